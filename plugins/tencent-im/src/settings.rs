//! The sink's `config:` keys, read and checked all at once.

use outbox_sink::Config;

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
    /// Reads every key; what is missing or malformed is recorded in `config`, naming its key.
    pub fn read(config: &mut Config) -> Settings {
        let sdk_app_id: u64 = config.required("sdk_app_id", "the SDKAppID of the IM application, a positive number");
        config.check("sdk_app_id", sdk_app_id > 0 || config.get("sdk_app_id").is_none(), "must be positive");
        let identifier = config.required("identifier", "an App admin account, e.g. administrator");
        let secret_key = config.required("secret_key", "the application's key; put it in an environment variable");
        let endpoint =
            config.get("endpoint").unwrap_or_else(|| DEFAULT_ENDPOINT.into()).trim_end_matches('/').to_string();
        let base = (endpoint.starts_with("https://") || endpoint.starts_with("http://")) && !endpoint.contains('?');
        config.check("endpoint", base, format!("{endpoint:?} must be a base URL such as {DEFAULT_ENDPOINT}"));
        if base {
            config.endpoint("endpoint", &endpoint);
        }
        let usersig_expire_seconds = config.with_default(
            "usersig_expire_seconds",
            DEFAULT_USERSIG_EXPIRE_SECONDS,
            "a number of seconds of at least 60",
        );
        config.check("usersig_expire_seconds", usersig_expire_seconds >= 60, "must be at least 60 seconds");
        let msg_priority = config.get("msg_priority");
        if let Some(p) = &msg_priority {
            config.check(
                "msg_priority",
                PRIORITIES.contains(&p.as_str()),
                format!("{p:?} is not one of {}", PRIORITIES.join(", ")),
            );
        }
        Settings {
            sdk_app_id,
            identifier,
            secret_key,
            endpoint,
            group_id_prefix: config.get("group_id_prefix").unwrap_or_default(),
            usersig_expire_seconds,
            msg_priority,
            online_only: config.flag("online_only", false),
            from_account: config.get("from_account"),
            skip_event_types: config
                .list("skip_event_types")
                .unwrap_or_else(|| DEFAULT_SKIP_EVENT_TYPES.iter().map(|s| s.to_string()).collect()),
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

    fn read(pairs: &[(&str, &str)]) -> Result<Settings, Vec<String>> {
        let mut config = Config::from_pairs(pairs);
        let settings = Settings::read(&mut config);
        let problems: Vec<String> = config.problems().iter().map(ToString::to_string).collect();
        if problems.is_empty() { Ok(settings) } else { Err(problems) }
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
    fn the_endpoint_is_declared_for_the_hosts_egress_check() {
        let mut config = Config::from_pairs(MINIMAL);
        Settings::read(&mut config);
        assert_eq!(config.endpoints(), [("endpoint".to_string(), DEFAULT_ENDPOINT.to_string())]);
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
            ("online_only", "sometimes"),
            ("usersig_expire_seconds", "5"),
        ]);
        let problems = read(&pairs).unwrap_err();
        for key in ["sdk_app_id:", "endpoint:", "msg_priority:", "online_only:", "usersig_expire_seconds:"] {
            assert!(problems.iter().any(|p| p.starts_with(key)), "{key} missing from {problems:?}");
        }
        assert_eq!(read(&[("sdk_app_id", "0"), ("identifier", "a"), ("secret_key", "k")]).unwrap_err().len(), 1);
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
