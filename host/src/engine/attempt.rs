//! One attempt at one row, in plain steps: decode the envelope, call the sink, decide the
//! outcome, then count and log it. Every line of the attempt, the sink's own included, is
//! inside one `deliver` span that carries room-service's fields (`worker`, `node_id`,
//! `event_id`, `event_type`, `room_id`, `retry_count`), and the attempt's `trace_id` and
//! `span_id` while tracing is on; the outcome line adds only `status` and what is
//! particular to it. With tracing on, the attempt is also an OpenTelemetry span
//! (`ops/traces.rs`), a child of the row's trace context, closed with the outcome.

use tokio::time::Instant;
use tracing::Instrument as _;

use super::breaker::Verdict;
use super::retry::after_failure;
use super::settings::WorkerConfig;
use crate::ops::metrics::Metrics;
use crate::ops::traces::{self, AttemptInfo};
use crate::sandbox::{AttemptFailure, Deliver, Delivered, FailureClass, Pressure, Turn};
use crate::store::{Claimed, Outcome};

/// Delivers `row` through `sink` and returns the outcome to record, and what the attempt
/// says about the destination (for the circuit breaker).
/// Under a room pipeline, `turn` is the event's place in its room's line (see [`Turn`]).
pub async fn deliver_one(
    sink: &dyn Deliver,
    (config, metrics, node_id, clock): (&WorkerConfig, &Metrics, &str, &super::dbclock::DbClock),
    row: &Claimed,
    turn: Turn,
) -> (Outcome, Verdict) {
    let attempt = row.retry_count.saturating_add(1);
    // With tracing off, an attempt reads no clock and describes nothing for it.
    let traced = traces::enabled()
        .then(|| {
            let info = AttemptInfo {
                trace_context: row.trace_context.as_deref(),
                event_id: &row.event_id,
                event_type: &row.event_type,
                room_id: &row.room_id,
                attempt: u32::try_from(attempt).unwrap_or(0),
                waited_ms: clock.now_ms() - row.created_at_ms,
            };
            traces::start_attempt(sink.messaging(), &info)
        })
        .flatten();
    let (trace_id, span_id) = traced.as_ref().map(|t| t.trace().ids()).unzip();
    let (trace_id, span_id) = (trace_id.map(tracing::field::display), span_id.map(tracing::field::display));
    let span = tracing::info_span!(
        "deliver",
        worker = %"room_outbox",
        node_id = %node_id,
        event_id = %row.event_id,
        event_type = %row.event_type,
        room_id = %row.room_id,
        retry_count = row.retry_count,
        trace_id,
        span_id,
    );
    async {
        let started = Instant::now();
        let (result, took) = match crate::envelope::to_event(row) {
            Err(reason) => (Err(AttemptFailure::permanent(reason)), None),
            Ok(event) => {
                let call = sink.deliver_in_turn(&event, config.publish_timeout, turn);
                let result = match &traced {
                    Some(traced) => traced.scope(call).await,
                    None => call.await,
                };
                (result, Some(started.elapsed()))
            }
        };
        let outcome = match &result {
            Ok(_) => Outcome::Delivered,
            Err(failure) => after_failure(failure, attempt, config, clock.now_ms(), super::retry::draw()),
        };
        let verdict = verdict(&result, took.is_some());
        // Which build of the sink this was, for the operator who reloads it.
        let plugin = sink.digest();
        let plugin = plugin.as_deref();
        match &result {
            Ok(delivered) => {
                let skipped = match delivered {
                    Delivered::Skipped(reason) => Some(reason.as_str()),
                    Delivered::Delivered => None,
                };
                metrics.delivered(&row.event_type, skipped.is_some(), took.unwrap_or_default());
                if let Some(traced) = traced {
                    traced.end(if skipped.is_some() { "skipped" } else { "delivered" }, None);
                }
                tracing::info!(status = "delivered", skipped, plugin, "event delivered");
            }
            Err(failure) => {
                metrics.failed(&row.event_type, failure.class.as_str(), took);
                // A deferral is not counted against the event: `retry_count` stays.
                let pushed = failure.pressure.filter(|_| matches!(outcome, Outcome::Defer { .. }));
                if let Some(pressure) = pushed {
                    metrics.pushed_back(pressure.as_str());
                }
                if let Some(traced) = traced {
                    let ended = if pushed.is_some() { "deferred" } else { outcome.status().as_str() };
                    traced.end(ended, Some(failure.class.as_str()));
                }
                // `retry_count` (the span's) is the failures before this attempt; `attempt`
                // is this one, which is also the row's failure count from now on.
                tracing::warn!(
                    status = outcome.status().as_str(),
                    attempt,
                    kind = failure.class.as_str(),
                    pressure = pushed.map(Pressure::as_str),
                    error = outcome.error().unwrap_or_default(),
                    plugin,
                    "{}",
                    match pushed {
                        Some(Pressure::Misconfigured) => "delivery deferred: the sink's config denies this request",
                        Some(_) => "delivery deferred: the sink pushed back",
                        None => "delivery failed",
                    }
                );
            }
        }
        (outcome, verdict)
    }
    .instrument(span)
    .await
}

/// What an attempt's result says about the destination. `called`: the sink was called (an
/// envelope that does not decode never reaches it).
fn verdict(result: &Result<Delivered, AttemptFailure>, called: bool) -> Verdict {
    let Err(failure) = result else { return Verdict::Answered };
    match (failure.class, failure.pressure) {
        _ if !called => Verdict::Neutral,
        (FailureClass::Retryable, Some(Pressure::RoomThrottled)) => Verdict::Neutral,
        (FailureClass::Retryable, Some(Pressure::Misconfigured)) => {
            Verdict::Misconfigured { reason: failure.message.clone() }
        }
        (FailureClass::Retryable, Some(pressure)) => {
            Verdict::PushedBack { throttled: pressure == Pressure::Throttled, retry_after: failure.retry_after }
        }
        (FailureClass::Retryable | FailureClass::Timeout, _) => Verdict::Failed,
        (FailureClass::Permanent, _) => Verdict::Answered,
        (FailureClass::Trap, _) => Verdict::Neutral,
    }
}
