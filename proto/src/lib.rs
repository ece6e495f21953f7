//! The room event schema: [`EventEnvelope`] as stored in `room_outbox.envelope`, and the
//! concrete event bodies it carries. Generated from `proto/room_events.proto` by prost.

#![allow(missing_docs)] // generated code; the .proto file documents the messages

mod generated {
    include!(concat!(env!("OUT_DIR"), "/room.events.v1.rs"));
}

pub use generated::*;
pub use prost::{DecodeError, Message};

/// The event types this schema defines, each with its body message.
pub const EVENT_TYPES: &[&str] = &[
    "RoomCreated",
    "RoomUserJoined",
    "RoomUserLeft",
    "RoomGiftSent",
    "RoomMicChanged",
    "RoomHeatChanged",
    "RoomRankChanged",
];

/// An event body decoded into its typed message, one variant per event type.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum EventBody {
    RoomCreated(RoomCreated),
    RoomUserJoined(RoomUserJoined),
    RoomUserLeft(RoomUserLeft),
    RoomGiftSent(RoomGiftSent),
    RoomMicChanged(RoomMicChanged),
    RoomHeatChanged(RoomHeatChanged),
    RoomRankChanged(RoomRankChanged),
}

impl EventBody {
    /// Decodes a body of the named event type.
    ///
    /// Returns `None` for an event type this schema does not know.
    pub fn decode(event_type: &str, body: &[u8]) -> Option<Result<EventBody, prost::DecodeError>> {
        macro_rules! decode {
            ($($name:ident),*) => {
                match event_type {
                    $(stringify!($name) => Some($name::decode(body).map(EventBody::$name)),)*
                    _ => None,
                }
            };
        }
        decode!(
            RoomCreated,
            RoomUserJoined,
            RoomUserLeft,
            RoomGiftSent,
            RoomMicChanged,
            RoomHeatChanged,
            RoomRankChanged
        )
    }

    /// The body as JSON (field names as in the .proto file).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a prost message always serializes")
    }
}

/// Decodes a body of the named event type into JSON (field names as in the .proto file).
///
/// Returns `None` for an event type this schema does not know.
pub fn body_to_json(event_type: &str, body: &[u8]) -> Option<Result<serde_json::Value, prost::DecodeError>> {
    EventBody::decode(event_type, body).map(|decoded| decoded.map(|b| b.to_json()))
}

/// Encodes a JSON body as the protobuf message of the named event type.
///
/// Returns `None` for an unknown event type; `Some(Err)` when the JSON does not fit the
/// message (an unknown field or a wrong type).
pub fn body_from_json(event_type: &str, json: &serde_json::Value) -> Option<Result<Vec<u8>, serde_json::Error>> {
    macro_rules! encode {
        ($($name:ident),*) => {
            match event_type {
                $(stringify!($name) => Some($name::deserialize(json).map(|m| m.encode_to_vec())),)*
                _ => None,
            }
        };
    }
    use serde::Deserialize;
    encode!(RoomCreated, RoomUserJoined, RoomUserLeft, RoomGiftSent, RoomMicChanged, RoomHeatChanged, RoomRankChanged)
}
