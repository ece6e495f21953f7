//! The status page at `/` of the admin listener: server-rendered HTML with plain forms, so
//! it works without JavaScript; the chart is an inline SVG drawn on the server.

use std::fmt::Write as _;

use crate::ops::health::DbFailure;
use crate::ops::metrics::SinkState as State;
use crate::ops::metrics::{BreakerReport, BrokerReport};
use crate::store::{Minute, Row, Stats, Status};
use crate::units::format_duration;

/// What the page shows.
pub struct PageData<'a> {
    /// Outbox table name.
    pub table: &'a str,
    /// This host.
    pub node_id: &'a str,
    /// The sink's name.
    pub sink: &'a str,
    /// Current counts.
    pub stats: &'a Stats,
    /// Per-minute deliveries and failures over the last hour.
    pub history: &'a [Minute],
    /// Recent failed and retryable rows.
    pub failures: &'a [Row],
    /// Now, UTC ms.
    pub now_ms: i64,
    /// A message after an action (e.g. "moved 3 failed events back to pending").
    pub flash: Option<&'a str>,
    /// The form token when retrying from the page is possible (`admin.token` is set).
    pub form_token: Option<String>,
    /// The worker's last database error since start.
    pub db_failure: Option<DbFailure>,
    /// The sink's circuit breaker.
    pub breaker: BreakerReport,
    /// Every sink registered on the table, with its counts.
    pub sinks: &'a [crate::ops::SinkSummary],
    /// This host's sinks paused as misconfigured, by name, with why.
    pub misconfigured: Vec<(String, String)>,
    /// The brokers this host's relays publish to, by name, with their connection state.
    pub brokers: Vec<(String, BrokerReport)>,
}

/// Text from the table shown on the page: control and reordering characters made visible,
/// then HTML-escaped.
fn show(text: &str) -> String {
    esc(&crate::text::printable(text, 2_000))
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

fn age(ms: i64) -> String {
    format_duration(std::time::Duration::from_millis(ms.max(0) as u64 / 1000 * 1000))
}

/// The sink's circuit breaker: one line, which says more when it is not closed.
fn breaker(b: &BreakerReport, now_ms: i64) -> String {
    let state = b.state.as_str();
    let detail = match b.state {
        State::Closed if b.since_ms == 0 => "closed: delivering".to_string(),
        State::Closed => format!("closed: delivering (again for {}: {})", age(now_ms - b.since_ms), esc(&b.reason)),
        State::HalfOpen => format!("half-open: one probe delivery ({})", esc(&b.reason)),
        State::Misconfigured => format!(
            "misconfigured for {}: deliveries paused, waiting rows keep their attempts ({})",
            age(now_ms - b.since_ms),
            esc(&b.reason)
        ),
        State::Open => {
            let probe =
                b.next_probe_at_ms.map(|at| format!("; next probe in {}", age(at - now_ms))).unwrap_or_default();
            format!(
                "open for {}: deliveries paused, waiting rows are not attempted ({}){probe}",
                age(now_ms - b.since_ms),
                esc(&b.reason)
            )
        }
    };
    format!("<p class=\"breaker {state}\" id=\"breaker\" data-state=\"{state}\">Circuit breaker {detail}</p>")
}

/// Every sink's counts, and the replay form (with the admin token set).
fn sinks(h: &mut String, d: &PageData<'_>) {
    if d.sinks.is_empty() {
        return;
    }
    h.push_str("<section><h2>Sinks</h2><table id=\"sinks\"><tr><th>sink</th><th>state in</th>");
    for status in Status::ALL {
        let _ = write!(h, "<th>{status}</th>");
    }
    h.push_str("<th>oldest waiting</th><th>owners: partitions, in flight</th></tr>");
    for sink in d.sinks {
        let _ = write!(
            h,
            "<tr data-sink=\"{name}\"><td>{name}</td><td><code>{}</code></td>",
            esc(&sink.table),
            name = esc(&sink.name)
        );
        for status in Status::ALL {
            let _ = write!(h, "<td class=\"{status}\" data-status=\"{status}\">{}</td>", sink.stats.count(status));
        }
        let oldest =
            sink.stats.oldest_waiting_created_at_ms.map_or("none".into(), |c| format!("{} old", age(d.now_ms - c)));
        let owners: Vec<String> = sink
            .owners
            .iter()
            .map(|o| {
                format!(
                    "<span class=\"owner\">{}: {} ({}), {} in flight</span>",
                    esc(&o.owner),
                    o.partitions.len(),
                    crate::ops::report::ranges(&o.partitions),
                    o.in_flight
                )
            })
            .collect();
        let owners = if owners.is_empty() { "none".to_string() } else { owners.join("<br>") };
        let _ = write!(h, "<td>{oldest}</td><td class=\"owners\">{owners}</td></tr>");
    }
    h.push_str("</table>");
    if let Some(csrf) = &d.form_token {
        let _ = write!(
            h,
            "<form id=\"replay\" method=\"post\" action=\"/replay\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <p>Deliver again to one sink: <select name=\"sink\">{}</select> \
             events created from <input name=\"from\" placeholder=\"2026-11-30T08:00:00Z\" required> \
             to <input name=\"to\" placeholder=\"(now)\"> type <input name=\"event_type\" placeholder=\"(any)\"> \
             room <input name=\"room\" placeholder=\"(any)\"> \
             at most <input name=\"limit\" value=\"10000\" size=\"6\" required> events \
             <label>admin token <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label> \
             <button id=\"replay-button\">replay</button></p></form>",
            esc(csrf),
            d.sinks.iter().map(|s| format!("<option>{}</option>", esc(&s.name))).collect::<String>()
        );
    }
    h.push_str("</section>");
}

/// Renders the page.
pub fn render(d: &PageData<'_>) -> String {
    let mut h = String::new();
    top(&mut h, d);

    rows(&mut h, d);

    sinks(&mut h, d);

    h.push_str("<section><h2>Last hour</h2>");
    h.push_str(&chart(d.history, d.now_ms));
    h.push_str("</section>");

    // One form holds every retry button; the button pressed says what to retry.
    let can_retry = d.form_token.is_some();
    match &d.form_token {
        Some(csrf) => {
            let _ = write!(
                h,
                "<form id=\"actions\" method=\"post\" action=\"/retry\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <p class=\"token\"><label>Admin token (needed to retry) <input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"off\" required></label></p>",
                esc(csrf)
            );
        }
        None => h.push_str("<p class=\"note\" id=\"retry-off\">Retrying from this page is off: set <code>admin.token</code> in the config.</p>"),
    }
    errors(&mut h, d, can_retry);

    failures(&mut h, d, can_retry);

    if can_retry {
        h.push_str("</form>");
    }
    h.push_str("<footer><a href=\"/metrics\">/metrics</a> · <a href=\"/api/status\">/api/status</a> · <a href=\"/readyz\">/readyz</a></footer></body></html>");
    h
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

/// The head, the flash, the last database error and the breaker's and config's state.
fn top(h: &mut String, d: &PageData<'_>) {
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"30\">\
         <title>outbox-host · {table}</title><style>{CSS}</style></head><body>\
         <header><h1>outbox-host</h1><p>table <b>{table}</b> · node <b>{node}</b> · sink <b>{sink}</b></p></header>",
        table = esc(d.table),
        node = esc(d.node_id),
        sink = esc(d.sink),
    );
    if let Some(flash) = d.flash {
        let _ = write!(h, "<p class=\"flash\" id=\"flash\">{}</p>", esc(flash));
    }
    if let Some(f) = &d.db_failure {
        let _ = write!(
            h,
            "<p class=\"dberror\" id=\"db-error\">Last database error ({op}, {ago} ago): <code>{error}</code></p>",
            op = f.operation,
            ago = age(d.now_ms - f.at_ms),
            error = show(&f.error),
        );
    }
    h.push_str(&breaker(&d.breaker, d.now_ms));
    for (name, report) in &d.brokers {
        h.push_str(&broker(name, report, d.now_ms));
    }
    for (sink, why) in &d.misconfigured {
        let _ = write!(
            h,
            "<p class=\"misconfigured\" data-sink=\"{}\">Sink {} is misconfigured: {}. Fix its config and restart the host.</p>",
            esc(sink),
            show(sink),
            show(why)
        );
    }
}

/// The counts per status, unknown statuses, the oldest waiting event and the rate.
fn rows(h: &mut String, d: &PageData<'_>) {
    h.push_str("<section><h2>Rows</h2><table id=\"counts\"><tr>");
    for status in Status::ALL {
        let _ = write!(h, "<th>{status}</th>");
    }
    h.push_str("</tr><tr>");
    for status in Status::ALL {
        let _ = write!(h, "<td class=\"{status}\" data-status=\"{status}\">{}</td>", d.stats.count(status));
    }
    h.push_str("</tr></table>");
    for (status, n) in &d.stats.unknown_statuses {
        let _ = write!(
            h,
            "<p class=\"note unknown-status\">{n} row(s) in status <code>{}</code>, which the host does not know: never claimed.</p>",
            show(status)
        );
    }
    let oldest = match d.stats.oldest_waiting_created_at_ms {
        Some(created) => format!("{} old", age(d.now_ms - created)),
        None => "none".into(),
    };
    let _ = write!(
        h,
        "<p>Oldest waiting event: <b id=\"oldest\">{oldest}</b> · delivered in the last minute: <b id=\"rate\">{}</b></p></section>",
        d.stats.delivered_last_minute
    );
}

/// The most frequent errors, each with a retry button when retrying is on.
fn errors(h: &mut String, d: &PageData<'_>, can_retry: bool) {
    h.push_str("<section><h2>Errors</h2>");
    if d.stats.top_errors.is_empty() {
        h.push_str("<p>No retryable or failed rows.</p>");
    } else {
        h.push_str("<table id=\"errors\"><tr><th>rows</th><th>error</th><th></th></tr>");
        for (error, n) in &d.stats.top_errors {
            let button = if can_retry {
                format!("<button name=\"error_is\" value=\"{}\">retry failed</button>", esc(error))
            } else {
                String::new()
            };
            let _ = write!(h, "<tr><td>{n}</td><td><code>{}</code></td><td>{button}</td></tr>", show(error));
        }
        h.push_str("</table>");
    }
    let failed = d.stats.count(Status::Failed);
    if failed > 0 && can_retry {
        let _ = write!(h, "<button id=\"retry-all\" name=\"all\" value=\"true\">retry all {failed} failed</button>");
    }
    h.push_str("</section>");
}

/// The most recent failures, a retry button on each failed one when retrying is on.
fn failures(h: &mut String, d: &PageData<'_>, can_retry: bool) {
    h.push_str("<section><h2>Recent failures</h2>");
    if d.failures.is_empty() {
        h.push_str("<p>None.</p>");
    } else {
        h.push_str(
            "<table id=\"failures\"><tr><th>event</th><th>type</th><th>room</th><th>status</th><th>attempts</th>\
             <th>error</th><th>updated</th><th></th></tr>",
        );
        for row in d.failures {
            let id = esc(&row.event_id);
            let button = if row.status == Status::Failed && can_retry {
                format!("<button class=\"retry-event\" name=\"event_id\" value=\"{id}\">retry</button>")
            } else {
                String::new()
            };
            let _ = write!(
                h,
                "<tr data-event-id=\"{id}\"><td><a href=\"/api/events/{link}\">{shown}</a></td><td>{}</td><td>{}</td>\
                 <td class=\"{}\">{}</td><td>{}</td><td><code>{}</code></td><td>{} ago</td><td>{button}</td></tr>",
                show(&row.event_type),
                show(&row.room_id),
                row.status,
                row.status,
                row.retry_count,
                show(row.last_error.as_deref().unwrap_or("")),
                age(d.now_ms - row.updated_at_ms),
                link = esc(&percent_encode(&row.event_id)),
                shown = show(&row.event_id),
            );
        }
        h.push_str("</table>");
    }
    h.push_str("</section>");
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

/// Delivered (up) and failed (down) per minute over the hour before `now_ms`, as SVG.
fn chart(history: &[Minute], now_ms: i64) -> String {
    const W: i64 = 600;
    const H: i64 = 120;
    let first = now_ms - now_ms % 60_000 - 59 * 60_000;
    let peak = history.iter().map(|m| m.delivered.max(m.failed)).max().unwrap_or(0).max(1);
    let mut svg = format!(
        "<svg id=\"chart\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" \
         aria-label=\"delivered and failed per minute, last hour\"><line x1=\"0\" y1=\"{mid}\" x2=\"{W}\" y2=\"{mid}\" class=\"axis\"/>",
        mid = H / 2
    );
    for m in history.iter().filter(|m| m.start_ms >= first) {
        let x = (m.start_ms - first) / 60_000 * (W / 60);
        let up = m.delivered * (H / 2 - 4) / peak;
        let down = m.failed * (H / 2 - 4) / peak;
        let minute = (m.start_ms - first) / 60_000;
        let _ = write!(
            svg,
            "<rect class=\"delivered\" x=\"{x}\" y=\"{}\" width=\"8\" height=\"{up}\"><title>minute {minute}: {} delivered</title></rect>\
             <rect class=\"failed\" x=\"{x}\" y=\"{}\" width=\"8\" height=\"{down}\"><title>minute {minute}: {} failed</title></rect>",
            H / 2 - up,
            m.delivered,
            H / 2,
            m.failed,
        );
    }
    svg.push_str("</svg><p class=\"legend\"><span class=\"delivered\">■</span> delivered <span class=\"failed\">■</span> failed, per minute</p>");
    svg
}

const CSS: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{margin:0}header p{margin:.2em 0 1em;color:#555}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left}\
td.failed{color:#b00}td.retryable{color:#a60}td.delivered{color:#070}code{font-size:12px}\
.flash{background:#eef6ee;border:1px solid #9c9;padding:.5em}svg .delivered,.legend .delivered{fill:#2a2;color:#2a2}\
svg .failed,.legend .failed{fill:#c22;color:#c22}svg .axis{stroke:#999}form{margin:0}button{cursor:pointer}\
.note{color:#555}.dberror{background:#fde8e8;padding:.4em .6em;border-left:4px solid #c62828}\
.breaker.open{background:#fff3e0;padding:.4em .6em;border-left:4px solid #ef6c00}\
.broker.down{background:#fff3e0;padding:.4em .6em;border-left:4px solid #ef6c00}\
.breaker.half_open{background:#fffde7;padding:.4em .6em;border-left:4px solid #f9a825}";

#[cfg(test)]
mod tests {
    use super::*;

    fn page(stats: &Stats, failures: &[Row], form_token: Option<&str>) -> String {
        page_with(stats, failures, form_token, None)
    }

    fn page_with(stats: &Stats, failures: &[Row], form_token: Option<&str>, db_failure: Option<DbFailure>) -> String {
        render(&PageData {
            table: "room_outbox",
            node_id: "n",
            sink: "s",
            stats,
            history: &[],
            failures,
            now_ms: 0,
            flash: None,
            form_token: form_token.map(str::to_string),
            db_failure,
            breaker: BreakerReport { state: State::Closed, since_ms: 0, reason: String::new(), next_probe_at_ms: None },
            misconfigured: Vec::new(),
            brokers: Vec::new(),
            sinks: &[],
        })
    }

    #[test]
    fn text_from_the_table_is_escaped() {
        let row = Row {
            id: 1,
            app_code: String::new(),
            event_id: "<script>alert(1)</script>".into(),
            event_type: "T".into(),
            room_id: "r".into(),
            status: Status::Failed,
            envelope: vec![],
            created_at_ms: 0,
            retry_count: 1,
            last_error: Some("a \"quoted\" <b>".into()),
            worker_id: None,
            lock_until_ms: 0,
            next_retry_at_ms: 0,
            updated_at_ms: 0,
            delivered_at_ms: None,
            plugin_digest: None,
        };
        let stats = Stats {
            top_errors: vec![("<i>".into(), 1)],
            unknown_statuses: vec![("<b>published".into(), 2)],
            ..Stats::default()
        };
        let html = page(&stats, &[row], Some("t"));
        assert!(!html.contains("<script>alert"), "unescaped event id");
        assert!(html.contains("&lt;script&gt;"));
        assert!(!html.contains("<i>"), "unescaped error group");
        assert!(html.contains("2 row(s) in status <code>&lt;b&gt;published</code>"), "unknown statuses shown escaped");
    }

    #[test]
    fn control_and_reordering_characters_are_shown_escaped() {
        let stats = Stats { top_errors: vec![("evil\u{202E}gnp.exe \u{1b}[31m".into(), 1)], ..Stats::default() };
        let html = page(&stats, &[], None);
        assert!(html.contains("<code>evil\\u{202e}gnp.exe \\u{1b}[31m</code>"), "{html}");
        assert!(!html.contains('\u{202E}') && !html.contains('\u{1b}'));
        assert!(html.contains("id=\"retry-off\""), "no token: the page says retrying is off");
        assert!(!html.contains("<button"), "no token: no buttons");
    }

    #[test]
    fn the_last_database_error_is_shown_escaped() {
        let failure = DbFailure { operation: "claim", error: "Unknown column '<b>x</b>'".into(), at_ms: -5_000 };
        let html = page_with(&Stats::default(), &[], None, Some(failure));
        assert!(html.contains("id=\"db-error\">Last database error (claim, 5s ago): <code>Unknown column &#39;&lt;b&gt;x&lt;/b&gt;&#39;</code>"), "{html}");
        assert!(!page(&Stats::default(), &[], None).contains("db-error"), "no error, no line");
    }

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
        assert!(page(&Stats::default(), &[], None).contains("Circuit breaker closed: delivering</p>"));
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
}
