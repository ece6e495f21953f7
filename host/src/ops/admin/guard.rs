//! What keeps a web page from using the admin listener against its operator.
//!
//! - **DNS rebinding**: only requests whose `Host` is an IP literal, `localhost`, or a name in
//!   `admin.allowed_hosts` are answered. A rebinding attack needs the attacker's own name in
//!   `Host`, so IP literals (what probes and scrapers send) stay safe to accept.
//! - **Cross-site requests**: every state change needs the admin token (`admin.token`), as a
//!   bearer header on the API or typed into the page's form, and a same-origin request
//!   (`Sec-Fetch-Site`, `Origin`). The page's form also carries a per-process form token.
//!   Without `admin.token` nothing can change state over HTTP.
//! - **Cross-site reads**: every route but `/healthz`, `/readyz` and `/metrics` refuses a
//!   request the browser marks `Sec-Fetch-Site: cross-site`, so an `<img>` or a script on
//!   another site cannot make an operator's browser read the page or an event.
//! - **Reads off loopback**: with `admin.token` set and the listener on an address other
//!   than loopback, the page and the API need the token too (as a bearer header, or as the
//!   password of the browser's Basic prompt); probes and scrapes do not.
//! - **Clickjacking and injection**: `X-Frame-Options: DENY` and a strict CSP on everything.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use super::AdminState;
use super::settings::AdminConfig;

/// The page's policy: no scripts, no plugins, styles inline, forms only to itself, never framed.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Who may do what on the admin listener.
pub struct Guard {
    token: Option<String>,
    allowed_hosts: Vec<String>,
    form_token: String,
    /// Reads need the token too: it is set and the listener is not on loopback.
    reads_need_token: bool,
}

/// The routes any client may read without a token, from any site: probes and scrapes.
const OPEN_ROUTES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

impl Guard {
    /// The guard for `admin:`; the form token is new in every process.
    pub fn new(config: &AdminConfig) -> Guard {
        let form_token = crate::clock::hex(&crate::clock::random_bytes(16));
        let off_loopback = config.listen.is_some_and(|addr| !addr.ip().is_loopback());
        Guard {
            token: config.token.clone(),
            allowed_hosts: config.allowed_hosts.clone(),
            form_token,
            reads_need_token: config.token.is_some() && off_loopback,
        }
    }

    /// Any request but a probe's or a scrape's: refused from another site, and, where reads
    /// need the token, without it.
    pub fn check_read(&self, path: &str, headers: &HeaderMap) -> Result<(), Refusal> {
        if OPEN_ROUTES.contains(&path) {
            return Ok(());
        }
        if headers.get("sec-fetch-site").is_some_and(|site| site.as_bytes() == b"cross-site") {
            return Err(Refusal(StatusCode::FORBIDDEN, "cross-site request refused"));
        }
        if !self.reads_need_token {
            return Ok(());
        }
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| {
            v.strip_prefix("Bearer ")
                .map(|t| t.trim().to_string())
                .or_else(|| basic_password(v.strip_prefix("Basic ")?))
        });
        self.token_matches(given.as_deref()).map_err(|_| Refusal::ask_for_token())
    }

    /// Whether any state change is possible over HTTP (`admin.token` is set).
    pub fn mutations_allowed(&self) -> bool {
        self.token.is_some()
    }

    /// Who made a change, for the log: the first 8 hex digits of the admin token's SHA-256
    /// (`token:1a2b3c4d`), which names the token without showing it; `None` without a token.
    pub fn token_id(&self) -> Option<String> {
        use sha2::Digest as _;
        let token = self.token.as_deref()?;
        let digest = sha2::Sha256::digest(token.as_bytes());
        Some(format!("token:{}", crate::clock::hex(&digest[..4])))
    }

    /// The token the page's form must send back.
    pub fn form_token(&self) -> String {
        self.form_token.clone()
    }

    /// Whether `Host` (with or without a port) names this listener acceptably.
    pub fn host_allowed(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            Some(rest) => return rest.split(']').next().is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
            None => host.rsplit_once(':').map_or(host, |(name, _)| name),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name.parse::<std::net::Ipv4Addr>().is_ok() || name == "localhost" || self.allowed_hosts.contains(&name)
    }

    /// A state change through the API: same-origin, with `Authorization: Bearer <admin.token>`.
    pub fn check_api(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        self.same_origin(headers)?;
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        self.token_matches(given)
    }

    /// A state change through the page's form: same-origin, with the form token and the
    /// admin token the operator typed.
    pub fn check_form(&self, headers: &HeaderMap, token: Option<&str>, csrf: Option<&str>) -> Result<(), Refusal> {
        self.same_origin(headers)?;
        if !csrf.is_some_and(|c| same(c, &self.form_token)) {
            return Err(Refusal(
                StatusCode::FORBIDDEN,
                "the form is stale or did not come from this page: reload the page",
            ));
        }
        self.token_matches(token)
    }

    fn token_matches(&self, given: Option<&str>) -> Result<(), Refusal> {
        let Some(expected) = &self.token else {
            return Err(Refusal(
                StatusCode::FORBIDDEN,
                "changes over HTTP are off: set admin.token in the config (or OUTBOX__ADMIN__TOKEN)",
            ));
        };
        match given {
            Some(given) if same(given, expected) => Ok(()),
            _ => Err(Refusal(StatusCode::UNAUTHORIZED, "the admin token is missing or wrong")),
        }
    }

    /// Refuses what a browser marks as coming from another site. Clients that are not
    /// browsers (curl, scripts) send neither header and pass; they still need the token.
    fn same_origin(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(site) = text("sec-fetch-site")
            && !matches!(site, "same-origin" | "none")
        {
            return Err(Refusal(StatusCode::FORBIDDEN, "cross-site request refused"));
        }
        if let Some(origin) = text("origin") {
            let host = text("host").unwrap_or_default();
            let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
            if origin == "null" || !origin_host.eq_ignore_ascii_case(host) {
                return Err(Refusal(StatusCode::FORBIDDEN, "cross-origin request refused"));
            }
        }
        Ok(())
    }
}

/// Compares secrets without leaking where, or whether in length, they differ through timing:
/// their digests, in constant time.
fn same(given: &str, expected: &str) -> bool {
    Sha256::digest(given.as_bytes()).as_slice().ct_eq(Sha256::digest(expected.as_bytes()).as_slice()).into()
}

/// The password of a Basic `Authorization` value (base64 of `user:password`).
fn basic_password(encoded: &str) -> Option<String> {
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    Some(text.split_once(':')?.1.to_string())
}

/// Why a request may not do what it asks: its status and a sentence for the operator.
#[derive(Debug)]
pub struct Refusal(StatusCode, &'static str);

/// What a read off loopback without the token is told: a browser asks its user for the
/// token (the Basic challenge); scripts send a bearer.
const READ_NEEDS_TOKEN: &str = "this listener is not on loopback: reading it needs the admin token";

impl Refusal {
    fn ask_for_token() -> Refusal {
        Refusal(StatusCode::UNAUTHORIZED, READ_NEEDS_TOKEN)
    }

    /// The HTTP status it answers with.
    pub fn status(&self) -> StatusCode {
        self.0
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = refuse(self.0, self.1);
        if self.0 == StatusCode::UNAUTHORIZED {
            response.headers_mut().append(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            // Only a read asks the browser to prompt: a form's wrong token is said in the page.
            if self.1 == READ_NEEDS_TOKEN {
                response
                    .headers_mut()
                    .append(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"outbox-host\""));
            }
        }
        response
    }
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], format!("{why}\n")).into_response()
}

/// Every request: refuse a foreign `Host`, and add the headers that keep the answer from
/// being framed, sniffed or cached.
pub async fn screen(State(s): State<Arc<AdminState>>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut response = if !s.guard.host_allowed(host) {
        refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this Host is not served here: use an IP address or localhost, or add the name to admin.allowed_hosts",
        )
    } else if let Err(refused) = s.guard.check_read(request.uri().path(), request.headers()) {
        refused.into_response()
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(token: Option<&str>) -> Guard {
        Guard::new(&AdminConfig {
            listen: None,
            stats_interval: std::time::Duration::from_secs(5),
            unready_after_db_failures: 3,
            token: token.map(str::to_string),
            allowed_hosts: vec!["outbox.internal".into()],
        })
    }

    #[test]
    fn only_ip_literals_localhost_and_configured_names_are_answered() {
        let g = guard(None);
        for ok in ["127.0.0.1:9464", "10.0.0.5", "[::1]:9464", "localhost:9464", "LOCALHOST", "outbox.internal:80"] {
            assert!(g.host_allowed(ok), "{ok} refused");
        }
        for bad in ["evil.example:9464", "", "localhost.evil.example", "[not-an-ip]:1", "127.0.0.1.nip.io"] {
            assert!(!g.host_allowed(bad), "{bad} answered");
        }
    }

    #[test]
    fn api_changes_need_the_bearer_token_and_no_foreign_origin() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_str(v).unwrap());
            }
            h
        };
        let token = "0123456789abcdef0123";
        assert_eq!(guard(None).check_api(&headers(&[])).unwrap_err().status(), StatusCode::FORBIDDEN);
        let g = guard(Some(token));
        assert_eq!(g.check_api(&headers(&[])).unwrap_err().status(), StatusCode::UNAUTHORIZED);
        let bearer = format!("Bearer {token}");
        assert!(g.check_api(&headers(&[("authorization", &bearer)])).is_ok());
        assert_eq!(
            g.check_api(&headers(&[("authorization", "Bearer wrong")])).unwrap_err().status(),
            StatusCode::UNAUTHORIZED
        );
        let cross = headers(&[("authorization", &bearer), ("sec-fetch-site", "cross-site")]);
        assert_eq!(g.check_api(&cross).unwrap_err().status(), StatusCode::FORBIDDEN);
        let foreign =
            headers(&[("authorization", &bearer), ("origin", "http://evil.example"), ("host", "127.0.0.1:9464")]);
        assert_eq!(g.check_api(&foreign).unwrap_err().status(), StatusCode::FORBIDDEN);
        let own =
            headers(&[("authorization", &bearer), ("origin", "http://127.0.0.1:9464"), ("host", "127.0.0.1:9464")]);
        assert!(g.check_api(&own).is_ok());
    }
}
