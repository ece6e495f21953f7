//! [`SqlStore`] as a [`Store`]: each method once for every dialect, over the statements of
//! `sql.rs` and the roles' files (`sinks.rs`, `partitions.rs`, `consumers.rs`, `runner.rs`). This is the one
//! file of the store that looks at all of them; none of them looks back at it.

use async_trait::async_trait;
use sqlx::Database;

use super::schema::TableInfo;
use super::sql::for_every_dialect;
use super::sql::*;
use super::{
    Backend, Claimed, Claims, Consumers, Held, Inspection, Mark, Minute, NewEvent, Outcome, Partitions, Producer,
    RetryFilter, Row, Schema, SinkRegistry, Stats, Store, StoreError, now_ms,
};

for_every_dialect!(
    #[async_trait]
    impl Schema {
        async fn migrate(&self) -> Result<super::Migrated, StoreError> {
            if self.schema_current().await? {
                return Ok(super::Migrated::default());
            }
            // Apply what is not recorded yet, holding the dialect's migration lock.
            self.holding_migration_lock(super::runner::Job::Migrate).await
        }

        fn backend(&self) -> Backend {
            D::BACKEND
        }

        fn table(&self) -> &str {
            &self.table
        }

        async fn describe(&self) -> Result<Option<TableInfo>, StoreError> {
            self.describe_on(&mut *self.pool.acquire().await?).await
        }

        async fn ping(&self) -> Result<(), StoreError> {
            sqlx::query("SELECT 1").execute(&self.pool).await?;
            Ok(())
        }

        async fn clock_ms(&self) -> Result<i64, StoreError> {
            let Some(sql) = D::clock_sql() else { return Ok(now_ms()) };
            // Timed on a connection already held: a wait for the pool (every connection
            // busy behind a backlog) is not taken for the round trip.
            let mut connection = self.pool.acquire().await?;
            let before = now_ms();
            let read = D::int(&sqlx::query(sql).fetch_one(&mut *connection).await?, 0)?;
            // The server read its clock about halfway through the round trip.
            Ok(read + (now_ms() - before) / 2)
        }

        async fn close(&self) {
            self.pool.close().await;
        }
    }
);

for_every_dialect!(
    #[async_trait]
    impl Claims {
        async fn claim(
            &self,
            worker_id: &str,
            now_ms: i64,
            lock_until_ms: i64,
            limit: u32,
        ) -> Result<Vec<Claimed>, StoreError> {
            let _writing = self.writing().await;
            D::claim_rows(self, worker_id, now_ms, lock_until_ms, limit).await
        }

        async fn mark(&self, marks: &[Mark], now_ms: i64) -> Result<u64, StoreError> {
            let _writing = self.writing().await;
            let mut changed = 0;
            // One write per build of the sink that produced the outcomes: one, unless a reload
            // happened between them.
            let mut digests: Vec<Option<&str>> = marks.iter().map(|m| m.plugin_digest.as_deref()).collect();
            digests.sort_unstable();
            digests.dedup();
            for digest in digests {
                let ours = |m: &&Mark| m.plugin_digest.as_deref() == digest;
                let delivered: Vec<&Mark> =
                    marks.iter().filter(|m| m.outcome == Outcome::Delivered).filter(ours).collect();
                // Delivered wins: any row not yet delivered, whoever holds it.
                if let Some(n) = D::mark_delivered(self, &delivered, now_ms).await? {
                    changed += n;
                } else if !delivered.is_empty() {
                    let sql = self.sql.delivered.get(delivered.len());
                    let mut q = sqlx::query(&sql).bind(now_ms).bind(now_ms).bind(digest.unwrap_or("").to_string());
                    for m in &delivered {
                        q = if self.profile.key.is_text() { q.bind(m.event_id.as_str()) } else { q.bind(m.id) };
                    }
                    changed += D::rows_affected(&q.execute(&self.pool).await?);
                }
                let failed: Vec<&Mark> =
                    marks.iter().filter(|m| m.outcome != Outcome::Delivered).filter(ours).collect();
                if !failed.is_empty() {
                    changed += D::mark_failed(self, &failed, now_ms).await?;
                }
            }
            Ok(changed)
        }

        async fn release(&self, rows: &[Held], now_ms: i64) -> Result<u64, StoreError> {
            if rows.is_empty() {
                return Ok(0);
            }
            let _writing = self.writing().await;
            D::release_rows(self, rows, now_ms).await
        }

        async fn has_pending(&self) -> Result<bool, StoreError> {
            Ok(sqlx::query(&self.sql.has_pending).fetch_optional(&self.pool).await?.is_some())
        }

        fn is_consumer(&self) -> bool {
            false
        }

        fn inserted(&self) -> std::sync::Arc<tokio::sync::Notify> {
            self.inserted.clone()
        }

        fn listen_for_inserts(
            &self,
            wake: std::sync::Arc<tokio::sync::Notify>,
            stop: tokio_util::sync::CancellationToken,
        ) -> bool {
            D::listen_for_inserts(self, wake, stop)
        }
    }
);

for_every_dialect!(
    #[async_trait]
    impl Producer {
        async fn insert(&self, events: &[NewEvent]) -> Result<(), StoreError> {
            let _writing = self.writing().await;
            let mut tx = self.pool.begin().await?;
            // Several rows per statement; a clash names the event when it can.
            for chunk in events.chunks(super::INSERT_CHUNK) {
                let traced = chunk.iter().any(|e| e.trace_context.is_some());
                let sql =
                    if traced { self.sql.insert.get(chunk.len()) } else { self.sql.insert_untraced.get(chunk.len()) };
                let mut q = sqlx::query(&sql);
                for e in chunk {
                    q = q
                        .bind(e.app_code.clone())
                        .bind(e.event_id.clone())
                        .bind(e.event_type.clone())
                        .bind(e.room_id.clone())
                        .bind(e.status.as_str().to_string())
                        .bind(e.envelope.clone())
                        .bind(e.created_at_ms);
                    if traced {
                        q = q.bind(e.trace_context.clone());
                    }
                }
                let named = match chunk {
                    [one] => one.event_id.clone(),
                    [first, .., last] => format!("(one of {} … {})", first.event_id, last.event_id),
                    [] => String::new(),
                };
                q.execute(&mut *tx).await.map_err(|err| super::name_duplicate(err, &named))?;
            }
            tx.commit().await?;
            self.inserted.notify_one();
            Ok(())
        }
    }
);

for_every_dialect!(
    #[async_trait]
    impl Inspection {
        async fn get(&self, event_id: &str) -> Result<Option<Row>, StoreError> {
            let row = sqlx::query(&self.sql.get).bind(event_id.to_string()).fetch_optional(&self.pool).await?;
            Ok(row.as_ref().map(decode_row::<D>).transpose()?)
        }

        async fn stats(&self) -> Result<Stats, StoreError> {
            let [counts, oldest, errors] = &self.sql.stats;
            let pairs = |rows: Vec<<D::Db as Database>::Row>| -> Result<Vec<(String, i64)>, sqlx::Error> {
                rows.iter().map(|r| Ok((D::text(r, 0)?, D::int(r, 1)?))).collect()
            };
            let counts = pairs(sqlx::query(counts).fetch_all(&self.pool).await?)?;
            let oldest = D::opt_int(&sqlx::query(oldest).fetch_one(&self.pool).await?, 0)?;
            let errors = pairs(sqlx::query(errors).fetch_all(&self.pool).await?)?;
            let last_minute: i64 =
                sqlx::query_scalar(&self.sql.last_minute).bind(now_ms() - 60_000).fetch_one(&self.pool).await?;
            Ok(super::stats_from(counts, oldest, errors, last_minute))
        }

        async fn history(&self, since_ms: i64) -> Result<Vec<Minute>, StoreError> {
            let rows = sqlx::query(&self.sql.history).bind(since_ms).bind(since_ms).fetch_all(&self.pool).await?;
            let minute = |r: &<D::Db as Database>::Row| -> Result<Minute, sqlx::Error> {
                Ok(Minute { start_ms: D::int(r, 0)?, delivered: D::int(r, 1)?, failed: D::int(r, 2)? })
            };
            Ok(rows.iter().map(minute).collect::<Result<_, _>>()?)
        }

        async fn recent_failures(&self, limit: u32) -> Result<Vec<Row>, StoreError> {
            let rows = sqlx::query(&self.sql.recent_failures).bind(i64::from(limit)).fetch_all(&self.pool).await?;
            Ok(rows.iter().map(decode_row::<D>).collect::<Result<_, _>>()?)
        }

        async fn neighbours(&self, row: &Row) -> Result<[Option<Row>; 2], StoreError> {
            let key = if self.profile.key.is_text() {
                super::KeyValue::Text(row.event_id.clone())
            } else {
                super::KeyValue::Int(row.id)
            };
            let mut found = [None, None];
            for (sql, slot) in self.sql.neighbours.iter().zip(&mut found) {
                let q = sqlx::query(sql).bind(row.room_id.clone()).bind(row.created_at_ms).bind(row.created_at_ms);
                let next = super::sinks::bind_key::<D>(q, &key).fetch_optional(&self.pool).await?;
                *slot = next.as_ref().map(decode_row::<D>).transpose()?;
            }
            Ok(found)
        }

        async fn search(&self, search: &super::Search) -> Result<super::Found, StoreError> {
            self.search_outbox(search).await
        }

        async fn count_failed(&self, filter: &RetryFilter) -> Result<i64, StoreError> {
            let (filter, value) = failed_filter::<D>(filter, 1);
            let sql = format!("SELECT COUNT(*) FROM {}{filter}", self.table);
            let mut q = sqlx::query_scalar(&sql);
            if let Some(value) = value {
                q = q.bind(value);
            }
            Ok(q.fetch_one(&self.pool).await?)
        }

        async fn retry_failed(&self, filter: &RetryFilter, now_ms: i64) -> Result<u64, StoreError> {
            let (filter, value) = failed_filter::<D>(filter, 2);
            let sql = format!("{}{filter}", self.sql.retry_set);
            let mut q = sqlx::query(&sql).bind(now_ms);
            if let Some(value) = value {
                q = q.bind(value);
            }
            Ok(D::rows_affected(&q.execute(&self.pool).await?))
        }

        async fn purge_delivered(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
            // Picks in key order, past the rows a sink after the first still needs, until
            // `limit` rows are deleted or the picks run out.
            let mut after = super::KeyValue::first(self.profile.key);
            let mut deleted = 0;
            loop {
                let q = sqlx::query(&self.sql.purge_pick).bind(before_ms).bind(before_ms);
                let q = super::sinks::bind_key::<D>(q, &after).bind(i64::from(limit));
                let picked = q.fetch_all(&self.pool).await?;
                let Some(last) = picked.last() else { return Ok(deleted) };
                after = self.key_of(last)?;
                let needed = self.still_needed(&picked).await?;
                let doomed: Vec<_> =
                    picked.iter().filter(|row| D::text(row, 1).is_ok_and(|id| !needed.contains(&id))).collect();
                if !doomed.is_empty() {
                    let delete = self.sql.purge_delete.get(doomed.len());
                    let keys = doomed.iter().map(|row| self.key_of(row)).collect::<Result<Vec<_>, _>>()?;
                    // Under the registry's lock, so that a sink registered meanwhile either is
                    // seen by the DELETE's own check or comes after the rows are gone. Its
                    // check reads the consumers' tables, which their settles write: a deadlock
                    // the database breaks is tried again.
                    let _writing = self.writing().await;
                    deleted += retrying_deadlocks(std::time::Duration::from_millis(20), || async {
                        let mut conn = self.pool.acquire().await?;
                        self.lock_registry(&mut conn).await?;
                        let mut q = sqlx::query(&delete);
                        for key in &keys {
                            q = super::sinks::bind_key::<D>(q, key);
                        }
                        let done = q.execute(&mut *conn).await;
                        self.unlock_registry(&mut conn, done.is_ok()).await?;
                        Ok::<_, StoreError>(D::rows_affected(&done?))
                    })
                    .await?;
                }
                if picked.len() < limit as usize || deleted >= u64::from(limit) {
                    return Ok(deleted);
                }
            }
        }
    }
);

for_every_dialect!(
    #[async_trait]
    impl SinkRegistry {
        async fn sinks(&self) -> Result<Vec<super::RegisteredSink>, StoreError> {
            self.registered_sinks().await
        }

        async fn register_sink(
            &self,
            name: &str,
            start_from_ms: i64,
            may_be_first: bool,
            now_ms: i64,
        ) -> Result<super::RegisteredSink, StoreError> {
            let sink = self.register(name, start_from_ms, may_be_first, now_ms).await?;
            if !sink.is_first(&self.table) && !self.consumer_index_ok().await? {
                self.holding_migration_lock(super::runner::Job::ConsumerIndex).await?;
            }
            Ok(sink)
        }

        async fn sink_store(
            self: std::sync::Arc<Self>,
            sink: &super::RegisteredSink,
        ) -> Result<std::sync::Arc<dyn Store>, StoreError> {
            if sink.is_first(&self.table) {
                return Ok(self);
            }
            Ok(std::sync::Arc::new(super::consumer_store::ConsumerStore::new(self, sink)))
        }

        async fn count_replayable(&self, filter: &super::ReplayFilter) -> Result<i64, StoreError> {
            let (conditions, values) = filter.conditions("", D::param, 1);
            let sql =
                format!("SELECT COUNT(*) FROM {} WHERE status IN ('delivered', 'failed'){conditions}", self.table);
            let mut q = sqlx::query(&sql).bind(filter.from_ms).bind(filter.to_ms.unwrap_or(i64::MAX));
            for value in values {
                q = q.bind(value);
            }
            Ok(D::int(&q.fetch_one(&self.pool).await?, 0)?)
        }

        async fn replay(
            &self,
            filter: &super::ReplayFilter,
            now_ms: i64,
            after: Option<super::KeyValue>,
            limit: u32,
        ) -> Result<super::Step, StoreError> {
            let key = self.profile.key.column();
            let keys = self.pick_for_step("'delivered', 'failed'", filter, after, limit).await?;
            if keys.is_empty() {
                return Ok(super::Step { rows: 0, next: None });
            }
            let _writing = self.writing().await;
            let update = format!(
                "{} WHERE status IN ('delivered', 'failed') AND {key} IN ({})",
                self.sql.retry_set,
                params::<D>(2, keys.len())
            );
            let mut q = sqlx::query(&update).bind(now_ms);
            for k in &keys {
                q = super::sinks::bind_key::<D>(q, k);
            }
            let rows = D::rows_affected(&q.execute(&self.pool).await?);
            Ok(super::Step { rows, next: if keys.len() < limit as usize { None } else { keys.last().cloned() } })
        }

        async fn discard(
            &self,
            filter: &super::ReplayFilter,
            reason: &str,
            now_ms: i64,
            after: Option<super::KeyValue>,
            limit: u32,
        ) -> Result<super::Step, StoreError> {
            let key = self.profile.key.column();
            let keys = self.pick_for_step("'pending', 'retryable'", filter, after, limit).await?;
            if keys.is_empty() {
                return Ok(super::Step { rows: 0, next: None });
            }
            let _writing = self.writing().await;
            let update = format!(
                "UPDATE {} SET status = 'failed', last_error = {}, updated_at_ms = {}, worker_id = {}, lock_until_ms = 0, \
                 next_retry_at_ms = 0 WHERE status IN ('pending', 'retryable') AND {key} IN ({})",
                self.table,
                D::param(1),
                D::param(2),
                self.profile.no_worker,
                params::<D>(3, keys.len())
            );
            let reason = crate::text::clip_chars(reason, self.profile.last_error_chars).into_owned();
            let mut q = sqlx::query(&update).bind(reason).bind(now_ms);
            for k in &keys {
                q = super::sinks::bind_key::<D>(q, k);
            }
            let rows = D::rows_affected(&q.execute(&self.pool).await?);
            Ok(super::Step { rows, next: if keys.len() < limit as usize { None } else { keys.last().cloned() } })
        }
    }
);

for_every_dialect!(
    #[async_trait]
    impl Partitions {
        async fn keep_partitions(&self, beat: &super::Heartbeat<'_>) -> Result<super::Holding, StoreError> {
            self.heartbeat(beat).await
        }

        async fn read_owned(&self, read: &super::OwnedRead<'_>) -> Result<super::Page, StoreError> {
            self.read_waiting(read).await
        }

        async fn newest_key(&self) -> Result<Option<i64>, StoreError> {
            self.newest().await
        }

        async fn index_partitions(&self, total: u32) -> Result<bool, StoreError> {
            self.partition_index(total).await
        }

        async fn failed_rooms(&self, rooms: &[(String, String)]) -> Result<Vec<(String, String, i64)>, StoreError> {
            self.failed_in(rooms).await
        }

        async fn mark_owned(&self, owner: &str, marks: &[Mark], now_ms: i64) -> Result<(u64, Vec<usize>), StoreError> {
            self.mark_fenced(owner, marks, now_ms).await
        }

        async fn leave_partitions(&self, owner: &str) -> Result<(), StoreError> {
            self.leave(owner).await
        }

        async fn announce(
            &self,
            owner: &str,
            ordering: &str,
            now_ms: i64,
            until_ms: i64,
        ) -> Result<Vec<(String, String)>, StoreError> {
            self.announce_ordering(owner, ordering, now_ms, until_ms).await
        }

        async fn partition_owners(&self, now_ms: i64) -> Result<Vec<super::OwnerView>, StoreError> {
            self.owners(now_ms).await
        }

        async fn set_partitions(&self, total: u32, now_ms: i64) -> Result<Result<u32, Vec<String>>, StoreError> {
            self.set_partition_count(total, now_ms).await
        }
    }
);

for_every_dialect!(
    #[async_trait]
    impl Consumers {
        async fn positions(
            &self,
            sink: &super::RegisteredSink,
            parts: &[u32],
        ) -> Result<Vec<super::Position>, StoreError> {
            self.positions_of(sink, parts).await
        }

        async fn read_consumer(
            &self,
            sink: &super::RegisteredSink,
            read: &super::OwnedRead<'_>,
            finished: &super::Finished<'_>,
        ) -> Result<super::Page, StoreError> {
            Ok(self.consumer_page(sink, read, finished, &[]).await?.0)
        }

        async fn settle(&self, settle: &super::Settle<'_>) -> Result<super::Settled, StoreError> {
            self.settle_positions(settle).await
        }

        async fn consumer_from_copy(
            &self,
            sink: &super::RegisteredSink,
            now_ms: i64,
        ) -> Result<Option<u64>, StoreError> {
            SqlStore::consumer_from_copy(self, sink, now_ms).await
        }
    }
);
