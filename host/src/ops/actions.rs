//! Operator actions shared by the command line and the admin HTTP API.

use serde_json::{Value, json};

use crate::store::{RetryFilter, Row, Store, StoreError, now_ms};

/// Rows a purge deletes per statement, so it never holds locks for long.
pub const PURGE_BATCH: u32 = 1_000;

/// Deletes every `delivered` row last updated before `before_ms`, one bounded batch at a
/// time. Returns how many.
pub async fn purge(store: &dyn Store, before_ms: i64, batch: u32) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = store.purge_delivered(before_ms, batch).await?;
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// Moves the `failed` rows `filter` selects back to `pending`. Returns how many.
pub async fn retry(store: &dyn Store, filter: &RetryFilter) -> Result<u64, StoreError> {
    store.retry_failed(filter, now_ms()).await
}

/// The filter an operator's parameters name: exactly one of them, or an error saying so.
pub fn retry_filter(
    event_id: Option<String>,
    event_type: Option<String>,
    error_contains: Option<String>,
    error_is: Option<String>,
    all: bool,
) -> Result<RetryFilter, String> {
    let mut chosen = Vec::new();
    if let Some(id) = event_id {
        chosen.push(RetryFilter::EventId(id));
    }
    if let Some(t) = event_type {
        chosen.push(RetryFilter::EventType(t));
    }
    if let Some(text) = error_contains {
        chosen.push(RetryFilter::ErrorContains(text));
    }
    if let Some(text) = error_is {
        chosen.push(RetryFilter::ErrorIs(text));
    }
    if all {
        chosen.push(RetryFilter::All);
    }
    match chosen.len() {
        1 => Ok(chosen.remove(0)),
        0 => Err("say which failed events to retry: an event id, an event type, error text, or all".into()),
        _ => Err("name only one of: event id, event type, error text, all".into()),
    }
}

/// A row as JSON, with its envelope and body decoded where they decode.
pub fn describe(row: &Row) -> Value {
    use outbox_proto::Message as _;
    let envelope = match outbox_proto::EventEnvelope::decode(row.envelope.as_slice()) {
        Ok(e) => {
            let body = match outbox_proto::body_to_json(&e.event_type, &e.body) {
                Some(Ok(body)) => body,
                Some(Err(err)) => json!({ "error": format!("body does not decode: {err}") }),
                None => json!({ "error": format!("unknown event type {:?}", e.event_type), "bytes": e.body.len() }),
            };
            json!({
                "app_code": e.app_code,
                "event_id": e.event_id,
                "room_id": e.room_id,
                "event_type": e.event_type,
                "room_version": e.room_version,
                "occurred_at_ms": e.occurred_at_ms,
                "body": body,
            })
        }
        Err(err) => json!({ "error": format!("not a protobuf EventEnvelope: {err}"), "bytes": row.envelope.len() }),
    };
    json!({
        "id": row.id,
        "app_code": row.app_code,
        "event_id": row.event_id,
        "event_type": row.event_type,
        "room_id": row.room_id,
        "status": row.status.as_str(),
        "created_at_ms": row.created_at_ms,
        "retry_count": row.retry_count,
        "last_error": row.last_error,
        "worker_id": row.worker_id,
        "lock_until_ms": row.lock_until_ms,
        "next_retry_at_ms": row.next_retry_at_ms,
        "updated_at_ms": row.updated_at_ms,
        "delivered_at_ms": row.delivered_at_ms,
        "envelope": envelope,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_filter_is_taken() {
        assert_eq!(retry_filter(None, None, None, None, true), Ok(RetryFilter::All));
        assert_eq!(retry_filter(Some("e".into()), None, None, None, false), Ok(RetryFilter::EventId("e".into())));
        assert!(retry_filter(None, None, None, None, false).is_err());
        assert!(retry_filter(Some("e".into()), Some("t".into()), None, None, false).is_err());
    }
}
