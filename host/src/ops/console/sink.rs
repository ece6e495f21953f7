//! A sink's page at `/sinks/{name}`: its state (breaker, paused, its brokers), its counts
//! and oldest waiting event, the last hour's chart, its most frequent errors and most recent
//! failures with their `last_error`, the hosts that own its partitions, and (with
//! `admin.token` set) the forms that retry its failures and replay a range to it.

use std::fmt::Write as _;

use super::{Frame, SinkLine, age, esc, event_link, foot, show, top};
use crate::ops::metrics::HeldRoom;
use crate::store::{Minute, Row, Status};

/// What a sink's page shows beyond the frame.
pub struct SinkPage<'a> {
    /// The sink, its counts and owners, and this host's view of it.
    pub line: SinkLine<'a>,
    /// Per-minute deliveries and failures over the last hour.
    pub history: &'a [Minute],
    /// Its most recent retryable and failed events.
    pub failures: &'a [Row],
    /// The form token when acting from the page is possible (`admin.token` is set).
    pub form_token: Option<String>,
    /// The rooms this host holds back by their rate limit now (`rate_limit.per_room`).
    pub held_rooms: Vec<HeldRoom>,
}

/// Renders a sink's page.
pub fn render(f: &Frame<'_>, p: &SinkPage<'_>) -> String {
    let name = &p.line.summary.name;
    let mut h = String::new();
    top(&mut h, f, &format!("sink {}", show(name)), &format!("sink <span id=\"sink\">{}</span>", show(name)));
    match &p.line.breaker {
        Some(b) => h.push_str(&super::breaker(b, f.now_ms)),
        None => h.push_str(
            "<p class=\"note\" id=\"elsewhere\">This host does not deliver this sink: the hosts that own its \
             partitions do (below).</p>",
        ),
    }
    for (broker, report) in &p.line.brokers {
        h.push_str(&super::broker(broker, report, f.now_ms));
    }
    if let Some(why) = &p.line.misconfigured {
        h.push_str(&super::misconfigured(name, why));
    }
    rows(&mut h, p, f.now_ms);
    held_rooms(&mut h, p);
    h.push_str("<section><h2>Last hour</h2>");
    h.push_str(&chart(p.history, f.now_ms));
    h.push_str("</section>");

    // One form holds every retry button; the button pressed says what to retry.
    let can_act = p.form_token.is_some();
    match &p.form_token {
        Some(csrf) => {
            let _ = write!(
                h,
                "<form id=\"actions\" method=\"post\" action=\"/retry\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <input type=\"hidden\" name=\"sink\" value=\"{}\">\
                 <p class=\"token\"><label>Admin token (needed to retry) <input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"off\" required></label></p>",
                esc(csrf),
                esc(name)
            );
        }
        None => h.push_str(
            "<p class=\"note\" id=\"retry-off\">Retrying and replaying from this page are off: set <code>admin.token</code> in the config.</p>",
        ),
    }
    errors(&mut h, p, can_act);
    failures(&mut h, p, can_act, f.now_ms);
    if can_act {
        h.push_str("</form>");
    }
    let _ = write!(
        h,
        "<section><h2>Owners</h2><p id=\"owners\">{}</p></section>",
        super::overview::owners(&p.line.summary.owners)
    );
    if let Some(csrf) = &p.form_token {
        replay_form(&mut h, csrf, name);
    }
    foot(&mut h);
    h
}

/// The rooms waiting for their rate limit on this host, each with its rows waiting and a
/// search of its events; nothing when none is.
fn held_rooms(h: &mut String, p: &SinkPage<'_>) {
    if p.held_rooms.is_empty() {
        return;
    }
    h.push_str(
        "<section><h2>Rooms held by their rate limit</h2><p class=\"note\">Each room's next event waits for its \
         <code>rate_limit.per_room</code> on this host; other rooms go on.</p>\
         <table id=\"held-rooms\"><tr><th>app</th><th>room</th><th>waiting here</th></tr>",
    );
    let sink = super::percent_encode(&p.line.summary.name);
    for room in &p.held_rooms {
        let _ = write!(
            h,
            "<tr><td>{}</td><td><a href=\"/events?sink={sink}&amp;room={}\">{}</a></td><td>{}</td></tr>",
            show(&room.app_code),
            super::percent_encode(&room.room_id),
            show(&room.room_id),
            room.queued
        );
    }
    h.push_str("</table></section>");
}

/// The counts per status, unknown statuses, the oldest waiting event and the rate.
fn rows(h: &mut String, p: &SinkPage<'_>, now_ms: i64) {
    let stats = &p.line.summary.stats;
    h.push_str("<section><h2>Events</h2><table id=\"counts\"><tr>");
    for status in Status::ALL {
        let _ = write!(h, "<th>{status}</th>");
    }
    h.push_str("</tr><tr>");
    for status in Status::ALL {
        let _ = write!(h, "<td class=\"{status}\" data-status=\"{status}\">{}</td>", stats.count(status));
    }
    h.push_str("</tr></table>");
    for (status, n) in &stats.unknown_statuses {
        let _ = write!(
            h,
            "<p class=\"note unknown-status\">{n} row(s) in status <code>{}</code>, which the host does not know: never claimed.</p>",
            show(status)
        );
    }
    let oldest = match stats.oldest_waiting_created_at_ms {
        Some(created) => format!("{} old", age(now_ms - created)),
        None => "none".into(),
    };
    let _ = write!(
        h,
        "<p>Oldest waiting event: <b id=\"oldest\">{oldest}</b> · delivered in the last minute: <b id=\"rate\">{}</b></p></section>",
        stats.delivered_last_minute
    );
}

/// The most frequent errors, each with a retry button when acting is on.
fn errors(h: &mut String, p: &SinkPage<'_>, can_act: bool) {
    let stats = &p.line.summary.stats;
    let _ = write!(
        h,
        "<section><h2>Errors</h2><p><a id=\"search-failures\" href=\"/events?sink={}&amp;status=retryable&amp;status=failed\">search all its failures</a></p>",
        esc(&super::percent_encode(&p.line.summary.name))
    );
    if stats.top_errors.is_empty() {
        h.push_str("<p id=\"no-errors\">No retryable or failed events.</p>");
    } else {
        h.push_str("<table id=\"errors\"><tr><th>events</th><th>error</th><th></th></tr>");
        for (error, n) in &stats.top_errors {
            let button = if can_act {
                format!("<button name=\"error_is\" value=\"{}\">retry failed</button>", esc(error))
            } else {
                String::new()
            };
            let _ = write!(h, "<tr><td>{n}</td><td><code>{}</code></td><td>{button}</td></tr>", show(error));
        }
        h.push_str("</table>");
    }
    let failed = stats.count(Status::Failed);
    if failed > 0 && can_act {
        let _ = write!(h, "<button id=\"retry-all\" name=\"all\" value=\"true\">retry all {failed} failed</button>");
    }
    h.push_str("</section>");
}

/// The most recent failures, a retry button on each failed one when acting is on.
fn failures(h: &mut String, p: &SinkPage<'_>, can_act: bool, now_ms: i64) {
    h.push_str("<section><h2>Recent failures</h2>");
    if p.failures.is_empty() {
        h.push_str("<p id=\"no-failures\">None.</p>");
    } else {
        h.push_str(
            "<table id=\"failures\"><tr><th>event</th><th>type</th><th>room</th><th>status</th><th>attempts</th>\
             <th>error</th><th>updated</th><th></th></tr>",
        );
        for row in p.failures {
            let id = esc(&row.event_id);
            let button = if row.status == Status::Failed && can_act {
                format!("<button class=\"retry-event\" name=\"event_id\" value=\"{id}\">retry</button>")
            } else {
                String::new()
            };
            let _ = write!(
                h,
                "<tr data-event-id=\"{id}\"><td>{link}</td><td>{}</td><td>{}</td>\
                 <td class=\"{}\">{}</td><td>{}</td><td><code>{}</code></td><td>{} ago</td><td>{button}</td></tr>",
                show(&row.event_type),
                show(&row.room_id),
                row.status,
                row.status,
                row.retry_count,
                show(row.last_error.as_deref().unwrap_or("")),
                age(now_ms - row.updated_at_ms),
                link = event_link(&row.event_id),
            );
        }
        h.push_str("</table>");
    }
    h.push_str("</section>");
}

/// The form that delivers a range of events again to this sink only.
fn replay_form(h: &mut String, csrf: &str, sink: &str) {
    let _ = write!(
        h,
        "<section><h2>Replay</h2><form id=\"replay\" method=\"post\" action=\"/replay\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"sink\" value=\"{}\">\
         <p>Deliver again to this sink only: events created from <input name=\"from\" placeholder=\"2026-11-30T08:00:00Z\" required> \
         to <input name=\"to\" placeholder=\"(now)\"> type <input name=\"event_type\" placeholder=\"(any)\"> \
         room <input name=\"room\" placeholder=\"(any)\"> \
         at most <input name=\"limit\" value=\"10000\" size=\"6\" required> events \
         <label>admin token <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label> \
         <button id=\"replay-button\">replay</button></p></form></section>",
        esc(csrf),
        esc(sink),
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::SinkSummary;
    use crate::store::Stats;

    fn page(summary: &SinkSummary, failures: &[Row], form_token: Option<&str>) -> String {
        let frame = Frame { table: "room_outbox", node_id: "n", now_ms: 0, flash: None, db_failure: None };
        let line = SinkLine { summary, breaker: None, brokers: Vec::new(), misconfigured: None };
        render(
            &frame,
            &SinkPage {
                line,
                history: &[],
                failures,
                form_token: form_token.map(str::to_string),
                held_rooms: Vec::new(),
            },
        )
    }

    fn summary(stats: Stats) -> SinkSummary {
        SinkSummary { name: "s".into(), table: "room_outbox".into(), stats, owners: Vec::new() }
    }

    #[test]
    fn held_rooms_are_listed_escaped_with_a_search_of_each() {
        let summary = summary(Stats::default());
        let frame = Frame { table: "room_outbox", node_id: "n", now_ms: 0, flash: None, db_failure: None };
        let line = SinkLine { summary: &summary, breaker: None, brokers: Vec::new(), misconfigured: None };
        let held = vec![HeldRoom { app_code: "app".into(), room_id: "<b>r&1".into(), queued: 7 }];
        let html = render(&frame, &SinkPage { line, history: &[], failures: &[], form_token: None, held_rooms: held });
        assert!(
            html.contains("<td><a href=\"/events?sink=s&amp;room=%3Cb%3Er%261\">&lt;b&gt;r&amp;1</a></td><td>7</td>"),
            "{html}"
        );
        assert!(!page(&summary, &[], None).contains("held-rooms"), "no section when no room is held");
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
        let html = page(&summary(stats), &[row], Some("t"));
        assert!(!html.contains("<script>alert"), "unescaped event id");
        assert!(html.contains("&lt;script&gt;"));
        assert!(html.contains("href=\"/events/%3Cscript%3Ealert%281%29%3C%2Fscript%3E\""), "{html}");
        assert!(!html.contains("<i>"), "unescaped error group");
        assert!(html.contains("2 row(s) in status <code>&lt;b&gt;published</code>"), "unknown statuses shown escaped");
        assert!(html.contains("<input type=\"hidden\" name=\"sink\" value=\"s\">"), "the forms act on this sink");
    }

    #[test]
    fn control_and_reordering_characters_are_shown_escaped() {
        let stats = Stats { top_errors: vec![("evil\u{202E}gnp.exe \u{1b}[31m".into(), 1)], ..Stats::default() };
        let html = page(&summary(stats), &[], None);
        assert!(html.contains("<code>evil\\u{202e}gnp.exe \\u{1b}[31m</code>"), "{html}");
        assert!(!html.contains('\u{202E}') && !html.contains('\u{1b}'));
        assert!(html.contains("id=\"retry-off\""), "no token: the page says acting is off");
        assert!(!html.contains("<button"), "no token: no buttons");
        assert!(html.contains("id=\"elsewhere\""), "no breaker here: the page says who delivers it");
    }
}
