//! Test support for the end-to-end tests: paths of the sink plugins built from `plugins/`,
//! and a collector HTTP server that records what the fake sink reports.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};

pub mod tencent;
pub mod webdriver;

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
}

/// A local HTTP server the fake sink reports each attempt to (`POST /report`), which also
/// answers `GET /ok` with 200 for the sink's `http:` behaviour.
pub struct Collector {
    addr: SocketAddr,
    reports: Arc<Mutex<Vec<Report>>>,
}

impl Collector {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Collector {
        let reports: Arc<Mutex<Vec<Report>>> = Arc::default();
        let app = Router::new()
            .route("/report", post(record))
            .route("/ok", get(|| async { "ok" }))
            .with_state(reports.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the collector");
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.expect("collector server") });
        Collector { addr, reports }
    }

    /// `host:port`, for the sink's `allowed_hosts`.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
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
        });
    }
    "ok"
}
