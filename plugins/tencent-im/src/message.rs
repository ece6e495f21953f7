//! One room event as one `send_group_msg` request: the URL, the `Random` derived from
//! `event_id`, and the JSON body carrying the event in a `TIMCustomElem`.

use outbox_sink::Event;
use outbox_sink::serde_json::{Value, json};

use crate::settings::Settings;

/// The path of Tencent IM's group message API.
pub const SEND_GROUP_MSG: &str = "/v4/group_open_http_svc/send_group_msg";

/// A stable 32-bit value from `event_id` (FNV-1a): Tencent drops a second message with the
/// same `Random` in one group within five minutes, so a retry is not shown twice.
pub fn random_of(event_id: &str) -> u32 {
    event_id.bytes().fold(0x811c_9dc5u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193))
}

/// The request URL, `usersig` included (never log it).
pub fn url(settings: &Settings, usersig: &str, request_random: u32) -> String {
    format!(
        "{}{SEND_GROUP_MSG}?sdkappid={}&identifier={}&usersig={usersig}&random={request_random}&contenttype=json",
        settings.endpoint,
        settings.sdk_app_id,
        encode_query(&settings.identifier),
    )
}

/// The `send_group_msg` body.
/// `MsgContent.Data` is the event's fields and decoded body (`Event::to_json`).
pub fn body(settings: &Settings, event: &Event) -> Value {
    let mut body = json!({
        "GroupId": format!("{}{}", settings.group_id_prefix, event.room_id),
        "Random": random_of(&event.event_id),
        "MsgBody": [{
            "MsgType": "TIMCustomElem",
            "MsgContent": { "Data": event.to_json().to_string(), "Desc": event.event_type },
        }],
    });
    if let Some(priority) = &settings.msg_priority {
        body["MsgPriority"] = json!(priority);
    }
    if settings.online_only {
        body["OnlineOnlyFlag"] = json!(1);
    }
    if let Some(from) = &settings.from_account {
        body["From_Account"] = json!(from);
    }
    body
}

fn encode_query(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_sink::{Config, serde_json};

    fn settings() -> Settings {
        let pairs = [
            ("sdk_app_id", "1400000001"),
            ("identifier", "admin user"),
            ("secret_key", "s3cret"),
            ("group_id_prefix", "live_"),
        ];
        Settings::read(&mut Config::from_pairs(&pairs))
    }

    fn gift() -> Event {
        let body = json!({"room_id": "r1", "sender_user_id": "u1", "gift_id": "rose", "gift_count": 3});
        Event {
            app_code: "app".into(),
            event_id: "evt_1".into(),
            room_version: 7,
            occurred_at_ms: 1_700_000_000_000,
            ..Event::new("RoomGiftSent", "r1", body)
        }
    }

    #[test]
    fn random_is_stable_per_event_and_differs_between_events() {
        assert_eq!(random_of("evt_1"), random_of("evt_1"));
        assert_ne!(random_of("evt_1"), random_of("evt_2"));
        assert_eq!(random_of(""), 0x811c_9dc5);
    }

    #[test]
    fn body_targets_the_rooms_group_with_the_event_as_custom_data() {
        let body = body(&settings(), &gift());
        assert_eq!(body["GroupId"], "live_r1");
        assert_eq!(body["Random"], random_of("evt_1"));
        let elem = &body["MsgBody"][0];
        assert_eq!(elem["MsgType"], "TIMCustomElem");
        assert_eq!(elem["MsgContent"]["Desc"], "RoomGiftSent");
        let data: Value = serde_json::from_str(elem["MsgContent"]["Data"].as_str().unwrap()).unwrap();
        assert_eq!(data["event_id"], "evt_1");
        assert_eq!(data["room_version"], 7);
        assert_eq!(data["occurred_at_ms"], 1_700_000_000_000i64);
        assert_eq!(data["body"]["gift_id"], "rose");
        assert_eq!(data["body"]["gift_count"], 3);
        assert!(body.get("MsgPriority").is_none() && body.get("OnlineOnlyFlag").is_none());
        assert!(!body.to_string().contains("s3cret"));
    }

    #[test]
    fn url_has_the_query_tencent_expects() {
        let url = url(&settings(), "SIG", 42);
        assert_eq!(
            url,
            "https://console.tim.qq.com/v4/group_open_http_svc/send_group_msg?sdkappid=1400000001&identifier=admin%20user&usersig=SIG&random=42&contenttype=json"
        );
    }
}
