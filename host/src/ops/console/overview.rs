//! The overview at `/`: this host's troubles (the database, its brokers, sinks paused as
//! misconfigured) and every sink registered on the table, each on its own row with its
//! state and counts, linking to its page. Nothing here speaks for one sink alone.

use std::fmt::Write as _;

use super::{Frame, SinkLine, age, esc, foot, sink_link, top};
use crate::ops::metrics::BrokerReport;
use crate::store::Status;

/// What the overview shows beyond the frame.
pub struct Overview<'a> {
    /// Every registered sink, in registration order; `None` when their counts could not be
    /// read.
    pub sinks: Option<Vec<SinkLine<'a>>>,
    /// Every broker this host's relays publish to.
    pub brokers: Vec<(String, BrokerReport)>,
    /// This host's sinks paused as misconfigured, with why.
    pub misconfigured: Vec<(String, String)>,
}

/// Renders the overview.
pub fn render(f: &Frame<'_>, o: &Overview<'_>) -> String {
    let mut h = String::new();
    top(&mut h, f, "overview", "outbox-host");
    for (name, report) in &o.brokers {
        h.push_str(&super::broker(name, report, f.now_ms));
    }
    for (sink, why) in &o.misconfigured {
        h.push_str(&super::misconfigured(sink, why));
    }
    h.push_str("<section><h2>Sinks</h2>");
    match &o.sinks {
        None => h.push_str("<p class=\"dberror\">The sinks' counts could not be read: see the database error.</p>"),
        Some(sinks) if sinks.is_empty() => h.push_str("<p>No sink is registered on this table yet.</p>"),
        Some(sinks) => table(&mut h, sinks, f.now_ms),
    }
    h.push_str(
        "<p class=\"note\">A sink's page has its chart, its failures with their errors, its partitions' owners, and \
         the retry and replay forms.</p></section>",
    );
    foot(&mut h);
    h
}

fn table(h: &mut String, sinks: &[SinkLine<'_>], now_ms: i64) {
    h.push_str("<table id=\"sinks\"><tr><th>sink</th><th>state on this host</th>");
    for status in Status::ALL {
        let _ = write!(h, "<th>{status}</th>");
    }
    h.push_str("<th>oldest waiting</th><th>delivered last minute</th><th>owners: partitions, in flight</th></tr>");
    for line in sinks {
        let sink = line.summary;
        let _ = write!(
            h,
            "<tr data-sink=\"{name}\" data-state=\"{state}\"{troubled}><td>{link}</td><td class=\"state {state}\">{phrase}</td>",
            name = esc(&sink.name),
            state = line.state(),
            troubled = if line.troubled() { " class=\"troubled\"" } else { "" },
            link = sink_link(&sink.name),
            phrase = line.state_phrase(),
        );
        for status in Status::ALL {
            let _ = write!(h, "<td class=\"{status}\" data-status=\"{status}\">{}</td>", sink.stats.count(status));
        }
        let oldest =
            sink.stats.oldest_waiting_created_at_ms.map_or("none".into(), |c| format!("{} old", age(now_ms - c)));
        let _ = write!(
            h,
            "<td>{oldest}</td><td>{}</td><td class=\"owners\">{}</td></tr>",
            sink.stats.delivered_last_minute,
            owners(&sink.owners)
        );
    }
    h.push_str("</table>");
}

/// The hosts that own a sink's partitions, one per line.
pub(super) fn owners(owners: &[crate::store::OwnerView]) -> String {
    if owners.is_empty() {
        return "none".to_string();
    }
    owners
        .iter()
        .map(|o| {
            format!(
                "<span class=\"owner\">{}: {} ({}), {} in flight</span>",
                super::show(&o.owner),
                o.partitions.len(),
                crate::ops::report::ranges(&o.partitions),
                o.in_flight
            )
        })
        .collect::<Vec<_>>()
        .join("<br>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::SinkSummary;
    use crate::ops::metrics::{BreakerReport, SinkState};
    use crate::store::Stats;

    fn summary(name: &str, delivered: i64, failed: i64) -> SinkSummary {
        let stats = Stats {
            counts: vec![(Status::Delivered, delivered), (Status::Failed, failed)],
            top_errors: vec![("boom".into(), failed)],
            ..Stats::default()
        };
        SinkSummary { name: name.into(), table: name.into(), stats, owners: Vec::new() }
    }

    fn closed() -> Option<BreakerReport> {
        Some(BreakerReport { state: SinkState::Closed, since_ms: 0, reason: String::new(), next_probe_at_ms: None })
    }

    #[test]
    fn every_sink_has_its_row_and_a_failing_one_is_marked() {
        let (a, b, c) = (summary("a", 5, 0), summary("b", 0, 5), summary("<c>", 0, 0));
        let line = |summary, breaker| SinkLine { summary, breaker, brokers: Vec::new(), misconfigured: None };
        let sinks = vec![line(&a, closed()), line(&b, closed()), line(&c, None)];
        let frame = Frame { table: "room_outbox", node_id: "n", now_ms: 0, flash: None, db_failure: None };
        let html = render(&frame, &Overview { sinks: Some(sinks), brokers: Vec::new(), misconfigured: Vec::new() });
        assert!(
            html.contains("<tr data-sink=\"a\" data-state=\"delivering\"><td><a href=\"/sinks/a\">a</a>"),
            "{html}"
        );
        assert!(html.contains("<tr data-sink=\"b\" data-state=\"delivering\" class=\"troubled\">"), "{html}");
        assert!(html.contains("<tr data-sink=\"&lt;c&gt;\" data-state=\"elsewhere\">"), "{html}");
        assert!(html.contains("not delivered by this host"), "{html}");
        assert!(!html.contains("<c>"), "escaped");
        assert!(!html.contains("Recent failures") && !html.contains("id=\"breaker\""), "nothing for one sink alone");
    }
}
