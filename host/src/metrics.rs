//! Prometheus metrics in the text exposition format, with the seed's names. Counters and
//! histograms are updated by the worker as it goes; the gauges that need a database query
//! are refreshed on an interval (`admin.stats_interval`), never per scrape.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use crate::sink::FailureClass;
use crate::store::{Stats, Status};

/// Upper bounds of the latency buckets, in milliseconds.
const LATENCY_BUCKETS_MS: &[f64] =
    &[1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0];
/// Upper bounds of the claimed-batch-size buckets.
const BATCH_BUCKETS: &[f64] = &[0.0, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0, 10000.0];

#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], value: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; bounds.len()];
        }
        for (i, bound) in bounds.iter().enumerate() {
            if value <= *bound {
                self.counts[i] += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, bound) in bounds.iter().enumerate() {
            let n = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{} {}", braces(labels), self.sum);
        let _ = writeln!(out, "{name}_count{} {}", braces(labels), self.count);
    }
}

fn braces(labels: &str) -> String {
    if labels.is_empty() { String::new() } else { format!("{{{labels}}}") }
}

/// Label values are event types, sink names, kinds: escape them anyway.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[derive(Default)]
struct Values {
    success: BTreeMap<String, u64>,
    skipped: BTreeMap<String, u64>,
    failure: BTreeMap<(String, &'static str), u64>,
    latency: Histogram,
    claims: u64,
    claimed_rows: Histogram,
    rescues: u64,
    handed_back: u64,
    db_errors: BTreeMap<&'static str, u64>,
    sink_limits: BTreeMap<&'static str, u64>,
    panics: u64,
    rows: Vec<(Status, i64)>,
    oldest_waiting_age_ms: i64,
    stats_refreshed: bool,
}

/// The budgets of [`Metrics::sink_limit`], all exported from the start.
const SINK_LIMITS: [&str; 7] = ["log", "message", "skip_reason", "stdio", "requests", "request_bytes", "retry_after"];

/// Everything `/metrics` shows, for one host and its sink.
pub struct Metrics {
    sink: String,
    values: Mutex<Values>,
}

impl Metrics {
    /// Metrics for the sink named `sink`.
    pub fn new(sink: &str) -> Metrics {
        Metrics { sink: escape(sink), values: Mutex::default() }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Values) -> R) -> R {
        f(&mut self.values.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A delivery the sink accepted (`skipped` is also counted apart).
    pub fn delivered(&self, event_type: &str, skipped: bool, took: Duration) {
        self.with(|v| {
            *v.success.entry(event_type.to_string()).or_default() += 1;
            if skipped {
                *v.skipped.entry(event_type.to_string()).or_default() += 1;
            }
            v.latency.observe(LATENCY_BUCKETS_MS, took.as_secs_f64() * 1000.0);
        });
    }

    /// Deliveries counted so far (all event types), for the benchmark's exactly-once check.
    pub fn delivered_total(&self) -> u64 {
        self.with(|v| v.success.values().sum())
    }

    /// A failed attempt of this kind.
    pub fn failed(&self, event_type: &str, class: FailureClass, took: Option<Duration>) {
        self.with(|v| {
            *v.failure.entry((event_type.to_string(), class.as_str())).or_default() += 1;
            if let Some(took) = took {
                v.latency.observe(LATENCY_BUCKETS_MS, took.as_secs_f64() * 1000.0);
            }
        });
    }

    /// A claim returned `rows` rows, `rescued` of them with an expired lease.
    pub fn claimed(&self, rows: usize, rescued: usize) {
        self.with(|v| {
            v.claims += 1;
            v.claimed_rows.observe(BATCH_BUCKETS, rows as f64);
            v.rescues += rescued as u64;
        });
    }

    /// Rows handed back unstarted.
    pub fn handed_back(&self, rows: u64) {
        self.with(|v| v.handed_back += rows);
    }

    /// A sink went past one of its budgets (`log`, `message`, `skip_reason`, `stdio`,
    /// `requests`, `request_bytes`, `retry_after`); the excess was dropped or clamped.
    pub fn sink_limit(&self, limit: &'static str) {
        self.with(|v| *v.sink_limits.entry(limit).or_default() += 1);
    }

    /// A delivery task panicked; its row was recorded as retryable.
    pub fn delivery_panic(&self) {
        self.with(|v| v.panics += 1);
    }

    /// A database operation failed.
    pub fn db_error(&self, operation: &'static str) {
        self.with(|v| *v.db_errors.entry(operation).or_default() += 1);
    }

    /// The latest table counts (from the periodic refresh).
    pub fn set_stats(&self, stats: &Stats, now_ms: i64) {
        self.with(|v| {
            v.rows = stats.counts.clone();
            v.oldest_waiting_age_ms = stats.oldest_waiting_created_at_ms.map_or(0, |c| (now_ms - c).max(0));
            v.stats_refreshed = true;
        });
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let sink = &self.sink;
        let mut out = String::new();
        self.with(|v| {
            out.push_str("# HELP room_outbox_pending_total Rows waiting for delivery (pending, retryable).\n");
            out.push_str("# TYPE room_outbox_pending_total gauge\n");
            for status in [Status::Pending, Status::Retryable] {
                let n = v.rows.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n);
                let _ = writeln!(out, "room_outbox_pending_total{{status=\"{status}\"}} {n}");
            }
            out.push_str("# HELP room_outbox_rows Rows in the outbox table by status.\n");
            out.push_str("# TYPE room_outbox_rows gauge\n");
            for status in Status::ALL {
                let n = v.rows.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n);
                let _ = writeln!(out, "room_outbox_rows{{status=\"{status}\"}} {n}");
            }
            out.push_str(
                "# HELP room_outbox_oldest_pending_age_ms Age of the oldest pending or retryable row (0 when none).\n",
            );
            out.push_str("# TYPE room_outbox_oldest_pending_age_ms gauge\n");
            let _ = writeln!(out, "room_outbox_oldest_pending_age_ms {}", v.oldest_waiting_age_ms);
            out.push_str("# HELP room_outbox_stats_up Whether the table counts above have been read at least once.\n");
            out.push_str("# TYPE room_outbox_stats_up gauge\n");
            let _ = writeln!(out, "room_outbox_stats_up {}", u8::from(v.stats_refreshed));

            out.push_str("# HELP room_outbox_publish_success_total Events the sink delivered (skipped included).\n");
            out.push_str("# TYPE room_outbox_publish_success_total counter\n");
            for (event_type, n) in &v.success {
                let _ = writeln!(
                    out,
                    "room_outbox_publish_success_total{{sink=\"{sink}\",event_type=\"{}\"}} {n}",
                    escape(event_type)
                );
            }
            out.push_str("# HELP room_outbox_publish_failure_total Failed delivery attempts by kind.\n");
            out.push_str("# TYPE room_outbox_publish_failure_total counter\n");
            for ((event_type, kind), n) in &v.failure {
                let _ = writeln!(
                    out,
                    "room_outbox_publish_failure_total{{sink=\"{sink}\",event_type=\"{}\",kind=\"{kind}\"}} {n}",
                    escape(event_type)
                );
            }
            out.push_str("# HELP room_outbox_skipped_total Events the sink does not carry, stored as delivered.\n");
            out.push_str("# TYPE room_outbox_skipped_total counter\n");
            for (event_type, n) in &v.skipped {
                let _ = writeln!(
                    out,
                    "room_outbox_skipped_total{{sink=\"{sink}\",event_type=\"{}\"}} {n}",
                    escape(event_type)
                );
            }
            out.push_str("# HELP room_outbox_publish_latency_ms Time of one sink call, sandbox included.\n");
            out.push_str("# TYPE room_outbox_publish_latency_ms histogram\n");
            v.latency.render(
                &mut out,
                "room_outbox_publish_latency_ms",
                &format!("sink=\"{sink}\""),
                LATENCY_BUCKETS_MS,
            );

            out.push_str("# HELP room_outbox_claims_total Claims that returned at least one row.\n");
            out.push_str("# TYPE room_outbox_claims_total counter\n");
            let _ = writeln!(out, "room_outbox_claims_total {}", v.claims);
            out.push_str("# HELP room_outbox_claim_batch_size Rows per non-empty claim.\n");
            out.push_str("# TYPE room_outbox_claim_batch_size histogram\n");
            v.claimed_rows.render(&mut out, "room_outbox_claim_batch_size", "", BATCH_BUCKETS);
            out.push_str(
                "# HELP room_outbox_lease_rescues_total Rows claimed again after another worker's lease expired.\n",
            );
            out.push_str("# TYPE room_outbox_lease_rescues_total counter\n");
            let _ = writeln!(out, "room_outbox_lease_rescues_total {}", v.rescues);
            out.push_str(
                "# HELP room_outbox_handed_back_total Claimed rows handed back unstarted (shutdown, short lease).\n",
            );
            out.push_str("# TYPE room_outbox_handed_back_total counter\n");
            let _ = writeln!(out, "room_outbox_handed_back_total {}", v.handed_back);
            out.push_str("# HELP room_outbox_db_errors_total Failed database operations by operation.\n");
            out.push_str("# TYPE room_outbox_db_errors_total counter\n");
            for operation in ["claim", "mark", "release", "stats"] {
                let n = v.db_errors.get(operation).copied().unwrap_or(0);
                let _ = writeln!(out, "room_outbox_db_errors_total{{op=\"{operation}\"}} {n}");
            }
            out.push_str("# HELP room_outbox_sink_limit_hits_total Times a sink went past a budget; the excess was dropped or clamped.\n");
            out.push_str("# TYPE room_outbox_sink_limit_hits_total counter\n");
            for limit in SINK_LIMITS {
                let n = v.sink_limits.get(limit).copied().unwrap_or(0);
                let _ = writeln!(out, "room_outbox_sink_limit_hits_total{{sink=\"{sink}\",limit=\"{limit}\"}} {n}");
            }
            out.push_str("# HELP room_outbox_delivery_panics_total Delivery tasks that panicked; their rows were recorded as retryable.\n");
            out.push_str("# TYPE room_outbox_delivery_panics_total counter\n");
            let _ = writeln!(out, "room_outbox_delivery_panics_total{{sink=\"{sink}\"}} {}", v.panics);
            out.push_str("# HELP room_outbox_log_lines_dropped_total Log lines dropped because the log output was closed, broken or too slow.\n");
            out.push_str("# TYPE room_outbox_log_lines_dropped_total counter\n");
            let _ = writeln!(out, "room_outbox_log_lines_dropped_total {}", crate::logging::dropped_lines());
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let m = Metrics::new("fake");
        m.delivered("RoomGiftSent", false, Duration::from_millis(3));
        m.delivered("RoomGiftSent", true, Duration::from_millis(700));
        let text = m.render();
        assert!(text.contains("room_outbox_publish_latency_ms_bucket{sink=\"fake\",le=\"2.5\"} 0\n"), "{text}");
        assert!(text.contains("room_outbox_publish_latency_ms_bucket{sink=\"fake\",le=\"5\"} 1\n"), "{text}");
        assert!(text.contains("room_outbox_publish_latency_ms_bucket{sink=\"fake\",le=\"1000\"} 2\n"), "{text}");
        assert!(text.contains("room_outbox_publish_latency_ms_bucket{sink=\"fake\",le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("room_outbox_publish_latency_ms_count{sink=\"fake\"} 2\n"), "{text}");
        assert!(text.contains("room_outbox_publish_success_total{sink=\"fake\",event_type=\"RoomGiftSent\"} 2\n"));
        assert!(text.contains("room_outbox_skipped_total{sink=\"fake\",event_type=\"RoomGiftSent\"} 1\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new("a\"b");
        m.failed("x\ny", FailureClass::Trap, None);
        let text = m.render();
        assert!(text.contains("{sink=\"a\\\"b\",event_type=\"x\\ny\",kind=\"trap\"} 1"), "{text}");
    }
}
