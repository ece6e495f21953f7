//! Whether the worker's database work succeeds: how many claims and outcome writes have
//! failed in a row, and the last database error. `/readyz` turns 503 once the run of
//! failures reaches `admin.unready_after_db_failures`, because a host whose every claim fails
//! (a dropped column, a revoked grant) is not ready even when `SELECT 1` answers. The status
//! page shows the last error.

use std::sync::Mutex;

/// Longest error text kept, in bytes; a database can return long messages.
const ERROR_BYTES: usize = 300;

/// The last failed database operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbFailure {
    /// `claim`, `mark`, `release`, `partitions` or `stats`.
    pub operation: &'static str,
    /// The database's message, printable and at most [`ERROR_BYTES`] bytes (plus the clip mark).
    pub error: String,
    /// When it failed, UTC milliseconds.
    pub at_ms: i64,
}

#[derive(Default)]
struct State {
    /// Failed claims since the last claim that succeeded.
    claims: u32,
    /// Failed outcome writes (and hand-backs) since the last write that succeeded.
    writes: u32,
    last: Option<DbFailure>,
}

/// The run of failed worker operations and the last database error.
#[derive(Default)]
pub struct DbHealth {
    state: Mutex<State>,
}

impl DbHealth {
    /// A worker operation succeeded: its run of failures ends. Claims and writes are
    /// counted apart, so that claims that work do not hide writes that keep failing.
    pub fn succeeded(&self, operation: &'static str) {
        let mut state = self.lock();
        match operation {
            "claim" => state.claims = 0,
            "stats" => {}
            _ => state.writes = 0,
        }
    }

    /// A database operation failed. Only the worker's operations lengthen a run; a failed
    /// `stats` refresh is still the last error shown.
    pub fn failed(&self, operation: &'static str, error: &dyn std::fmt::Display, at_ms: i64) {
        let mut state = self.lock();
        match operation {
            "claim" => state.claims = state.claims.saturating_add(1),
            "stats" => {}
            _ => state.writes = state.writes.saturating_add(1),
        }
        let error = crate::text::printable(&crate::redact::scrub(&error.to_string()), ERROR_BYTES);
        state.last = Some(DbFailure { operation, error, at_ms });
    }

    /// The longer run: claims that failed since the last claim that succeeded, or writes
    /// since the last write that succeeded.
    pub fn failures_in_a_row(&self) -> u32 {
        let state = self.lock();
        state.claims.max(state.writes)
    }

    /// The last database error since start, if any.
    pub fn last_failure(&self) -> Option<DbFailure> {
        self.lock().last.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_ends_the_run_but_the_last_error_stays() {
        let health = DbHealth::default();
        health.failed("claim", &"Unknown column 'lock_until_ms'", 10);
        health.failed("claim", &"Unknown column 'lock_until_ms'", 15);
        health.failed("mark", &"gone", 20);
        assert_eq!(health.failures_in_a_row(), 2);
        health.succeeded("claim");
        assert_eq!(health.failures_in_a_row(), 1, "the write still failed last");
        health.succeeded("mark");
        assert_eq!(health.failures_in_a_row(), 0);
        assert_eq!(health.last_failure(), Some(DbFailure { operation: "mark", error: "gone".into(), at_ms: 20 }));
    }

    #[test]
    fn claims_that_work_do_not_hide_writes_that_keep_failing() {
        let health = DbHealth::default();
        for at in 0..3 {
            health.succeeded("claim");
            health.failed("mark", &"Unknown column 'last_error'", at);
        }
        assert_eq!(health.failures_in_a_row(), 3);
    }

    #[test]
    fn stats_failures_are_shown_but_do_not_make_the_host_unready() {
        let health = DbHealth::default();
        health.failed("stats", &"timeout", 5);
        assert_eq!(health.failures_in_a_row(), 0);
        assert_eq!(health.last_failure().unwrap().operation, "stats");
    }

    #[test]
    fn long_or_control_laden_errors_are_clamped() {
        let health = DbHealth::default();
        health.failed("claim", &format!("a\u{1b}[31m{}", "x".repeat(5_000)), 1);
        let shown = health.last_failure().unwrap().error;
        assert!(shown.len() <= ERROR_BYTES + crate::text::CLIPPED.len(), "{} bytes", shown.len());
        assert!(shown.ends_with(crate::text::CLIPPED));
        assert!(!shown.contains('\u{1b}'));
    }
}
