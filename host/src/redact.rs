//! Credentials kept out of every output: one redaction for every URL and connection string
//! the host prints, one rule for which names carry a credential, and the credentials of
//! the loaded config scrubbed from whatever reaches a log line, a terminal, `last_error` or
//! the status page (decision 0197).
//!
//! Two layers, so that a path nobody thought of is still covered: a URL the host prints
//! itself goes through [`url`], which hides its user info and its credential-looking query
//! and fragment values; and every credential the config holds (a database or broker
//! password or token, a sink's `secret_key`, the admin token) is [`remember`]ed when the
//! config is read, and [`scrub`] replaces it (raw or percent-encoded) by `***` in the log
//! writer, in `last_error`, in a broker's error on the page and in what the commands print.
//! A library's error that repeats a URL it was given is caught by the second layer.

use std::borrow::Cow;
use std::sync::RwLock;

/// What a hidden value is shown as.
pub const HIDDEN: &str = "***";

/// Config values shorter than this are not scrubbed from text (a one-letter password would
/// blank every such letter); [`url`] still hides them in a URL.
pub const MIN_SECRET_CHARS: usize = 4;

/// Names (of query parameters, headers, config keys) that contain one of these carry a
/// credential; so does a name that is exactly `key`, `pass` or `pwd`.
const SECRET_NAMES: &[&str] = &[
    "sig",
    "token",
    "secret",
    "password",
    "passwd",
    "auth",
    "credential",
    "session",
    "cookie",
    "api-key",
    "api_key",
    "apikey",
    "access-key",
    "access_key",
    "accesskey",
    "private",
    "sslkey",
    "ssl-key",
    "ssl_key",
    "signing",
];

/// Whether a query parameter, header or config key of this name carries a credential.
pub fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(name.as_str(), "key" | "pass" | "pwd") || SECRET_NAMES.iter().any(|s| name.contains(s))
}

/// A URL or connection string with its credentials shown as `***`: the user info (all of
/// it when it has no `:`, as `nats://TOKEN@host`; the password after `user:` otherwise),
/// and the values of credential-looking parameters in its query and fragment.
///
/// A password may hold `@`, `/`, `?` or `#` raw: the user info is taken to end at the
/// *last* `@`. A `@` in a query is taken for one too, so everything before it is hidden:
/// more than needed, never less.
pub fn url(url: &str) -> String {
    let Parts { scheme, user_info, after } = parts(url);
    // Without a scheme (a DSN), the part before `:` is not known to be a user name.
    let shown = user_info.map(|user_info| match user_info.split_once(':') {
        Some((user, _)) if scheme.is_some() && !user.is_empty() && !user.contains(['/', '?', '#']) => {
            format!("{user}:{HIDDEN}@")
        }
        _ => format!("{HIDDEN}@"),
    });
    let scheme = scheme.map(|scheme| format!("{scheme}://")).unwrap_or_default();
    format!("{scheme}{}{}", shown.unwrap_or_default(), after_user_info(after))
}

/// A URL split around its user info.
struct Parts<'a> {
    /// `postgres`, …; none for a DSN without one (`user:pass@tcp(host)/db`).
    scheme: Option<&'a str>,
    /// Up to the *last* `@` (a password may hold `@`, `/`, `?` or `#` raw); none for a file
    /// (`sqlite:`), whose path may hold an `@`.
    user_info: Option<&'a str>,
    /// The host, path, query and fragment.
    after: &'a str,
}

fn parts(url: &str) -> Parts<'_> {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    if scheme.is_some_and(|s| s.eq_ignore_ascii_case("sqlite")) {
        return Parts { scheme, user_info: None, after: rest };
    }
    match rest.rsplit_once('@') {
        Some((user_info, after)) => Parts { scheme, user_info: Some(user_info), after },
        None => Parts { scheme, user_info: None, after: rest },
    }
}

/// The host, path, query and fragment of a URL, the query's and fragment's credential
/// values hidden.
fn after_user_info(rest: &str) -> String {
    let (before_fragment, fragment) = match rest.split_once('#') {
        Some((before, fragment)) => (before, Some(fragment)),
        None => (rest, None),
    };
    let mut out = match before_fragment.split_once('?') {
        Some((address, query)) => format!("{address}?{}", query_values(query, is_secret_name)),
        None => before_fragment.to_string(),
    };
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(&query_values(fragment, is_secret_name));
    }
    out
}

/// A URL's query (`a=1&token=x`) with the values of the parameters `secret` names shown as
/// `***`.
pub fn query_values(query: &str, secret: impl Fn(&str) -> bool) -> String {
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if secret(&percent_decoded(name)) => format!("{name}={HIDDEN}"),
            _ => pair.to_string(),
        })
        .collect();
    pairs.join("&")
}

/// `text` with `%XX` escapes decoded (invalid ones kept as they are).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b)))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` with every byte outside the URL-unreserved set written as `%XX`.
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Credential values to scrub from text: each as written, and percent-encoded (upper and
/// lower case hex), longest first so that one that contains another is hidden whole.
#[derive(Default, Clone)]
pub struct Secrets(Vec<String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} values)", self.0.len())
    }
}

impl Secrets {
    /// `values`, less those shorter than [`MIN_SECRET_CHARS`].
    pub fn new(values: impl IntoIterator<Item = String>) -> Secrets {
        let mut secrets = Secrets::default();
        secrets.add(values);
        secrets
    }

    /// Adds `values` (and their encoded forms).
    pub fn add(&mut self, values: impl IntoIterator<Item = String>) {
        for value in values.into_iter().filter(|v| v.chars().count() >= MIN_SECRET_CHARS) {
            let encoded = percent_encoded(&value);
            for form in [encoded.to_ascii_lowercase(), encoded, value] {
                if !self.0.contains(&form) {
                    self.0.push(form);
                }
            }
        }
        self.0.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    /// Whether there is nothing to scrub.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every value shown as `***`.
    pub fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for secret in &self.0 {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), HIDDEN));
            }
        }
        out
    }
}

/// The credentials of every config this process has read.
static KNOWN: RwLock<Option<Secrets>> = RwLock::new(None);

/// Adds `values` to the credentials [`scrub`] hides, for the rest of the process.
pub fn remember(values: impl IntoIterator<Item = String>) {
    let values: Vec<String> = values.into_iter().collect();
    if values.iter().all(|v| v.chars().count() < MIN_SECRET_CHARS) {
        return;
    }
    let mut known = KNOWN.write().unwrap_or_else(|p| p.into_inner());
    known.get_or_insert_with(Secrets::default).add(values);
}

/// `text` with every credential this process knows of shown as `***`.
pub fn scrub(text: &str) -> Cow<'_, str> {
    let known = KNOWN.read().unwrap_or_else(|p| p.into_inner());
    match known.as_ref() {
        Some(secrets) => secrets.scrub(text),
        None => Cow::Borrowed(text),
    }
}

/// The credentials in `url`: its user info (the password, or all of it when it has no
/// `:`) and its credential-looking query and fragment values, each as written and
/// percent-decoded.
pub fn credentials_in_url(url: &str) -> Vec<String> {
    let Parts { user_info, after, .. } = parts(url);
    let mut found: Vec<String> =
        user_info.map(|u| u.split_once(':').map_or(u, |(_, password)| password).to_string()).into_iter().collect();
    for part in after.split(['?', '#']).skip(1) {
        for pair in part.split('&') {
            if let Some((name, value)) = pair.split_once('=')
                && is_secret_name(&percent_decoded(name))
            {
                found.push(value.to_string());
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|v| percent_decoded(v)).collect();
    found.extend(decoded);
    found.retain(|v| !v.is_empty());
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_info_is_hidden_with_or_without_a_password() {
        assert_eq!(url("postgres://app:s3cret@db:5432/outbox"), "postgres://app:***@db:5432/outbox");
        assert_eq!(url("nats://TOKEN@127.0.0.1:4999"), "nats://***@127.0.0.1:4999");
        assert_eq!(url("mysql://root@127.0.0.1/test"), "mysql://***@127.0.0.1/test");
        assert_eq!(url("postgres://u:p@ss@db/x"), "postgres://u:***@db/x");
        assert_eq!(url("postgres://u:pa?ss#w/rd@db/x?sslmode=require"), "postgres://u:***@db/x?sslmode=require");
        assert_eq!(url("redis://:pw@127.0.0.1:6379/0"), "redis://***@127.0.0.1:6379/0");
        assert_eq!(url("sqlite://outbox.db"), "sqlite://outbox.db");
        assert_eq!(url("sqlite:///data/a@b/outbox.db"), "sqlite:///data/a@b/outbox.db");
        assert_eq!(url("user:pass@tcp(db)/x"), "***@tcp(db)/x");
    }

    #[test]
    fn credential_parameters_are_hidden_in_the_query_and_the_fragment() {
        assert_eq!(
            url("postgres://db/outbox?user=app&password=s3cret&sslmode=require"),
            "postgres://db/outbox?user=app&password=***&sslmode=require"
        );
        assert_eq!(
            url("https://a/b?access_token=t&API_KEY=k&q=1#auth=z"),
            "https://a/b?access_token=***&API_KEY=***&q=1#auth=***"
        );
        assert_eq!(url("https://a/b?pass%77ord=x"), "https://a/b?pass%77ord=***");
        // A '@' in the query: everything before it is hidden, more than needed.
        assert_eq!(url("mysql://db/x?ssl-key=/k.pem&PWD=a@b"), "mysql://***@b");
    }

    #[test]
    fn scrub_hides_each_value_raw_and_percent_encoded_longest_first() {
        let secrets = Secrets::new(["pa?ss/w@rd".to_string(), "pa?ss".to_string(), "ab".to_string()]);
        assert_eq!(secrets.scrub("x pa?ss/w@rd y"), "x *** y");
        assert_eq!(secrets.scrub("x pa%3Fss%2Fw%40rd y"), "x *** y");
        assert_eq!(secrets.scrub("x pa%3fss%2fw%40rd y"), "x *** y");
        assert_eq!(secrets.scrub("ab stays: too short to scrub"), "ab stays: too short to scrub");
    }

    #[test]
    fn names_that_carry_credentials() {
        for name in
            ["password", "PWD", "key", "api_key", "access_token", "usersig", "Authorization", "secret_key", "sslkey"]
        {
            assert!(is_secret_name(name), "{name}");
        }
        for name in ["sslmode", "user", "monkey", "Idempotency-Key", "webhook-id", "content-type"] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    /// Over generated URLs with secrets holding every character a URL treats specially, raw
    /// or percent-encoded, in the user info and the query: no secret survives [`url`], in
    /// any form, and [`credentials_in_url`] finds each, so that [`scrub`] hides it in any
    /// text too.
    #[test]
    fn no_generated_secret_survives_in_any_form() {
        let alphabet: Vec<char> = "abcXYZ019-_.~!$&'()*+,;=:@/?#%[] ".chars().collect();
        let mut next = crate::text::xorshift(0x9E37_79B9_7F4A_7C15);
        for round in 0..20_000 {
            let len = 6 + (next() % 14) as usize;
            // Starts with a letter run that no other part of the URL holds.
            let mut secret = String::from("Qz");
            for _ in 0..len {
                secret.push(alphabet[(next() % alphabet.len() as u64) as usize]);
            }
            let encode = next().is_multiple_of(2);
            let form = next() % 4;
            if form == 1 && !encode {
                // A token alone as the user info: a raw ':' in it would make it `user:password`
                // to every client too.
                secret = secret.replace(':', "x");
            }
            let written = if encode { percent_encoded(&secret) } else { secret.clone() };
            let scheme = ["postgres", "mysql", "nats", "redis", "amqp", "mqtt"][(next() % 6) as usize];
            let text = match form {
                0 => format!("{scheme}://app:{written}@db.internal:5432/outbox?sslmode=require"),
                1 => format!("{scheme}://{written}@127.0.0.1:4999"),
                2 => format!("{scheme}://db/outbox?sslmode=require&password={}", percent_encoded(&secret)),
                _ => format!("{scheme}://db/x?token={}#f", percent_encoded(&secret)),
            };
            let shown = url(&text);
            let forms = [secret.clone(), percent_encoded(&secret), percent_encoded(&secret).to_ascii_lowercase()];
            // What survives of the secret: its first run that holds no character a URL
            // splits on.
            for f in &forms {
                assert!(!shown.contains(f.as_str()), "round {round}: {text:?} shown as {shown:?}");
            }
            assert!(!shown.contains(&secret[..4.min(secret.len())]), "round {round}: {text:?} shown as {shown:?}");
            let found = Secrets::new(credentials_in_url(&text));
            let error = format!("error connecting to {text}: refused (tried {text})");
            let scrubbed = found.scrub(&error);
            for f in &forms {
                assert!(!scrubbed.contains(f.as_str()), "round {round}: {text:?} scrubbed as {scrubbed:?}");
            }
        }
    }
}
