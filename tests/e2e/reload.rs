//! Hot reload: the plugin file replaced under load is swapped in without a restart, every
//! event is still delivered exactly once per sink, every outcome records the build that
//! produced it, and a broken replacement is refused while the old build goes on. `SIGHUP`
//! reloads the real binary.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use outbox_host::store::{NewEvent, Status, Store};
use outbox_test_support::{Collector, FAKE_SINK};

use crate::support::{Running, World, per_backend, sink_entry};

per_backend!(a_plugin_replaced_under_load_is_swapped_in_and_a_broken_one_refused);

const TOKEN: &str = "reload-test-token-0123456789";

/// The same component with a custom section appended: another build (another digest) that
/// behaves the same.
pub(crate) fn another_build(wasm: &[u8], tag: &str) -> Vec<u8> {
    let name = b"outbox-test-build";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(tag.as_bytes());
    assert!(payload.len() < 128, "one LEB128 byte of size");
    let mut out = wasm.to_vec();
    out.push(0);
    out.push(payload.len() as u8);
    out.extend(payload);
    out
}

pub(crate) fn digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{:x}", sha2::Sha256::digest(bytes))
}

/// Replaces `path` as a deploy would: a new file renamed over the old one.
pub(crate) fn deploy(path: &Path, bytes: &[u8]) {
    let next = path.with_extension("next");
    std::fs::write(&next, bytes).unwrap();
    std::fs::rename(&next, path).unwrap();
}

use crate::support::metric;

async fn delivered(store: &dyn Store) -> i64 {
    store.stats().await.unwrap().count(Status::Delivered)
}

/// 10,000 events drain through two sinks; the first one's plugin file is replaced by another
/// build while they do, then by a file that is not a component. Each sink gets every event
/// once; the first sink's rows record both builds, the second's only its own; the broken
/// file is refused (log, metric, and a 422 from the reload endpoint) and delivery goes on.
async fn a_plugin_replaced_under_load_is_swapped_in_and_a_broken_one_refused(world: World) {
    const EVENTS: usize = 10_000;
    let original = std::fs::read(FAKE_SINK).unwrap();
    let plugin = world.dir.path().join("fake_sink.wasm");
    std::fs::write(&plugin, &original).unwrap();
    let audit = Collector::start().await;
    let audit_spec = crate::support::fake_sink_to("audit", &audit, "");
    let config = world
        .setup("concurrency: 16\nbatch_size: 100", "")
        .set(&["sink", "plugin"], plugin.to_str().unwrap())
        .set(&["sink", "rate_limit"], "2000/s")
        .with_sinks(vec![sink_entry(&audit_spec, "start_from: beginning")])
        .set(&["admin", "token"], TOKEN)
        .with_admin()
        .parse();
    let mut host = Running::start(config).await;
    let base = format!("http://{}", host.admin.unwrap());
    let events: Vec<NewEvent> =
        (0..EVENTS).map(|i| world.event("RoomGiftSent", &format!("room-{}", i % 100), Status::Pending)).collect();
    for chunk in events.chunks(1_000) {
        world.producer.insert(chunk).await.unwrap();
    }
    let sinks = world.producer.sinks().await.unwrap();
    let audit_state = world.producer.clone().sink_store(&sinks[1]).await.unwrap();

    host.wait_for("a first part delivered", || async { delivered(world.producer.as_ref()).await >= 1_000 }).await;
    let second = another_build(&original, "2");
    deploy(&plugin, &second);
    let (first_digest, second_digest) = (digest(&original), digest(&second));
    host.wait_for("the second build to be swapped in", || async {
        metric(&base, "room_outbox_sink_reloads_total{sink=\"fake\",result=\"ok\"}").await >= 1.0
    })
    .await;
    assert!(delivered(world.producer.as_ref()).await < EVENTS as i64, "the swap happened under load");

    deploy(&plugin, b"not a component at all");
    host.wait_for("the broken build to be refused", || async {
        metric(&base, "room_outbox_sink_reloads_total{sink=\"fake\",result=\"refused\"}").await >= 1.0
    })
    .await;
    let refused =
        reqwest::Client::new().post(format!("{base}/api/sinks/fake/reload")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(refused.status(), 422);
    assert!(refused.text().await.unwrap().contains("the old one keeps delivering"));

    host.wait_for_within("both sinks to deliver every event", Duration::from_secs(120), || async {
        delivered(world.producer.as_ref()).await == EVENTS as i64
            && delivered(audit_state.as_ref()).await == EVENTS as i64
    })
    .await;
    // The other sink was not reloaded (a consumer's settled deliveries keep no build digest
    // of their own: its metrics say it).
    let samples = crate::support::scrape(&base).await;
    assert!(samples.get("room_outbox_sink_reloads_total{sink=\"fake\",result=\"ok\"}").is_some_and(|n| *n >= 1.0));
    let audit_reloads = |result: &str| {
        samples.get(&format!("room_outbox_sink_reloads_total{{sink=\"audit\",result=\"{result}\"}}")).copied()
    };
    assert_eq!((audit_reloads("ok").unwrap_or(0.0), audit_reloads("refused").unwrap_or(0.0)), (0.0, 0.0));
    host.stop().await;

    for (name, collector) in [("fake", &world.collector), ("audit", &audit)] {
        let mut seen: HashMap<String, usize> = HashMap::new();
        for r in collector.reports() {
            *seen.entry(r.event_id).or_insert(0) += 1;
        }
        for e in &events {
            assert_eq!(seen.get(&e.event_id), Some(&1), "{name} got {} once", e.event_id);
        }
    }
    let mut first_builds = HashSet::new();
    for e in &events {
        first_builds.insert(world.row(&e.event_id).await.plugin_digest.expect("a digest with each outcome"));
        assert_eq!(audit_state.get(&e.event_id).await.unwrap().unwrap().status, Status::Delivered);
    }
    assert_eq!(first_builds, HashSet::from([first_digest, second_digest]), "both builds delivered");
}

/// `SIGHUP` makes the real binary reload its sink (with the file watch off): the log says
/// so, and the next event records the new build; so does `POST /api/sinks/NAME/reload`.
#[tokio::test]
async fn sighup_reloads_the_binarys_sink() {
    let world = World::new().await;
    let original = std::fs::read(FAKE_SINK).unwrap();
    let plugin = world.dir.path().join("fake_sink.wasm");
    std::fs::write(&plugin, &original).unwrap();
    let port = crate::binary::free_port();
    let yaml = world
        .setup("", "")
        .set(&["sink", "plugin"], plugin.to_str().unwrap())
        .set(&["sink", "watch_plugin"], "false")
        .set(&["admin", "listen"], &format!("127.0.0.1:{port}"))
        .set(&["admin", "token"], TOKEN)
        .yaml();
    let child = crate::binary::spawn_host(&world, &yaml);
    let first = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    crate::binary::wait_table(&world, "the first event delivered", |s| s.count(Status::Delivered) == 1).await;
    assert_eq!(world.row(&first).await.plugin_digest, Some(digest(&original)));

    let second = another_build(&original, "hup");
    deploy(&plugin, &second);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before_signal = world.produce("RoomGiftSent", "room-2", Status::Pending).await;
    crate::binary::wait_table(&world, "the second event delivered", |s| s.count(Status::Delivered) == 2).await;
    assert_eq!(world.row(&before_signal).await.plugin_digest, Some(digest(&original)), "no reload without a signal");

    crate::binary::signal(&child, "HUP");
    let deadline = tokio::time::Instant::now() + crate::support::PATIENCE;
    let mut n = 2;
    loop {
        let id = world.produce("RoomGiftSent", "room-3", Status::Pending).await;
        n += 1;
        crate::binary::wait_table(&world, "the next event delivered", |s| s.count(Status::Delivered) == n).await;
        if world.row(&id).await.plugin_digest == Some(digest(&second)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "SIGHUP did not reload the sink");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The admin endpoint: a third build, swapped in on request.
    let third = another_build(&original, "api");
    deploy(&plugin, &third);
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/api/sinks/fake/reload");
    let answer: serde_json::Value =
        serde_json::from_str(&client.post(&url).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap())
            .unwrap();
    assert_eq!(answer["reloaded"], true, "{answer}");
    assert_eq!(answer["plugin_digest"], digest(&third).as_str());
    assert_eq!(answer["from"], digest(&second).as_str());
    let again: serde_json::Value =
        serde_json::from_str(&client.post(&url).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap())
            .unwrap();
    assert_eq!(again["reloaded"], false, "the same build again changes nothing: {again}");
    let after_api = world.produce("RoomGiftSent", "room-4", Status::Pending).await;
    n += 1;
    crate::binary::wait_table(&world, "the event after the API reload", |s| s.count(Status::Delivered) == n).await;
    assert_eq!(world.row(&after_api).await.plugin_digest, Some(digest(&third)));
    crate::binary::signal(&child, "TERM");
    let out = crate::binary::wait_exit(child).await;
    assert!(out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("sink reloaded") && log.contains("trigger=\"SIGHUP\""), "{log}");
}

/// The same build with one byte of its data changed: the same size, another digest.
fn rewritten(wasm: &[u8]) -> Vec<u8> {
    let needle = b"fake: scripted permanent failure";
    let at = wasm.windows(needle.len()).position(|w| w == needle).expect("the fake sink's message") + needle.len() - 1;
    let mut out = wasm.to_vec();
    out[at] = b'E';
    out
}

/// A plugin file rewritten in place with a build of the same size, its modification time
/// put back: the content's digest changes, so the watch reloads it. Then the file made
/// group-writable: a reload refuses it (over the API, 422, naming the mode) and the build
/// that was delivering goes on.
#[tokio::test]
async fn a_rewrite_in_place_is_noticed_and_a_writable_file_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let world = World::new().await;
    let original = std::fs::read(FAKE_SINK).unwrap();
    let plugin = world.dir.path().join("fake_sink.wasm");
    std::fs::write(&plugin, &original).unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = world
        .setup("retry_interval: 1h", "default: permanent")
        .set(&["sink", "plugin"], plugin.to_str().unwrap())
        .set(&["admin", "token"], TOKEN)
        .with_admin()
        .parse();
    let mut host = Running::start(config).await;
    let base = format!("http://{}", host.admin.unwrap());
    let first = world.produce("RoomGiftSent", "room-1", Status::Pending).await;
    host.wait_status(&world, &[&first], Status::Failed).await;
    assert_eq!(world.row(&first).await.last_error.as_deref(), Some("fake: scripted permanent failure"));

    let changed = rewritten(&original);
    assert_eq!(changed.len(), original.len());
    let modified = std::fs::metadata(&plugin).unwrap().modified().unwrap();
    {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new().write(true).open(&plugin).unwrap();
        file.write_all(&changed).unwrap();
        file.set_modified(modified).unwrap();
    }
    assert_eq!(std::fs::metadata(&plugin).unwrap().modified().unwrap(), modified, "the same modification time");
    host.wait_for("the rewritten build to be swapped in", || async {
        metric(&base, "room_outbox_sink_reloads_total{sink=\"fake\",result=\"ok\"}").await >= 1.0
    })
    .await;
    let second = world.produce("RoomGiftSent", "room-2", Status::Pending).await;
    host.wait_status(&world, &[&second], Status::Failed).await;
    let row = world.row(&second).await;
    assert_eq!(row.last_error.as_deref(), Some("fake: scripted permanent failurE"));
    assert_eq!(row.plugin_digest, Some(digest(&changed)));

    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o664)).unwrap();
    let refused =
        reqwest::Client::new().post(format!("{base}/api/sinks/fake/reload")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(refused.status(), 422);
    let why = refused.text().await.unwrap();
    assert!(why.contains("is writable by other users (mode 0664)"), "{why}");
    let third = world.produce("RoomGiftSent", "room-3", Status::Pending).await;
    host.wait_status(&world, &[&third], Status::Failed).await;
    assert_eq!(world.row(&third).await.plugin_digest, Some(digest(&changed)), "the build that was delivering goes on");
    host.stop().await;
}
