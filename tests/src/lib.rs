//! Test support for the end-to-end tests: paths of the sink plugins built from `plugins/`,
//! and a collector HTTP server that records what the fake sink reports.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::post;

pub mod brokers;
pub mod db;
pub mod otlp;
pub mod proxy;
pub mod skip;
pub mod tencent;
pub mod webdriver;
pub mod webhook;

include!(concat!(env!("OUT_DIR"), "/plugins.rs"));

/// One attempt the fake sink reported: `<event_id> <attempt> <behaviour>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The event.
    pub event_id: String,
    /// Its attempt number (1 on the first worker attempt).
    pub attempt: u32,
    /// The behaviour the sink ran.
    pub behaviour: String,
    /// When the collector received the report (the attempt had just started).
    pub at: std::time::Instant,
}

/// A local HTTP server the fake sink reports each attempt to (`POST /report`), which also
/// answers any other request (`GET /ok`, `POST /events`) with 200 and records its path,
/// headers and body.
pub struct Collector {
    addr: SocketAddr,
    reports: Arc<Mutex<Vec<Report>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// One request other than `/report` as the server received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Its path.
    pub path: String,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// Body length.
    pub body_len: usize,
    /// The body, if it is JSON.
    pub json: Option<serde_json::Value>,
}

impl Collector {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Collector {
        Collector::start_on("127.0.0.1:0").await
    }

    /// Starts the server on `addr` (e.g. `[::1]:0`).
    pub async fn start_on(addr: &str) -> Collector {
        let reports: Arc<Mutex<Vec<Report>>> = Arc::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let app = Router::new()
            .route("/report", post(record))
            .with_state(reports.clone())
            .merge(Router::new().fallback(observe).with_state(seen.clone()));
        let listener = tokio::net::TcpListener::bind(addr).await.expect("binding the collector");
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.expect("collector server") });
        Collector { addr, reports, seen }
    }

    /// The requests other than `/report` received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// `host:port` (`[v6]:port` for IPv6), for the sink's `allowed_hosts`.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A URL on this server.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Everything reported so far.
    pub fn reports(&self) -> Vec<Report> {
        self.reports.lock().unwrap().clone()
    }

    /// The reports for one event.
    pub fn attempts_of(&self, event_id: &str) -> Vec<Report> {
        self.reports().into_iter().filter(|r| r.event_id == event_id).collect()
    }
}

async fn observe(
    State(seen): State<Arc<Mutex<Vec<Seen>>>>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> &'static str {
    let headers = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let json = serde_json::from_slice(&body).ok();
    seen.lock().unwrap().push(Seen { path: uri.path().to_string(), headers, body_len: body.len(), json });
    "ok"
}

async fn record(State(reports): State<Arc<Mutex<Vec<Report>>>>, body: String) -> &'static str {
    let mut reports = reports.lock().unwrap();
    for line in body.lines() {
        let mut parts = line.splitn(3, ' ');
        let (Some(event_id), Some(attempt), Some(behaviour)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        reports.push(Report {
            event_id: event_id.to_string(),
            attempt: attempt.parse().unwrap_or(0),
            behaviour: behaviour.to_string(),
            at: std::time::Instant::now(),
        });
    }
    "ok"
}
