//! Typed access to the sink's `config:` map. Every getter records what is missing or
//! malformed as a [`ConfigProblem`] and hands back a stand-in value, so a sink reads all its
//! keys in one go and the operator hears about every bad key at once.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One thing wrong with the sink's config, naming its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigProblem {
    /// A required key is absent or empty.
    Missing {
        /// The key.
        key: String,
        /// What it should hold.
        expected: String,
    },
    /// A key's value cannot be used.
    BadValue {
        /// The key.
        key: String,
        /// The value found (leave secrets out: use [`Config::problem`] for them).
        value: String,
        /// What it should be.
        expected: String,
    },
    /// Anything else, in the sink's words.
    Invalid {
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigProblem::Missing { key, expected } => write!(f, "{key}: is required ({expected})"),
            ConfigProblem::BadValue { key, value, expected } => write!(f, "{key}: {value:?} is not {expected}"),
            ConfigProblem::Invalid { key, message } => write!(f, "{key}: {message}"),
        }
    }
}

/// The value of `key` in the sink's `config:` map as the host holds it, untrimmed: for keys
/// only known at delivery time (`room.<room_id>`). [`Config`] reads the rest.
pub fn get(key: &str) -> Option<String> {
    crate::host::config_get(key)
}

/// The sink's `config:` map, and the problems found reading it.
pub struct Config {
    source: Source,
    problems: Vec<ConfigProblem>,
    endpoints: Vec<(String, String)>,
}

enum Source {
    Host,
    Map(BTreeMap<String, String>),
}

impl Config {
    /// The map the host holds for this sink.
    pub(crate) fn from_host() -> Config {
        Config { source: Source::Host, problems: Vec::new(), endpoints: Vec::new() }
    }

    /// A map of its own: for unit tests of a sink's `configure`.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Config {
        let map = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config { source: Source::Map(map), problems: Vec::new(), endpoints: Vec::new() }
    }

    /// The key's value, trimmed; `None` when absent or empty.
    pub fn get(&self, key: &str) -> Option<String> {
        let value = match &self.source {
            Source::Host => get(key),
            Source::Map(map) => map.get(key).cloned(),
        };
        value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
    }

    /// The key's value parsed as `T`; a problem (and `T::default()`) when it is absent or
    /// does not parse. `expected` says what it should hold, e.g. "the SDKAppID, a number".
    pub fn required<T: FromStr + Default>(&mut self, key: &str, expected: &str) -> T {
        if self.get(key).is_none() {
            self.problems.push(ConfigProblem::Missing { key: key.into(), expected: expected.into() });
            return T::default();
        }
        self.optional(key, expected).unwrap_or_default()
    }

    /// The key's value parsed as `T`, if present; a problem (and `None`) when it does not
    /// parse.
    pub fn optional<T: FromStr>(&mut self, key: &str, expected: &str) -> Option<T> {
        let value = self.get(key)?;
        match value.parse() {
            Ok(parsed) => Some(parsed),
            Err(_) => {
                self.problems.push(ConfigProblem::BadValue { key: key.into(), value, expected: expected.into() });
                None
            }
        }
    }

    /// [`Config::optional`], or `default` when the key is absent or bad.
    pub fn with_default<T: FromStr>(&mut self, key: &str, default: T, expected: &str) -> T {
        self.optional(key, expected).unwrap_or(default)
    }

    /// `true`/`false` (also `1`/`0`, `yes`/`no`), or `default` when absent.
    pub fn flag(&mut self, key: &str, default: bool) -> bool {
        match self.get(key).as_deref() {
            None => default,
            Some("true" | "1" | "yes") => true,
            Some("false" | "0" | "no") => false,
            Some(other) => {
                let value = other.to_string();
                self.problems.push(ConfigProblem::BadValue {
                    key: key.into(),
                    value,
                    expected: "true or false".into(),
                });
                default
            }
        }
    }

    /// A comma-separated list (items trimmed, empty ones dropped), if present.
    pub fn list(&self, key: &str) -> Option<Vec<String>> {
        let value = self.get(key)?;
        Some(value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
    }

    /// Records a problem with `key` in the sink's own words.
    pub fn problem(&mut self, key: &str, message: impl Into<String>) {
        self.problems.push(ConfigProblem::Invalid { key: key.into(), message: message.into() });
    }

    /// Records `message` for `key` unless `ok`.
    pub fn check(&mut self, key: &str, ok: bool, message: impl Into<String>) {
        if !ok {
            self.problem(key, message);
        }
    }

    /// Says that the sink will send to `url`, read from `key`: the host checks it against
    /// the sink's egress policy (`allowed_hosts`, `allow_http`) with the config, and refuses
    /// to start, naming `key` and the host key to change, when it could never be reached.
    /// Call it for every URL the config names (a base URL is enough).
    pub fn endpoint(&mut self, key: &str, url: &str) {
        if let Source::Host = self.source {
            crate::host::declare(key, url);
        }
        self.endpoints.push((key.into(), url.into()));
    }

    /// The endpoints declared so far: (key, url).
    pub fn endpoints(&self) -> &[(String, String)] {
        &self.endpoints
    }

    /// What was found wrong so far.
    pub fn problems(&self) -> &[ConfigProblem] {
        &self.problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_bad_values_are_named_and_all_reported() {
        let mut config = Config::from_pairs(&[("port", "eighty"), ("empty", "  "), ("verbose", "maybe")]);
        let host: String = config.required("host", "a host name");
        let port: u16 = config.required("port", "a port number");
        let empty: String = config.required("empty", "anything");
        let verbose = config.flag("verbose", true);
        assert_eq!((host.as_str(), port, empty.as_str(), verbose), ("", 0, "", true));
        let shown: Vec<String> = config.problems().iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "host: is required (a host name)",
                "port: \"eighty\" is not a port number",
                "empty: is required (anything)",
                "verbose: \"maybe\" is not true or false",
            ]
        );
    }

    #[test]
    fn present_values_parse_and_defaults_apply() {
        let mut config = Config::from_pairs(&[("port", " 8080 "), ("tags", "a, b,,c"), ("on", "yes")]);
        assert_eq!(config.required::<u16>("port", "a port"), 8080);
        assert_eq!(config.with_default("timeout_ms", 500u64, "milliseconds"), 500);
        assert_eq!(config.optional::<u64>("absent", "a number"), None);
        assert_eq!(config.list("tags").unwrap(), ["a", "b", "c"]);
        assert!(config.flag("on", false));
        config.check("port", true, "fine");
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        config.check("port", false, "must not be 8080");
        assert_eq!(config.problems()[0].to_string(), "port: must not be 8080");
    }
}
