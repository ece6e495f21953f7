//! The admin listener: liveness, and readiness that flips to 503 while draining.

use std::time::Duration;

use outbox_host::engine::Signal;
use outbox_host::store::Status;

use crate::support::{Running, World, per_backend};

use crate::breaker::get;

/// Asks `/readyz` every `pause`, up to `tries` times, until it answers 503; the last answer.
async fn until_unready(base: &str, tries: usize, pause: Duration) -> (u16, String) {
    let mut answer = (0, String::new());
    for _ in 0..tries {
        answer = get(&format!("{base}/readyz")).await;
        if answer.0 == 503 {
            break;
        }
        tokio::time::sleep(pause).await;
    }
    answer
}

#[tokio::test]
async fn healthz_and_readyz_answer_and_readiness_flips_while_draining() {
    let world = World::new().await;
    let slow = world.produce("RoomGiftSent", "room-slow", Status::Pending).await;
    let config = world.setup("publish_timeout: 5s", "room.room-slow: sleep:1500").with_admin();
    let mut host = Running::start(config.parse()).await;
    let base = format!("http://{}", host.admin.expect("admin listener on"));

    assert_eq!(get(&format!("{base}/healthz")).await, (200, "ok\n".into()));
    assert_eq!(get(&format!("{base}/readyz")).await, (200, "ready\n".into()));

    host.wait_signal("the slow claim", |s| *s == Signal::Claimed(1)).await;
    host.shutdown.cancel();
    // The slow delivery keeps the host draining for a while; readiness must say so.
    let draining = until_unready(&base, 50, Duration::from_millis(10)).await;
    assert_eq!(draining, (503, "draining\n".into()));
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200, "alive while draining");

    tokio::time::timeout(Duration::from_secs(10), host.task).await.unwrap().unwrap().unwrap();
    assert_eq!(world.row(&slow).await.status, Status::Delivered);
    assert!(reqwest::get(format!("{base}/healthz")).await.is_err(), "the listener is closed after shutdown");
}

/// A failing sink never makes the host unready: IM trouble must not take the service down.
#[tokio::test]
async fn a_failing_sink_keeps_the_host_ready() {
    let world = World::new().await;
    let id = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    let config = world.setup("retry_interval: 1h", "default: retryable").with_admin();
    let mut host = Running::start(config.parse()).await;
    host.wait_status(&world, &[&id], Status::Retryable).await;
    let base = format!("http://{}", host.admin.unwrap());
    assert_eq!(get(&format!("{base}/readyz")).await, (200, "ready\n".into()));
    host.stop().await;
}

per_backend!(readiness_turns_503_while_claims_fail_and_200_once_fixed);

/// `SELECT 1` keeps answering while every claim fails (here a column the claim needs is
/// renamed away, as a botched migration would): readiness must still say the host cannot
/// work, with the database's reason, and recover by itself once the table is fixed.
async fn readiness_turns_503_while_claims_fail_and_200_once_fixed(world: World) {
    readiness_on(&world, "room_outbox").await;
}

/// Readiness of a host on `table` while its claims fail, then once they work again.
pub async fn readiness_on(world: &World, table: &str) {
    let config = world.setup("poll_interval: 50ms\nwake_up: poll", "").set(&["outbox", "table"], table).with_admin();
    let mut host = Running::start(config.parse()).await;
    let rows = outbox_host::store::open(&world.db_url(), 2, table).await.unwrap();
    let base = format!("http://{}", host.admin.expect("admin listener on"));
    assert_eq!(get(&format!("{base}/readyz")).await, (200, "ready\n".into()));

    world.db.execute(&format!("ALTER TABLE {table} RENAME COLUMN lock_until_ms TO lock_until_ms_gone")).await.unwrap();
    let readiness = until_unready(&base, 300, Duration::from_millis(50)).await;
    assert_eq!(readiness.0, 503, "claims fail but the host says it is ready: {readiness:?}");
    assert!(
        readiness.1.starts_with("database: the last ")
            && readiness.1.contains("(claim)")
            && readiness.1.contains("lock_until_ms"),
        "the reason names the failing operation and the database's error: {:?}",
        readiness.1
    );
    let status: serde_json::Value = serde_json::from_str(&get(&format!("{base}/api/status")).await.1).unwrap();
    assert!(status["db_failures_in_a_row"].as_u64().unwrap() >= 3, "{status}");
    assert_eq!(status["last_db_error"]["operation"], "claim");

    world.db.execute(&format!("ALTER TABLE {table} RENAME COLUMN lock_until_ms_gone TO lock_until_ms")).await.unwrap();
    rows.insert(&[world.event("RoomGiftSent", "room-1", Status::Pending)]).await.unwrap();
    host.wait_for("claims to work again", || async { rows.stats().await.unwrap().count(Status::Delivered) == 1 }).await;
    assert_eq!(get(&format!("{base}/readyz")).await, (200, "ready\n".into()), "ready again once claims work");
    let page = get(&format!("{base}/")).await.1;
    assert!(
        page.contains("id=\"db-error\">Last database error (claim"),
        "the page shows the last database error, also after recovery"
    );
    host.stop().await;
}

const TOKEN: &str = "admin-test-token-0123456789";

/// A host with failed and delivered rows, its admin listener on, with `admin.token` if given.
async fn guarded_host(world: &World, token: Option<&str>) -> (Running, String, String, String) {
    let failed = world.produce("RoomGiftSent", "room-bad", Status::Pending).await;
    let delivered = world.produce("RoomGiftSent", "room-ok", Status::Pending).await;
    let mut config = world.setup("retry_interval: 1h", "room.room-bad: permanent").with_admin();
    if let Some(token) = token {
        config = config.set(&["admin", "token"], token);
    }
    let mut host = Running::start(config.parse()).await;
    host.wait_status(world, &[&failed], Status::Failed).await;
    host.wait_status(world, &[&delivered], Status::Delivered).await;
    let base = format!("http://{}", host.admin.unwrap());
    (host, base, failed, delivered)
}

/// What a web page can make a browser send: form posts with a foreign `Origin` or
/// `Sec-Fetch-Site`, without the form token, without the admin token. None changes a row.
#[tokio::test]
async fn cross_site_and_tokenless_requests_change_nothing() {
    let world = World::new().await;
    let (host, base, failed, delivered) = guarded_host(&world, Some(TOKEN)).await;
    let client = reqwest::Client::new();
    let form = |extra: &[(&str, &str)]| {
        let mut fields = vec![("all".to_string(), "true".to_string()), ("token".to_string(), TOKEN.to_string())];
        fields.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        fields
    };
    let page = client.get(format!("{base}/sinks/fake")).send().await.unwrap();
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"), "{csp}");
    let html = page.text().await.unwrap();
    let csrf = html.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();

    let cases: Vec<(&str, reqwest::RequestBuilder)> = vec![
        (
            "foreign Origin",
            client
                .post(format!("{base}/retry"))
                .header("origin", "http://evil.example")
                .form(&form(&[("csrf", &csrf)])),
        ),
        (
            "cross-site fetch",
            client.post(format!("{base}/retry")).header("sec-fetch-site", "cross-site").form(&form(&[("csrf", &csrf)])),
        ),
        ("no form token", client.post(format!("{base}/retry")).form(&form(&[]))),
        ("API without bearer", client.post(format!("{base}/api/retry?all=true"))),
        ("purge without bearer", client.post(format!("{base}/api/purge?delivered_before=1ms"))),
        (
            "purge with a wrong bearer",
            client.post(format!("{base}/api/purge?delivered_before=1ms")).bearer_auth("wrong-token-wrong-token"),
        ),
        (
            "replay form from another site",
            client.post(format!("{base}/replay")).header("origin", "http://evil.example").form(&form(&[
                ("csrf", &csrf),
                ("sink", "fake"),
                ("from", "1970-01-01"),
            ])),
        ),
        ("replay without bearer", client.post(format!("{base}/api/sinks/fake/replay?from=1970-01-01"))),
        ("reload without bearer", client.post(format!("{base}/api/sinks/fake/reload"))),
        ("bulk without bearer", client.post(format!("{base}/api/events/bulk?action=retry&status=failed&confirm=1"))),
        (
            "bulk form from another site",
            client.post(format!("{base}/events/bulk")).header("origin", "http://evil.example").form(&form(&[
                ("csrf", &csrf),
                ("action", "retry"),
                ("status", "failed"),
                ("confirm", "1"),
            ])),
        ),
        (
            "bulk form without the form token",
            client.post(format!("{base}/events/bulk")).form(&form(&[
                ("action", "retry"),
                ("status", "failed"),
                ("confirm", "1"),
            ])),
        ),
    ];
    for (what, request) in cases {
        let response = request.send().await.unwrap();
        assert!([401, 403].contains(&response.status().as_u16()), "{what}: {}", response.status());
    }
    assert_eq!(world.row(&failed).await.status, Status::Failed, "a refused request moved a row");
    assert_eq!(world.row(&delivered).await.status, Status::Delivered, "a refused request purged a row");

    // A DNS-rebinding page speaks to this listener under its own name: not answered.
    let rebound =
        client.get(format!("{base}/api/events/{failed}")).header("host", "evil.example:80").send().await.unwrap();
    assert_eq!(rebound.status(), 421);
    let own = client.get(format!("{base}/api/events/{failed}")).send().await.unwrap();
    assert_eq!(own.status(), 200);

    // Probes and scrapers keep working without a token.
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(client.get(format!("{base}{path}")).send().await.unwrap().status(), 200, "{path}");
    }

    // The operator's own requests go through.
    let moved = client.post(format!("{base}/retry")).form(&form(&[("csrf", &csrf)])).send().await.unwrap();
    assert!(moved.url().as_str().ends_with("/?moved=1"), "{}", moved.url());
    let purged = client.post(format!("{base}/api/purge?delivered_before=1ms")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(purged.status(), 200);
    assert_eq!(purged.text().await.unwrap(), "{\"deleted\":1,\"tables\":{\"room_outbox\":1}}");
    host.stop().await;
}

/// Without `admin.token`, nothing changes state over HTTP, and the page says so.
#[tokio::test]
async fn without_a_token_the_listener_is_read_only() {
    let world = World::new().await;
    let (host, base, failed, _) = guarded_host(&world, None).await;
    let client = reqwest::Client::new();
    let response = client.post(format!("{base}/api/retry?all=true")).send().await.unwrap();
    assert_eq!(response.status(), 403);
    assert!(response.text().await.unwrap().contains("set admin.token"));
    let html = client.get(format!("{base}/sinks/fake")).send().await.unwrap().text().await.unwrap();
    assert!(html.contains("Retrying and replaying from this page are off"), "{html}");
    assert!(!html.contains("<button"), "{html}");
    let search = client.get(format!("{base}/events?status=failed")).send().await.unwrap().text().await.unwrap();
    assert!(search.contains("data-count=\"1\"") && !search.contains("id=\"bulk\""), "no bulk form: {search}");
    let bulk =
        client.post(format!("{base}/api/events/bulk?action=retry&status=failed&confirm=1")).send().await.unwrap();
    assert_eq!(bulk.status(), 403);
    assert_eq!(world.row(&failed).await.status, Status::Failed);
    host.stop().await;
}

/// What any web page can make an operator's browser ask: every read but the probes' and
/// the scrapes' is refused when the browser marks it cross-site, so no page elsewhere can
/// read events or make the host count its tables.
#[tokio::test]
async fn cross_site_reads_are_refused_except_probes_and_scrapes() {
    let world = World::new().await;
    let (host, base, failed, _) = guarded_host(&world, Some(TOKEN)).await;
    let client = reqwest::Client::new();
    let read =
        |path: &str, site: &'static str| client.get(format!("{base}{path}")).header("sec-fetch-site", site).send();
    for path in [
        "/",
        "/api/status",
        &format!("/api/events/{failed}"),
        "/sinks/fake",
        "/events?status=failed",
        &format!("/events/{failed}"),
        "/api/events?status=failed",
    ] {
        let refused = read(path, "cross-site").await.unwrap();
        assert_eq!(refused.status(), 403, "{path}");
        assert_eq!(refused.text().await.unwrap(), "cross-site request refused\n");
        assert_eq!(read(path, "same-origin").await.unwrap().status(), 200, "{path}");
        assert_eq!(read(path, "none").await.unwrap().status(), 200, "{path}: typed into the address bar");
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(read(path, "cross-site").await.unwrap().status(), 200, "{path}");
    }
    host.stop().await;
}

/// The page and `/api/status` read the tables at most about once a second: a count asked
/// again at once is the one read a moment ago, and a later ask reads the table anew.
#[tokio::test]
async fn the_page_and_the_status_api_read_the_tables_at_most_once_a_second() {
    let world = World::new().await;
    let (host, base, _, _) = guarded_host(&world, None).await;
    let failed_count = |json: &str| -> i64 {
        serde_json::from_str::<serde_json::Value>(json).unwrap()["counts"]["failed"].as_i64().unwrap()
    };
    let url = format!("{base}/api/status");
    // A pair of reads close together (well within the second), around a new failed row.
    let mut pair = None;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let before = failed_count(&get(&url).await.1);
        world
            .insert(
                &format!("evt-bad-{}", outbox_host::clock::random_u64()),
                "RoomGiftSent",
                "room-z",
                Status::Failed,
                vec![1],
            )
            .await;
        let after = failed_count(&get(&url).await.1);
        if started.elapsed() < Duration::from_millis(500) {
            pair = Some((before, after));
            break;
        }
    }
    let (before, after) = pair.expect("two reads within half a second");
    assert_eq!(after, before, "the second read is served from the first");
    // Later, the table is read again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while failed_count(&get(&url).await.1) == before {
        assert!(std::time::Instant::now() < deadline, "the counts were never read again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    host.stop().await;
}

/// With `admin.token` set and the listener on every address (not loopback), the page and
/// the API need the token to be read: as a bearer, or as the password of the browser's
/// Basic prompt. Probes and scrapes need none.
#[tokio::test]
async fn off_loopback_reads_need_the_token() {
    let world = World::new().await;
    let failed = world.produce("RoomGiftSent", "room-bad", Status::Pending).await;
    let config = world
        .setup("retry_interval: 1h", "room.room-bad: permanent")
        .set(&["admin", "listen"], "0.0.0.0:0")
        .set(&["admin", "token"], TOKEN);
    let mut host = Running::start(config.parse()).await;
    host.wait_status(&world, &[&failed], Status::Failed).await;
    let base = format!("http://127.0.0.1:{}", host.admin.unwrap().port());
    let client = reqwest::Client::new();
    for path in ["/", "/api/status", &format!("/api/events/{failed}")] {
        let refused = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(refused.status(), 401, "{path}");
        let challenges: Vec<_> =
            refused.headers().get_all("www-authenticate").iter().map(|v| v.to_str().unwrap().to_string()).collect();
        assert!(challenges.contains(&"Basic realm=\"outbox-host\"".to_string()), "{challenges:?}");
        let wrong = client.get(format!("{base}{path}")).bearer_auth("not-the-token-at-all").send().await.unwrap();
        assert_eq!(wrong.status(), 401, "{path}");
        assert_eq!(
            client.get(format!("{base}{path}")).bearer_auth(TOKEN).send().await.unwrap().status(),
            200,
            "{path}"
        );
        let basic = client.get(format!("{base}{path}")).basic_auth("operator", Some(TOKEN)).send().await.unwrap();
        assert_eq!(basic.status(), 200, "{path}");
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(client.get(format!("{base}{path}")).send().await.unwrap().status(), 200, "{path}");
    }
    host.stop().await;
}
