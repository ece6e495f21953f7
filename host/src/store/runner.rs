//! The migration runner: applies `migrations/<dialect>/` (see [`super::migrate`]) to a table
//! under the dialect's migration lock, adopts a table made elsewhere (room-service's own, or
//! one a development version of the host made), installs the routines whose checksum
//! differs, and refuses a migration file changed after it was applied.

use sqlx::{Database, Executor};

use super::migrate::{self, BASELINE};
use super::schema::{self, Key};
use super::sql::for_every_dialect;
use super::sql::{Dialect, Lock, SqlStore, is_lock_timeout, params};
use super::{Schema, StoreError, now_ms};

/// What [`SqlStore::holding_migration_lock`] does while it holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Job {
    /// Applies the migrations not recorded yet, adopting a table made elsewhere.
    Migrate,
    /// Builds the index the outbox's consumers read by, or rebuilds an invalid one.
    ConsumerIndex,
    /// Builds the table's partition index for this many partitions (dropping those of
    /// other counts, and an invalid one).
    PartitionIndex(u32),
}

/// How long one DDL statement on a live table may wait for its lock before it gives up and
/// lets the inserts queued behind it through (it is tried again after as long).
const DDL_LOCK_TIMEOUT_MS: u64 = 1_000;

/// How long a schema change keeps retrying a lock that a long transaction holds.
const DDL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(600);

/// Each row's first column, read by `first`, with its checksum (the second column): the
/// rows of `<table>_migrations` and `<table>_routines`.
fn with_checksums<D: Dialect, T>(
    rows: &[<D::Db as Database>::Row],
    first: fn(&<D::Db as Database>::Row, usize) -> Result<T, sqlx::Error>,
) -> Result<Vec<(T, String)>, sqlx::Error> {
    rows.iter().map(|r| Ok((first(r, 0)?, D::text(r, 1)?))).collect()
}

/// What `<table>_migrations` says.
enum Recorded {
    /// No bookkeeping yet.
    Nothing,
    /// A development version's, without checksums: the versions it applied.
    Development(Vec<i64>),
    /// This version's: each applied migration with its file's checksum.
    Checked(Vec<(i64, String)>),
}

for_every_dialect!(impl {
    /// Runs `job` on one connection that holds the table's migration lock. Each DDL statement
    /// waits at most [`DDL_LOCK_TIMEOUT_MS`] for its lock, so that a long transaction on the
    /// table (a producer's) never queues every insert behind a waiting `ALTER`; the job is
    /// then tried again, saying what holds the table, for up to [`DDL_PATIENCE`].
    pub(super) async fn holding_migration_lock(&self, job: Job) -> Result<super::Migrated, StoreError> {
        let started = std::time::Instant::now();
        // Whether a try found no table and made it: a try cut short after that (an index
        // built online waits past the lock timeout for a transaction anywhere in the
        // database) leaves the table there, and the next try must still say it was made here.
        let mut made = false;
        loop {
            let done = self.locked_once(job, &mut made).await;
            match done {
                Err(e) if is_lock_timeout(&e) && started.elapsed() < DDL_PATIENCE => {
                    let holders = self.lock_holders().await.unwrap_or_else(|e| format!("(could not tell: {e})"));
                    tracing::warn!(
                        table = %self.table,
                        ?job,
                        holders = %holders,
                        "waiting for a lock to change the table's schema: a transaction holds it; inserts go on meanwhile, and the change is tried again in a second"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(DDL_LOCK_TIMEOUT_MS)).await;
                }
                other => return other,
            }
        }
    }

    /// One try of [`Self::holding_migration_lock`].
    async fn locked_once(&self, job: Job, made: &mut bool) -> Result<super::Migrated, StoreError> {
        let lock = D::migration_lock(&self.table);
        let mut conn = self.pool.acquire().await?;
        if !self.take_lock(&mut conn, &lock).await? {
            return Err(StoreError::Migration(format!("could not take the lock {:?}", lock.take)));
        }
        let [limit, unlimit] = D::ddl_lock_timeout(DDL_LOCK_TIMEOUT_MS).unwrap_or_default();
        let done = async {
            if !limit.is_empty() {
                Executor::execute(&mut *conn, limit.as_str()).await?;
            }
            match job {
                Job::Migrate => self.apply_migrations(&mut conn, made).await,
                Job::ConsumerIndex => self.build_consumer_index(&mut conn).await.map(|()| super::Migrated::default()),
                Job::PartitionIndex(total) => {
                    D::build_partition_index(self, &mut conn, total).await.map(|()| super::Migrated::default())
                }
            }
        }
        .await;
        if !unlimit.is_empty() {
            let _ = Executor::execute(&mut *conn, unlimit.as_str()).await;
        }
        self.release_lock(&mut conn, &lock, done.is_ok()).await?;
        done
    }

    /// Takes `lock` on `conn`: `false` if it was not to be had (a checked lock that did not
    /// return 1 in its time). After an error or `false`, nothing of it is held.
    pub(super) async fn take_lock(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        lock: &Lock,
    ) -> Result<bool, StoreError> {
        if !lock.checked {
            if let Err(e) = Executor::execute(&mut *conn, lock.take.as_str()).await {
                let _ = Executor::execute(&mut *conn, lock.undo.as_str()).await;
                return Err(e.into());
            }
            return Ok(true);
        }
        let mut tries = if lock.polled { 1_200 } else { 1 };
        loop {
            if D::opt_int(&sqlx::query(&lock.take).fetch_one(&mut *conn).await?, 0)? == Some(1) {
                return Ok(true);
            }
            tries -= 1;
            if tries == 0 {
                return Ok(false);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Ends what [`Self::take_lock`] began: `keep` after success (`kept`), else `undo`.
    pub(super) async fn release_lock(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        lock: &Lock,
        kept: bool,
    ) -> Result<(), StoreError> {
        Executor::execute(&mut *conn, if kept { lock.keep.as_str() } else { lock.undo.as_str() }).await?;
        Ok(())
    }

    /// Whether the table is as this build would leave it: every migration applied with its
    /// file's checksum, nothing to add, and every routine installed as rendered. Then
    /// `migrate` runs no DDL, so a host whose user may only read and write rows can start.
    pub(super) async fn schema_current(&self) -> Result<bool, StoreError> {
        let t = &self.table;
        let Ok(rows) =
            sqlx::query(&format!("SELECT version, checksum FROM {t}_migrations")).fetch_all(&self.pool).await
        else {
            return Ok(false);
        };
        let applied = with_checksums::<D, _>(&rows, D::int)?;
        if !migrate::up_to_date(D::migrator(), &applied) {
            return Ok(false);
        }
        let Some(review) = self.review(None).await?.filter(|r| r.additions.is_empty() && r.problems.is_empty()) else {
            return Ok(false);
        };
        let Ok(rows) = sqlx::query(&format!("SELECT name, checksum FROM {t}_routines")).fetch_all(&self.pool).await
        else {
            return Ok(false);
        };
        let installed = with_checksums::<D, _>(&rows, D::text)?;
        Ok(migrate::routines(D::BACKEND, t, review.profile.key)
            .iter()
            .all(|r| installed.iter().any(|(name, sum)| name == r.name && *sum == r.checksum)))
    }

    /// What `<table>_migrations` says, read on `conn`.
    async fn recorded(&self, conn: &mut <D::Db as Database>::Connection) -> Result<Recorded, StoreError> {
        let t = &self.table;
        let bookkeeping = format!("{t}_migrations");
        let Some(info) = self.describe_named(&mut *conn, &bookkeeping).await? else { return Ok(Recorded::Nothing) };
        if info.columns.iter().any(|c| c.name == "checksum") {
            let rows =
                sqlx::query(&format!("SELECT version, checksum FROM {bookkeeping}")).fetch_all(&mut *conn).await?;
            let applied = with_checksums::<D, _>(&rows, D::int)?;
            return Ok(Recorded::Checked(applied));
        }
        let rows = sqlx::query(&format!("SELECT version FROM {bookkeeping}")).fetch_all(&mut *conn).await?;
        Ok(Recorded::Development(rows.iter().map(|r| D::int(r, 0)).collect::<Result<_, _>>()?))
    }

    /// The migrations not recorded yet, applied on `conn` (which holds the migration lock).
    /// A table that is already there is adopted: room-service's own, or one a development
    /// version of the host made (its bookkeeping has no checksums). Then the routines are
    /// installed where their checksum differs. `made_here`: an earlier try of this call made
    /// the table (set when this one does).
    pub(super) async fn apply_migrations(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        made_here: &mut bool,
    ) -> Result<super::Migrated, StoreError> {
        let t = &self.table;
        let review = self.review(None).await?;
        if let Some(review) = review.as_ref().filter(|r| !r.problems.is_empty()) {
            return Err(StoreError::Migration(format!(
                "table {t} exists but cannot be adopted as it is; nothing was changed:\n  - {}",
                review.problems.join("\n  - ")
            )));
        }
        let recorded = self.recorded(&mut *conn).await?;
        if let Recorded::Checked(applied) = &recorded
            && let Some(changed) = migrate::changed(D::migrator(), D::BACKEND, t, applied)
        {
            return Err(StoreError::Migration(changed));
        }
        let created = review.is_none();
        *made_here |= created;
        let key = review.as_ref().map_or(Key::Id, |r| r.profile.key);
        if let Some(review) = &review {
            self.add(&mut *conn, review).await?;
        }
        let (applied, development) = match recorded {
            Recorded::Nothing => (Vec::new(), None),
            Recorded::Checked(applied) => (applied, None),
            // A development version's bookkeeping makes way for this one's; its table is
            // adopted as it is (what it lacks was added above, what it has left over goes below).
            Recorded::Development(versions) => {
                Executor::execute(&mut *conn, format!("DROP TABLE {t}_migrations").as_str()).await?;
                (Vec::new(), Some(versions))
            }
        };
        for create in [
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_migrations (version BIGINT PRIMARY KEY, description VARCHAR(255) NOT NULL, \
                 applied_at_ms BIGINT NOT NULL, checksum VARCHAR(128) NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {t}_routines (name VARCHAR(64) PRIMARY KEY, checksum VARCHAR(128) NOT NULL, \
                 installed_at_ms BIGINT NOT NULL)"
            ),
        ] {
            Executor::execute(&mut *conn, create.as_str()).await?;
        }
        let record = format!(
            "INSERT INTO {t}_migrations (version, description, applied_at_ms, checksum) VALUES ({})",
            params::<D>(1, 4)
        );
        for step in migrate::steps(D::migrator(), t) {
            if applied.iter().any(|(v, _)| *v == step.version) {
                continue;
            }
            let (sql, description) = if step.version == BASELINE {
                let (_, bookkeeping) = step.parts();
                let sql = if created { step.sql.as_str() } else { bookkeeping };
                let description = match (&development, created) {
                    (Some(versions), _) => format!(
                        "{}, adopting a table of development versions {}-{}",
                        step.description,
                        versions.iter().min().unwrap_or(&0),
                        versions.iter().max().unwrap_or(&0)
                    ),
                    (None, false) => format!("{}, adopting an existing table", step.description),
                    (None, true) => step.description.clone(),
                };
                (sql, description)
            } else {
                (step.sql.as_str(), step.description.clone())
            };
            if !sql.trim().is_empty() {
                Executor::execute(&mut *conn, sql)
                    .await
                    .map_err(|e| StoreError::Migration(format!("{}: {e}", step.file(D::BACKEND))))?;
            }
            sqlx::query(&record)
                .bind(step.version)
                .bind(description)
                .bind(now_ms())
                .bind(step.checksum.clone())
                .execute(&mut *conn)
                .await?;
        }
        // What the versions do not create (indexes built online on a live table), seen
        // on this connection (SQLite's changes are not committed yet).
        if let Some(info) = self.describe_on(&mut *conn).await? {
            let review = schema::review(D::BACKEND, t, &info, None);
            self.add(&mut *conn, &review).await?;
            self.retire(&mut *conn, &info).await?;
        }
        self.install_routines(&mut *conn, key).await?;
        // The partition index for the sink's partition count (the default where its
        // partitions are not made yet): built on a new table before it has rows, so that
        // no host has to build it under load.
        let (parts, _) = self.lease_tables();
        let made = format!("SELECT COUNT(*) FROM {parts} WHERE sink_table = '{t}'");
        let total = D::int(&sqlx::query(&made).fetch_one(&mut *conn).await?, 0)?;
        let total = if total > 0 { total as u32 } else { super::partitions::DEFAULT_PARTITIONS };
        D::build_partition_index(self, &mut *conn, total).await?;
        // The console's search indexes, the consumers' among them (an invalid one, from a
        // build cut short, is made again).
        self.build_search_indexes(&mut *conn).await?;
        Ok(super::Migrated { created: *made_here })
    }

    /// Drops what earlier versions made and this one no longer uses, online like the
    /// additions: the room order index of the row claims that kept room order (every insert
    /// paid for it; their claim routines are replaced by [`Self::install_routines`]), and
    /// the fan-out's index of rows not copied yet to the sinks' copies (decision 0203: a
    /// sink after the first reads the outbox itself, and every new row would enter it).
    async fn retire(
        &self,
        conn: &mut <D::Db as Database>::Connection,
        info: &schema::TableInfo,
    ) -> Result<(), StoreError> {
        let t = &self.table;
        for index in [format!("{t}_room_order_idx"), format!("{t}_fanout_idx")] {
            if !info.indexes.iter().any(|i| i.name.eq_ignore_ascii_case(&index)) {
                continue;
            }
            let drop = D::drop_index_online(t, &index);
            Executor::execute(&mut *conn, drop.as_str()).await.map_err(|e| {
                StoreError::Migration(format!("dropping {index}, which this version no longer uses: {e}"))
            })?;
            tracing::info!(table = %t, index, "dropped an index of an earlier version that this one no longer uses");
        }
        Ok(())
    }

    /// Installs each of the dialect's routines, rendered for this table and `key`, whose
    /// checksum in `<table>_routines` differs (or is not there), and records it.
    async fn install_routines(&self, conn: &mut <D::Db as Database>::Connection, key: Key) -> Result<(), StoreError> {
        let t = &self.table;
        let rows = sqlx::query(&format!("SELECT name, checksum FROM {t}_routines")).fetch_all(&mut *conn).await?;
        let installed = with_checksums::<D, _>(&rows, D::text)?;
        let forget = format!("DELETE FROM {t}_routines WHERE name = {}", D::param(1));
        let record =
            format!("INSERT INTO {t}_routines (name, checksum, installed_at_ms) VALUES ({})", params::<D>(1, 3));
        for routine in migrate::routines(D::BACKEND, t, key) {
            if installed.iter().any(|(name, sum)| name == routine.name && *sum == routine.checksum) {
                continue;
            }
            Executor::execute(&mut *conn, routine.sql.as_str())
                .await
                .map_err(|e| StoreError::Migration(format!("installing the routine {} of {t}: {e}", routine.name)))?;
            sqlx::query(&forget).bind(routine.name.to_string()).execute(&mut *conn).await?;
            sqlx::query(&record)
                .bind(routine.name.to_string())
                .bind(routine.checksum)
                .bind(now_ms())
                .execute(&mut *conn)
                .await?;
            tracing::info!(table = %t, routine = routine.name, "installed a routine (it was missing or differed)");
        }
        Ok(())
    }

    /// Finds or builds the partition index for `total` (see [`Store::index_partitions`]).
    pub(super) async fn partition_index(&self, total: u32) -> Result<bool, StoreError>
    where
        Self: super::Store,
    {
        if !D::PARTITION_INDEX {
            return Ok(false);
        }
        if self.indexed_partitions.load(std::sync::atomic::Ordering::Relaxed) == total {
            return Ok(true);
        }
        // Only valid indexes are described; an invalid one of this count is rebuilt.
        let indexes = super::Schema::describe(self).await?.map(|info| info.indexes).unwrap_or_default();
        let wanted = super::partitions::partition_index_name(&self.table, total);
        let ours = |name: &str| super::partitions::partition_index_count(&self.table, name);
        let done = indexes.iter().any(|i| i.name == wanted)
            && !indexes.iter().any(|i| ours(&i.name).is_some_and(|n| n != total));
        if !done {
            self.holding_migration_lock(Job::PartitionIndex(total)).await?;
            tracing::info!(table = %self.table, index = %wanted, "built the partition index: an owner of some partitions reads their rows only");
        }
        self.indexed_partitions.store(total, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    /// What holds locks on the table now, for the log: each session's id, age and state.
    async fn lock_holders(&self) -> Result<String, StoreError> {
        let Some(sql) = D::lock_holders_sql(&self.table) else { return Ok("another writer".into()) };
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        let holders = rows.iter().map(|r| D::text(r, 0)).collect::<Result<Vec<_>, _>>()?;
        Ok(if holders.is_empty() { "none found by now".into() } else { holders.join(", ") })
    }
});
