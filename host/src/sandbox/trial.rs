//! A trial delivery (`outbox-host try-sink`): everything the sink asked of the host, in
//! order (each request with its reply or error, each log line), with secrets redacted. In a
//! dry run, requests that pass the egress rules are answered by a scripted reply instead of
//! being sent.

use std::sync::Mutex;

use super::bindings::{HttpError, HttpRequest, HttpResponse};
use crate::redact::is_secret_name;
use crate::text::printable;

/// How much of a request or reply body a transcript shows.
const BODY_SHOWN: usize = 2048;
/// How many headers of a request or reply a transcript shows.
const HEADERS_SHOWN: usize = 64;

/// The reply a dry run gives every request.
#[derive(Debug, Clone)]
pub struct ScriptedReply {
    /// Its status.
    pub status: u16,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Vec<u8>,
}

/// One thing the sink did, as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A request, redacted.
    Request {
        /// `GET`, `POST`, …
        method: String,
        /// The URL, credentials in its query shown as `***`.
        url: String,
        /// The headers, credentials shown as `***`.
        headers: Vec<(String, String)>,
        /// The body, escaped and cut at 2 KiB.
        body: String,
    },
    /// The reply to the request before it.
    Reply {
        /// Its status.
        status: u16,
        /// Its headers.
        headers: Vec<(String, String)>,
        /// Its body, escaped and cut at 2 KiB.
        body: String,
        /// Whether it is the dry run's scripted reply.
        scripted: bool,
    },
    /// Why the request before it got no reply.
    Error(String),
    /// A log line, or a line the sink wrote to stdout or stderr.
    Log {
        /// Its level.
        level: tracing::Level,
        /// `log`, `stdout` or `stderr`.
        stream: &'static str,
        /// The line, escaped and clipped as the host logs it.
        text: String,
    },
}

/// What a trial records, and how it answers requests.
#[derive(Debug, Default)]
pub struct Trial {
    dry_run: Option<ScriptedReply>,
    steps: Mutex<Vec<Step>>,
}

impl Trial {
    /// A trial that sends requests (`None`), or answers them with `reply`.
    pub fn new(dry_run: Option<ScriptedReply>) -> Trial {
        Trial { dry_run, steps: Mutex::default() }
    }

    /// The scripted reply, in a dry run.
    pub(super) fn scripted(&self) -> Option<HttpResponse> {
        let reply = self.dry_run.as_ref()?;
        Some(HttpResponse { status: reply.status, headers: reply.headers.clone(), body: reply.body.clone() })
    }

    /// What was recorded so far.
    pub fn steps(&self) -> Vec<Step> {
        self.lock().clone()
    }

    pub(super) fn request(&self, req: &HttpRequest) {
        let headers = shown_headers(&req.headers);
        self.push(Step::Request {
            method: printable(&req.method, 32),
            url: crate::redact::url(&printable(&req.url, 4096)),
            headers,
            body: shown_body(&req.body),
        });
    }

    pub(super) fn reply(&self, result: &Result<HttpResponse, HttpError>) {
        self.push(match result {
            Ok(r) => Step::Reply {
                status: r.status,
                headers: shown_headers(&r.headers),
                body: shown_body(&r.body),
                scripted: self.dry_run.is_some(),
            },
            Err(e) => Step::Error(printable(&describe(e), 1024)),
        });
    }

    pub(super) fn log(&self, level: tracing::Level, stream: &'static str, text: &str) {
        self.push(Step::Log { level, stream, text: text.to_string() });
    }

    fn push(&self, step: Step) {
        self.lock().push(step);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Step>> {
        self.steps.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An `http-error` as a sink author reads it.
fn describe(e: &HttpError) -> String {
    match e {
        HttpError::Denied(why) => format!("denied: {why}"),
        HttpError::InvalidRequest(why) => format!("invalid request: {why}"),
        HttpError::Transport(why) => format!("transport: {why}"),
        HttpError::Timeout => "timeout (publish_timeout ran out)".into(),
        HttpError::TooLarge(limit) => format!("response larger than {limit} bytes (sink.max_response_bytes)"),
    }
}

/// A header value, or `***` for credentials (`Authorization`, `X-Api-Key`, `Cookie`, …).
fn redact_header(name: &str, value: &str) -> String {
    if is_secret_name(name) { "***".into() } else { printable(value, 1024) }
}

/// Headers as shown: names escaped, credentials redacted, at most [`HEADERS_SHOWN`].
fn shown_headers(headers: &[(String, String)]) -> Vec<(String, String)> {
    let mut shown: Vec<_> =
        headers.iter().take(HEADERS_SHOWN).map(|(k, v)| (printable(k, 128), redact_header(k, v))).collect();
    if headers.len() > HEADERS_SHOWN {
        shown.push(("…".into(), format!("{} more headers", headers.len() - HEADERS_SHOWN)));
    }
    shown
}

fn shown_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(BODY_SHOWN)]);
    let mut shown = printable(&text, BODY_SHOWN + 64);
    if body.len() > BODY_SHOWN {
        shown.push_str(&format!(" …({} bytes in all)", body.len()));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_queries_and_headers_are_redacted() {
        assert_eq!(
            crate::redact::url("https://console.tim.qq.com/v4/x?sdkappid=14&identifier=admin&usersig=eJx1&random=7"),
            "https://console.tim.qq.com/v4/x?sdkappid=14&identifier=admin&usersig=***&random=7"
        );
        assert_eq!(
            crate::redact::url("https://a/b?access_token=t&API_KEY=k&q=1#f"),
            "https://a/b?access_token=***&API_KEY=***&q=1#f"
        );
        assert_eq!(crate::redact::url("https://user:pw@a/b"), "https://user:***@a/b");
        assert_eq!(redact_header("Authorization", "Bearer abc"), "***");
        assert_eq!(redact_header("X-Api-Key", "abc"), "***");
        assert_eq!(redact_header("webhook-id", "evt-1"), "evt-1");
        assert_eq!(redact_header("Idempotency-Key", "evt-1"), "evt-1");
        assert_eq!(crate::redact::url("https://maps/x?key=k&monkey=m"), "https://maps/x?key=***&monkey=m");
        assert_eq!(redact_header("content-type", "application/json\n"), "application/json\\n");
    }

    #[test]
    fn many_headers_are_cut() {
        let many: Vec<(String, String)> = (0..100).map(|i| (format!("x-{i}"), "v".into())).collect();
        let shown = shown_headers(&many);
        assert_eq!(shown.len(), HEADERS_SHOWN + 1);
        assert_eq!(shown.last().unwrap().1, "36 more headers");
    }

    #[test]
    fn long_bodies_are_cut() {
        let shown = shown_body(&vec![b'a'; 5000]);
        assert!(shown.ends_with(" …(5000 bytes in all)") && shown.len() < 2200, "{}", shown.len());
    }
}
