//! Operator actions shared by the command line and the admin HTTP API.

use serde_json::{Value, json};

use std::sync::Arc;

use crate::store::{RegisteredSink, ReplayFilter, RetryFilter, Row, Store, StoreError, now_ms};

/// Rows a purge deletes per statement, so it never holds locks for long.
pub const PURGE_BATCH: u32 = 1_000;

/// Deletes every `delivered` row last updated before `before_ms`, one bounded batch at a
/// time, that no sink after the first still needs (past its lowest position, or with an
/// exception still to deliver: decision 0203). Returns how many.
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

/// The sink `name` as the outbox's registry has it, or an error naming the sinks there are.
async fn registered(outbox: &dyn Store, name: &str) -> Result<RegisteredSink, ReplayError> {
    let sinks = outbox.sinks().await?;
    match sinks.iter().find(|s| s.name == name) {
        Some(sink) => Ok(sink.clone()),
        None => {
            let known = sinks.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ");
            Err(ReplayError::UnknownSink { name: name.to_string(), known })
        }
    }
}

/// The store of the sink `name`'s state (the outbox itself for the first sink), or an
/// error naming the sinks there are.
pub async fn sink_state(outbox: Arc<dyn Store>, name: &str) -> Result<Arc<dyn Store>, ReplayError> {
    let sink = registered(outbox.as_ref(), name).await?;
    Ok(outbox.sink_store(&sink).await?)
}

/// Moves the `failed` rows `filter` selects back to `pending`. Returns how many.
pub async fn retry(store: &dyn Store, filter: &RetryFilter) -> Result<u64, StoreError> {
    store.retry_failed(filter, now_ms()).await
}

/// Why a replay did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// No sink of that name is registered on the table.
    #[error("no sink {name:?} on this table (its sinks: {known})")]
    UnknownSink {
        /// The name asked for.
        name: String,
        /// The registered names, comma-separated.
        known: String,
    },
    /// The range is empty or backwards.
    #[error("{0}")]
    BadRange(String),
    /// The database refused or is away.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Rows one step of a replay moves: each step is its own short statement, so a
/// replay of a large range never holds many rows' locks at once, nor for long.
pub const REPLAY_STEP: u32 = 1_000;

/// The store of the sink `name`'s state, for a replay of `filter`.
async fn replay_target(
    outbox: &Arc<dyn Store>,
    name: &str,
    filter: &ReplayFilter,
) -> Result<Arc<dyn Store>, ReplayError> {
    if filter.to_ms.is_some_and(|to| to <= filter.from_ms) {
        return Err(ReplayError::BadRange("--to must be later than --from".into()));
    }
    let sink = registered(outbox.as_ref(), name).await?;
    Ok(outbox.clone().sink_store(&sink).await?)
}

/// How many events a replay of `filter` to the sink `name` would deliver again.
pub async fn count_replay(outbox: Arc<dyn Store>, name: &str, filter: &ReplayFilter) -> Result<u64, ReplayError> {
    let state = replay_target(&outbox, name, filter).await?;
    Ok(state.count_replayable(filter).await?.max(0) as u64)
}

/// Delivers the events `filter` selects again to the sink `name` only: its `delivered` and
/// `failed` ones move back to `pending` in its own state (the row's columns for the first
/// sink, an exception for a sink after it; events waiting or in flight are left alone),
/// walking the rows in key order, [`REPLAY_STEP`] at a time, each event visited once.
/// Returns how many events will be delivered.
pub async fn replay(outbox: Arc<dyn Store>, name: &str, filter: &ReplayFilter) -> Result<u64, ReplayError> {
    let state = replay_target(&outbox, name, filter).await?;
    let (mut moved, mut after) = (0, None);
    loop {
        let step = state.replay(filter, now_ms(), after, REPLAY_STEP).await?;
        moved += step.rows;
        match step.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    tracing::info!(sink = %name, moved, ?filter, "replay");
    Ok(moved)
}

/// One registered sink and its counts, for `/api/status` and the page.
#[derive(Debug, Clone)]
pub struct SinkSummary {
    /// Its name.
    pub name: String,
    /// Where its state lives: the outbox's name for the first sink, else the name that keys
    /// its partitions (it reads the outbox as a consumer).
    pub table: String,
    /// Its counts, oldest waiting event and top errors.
    pub stats: crate::store::Stats,
    /// The hosts that own its partitions (per-room order), with what they have in flight.
    pub owners: Vec<crate::store::OwnerView>,
}

/// Every sink registered on the outbox, with its counts (the first sink's are `first`).
pub async fn sink_summaries(
    outbox: Arc<dyn Store>,
    first: &crate::store::Stats,
) -> Result<Vec<SinkSummary>, StoreError> {
    let mut out = Vec::new();
    for sink in outbox.sinks().await? {
        let own = outbox.clone().sink_store(&sink).await?;
        let stats = if sink.is_first(outbox.table()) { first.clone() } else { own.stats().await? };
        out.push(SinkSummary {
            owners: own.partition_owners(own.clock_ms().await?).await?,
            name: sink.name,
            table: sink.table,
            stats,
        });
    }
    Ok(out)
}

/// A replay's range from an operator's text: RFC 3339 times (or dates).
pub fn replay_filter(
    from: &str,
    to: Option<&str>,
    event_type: Option<String>,
    room_id: Option<String>,
) -> Result<ReplayFilter, ReplayError> {
    let time = |key: &str, text: &str| {
        crate::units::parse_rfc3339_ms(text).map_err(|why| ReplayError::BadRange(format!("{key}: {why}")))
    };
    Ok(ReplayFilter {
        from_ms: time("from", from)?,
        to_ms: to.filter(|t| !t.is_empty()).map(|t| time("to", t)).transpose()?,
        event_type: event_type.filter(|t| !t.is_empty()),
        room_id: room_id.filter(|r| !r.is_empty()),
    })
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
    let mut described = describe_state(row);
    described["envelope"] = describe_envelope(row);
    described
}

/// A row without its envelope: one sink's state of the event.
pub fn describe_state(row: &Row) -> Value {
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
        "plugin_digest": row.plugin_digest,
    })
}

/// An event as `show` and `/api/events/ID` give it: the outbox row (the first sink's state)
/// with its envelope decoded, and under `sinks` every registered sink's state of it (a sink
/// whose table does not have it reads `null`: before its start, or not copied yet).
pub async fn describe_everywhere(outbox: Arc<dyn Store>, row: &Row) -> Result<Value, StoreError> {
    let mut described = describe(row);
    let mut sinks = serde_json::Map::new();
    for sink in outbox.sinks().await.unwrap_or_default() {
        let state = if sink.is_first(outbox.table()) {
            Some(row.clone())
        } else {
            outbox.clone().sink_store(&sink).await?.get(&row.event_id).await?
        };
        let mut shown = state.as_ref().map_or(Value::Null, describe_state);
        if let Value::Object(fields) = &mut shown {
            for shared in ["app_code", "event_id", "event_type", "room_id", "created_at_ms"] {
                fields.remove(shared);
            }
            fields.insert("table".into(), json!(sink.table));
        }
        sinks.insert(sink.name.clone(), shown);
    }
    if !sinks.is_empty() {
        described["sinks"] = Value::Object(sinks);
    }
    Ok(described)
}

fn describe_envelope(row: &Row) -> Value {
    use outbox_proto::Message as _;
    match outbox_proto::EventEnvelope::decode(row.envelope.as_slice()) {
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
    }
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
