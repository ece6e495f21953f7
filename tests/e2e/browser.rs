//! The operator console in a real headless Chromium (Debian's), with JavaScript turned off:
//! the overview, a sink's page with its counts, chart and working retry buttons, an event's
//! story, and the replay form. Each test keeps screenshots of the pages it asserts on, under
//! `target/tmp/console-screenshots/` (the test artifacts).

use outbox_host::store::Status;
use outbox_test_support::webdriver::{Browser, CHROMEDRIVER};

use crate::support::{Running, World};

const TOKEN: &str = "browser-test-token-0123456789";

/// Serves, on another origin (`localhost` rather than `127.0.0.1`), a page whose button
/// posts a retry-everything form, with the right admin token, to `target`.
async fn evil_site(target: &str) -> String {
    let page = format!(
        "<!doctype html><form method=\"post\" action=\"{target}\"><input type=\"hidden\" name=\"all\" value=\"true\">\
         <input type=\"hidden\" name=\"token\" value=\"{TOKEN}\"><button id=\"go\">win a prize</button></form>"
    );
    let app = axum::Router::new().route("/", axum::routing::get(move || async move { axum::response::Html(page) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://localhost:{port}/")
}

/// Where a screenshot named `name` is kept.
fn artifact(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots").join(format!("{name}.png"))
}

/// Takes a screenshot of what the browser shows into [`artifact`] `name`, and checks that
/// it is a PNG of the page (not an empty picture).
async fn keep_screenshot(browser: &Browser, name: &str) {
    let path = artifact(name);
    browser.screenshot(&path).await.unwrap();
    let png = std::fs::read(&path).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "{}: {} bytes", path.display(), png.len());
}

/// Chromium is installed by `make test` (`scripts/ensure-chromium.sh`): a missing one fails
/// the test, unless the server and browser tests are skipped (`OUTBOX_SKIP_SERVER_TESTS=1`).
fn browser_available() -> bool {
    if outbox_test_support::skip::skipping("Chromium") {
        return false;
    }
    assert!(
        std::path::Path::new(CHROMEDRIVER).exists(),
        "{CHROMEDRIVER} is missing: `make test` installs it; OUTBOX_SKIP_SERVER_TESTS=1 skips the browser tests"
    );
    true
}

#[tokio::test]
async fn the_status_page_shows_counts_and_its_retry_buttons_work() {
    if !browser_available() {
        return;
    }
    let world = World::new().await;
    let first = world.produce("RoomGiftSent", "room-bad-1", Status::Pending).await;
    let second = world.produce("RoomGiftSent", "room-bad-2", Status::Pending).await;
    let fine = world.produce("RoomGiftSent", "room-ok", Status::Pending).await;
    let config = world
        .setup("retry_interval: 1h", "room.room-bad-1: permanent\nroom.room-bad-2: permanent")
        .with_admin()
        .set(&["admin", "token"], TOKEN);
    let mut host = Running::start(config.parse()).await;
    host.wait_status(&world, &[&first, &second], Status::Failed).await;
    host.wait_status(&world, &[&fine], Status::Delivered).await;
    let base = format!("http://{}", host.admin.unwrap());

    let browser = Browser::start_without_javascript().await.expect("headless chromium starts");
    browser.open(&format!("{base}/")).await.unwrap();
    assert_eq!(browser.text("tr[data-sink=fake] td[data-status=failed]").await.unwrap(), "2");
    assert_eq!(browser.text("tr[data-sink=fake] td.state").await.unwrap(), "delivering");
    keep_screenshot(&browser, "overview").await;
    browser.click("tr[data-sink=fake] a").await.unwrap();
    assert_eq!(browser.wait_text("#sink").await.unwrap(), "fake");
    assert!(browser.url().await.unwrap().ends_with("/sinks/fake"));
    assert_eq!(browser.text("td[data-status=failed]").await.unwrap(), "2");
    assert_eq!(browser.text("td[data-status=delivered]").await.unwrap(), "1");
    assert_eq!(browser.text("td[data-status=pending]").await.unwrap(), "0");
    assert_eq!(browser.find_all("#chart rect.delivered").await.unwrap().len(), 1, "one minute with deliveries");
    assert!(browser.text("#errors").await.unwrap().contains("fake: scripted permanent failure"));
    // Permanent failures are the destination answering: the sink's breaker stays closed.
    assert_eq!(browser.text("#breaker").await.unwrap(), "Circuit breaker closed: delivering");
    keep_screenshot(&browser, "sink").await;

    // An event's story, from its link among the failures.
    browser.click(&format!("tr[data-event-id='{first}'] a")).await.unwrap();
    assert_eq!(browser.wait_text("#event-id").await.unwrap(), first);
    assert_eq!(browser.text("#states tr[data-sink=fake] td.status").await.unwrap(), "failed");
    assert!(browser.text("#states tr[data-sink=fake]").await.unwrap().contains("fake: scripted permanent failure"));
    assert!(browser.text("#envelope").await.unwrap().contains("\"room_id\": \"room-bad-1\""));
    assert_eq!(browser.text("#previous").await.unwrap(), "previous none");
    keep_screenshot(&browser, "event").await;

    // A page on another site posting the same form, even with the right admin token,
    // is refused, and nothing moves.
    let evil = evil_site(&format!("{base}/retry")).await;
    browser.open(&evil).await.unwrap();
    browser.click("#go").await.unwrap();
    let refused = browser.wait_text_containing("body", "refused").await.unwrap();
    assert!(refused.contains("refused"), "{refused}");
    assert_eq!(world.row(&first).await.status, Status::Failed);
    assert_eq!(world.collector.attempts_of(&first).len(), 1);

    // Without the token typed in, the page's own form is refused too.
    browser.open(&format!("{base}/sinks/fake")).await.unwrap();
    browser.type_into("#token", "not-the-token-at-all").await.unwrap();
    browser.click(&format!("tr[data-event-id='{first}'] button.retry-event")).await.unwrap();
    let wrong = browser.wait_text_containing("body", "the admin token is missing or wrong").await.unwrap();
    assert!(wrong.contains("the admin token is missing or wrong"), "{wrong}");
    assert_eq!(world.row(&first).await.status, Status::Failed);

    // The per-event button: that event goes back to pending and is attempted again.
    browser.open(&format!("{base}/sinks/fake")).await.unwrap();
    browser.type_into("#token", TOKEN).await.unwrap();
    browser.click(&format!("tr[data-event-id='{first}'] button.retry-event")).await.unwrap();
    assert_eq!(browser.wait_text("#flash").await.unwrap(), "Moved 1 failed event(s) back to pending.");
    assert!(browser.url().await.unwrap().ends_with("/sinks/fake?moved=1"));
    host.wait_for("the first event's second attempt", || async { world.collector.attempts_of(&first).len() == 2 })
        .await;
    host.wait_status(&world, &[&first], Status::Failed).await;

    // The error group's button moves every failed event with that error.
    browser.open(&format!("{base}/sinks/fake")).await.unwrap();
    browser.type_into("#token", TOKEN).await.unwrap();
    browser.click("#errors button").await.unwrap();
    assert_eq!(browser.wait_text("#flash").await.unwrap(), "Moved 2 failed event(s) back to pending.");
    host.wait_for("second attempts after the group retry", || async {
        world.collector.attempts_of(&second).len() == 2 && world.collector.attempts_of(&first).len() == 3
    })
    .await;
    host.wait_status(&world, &[&first, &second], Status::Failed).await;

    // Search from the sink's page, then act on every event found: the count first, then
    // the confirmed action, back on the sink's page.
    browser.open(&format!("{base}/sinks/fake")).await.unwrap();
    browser.click("#search-failures").await.unwrap();
    assert_eq!(browser.wait_text("#found").await.unwrap(), "2 event(s) on this page, newest first.");
    assert_eq!(browser.find_all("#results tr[data-event-id]").await.unwrap().len(), 2);
    assert!(browser.text(&format!("#results tr[data-event-id='{second}']")).await.unwrap().contains("failed"));
    keep_screenshot(&browser, "search").await;
    browser.type_into("#bulk input[name=token]", TOKEN).await.unwrap();
    browser.click("#bulk-button").await.unwrap();
    let asked = browser.wait_text("#matching").await.unwrap();
    assert_eq!(asked, "2 event(s) match: move the failed ones among them back to pending.");
    assert_eq!(world.collector.attempts_of(&first).len(), 3, "counting moved nothing");
    browser.type_into("#confirm input[name=token]", TOKEN).await.unwrap();
    browser.click("#confirm-button").await.unwrap();
    assert_eq!(browser.wait_text("#flash").await.unwrap(), "Moved 2 failed event(s) back to pending.");
    assert!(browser.url().await.unwrap().ends_with("/sinks/fake?bulk=retry&changed=2"));
    host.wait_for("third and fourth attempts after the bulk retry", || async {
        world.collector.attempts_of(&second).len() == 3 && world.collector.attempts_of(&first).len() == 4
    })
    .await;
    drop(browser);
    host.stop().await;
}

/// The overview lists every sink with its counts, and a sink's replay form delivers a range
/// again to that sink only.
#[tokio::test]
async fn the_status_page_lists_every_sink_and_its_replay_button_works() {
    if !browser_available() {
        return;
    }
    let world = World::new().await;
    let audit = outbox_test_support::Collector::start().await;
    let audit_spec = crate::support::fake_sink_to("audit", &audit, "");
    let config = world
        .setup("", "")
        .with_sinks(vec![crate::support::sink_entry(&audit_spec, "start_from: beginning")])
        .with_admin()
        .set(&["admin", "token"], TOKEN);
    let mut host = Running::start(config.parse()).await;
    let mut ids = Vec::new();
    for room in ["room-1", "room-2", "room-3"] {
        ids.push(world.produce("RoomGiftSent", room, Status::Pending).await);
    }
    let seen_by = |collector: &outbox_test_support::Collector, id: &str| collector.attempts_of(id).len();
    host.wait_for("both sinks to deliver", || async {
        ids.iter().all(|id| seen_by(&world.collector, id) == 1 && seen_by(&audit, id) == 1)
    })
    .await;
    let base = format!("http://{}", host.admin.unwrap());

    let browser = Browser::start_without_javascript().await.expect("headless chromium starts");
    browser.open(&format!("{base}/")).await.unwrap();
    host.wait_for("the page to count audit's deliveries", || async {
        browser.open(&format!("{base}/")).await.unwrap();
        browser.text("tr[data-sink=audit] td[data-status=delivered]").await.unwrap() == "3"
    })
    .await;
    assert_eq!(browser.text("tr[data-sink=fake] td[data-status=delivered]").await.unwrap(), "3");

    browser.click("tr[data-sink=audit] a").await.unwrap();
    assert_eq!(browser.wait_text("#sink").await.unwrap(), "audit");
    browser.type_into("#replay input[name=from]", "1970-01-01").await.unwrap();
    browser.type_into("#replay input[name=token]", TOKEN).await.unwrap();
    browser.click("#replay-button").await.unwrap();
    assert_eq!(browser.wait_text("#flash").await.unwrap(), "Replaying 3 event(s) to sink audit.");
    assert_eq!(browser.text("#sink").await.unwrap(), "audit", "back on audit's page");
    host.wait_for("audit to receive every event again", || async { ids.iter().all(|id| seen_by(&audit, id) == 2) })
        .await;
    for id in &ids {
        assert_eq!(seen_by(&world.collector, id), 1, "the first sink got {id} only once");
    }
    drop(browser);
    host.stop().await;
}
