//! The operator console over HTTP on every database: the overview speaks for every sink, a
//! sink's page shows its own failures, an event's story shows its state in every sink and
//! its room's neighbours, and the retry form on a sink's page acts on that sink only.

use outbox_host::store::Status;

use crate::support::{Running, World, fake_sink_to, per_backend, sink_entry};

per_backend!(
    each_sink_has_its_own_page_and_the_overview_speaks_for_every_sink,
    bulk_actions_count_first_then_act_on_one_sink_and_are_logged,
    migrate_builds_the_indexes_the_searches_read_by,
);

/// `migrate` (here the world's) builds the indexes the console's searches read by, on one
/// sink's table too; migrating again builds nothing more and succeeds.
async fn migrate_builds_the_indexes_the_searches_read_by(world: World) {
    let names = || async {
        let info = world.producer.describe().await.unwrap().expect("the table");
        info.indexes.into_iter().map(|i| i.name).collect::<Vec<_>>()
    };
    let built = names().await;
    let mut wanted = vec!["room_outbox_room_idx", "room_outbox_type_idx", "room_outbox_consumer_idx"];
    if world.producer.backend() == outbox_host::store::Backend::Postgres {
        wanted.push("room_outbox_failed_idx");
    }
    for index in wanted {
        assert!(built.iter().any(|n| n == index), "{index} not in {built:?}");
    }
    world.producer.migrate().await.unwrap();
    assert_eq!(names().await.len(), built.len(), "migrating again adds nothing");
}

const TOKEN: &str = "console-test-token-0123456789";

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The case: on one table, sink `fake` delivers every event and sink `b` fails all
/// five. `b`'s failures show on its page and on its row of the overview; `fake`'s page shows
/// none.
async fn each_sink_has_its_own_page_and_the_overview_speaks_for_every_sink(world: World) {
    let b = outbox_test_support::Collector::start().await;
    let b_spec = fake_sink_to("b", &b, "default: permanent");
    let config = world
        .setup("retry_interval: 1h", "")
        .with_sinks(vec![sink_entry(&b_spec, "start_from: beginning")])
        .with_admin()
        .set(&["admin", "token"], TOKEN);
    let mut host = Running::start(config.parse()).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(world.produce("RoomGiftSent", "room-1", Status::Pending).await);
        // Each its own creation time: newest first is then the reverse of this order in
        // every sink (the first sink breaks ties by its key, a later one by event id).
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    host.wait_status(&world, &refs, Status::Delivered).await;
    let b_state = world.producer.clone().sink_store(&sink_named(&world, "b").await).await.unwrap();
    host.wait_status_in(b_state.as_ref(), &refs, Status::Failed).await;
    let base = format!("http://{}", host.admin.unwrap());

    // The overview: a row per sink, b's marked troubled with its five failures.
    host.wait_for("the overview to count b's failures", || async {
        cell(&get(&format!("{base}/")).await.1, "b", "failed") == "5"
    })
    .await;
    let overview = get(&format!("{base}/")).await.1;
    assert!(overview.contains("<tr data-sink=\"b\" data-state=\"delivering\" class=\"troubled\">"), "{overview}");
    assert!(overview.contains("<tr data-sink=\"fake\" data-state=\"delivering\"><td>"), "{overview}");
    assert_eq!(cell(&overview, "fake", "delivered"), "5");
    assert_eq!(cell(&overview, "fake", "failed"), "0");
    assert_eq!(cell(&overview, "b", "delivered"), "0");
    assert!(
        !overview.contains("<header><h1>outbox-host</h1><p>table <b>room_outbox</b> · node <b>test-node</b> · sink")
    );
    assert!(!overview.contains("Recent failures") && !overview.contains("No retryable"), "{overview}");

    // b's page: its breaker, its counts, its error and every failure, with a retry button.
    let (status, page) = get(&format!("{base}/sinks/b")).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("sink <span id=\"sink\">b</span>"), "{page}");
    assert!(page.contains("Circuit breaker closed: delivering"), "{page}");
    assert!(page.contains("<td class=\"failed\" data-status=\"failed\">5</td>"), "{page}");
    assert!(page.contains("<tr><td>5</td><td><code>fake: scripted permanent failure</code>"), "{page}");
    for id in &ids {
        assert!(page.contains(&format!("<tr data-event-id=\"{id}\">")), "{id} among b's failures: {page}");
    }
    assert!(page.contains("<input type=\"hidden\" name=\"sink\" value=\"b\">"), "{page}");
    // fake's page: nothing wrong.
    let fake_page = get(&format!("{base}/sinks/fake")).await.1;
    assert!(fake_page.contains("<td class=\"delivered\" data-status=\"delivered\">5</td>"), "{fake_page}");
    assert!(fake_page.contains("id=\"no-errors\"") && fake_page.contains("id=\"no-failures\""), "{fake_page}");
    let (status, missing) = get(&format!("{base}/sinks/c%3Cx%3E")).await;
    assert_eq!(status, 404);
    assert!(
        missing.contains("no sink &quot;c&lt;x&gt;&quot;") || missing.contains("no sink \"c&lt;x&gt;\""),
        "{missing}"
    );
    assert!(missing.contains("fake, b"), "names the sinks there are: {missing}");

    // The story of the middle event: its state in both sinks and its room's neighbours.
    let (status, story) = get(&format!("{base}/events/{}", ids[2])).await;
    assert_eq!(status, 200, "{story}");
    let fake_row = row_of(&story, "<tr data-sink=\"fake\">");
    assert!(fake_row.contains("data-status=\"delivered\""), "{fake_row}");
    assert!(fake_row.contains("<code>sha256:"), "the build that delivered it: {fake_row}");
    let b_row = row_of(&story, "<tr data-sink=\"b\">");
    assert!(b_row.contains("data-status=\"failed\"") && b_row.contains("fake: scripted permanent failure"), "{b_row}");
    assert!(story.contains(&format!("<tr id=\"previous\" data-event-id=\"{}\">", ids[1])), "{story}");
    assert!(story.contains(&format!("<tr id=\"next\" data-event-id=\"{}\">", ids[3])), "{story}");
    assert!(row_of(&story, "<tr id=\"next\"").contains("<td class=\"failed\" data-sink=\"b\">failed</td>"), "{story}");
    assert!(story.contains("&quot;event_type&quot;: &quot;RoomGiftSent&quot;"), "the envelope decoded: {story}");
    let first = get(&format!("{base}/events/{}", ids[0])).await.1;
    assert!(first.contains("<tr id=\"previous\"><td>previous</td><td colspan=\"5\">none</td></tr>"), "{first}");
    assert_eq!(get(&format!("{base}/events/no-such-event")).await.0, 404);

    // /api/status gives each sink's state.
    let api: serde_json::Value = serde_json::from_str(&get(&format!("{base}/api/status")).await.1).unwrap();
    assert_eq!(api["sinks"][1]["name"], "b");
    assert_eq!(api["sinks"][1]["state"], "delivering");
    assert_eq!(api["sinks"][1]["breaker"]["state"], "closed");
    assert_eq!(api["sinks"][1]["counts"]["failed"], 5);

    // Search: b's failures among its exceptions, paged newest first by a cursor.
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(search_all(&base, "sink=b&status=failed&limit=2").await, (newest_first.clone(), 3));
    // Every state of b (its positions and exceptions judged row by row), and the outbox's own.
    assert_eq!(search_all(&base, "sink=b&limit=2").await, (newest_first.clone(), 3));
    assert_eq!(search_all(&base, "sink=b&status=delivered,pending").await.0, Vec::<String>::new());
    assert_eq!(search_all(&base, "sink=fake&status=delivered&room=room-1&limit=4").await, (newest_first.clone(), 2));
    assert_eq!(search_all(&base, "status=failed&status=retryable").await.0, Vec::<String>::new(), "the first sink's");
    assert_eq!(search_all(&base, &format!("sink=b&event_id={}", ids[3])).await.0, [ids[3].clone()]);
    assert_eq!(search_all(&base, "sink=b&type=RoomMicChanged").await.0, Vec::<String>::new());
    let api: serde_json::Value =
        serde_json::from_str(&get(&format!("{base}/api/events?sink=b&status=failed&limit=1")).await.1).unwrap();
    assert_eq!(api["events"][0]["status"], "failed");
    assert_eq!(api["events"][0]["last_error"], "fake: scripted permanent failure");
    let (status, bad) = get(&format!("{base}/api/events?status=lost&colour=red")).await;
    assert_eq!(status, 400);
    assert!(bad.contains("status: \\\"lost\\\"") && bad.contains("colour: not a search key"), "{bad}");
    assert_eq!(get(&format!("{base}/api/events?sink=zzz")).await.0, 404);
    // The search page: the same search, without JavaScript.
    let (status, found) = get(&format!("{base}/events?sink=b&status=failed&status=retryable")).await;
    assert_eq!(status, 200, "{found}");
    assert!(found.contains("id=\"found\" data-count=\"5\""), "{found}");
    assert!(found.contains("<input type=\"checkbox\" name=\"status\" value=\"failed\" checked>"), "{found}");
    assert!(found.contains("<option value=\"b\" selected>b</option>"), "{found}");
    for id in &ids {
        assert!(found.contains(&format!("<tr data-event-id=\"{id}\"><td><a href=\"/events/{id}\">")), "{found}");
    }

    // The retry form on b's page moves b's failures only, and comes back to b's page.
    let csrf = page.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    let client = reqwest::Client::new();
    let fields = [("csrf", csrf.as_str()), ("token", TOKEN), ("sink", "b"), ("all", "true")];
    let moved = client.post(format!("{base}/retry")).form(&fields).send().await.unwrap();
    assert!(moved.url().as_str().ends_with("/sinks/b?moved=5"), "{}", moved.url());
    host.wait_for("b's second attempts", || async { ids.iter().all(|id| b.attempts_of(id).len() == 2) }).await;
    for id in &ids {
        assert_eq!(world.collector.attempts_of(id).len(), 1, "fake got {id} once");
    }
    host.stop().await;
}

/// Bulk actions on what a search selects, through the real binary: each answers with the
/// count and does nothing until confirmed with it; retry, replay to one sink and discard each
/// change that sink's events only; the log says who (the token's id) and what.
async fn bulk_actions_count_first_then_act_on_one_sink_and_are_logged(world: World) {
    use crate::binary::{free_port, signal, spawn_host, wait_exit};
    let b = outbox_test_support::Collector::start().await;
    let b_spec = fake_sink_to("b", &b, "default: permanent\nroom.r-wait: retryable");
    let port = free_port();
    let yaml = world
        .setup("retry_interval: 1h", "room.r-fail: permanent\nroom.r-wait: retryable")
        .with_sinks(vec![sink_entry(&b_spec, "start_from: beginning")])
        .set(&["admin", "listen"], &format!("127.0.0.1:{port}"))
        .set(&["admin", "token"], TOKEN)
        .yaml();
    let mut rooms: Vec<(&str, String)> = Vec::new();
    for room in ["r-fail", "r-fail", "r-fail", "r-fail", "r-ok", "r-ok", "r-ok", "r-wait", "r-wait"] {
        rooms.push((room, world.produce("RoomGiftSent", room, Status::Pending).await));
    }
    let of = |room: &str| rooms.iter().filter(|(r, _)| *r == room).map(|(_, id)| id.clone()).collect::<Vec<_>>();
    let host = spawn_host(&world, &yaml);
    wait_until("the host to register b", || async {
        world.producer.sinks().await.unwrap().iter().any(|s| s.name == "b")
    })
    .await;
    let b_state = world.producer.clone().sink_store(&sink_named(&world, "b").await).await.unwrap();
    let status_in = |store: std::sync::Arc<dyn outbox_host::store::Store>, id: String| async move {
        store.get(&id).await.unwrap().map(|r| r.status)
    };
    // r-wait's first event waits to be retried in both sinks, and its second behind it (in
    // per-room order, pending).
    let waiting = [Some(Status::Retryable), Some(Status::Pending)];
    let settled = || async {
        for (room, id) in &rooms {
            let (first, second) =
                (status_in(world.producer.clone(), id.clone()).await, status_in(b_state.clone(), id.clone()).await);
            let done = match *room {
                "r-fail" => (first, second) == (Some(Status::Failed), Some(Status::Failed)),
                "r-ok" => (first, second) == (Some(Status::Delivered), Some(Status::Failed)),
                _ => waiting.contains(&first) && waiting.contains(&second),
            };
            if !done {
                return false;
            }
        }
        let tried = |c: &outbox_test_support::Collector| of("r-wait").iter().any(|id| !c.attempts_of(id).is_empty());
        tried(&world.collector) && tried(&b)
    };
    wait_until("every event settled in both sinks", settled).await;

    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let bulk = |query: String, token: Option<&'static str>| {
        let request = client.post(format!("{base}/api/events/bulk?{query}"));
        let request = match token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, serde_json::from_str::<serde_json::Value>(&response.text().await.unwrap()).unwrap_or_default())
        }
    };

    // Retry fake's failures: the count first, a wrong count changes nothing, then done.
    let (status, counted) = bulk("action=retry&sink=fake&status=failed".into(), Some(TOKEN)).await;
    assert_eq!((status, &counted["matching"]), (409, &serde_json::json!(4)), "{counted}");
    assert_eq!(bulk("action=retry&sink=fake&status=failed&confirm=3".into(), Some(TOKEN)).await.0, 409);
    assert_eq!(bulk("action=retry&sink=fake&status=failed&confirm=4".into(), None).await.0, 401);
    for id in of("r-fail") {
        assert_eq!(world.collector.attempts_of(&id).len(), 1, "nothing moved before the confirmed count");
    }
    let (status, done) = bulk("action=retry&sink=fake&status=failed&confirm=4".into(), Some(TOKEN)).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!((done["action"].as_str(), done["changed"].as_u64()), (Some("retry"), Some(4)), "{done}");
    wait_until("fake's second attempts", || async {
        of("r-fail").iter().all(|id| world.collector.attempts_of(id).len() == 2)
    })
    .await;

    // Replay fake's delivered events to b only.
    let (status, done) = bulk("action=replay&sink=fake&status=delivered&target=b&confirm=3".into(), Some(TOKEN)).await;
    assert_eq!((status, done["changed"].as_u64()), (200, Some(3)), "{done}");
    wait_until("b's second attempts of r-ok", || async { of("r-ok").iter().all(|id| b.attempts_of(id).len() == 2) })
        .await;

    // Discard b's waiting events of r-wait: failed in b, still waiting in fake.
    let (status, done) = bulk("action=discard&sink=b&room=r-wait&confirm=2".into(), Some(TOKEN)).await;
    assert_eq!((status, done["changed"].as_u64()), (200, Some(2)), "{done}");
    let mut who = String::new();
    for id in of("r-wait") {
        let row = b_state.get(&id).await.unwrap().unwrap();
        assert_eq!(row.status, Status::Failed);
        let error = row.last_error.unwrap_or_default();
        assert!(error.starts_with("discarded by an operator (token:") && !error.contains(TOKEN), "{error}");
        who = error["discarded by an operator (".len()..error.len() - 1].to_string();
        assert!(waiting.contains(&Some(world.row(&id).await.status)), "fake's state is its own");
    }
    // Discarding what is finished changes nothing.
    let (status, done) = bulk("action=discard&sink=fake&room=r-ok&confirm=3".into(), Some(TOKEN)).await;
    assert_eq!((status, done["changed"].as_u64()), (200, Some(0)), "{done}");
    for id in of("r-ok") {
        assert_eq!(world.row(&id).await.status, Status::Delivered);
        assert_eq!(world.collector.attempts_of(&id).len(), 1, "fake got {id} once");
    }

    signal(&host, "TERM");
    let output = wait_exit(host).await;
    let log = String::from_utf8_lossy(&output.stderr);
    let actions: Vec<&str> = log.lines().filter(|l| l.contains("operator bulk action")).collect();
    assert_eq!(actions.len(), 4, "{log}");
    for (line, (action, changed)) in actions.iter().zip([("retry", 4), ("replay", 3), ("discard", 2), ("discard", 0)]) {
        assert!(line.contains(&format!("who={who}")), "{line}");
        assert!(
            line.contains(&format!("action=\"{action}\"")) && line.contains(&format!("changed={changed}")),
            "{line}"
        );
    }
    assert!(!log.contains(TOKEN), "the token itself is never logged");
}

/// Polls `check` every 50 ms for up to a minute.
async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Every event id `/api/events?{query}` finds, following its cursors, and how many pages.
async fn search_all(base: &str, query: &str) -> (Vec<String>, usize) {
    let (mut ids, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let at = cursor.as_ref().map(|c| format!("&cursor={}", urlencode(c))).unwrap_or_default();
        let (status, body) = get(&format!("{base}/api/events?{query}{at}")).await;
        assert_eq!(status, 200, "{query}: {body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        pages += 1;
        ids.extend(page["events"].as_array().unwrap().iter().map(|e| e["event_id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return (ids, pages),
        }
        assert!(pages < 50, "{query}: the cursor does not end");
    }
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

async fn sink_named(world: &World, name: &str) -> outbox_host::store::RegisteredSink {
    world.producer.sinks().await.unwrap().into_iter().find(|s| s.name == name).unwrap()
}

/// The text of the overview's cell for `sink` and `status`.
fn cell(html: &str, sink: &str, status: &str) -> String {
    let row = row_of(html, &format!("<tr data-sink=\"{sink}\""));
    let marker = format!("data-status=\"{status}\">");
    row.split(&marker).nth(1).and_then(|rest| rest.split('<').next()).unwrap_or_default().to_string()
}

/// The table row that starts with `start`, up to its end.
fn row_of<'a>(html: &'a str, start: &str) -> &'a str {
    let from = html.find(start).unwrap_or_else(|| panic!("no {start} in {html}"));
    let rest = &html[from..];
    &rest[..rest.find("</tr>").unwrap_or(rest.len())]
}
