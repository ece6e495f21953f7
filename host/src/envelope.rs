//! The protobuf `EventEnvelope` stored in each row, and the sink's view of it.

use outbox_proto::{EventEnvelope, Message as _};

use crate::sandbox::Event;
use crate::store::{Claimed, NewEvent};

/// Decodes a claimed row's envelope into the event handed to the sink. A row whose
/// envelope does not decode, or names another event, cannot ever be delivered: the caller
/// marks it `failed` with this reason.
pub fn to_event(row: &Claimed) -> Result<Event, String> {
    let envelope = EventEnvelope::decode(row.envelope.as_slice())
        .map_err(|e| format!("bad envelope: not a protobuf EventEnvelope ({e})"))?;
    if !envelope.event_id.is_empty() && envelope.event_id != row.event_id {
        return Err(format!(
            "bad envelope: its event_id {:?} differs from the row's {:?}",
            envelope.event_id, row.event_id
        ));
    }
    if !envelope.event_type.is_empty() && envelope.event_type != row.event_type {
        return Err(format!(
            "bad envelope: its event_type {:?} differs from the row's {:?}",
            envelope.event_type, row.event_type
        ));
    }
    Ok(Event {
        app_code: row.app_code.clone(),
        event_id: row.event_id.clone(),
        event_type: row.event_type.clone(),
        room_id: row.room_id.clone(),
        room_version: envelope.room_version,
        occurred_at_ms: envelope.occurred_at_ms,
        body: envelope.body,
        attempt: u32::try_from(row.retry_count).unwrap_or(0).saturating_add(1),
    })
}

/// The event a sink is handed for `row` as a producer writes it, at its first attempt: what
/// a benchmark or a test hands a sink or a relay without a table in between.
pub fn first_attempt(row: &NewEvent) -> Result<Event, String> {
    let envelope = EventEnvelope::decode(row.envelope.as_slice())
        .map_err(|e| format!("bad envelope: not a protobuf EventEnvelope ({e})"))?;
    Ok(Event {
        app_code: envelope.app_code,
        event_id: envelope.event_id,
        event_type: envelope.event_type,
        room_id: envelope.room_id,
        room_version: envelope.room_version,
        occurred_at_ms: envelope.occurred_at_ms,
        body: envelope.body,
        attempt: 1,
    })
}

/// Encodes an envelope the way room-service's `outbox.Build` does.
pub fn encode(
    app_code: &str,
    event_id: &str,
    event_type: &str,
    room_id: &str,
    room_version: i64,
    occurred_at_ms: i64,
    body: Vec<u8>,
) -> Vec<u8> {
    EventEnvelope {
        app_code: app_code.into(),
        event_id: event_id.into(),
        room_id: room_id.into(),
        event_type: event_type.into(),
        room_version,
        occurred_at_ms,
        body,
    }
    .encode_to_vec()
}

/// The protobuf body of an `event_type` event from its JSON fields, as `enqueue` and
/// `try-sink` take them on the command line (`None`: an empty body).
pub fn body_from_json_text(event_type: &str, json: Option<&str>) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context as _;
    let Some(text) = json else {
        return Ok(Vec::new());
    };
    let json: serde_json::Value = serde_json::from_str(text).context("--body is not JSON")?;
    match outbox_proto::body_from_json(event_type, &json) {
        Some(encoded) => encoded.with_context(|| format!("--body does not fit {event_type}")),
        None => anyhow::bail!("unknown event type {event_type:?} (known: {})", outbox_proto::EVENT_TYPES.join(", ")),
    }
}
