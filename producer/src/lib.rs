//! Writes events into an outbox-host table from a Rust service.
//!
//! A producer does two things, both with plain SQL that any language can run (the README's
//! *Producers* section has the statements and a Go version):
//!
//! 1. **Insert** the event in the same transaction as the state change it announces, with
//!    [`Outbox::insert`] on the caller's `sqlx` transaction. Nothing is visible to the host
//!    until that transaction commits; a rollback leaves no row.
//! 2. Optionally publish it itself right after the commit and, when that publish succeeded,
//!    **mark it delivered** with [`Outbox::mark_delivered`], so that the host does not send
//!    it again. Delivered wins: a host that holds the row at that moment delivers it once
//!    more at most (consumers deduplicate by `event_id`), and its late outcome cannot move the
//!    row out of `delivered`, because the host's failure writes apply only to a row still
//!    `delivering` under its own lease.
//!
//! ```ignore
//! let outbox = Outbox::<sqlx::Postgres>::new("room_outbox")?;
//! let mut tx = pool.begin().await?;
//! // … the room's state change on &mut *tx …
//! let event = Event {
//!     app_code: "default".into(),
//!     event_id: new_event_id(),
//!     event_type: "RoomGiftSent".into(),
//!     room_id: "room-1".into(),
//!     envelope,
//!     created_at_ms: now_ms(),
//!     delivered: false,
//!     // The caller's trace, so that the host's delivery joins it (feature `opentelemetry`).
//!     trace_context: outbox_producer::current_trace_context(),
//! };
//! outbox.insert(&mut *tx, &event).await?;
//! tx.commit().await?;
//! if publish(&event).await.is_ok() {
//!     outbox.mark_delivered(&pool, &event.event_id, now_ms()).await?;
//! }
//! ```
//!
//! The statements are built once by [`Outbox::new`]; [`sql`] has them as text, which
//! outbox-host's own `enqueue` uses too.

use std::marker::PhantomData;

use sqlx::Executor;

/// One event as a producer writes it. The host fills in every other column's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Tenant / app; events of different apps are never merged, even for equal room ids.
    pub app_code: String,
    /// The idempotency key, unique in the table; consumers deduplicate by it.
    pub event_id: String,
    /// e.g. `RoomGiftSent`.
    pub event_type: String,
    /// The room; the host keeps a room's events in order.
    pub room_id: String,
    /// The protobuf `EventEnvelope`.
    pub envelope: Vec<u8>,
    /// UTC milliseconds; the host delivers in this order (then in insert order).
    pub created_at_ms: i64,
    /// Write it as already `delivered` (the producer's own publish succeeded before the
    /// insert) rather than `pending`.
    pub delivered: bool,
    /// The trace the event belongs to, as the `trace_context` column holds it: the W3C
    /// `traceparent`, then `;` and the `tracestate` when there is one ([`trace_context`]
    /// writes it; with the feature `opentelemetry`, [`current_trace_context`] takes the
    /// caller's current span). `None`: the host's delivery starts a trace of its own.
    pub trace_context: Option<String>,
}

/// The `trace_context` column's text for a W3C `traceparent` and, when there is one, a
/// `tracestate`: `00-<trace id>-<span id>-<flags>[;<tracestate>]`. The host checks it
/// when it delivers; text it cannot read starts a new trace and never holds the event.
pub fn trace_context(traceparent: &str, tracestate: Option<&str>) -> String {
    match tracestate.filter(|s| !s.is_empty()) {
        Some(state) => format!("{traceparent};{state}"),
        None => traceparent.to_string(),
    }
}

/// The current OpenTelemetry context's span as `trace_context` text, or `None` when there
/// is no valid span (nothing to join).
#[cfg(feature = "opentelemetry")]
pub fn current_trace_context() -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let traceparent = format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8());
    Some(trace_context(&traceparent, Some(&sc.trace_state().header())))
}

/// Why an [`Outbox`] could not be made or a write failed.
#[derive(Debug)]
pub enum Error {
    /// The table name is not a plain SQL identifier.
    BadTable(String),
    /// Another row already has this `event_id`.
    Duplicate(String),
    /// The database refused or could not be reached.
    Database(sqlx::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::BadTable(t) => {
                write!(f, "{t:?} is not a plain SQL identifier (letters, digits and '_', not starting with a digit)")
            }
            Error::Duplicate(id) => write!(f, "event_id {id:?} is already in the outbox"),
            Error::Database(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Database(e) => Some(e),
            _ => None,
        }
    }
}

/// The SQL text of the producer's statements, for any placeholder style.
pub mod sql {
    /// The columns a producer writes, in the order [`insert`] binds them.
    pub const COLUMNS: [&str; 8] =
        ["app_code", "event_id", "event_type", "room_id", "status", "envelope", "created_at_ms", "trace_context"];

    /// `INSERT` of `rows` events into `table`; `param(n)` is the placeholder of the `n`th
    /// parameter, from 1 (`$n` on PostgreSQL, `?` elsewhere).
    pub fn insert(table: &str, rows: usize, param: impl Fn(usize) -> String) -> String {
        insert_columns(table, rows, &COLUMNS, param)
    }

    /// [`insert`] without `trace_context`, for an event that has none: it also writes to a
    /// table that a host older than the column migrated.
    pub fn insert_untraced(table: &str, rows: usize, param: impl Fn(usize) -> String) -> String {
        insert_columns(table, rows, &COLUMNS[..COLUMNS.len() - 1], param)
    }

    fn insert_columns(table: &str, rows: usize, columns: &[&str], param: impl Fn(usize) -> String) -> String {
        let values: Vec<String> = (0..rows)
            .map(|row| {
                let one: Vec<String> = (1..=columns.len()).map(|i| param(row * columns.len() + i)).collect();
                format!("({})", one.join(", "))
            })
            .collect();
        format!("INSERT INTO {table} ({}) VALUES {}", columns.join(", "), values.join(", "))
    }

    /// Marks one event `delivered` by `event_id` (parameters: now in ms twice, then the id),
    /// whatever its state, unless it already is. It leaves `worker_id` and `lock_until_ms`
    /// alone, so a host holding the row still sees its own lease; its failure writes then
    /// find the row no longer `delivering` and change nothing.
    pub fn mark_delivered(table: &str, param: impl Fn(usize) -> String) -> String {
        format!(
            "UPDATE {table} SET status = 'delivered', updated_at_ms = {}, delivered_at_ms = {} \
             WHERE event_id = {} AND status <> 'delivered'",
            param(1),
            param(2),
            param(3)
        )
    }
}

/// A database the producer can write to: PostgreSQL, MySQL/MariaDB or SQLite.
pub trait Backend: sqlx::Database {
    /// The placeholder of the `n`th parameter.
    fn param(n: usize) -> String;

    /// Runs `statement` (from [`sql::insert`] for one row, or [`sql::insert_untraced`] when
    /// the event has no trace context) with `event`'s values.
    fn run_insert<'e, E: Executor<'e, Database = Self>>(
        executor: E,
        statement: &str,
        event: &Event,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Runs `statement` (from [`sql::mark_delivered`]).
    fn run_mark<'e, E: Executor<'e, Database = Self>>(
        executor: E,
        statement: &str,
        event_id: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}

macro_rules! backend {
    ($db:ty, $param:expr) => {
        impl Backend for $db {
            fn param(n: usize) -> String {
                ($param)(n)
            }

            async fn run_insert<'e, E: Executor<'e, Database = Self>>(
                executor: E,
                statement: &str,
                event: &Event,
            ) -> Result<u64, sqlx::Error> {
                let mut q = sqlx::query(statement)
                    .bind(event.app_code.as_str())
                    .bind(event.event_id.as_str())
                    .bind(event.event_type.as_str())
                    .bind(event.room_id.as_str())
                    .bind(if event.delivered { "delivered" } else { "pending" })
                    .bind(event.envelope.as_slice())
                    .bind(event.created_at_ms);
                if let Some(context) = &event.trace_context {
                    q = q.bind(context.as_str());
                }
                let done = q.execute(executor).await?;
                Ok(done.rows_affected())
            }

            async fn run_mark<'e, E: Executor<'e, Database = Self>>(
                executor: E,
                statement: &str,
                event_id: &str,
                now_ms: i64,
            ) -> Result<u64, sqlx::Error> {
                let done = sqlx::query(statement).bind(now_ms).bind(now_ms).bind(event_id).execute(executor).await?;
                Ok(done.rows_affected())
            }
        }
    };
}

backend!(sqlx::Postgres, |n: usize| format!("${n}"));
backend!(sqlx::MySql, |_n: usize| "?".to_string());
backend!(sqlx::Sqlite, |_n: usize| "?".to_string());

/// An outbox table on database `DB`, with its statements built.
#[derive(Debug, Clone)]
pub struct Outbox<DB: Backend> {
    insert: String,
    insert_untraced: String,
    mark_delivered: String,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Backend> Outbox<DB> {
    /// The outbox `table` (outbox-host's `outbox.table`, default `room_outbox`).
    pub fn new(table: &str) -> Result<Self, Error> {
        if !is_identifier(table) {
            return Err(Error::BadTable(table.to_string()));
        }
        Ok(Outbox {
            insert: sql::insert(table, 1, DB::param),
            insert_untraced: sql::insert_untraced(table, 1, DB::param),
            mark_delivered: sql::mark_delivered(table, DB::param),
            db: PhantomData,
        })
    }

    /// Inserts `event`. Pass the caller's transaction (`&mut *tx`) so that the event
    /// commits or rolls back with the state change.
    pub async fn insert<'e, E: Executor<'e, Database = DB>>(&self, executor: E, event: &Event) -> Result<(), Error> {
        let statement = if event.trace_context.is_some() { &self.insert } else { &self.insert_untraced };
        DB::run_insert(executor, statement, event).await.map(drop).map_err(|e| match e {
            sqlx::Error::Database(d) if d.is_unique_violation() => Error::Duplicate(event.event_id.clone()),
            other => Error::Database(other),
        })
    }

    /// Marks the event `delivered` after the producer's own publish succeeded; `true` if this
    /// call changed the row (`false`: no such event, or already delivered). Safe while a host
    /// holds the row: delivered wins (see the crate's documentation).
    pub async fn mark_delivered<'e, E: Executor<'e, Database = DB>>(
        &self,
        executor: E,
        event_id: &str,
        now_ms: i64,
    ) -> Result<bool, Error> {
        Ok(DB::run_mark(executor, &self.mark_delivered, event_id, now_ms).await.map_err(Error::Database)? > 0)
    }
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_per_placeholder_style() {
        assert_eq!(
            sql::insert("room_outbox", 2, |n| format!("${n}")),
            "INSERT INTO room_outbox (app_code, event_id, event_type, room_id, status, envelope, created_at_ms, \
             trace_context) VALUES ($1, $2, $3, $4, $5, $6, $7, $8), ($9, $10, $11, $12, $13, $14, $15, $16)"
        );
        assert_eq!(
            sql::insert_untraced("room_outbox", 1, |_| "?".into()),
            "INSERT INTO room_outbox (app_code, event_id, event_type, room_id, status, envelope, created_at_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?)"
        );
        assert_eq!(
            sql::mark_delivered("events_out", |_| "?".into()),
            "UPDATE events_out SET status = 'delivered', updated_at_ms = ?, delivered_at_ms = ? \
             WHERE event_id = ? AND status <> 'delivered'"
        );
    }

    #[test]
    fn trace_context_joins_the_state_to_the_parent() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(trace_context(parent, None), parent);
        assert_eq!(trace_context(parent, Some("")), parent);
        assert_eq!(trace_context(parent, Some("congo=t61rcWkgMzE")), format!("{parent};congo=t61rcWkgMzE"));
    }

    #[test]
    fn only_plain_identifiers_name_a_table() {
        assert!(Outbox::<sqlx::Sqlite>::new("room_outbox").is_ok());
        for bad in ["", "1x", "room_outbox; DROP TABLE x", "a-b", &"x".repeat(64)] {
            assert!(matches!(Outbox::<sqlx::Sqlite>::new(bad), Err(Error::BadTable(_))), "{bad:?} accepted");
        }
    }
}
