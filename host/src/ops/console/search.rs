//! The search at `/events`: a plain GET form (sink, statuses, type, room, event id, a
//! creation-time range) and a page of what it selects, newest first, each linking to its
//! story, with a link to the next page. The same search answers `/api/events` as JSON.

use std::fmt::Write as _;

use super::{Frame, age, esc, event_link, foot, percent_encode, show, sink_link, top};
use crate::ops::SearchRequest;
use crate::store::{Found, Status};
use crate::units::format_rfc3339_ms;

/// What the search page shows beyond the frame.
pub struct SearchPage<'a> {
    /// The sinks to choose from, the first first.
    pub sinks: &'a [String],
    /// The search asked, to fill the form again.
    pub request: &'a SearchRequest,
    /// What it found, in which sink; or why it could not be searched; `None` before a search.
    pub outcome: Option<Result<(String, Found), String>>,
    /// The form token when acting from the page is possible (`admin.token` is set).
    pub form_token: Option<String>,
}

/// Renders the search page.
pub fn render(f: &Frame<'_>, p: &SearchPage<'_>) -> String {
    let mut h = String::new();
    top(&mut h, f, "search", "search events");
    form(&mut h, p, f);
    match &p.outcome {
        None => {}
        Some(Err(why)) => {
            let _ = write!(h, "<p class=\"dberror\" id=\"search-error\">{}</p>", show(why));
        }
        Some(Ok((sink, found))) => {
            results(&mut h, p.request, sink, found, f.now_ms);
            if let Some(csrf) = p.form_token.as_deref().filter(|_| !found.rows.is_empty()) {
                bulk_form(&mut h, p, sink, csrf);
            }
        }
    }
    foot(&mut h);
    h
}

fn form(h: &mut String, p: &SearchPage<'_>, f: &Frame<'_>) {
    let s = &p.request.search;
    let value = |v: &Option<String>| esc(v.as_deref().unwrap_or(""));
    let time = |v: Option<i64>| v.map(format_rfc3339_ms).unwrap_or_default();
    h.push_str("<form id=\"search\" method=\"get\" action=\"/events\"><p><label>sink <select name=\"sink\">");
    for name in p.sinks {
        let selected = if p.request.sink.as_deref() == Some(name.as_str()) { " selected" } else { "" };
        let _ = write!(h, "<option value=\"{}\"{selected}>{}</option>", esc(name), show(name));
    }
    h.push_str("</select></label> status");
    for status in Status::ALL {
        let checked = if s.statuses.contains(&status) { " checked" } else { "" };
        let _ =
            write!(h, " <label><input type=\"checkbox\" name=\"status\" value=\"{status}\"{checked}> {status}</label>");
    }
    let _ = write!(
        h,
        "</p><p><label>type <input name=\"type\" value=\"{}\"></label> <label>room <input name=\"room\" value=\"{}\"></label> \
         <label>event id <input name=\"event_id\" value=\"{}\"></label></p>\
         <p><label>created from <input name=\"from\" value=\"{}\" placeholder=\"{}\"></label> \
         <label>to <input name=\"to\" value=\"{}\" placeholder=\"(now)\"></label> \
         <label>per page <input name=\"limit\" value=\"{}\" size=\"4\"></label> <button id=\"search-button\">search</button></p></form>",
        value(&s.event_type),
        value(&s.room_id),
        value(&s.event_id),
        time(s.from_ms),
        format_rfc3339_ms(f.now_ms - 3_600_000),
        time(s.to_ms),
        s.limit,
    );
}

fn results(h: &mut String, request: &SearchRequest, sink: &str, found: &Found, now_ms: i64) {
    let _ = write!(
        h,
        "<section><h2>In sink {}</h2><p id=\"found\" data-count=\"{}\">{} event(s) on this page, newest first.</p>",
        sink_link(sink),
        found.rows.len(),
        found.rows.len()
    );
    if !found.rows.is_empty() {
        h.push_str(
            "<table id=\"results\"><tr><th>event</th><th>type</th><th>room</th><th>created</th><th>status</th>\
             <th>attempts</th><th>last error</th></tr>",
        );
        for row in &found.rows {
            let _ = write!(
                h,
                "<tr data-event-id=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{} ({} ago)</td>\
                 <td class=\"{status}\" data-status=\"{status}\">{status}</td><td>{}</td><td><code>{}</code></td></tr>",
                esc(&row.event_id),
                event_link(&row.event_id),
                show(&row.event_type),
                show(&row.room_id),
                format_rfc3339_ms(row.created_at_ms),
                age(now_ms - row.created_at_ms),
                row.retry_count,
                show(row.last_error.as_deref().unwrap_or("")),
                status = row.status,
            );
        }
        h.push_str("</table>");
    }
    if let Some(next) = &found.next {
        let _ = write!(
            h,
            "<p><a id=\"next\" href=\"/events?{}\">older events</a></p>",
            esc(&next_query(request, sink, &next.encode()))
        );
    }
    h.push_str("</section>");
}

/// The form that acts on every event the search selects (not this page alone): it asks
/// for the count first (`/events/bulk` answers with it and a confirm button).
fn bulk_form(h: &mut String, p: &SearchPage<'_>, sink: &str, csrf: &str) {
    let _ = write!(
        h,
        "<section><h2>Act on every event this search selects</h2><form id=\"bulk\" method=\"post\" action=\"/events/bulk\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">{}\
         <p><label><input type=\"radio\" name=\"action\" value=\"retry\" checked> retry its failed events</label> \
         <label><input type=\"radio\" name=\"action\" value=\"discard\"> discard its waiting events (mark them failed)</label> \
         <label><input type=\"radio\" name=\"action\" value=\"replay\"> deliver it again to sink</label> <select name=\"target\">",
        esc(csrf),
        hidden(&search_pairs(p.request, sink)),
    );
    for name in p.sinks {
        let selected = if name == sink { " selected" } else { "" };
        let _ = write!(h, "<option value=\"{}\"{selected}>{}</option>", esc(name), show(name));
    }
    let _ = write!(
        h,
        "</select></p><p>At most {} events. <label>admin token <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label> \
         <button id=\"bulk-button\">count them first</button></p></form></section>",
        crate::ops::BULK_MAX
    );
}

/// The page that shows how many events a bulk action would act on and asks to confirm; the
/// admin token is typed again (never written into a page).
pub fn confirm(
    f: &Frame<'_>,
    pairs: &[(String, String)],
    action: &str,
    to: &str,
    matching: usize,
    csrf: &str,
) -> String {
    let mut h = String::new();
    top(&mut h, f, "confirm", "confirm a bulk action");
    let what = match action {
        "retry" => "move the failed ones among them back to pending".to_string(),
        "discard" => "mark the waiting ones among them failed, not to be attempted again".to_string(),
        _ => format!("deliver the finished ones among them again to sink {}", show(to)),
    };
    let _ = write!(
        h,
        "<form id=\"confirm\" method=\"post\" action=\"/events/bulk\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">{}\
         <input type=\"hidden\" name=\"confirm\" value=\"{matching}\">\
         <p id=\"matching\" data-count=\"{matching}\">{matching} event(s) match: {what}.</p>\
         <p><label>admin token <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label> \
         <button id=\"confirm-button\">{} {matching} event(s)</button> <a href=\"/events\">cancel</a></p></form>",
        esc(csrf),
        hidden(pairs),
        esc(action),
    );
    foot(&mut h);
    h
}

/// Hidden inputs for `pairs`.
fn hidden(pairs: &[(String, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("<input type=\"hidden\" name=\"{}\" value=\"{}\">", esc(k), esc(v))).collect()
}

/// The search's keys and values, for a link or a form: the sink, every status, the texts
/// and times that are set, and the page size.
pub fn search_pairs(request: &SearchRequest, sink: &str) -> Vec<(String, String)> {
    let s = &request.search;
    let mut pairs = vec![("sink", sink.to_string())];
    pairs.extend(s.statuses.iter().map(|st| ("status", st.as_str().to_string())));
    let texts = [("type", &s.event_type), ("room", &s.room_id), ("event_id", &s.event_id)];
    pairs.extend(texts.into_iter().filter_map(|(k, v)| v.clone().map(|v| (k, v))));
    let times = [("from", s.from_ms), ("to", s.to_ms)];
    pairs.extend(times.into_iter().filter_map(|(k, v)| v.map(|ms| (k, format_rfc3339_ms(ms)))));
    pairs.push(("limit", s.limit.to_string()));
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The query string of the page after this one: the same search, from `cursor`.
pub fn next_query(request: &SearchRequest, sink: &str, cursor: &str) -> String {
    let mut pairs = search_pairs(request, sink);
    pairs.push(("cursor".into(), cursor.to_string()));
    pairs.iter().map(|(k, v)| format!("{k}={}", percent_encode(v))).collect::<Vec<_>>().join("&")
}
