//! The text `outbox-host status` prints.

use std::fmt::Write as _;

use crate::store::{OwnerView, Stats, Status};
use crate::units::format_duration;

/// Renders which host owns which of a sink's partitions, and what each has in flight (the
/// table shows its rows `pending` while they are).
pub fn owners(owners: &[OwnerView]) -> String {
    if owners.is_empty() {
        return "partition owners: none (no host delivers it in per-room order now)\n".into();
    }
    let mut out = String::from("partition owners (per-room order; rows in flight stay pending in the table):\n");
    for o in owners {
        let _ = writeln!(
            out,
            "  {}  {} partition(s) {}  {} in flight",
            crate::text::printable(&o.owner, 128),
            o.partitions.len(),
            ranges(&o.partitions),
            o.in_flight
        );
    }
    out
}

/// `0-2, 5, 7-9` for sorted partition numbers.
pub fn ranges(parts: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < parts.len() {
        let start = parts[i];
        while i + 1 < parts.len() && parts[i + 1] == parts[i] + 1 {
            i += 1;
        }
        out.push(if parts[i] == start { start.to_string() } else { format!("{start}-{}", parts[i]) });
        i += 1;
    }
    out.join(", ")
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn partitions_read_as_ranges() {
        assert_eq!(super::ranges(&[0, 1, 2, 5, 7, 8, 9]), "0-2, 5, 7-9");
        assert_eq!(super::ranges(&[]), "");
    }
}
