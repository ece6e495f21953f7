//! The retry decision: what a failed attempt leaves its row in, and when it may be tried
//! again. A pure function of the failure, the attempt number, the config, the clock and a
//! random draw (for the exponential strategy's jitter).

use std::time::Duration;

use super::settings::{RetryStrategy, WorkerConfig};
use crate::sandbox::{AttemptFailure, FailureClass};
use crate::store::Outcome;
use crate::text::short_error;

/// What to record after a failed attempt: `failed` for a permanent failure or when
/// `max_attempts` is used up, else `retryable` after the strategy's wait ([`wait`]), or
/// later if the sink asked (its hint was clamped to `sink.max_retry_after` already; the sum
/// saturates). `draw` is uniform in `[0, 1)`.
///
/// A retryable failure the sink pushed back with (its room or its destination is throttled
/// or down) is deferred instead: not counted against the event, so never `failed` for it,
/// and due again after the sink's hint or `retry_interval`.
pub fn after_failure(failure: &AttemptFailure, attempt: i32, config: &WorkerConfig, now_ms: i64, draw: f64) -> Outcome {
    let AttemptFailure { class, message, retry_after, pressure } = failure;
    let exhausted = config.max_attempts > 0 && i64::from(attempt) >= i64::from(config.max_attempts);
    if let Some(pressure) = pressure
        && *class == FailureClass::Retryable
    {
        let wait = retry_after.unwrap_or(config.retry_interval);
        Outcome::Defer {
            error: short_error(&format!("{}: {message}", pressure.as_str())),
            next_retry_at_ms: now_ms.saturating_add(millis(wait)),
        }
    } else if *class == FailureClass::Permanent {
        Outcome::Fail { error: short_error(message) }
    } else if exhausted {
        Outcome::Fail { error: short_error(&format!("gave up after {attempt} attempts: {message}")) }
    } else {
        let wait = retry_after.unwrap_or_default().max(wait(config, attempt, draw));
        Outcome::Retry { error: short_error(message), next_retry_at_ms: now_ms.saturating_add(millis(wait)) }
    }
}

/// The strategy's wait after failed attempt number `attempt` (from 1): `retry_interval`, or
/// with the exponential strategy a uniform draw from `[0, min(max_retry_interval,
/// retry_interval × 2^(attempt-1)))` (full jitter).
pub fn wait(config: &WorkerConfig, attempt: i32, draw: f64) -> Duration {
    match config.retry_strategy {
        RetryStrategy::FixedInterval => config.retry_interval,
        RetryStrategy::Exponential => {
            let doublings = attempt.saturating_sub(1).clamp(0, 62);
            let ceiling = Duration::try_from_secs_f64(config.retry_interval.as_secs_f64() * 2f64.powi(doublings))
                .map_or(config.max_retry_interval, |d| d.min(config.max_retry_interval));
            // A draw out of range (or NaN) must not make `mul_f64` panic.
            ceiling.mul_f64(if draw.is_nan() { 0.0 } else { draw.clamp(0.0, 1.0) })
        }
    }
}

/// A uniform draw from `[0, 1)` for [`after_failure`]'s jitter.
pub fn draw() -> f64 {
    (crate::clock::random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A duration in milliseconds, saturating at `i64::MAX`.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Pressure;

    fn failure(class: FailureClass, message: &str, retry_after: Option<Duration>) -> AttemptFailure {
        AttemptFailure { class, message: message.into(), retry_after, pressure: None }
    }

    fn config(max_attempts: u32) -> WorkerConfig {
        WorkerConfig { retry_interval: Duration::from_secs(2), max_attempts, ..WorkerConfig::default() }
    }

    #[test]
    fn a_permanent_failure_fails_at_once() {
        let outcome = after_failure(&failure(FailureClass::Permanent, "bad group", None), 1, &config(0), 1_000, 0.5);
        assert_eq!(outcome, Outcome::Fail { error: "bad group".into() });
    }

    #[test]
    fn retryable_failures_wait_retry_interval_or_the_sinks_longer_hint() {
        let at = |hint: Option<Duration>| match after_failure(
            &failure(FailureClass::Retryable, "busy", hint),
            1,
            &config(0),
            1_000,
            0.5,
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
            let outcome = after_failure(&failure(class, "sink trapped", None), 3, &config(0), 0, 0.5);
            assert_eq!(outcome, Outcome::Retry { error: "sink trapped".into(), next_retry_at_ms: 2_000 });
        }
    }

    #[test]
    fn the_last_allowed_attempt_fails_the_row() {
        let retry = after_failure(&failure(FailureClass::Retryable, "busy", None), 2, &config(3), 0, 0.5);
        assert!(matches!(retry, Outcome::Retry { .. }), "{retry:?}");
        let last = after_failure(&failure(FailureClass::Timeout, "busy", None), 3, &config(3), 0, 0.5);
        assert_eq!(last, Outcome::Fail { error: "gave up after 3 attempts: busy".into() });
    }

    fn exponential(base_ms: u64, max_ms: u64) -> WorkerConfig {
        WorkerConfig {
            retry_strategy: RetryStrategy::Exponential,
            retry_interval: Duration::from_millis(base_ms),
            max_retry_interval: Duration::from_millis(max_ms),
            ..WorkerConfig::default()
        }
    }

    #[test]
    fn fixed_interval_ignores_the_attempt_and_the_draw() {
        for (attempt, draw) in [(1, 0.0), (7, 0.99), (i32::MAX, 0.5)] {
            assert_eq!(wait(&config(0), attempt, draw), Duration::from_secs(2));
        }
    }

    #[test]
    fn the_exponential_ceiling_doubles_per_attempt_up_to_the_maximum() {
        let c = exponential(1_000, 60_000);
        let ceiling = |attempt| wait(&c, attempt, 1.0).as_millis();
        assert_eq!([1, 2, 3, 4, 5, 6, 7].map(ceiling), [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000]);
        for attempt in [8, 31, 32, 33, 63, 64, 1_000, i32::MAX] {
            assert_eq!(ceiling(attempt), 60_000, "attempt {attempt} stays at the maximum, without overflow");
        }
        assert_eq!(wait(&c, 0, 1.0).as_millis(), 1_000, "attempt 0 (never happens) is treated as the first");
        assert_eq!(wait(&c, -5, 1.0).as_millis(), 1_000);
    }

    #[test]
    fn full_jitter_spreads_each_wait_between_zero_and_its_ceiling() {
        let c = exponential(500, 10_000);
        for attempt in 1..=40 {
            let ceiling = wait(&c, attempt, 1.0);
            assert_eq!(wait(&c, attempt, 0.0), Duration::ZERO);
            assert_eq!(wait(&c, attempt, 0.5), ceiling / 2);
            for _ in 0..50 {
                let w = wait(&c, attempt, draw());
                assert!(w < ceiling || (w == ceiling && ceiling.is_zero()), "attempt {attempt}: {w:?} ≥ {ceiling:?}");
            }
        }
        assert_eq!(wait(&c, 3, 7.0), wait(&c, 3, 1.0), "a draw out of range is clamped");
        assert_eq!(wait(&c, 3, -1.0), Duration::ZERO);
        assert_eq!(wait(&c, 3, f64::NAN), Duration::ZERO);
    }

    #[test]
    fn the_draws_are_uniform_in_zero_to_one() {
        let draws: Vec<f64> = (0..10_000).map(|_| draw()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((0.45..0.55).contains(&mean), "mean {mean}");
    }

    #[test]
    fn a_sinks_longer_hint_still_wins_over_the_exponential_wait() {
        let c = exponential(1_000, 60_000);
        let hinted =
            after_failure(&failure(FailureClass::Retryable, "slow down", Some(Duration::from_secs(90))), 2, &c, 0, 0.5);
        assert_eq!(hinted, Outcome::Retry { error: "slow down".into(), next_retry_at_ms: 90_000 });
        let jittered = after_failure(&failure(FailureClass::Retryable, "busy", None), 3, &c, 10, 0.25);
        assert_eq!(jittered, Outcome::Retry { error: "busy".into(), next_retry_at_ms: 10 + 1_000 });
    }

    #[test]
    fn a_push_back_defers_without_counting_even_on_the_last_attempt() {
        for pressure in [Pressure::RoomThrottled, Pressure::Throttled, Pressure::Unavailable] {
            let pushed = |retry_after| AttemptFailure {
                pressure: Some(pressure),
                ..failure(FailureClass::Retryable, "error 10006", retry_after)
            };
            let label = pressure.as_str();
            let hinted = after_failure(&pushed(Some(Duration::from_millis(1_500))), 3, &config(3), 100, 0.5);
            assert_eq!(hinted, Outcome::Defer { error: format!("{label}: error 10006"), next_retry_at_ms: 1_600 });
            assert_eq!(hinted.counted(), 0);
            let unhinted = after_failure(&pushed(None), 1, &exponential(700, 60_000), 100, 0.0);
            assert_eq!(unhinted, Outcome::Defer { error: format!("{label}: error 10006"), next_retry_at_ms: 800 });
        }
    }

    #[test]
    fn a_push_back_with_anything_but_a_retryable_failure_is_ignored() {
        let permanent =
            AttemptFailure { pressure: Some(Pressure::Throttled), ..failure(FailureClass::Permanent, "bad", None) };
        assert_eq!(after_failure(&permanent, 1, &config(0), 0, 0.5), Outcome::Fail { error: "bad".into() });
        let timeout =
            AttemptFailure { pressure: Some(Pressure::Unavailable), ..failure(FailureClass::Timeout, "slow", None) };
        let retry = after_failure(&timeout, 1, &config(0), 0, 0.5);
        assert_eq!(retry, Outcome::Retry { error: "slow".into(), next_retry_at_ms: 2_000 });
        assert_eq!(retry.counted(), 1);
    }
}
