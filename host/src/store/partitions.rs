//! Per-room order by partition ownership (engine v3): the leases on a sink's partitions,
//! the owner's read of its partitions' waiting rows, and its outcome writes, fenced by the
//! partition's epoch.
//!
//! A room, `(app_code, room_id)`, hashes to one of `P` partitions; `P` is fixed per sink when
//! its partition rows are first made. The database computes the hash where it has one
//! (PostgreSQL's `hashtextextended`, MySQL's `CRC32`), so that the read filters on it; on
//! SQLite this process does (FNV-1a), after reading.

use sqlx::{Database, Decode, Encode, Type};

use super::sinks::{KeyValue, bind_key};
use super::sql::for_every_dialect;
use super::sql::{Dialect, SqlStore, params};
use super::{Claimed, Lease, Mark, Outcome, Status, StoreError};

/// The partitions of a sink whose count neither its table nor its config says (see
/// `outbox_worker.partitions`).
pub const DEFAULT_PARTITIONS: u32 = 64;

/// How many times one heartbeat tries to take free partitions that other hosts took first.
const TAKE_ROUNDS: usize = 3;

/// A lease renewed within the last `1 / RENEWED_LATELY` of its length is not renewed again
/// by a heartbeat (see [`SqlStore::renew`]).
const RENEWED_LATELY: i64 = 8;

/// Where [`SqlStore::waiting_columns`] put `trace_context`: last.
pub(super) const WAITING_CONTEXT: usize = 13;

/// A partition held under a lease: outcome writes for its rows land only while the writer
/// still holds it under this epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The partition, `0..P`.
    pub partition: u32,
    /// Incremented by every takeover.
    pub epoch: i64,
}

/// One heartbeat of an owner: what it asks of the partition table.
#[derive(Debug, Clone)]
pub struct Heartbeat<'a> {
    /// The owner (the worker id).
    pub owner: &'a str,
    /// `P` for a sink whose partitions are not made yet (`outbox_worker.partitions`).
    pub partitions: u32,
    /// Events this owner has read and not yet recorded (shown by `status`).
    pub in_flight: i64,
    /// Now on the database's clock.
    pub now_ms: i64,
    /// How long a lease lasts from now.
    pub lease_ms: i64,
    /// Partitions this owner holds, to renew.
    pub renew: &'a [u32],
    /// Partitions this owner has drained and gives up.
    pub release: &'a [u32],
}

/// What a heartbeat left this owner with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// `P` of this sink.
    pub total: u32,
    /// The partitions it holds, with their epochs, in partition order.
    pub owned: Vec<Fence>,
    /// How many it should hold: about `P / N` over the `N` live owners.
    pub share: usize,
    /// Partitions its share says it should give up (it drains them first).
    pub surplus: Vec<u32>,
    /// Where its leases end, on the database's clock.
    pub lease_until_ms: i64,
}

/// One owner as the partition table shows it, for `status` and the page.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OwnerView {
    /// The sink's state table.
    pub sink_table: String,
    /// The owner (`<node_id>-<pid>-<hex>`).
    pub owner: String,
    /// The partitions it holds under a live lease.
    pub partitions: Vec<u32>,
    /// Events it had read and not yet recorded at its last heartbeat.
    pub in_flight: i64,
    /// Its heartbeat's lease end, UTC ms.
    pub lease_until_ms: i64,
}

/// A waiting row of an owned partition, as the owner reads it: the row as a claim would
/// return it, with what says whether it may start now.
#[derive(Debug, Clone)]
pub struct Waiting {
    /// The row (its lease names the owner and fences by partition).
    pub row: Claimed,
    /// `pending`, `retryable` or `delivering` (someone else's lease, maybe expired).
    pub status: Status,
    /// When a `retryable` row is due.
    pub next_retry_at_ms: i64,
    /// Where another worker's lease on a `delivering` row ends.
    pub lock_until_ms: i64,
    /// The row's key, where a read that stops at it goes on from.
    pub key: KeyValue,
}

impl Waiting {
    /// Whether the row may be delivered at `now_ms`: due, and not under another worker's
    /// live lease (room-service's Go worker during a cutover).
    pub fn due(&self, now_ms: i64) -> bool {
        match self.status {
            Status::Delivering => self.lock_until_ms <= now_ms,
            _ => self.next_retry_at_ms <= now_ms,
        }
    }
}

/// One read of an owner's partitions.
#[derive(Debug, Clone)]
pub struct OwnedRead<'a> {
    /// The owner, written into the rows' leases.
    pub owner: &'a str,
    /// `P`.
    pub total: u32,
    /// The partitions to read, with their epochs.
    pub owned: &'a [Fence],
    /// Start after this row (`created_at_ms`, key); `None`: from the oldest.
    pub after: Option<(i64, KeyValue)>,
    /// Rows at most.
    pub limit: u32,
}

/// The partition of a room on SQLite (FNV-1a over `app_code:room_id`).
pub fn partition_of(app_code: &str, room_id: &str, total: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in app_code.bytes().chain(std::iter::once(b':')).chain(room_id.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % u64::from(total.max(1))) as u32
}

/// The index of a table's unfinished rows by partition of `total`, then creation order.
pub(super) fn partition_index_name(table: &str, total: u32) -> String {
    format!("{table}_p{total}_idx")
}

/// The partition count `index` is for, if it is one of `table`'s partition indexes.
pub(super) fn partition_index_count(table: &str, index: &str) -> Option<u32> {
    index.strip_prefix(&format!("{table}_p"))?.strip_suffix("_idx")?.parse().ok()
}

/// Partition numbers as an SQL list: `3, 5, 8`.
/// Rows after the cursor `(created_at_ms, key)` bound at parameters `first` (twice, the
/// time) and `first + 2` (the key), as the database seeks to it ([`Dialect::after_cursor`]).
pub(super) fn after_cursor<D: Dialect>(key: &str, first: usize) -> String {
    D::after_cursor(key, &D::param(first), &D::param(first + 1), &D::param(first + 2))
}

pub(super) fn list(parts: &[u32]) -> String {
    parts.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// Each owner's share of `total` partitions among `owners` (sorted): `total / N`, and one
/// more for the first `total % N`.
pub fn share_of(owner: &str, owners: &[String], total: u32) -> usize {
    let n = owners.len().max(1);
    let index = owners.iter().position(|o| o == owner).unwrap_or(n - 1);
    let base = total as usize / n;
    base + usize::from(index < total as usize % n)
}

for_every_dialect!(impl {
    /// The outbox whose tables hold the leases (this table, or the one it is a copy of).
    pub(super) fn lease_tables(&self) -> (String, String) {
        let outbox = self.copy_of.as_deref().unwrap_or(&self.table);
        (format!("{outbox}_partitions"), format!("{outbox}_owners"))
    }

    /// The outbox's table of the hosts that deliver with `ordering: none`.
    fn claimers_table(&self) -> String {
        format!("{}_claimers", self.copy_of.as_deref().unwrap_or(&self.table))
    }

    /// One heartbeat: says this owner is there, renews its leases, gives up `release`, makes
    /// the sink's partitions if there are none, and takes free or expired ones up to its
    /// share. Returns what it holds afterwards.
    pub(super) async fn heartbeat(&self, beat: &Heartbeat<'_>) -> Result<Holding, StoreError> {
        self.renew(beat).await?;
        let (parts, _) = self.lease_tables();
        let (t, p) = (&self.table, D::param);
        let until = beat.now_ms + beat.lease_ms;
        for part in beat.release {
            let give_up = format!(
                "UPDATE {parts} SET owner = NULL, lease_until_ms = 0 WHERE sink_table = {} AND part = {} AND owner = {}",
                p(1),
                p(2),
                p(3)
            );
            sqlx::query(&give_up)
                .bind(t.clone())
                .bind(i64::from(*part))
                .bind(beat.owner.to_string())
                .execute(&self.pool)
                .await?;
        }
        let mut table = self.lease_rows(beat.now_ms).await?;
        if table.parts.is_empty() {
            self.make_partitions(beat.partitions).await?;
            table = self.lease_rows(beat.now_ms).await?;
        }
        let total = table.parts.len() as u32;
        let mut live: Vec<String> = table.live_owners;
        if !live.iter().any(|o| o == beat.owner) {
            live.push(beat.owner.to_string());
        }
        live.sort();
        let share = share_of(beat.owner, &live, total);
        let mut mine: Vec<u32> =
            table.parts.iter().filter(|r| r.owner.as_deref() == Some(beat.owner)).map(|r| r.part).collect();
        // Hosts that start together each begin at their own place (the i-th of N at partition
        // i·P/N), so that they do not all race for the same free partitions; a host that lost
        // races tries the partitions still free again, a few rounds, rather than a heartbeat
        // later.
        let place = live.iter().position(|o| o == beat.owner).unwrap_or(0) as u32 * total / live.len().max(1) as u32;
        let take = format!(
            "UPDATE {parts} SET owner = {}, epoch = epoch + 1, lease_until_ms = {} \
             WHERE sink_table = {} AND part = {} AND (owner IS NULL OR lease_until_ms <= {})",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5)
        );
        for _ in 0..TAKE_ROUNDS {
            if mine.len() >= share {
                break;
            }
            // Free first (never held, or given up), then expired.
            let mut free: Vec<&LeaseRow> =
                table.parts.iter().filter(|r| r.owner.is_none() || r.lease_until_ms <= beat.now_ms).collect();
            if free.is_empty() {
                break;
            }
            free.sort_by_key(|r| (r.owner.is_some(), (r.part + total - place % total.max(1)) % total.max(1)));
            for row in free.into_iter().take(share - mine.len()) {
                let taken = sqlx::query(&take)
                    .bind(beat.owner.to_string())
                    .bind(until)
                    .bind(t.clone())
                    .bind(i64::from(row.part))
                    .bind(beat.now_ms)
                    .execute(&self.pool)
                    .await?;
                if D::rows_affected(&taken) == 1 {
                    mine.push(row.part);
                }
            }
            table = self.lease_rows(beat.now_ms).await?;
        }
        let mine = || table.parts.iter().filter(|r| r.owner.as_deref() == Some(beat.owner));
        let mut owned: Vec<Fence> = mine().map(|r| Fence { partition: r.part, epoch: r.epoch }).collect();
        owned.sort_by_key(|f| f.partition);
        let surplus = owned.iter().skip(share).map(|f| f.partition).collect();
        // The earliest of the leases as the table has them: a lease renewed a moment ago
        // was not written again (see `renew`).
        let lease_until_ms = mine().map(|r| r.lease_until_ms).min().unwrap_or(until);
        Ok(Holding { total, owned, share, surplus, lease_until_ms })
    }

    /// The part of a heartbeat that keeps what this owner has: says it is there and renews
    /// the leases of `renew` (nothing given up, nothing taken).
    ///
    /// A lease renewed within the last eighth of its length ([`RENEWED_LATELY`]) is not
    /// written again: the quick heartbeats of a host's start (eight to a normal beat) wrote
    /// every partition row of every sink each time (the benchmark's four sinks: most of
    /// their row writes beyond the events'). A normal beat, a third of a lease after the
    /// last, renews all. The heartbeat reports the earliest lease as the table has it, so a
    /// delivery still starts only with `publish_timeout` and a second left: past a skipped
    /// renewal the next beat comes with more than half the lease left (7/8 - 1/3), which
    /// the shortest lease allowed, twice that, covers.
    pub(super) async fn renew(&self, beat: &Heartbeat<'_>) -> Result<(), StoreError> {
        let (parts, owners) = self.lease_tables();
        let (t, p) = (&self.table, D::param);
        let until = beat.now_ms + beat.lease_ms;
        let seen = format!(
            "UPDATE {owners} SET lease_until_ms = {}, in_flight = {} WHERE sink_table = {} AND owner = {}",
            p(1),
            p(2),
            p(3),
            p(4)
        );
        let seen = sqlx::query(&seen).bind(until).bind(beat.in_flight).bind(t.clone()).bind(beat.owner.to_string());
        if D::rows_affected(&seen.execute(&self.pool).await?) == 0 {
            let join = format!(
                "INSERT INTO {owners} (sink_table, owner, lease_until_ms, in_flight) VALUES ({})",
                params::<D>(1, 4)
            );
            sqlx::query(&join)
                .bind(t.clone())
                .bind(beat.owner.to_string())
                .bind(until)
                .bind(beat.in_flight)
                .execute(&self.pool)
                .await?;
        }
        // By primary key, so that InnoDB locks these rows only, not every row it scans.
        if !beat.renew.is_empty() {
            let renew = format!(
                "UPDATE {parts} SET lease_until_ms = {} \
                 WHERE sink_table = {} AND part IN ({}) AND owner = {} AND lease_until_ms < {}",
                p(1),
                p(2),
                list(beat.renew),
                p(3),
                p(4)
            );
            let lately = until - beat.lease_ms / RENEWED_LATELY;
            sqlx::query(&renew)
                .bind(until)
                .bind(t.clone())
                .bind(beat.owner.to_string())
                .bind(lately)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    /// Every partition row of this sink, and the owners whose heartbeat is live.
    async fn lease_rows(&self, now_ms: i64) -> Result<LeaseTable, StoreError> {
        let (parts, owners) = self.lease_tables();
        let p = D::param;
        let sql = format!(
            "SELECT part, owner, epoch, lease_until_ms FROM {parts} WHERE sink_table = {} \
             UNION ALL SELECT -1, owner, 0, lease_until_ms FROM {owners} WHERE sink_table = {} AND lease_until_ms > {}",
            p(1),
            p(2),
            p(3)
        );
        let rows = sqlx::query(&sql)
            .bind(self.table.clone())
            .bind(self.table.clone())
            .bind(now_ms)
            .fetch_all(&self.pool)
            .await?;
        let mut table = LeaseTable::default();
        for r in &rows {
            let (part, owner) = (D::int(r, 0)?, D::opt_text(r, 1)?);
            if part < 0 {
                table.live_owners.extend(owner);
            } else {
                table.parts.push(LeaseRow {
                    part: part as u32,
                    owner,
                    epoch: D::int(r, 2)?,
                    lease_until_ms: D::int(r, 3)?,
                });
            }
        }
        Ok(table)
    }

    /// Makes this sink's `total` partition rows, unowned (a host that got there first made
    /// them already: its count stands). The table's name is the host's own identifier.
    async fn make_partitions(&self, total: u32) -> Result<(), StoreError> {
        let (parts, _) = self.lease_tables();
        match sqlx::query(&self.insert_partitions(&parts, total)).execute(&self.pool).await {
            Ok(_) => Ok(()),
            Err(e) => match StoreError::from(e) {
                StoreError::Duplicate(_) => Ok(()),
                other => Err(other),
            },
        }
    }

    /// Makes this sink's partitions `total` anew, unless a host holds one under a live lease
    /// (then its owners are the error). Returns the count it had (0: none made yet).
    pub(super) async fn set_partition_count(
        &self,
        total: u32,
        now_ms: i64,
    ) -> Result<Result<u32, Vec<String>>, StoreError> {
        let mut tx = self.begin_writing().await?;
        let set = self.set_partition_count_on(&mut tx, total, now_ms).await?;
        tx.commit().await?;
        Ok(set)
    }

    /// [`Self::set_partition_count`] in the caller's transaction, which commits it.
    pub(super) async fn set_partition_count_on(
        &self,
        tx: &mut <D::Db as Database>::Connection,
        total: u32,
        now_ms: i64,
    ) -> Result<Result<u32, Vec<String>>, StoreError> {
        let (parts, _) = self.lease_tables();
        let t = &self.table;
        let rows = sqlx::query(&format!(
            "SELECT part, owner, lease_until_ms FROM {parts} WHERE sink_table = '{t}'{}",
            D::UPDATE_LOCK
        ))
        .fetch_all(&mut *tx)
        .await?;
        let mut live = Vec::new();
        for r in &rows {
            if let Some(owner) = D::opt_text(r, 1)?.filter(|_| D::int(r, 2).is_ok_and(|until| until > now_ms)) {
                live.push(owner);
            }
        }
        live.sort();
        live.dedup();
        if !live.is_empty() {
            return Ok(Err(live));
        }
        sqlx::query(&format!("DELETE FROM {parts} WHERE sink_table = '{t}'")).execute(&mut *tx).await?;
        sqlx::query(&self.insert_partitions(&parts, total)).execute(&mut *tx).await?;
        Ok(Ok(rows.len() as u32))
    }

    /// The `INSERT` of this sink's `total` unowned partition rows into `parts` (the table's
    /// name is the host's own identifier).
    fn insert_partitions(&self, parts: &str, total: u32) -> String {
        let values: Vec<String> = (0..total).map(|i| format!("('{}', {i})", self.table)).collect();
        format!("INSERT INTO {parts} (sink_table, part) VALUES {}", values.join(", "))
    }

    /// Gives up every partition `owner` holds and its place among the sink's hosts (a
    /// clean shutdown).
    pub(super) async fn leave(&self, owner: &str) -> Result<(), StoreError> {
        let (parts, owners) = self.lease_tables();
        let p = D::param;
        let give_up = format!(
            "UPDATE {parts} SET owner = NULL, lease_until_ms = 0 WHERE sink_table = {} AND owner = {}",
            p(1),
            p(2)
        );
        sqlx::query(&give_up).bind(self.table.clone()).bind(owner.to_string()).execute(&self.pool).await?;
        for table in [owners, self.claimers_table()] {
            let gone = format!("DELETE FROM {table} WHERE sink_table = {} AND owner = {}", p(1), p(2));
            sqlx::query(&gone).bind(self.table.clone()).bind(owner.to_string()).execute(&self.pool).await?;
        }
        Ok(())
    }

    /// See [`super::Partitions::announce`]. A `per_room` host says it is there in
    /// `<outbox>_owners` (as its heartbeat does) and is answered with the live
    /// `<outbox>_claimers`; an `ordering: none` host the other way round.
    pub(super) async fn announce_ordering(
        &self,
        owner: &str,
        ordering: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let (_, owners) = self.lease_tables();
        let claimers = self.claimers_table();
        let (mine, theirs, other) =
            if ordering == "none" { (&claimers, &owners, "per_room") } else { (&owners, &claimers, "none") };
        let (t, p) = (&self.table, D::param);
        let seen = format!(
            "UPDATE {mine} SET lease_until_ms = {} WHERE sink_table = {} AND owner = {}",
            p(1),
            p(2),
            p(3)
        );
        let seen = sqlx::query(&seen).bind(until_ms).bind(t.clone()).bind(owner.to_string());
        if D::rows_affected(&seen.execute(&self.pool).await?) == 0 {
            let join =
                format!("INSERT INTO {mine} (sink_table, owner, lease_until_ms) VALUES ({})", params::<D>(1, 3));
            sqlx::query(&join).bind(t.clone()).bind(owner.to_string()).bind(until_ms).execute(&self.pool).await?;
        }
        let live = format!(
            "SELECT owner FROM {theirs} WHERE sink_table = {} AND lease_until_ms > {} ORDER BY owner",
            p(1),
            p(2)
        );
        let rows = sqlx::query(&live).bind(t.clone()).bind(now_ms).fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok((D::text(r, 0)?, other.to_string()))).collect()
    }

    /// Every owner of this sink's partitions with a live heartbeat, and what it holds.
    pub(super) async fn owners(&self, now_ms: i64) -> Result<Vec<OwnerView>, StoreError> {
        let (parts, owners) = self.lease_tables();
        let p = D::param;
        let sql = format!(
            "SELECT o.owner, o.in_flight, o.lease_until_ms, p.part FROM {owners} o \
             LEFT JOIN {parts} p ON p.sink_table = o.sink_table AND p.owner = o.owner AND p.lease_until_ms > {} \
             WHERE o.sink_table = {} AND o.lease_until_ms > {} ORDER BY o.owner, p.part",
            p(1),
            p(2),
            p(3)
        );
        let rows = sqlx::query(&sql).bind(now_ms).bind(self.table.clone()).bind(now_ms).fetch_all(&self.pool).await?;
        let mut views: Vec<OwnerView> = Vec::new();
        for r in &rows {
            let owner = D::text(r, 0)?;
            if views.last().is_none_or(|v| v.owner != owner) {
                views.push(OwnerView {
                    sink_table: self.table.clone(),
                    owner,
                    partitions: Vec::new(),
                    in_flight: D::int(r, 1)?,
                    lease_until_ms: D::int(r, 2)?,
                });
            }
            if let Some(part) = D::opt_int(r, 3)? {
                views.last_mut().expect("pushed above").partitions.push(part as u32);
            }
        }
        Ok(views)
    }

    /// Up to `read.limit` rows of the owned partitions that are not finished (`pending`,
    /// `retryable`, or `delivering` under someone else's lease), in `(created_at_ms, key)`
    /// order after `read.after`, due or not (a room's earliest such row decides whether the
    /// room may go on).
    pub(super) async fn read_waiting(&self, read: &OwnedRead<'_>) -> Result<Page, StoreError> {
        let by_database = D::PARTITION_HASH.is_some();
        let everything = read.owned.len() as u32 >= read.total;
        if !everything
            && by_database
            && self.indexed_partitions.load(std::sync::atomic::Ordering::Relaxed) == read.total
        {
            return self.read_by_partition(read).await;
        }
        let only = (!everything && by_database).then(|| read.owned.iter().map(|f| f.partition).collect());
        let sql = self.waiting_read_sql(read.total, only);
        let statuses = D::WAITING;
        let (after_at, after_key) = read.after.clone().unwrap_or((i64::MIN, KeyValue::first(self.profile.key)));
        let mut q = sqlx::query(&sql);
        for _ in statuses {
            q = bind_key::<D>(q.bind(after_at).bind(after_at), &after_key).bind(i64::from(read.limit));
        }
        if statuses.len() > 1 {
            q = q.bind(i64::from(read.limit));
        }
        let rows = self.in_index_order(q).await?;
        let at_end = rows.len() < read.limit as usize;
        self.decode_page(read, by_database, &rows, at_end)
    }

    /// [`Self::read_waiting`] through the partition index (PostgreSQL): each owned
    /// partition's next rows after the cursor, each an ordered range of the index, at most
    /// `per` of each, merged in order. A partition that returned `per` rows may have more
    /// before another partition's last: the page ends at the earliest such partition's last
    /// row, which every partition has been read up to.
    async fn read_by_partition(&self, read: &OwnedRead<'_>) -> Result<Page, StoreError> {
        let limit = read.limit.max(1) as usize;
        // A little over each partition's share of the page: fewer rows read past the page's end.
        let per = ((limit + limit / 4).div_ceil(read.owned.len().max(1)) + 1).min(limit);
        let parts: Vec<u32> = read.owned.iter().map(|f| f.partition).collect();
        let sql = self.partition_read_sql(read.total);
        let (after_at, after_key) = read.after.clone().unwrap_or((i64::MIN, KeyValue::first(self.profile.key)));
        let parts = parts.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let q = bind_key::<D>(sqlx::query(&sql).bind(after_at).bind(after_at), &after_key).bind(parts).bind(per as i64);
        // Not pinned (see `in_index_order`): each partition's range is the index's first
        // rows at any estimate, and the merge must sort.
        let rows = q.fetch_all(&self.pool).await?;
        // Each partition's count and the position of its last row.
        let mut seen: std::collections::HashMap<i64, (usize, usize)> = std::collections::HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            let entry = seen.entry(D::int(r, 11)?).or_default();
            *entry = (entry.0 + 1, i);
        }
        let cut = seen.values().filter(|(n, _)| *n >= per).map(|(_, last)| last + 1).min();
        let keep = cut.unwrap_or(rows.len()).min(limit);
        let at_end = cut.is_none() && rows.len() <= limit;
        self.decode_page(read, true, &rows[..keep], at_end)
    }

    /// The statement of [`Self::read_by_partition`] for `total` partitions, whose hash is
    /// `expr`: built once per count. Everything else is bound, so that the text (and its
    /// prepared plan) depends only on the count.
    fn partition_read_sql(&self, total: u32) -> std::sync::Arc<str> {
        self.partition_read.get(total, || {
            let expr = D::partition_expr(total).unwrap_or_else(|| "0".into());
            D::partition_read_sql(&self.table, &self.waiting_columns(&expr, true), self.profile.key.column(), &expr)
                .expect("a database that keeps partition indexes reads by them")
        })
    }

    /// What an owner's read selects, with `part` as each row's partition (the envelope and
    /// the trace context `NULL` unless `envelopes`), as [`Self::decode_page`] reads it.
    pub(super) fn waiting_columns(&self, part: &str, envelopes: bool) -> String {
        let (id, key) = (super::key_as_id(self.profile.key), self.profile.key.column());
        let (envelope, context) =
            if envelopes { ("envelope", "trace_context") } else { ("NULL AS envelope", "NULL AS trace_context") };
        format!(
            "{id}, app_code, event_id, event_type, room_id, {envelope}, created_at_ms, retry_count, \
             status, next_retry_at_ms, lock_until_ms, {part} AS part_no, {key} AS sort_key, {context}"
        )
    }

    /// [`Self::read_waiting`]'s statement for `total` partitions, of which it reads `only`
    /// (`None`: every one), built once and kept. One ordered range of an index
    /// per condition of [`Dialect::WAITING`], never a sort: PostgreSQL's partial claim index,
    /// SQLite's partial pick index, and on MySQL one range per status, merged.
    fn waiting_read_sql(&self, total: u32, only: Option<Vec<u32>>) -> std::sync::Arc<str> {
        let key = self.profile.key.column();
        self.waiting_read.get((total, only.clone()), || {
            let expr = D::partition_expr(total);
            let only_sql = match (&expr, &only) {
                (Some(expr), Some(only)) => format!(" AND {expr} IN ({})", list(only)),
                _ => String::new(),
            };
            let columns = self.waiting_columns(expr.as_deref().unwrap_or("0"), true);
            let from = D::waiting_from(&self.table);
            let select = |status: &str, first: usize| {
                format!(
                    "SELECT {columns} FROM {from} WHERE {status} AND {}{only_sql} ORDER BY created_at_ms, {key} LIMIT {}",
                    after_cursor::<D>(key, first),
                    D::param(first + 3),
                )
            };
            match D::WAITING {
                [one] => select(one, 1),
                many => format!(
                    "SELECT * FROM ({}) AS waiting ORDER BY created_at_ms, sort_key LIMIT {}",
                    many.iter()
                        .enumerate()
                        .map(|(i, status)| format!("({})", select(status, 1 + 4 * i)))
                        .collect::<Vec<_>>()
                        .join(" UNION ALL "),
                    D::param(1 + 4 * many.len())
                ),
            }
        })
    }

    /// Runs an owner's read. On PostgreSQL the planner is told to walk the index in order:
    /// on a table without statistics (new, or never analyzed) it guesses that a handful of
    /// rows wait, and then prefers a bitmap scan and a sort of every waiting row to the
    /// first rows of the index (80 ms against 0.3 ms per read of 200 on a backlog of 50,000,
    /// until autovacuum first analyzes the table). Only for a read the index can answer
    /// unsorted: where a sort cannot be avoided, `enable_sort = off` prices the plan so high
    /// that the server compiles it (JIT) for every read, 150 ms each; `jit = off` guards
    /// against that too.
    async fn in_index_order<'q>(
        &self,
        q: sqlx::query::Query<'q, D::Db, <D::Db as Database>::Arguments<'q>>,
    ) -> Result<Vec<<D::Db as Database>::Row>, StoreError> {
        let Some(begin) = D::INDEX_ORDER_READ else { return Ok(q.fetch_all(&self.pool).await?) };
        let mut tx = self.pool.begin_with(begin).await?;
        let rows = q.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// A page of `rows` (in read order) for `read`; `by_database`: the rows carry their
    /// partition (else the host computes it).
    fn decode_page(
        &self,
        read: &OwnedRead<'_>,
        by_database: bool,
        rows: &[<D::Db as Database>::Row],
        at_end: bool,
    ) -> Result<Page, StoreError> {
        let epochs: std::collections::HashMap<u32, i64> = read.owned.iter().map(|f| (f.partition, f.epoch)).collect();
        let mut waiting = Vec::with_capacity(rows.len());
        let mut last = None;
        for r in rows {
            let (app_code, room_id) = (D::text(r, 1)?, D::text(r, 4)?);
            let partition =
                if by_database { D::int(r, 11)? as u32 } else { partition_of(&app_code, &room_id, read.total) };
            let key = if self.profile.key.is_text() {
                KeyValue::Text(D::text(r, 12)?)
            } else {
                KeyValue::Int(D::int(r, 12)?)
            };
            let status = D::text(r, 8)?;
            last = Some((D::int(r, 6)?, key.clone()));
            let Some(&epoch) = epochs.get(&partition) else {
                // Another owner's room: SQLite reads every partition.
                continue;
            };
            waiting.push(Waiting {
                row: Claimed {
                    id: D::int(r, 0)?,
                    app_code,
                    event_id: D::text(r, 2)?,
                    event_type: D::text(r, 3)?,
                    room_id,
                    envelope: D::bytes(r, 5)?,
                    created_at_ms: D::int(r, 6)?,
                    retry_count: i32::try_from(D::int(r, 7)?).unwrap_or(i32::MAX),
                    trace_context: D::opt_text(r, WAITING_CONTEXT)?,
                    lease: Lease {
                        worker_id: read.owner.to_string(),
                        lock_until_ms: i64::MAX,
                        fence: Some(Fence { partition, epoch }),
                    },
                    rescued: status == "delivering",
                },
                status: Status::parse(&status).unwrap_or(Status::Pending),
                next_retry_at_ms: D::int(r, 9)?,
                lock_until_ms: D::int(r, 10)?,
                key,
            });
        }
        Ok(Page { waiting, last, at_end })
    }

    /// The newest key given so far (0 in an empty table), where keys are given in insert
    /// order (`id`, SQLite's `rowid`); `None` where the key is the event id.
    pub(super) async fn newest(&self) -> Result<Option<i64>, StoreError> {
        if self.profile.key.is_text() {
            return Ok(None);
        }
        let sql = format!("SELECT COALESCE(MAX({}), 0) FROM {}", self.profile.key.column(), self.table);
        let row = sqlx::query(&sql).fetch_one(&self.pool).await?;
        Ok(Some(D::int(&row, 0)?))
    }

    /// Of `rooms`, those with a `failed` row, and the earliest such row's creation time: with
    /// `failed_blocks_room`, a room's later events wait behind it.
    pub(super) async fn failed_in(&self, rooms: &[(String, String)]) -> Result<Vec<(String, String, i64)>, StoreError> {
        if rooms.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT app_code, room_id, MIN(created_at_ms) FROM {} WHERE status = 'failed' AND room_id IN ({}) \
             GROUP BY app_code, room_id",
            self.table,
            params::<D>(1, rooms.len())
        );
        let mut q = sqlx::query(&sql);
        for (_, room) in rooms {
            q = q.bind(room.clone());
        }
        let rows = q.fetch_all(&self.pool).await?;
        let found = rows
            .iter()
            .map(|r| Ok((D::text(r, 0)?, D::text(r, 1)?, D::int(r, 2)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(found.into_iter().filter(|(app, room, _)| rooms.iter().any(|(a, r)| a == app && r == room)).collect())
    }

    /// Writes owned rows' outcomes in one transaction that first checks, under a share lock
    /// on the partition rows, that `owner` still holds each mark's partition under its epoch
    /// and lease; a mark whose partition it lost is not written. Returns the rows changed and
    /// the marks fenced off.
    pub(super) async fn mark_fenced(
        &self,
        owner: &str,
        marks: &[Mark],
        now_ms: i64,
    ) -> Result<(u64, Vec<usize>), StoreError>
    where
        for<'r> Vec<u8>: Encode<'r, D::Db> + Decode<'r, D::Db> + Type<D::Db>,
    {
        let (parts, _) = self.lease_tables();
        let _writing = self.writing().await;
        let mut tx = self.begin_writing().await?;
        // The marks' partitions only, by primary key: a share lock on exactly those rows.
        let mut parts_of: Vec<u32> = marks.iter().filter_map(|m| m.lease.fence).map(|f| f.partition).collect();
        parts_of.sort_unstable();
        parts_of.dedup();
        let mut held = std::collections::HashSet::new();
        if !parts_of.is_empty() {
            let check = format!(
                "SELECT part, epoch, owner, lease_until_ms FROM {parts} WHERE sink_table = {} AND part IN ({}){}",
                D::param(1),
                list(&parts_of),
                D::SHARE_LOCK
            );
            for r in sqlx::query(&check).bind(self.table.clone()).fetch_all(&mut *tx).await? {
                if D::opt_text(&r, 2)?.as_deref() == Some(owner) && D::int(&r, 3)? > now_ms {
                    held.insert(Fence { partition: D::int(&r, 0)? as u32, epoch: D::int(&r, 1)? });
                }
            }
        }
        let mut fenced = Vec::new();
        let mut changed = 0;
        let mut delivered: Vec<&Mark> = Vec::new();
        let failure = format!(
            "UPDATE {t} SET status = {}, retry_count = retry_count + {}, last_error = {}, next_retry_at_ms = {}, \
             worker_id = {no_worker}, lock_until_ms = 0, updated_at_ms = {}, plugin_digest = {} \
             WHERE {key} = {} AND status IN ('pending', 'retryable', 'delivering') \
             AND NOT (status = 'delivering' AND lock_until_ms > {})",
            D::param(1),
            D::param(2),
            D::param(3),
            D::param(4),
            D::param(5),
            D::param(6),
            D::param(7),
            D::param(8),
            t = self.table,
            no_worker = self.profile.no_worker,
            key = self.profile.key.column(),
        );
        for (i, m) in marks.iter().enumerate() {
            if !m.lease.fence.is_some_and(|f| held.contains(&f)) {
                fenced.push(i);
                continue;
            }
            if m.outcome == Outcome::Delivered {
                delivered.push(m);
                continue;
            }
            let q = sqlx::query(&failure)
                .bind(m.outcome.status().as_str().to_string())
                .bind(i64::from(m.outcome.counted()))
                .bind(m.outcome.error().map(|e| self.fit_error(e).into_owned()).unwrap_or_default())
                .bind(m.outcome.next_retry_at_ms())
                .bind(now_ms)
                .bind(m.plugin_digest.as_deref().unwrap_or("").to_string());
            let q = bind_key::<D>(q, &self.key_value(m)).bind(now_ms);
            changed += D::rows_affected(&q.execute(&mut *tx).await?);
        }
        // Delivered wins over anything but delivered, one statement per sink build.
        let mut digests: Vec<Option<&str>> = delivered.iter().map(|m| m.plugin_digest.as_deref()).collect();
        digests.sort_unstable();
        digests.dedup();
        for digest in digests {
            let ours: Vec<&&Mark> = delivered.iter().filter(|m| m.plugin_digest.as_deref() == digest).collect();
            let sql = self.sql.delivered.get(ours.len());
            let mut q = sqlx::query(&sql).bind(now_ms).bind(now_ms).bind(digest.unwrap_or("").to_string());
            for m in ours {
                q = bind_key::<D>(q, &self.key_value(m));
            }
            changed += D::rows_affected(&q.execute(&mut *tx).await?);
        }
        tx.commit().await?;
        Ok((changed, fenced))
    }

    /// The key a mark names its row by.
    fn key_value(&self, m: &Mark) -> KeyValue {
        if self.profile.key.is_text() { KeyValue::Text(m.event_id.clone()) } else { KeyValue::Int(m.id) }
    }
});

/// One page of an owner's read.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The owned partitions' rows, in order.
    pub waiting: Vec<Waiting>,
    /// The last row read (of any partition): where the next page starts.
    pub last: Option<(i64, KeyValue)>,
    /// Whether the read reached the end of the table's waiting rows.
    pub at_end: bool,
}

/// A partition row.
#[derive(Debug, Clone)]
struct LeaseRow {
    part: u32,
    owner: Option<String>,
    epoch: i64,
    lease_until_ms: i64,
}

/// The partition rows of a sink and its live owners.
#[derive(Debug, Default)]
struct LeaseTable {
    parts: Vec<LeaseRow>,
    live_owners: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_every_partition_and_differ_by_at_most_one() {
        let owners: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let shares: Vec<usize> = owners.iter().map(|o| share_of(o, &owners, 64)).collect();
        assert_eq!(shares, vec![22, 21, 21]);
        assert_eq!(share_of("a", &owners[..1], 64), 64);
    }

    #[test]
    fn a_room_keeps_its_partition_and_rooms_spread() {
        assert_eq!(partition_of("app", "room-1", 64), partition_of("app", "room-1", 64));
        let used: std::collections::HashSet<u32> =
            (0..1_000).map(|i| partition_of("app", &format!("room-{i}"), 64)).collect();
        assert_eq!(used.len(), 64, "1,000 rooms reach every one of 64 partitions");
    }
}
