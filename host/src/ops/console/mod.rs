//! The operator console on the admin listener: server-rendered HTML with plain forms and
//! links, so every page works without JavaScript (charts are inline SVG drawn here).
//!
//! - [`overview`] (`/`): the host and every sink on the table with its state and counts;
//!   nothing on it speaks for one sink alone.
//! - [`sink`] (`/sinks/{name}`): one sink's state, counts, chart, failures, owners, and the
//!   retry and replay forms.
//! - [`search`] (`/events?…`): a sink's events by status, type, room, event id and
//!   creation time, newest first, a page at a time.
//! - [`event`] (`/events/{id}`): one event's story: its envelope, its state in every sink,
//!   and its room's neighbours.
//!
//! Everything read from the table or a sink is shown through [`show`] (control and
//! reordering characters made visible, bounded, HTML-escaped).

pub mod event;
pub mod overview;
pub mod search;
pub mod sink;

use std::fmt::Write as _;

use crate::ops::health::DbFailure;
use crate::ops::metrics::SinkState as State;
use crate::ops::metrics::{BreakerReport, BrokerReport};
use crate::units::format_duration;

/// What every page shows at its top: where this is, and the host's own troubles.
pub struct Frame<'a> {
    /// Outbox table name.
    pub table: &'a str,
    /// This host.
    pub node_id: &'a str,
    /// Now, UTC ms.
    pub now_ms: i64,
    /// A message after an action (e.g. "Moved 3 failed event(s) back to pending.").
    pub flash: Option<&'a str>,
    /// The worker's last database error since start.
    pub db_failure: Option<DbFailure>,
}

/// One sink as this host knows it beyond the table: its breaker (when this host delivers
/// it), its brokers (a relay) and whether it is paused as misconfigured.
pub struct SinkLine<'a> {
    /// Its counts and owners, from the table.
    pub summary: &'a crate::ops::SinkSummary,
    /// Its circuit breaker on this host; `None` when this host does not deliver it.
    pub breaker: Option<BreakerReport>,
    /// The brokers it publishes to from this host, with their connection state.
    pub brokers: Vec<(String, BrokerReport)>,
    /// Why it is paused as misconfigured on this host.
    pub misconfigured: Option<String>,
}

impl SinkLine<'_> {
    /// One word for its state, worst first: `misconfigured`, `open`, `half_open`,
    /// `broker_down`, `delivering`, or `elsewhere` (this host does not deliver it).
    pub fn state(&self) -> &'static str {
        if self.misconfigured.is_some() {
            return "misconfigured";
        }
        match self.breaker.as_ref().map(|b| b.state) {
            None => "elsewhere",
            Some(State::Misconfigured) => "misconfigured",
            Some(State::Open) => "open",
            Some(State::HalfOpen) => "half_open",
            Some(State::Closed) if self.brokers.iter().any(|(_, b)| !b.up) => "broker_down",
            Some(State::Closed) => "delivering",
        }
    }

    /// The state as a short phrase for a table cell.
    fn state_phrase(&self) -> &'static str {
        match self.state() {
            "misconfigured" => "paused: misconfigured",
            "open" => "paused: breaker open",
            "half_open" => "probing (breaker half-open)",
            "broker_down" => "waiting: broker down",
            "delivering" => "delivering",
            _ => "not delivered by this host",
        }
    }

    /// Whether it has events an operator should look at (retryable or failed).
    fn troubled(&self) -> bool {
        let stats = &self.summary.stats;
        stats.count(crate::store::Status::Failed) + stats.count(crate::store::Status::Retryable) > 0
    }
}

/// Text from the table or a sink shown on a page: control and reordering characters made
/// visible, at most 2,000 bytes, then HTML-escaped.
pub(crate) fn show(text: &str) -> String {
    esc(&crate::text::printable(text, 2_000))
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

fn age(ms: i64) -> String {
    format_duration(std::time::Duration::from_millis(ms.max(0) as u64 / 1000 * 1000))
}

/// A link to a sink's page.
fn sink_link(name: &str) -> String {
    format!("<a href=\"/sinks/{}\">{}</a>", esc(&percent_encode(name)), show(name))
}

/// A link to an event's story.
fn event_link(event_id: &str) -> String {
    format!("<a href=\"/events/{}\">{}</a>", esc(&percent_encode(event_id)), show(event_id))
}

/// A path segment or query value with everything but unreserved characters percent-encoded.
pub(crate) fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A sink's circuit breaker: one line, which says more when it is not closed.
fn breaker(b: &BreakerReport, now_ms: i64) -> String {
    let state = b.state.as_str();
    let detail = match b.state {
        State::Closed if b.since_ms == 0 => "closed: delivering".to_string(),
        State::Closed => format!("closed: delivering (again for {}: {})", age(now_ms - b.since_ms), show(&b.reason)),
        State::HalfOpen => format!("half-open: one probe delivery ({})", show(&b.reason)),
        State::Misconfigured => format!(
            "misconfigured for {}: deliveries paused, waiting rows keep their attempts ({})",
            age(now_ms - b.since_ms),
            show(&b.reason)
        ),
        State::Open => {
            let probe =
                b.next_probe_at_ms.map(|at| format!("; next probe in {}", age(at - now_ms))).unwrap_or_default();
            format!(
                "open for {}: deliveries paused, waiting rows are not attempted ({}){probe}",
                age(now_ms - b.since_ms),
                show(&b.reason)
            )
        }
    };
    format!("<p class=\"breaker {state}\" id=\"breaker\" data-state=\"{state}\">Circuit breaker {detail}</p>")
}

/// A broker's connection state: one line.
fn broker(name: &str, b: &BrokerReport, now_ms: i64) -> String {
    let since = age(now_ms - b.since_ms);
    let (state, detail) = if b.up {
        ("up", format!("answers (for {since})"))
    } else {
        ("down", format!("cannot be reached for {since}: {}", show(b.error.as_deref().unwrap_or_default())))
    };
    format!(
        "<p class=\"broker {state}\" data-broker=\"{name}\" data-state=\"{state}\">Broker <b>{shown}</b> ({kind}) {detail}</p>",
        name = esc(name),
        shown = show(name),
        kind = esc(b.kind),
    )
}

/// A sink paused as misconfigured: one line.
fn misconfigured(sink: &str, why: &str) -> String {
    format!(
        "<p class=\"misconfigured\" data-sink=\"{}\">Sink {} is misconfigured: {}. Fix its config and restart the host.</p>",
        esc(sink),
        show(sink),
        show(why)
    )
}

/// The document's head and the header, the flash and the last database error. `title` and
/// `heading` are HTML already.
fn top(h: &mut String, f: &Frame<'_>, title: &str, heading: &str) {
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"30\">\
         <title>{title} · outbox-host · {table}</title><style>{CSS}</style></head><body>\
         <header><h1>{heading}</h1><p><a href=\"/\">outbox-host</a> · table <b>{table}</b> · node <b>{node}</b></p></header>",
        table = esc(f.table),
        node = esc(f.node_id),
    );
    if let Some(flash) = f.flash {
        let _ = write!(h, "<p class=\"flash\" id=\"flash\">{}</p>", esc(flash));
    }
    if let Some(failure) = &f.db_failure {
        let _ = write!(
            h,
            "<p class=\"dberror\" id=\"db-error\">Last database error ({op}, {ago} ago): <code>{error}</code></p>",
            op = failure.operation,
            ago = age(f.now_ms - failure.at_ms),
            error = show(&failure.error),
        );
    }
}

/// The links at the foot of every page.
fn foot(h: &mut String) {
    h.push_str(
        "<footer><a href=\"/\">overview</a> · <a href=\"/events\">search</a> · <a href=\"/metrics\">/metrics</a> · <a href=\"/api/status\">/api/status</a> · \
         <a href=\"/readyz\">/readyz</a></footer></body></html>",
    );
}

const CSS: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{margin:0}header p{margin:.2em 0 1em;color:#555}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}\
td.failed{color:#b00}td.retryable{color:#a60}td.delivered{color:#070}code{font-size:12px}pre{font-size:12px;background:#f6f6f6;padding:.5em;overflow:auto;max-height:30em}\
.flash{background:#eef6ee;border:1px solid #9c9;padding:.5em}svg .delivered,.legend .delivered{fill:#2a2;color:#2a2}\
svg .failed,.legend .failed{fill:#c22;color:#c22}svg .axis{stroke:#999}form{margin:0}button{cursor:pointer}\
.note{color:#555}.dberror{background:#fde8e8;padding:.4em .6em;border-left:4px solid #c62828}\
.breaker.open,.broker.down,.misconfigured{background:#fff3e0;padding:.4em .6em;border-left:4px solid #ef6c00}\
.breaker.half_open{background:#fffde7;padding:.4em .6em;border-left:4px solid #f9a825}\
tr.troubled td:first-child{border-left:4px solid #c62828}td.state.open,td.state.misconfigured,td.state.broker_down{color:#b00}\
.current td{background:#f3f7ff}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_says_when_it_is_open_and_when_it_probes_next() {
        let open = BreakerReport {
            state: State::Open,
            since_ms: 1_000,
            reason: "the sink says <b>throttled</b>".into(),
            next_probe_at_ms: Some(9_000),
        };
        let line = breaker(&open, 5_000);
        assert!(line.contains("data-state=\"open\""), "{line}");
        assert!(line.contains("open for 4s: deliveries paused"), "{line}");
        assert!(line.contains("next probe in 4s"), "{line}");
        assert!(line.contains("&lt;b&gt;throttled&lt;/b&gt;") && !line.contains("<b>"), "escaped: {line}");
        let closed = BreakerReport { state: State::Closed, since_ms: 0, reason: String::new(), next_probe_at_ms: None };
        assert!(breaker(&closed, 0).contains("Circuit breaker closed: delivering</p>"));
    }

    #[test]
    fn a_broker_line_says_how_long_it_is_down_and_why_escaped() {
        let down = BrokerReport {
            kind: "nats",
            up: false,
            since_ms: 1_000,
            error: Some("broker <x>: connection lost \u{202E}".into()),
        };
        let line = broker("ev\"ents", &down, 13_000);
        assert!(
            line.starts_with("<p class=\"broker down\" data-broker=\"ev&quot;ents\" data-state=\"down\">"),
            "{line}"
        );
        assert!(
            line.contains("(nats) cannot be reached for 12s: broker &lt;x&gt;: connection lost \\u{202e}"),
            "{line}"
        );
        let up = BrokerReport { kind: "redis", up: true, since_ms: 0, error: None };
        assert!(broker("events", &up, 180_000).contains("Broker <b>events</b> (redis) answers (for 3m)</p>"));
    }

    #[test]
    fn the_last_database_error_is_shown_escaped() {
        let failure = DbFailure { operation: "claim", error: "Unknown column '<b>x</b>'".into(), at_ms: -5_000 };
        let frame = Frame { table: "t", node_id: "n", now_ms: 0, flash: None, db_failure: Some(failure) };
        let mut html = String::new();
        top(&mut html, &frame, "x", "x");
        assert!(html.contains("id=\"db-error\">Last database error (claim, 5s ago): <code>Unknown column &#39;&lt;b&gt;x&lt;/b&gt;&#39;</code>"), "{html}");
        let mut quiet = String::new();
        top(&mut quiet, &Frame { db_failure: None, ..frame }, "x", "x");
        assert!(!quiet.contains("db-error"), "no error, no line");
    }

    #[test]
    fn links_carry_names_percent_encoded_and_show_them_escaped() {
        assert_eq!(sink_link("a/b<c>"), "<a href=\"/sinks/a%2Fb%3Cc%3E\">a/b&lt;c&gt;</a>");
        assert_eq!(event_link("e\"1"), "<a href=\"/events/e%221\">e&quot;1</a>");
    }
}
