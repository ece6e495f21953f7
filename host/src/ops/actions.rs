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

/// The sink `name` with its counts and owners, and the store of its state; an error names
/// the sinks there are when it is not registered.
pub async fn sink_summary(outbox: Arc<dyn Store>, name: &str) -> Result<(SinkSummary, Arc<dyn Store>), ReplayError> {
    let sink = registered(outbox.as_ref(), name).await?;
    let own = outbox.clone().sink_store(&sink).await?;
    let stats = own.stats().await?;
    let owners = own.partition_owners(own.clock_ms().await?).await?;
    Ok((SinkSummary { name: sink.name, table: sink.table, stats, owners }, own))
}

/// A search of one sink's events, as an operator asks it (the console's form and
/// `/api/events`): the sink (`None`: the first) and what to select.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchRequest {
    /// The sink whose state is searched; `None`: the first sink.
    pub sink: Option<String>,
    /// What to select.
    pub search: crate::store::Search,
}

/// Events per page when a search does not say.
pub const SEARCH_PAGE: u32 = 50;

/// A search from a query string's pairs: `sink`, `status` (repeated or comma-separated),
/// `type`, `room`, `event_id`, `from` and `to` (RFC 3339, on the creation time), `cursor` and
/// `limit`. An empty value is no filter (a form sends its empty fields). Anything else is an
/// error naming every bad key.
pub fn search_request(pairs: impl IntoIterator<Item = (String, String)>) -> Result<SearchRequest, String> {
    use crate::store::{Cursor, Status};
    let mut request = SearchRequest::default();
    request.search.limit = SEARCH_PAGE;
    let mut bad = Vec::new();
    for (key, value) in pairs {
        let value = value.trim().to_string();
        if value.is_empty() {
            continue;
        }
        let time = |v: &str| crate::units::parse_rfc3339_ms(v);
        match key.as_str() {
            "sink" => request.sink = Some(value),
            "status" => {
                for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    match Status::parse(part) {
                        Some(status) if !request.search.statuses.contains(&status) => {
                            request.search.statuses.push(status)
                        }
                        Some(_) => {}
                        None => bad.push(format!(
                            "status: {:?} is not one of pending, delivering, delivered, retryable, failed",
                            crate::text::printable(part, 40)
                        )),
                    }
                }
            }
            "type" => request.search.event_type = Some(value),
            "room" => request.search.room_id = Some(value),
            "event_id" => request.search.event_id = Some(value),
            "from" => match time(&value) {
                Ok(ms) => request.search.from_ms = Some(ms),
                Err(why) => bad.push(format!("from: {why}")),
            },
            "to" => match time(&value) {
                Ok(ms) => request.search.to_ms = Some(ms),
                Err(why) => bad.push(format!("to: {why}")),
            },
            "cursor" => match Cursor::decode(&value) {
                Ok(cursor) => request.search.cursor = Some(cursor),
                Err(why) => bad.push(format!("cursor: {why}")),
            },
            "limit" => match value.parse::<u32>() {
                Ok(n) if (1..=crate::store::search::MAX_PAGE).contains(&n) => request.search.limit = n,
                _ => bad.push(format!("limit: a number from 1 to {}", crate::store::search::MAX_PAGE)),
            },
            other => bad.push(format!(
                "{}: not a search key (sink, status, type, room, event_id, from, to, cursor, limit)",
                crate::text::printable(other, 40)
            )),
        }
    }
    if let (Some(from), Some(to)) = (request.search.from_ms, request.search.to_ms)
        && to <= from
    {
        bad.push("to: must be later than from".into());
    }
    if bad.is_empty() { Ok(request) } else { Err(bad.join("; ")) }
}

/// A page of the events `request` selects in its sink's state, and the sink's name.
pub async fn search(
    outbox: Arc<dyn Store>,
    request: &SearchRequest,
) -> Result<(String, crate::store::Found), ReplayError> {
    let sink = match &request.sink {
        Some(name) => registered(outbox.as_ref(), name).await?,
        None => outbox
            .sinks()
            .await?
            .into_iter()
            .find(|s| s.is_first(outbox.table()))
            .ok_or_else(|| ReplayError::UnknownSink { name: "(the first)".into(), known: String::new() })?,
    };
    let own = outbox.clone().sink_store(&sink).await?;
    Ok((sink.name, own.search(&request.search).await?))
}

/// What an operator's bulk action does to the events a search selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bulk {
    /// Their `failed` ones in the searched sink go back to `pending`.
    Retry,
    /// Their finished ones (`delivered`, `failed`) are delivered again to the sink `to` only.
    Replay {
        /// The sink to deliver to again.
        to: String,
    },
    /// Their waiting ones (`pending`, `retryable`) in the searched sink become `failed`, not
    /// attempted again.
    Discard,
}

impl Bulk {
    /// The action from its name (`retry`, `replay`, `discard`) and, for a replay, its sink
    /// (`None`: the searched sink).
    pub fn parse(action: &str, to: Option<String>, searched: &str) -> Result<Bulk, String> {
        match action {
            "retry" => Ok(Bulk::Retry),
            "replay" => Ok(Bulk::Replay { to: to.filter(|t| !t.is_empty()).unwrap_or_else(|| searched.to_string()) }),
            "discard" => Ok(Bulk::Discard),
            other => Err(format!("action: {:?} is not retry, replay or discard", crate::text::printable(other, 40))),
        }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            Bulk::Retry => "retry",
            Bulk::Replay { .. } => "replay",
            Bulk::Discard => "discard",
        }
    }
}

/// Most events one bulk action acts on: a larger selection is refused (narrow the search).
pub const BULK_MAX: usize = 1_000;

/// Every event `request` selects in its sink's state (every page, from its cursor if any),
/// and the sink's name; at most [`BULK_MAX`] + 1, so that a caller can tell there are more.
pub async fn bulk_selection(
    outbox: Arc<dyn Store>,
    request: &SearchRequest,
) -> Result<(String, Vec<Row>), ReplayError> {
    let mut request = request.clone();
    request.search.limit = crate::store::search::MAX_PAGE;
    let mut rows = Vec::new();
    loop {
        let (sink, found) = search(outbox.clone(), &request).await?;
        rows.extend(found.rows);
        match found.next {
            Some(next) if rows.len() <= BULK_MAX => request.search.cursor = Some(next),
            _ => {
                rows.truncate(BULK_MAX + 1);
                return Ok((sink, rows));
            }
        }
    }
}

/// Does `action` to each of `rows` (events of the sink `sink` as a search selected them),
/// one short statement or two per event; says who did it (`who`) in a discard's last error.
/// Returns how many events it changed.
pub async fn bulk(
    outbox: Arc<dyn Store>,
    sink: &str,
    rows: &[Row],
    action: &Bulk,
    who: &str,
) -> Result<u64, ReplayError> {
    let target = match action {
        Bulk::Replay { to } => to.as_str(),
        Bulk::Retry | Bulk::Discard => sink,
    };
    let state = sink_state(outbox, target).await?;
    let reason = format!("discarded by an operator ({who})");
    let now = now_ms();
    let mut changed = 0;
    for row in rows {
        // Exactly this event: its id, and its creation time, which every step's walk reads by.
        let only = ReplayFilter {
            from_ms: row.created_at_ms,
            to_ms: Some(row.created_at_ms + 1),
            event_type: None,
            room_id: None,
            event_id: Some(row.event_id.clone()),
        };
        changed += match action {
            Bulk::Retry => state.retry_failed(&RetryFilter::EventId(row.event_id.clone()), now).await?,
            Bulk::Replay { .. } => state.replay(&only, now, None, 10).await?.rows,
            Bulk::Discard => state.discard(&only, &reason, now, None, 10).await?.rows,
        };
    }
    Ok(changed)
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
        event_id: None,
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

/// An event's state in every registered sink, in registration order.
pub type States = Vec<(RegisteredSink, Option<Row>)>;

/// An event's state in every registered sink, in registration order: the row itself for
/// the first sink, a sink's own view of it for the others (`None`: a sink whose state does
/// not have it, created before its start).
pub async fn states_everywhere(outbox: Arc<dyn Store>, row: &Row) -> Result<States, StoreError> {
    let mut states = Vec::new();
    for sink in outbox.sinks().await.unwrap_or_default() {
        let state = if sink.is_first(outbox.table()) {
            Some(row.clone())
        } else {
            outbox.clone().sink_store(&sink).await?.get(&row.event_id).await?
        };
        states.push((sink, state));
    }
    Ok(states)
}

/// An event as `show` and `/api/events/ID` give it: the outbox row (the first sink's state)
/// with its envelope decoded, and under `sinks` every registered sink's state of it (a sink
/// whose state does not have it reads `null`: created before its start).
pub async fn describe_everywhere(outbox: Arc<dyn Store>, row: &Row) -> Result<Value, StoreError> {
    let mut described = describe(row);
    let mut sinks = serde_json::Map::new();
    for (sink, state) in states_everywhere(outbox, row).await? {
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

/// An event's story, as the console's `/events/ID` tells it.
pub struct Story {
    /// The outbox row (the first sink's state), envelope included.
    pub row: Row,
    /// Its envelope decoded, as `show` gives it.
    pub envelope: Value,
    /// Its state in every sink.
    pub states: States,
    /// The room's event just before it and just after it, each with its state in every sink.
    pub neighbours: [Option<(Row, States)>; 2],
}

/// The story of the event `event_id`: `None` when the outbox has no such event.
pub async fn story(outbox: Arc<dyn Store>, event_id: &str) -> Result<Option<Story>, StoreError> {
    let Some(row) = outbox.get(event_id).await? else { return Ok(None) };
    let states = states_everywhere(outbox.clone(), &row).await?;
    let [before, after] = outbox.neighbours(&row).await?;
    let mut neighbours = [None, None];
    for (found, slot) in [before, after].into_iter().zip(&mut neighbours) {
        if let Some(found) = found {
            let their = states_everywhere(outbox.clone(), &found).await?;
            *slot = Some((found, their));
        }
    }
    Ok(Some(Story { envelope: describe_envelope(&row), row, states, neighbours }))
}

/// Most bytes of a body shown as hex when it does not decode.
const HEX_BYTES: usize = 4_096;

/// Up to [`HEX_BYTES`] of `bytes` as lower-case hex, `…` after when there were more.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len().min(HEX_BYTES) * 2 + 3);
    for b in bytes.iter().take(HEX_BYTES) {
        let _ = write!(out, "{b:02x}");
    }
    if bytes.len() > HEX_BYTES {
        out.push('…');
    }
    out
}

fn describe_envelope(row: &Row) -> Value {
    use outbox_proto::Message as _;
    match outbox_proto::EventEnvelope::decode(row.envelope.as_slice()) {
        Ok(e) => {
            let body = match outbox_proto::body_to_json(&e.event_type, &e.body) {
                Some(Ok(body)) => body,
                Some(Err(err)) => json!({ "error": format!("body does not decode: {err}") }),
                None => json!({
                    "error": format!("unknown event type {:?}", e.event_type),
                    "bytes": e.body.len(),
                    "hex": hex(&e.body),
                }),
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
        Err(err) => json!({
            "error": format!("not a protobuf EventEnvelope: {err}"),
            "bytes": row.envelope.len(),
            "hex": hex(&row.envelope),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_that_do_not_decode_are_shown_as_bounded_hex() {
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
        let long = hex(&vec![1u8; HEX_BYTES + 1]);
        assert_eq!(long.len(), HEX_BYTES * 2 + '…'.len_utf8());
        assert!(long.ends_with('…'));
    }

    #[test]
    fn a_search_takes_every_key_and_names_every_bad_one() {
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let request = search_request(pairs(&[
            ("sink", "b"),
            ("status", "failed,retryable"),
            ("status", "failed"),
            ("type", "RoomGiftSent"),
            ("room", "r1"),
            ("event_id", ""),
            ("from", "2026-12-01T00:00:00Z"),
            ("limit", "10"),
        ]))
        .unwrap();
        assert_eq!(request.sink.as_deref(), Some("b"));
        assert_eq!(request.search.statuses, [crate::store::Status::Failed, crate::store::Status::Retryable]);
        assert_eq!(request.search.event_id, None, "an empty field is no filter");
        assert_eq!(request.search.limit, 10);
        assert_eq!(search_request(Vec::new()).unwrap().search.limit, SEARCH_PAGE);
        let bad = search_request(pairs(&[("status", "lost"), ("limit", "0"), ("colour", "red"), ("cursor", "x")]))
            .unwrap_err();
        for key in ["status: \"lost\"", "limit:", "colour: not a search key", "cursor:"] {
            assert!(bad.contains(key), "{key} in {bad}");
        }
        let backwards = search_request(pairs(&[("from", "2026-12-02"), ("to", "2026-12-01")])).unwrap_err();
        assert!(backwards.contains("to: must be later than from"), "{backwards}");
    }

    #[test]
    fn exactly_one_filter_is_taken() {
        assert_eq!(retry_filter(None, None, None, None, true), Ok(RetryFilter::All));
        assert_eq!(retry_filter(Some("e".into()), None, None, None, false), Ok(RetryFilter::EventId("e".into())));
        assert!(retry_filter(None, None, None, None, false).is_err());
        assert!(retry_filter(Some("e".into()), Some("t".into()), None, None, false).is_err());
    }
}
