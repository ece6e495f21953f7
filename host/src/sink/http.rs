//! The `http` import: requests the host performs for a sink, only to its `allowed_hosts`,
//! bounded by the event's remaining `publish_timeout` and by `max_response_bytes`.

use std::time::Duration;

use tokio::time::Instant;

use super::bindings::{HttpError, HttpRequest, HttpResponse};

/// One `allowed_hosts` entry: `host`, `host:port`, or `*.domain` (any subdomain).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    host: String,
    port: Option<u16>,
    wildcard: bool,
}

impl HostPattern {
    /// Parses one entry, saying what is wrong with a bad one.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let lower = text.trim().to_ascii_lowercase();
        if lower.contains("://") || lower.contains('/') {
            return Err(format!("{text:?} must be a host name, optionally with :port, not a URL"));
        }
        let (host, port) = match lower.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => {
                (h.to_string(), Some(p.parse::<u16>().map_err(|_| format!("{text:?} has a bad port"))?))
            }
            _ => (lower.clone(), None),
        };
        let (host, wildcard) = match host.strip_prefix("*.") {
            Some(rest) => (rest.to_string(), true),
            None => (host, false),
        };
        if host.is_empty()
            || !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'))
        {
            return Err(format!("{text:?} is not a host name"));
        }
        Ok(HostPattern { host, port, wildcard })
    }

    /// Whether a URL's host and port are allowed by this entry.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        let host_ok = if self.wildcard {
            host.len() > self.host.len()
                && host.ends_with(&self.host)
                && host[..host.len() - self.host.len()].ends_with('.')
        } else {
            host == self.host
        };
        host_ok && self.port.is_none_or(|p| p == port)
    }
}

/// What the host needs to perform a sink's request.
pub struct HttpPolicy {
    /// Shared connection pool; redirects are never followed (they could leave the allowed hosts).
    pub client: reqwest::Client,
    /// The sink's `allowed_hosts`.
    pub allowed: Vec<HostPattern>,
    /// Response bodies larger than this are refused.
    pub max_response_bytes: u64,
}

impl HttpPolicy {
    /// Builds the shared client.
    pub fn new(allowed: Vec<HostPattern>, max_response_bytes: u64) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(HttpPolicy { client, allowed, max_response_bytes })
    }

    /// Performs `req` if its host is allowed, within `deadline`.
    pub async fn send(&self, req: HttpRequest, deadline: Instant) -> Result<HttpResponse, HttpError> {
        let url = reqwest::Url::parse(&req.url).map_err(|e| HttpError::InvalidRequest(format!("bad url: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(HttpError::InvalidRequest(format!("scheme {} is not http or https", url.scheme())));
        }
        let host = url.host_str().unwrap_or_default().to_string();
        let port = url.port_or_known_default().unwrap_or(0);
        if !self.allowed.iter().any(|p| p.allows(&host, port)) {
            return Err(HttpError::Denied(format!("{host}:{port} is not in this sink's allowed_hosts")));
        }
        let method = reqwest::Method::from_bytes(req.method.as_bytes())
            .map_err(|_| HttpError::InvalidRequest(format!("bad method {:?}", req.method)))?;
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(HttpError::Timeout);
        }
        let mut builder = self.client.request(method, url).timeout(remaining).body(req.body);
        for (name, value) in req.headers {
            builder = builder.header(name, value);
        }
        let work = async {
            let mut response = builder.send().await.map_err(transport)?;
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                .collect();
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(transport)? {
                if (body.len() + chunk.len()) as u64 > self.max_response_bytes {
                    return Err(HttpError::TooLarge(self.max_response_bytes));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(HttpResponse { status, headers, body })
        };
        tokio::time::timeout_at(deadline, work).await.unwrap_or(Err(HttpError::Timeout))
    }
}

/// A transport error without the URL's query string (it may carry a signature).
fn transport(e: reqwest::Error) -> HttpError {
    if e.is_timeout() {
        return HttpError::Timeout;
    }
    let e = e.without_url();
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    HttpError::Transport(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_host_port_and_subdomains() {
        let exact = HostPattern::parse("console.tim.qq.com").unwrap();
        assert!(exact.allows("console.tim.qq.com", 443));
        assert!(exact.allows("CONSOLE.tim.qq.com", 80));
        assert!(!exact.allows("evil.com", 443));
        assert!(!exact.allows("xconsole.tim.qq.com", 443));

        let with_port = HostPattern::parse("127.0.0.1:8080").unwrap();
        assert!(with_port.allows("127.0.0.1", 8080));
        assert!(!with_port.allows("127.0.0.1", 8081));

        let wildcard = HostPattern::parse("*.im.qcloud.com").unwrap();
        assert!(wildcard.allows("adminapisgp.im.qcloud.com", 443));
        assert!(!wildcard.allows("im.qcloud.com", 443));
        assert!(!wildcard.allows("evilim.qcloud.com", 443));
    }

    #[test]
    fn urls_are_not_patterns() {
        assert!(HostPattern::parse("https://example.com").is_err());
        assert!(HostPattern::parse("example.com/path").is_err());
        assert!(HostPattern::parse("example.com:http").is_err());
        assert!(HostPattern::parse("").is_err());
    }
}
