//! An operator's search of one sink's events (the console's search and `/api/events`): any
//! combination of statuses, type, room, event id and a creation-time range, newest first,
//! a page at a time, each next page starting after an opaque cursor.
//!
//! The outbox's own rows (the first sink's state) are searched in SQL. A sink after the
//! first keeps its state in positions and exceptions (decision 0203): its `retryable` and
//! `failed` events are searched among its exceptions; any other search reads the outbox's
//! rows newest first and judges each by the sink's exceptions and positions, at most
//! [`SCAN_ROWS`] rows per request, so a request stays bounded whatever matches; its cursor
//! then says where the next request goes on.

use super::sql::{Dialect, SqlStore, for_every_dialect};
use super::{KeyValue, Row, Status, StoreError};

/// Events a search returns at most per page.
pub const MAX_PAGE: u32 = 200;

/// Rows a search of a sink after the first reads at most per request, when what it selects
/// is not among the sink's exceptions.
pub const SCAN_ROWS: u32 = 2_000;

/// What an operator's search selects; every part is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Search {
    /// Any of these statuses (none: any).
    pub statuses: Vec<Status>,
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this room.
    pub room_id: Option<String>,
    /// Only this event.
    pub event_id: Option<String>,
    /// Created at or after, UTC ms.
    pub from_ms: Option<i64>,
    /// Created before, UTC ms.
    pub to_ms: Option<i64>,
    /// Where the page starts: a cursor a previous page returned.
    pub cursor: Option<Cursor>,
    /// Events per page, at most [`MAX_PAGE`].
    pub limit: u32,
}

/// Where a page of a search starts: strictly older than this row, in `(created_at_ms, key)`
/// order (the key is the table's, or the event id among a sink's exceptions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last row's creation time.
    pub created_at_ms: i64,
    /// The last row's key.
    pub key: KeyValue,
}

impl Cursor {
    /// The cursor as text for a URL: `<ms>~i<number>` or `<ms>~t<text>`.
    pub fn encode(&self) -> String {
        match &self.key {
            KeyValue::Int(n) => format!("{}~i{n}", self.created_at_ms),
            KeyValue::Text(t) => format!("{}~t{t}", self.created_at_ms),
        }
    }

    /// A cursor from [`Cursor::encode`]'s text.
    pub fn decode(text: &str) -> Result<Cursor, String> {
        let bad = || format!("cursor {:?} is not one a search returned", crate::text::printable(text, 80));
        let (ms, key) = text.split_once('~').ok_or_else(bad)?;
        let created_at_ms = ms.parse().map_err(|_| bad())?;
        let key = match key.split_at_checked(1) {
            Some(("i", n)) => KeyValue::Int(n.parse().map_err(|_| bad())?),
            Some(("t", t)) => KeyValue::Text(t.to_string()),
            _ => return Err(bad()),
        };
        Ok(Cursor { created_at_ms, key })
    }
}

/// A page of a search.
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// The events, newest first, each in the sink's state.
    pub rows: Vec<Row>,
    /// Where the next page starts; `None` when nothing older matches.
    pub next: Option<Cursor>,
    /// Rows read to find these (a search of a sink after the first that reads the outbox).
    pub scanned: u64,
}

/// Statuses as SQL literals: they come from [`Status`], never from the request's text, and
/// written out they let PostgreSQL and SQLite use a partial index whose predicate names them.
pub(super) fn status_list(statuses: &[Status]) -> String {
    statuses.iter().map(|s| format!("'{}'", s.as_str())).collect::<Vec<_>>().join(", ")
}

/// The ` AND …` conditions of `search` but its statuses and cursor, on columns named as in
/// the outbox (and in the exceptions), their placeholders numbered from `first`, with the
/// values to bind in order.
pub(super) fn conditions<D: Dialect>(search: &Search, first: usize) -> (String, Vec<KeyValue>) {
    let mut sql = String::new();
    let mut binds = Vec::new();
    let mut add = |condition: &str, value: KeyValue| {
        sql.push_str(&format!(" AND {condition} {}", D::param(first + binds.len())));
        binds.push(value);
    };
    if let Some(room) = &search.room_id {
        add("room_id =", KeyValue::Text(room.clone()));
    }
    if let Some(event_type) = &search.event_type {
        add("event_type =", KeyValue::Text(event_type.clone()));
    }
    if let Some(id) = &search.event_id {
        add("event_id =", KeyValue::Text(id.clone()));
    }
    if let Some(from) = search.from_ms {
        add("created_at_ms >=", KeyValue::Int(from));
    }
    if let Some(to) = search.to_ms {
        add("created_at_ms <", KeyValue::Int(to));
    }
    (sql, binds)
}

/// ` AND (created_at_ms, key) < cursor`, its placeholders numbered from `first`. The
/// first term repeats what the rest says so that an index walk starts at the cursor: an `OR`
/// alone bounds no range of an index.
pub(super) fn before<D: Dialect>(cursor: &Cursor, key: &str, first: usize) -> (String, Vec<KeyValue>) {
    let sql = format!(
        " AND created_at_ms <= {} AND (created_at_ms < {} OR (created_at_ms = {} AND {key} < {}))",
        D::param(first),
        D::param(first + 1),
        D::param(first + 2),
        D::param(first + 3)
    );
    let at = KeyValue::Int(cursor.created_at_ms);
    (sql, vec![at.clone(), at.clone(), at, cursor.key.clone()])
}

/// ` AND status IN (…)` for `statuses`. With `delivered` among them (most of a table) the
/// rows are best read in the time order and filtered: the status is then written as a
/// residual condition ([`Dialect::residual`]), which SQLite's planner would otherwise serve
/// by its claim index, sorting every delivered row (860 ms on a million rows).
pub(super) fn status_condition<D: Dialect>(statuses: &[Status]) -> String {
    let list = format!("status IN ({})", status_list(statuses));
    if statuses.contains(&Status::Delivered) { format!(" AND {}", D::residual(&list)) } else { format!(" AND {list}") }
}

for_every_dialect!(impl {
    /// Rows of the outbox `search` selects (its statuses those of the row's own `status`
    /// when `by_status`), newest first, at most `limit`, older than `cursor`.
    pub(super) async fn search_rows(
        &self,
        search: &Search,
        by_status: bool,
        cursor: Option<&Cursor>,
        limit: u32,
    ) -> Result<Vec<Row>, StoreError> {
        let key = self.profile.key.column();
        let (mut filter, mut binds) = conditions::<D>(search, 1);
        if by_status && !search.statuses.is_empty() {
            filter.push_str(&status_condition::<D>(&search.statuses));
        }
        if let Some(cursor) = cursor {
            let (sql, values) = before::<D>(cursor, key, binds.len() + 1);
            filter.push_str(&sql);
            binds.extend(values);
        }
        let sql = format!(
            "SELECT {} FROM {} WHERE 1 = 1{filter} ORDER BY created_at_ms DESC, {key} DESC LIMIT {limit}",
            super::row_columns(self.profile.key),
            self.table,
        );
        let mut q = sqlx::query(&sql);
        for value in &binds {
            q = super::sinks::bind_key::<D>(q, value);
        }
        let rows = q.fetch_all(&self.pool).await?;
        Ok(rows.iter().map(super::sql::decode_row::<D>).collect::<Result<_, _>>()?)
    }

    /// The outbox's own search (the first sink's state).
    pub(super) async fn search_outbox(&self, search: &Search) -> Result<Found, StoreError> {
        let limit = search.limit.clamp(1, MAX_PAGE);
        let mut rows = self.search_rows(search, true, search.cursor.as_ref(), limit + 1).await?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let next = more.then(|| rows.last().map(|r| self.cursor_of(r))).flatten();
        Ok(Found { scanned: rows.len() as u64, rows, next })
    }

    /// Where a page ending at `row` goes on.
    pub(super) fn cursor_of(&self, row: &Row) -> Cursor {
        let key = if self.profile.key.is_text() { KeyValue::Text(row.event_id.clone()) } else { KeyValue::Int(row.id) };
        Cursor { created_at_ms: row.created_at_ms, key }
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_it_was_written() {
        for key in [KeyValue::Int(42), KeyValue::Text("evt~1".into()), KeyValue::Text(String::new())] {
            let cursor = Cursor { created_at_ms: 1_700_000_000_000, key };
            assert_eq!(Cursor::decode(&cursor.encode()), Ok(cursor));
        }
        for bad in ["", "12", "x~i1", "12~q1", "12~ix"] {
            assert!(Cursor::decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn statuses_are_written_from_the_enum() {
        assert_eq!(status_list(&[Status::Failed, Status::Retryable]), "'failed', 'retryable'");
    }
}
