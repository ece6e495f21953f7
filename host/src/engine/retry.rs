//! The retry decision: what a failed attempt leaves its row in, and when it may be tried
//! again. A pure function of the failure, the attempt number, the config and the clock.

use std::time::Duration;

use super::settings::WorkerConfig;
use crate::sandbox::{AttemptFailure, FailureClass};
use crate::store::Outcome;
use crate::text::short_error;

/// What to record after a failed attempt: `failed` for a permanent failure or when
/// `max_attempts` is used up, else `retryable` after `retry_interval`, or later if the sink
/// asked (its hint was clamped to `sink.max_retry_after` already; the sum saturates).
pub fn after_failure(failure: &AttemptFailure, attempt: i32, config: &WorkerConfig, now_ms: i64) -> Outcome {
    let AttemptFailure { class, message, retry_after } = failure;
    let exhausted = config.max_attempts > 0 && i64::from(attempt) >= i64::from(config.max_attempts);
    if *class == FailureClass::Permanent {
        Outcome::Fail { error: short_error(message) }
    } else if exhausted {
        Outcome::Fail { error: short_error(&format!("gave up after {attempt} attempts: {message}")) }
    } else {
        let wait = retry_after.unwrap_or_default().max(config.retry_interval);
        Outcome::Retry { error: short_error(message), next_retry_at_ms: now_ms.saturating_add(millis(wait)) }
    }
}

/// A duration in milliseconds, saturating at `i64::MAX`.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(class: FailureClass, message: &str, retry_after: Option<Duration>) -> AttemptFailure {
        AttemptFailure { class, message: message.into(), retry_after }
    }

    fn config(max_attempts: u32) -> WorkerConfig {
        WorkerConfig { retry_interval: Duration::from_secs(2), max_attempts, ..WorkerConfig::default() }
    }

    #[test]
    fn a_permanent_failure_fails_at_once() {
        let outcome = after_failure(&failure(FailureClass::Permanent, "bad group", None), 1, &config(0), 1_000);
        assert_eq!(outcome, Outcome::Fail { error: "bad group".into() });
    }

    #[test]
    fn retryable_failures_wait_retry_interval_or_the_sinks_longer_hint() {
        let at = |hint: Option<Duration>| match after_failure(
            &failure(FailureClass::Retryable, "busy", hint),
            1,
            &config(0),
            1_000,
        ) {
            Outcome::Retry { next_retry_at_ms, .. } => next_retry_at_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(at(None), 3_000);
        assert_eq!(at(Some(Duration::from_millis(500))), 3_000, "a hint never brings the retry closer");
        assert_eq!(at(Some(Duration::from_secs(60))), 61_000);
        assert_eq!(at(Some(Duration::MAX)), i64::MAX, "saturates instead of overflowing");
    }

    #[test]
    fn timeouts_and_traps_are_retried_like_retryable_failures() {
        for class in [FailureClass::Timeout, FailureClass::Trap] {
            let outcome = after_failure(&failure(class, "sink trapped", None), 3, &config(0), 0);
            assert_eq!(outcome, Outcome::Retry { error: "sink trapped".into(), next_retry_at_ms: 2_000 });
        }
    }

    #[test]
    fn the_last_allowed_attempt_fails_the_row() {
        let retry = after_failure(&failure(FailureClass::Retryable, "busy", None), 2, &config(3), 0);
        assert!(matches!(retry, Outcome::Retry { .. }), "{retry:?}");
        let last = after_failure(&failure(FailureClass::Timeout, "busy", None), 3, &config(3), 0);
        assert_eq!(last, Outcome::Fail { error: "gave up after 3 attempts: busy".into() });
    }
}
