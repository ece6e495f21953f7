//! Where a sink's requests may go: checked by address as well as by name, ports pinned,
//! plain http opt-in, the host's own headers kept, and requests per attempt bounded.

use outbox_host::store::Status;
use outbox_test_support::Collector;

use crate::support::{Running, SinkSpec, World};

/// Runs one event in `room-x` with `behaviour` on the fake sink whose `allowed_hosts` and
/// extra sink lines are given; returns the row once it has an outcome.
async fn attempt(
    world: &World,
    behaviour: &str,
    allowed_hosts: Vec<String>,
    sink: &[(&str, &str)],
) -> outbox_host::store::Row {
    let id = world.produce("RoomGiftSent", "room-x", Status::Pending).await;
    let mut spec: SinkSpec = world.fake_sink(&format!("room.room-x: \"{behaviour}\""));
    spec.allowed_hosts.extend(allowed_hosts);
    let mut config = world.setup_with("retry_interval: 1h", &spec);
    for (key, value) in sink {
        config = config.set(&["sink", key], value);
    }
    let mut host = Running::start(config.parse()).await;
    host.wait_for("an outcome", || async {
        world.row(&id).await.status != Status::Pending && world.row(&id).await.status != Status::Delivering
    })
    .await;
    host.stop().await;
    world.row(&id).await
}

/// `localhost` is an allowed name, but it resolves to loopback: refused, until the address
/// itself is allowed.
#[tokio::test]
async fn an_allowed_name_resolving_to_loopback_is_refused_unless_the_address_is_allowed() {
    loopback_by_name("localhost").await;
}

/// `localhost.` (a fully qualified name) is `localhost`, under the same policy: refused for
/// resolving to loopback until the address is allowed, then delivered.
#[tokio::test]
async fn a_name_with_a_trailing_dot_is_the_same_name() {
    loopback_by_name("localhost.").await;
}

/// A URL naming `name` (`localhost`, with or without its dot) with `localhost` allowed:
/// refused for resolving to loopback, also with the address allowed on another port, and
/// delivered once the address is allowed on its port.
async fn loopback_by_name(name: &str) {
    let world = World::new().await;
    let target = Collector::start().await;
    let port = target.port();
    let url = format!("http://{name}:{port}/ok");
    let row = attempt(&world, &format!("http:{url}"), vec![format!("localhost:{port}")], &[]).await;
    assert_eq!(row.status, Status::Retryable);
    let error = row.last_error.unwrap();
    assert!(
        error.contains("localhost resolves to an address sinks may not reach")
            && error.contains("127.0.0.1 is loopback"),
        "{error}"
    );
    assert!(target.seen().is_empty(), "the request went out");

    // Allowing the address for another port is not enough.
    let world = World::new().await;
    let hosts = vec![format!("localhost:{port}"), format!("127.0.0.0/8:{}", port.wrapping_add(1))];
    let row = attempt(&world, &format!("http:{url}"), hosts, &[]).await;
    assert_eq!(row.status, Status::Retryable);
    assert!(target.seen().is_empty(), "the request went out");

    let world = World::new().await;
    let hosts = vec![format!("localhost:{port}"), format!("127.0.0.0/8:{port}")];
    let row = attempt(&world, &format!("http:{url}"), hosts, &[]).await;
    assert_eq!(row.status, Status::Delivered, "{:?}", row.last_error);
    assert_eq!(target.seen().len(), 1);
}

/// An IPv6 literal entry matches an IPv6 URL.
#[tokio::test]
async fn an_ipv6_literal_entry_is_honoured() {
    let world = World::new().await;
    let v6 = Collector::start_on("[::1]:0").await;
    let row = attempt(&world, &format!("http:{}", v6.url("/ok")), vec![v6.host_port()], &[]).await;
    assert_eq!(v6.host_port(), format!("[::1]:{}", v6.port()));
    assert_eq!(row.status, Status::Delivered, "{:?}", row.last_error);
    assert_eq!(v6.seen().len(), 1);
}

/// An entry without a port means 443 (and 80 with plain http): not the server's port.
#[tokio::test]
async fn an_entry_without_a_port_does_not_allow_every_port() {
    let world = World::new().await;
    let target = Collector::start().await;
    let row = attempt(&world, &format!("http:{}", target.url("/ok")), vec!["127.0.0.1".into()], &[]).await;
    assert_eq!(row.status, Status::Retryable);
    let error = row.last_error.unwrap();
    assert!(error.ends_with(&format!("127.0.0.1:{} is not in this sink's allowed_hosts", target.port())), "{error}");
    assert!(target.seen().is_empty());
}

/// Plain `http` needs `sink.allow_http: true`. A request the policy refuses is a config
/// mistake: the row waits without spending an attempt.
#[tokio::test]
async fn plain_http_is_off_by_default() {
    let world = World::new().await;
    let row =
        attempt(&world, &format!("http:{}", world.collector.url("/ok")), vec![], &[("allow_http", "false")]).await;
    assert_eq!((row.status, row.retry_count), (Status::Retryable, 0));
    // The fake sink's report to its collector is its first request, and is refused the same way.
    assert_eq!(row.last_error.unwrap(), "misconfigured: plain http is off for this sink (sink.allow_http)");
}

/// `Host`, `Connection` and `Proxy-*` come from the host, not the sink.
#[tokio::test]
async fn the_sink_cannot_set_host_connection_or_proxy_headers() {
    let world = World::new().await;
    let row = attempt(&world, &format!("http-headers:{}", world.collector.url("/ok")), vec![], &[]).await;
    assert_eq!(row.status, Status::Delivered, "{:?}", row.last_error);
    let seen = world.collector.seen();
    let headers = &seen[0].headers;
    let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(get("host"), Some(world.collector.host_port().as_str()));
    assert_eq!(get("proxy-authorization"), None);
    assert_ne!(get("connection"), Some("upgrade"));
    assert_eq!(get("x-sink"), Some("fake"), "ordinary headers pass");
}

/// At most `sink.max_requests` requests per attempt, and no body over `max_request_bytes`.
#[tokio::test]
async fn requests_per_attempt_and_body_size_are_bounded() {
    let world = World::new().await;
    let row = attempt(&world, &format!("http-many:40:{}", world.collector.url("/ok")), vec![], &[]).await;
    assert_eq!(row.status, Status::Retryable);
    let error = row.last_error.unwrap();
    // The fake sink's report to the collector is the attempt's first request.
    assert!(error.contains("request 16 failed: denied: more than 16 requests in one attempt"), "{error}");
    assert_eq!(world.collector.seen().len(), 15);

    let world = World::new().await;
    let lines = &[("max_request_bytes", "64KiB")];
    let row = attempt(&world, &format!("http-post:2000000:{}", world.collector.url("/ok")), vec![], lines).await;
    assert_eq!(row.status, Status::Retryable);
    let error = row.last_error.unwrap();
    assert!(error.contains("request body of 2000000 bytes is larger than sink.max_request_bytes (65536)"), "{error}");
    assert!(world.collector.seen().is_empty());
}
