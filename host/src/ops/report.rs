//! The text `outbox-host status` prints.

use std::fmt::Write as _;

use crate::store::{Stats, Status};
use crate::units::format_duration;

/// Renders counts per status, the oldest waiting age and the top errors.
pub fn status(table: &str, stats: &Stats, now_ms: i64) -> String {
    let mut out = String::new();
    let total: i64 = stats.counts.iter().map(|(_, n)| n).chain(stats.unknown_statuses.iter().map(|(_, n)| n)).sum();
    let _ = writeln!(out, "{table}: {total} rows");
    for status in Status::ALL {
        let _ = writeln!(out, "  {:<11} {:>10}", status.as_str(), stats.count(status));
    }
    for (status, n) in &stats.unknown_statuses {
        let _ = writeln!(
            out,
            "  {:<11} {n:>10}  (not a status the host knows: never claimed; move these rows yourself)",
            crate::text::printable(status, 40)
        );
    }
    match stats.oldest_waiting_created_at_ms {
        Some(created) => {
            let age = std::time::Duration::from_millis((now_ms - created).max(0) as u64);
            let _ = writeln!(out, "oldest waiting (pending or retryable): {} old", format_duration(age));
        }
        None => out.push_str("oldest waiting (pending or retryable): none\n"),
    }
    let _ = writeln!(out, "delivered in the last minute: {}", stats.delivered_last_minute);
    if stats.top_errors.is_empty() {
        out.push_str("errors: none\n");
    } else {
        out.push_str("most frequent errors (retryable and failed rows):\n");
        for (error, n) in &stats.top_errors {
            let _ = writeln!(out, "  {n:>8}  {}", crate::text::printable(error, 500));
        }
    }
    out
}
