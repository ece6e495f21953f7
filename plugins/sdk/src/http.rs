//! Outgoing HTTP through the host (only to the sink's `allowed_hosts`, within the event's
//! `publish_timeout`), and what a reply means for the event.

use std::fmt;

use crate::{Delivery, Failure, Outcome, Pressure, host};

/// A request for the host to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, …
    pub method: String,
    /// The full URL.
    pub url: String,
    /// Header names and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// A request with no headers and no body.
    pub fn new(method: &str, url: &str) -> Request {
        Request { method: method.into(), url: url.into(), headers: Vec::new(), body: Vec::new() }
    }

    /// A `GET`.
    pub fn get(url: &str) -> Request {
        Request::new("GET", url)
    }

    /// A `POST`.
    pub fn post(url: &str) -> Request {
        Request::new("POST", url)
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// `value` as the body, with `content-type: application/json`.
    pub fn json(self, value: &serde_json::Value) -> Request {
        self.header("content-type", "application/json").body(value.to_string())
    }

    /// The body as it is.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// Has the host perform it.
    pub fn send(&self) -> Result<Response, HttpError> {
        crate::host::send(&self.into()).map(Response::from).map_err(HttpError::from)
    }
}

impl From<&Request> for host::Request {
    fn from(r: &Request) -> Self {
        host::Request { method: r.method.clone(), url: r.url.clone(), headers: r.headers.clone(), body: r.body.clone() }
    }
}

impl From<host::Request> for Request {
    fn from(r: host::Request) -> Self {
        Request { method: r.method, url: r.url, headers: r.headers, body: r.body }
    }
}

impl From<host::Response> for Response {
    fn from(r: host::Response) -> Self {
        Response { status: r.status, headers: r.headers, body: r.body }
    }
}

impl From<Response> for host::Response {
    fn from(r: Response) -> Self {
        host::Response { status: r.status, headers: r.headers, body: r.body }
    }
}

impl From<host::HttpError> for HttpError {
    fn from(e: host::HttpError) -> Self {
        match e {
            host::HttpError::Denied(why) => HttpError::Denied(why),
            host::HttpError::InvalidRequest(why) => HttpError::InvalidRequest(why),
            host::HttpError::Transport(why) => HttpError::Transport(why),
            host::HttpError::Timeout => HttpError::Timeout,
            host::HttpError::TooLarge(limit) => HttpError::TooLarge(limit),
        }
    }
}

impl From<HttpError> for host::HttpError {
    fn from(e: HttpError) -> Self {
        match e {
            HttpError::Denied(why) => host::HttpError::Denied(why),
            HttpError::InvalidRequest(why) => host::HttpError::InvalidRequest(why),
            HttpError::Transport(why) => host::HttpError::Transport(why),
            HttpError::Timeout => host::HttpError::Timeout,
            HttpError::TooLarge(limit) => host::HttpError::TooLarge(limit),
        }
    }
}

/// The destination's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names (lowercase) and values.
    pub headers: Vec<(String, String)>,
    /// The body (at most the host's `max_response_bytes`).
    pub body: Vec<u8>,
}

impl Response {
    /// A reply with this status and body, and no headers: for tests.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response { status, headers: Vec::new(), body: body.into() }
    }

    /// Adds a header: for tests.
    pub fn header(mut self, name: &str, value: &str) -> Response {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// The first value of the named header (case-insensitive).
    pub fn header_value(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// `Retry-After` in milliseconds from now: delta-seconds, or an HTTP date.
    pub fn retry_after_ms(&self) -> Option<u64> {
        let value = self.header_value("retry-after")?.trim();
        if let Ok(seconds) = value.parse::<u64>() {
            return Some(seconds.saturating_mul(1000));
        }
        let at = http_date_secs(value)?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
        Some(at.saturating_sub(now).saturating_mul(1000))
    }
}

/// Why the host could not get a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The URL's host is not in the sink's `allowed_hosts`.
    Denied(String),
    /// The URL, method or a header could not be used.
    InvalidRequest(String),
    /// Connecting, sending or reading failed.
    Transport(String),
    /// The event's `publish_timeout` ran out.
    Timeout,
    /// The reply was larger than the host allows (its limit in bytes).
    TooLarge(u64),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Denied(why) => write!(f, "denied: {why}"),
            HttpError::InvalidRequest(why) => write!(f, "invalid request: {why}"),
            HttpError::Transport(why) => write!(f, "transport: {why}"),
            HttpError::Timeout => write!(f, "timeout"),
            HttpError::TooLarge(limit) => write!(f, "response larger than {limit} bytes"),
        }
    }
}

/// What a reply means, for a destination named `destination` in messages:
/// - 2xx: delivered;
/// - 408: retryable;
/// - 429: retryable, not before `Retry-After`, and the whole destination is throttled;
/// - 5xx: retryable (after `Retry-After` if given), and the destination is unavailable;
/// - any other status: permanent;
/// - and for errors, [`failure_of`].
pub fn classify(destination: &str, reply: Result<Response, HttpError>) -> Delivery {
    let response = reply.map_err(|e| failure_of(destination, &e))?;
    let status = response.status;
    let failure = match status {
        200..=299 => return Ok(Outcome::Delivered),
        408 => Failure::retryable(format!("HTTP 408 from {destination}")),
        429 => Failure::retryable(format!("HTTP 429 from {destination}")).pressure(Pressure::Throttled),
        500..=599 => Failure::retryable(format!("HTTP {status} from {destination}")).pressure(Pressure::Unavailable),
        _ => return Err(Failure::permanent(format!("HTTP {status} from {destination}"))),
    };
    Err(match response.retry_after_ms() {
        Some(ms) => failure.after_ms(ms),
        None => failure,
    })
}

/// What an error means: a refused or unusable request is permanent (an operator must fix
/// the config); an unreachable destination is retryable and pauses the sink; a timeout or an
/// oversized reply is retryable.
pub fn failure_of(destination: &str, error: &HttpError) -> Failure {
    let message = format!("{destination}: {error}");
    match error {
        HttpError::Denied(_) | HttpError::InvalidRequest(_) => Failure::permanent(message),
        HttpError::Transport(_) => Failure::retryable(message).pressure(Pressure::Unavailable),
        HttpError::Timeout | HttpError::TooLarge(_) => Failure::retryable(message),
    }
}

/// Seconds since the epoch of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date_secs(text: &str) -> Option<u64> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = MONTHS.iter().position(|m| m == month)? as i64 + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + m * 60 + s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(reply: Result<Response, HttpError>) -> Failure {
        classify("the hook", reply).expect_err("a failure")
    }

    #[test]
    fn success_is_delivered() {
        assert_eq!(classify("x", Ok(Response::new(200, ""))), Ok(Outcome::Delivered));
        assert_eq!(classify("x", Ok(Response::new(204, ""))), Ok(Outcome::Delivered));
    }

    #[test]
    fn rate_limits_and_server_errors_are_retried_with_their_hint() {
        let throttled = failure(Ok(Response::new(429, "").header("Retry-After", "7")));
        assert_eq!(
            throttled,
            Failure::retryable("HTTP 429 from the hook").pressure(Pressure::Throttled).after_ms(7_000)
        );
        let down = failure(Ok(Response::new(503, "")));
        assert_eq!(down, Failure::retryable("HTTP 503 from the hook").pressure(Pressure::Unavailable));
        let timeout = failure(Ok(Response::new(408, "")));
        assert_eq!((timeout.kind, timeout.pressure), (crate::FailureKind::Retryable, None));
    }

    #[test]
    fn other_statuses_are_permanent() {
        for status in [301, 400, 401, 403, 404, 410, 422] {
            assert_eq!(
                failure(Ok(Response::new(status, ""))),
                Failure::permanent(format!("HTTP {status} from the hook"))
            );
        }
    }

    #[test]
    fn errors_are_classified() {
        assert_eq!(failure(Err(HttpError::Denied("no".into()))).kind, crate::FailureKind::Permanent);
        let unreachable = failure(Err(HttpError::Transport("refused".into())));
        assert_eq!(unreachable, Failure::retryable("the hook: transport: refused").pressure(Pressure::Unavailable));
        assert_eq!(failure(Err(HttpError::Timeout)).kind, crate::FailureKind::Retryable);
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(Response::new(429, "").header("retry-after", "120").retry_after_ms(), Some(120_000));
        assert_eq!(Response::new(429, "").header("retry-after", "soon").retry_after_ms(), None);
        assert_eq!(http_date_secs("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784_111_777));
        assert_eq!(http_date_secs("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        // A date in the past means now.
        assert_eq!(
            Response::new(503, "").header("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT").retry_after_ms(),
            Some(0)
        );
    }
}
