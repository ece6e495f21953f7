//! The event a sink delivers.

use outbox_proto::EventBody;
use serde_json::{Value, json};

/// One room event, as the outbox row's envelope carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Tenant / app.
    pub app_code: String,
    /// The event's unique id: a destination's idempotency key.
    pub event_id: String,
    /// e.g. `RoomGiftSent`.
    pub event_type: String,
    /// The room.
    pub room_id: String,
    /// The room's version after this event: an ordering key for clients.
    pub room_version: i64,
    /// When it happened, UTC milliseconds.
    pub occurred_at_ms: i64,
    /// Protobuf bytes of the body message named by `event_type`.
    pub body_bytes: Vec<u8>,
    /// 1 on the first attempt, 2 on the first retry, and so on.
    pub attempt: u32,
}

impl Event {
    /// An event of `event_type` for `room_id` whose body is `body` (fields of the type's
    /// message): for tests. Panics when `body` does not fit the type.
    pub fn new(event_type: &str, room_id: &str, body: Value) -> Event {
        let body_bytes = match outbox_proto::body_from_json(event_type, &body) {
            Some(Ok(bytes)) => bytes,
            Some(Err(e)) => panic!("the body does not fit {event_type}: {e}"),
            None => panic!("unknown event type {event_type:?} (known: {})", outbox_proto::EVENT_TYPES.join(", ")),
        };
        Event {
            app_code: "default".into(),
            event_id: format!("evt-{room_id}-1"),
            event_type: event_type.into(),
            room_id: room_id.into(),
            room_version: 1,
            occurred_at_ms: 1_767_225_600_000,
            body_bytes,
            attempt: 1,
        }
    }

    /// The body decoded into its typed message: `None` for an event type the schema does
    /// not know, `Some(Err)` for bytes that do not decode.
    pub fn body(&self) -> Option<Result<EventBody, outbox_proto::DecodeError>> {
        EventBody::decode(&self.event_type, &self.body_bytes)
    }

    /// The body as JSON (field names as in the `.proto` file), if it decodes.
    pub fn body_json(&self) -> Option<Value> {
        self.body().and_then(Result::ok).map(|b| b.to_json())
    }

    /// The event's fields and its decoded `body` as one JSON object; a body of a type the
    /// schema does not know (or that does not decode) is carried as `body_base64`.
    pub fn to_json(&self) -> Value {
        let mut json = json!({
            "app_code": self.app_code,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "room_id": self.room_id,
            "room_version": self.room_version,
            "occurred_at_ms": self.occurred_at_ms,
        });
        match self.body_json() {
            Some(body) => json["body"] = body,
            None => json["body_base64"] = Value::String(base64(&self.body_bytes)),
        }
        json
    }
}

impl From<crate::bindings::Event> for Event {
    fn from(e: crate::bindings::Event) -> Self {
        Event {
            app_code: e.app_code,
            event_id: e.event_id,
            event_type: e.event_type,
            room_id: e.room_id,
            room_version: e.room_version,
            occurred_at_ms: e.occurred_at_ms,
            body_bytes: e.body,
            attempt: e.attempt,
        }
    }
}

/// Standard base64 with padding.
pub(crate) fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_decodes_typed_and_as_json() {
        let event = Event::new("RoomGiftSent", "room-1", json!({"gift_id": "rose", "gift_count": 3}));
        match event.body() {
            Some(Ok(EventBody::RoomGiftSent(gift))) => {
                assert_eq!((gift.gift_id.as_str(), gift.gift_count), ("rose", 3))
            }
            other => panic!("{other:?}"),
        }
        let json = event.to_json();
        assert_eq!(json["body"]["gift_id"], "rose");
        assert_eq!(json["room_id"], "room-1");
        assert_eq!(json["event_type"], "RoomGiftSent");
    }

    #[test]
    fn an_unknown_type_is_carried_as_base64() {
        let event = Event {
            event_type: "RoomSomethingNew".into(),
            body_bytes: b"hi!?".to_vec(),
            ..Event::new("RoomHeatChanged", "r", json!({}))
        };
        assert!(event.body().is_none());
        assert_eq!(event.to_json()["body_base64"], "aGkhPw==");
    }
}
