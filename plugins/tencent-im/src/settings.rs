//! The sink's `config:` keys, read and checked all at once.

/// Default `endpoint`: Tencent Cloud IM's main REST domain.
pub const DEFAULT_ENDPOINT: &str = "https://console.tim.qq.com";
/// Default `usersig_expire_seconds`. A UserSig is made afresh for every request, so it
/// only needs to outlive one call; a short life limits what a leaked one is worth.
pub const DEFAULT_USERSIG_EXPIRE_SECONDS: u64 = 3_600;
/// Event types not sent to IM by default: the seed's non-IM events.
pub const DEFAULT_SKIP_EVENT_TYPES: &[&str] = &["RoomCreated", "RoomHeatChanged", "RoomRankChanged"];
/// The values Tencent accepts for `MsgPriority`.
pub const PRIORITIES: &[&str] = &["High", "Normal", "Low", "Lossy"];

/// Validated settings.
#[derive(Clone, PartialEq, Eq)]
pub struct Settings {
    /// The IM application's SDKAppID.
    pub sdk_app_id: u64,
    /// The App admin account the requests are signed for (e.g. `administrator`).
    pub identifier: String,
    /// The application's secret key; used only to sign, never logged.
    pub secret_key: String,
    /// Base URL, without a trailing slash.
    pub endpoint: String,
    /// Prepended to `room_id` to make the group id.
    pub group_id_prefix: String,
    /// UserSig lifetime.
    pub usersig_expire_seconds: u64,
    /// `MsgPriority`, if set.
    pub msg_priority: Option<String>,
    /// `OnlineOnlyFlag: 1` when true.
    pub online_only: bool,
    /// `From_Account`, if set.
    pub from_account: Option<String>,
    /// Event types answered with `skipped`.
    pub skip_event_types: Vec<String>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("sdk_app_id", &self.sdk_app_id)
            .field("identifier", &self.identifier)
            .field("secret_key", &"***")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// Reads every key through `get`; on failure, one line per problem, each naming its key.
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        let mut required = |key: &str, what: &str| match get(key).map(|v| v.trim().to_string()) {
            Some(v) if !v.is_empty() => v,
            _ => {
                problems.push(format!("{key}: is required ({what})"));
                String::new()
            }
        };
        let sdk_app_id_text = required("sdk_app_id", "the SDKAppID of the IM application");
        let identifier = required("identifier", "an App admin account, e.g. administrator");
        let secret_key = required("secret_key", "the application's key; put it in an environment variable");
        let sdk_app_id = match sdk_app_id_text.parse::<u64>() {
            Ok(id) if id > 0 => id,
            _ if sdk_app_id_text.is_empty() => 0,
            _ => {
                problems.push(format!("sdk_app_id: {sdk_app_id_text:?} is not a positive number"));
                0
            }
        };
        let endpoint =
            get("endpoint").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()).trim_end_matches('/').to_string();
        if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) || endpoint.contains('?') {
            problems.push(format!("endpoint: {endpoint:?} must be a base URL such as {DEFAULT_ENDPOINT}"));
        }
        let usersig_expire_seconds = match get("usersig_expire_seconds") {
            None => DEFAULT_USERSIG_EXPIRE_SECONDS,
            Some(text) => match text.trim().parse::<u64>() {
                Ok(n) if n >= 60 => n,
                _ => {
                    problems
                        .push(format!("usersig_expire_seconds: {text:?} is not a number of seconds of at least 60"));
                    DEFAULT_USERSIG_EXPIRE_SECONDS
                }
            },
        };
        let msg_priority = get("msg_priority").filter(|p| !p.is_empty());
        if let Some(p) = &msg_priority
            && !PRIORITIES.contains(&p.as_str())
        {
            problems.push(format!("msg_priority: {p:?} is not one of {}", PRIORITIES.join(", ")));
        }
        let online_only = match get("online_only").as_deref().map(str::trim) {
            None | Some("") | Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(other) => {
                problems.push(format!("online_only: {other:?} is not true or false"));
                false
            }
        };
        let skip_event_types = match get("skip_event_types") {
            None => DEFAULT_SKIP_EVENT_TYPES.iter().map(|s| s.to_string()).collect(),
            Some(list) => list.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        };
        if problems.is_empty() {
            Ok(Settings {
                sdk_app_id,
                identifier,
                secret_key,
                endpoint,
                group_id_prefix: get("group_id_prefix").unwrap_or_default(),
                usersig_expire_seconds,
                msg_priority,
                online_only,
                from_account: get("from_account").filter(|a| !a.is_empty()),
                skip_event_types,
            })
        } else {
            Err(problems)
        }
    }

    /// Whether events of this type are answered `skipped` without a call.
    pub fn skips(&self, event_type: &str) -> bool {
        self.skip_event_types.iter().any(|t| t == event_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(pairs: &[(&str, &str)]) -> Result<Settings, Vec<String>> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::read(|k| map.get(k).cloned())
    }

    const MINIMAL: &[(&str, &str)] =
        &[("sdk_app_id", "1400000000"), ("identifier", "administrator"), ("secret_key", "k")];

    #[test]
    fn defaults() {
        let s = read(MINIMAL).unwrap();
        assert_eq!(s.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(s.usersig_expire_seconds, 3_600);
        assert!(s.skips("RoomCreated") && s.skips("RoomHeatChanged") && s.skips("RoomRankChanged"));
        assert!(!s.skips("RoomGiftSent"));
        assert_eq!((s.online_only, &s.msg_priority, &s.from_account), (false, &None, &None));
        assert!(!format!("{s:?}").contains("\"k\""), "the key leaked into Debug");
    }

    #[test]
    fn missing_keys_are_all_named() {
        let problems = read(&[]).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("sdk_app_id: is required"));
        assert!(problems[1].starts_with("identifier: is required"));
        assert!(problems[2].starts_with("secret_key: is required"));
    }

    #[test]
    fn malformed_keys_are_named() {
        let mut pairs = vec![("sdk_app_id", "abc"), ("identifier", "a"), ("secret_key", "k")];
        pairs.extend([
            ("endpoint", "console.tim.qq.com"),
            ("msg_priority", "Urgent"),
            ("online_only", "yes"),
            ("usersig_expire_seconds", "5"),
        ]);
        let problems = read(&pairs).unwrap_err();
        for key in ["sdk_app_id:", "endpoint:", "msg_priority:", "online_only:", "usersig_expire_seconds:"] {
            assert!(problems.iter().any(|p| p.starts_with(key)), "{key} missing from {problems:?}");
        }
    }

    #[test]
    fn skip_list_and_options_are_configurable() {
        let mut pairs = MINIMAL.to_vec();
        pairs.extend([
            ("skip_event_types", "RoomCreated, RoomUserLeft"),
            ("endpoint", "http://127.0.0.1:9/"),
            ("online_only", "true"),
        ]);
        let s = read(&pairs).unwrap();
        assert_eq!(s.skip_event_types, vec!["RoomCreated", "RoomUserLeft"]);
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        assert!(s.online_only);
    }
}
