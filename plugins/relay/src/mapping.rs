//! The mapping, apart from the WIT bindings so that it runs natively in tests: the relay's
//! settings from its `config:` map, and the records of one event.

use outbox_proto::Message as _;
use serde_json::json;

pub use crate::bindings::outbox::relay::types::{Event, RelayRecord as Record};

/// What a template may name.
const FIELDS: &[&str] = &["app_code", "event_type", "room_id", "event_id"];

/// How the payload is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The envelope's fields and the decoded body as one JSON object.
    Json,
    /// The `EventEnvelope` protobuf, as room-service stores it.
    Protobuf,
}

/// A template: literal text and `{field}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(&'static str),
}

impl Template {
    /// Parses `text`; an unknown or unclosed placeholder is an error naming it.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| format!("{text:?}: a `{{` without its `}}`"))?;
            let name = &after[..close];
            let field = FIELDS
                .iter()
                .find(|f| **f == name)
                .ok_or_else(|| format!("{text:?}: unknown placeholder {{{name}}} (known: {})", FIELDS.join(", ")))?;
            parts.push(Part::Field(field));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Template(parts))
    }

    /// The text for `event`. A field's value keeps letters, digits, `-` and `_`; anything
    /// else becomes `_`, so that a room id cannot add a subject token (`.`), a wildcard
    /// (`*`, `>`, `#`, `+`) or a path (`/`) to the destination.
    pub fn render(&self, event: &Event) -> String {
        let mut out = String::with_capacity(64);
        for part in &self.0 {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field(name) => {
                    let value = match *name {
                        "app_code" => &event.app_code,
                        "event_type" => &event.event_type,
                        "room_id" => &event.room_id,
                        _ => &event.event_id,
                    };
                    out.extend(
                        value.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }),
                    );
                }
            }
        }
        out
    }
}

/// The relay's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where each record goes.
    pub destination: Template,
    /// The record's key; `None`: records carry no key.
    pub key: Option<Template>,
    /// How the payload is written.
    pub format: Format,
    /// Only these event types (`None`: every type).
    pub types: Option<Vec<String>>,
}

impl Settings {
    /// Reads `destination` (required), `key` (default `{room_id}`; empty: none), `format`
    /// (`json` or `protobuf`, default `json`) and `types` (comma-separated; default every
    /// type). Returns every problem at once.
    pub fn read(get: impl Fn(&str) -> Option<String>) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        let destination = match get("destination").filter(|d| !d.trim().is_empty()) {
            Some(text) => Template::parse(&text).map_err(|e| problems.push(format!("destination: {e}"))).ok(),
            None => {
                problems.push("destination: required, e.g. rooms.{app_code}.{event_type}".to_string());
                None
            }
        };
        let key = match get("key") {
            Some(text) if text.is_empty() => None,
            Some(text) => Template::parse(&text).map_err(|e| problems.push(format!("key: {e}"))).ok(),
            None => Template::parse("{room_id}").ok(),
        };
        let format = match get("format").as_deref() {
            None | Some("json") => Format::Json,
            Some("protobuf") => Format::Protobuf,
            Some(other) => {
                problems.push(format!("format: {other:?} is not json or protobuf"));
                Format::Json
            }
        };
        let types = get("types").map(|list| {
            list.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_string).collect::<Vec<_>>()
        });
        match (destination, problems.is_empty()) {
            (Some(destination), true) => Ok(Settings { destination, key, format, types }),
            _ => Err(problems),
        }
    }

    /// The records of `event`: one, or none when its type is not among `types`. A body
    /// that does not decode as its type is `Err` (a permanent failure: retrying cannot help).
    /// The event is taken whole so that its fields move into the record, uncopied.
    pub fn records(&self, event: Event) -> Result<Vec<Record>, String> {
        if self.types.as_ref().is_some_and(|types| !types.contains(&event.event_type)) {
            return Ok(Vec::new());
        }
        let destination = self.destination.render(&event);
        let key = self.key.as_ref().map(|k| k.render(&event));
        let (content_type, json) = match self.format {
            Format::Json => ("application/json", Some(json_payload(&event)?)),
            Format::Protobuf => ("application/x-protobuf", None),
        };
        let headers = vec![
            ("outbox-event-id".to_string(), event.event_id.clone()),
            ("outbox-event-type".to_string(), event.event_type.clone()),
            ("outbox-app-code".to_string(), event.app_code.clone()),
            ("outbox-room-id".to_string(), event.room_id.clone()),
            ("outbox-room-version".to_string(), event.room_version.to_string()),
            ("outbox-occurred-at-ms".to_string(), event.occurred_at_ms.to_string()),
            ("content-type".to_string(), content_type.to_string()),
        ];
        let payload = json.unwrap_or_else(|| protobuf_payload(event));
        Ok(vec![Record { destination, key, headers, payload }])
    }
}

/// The envelope's fields and the body decoded as JSON (`null`, with the bytes in
/// `body_base64`, for an event type the schema does not know).
fn json_payload(event: &Event) -> Result<Vec<u8>, String> {
    let body = match outbox_proto::body_to_json(&event.event_type, &event.body) {
        Some(Ok(body)) => body,
        Some(Err(e)) => return Err(format!("the {} body does not decode: {e}", event.event_type)),
        None => serde_json::Value::Null,
    };
    let mut object = json!({
        "app_code": event.app_code,
        "event_id": event.event_id,
        "event_type": event.event_type,
        "room_id": event.room_id,
        "room_version": event.room_version,
        "occurred_at_ms": event.occurred_at_ms,
        "body": body,
    });
    if object["body"].is_null() {
        object["body_hex"] = json!(event.body.iter().map(|b| format!("{b:02x}")).collect::<String>());
    }
    Ok(object.to_string().into_bytes())
}

/// The `EventEnvelope` protobuf.
fn protobuf_payload(event: Event) -> Vec<u8> {
    outbox_proto::EventEnvelope {
        app_code: event.app_code,
        event_id: event.event_id,
        room_id: event.room_id,
        event_type: event.event_type,
        room_version: event.room_version,
        occurred_at_ms: event.occurred_at_ms,
        body: event.body,
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, Vec<String>> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::read(|k| map.get(k).cloned())
    }

    fn gift(room: &str) -> Event {
        let body =
            outbox_proto::body_from_json("RoomGiftSent", &json!({"room_id": room, "gift_id": "rose", "gift_count": 2}))
                .unwrap()
                .unwrap();
        Event {
            app_code: "app-1".into(),
            event_id: "evt-1".into(),
            event_type: "RoomGiftSent".into(),
            room_id: room.into(),
            room_version: 7,
            occurred_at_ms: 1_764_400_000_000,
            body,
            attempt: 1,
        }
    }

    #[test]
    fn destination_and_key_come_from_templates() {
        let s = settings(&[("destination", "rooms.{app_code}.{event_type}")]).unwrap();
        let records = s.records(gift("room-1")).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].destination, "rooms.app-1.RoomGiftSent");
        assert_eq!(records[0].key.as_deref(), Some("room-1"), "the key is the room by default");
        let keyless = settings(&[("destination", "room.{room_id}"), ("key", "")]).unwrap();
        let records = keyless.records(gift("room-1")).unwrap();
        assert_eq!((records[0].destination.as_str(), records[0].key.as_deref()), ("room.room-1", None));
    }

    #[test]
    fn a_room_id_cannot_add_tokens_or_wildcards_to_the_destination() {
        let s = settings(&[("destination", "room.{room_id}")]).unwrap();
        let records = s.records(gift("a.b*>#+/ c")).unwrap();
        assert_eq!(records[0].destination, "room.a_b______c");
        assert_eq!(records[0].key.as_deref(), Some("a_b______c"));
    }

    #[test]
    fn headers_name_the_event() {
        let s = settings(&[("destination", "x")]).unwrap();
        let headers = s.records(gift("room-1")).unwrap().remove(0).headers;
        let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("outbox-event-id"), Some("evt-1"));
        assert_eq!(get("outbox-event-type"), Some("RoomGiftSent"));
        assert_eq!(get("outbox-room-id"), Some("room-1"));
        assert_eq!(get("outbox-room-version"), Some("7"));
        assert_eq!(get("outbox-occurred-at-ms"), Some("1764400000000"));
        assert_eq!(get("content-type"), Some("application/json"));
    }

    #[test]
    fn the_json_payload_holds_the_envelope_and_the_decoded_body() {
        let s = settings(&[("destination", "x")]).unwrap();
        let payload = s.records(gift("room-1")).unwrap().remove(0).payload;
        let value: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(value["event_id"], "evt-1");
        assert_eq!(value["room_version"], 7);
        assert_eq!(value["body"]["gift_id"], "rose");
        assert_eq!(value["body"]["gift_count"], 2);
    }

    #[test]
    fn the_protobuf_payload_is_the_envelope() {
        let s = settings(&[("destination", "x"), ("format", "protobuf")]).unwrap();
        let event = gift("room-1");
        let record = s.records(event.clone()).unwrap().remove(0);
        let envelope = outbox_proto::EventEnvelope::decode(record.payload.as_slice()).unwrap();
        assert_eq!((envelope.event_id.as_str(), envelope.room_version), ("evt-1", 7));
        assert_eq!(envelope.body, event.body);
        assert!(record.headers.contains(&("content-type".to_string(), "application/x-protobuf".to_string())));
    }

    #[test]
    fn types_choose_the_events_and_the_rest_are_not_for_this_relay() {
        let s = settings(&[("destination", "x"), ("types", "RoomUserJoined, RoomUserLeft")]).unwrap();
        assert!(s.records(gift("room-1")).unwrap().is_empty());
    }

    #[test]
    fn a_body_that_does_not_decode_fails_and_an_unknown_type_is_carried_as_bytes() {
        let s = settings(&[("destination", "x")]).unwrap();
        let bad = Event { body: vec![0xff, 0xff, 0xff], ..gift("room-1") };
        assert!(s.records(bad).unwrap_err().contains("does not decode"));
        let unknown = Event { event_type: "RoomPainted".into(), body: vec![1, 2], ..gift("room-1") };
        let value: serde_json::Value = serde_json::from_slice(&s.records(unknown).unwrap().remove(0).payload).unwrap();
        assert_eq!((value["body"].is_null(), value["body_hex"].as_str()), (true, Some("0102")));
    }

    #[test]
    fn every_config_problem_is_named_at_once() {
        let problems = settings(&[("key", "{user_id}"), ("format", "avro")]).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("destination: required"));
        assert!(problems[1].contains("unknown placeholder {user_id}"));
        assert!(problems[2].contains("\"avro\" is not json or protobuf"));
        let unclosed = settings(&[("destination", "rooms.{room_id")]).unwrap_err();
        assert!(unclosed[0].contains("without its"), "{unclosed:?}");
    }
}
