//! The fan-out: copies each new outbox row once into the table of every sink beside the
//! first (see [`crate::store::sinks`]), and the back-fill of a sink added later. Any host
//! of the table fans out once the table has such sinks; one at a time does (a lock), the
//! others find nothing to do.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::settings::{WakeUp, WorkerConfig};
use crate::ops::metrics::Metrics;
use crate::store::{RegisteredSink, Store, now_ms};

/// Rows per fan-out step.
pub const FAN_OUT_BATCH: u32 = 500;
/// Keys read per back-fill step.
const BACKFILL_BATCH: u32 = 1_000;

/// Fans out until `shutdown`, waking the sinks' workers (`wakes`) after each step that
/// copied rows. Idle, it waits for an insert (PostgreSQL's `LISTEN`) or probes every
/// `probe_interval`, as the workers do; `poll_interval` bounds the wait.
pub async fn run(
    outbox: Arc<dyn Store>,
    wakes: Vec<Arc<Notify>>,
    config: WorkerConfig,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let inserted = Arc::new(Notify::new());
    let listening = match config.wake_up {
        WakeUp::Auto | WakeUp::Notify => outbox.listen_for_inserts(inserted.clone(), shutdown.child_token()),
        WakeUp::Probe | WakeUp::Poll => false,
    };
    let idle = if listening || config.wake_up == WakeUp::Poll { config.poll_interval } else { config.probe_interval };
    let mut backoff = Duration::from_millis(100);
    tracing::info!(table = %outbox.table(), "fanning out to the other sinks' tables");
    while !shutdown.is_cancelled() {
        match outbox.fan_out(FAN_OUT_BATCH, now_ms()).await {
            Ok(fanned) => {
                backoff = Duration::from_millis(100);
                metrics.db_ok("fan_out");
                if fanned > 0 {
                    tracing::debug!(fanned, "fanned out");
                    for wake in &wakes {
                        wake.notify_one();
                    }
                }
                if fanned < u64::from(FAN_OUT_BATCH) {
                    tokio::select! {
                        () = tokio::time::sleep(idle) => {}
                        () = inserted.notified() => {}
                        () = shutdown.cancelled() => {}
                    }
                }
            }
            Err(e) => {
                metrics.db_error("fan_out", &e);
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "fan-out failed; will retry");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Copies the rows fanned out before `sink` was registered into its table (those created
/// at or after its start), then records that the copy is complete; until then the sink
/// does not deliver, so that a room's old events never arrive after its new ones. Every
/// host that starts the sink meanwhile does the same; the copies are idempotent. A database
/// error is retried until `shutdown`.
pub async fn backfill(outbox: &dyn Store, sink: &RegisteredSink, shutdown: &CancellationToken) {
    let (mut after, mut copied) = (None, 0u64);
    let mut backoff = Duration::from_millis(100);
    tracing::info!(sink = %sink.name, start_from_ms = sink.start_from_ms, "copying the events from before the sink was added");
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        match outbox.backfill(sink, after.clone(), BACKFILL_BATCH).await {
            Ok(step) => {
                copied += step.rows;
                match step.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            Err(e) => {
                tracing::warn!(sink = %sink.name, error = %e, "back-fill failed; will retry");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
    loop {
        match outbox.finish_backfill(&sink.name, now_ms()).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(sink = %sink.name, error = %e, "could not record the back-fill; will retry");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => return,
                }
            }
        }
    }
    tracing::info!(sink = %sink.name, copied, "the sink has every event from its start; delivering");
}
