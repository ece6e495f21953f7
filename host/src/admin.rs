//! The admin listener: `/healthz` (the process is alive) and `/readyz` (the database
//! answers and the worker runs; 503 while draining). A failing sink never makes the host
//! unready: IM trouble must not take the producer's service down with it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// What the readiness check looks at.
pub struct Readiness {
    /// The outbox store.
    pub store: Arc<dyn Store>,
    /// Set while the worker loop runs (or when the worker is disabled by config).
    pub worker_running: AtomicBool,
    /// Set once shutdown has begun.
    pub draining: AtomicBool,
}

/// Binds the admin address, so that a port already taken fails start-up.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("admin.listen: cannot listen on {addr}: {e}"))
}

/// Serves `/healthz` and `/readyz` on `listener` until `stop`.
pub fn serve(
    listener: tokio::net::TcpListener,
    readiness: Arc<Readiness>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let app =
        Router::new().route("/healthz", get(|| async { "ok\n" })).route("/readyz", get(ready)).with_state(readiness);
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin listener failed");
        }
    })
}

async fn ready(State(r): State<Arc<Readiness>>) -> (StatusCode, String) {
    if r.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n".into());
    }
    if !r.worker_running.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "worker not running\n".into());
    }
    match r.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}
