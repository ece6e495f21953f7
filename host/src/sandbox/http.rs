//! The `http` import: requests the host performs for a sink, only to its `allowed_hosts`,
//! bounded by the event's remaining `publish_timeout`, by `max_response_bytes`, and by the
//! per-attempt request budgets.
//!
//! Names are resolved by the host's own resolver, which drops special addresses (loopback,
//! metadata, private ranges) unless an address entry names them with the request's port; the
//! connection goes to an address that resolver returned, so DNS rebinding cannot slip in
//! between check and connect. A resolver sees only the name, so there is one client (and
//! connection pool) per destination port, each with a resolver for that port; the ports are
//! those `allowed_hosts` admits. The host's proxy environment never applies; redirects are
//! never followed.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::bindings::{HttpError, HttpRequest, HttpResponse};
use super::egress::{HostPattern, special_range};

/// Request headers a sink may not set: hop-by-hop headers, and those the host derives from
/// the URL and body.
const FORBIDDEN_HEADERS: &[&str] =
    &["host", "connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "content-length"];

/// An HTTP import error as a span's `error.type`.
fn http_error_type(error: &HttpError) -> &'static str {
    match error {
        HttpError::Denied(_) => "denied",
        HttpError::InvalidRequest(_) => "invalid_request",
        HttpError::Transport(_) => "transport",
        HttpError::Timeout => "timeout",
        HttpError::TooLarge(_) => "too_large",
    }
}

/// What the host needs to perform a sink's requests.
pub struct HttpPolicy {
    clients: Mutex<HashMap<u16, reqwest::Client>>,
    proxy: Option<String>,
    allowed: Arc<Vec<HostPattern>>,
    allow_http: bool,
    max_response_bytes: u64,
    max_request_bytes: u64,
}

/// The settings [`HttpPolicy::new`] takes from `sink:`.
pub struct PolicySettings<'a> {
    /// The parsed `allowed_hosts`.
    pub allowed: Vec<HostPattern>,
    /// Whether `http://` may be used.
    pub allow_http: bool,
    /// An explicit proxy, if configured.
    pub proxy: Option<&'a str>,
    /// Response bodies larger than this are refused.
    pub max_response_bytes: u64,
    /// Request bodies larger than this are refused.
    pub max_request_bytes: u64,
}

impl HttpPolicy {
    /// The policy; clients are built per destination port when first needed.
    pub fn new(settings: PolicySettings<'_>) -> anyhow::Result<Self> {
        if let Some(proxy) = settings.proxy {
            reqwest::Proxy::all(proxy)?;
        }
        Ok(HttpPolicy {
            clients: Mutex::default(),
            proxy: settings.proxy.map(str::to_string),
            allowed: Arc::new(settings.allowed),
            allow_http: settings.allow_http,
            max_response_bytes: settings.max_response_bytes,
            max_request_bytes: settings.max_request_bytes,
        })
    }

    /// The client for requests to `port`: no redirects, no proxy from the environment, and a
    /// resolver that checks addresses for that port.
    fn client(&self, port: u16) -> Result<reqwest::Client, HttpError> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(&port) {
            return Ok(client.clone());
        }
        let proxy_host = self
            .proxy
            .as_deref()
            .and_then(|p| reqwest::Url::parse(p).ok())
            .and_then(|u| u.host_str().map(str::to_string));
        let resolver = CheckedResolver { allowed: self.allowed.clone(), port, allow_http: self.allow_http, proxy_host };
        let builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(5))
            .dns_resolver(Arc::new(resolver));
        let builder = match &self.proxy {
            Some(proxy) => reqwest::Proxy::all(proxy.as_str()).map(|p| builder.proxy(p)),
            None => Ok(builder.no_proxy()),
        };
        let client = builder
            .and_then(|b| b.build())
            .map_err(|e| HttpError::Transport(format!("cannot set up the HTTP client: {e}")))?;
        clients.insert(port, client.clone());
        Ok(client)
    }

    /// Performs `req` if its URL is allowed, within `deadline`.
    pub async fn send(&self, req: HttpRequest, deadline: Instant) -> Result<HttpResponse, HttpError> {
        let url = self.check_url(&req.url)?;
        let client = self.client(url.port_or_known_default().unwrap_or(0))?;
        let method = reqwest::Method::from_bytes(req.method.as_bytes()).map_err(|_| {
            HttpError::InvalidRequest(format!("bad method {:?}", crate::text::printable(&req.method, 32)))
        })?;
        if req.body.len() as u64 > self.max_request_bytes {
            return Err(HttpError::InvalidRequest(format!(
                "request body of {} bytes is larger than sink.max_request_bytes ({})",
                req.body.len(),
                self.max_request_bytes
            )));
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(HttpError::Timeout);
        }
        let attempt = crate::ops::traces::current();
        let traced =
            attempt.as_ref().and_then(|a| a.http_span(method.as_str(), url.host_str()?, url.port_or_known_default()));
        let mut builder = client.request(method, url).timeout(remaining);
        if let Some(attempt) = &attempt {
            // The attempt's span, whatever the sink set (see `ops/traces.rs`).
            builder = builder.header("traceparent", attempt.traceparent());
        }
        for (name, value) in req.headers {
            let lower = name.to_ascii_lowercase();
            if attempt.is_some() && (lower == "traceparent" || lower == "tracestate") {
                continue;
            }
            if FORBIDDEN_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
                tracing::debug!(header = %crate::text::printable(&name, 64), "dropped a header the host controls");
                continue;
            }
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                HttpError::InvalidRequest(format!("bad header name {:?}", crate::text::printable(&name, 64)))
            })?;
            let value = reqwest::header::HeaderValue::from_str(&value)
                .map_err(|_| HttpError::InvalidRequest(format!("bad value for header {name}")))?;
            builder = builder.header(name, value);
        }
        let work = async {
            let mut response = builder.body(req.body).send().await.map_err(transport)?;
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
        let answered = tokio::time::timeout_at(deadline, work).await.unwrap_or(Err(HttpError::Timeout));
        if let Some(span) = traced {
            span.end(answered.as_ref().map(|r| r.status).map_err(http_error_type));
        }
        answered
    }

    /// Whether `req` would be sent: its URL allowed, its body within bounds (a dry run's
    /// check; [`HttpPolicy::send`] makes the same ones).
    pub fn check(&self, req: &HttpRequest) -> Result<(), HttpError> {
        self.check_url(&req.url)?;
        if req.body.len() as u64 > self.max_request_bytes {
            return Err(HttpError::InvalidRequest(format!(
                "request body of {} bytes is larger than sink.max_request_bytes ({})",
                req.body.len(),
                self.max_request_bytes
            )));
        }
        Ok(())
    }

    /// Whether a request to `url` would pass the sink's egress policy (scheme, host, port),
    /// without sending anything: for the destinations a sink declares.
    pub fn check_destination(&self, url: &str) -> Result<(), HttpError> {
        self.check_url(url).map(|_| ())
    }

    /// The parsed URL, if its scheme, host and port are allowed.
    fn check_url(&self, text: &str) -> Result<reqwest::Url, HttpError> {
        let mut url = reqwest::Url::parse(text).map_err(|e| HttpError::InvalidRequest(format!("bad url: {e}")))?;
        // A fully qualified name (`localhost.`) is the same name: checked, resolved and sent
        // without its dot, under the same policy.
        if let Some(url::Host::Domain(name)) = url.host()
            && let Some(bare) = name.strip_suffix('.').filter(|bare| !bare.is_empty() && !bare.ends_with('.'))
        {
            let bare = bare.to_string();
            url.set_host(Some(&bare)).map_err(|e| HttpError::InvalidRequest(format!("bad url: {e}")))?;
        }
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" => return Err(HttpError::Denied("plain http is off for this sink (sink.allow_http)".into())),
            other => {
                return Err(HttpError::InvalidRequest(format!(
                    "scheme {} is not http or https",
                    crate::text::printable(other, 32)
                )));
            }
        }
        let port = url.port_or_known_default().unwrap_or(0);
        let (shown, allowed) = match url.host() {
            Some(url::Host::Domain(name)) => {
                (name.to_string(), self.allowed.iter().any(|p| p.allows_name(name, port, self.allow_http)))
            }
            Some(url::Host::Ipv4(ip)) => (ip.to_string(), self.addr_allowed(IpAddr::V4(ip), port)),
            Some(url::Host::Ipv6(ip)) => (format!("[{ip}]"), self.addr_allowed(IpAddr::V6(ip), port)),
            None => return Err(HttpError::InvalidRequest("url has no host".into())),
        };
        if !allowed {
            return Err(HttpError::Denied(format!("{shown}:{port} is not in this sink's allowed_hosts")));
        }
        Ok(url)
    }

    fn addr_allowed(&self, ip: IpAddr, port: u16) -> bool {
        self.allowed.iter().any(|p| p.allows_addr(ip, port, self.allow_http))
    }
}

/// Resolves names for the sink's client of one port, keeping only addresses a sink may
/// reach: public ones, and special ones an address entry names for that port.
struct CheckedResolver {
    allowed: Arc<Vec<HostPattern>>,
    port: u16,
    allow_http: bool,
    /// The configured proxy's host, which the operator chose and is not checked.
    proxy_host: Option<String>,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowed = self.allowed.clone();
        let (port, allow_http) = (self.port, self.allow_http);
        let trusted = self.proxy_host.as_deref() == Some(name.as_str());
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = Vec::new();
            let usable: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match special_range(a.ip()) {
                    Some(why) if !trusted && !allowed.iter().any(|p| p.allows_addr(a.ip(), port, allow_http)) => {
                        refused.push(format!("{} is {why}", a.ip()));
                        false
                    }
                    _ => true,
                })
                .collect();
            if usable.is_empty() {
                let why = if refused.is_empty() { "no address".to_string() } else { refused.join(", ") };
                return Err(format!(
                    "{host} resolves to an address sinks may not reach ({why}); name that address or range in allowed_hosts to allow it"
                )
                .into());
            }
            Ok(Box::new(usable.into_iter()) as reqwest::dns::Addrs)
        })
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
