//! Operator actions shared by the command line and the admin HTTP API.

use serde_json::{Value, json};

use std::sync::Arc;

use crate::store::{RegisteredSink, ReplayFilter, RetryFilter, Row, Store, StoreError, now_ms};

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

/// [`purge`] on the outbox and on every other sink's own table: the outbox keeps a row
/// until the first sink has it delivered and every other sink has its copy; each sink's
/// table keeps its rows until that sink has them delivered. Returns how many, per table.
/// A sink registered a moment ago by a starting host may have no table yet (the host
/// creates it just after registering): there is nothing of it to purge then.
pub async fn purge_everywhere(
    outbox: Arc<dyn Store>,
    before_ms: i64,
    batch: u32,
) -> Result<Vec<(String, u64)>, StoreError> {
    let mut deleted = vec![(outbox.table().to_string(), purge(outbox.as_ref(), before_ms, batch).await?)];
    for sink in outbox.sinks().await.unwrap_or_default().iter().filter(|s| !s.is_first(outbox.table())) {
        let own = outbox.clone().sink_store(sink).await?;
        let purged = if own.describe().await?.is_some() { purge(own.as_ref(), before_ms, batch).await? } else { 0 };
        deleted.push((sink.table.clone(), purged));
    }
    Ok(deleted)
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

/// Rows one step of a replay moves or copies: each step is its own short statement, so a
/// replay of a large range never holds many rows' locks at once, nor for long.
pub const REPLAY_STEP: u32 = 1_000;

/// The sink `name` and its state's store, for a replay of `filter`.
async fn replay_target(
    outbox: &Arc<dyn Store>,
    name: &str,
    filter: &ReplayFilter,
) -> Result<(RegisteredSink, Arc<dyn Store>), ReplayError> {
    if filter.to_ms.is_some_and(|to| to <= filter.from_ms) {
        return Err(ReplayError::BadRange("--to must be later than --from".into()));
    }
    let sink = registered(outbox.as_ref(), name).await?;
    let state = outbox.clone().sink_store(&sink).await?;
    Ok((sink, state))
}

/// How many events a replay of `filter` to the sink `name` would deliver again.
pub async fn count_replay(outbox: Arc<dyn Store>, name: &str, filter: &ReplayFilter) -> Result<u64, ReplayError> {
    let (sink, state) = replay_target(&outbox, name, filter).await?;
    let missing = outbox.count_recopy(&sink, filter).await?;
    let finished = state.count_replayable(filter).await?;
    Ok((missing + finished).max(0) as u64)
}

/// Delivers the events `filter` selects again to the sink `name` only: its `delivered` and
/// `failed` ones move back to `pending` in its own state (rows waiting or in flight are
/// left alone), and for a sink beside the first, events its table no longer has (purged
/// there) are copied in again from the outbox. Both walk the rows in key order,
/// [`REPLAY_STEP`] at a time, each event visited once. Returns how many events will be
/// delivered.
pub async fn replay(outbox: Arc<dyn Store>, name: &str, filter: &ReplayFilter) -> Result<u64, ReplayError> {
    let (sink, state) = replay_target(&outbox, name, filter).await?;
    // The moves first, then the copies: a copy is `pending` (and soon delivered again) at
    // once, so copying first would let a later move step take it a second time.
    let (mut moved, mut after) = (0, None);
    loop {
        let step = state.replay(filter, now_ms(), after, REPLAY_STEP).await?;
        moved += step.rows;
        match step.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let (mut recopied, mut after) = (0, None);
    loop {
        let step = outbox.recopy(&sink, filter, after, REPLAY_STEP).await?;
        recopied += step.rows;
        match step.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    tracing::info!(sink = %name, moved, recopied, ?filter, "replay");
    Ok(moved + recopied)
}

/// One registered sink and its counts, for `/api/status` and the page.
#[derive(Debug, Clone)]
pub struct SinkSummary {
    /// Its name.
    pub name: String,
    /// Where its state lives.
    pub table: String,
    /// Its counts, oldest waiting event and top errors.
    pub stats: crate::store::Stats,
    /// Still copying the events from before it was added (not delivering yet).
    pub backfilling: bool,
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
            backfilling: sink.backfilled_at_ms.is_none(),
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
