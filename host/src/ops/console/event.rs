//! An event's story at `/events/{id}`: what it is (type, room, creation time), its state in
//! every sink (status, attempts, next retry, last error, when it was delivered and by which
//! build), its room's previous and next events with their states (so that a room held
//! behind a failure explains itself), and its envelope decoded (JSON of the body for the
//! seed's types, hex for others).

use std::fmt::Write as _;

use super::{Frame, age, esc, event_link, foot, show, sink_link, top};
use crate::ops::Story;
use crate::ops::actions::States;
use crate::store::Status;
use crate::units::format_rfc3339_ms;

/// Renders an event's story.
pub fn render(f: &Frame<'_>, story: &Story) -> String {
    let row = &story.row;
    let mut h = String::new();
    let id = show(&row.event_id);
    top(&mut h, f, &format!("event {id}"), &format!("event <span id=\"event-id\">{id}</span>"));
    let _ = write!(
        h,
        "<table id=\"event\"><tr><th>type</th><td>{}</td></tr><tr><th>room</th><td>{}</td></tr>\
         <tr><th>created</th><td>{} ({} ago)</td></tr><tr><th>app</th><td>{}</td></tr></table>",
        show(&row.event_type),
        show(&row.room_id),
        format_rfc3339_ms(row.created_at_ms),
        age(f.now_ms - row.created_at_ms),
        show(&row.app_code),
    );
    sinks(&mut h, &story.states, f.now_ms);
    neighbours(&mut h, story);
    let envelope = serde_json::to_string_pretty(&story.envelope).unwrap_or_default();
    let _ = write!(h, "<section><h2>Envelope</h2><pre id=\"envelope\">{}</pre></section>", show_block(&envelope));
    foot(&mut h);
    h
}

/// Its state in every sink.
fn sinks(h: &mut String, states: &States, now_ms: i64) {
    h.push_str(
        "<section><h2>In every sink</h2><table id=\"states\"><tr><th>sink</th><th>status</th><th>attempts</th>\
         <th>next retry</th><th>last error</th><th>delivered</th><th>build</th></tr>",
    );
    for (sink, state) in states {
        let _ = write!(h, "<tr data-sink=\"{}\"><td>{}</td>", esc(&sink.name), sink_link(&sink.name));
        match state {
            None => h.push_str(
                "<td class=\"status\" data-status=\"none\" colspan=\"6\">not this sink's: created before its start</td>",
            ),
            Some(s) => {
                let next = match s.status {
                    Status::Retryable if s.next_retry_at_ms > now_ms => format!("in {}", age(s.next_retry_at_ms - now_ms)),
                    Status::Retryable => "due".to_string(),
                    _ => String::new(),
                };
                let delivered = s.delivered_at_ms.map(format_rfc3339_ms).unwrap_or_default();
                let _ = write!(
                    h,
                    "<td class=\"status {status}\" data-status=\"{status}\">{status}</td><td class=\"attempts\">{}</td>\
                     <td>{next}</td><td><code class=\"error\">{}</code></td><td>{delivered}</td><td><code>{}</code></td></tr>",
                    s.retry_count,
                    show(s.last_error.as_deref().unwrap_or("")),
                    show(s.plugin_digest.as_deref().unwrap_or("")),
                    status = s.status,
                );
                continue;
            }
        }
        h.push_str("</tr>");
    }
    h.push_str("</table></section>");
}

/// The room's previous and next events, and this one between them, with each sink's status.
fn neighbours(h: &mut String, story: &Story) {
    h.push_str("<section><h2>Its room</h2><table id=\"room\"><tr><th></th><th>event</th><th>type</th><th>created</th>");
    for (sink, _) in &story.states {
        let _ = write!(h, "<th>{}</th>", show(&sink.name));
    }
    h.push_str("</tr>");
    let [before, after] = &story.neighbours;
    let this = Some((story.row.clone(), story.states.clone()));
    for (which, found) in [("previous", before), ("this", &this), ("next", after)] {
        let current = if which == "this" { " class=\"current\"" } else { "" };
        match found {
            None => {
                let _ = write!(
                    h,
                    "<tr id=\"{which}\"><td>{which}</td><td colspan=\"{}\">none</td></tr>",
                    3 + story.states.len()
                );
            }
            Some((row, states)) => {
                let _ = write!(
                    h,
                    "<tr id=\"{which}\"{current} data-event-id=\"{}\"><td>{which}</td><td>{}</td><td>{}</td><td>{}</td>",
                    esc(&row.event_id),
                    event_link(&row.event_id),
                    show(&row.event_type),
                    format_rfc3339_ms(row.created_at_ms),
                );
                for (sink, state) in states.iter() {
                    let status = state.as_ref().map_or("none", |s| s.status.as_str());
                    let _ = write!(h, "<td class=\"{status}\" data-sink=\"{}\">{status}</td>", esc(&sink.name));
                }
                h.push_str("</tr>");
            }
        }
    }
    h.push_str(
        "</table><p class=\"note\">Under per-room order, a room's event waits for the one before it.</p></section>",
    );
}

/// Multi-line text shown in a `<pre>`: each line made printable (no control or reordering
/// character reaches the page) and escaped, at most [`BLOCK_BYTES`] in all.
fn show_block(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let (line, clipped) = crate::text::printable_within(line, BLOCK_BYTES.saturating_sub(out.len()));
        out.push_str(&line);
        out.push('\n');
        if clipped || out.len() >= BLOCK_BYTES {
            break;
        }
    }
    esc(&out)
}

/// Most bytes of an envelope shown.
const BLOCK_BYTES: usize = 65_536;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_keeps_its_lines_and_shows_nothing_unsafe() {
        let shown = show_block("{\n  \"a\": \"<b>\u{202E}x\u{1b}\"\n}");
        assert_eq!(shown, "{\n  &quot;a&quot;: &quot;&lt;b&gt;\\u{202e}x\\u{1b}&quot;\n}\n");
        let long = show_block(&"x".repeat(BLOCK_BYTES * 2));
        assert!(long.len() < BLOCK_BYTES + 100 && long.contains(crate::text::CLIPPED), "bounded");
    }
}
