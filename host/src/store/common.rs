//! The `Store` impl every backend shares. Statements that read the same in every dialect
//! are written here once, built with `QueryBuilder` (which writes each database's own
//! placeholders); the dialect's own methods (`migrate_schema`, `claim_rows`, `mark_failed`,
//! `release_rows`) live in the backend module.

/// Implements `Store` for a backend `$store` with fields `pool` and `table`, on database
/// `$db`, with migrations `$migrator`.
macro_rules! common_store {
    ($store:ty, $db:ty, $migrator:expr) => {
        impl $store {
            /// Whether every migration is recorded as applied (no DDL needed).
            async fn applied_all(&self) -> bool {
                let sql = format!("SELECT version FROM {}_migrations", self.table);
                let applied: Result<Vec<i64>, _> = sqlx::query_scalar(&sql).fetch_all(&self.pool).await;
                applied.is_ok_and(|v| $crate::store::migrate::up_to_date(&$migrator, &v))
            }

            /// Applies the migrations not yet recorded, on a connection the caller holds
            /// exclusively (its lock or transaction keeps concurrent starters out).
            async fn apply_missing(
                &self,
                conn: &mut <$db as sqlx::Database>::Connection,
            ) -> Result<(), $crate::store::StoreError> {
                use $crate::store::StoreError;
                let t = &self.table;
                sqlx::query(&format!(
                    "CREATE TABLE IF NOT EXISTS {t}_migrations \
                     (version BIGINT PRIMARY KEY, description VARCHAR(255) NOT NULL, applied_at_ms BIGINT NOT NULL)"
                ))
                .execute(&mut *conn)
                .await?;
                for step in $crate::store::migrate::steps(&$migrator, t) {
                    let mut check =
                        sqlx::QueryBuilder::<$db>::new(format!("SELECT version FROM {t}_migrations WHERE version = "));
                    check.push_bind(step.version);
                    if check.build().fetch_optional(&mut *conn).await?.is_some() {
                        continue;
                    }
                    sqlx::Executor::execute(&mut *conn, step.sql.as_str())
                        .await
                        .map_err(|e| StoreError::Migration(format!("{} {}: {e}", step.version, step.description)))?;
                    let mut record = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO {t}_migrations (version, description, applied_at_ms) "
                    ));
                    record.push_values([&step], |mut row, step| {
                        row.push_bind(step.version)
                            .push_bind(step.description.clone())
                            .push_bind($crate::store::now_ms());
                    });
                    record.build().execute(&mut *conn).await?;
                }
                Ok(())
            }

            /// `AND <filter>` over `failed` rows.
            fn push_failed_filter<'a>(
                q: &mut sqlx::QueryBuilder<'a, $db>,
                filter: &'a $crate::store::RetryFilter,
            ) {
                use $crate::store::RetryFilter;
                q.push(" WHERE status = 'failed'");
                match filter {
                    RetryFilter::EventId(id) => {
                        q.push(" AND event_id = ").push_bind(id.as_str());
                    }
                    RetryFilter::EventType(t) => {
                        q.push(" AND event_type = ").push_bind(t.as_str());
                    }
                    RetryFilter::ErrorContains(text) => {
                        q.push(" AND last_error LIKE ").push_bind($crate::store::contains_pattern(text));
                        q.push(" ESCAPE '!'");
                    }
                    RetryFilter::ErrorIs(text) => {
                        q.push(" AND last_error = ").push_bind(text.as_str());
                    }
                    RetryFilter::All => {}
                }
            }
        }

        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            async fn migrate(&self) -> Result<(), $crate::store::StoreError> {
                // Up to date: no DDL, so a host whose user may only read and write rows can start.
                if self.applied_all().await {
                    return Ok(());
                }
                self.migrate_schema().await
            }

            async fn claim(
                &self,
                worker_id: &str,
                now_ms: i64,
                lock_until_ms: i64,
                limit: u32,
            ) -> Result<Vec<$crate::store::Claimed>, $crate::store::StoreError> {
                self.claim_rows(worker_id, now_ms, lock_until_ms, limit).await
            }

            async fn mark(&self, marks: &[$crate::store::Mark], now_ms: i64) -> Result<u64, $crate::store::StoreError> {
                use $crate::store::Outcome;
                let mut changed = 0;
                let delivered: Vec<i64> =
                    marks.iter().filter(|m| matches!(m.outcome, Outcome::Delivered)).map(|m| m.id).collect();
                if !delivered.is_empty() {
                    // Delivered wins: any row not yet delivered, whoever holds it.
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "UPDATE {} SET status = 'delivered', last_error = NULL, worker_id = NULL, lock_until_ms = 0, \
                         updated_at_ms = ",
                        self.table
                    ));
                    q.push_bind(now_ms).push(", delivered_at_ms = ").push_bind(now_ms);
                    q.push(" WHERE status <> 'delivered' AND id IN (");
                    let mut ids = q.separated(", ");
                    for id in &delivered {
                        ids.push_bind(*id);
                    }
                    q.push(")");
                    changed += q.build().execute(&self.pool).await?.rows_affected();
                }
                let failed: Vec<&$crate::store::Mark> =
                    marks.iter().filter(|m| !matches!(m.outcome, Outcome::Delivered)).collect();
                if !failed.is_empty() {
                    changed += self.mark_failed(&failed, now_ms).await?;
                }
                Ok(changed)
            }

            async fn release(
                &self,
                rows: &[(i64, $crate::store::Lease)],
                now_ms: i64,
            ) -> Result<u64, $crate::store::StoreError> {
                if rows.is_empty() {
                    return Ok(0);
                }
                self.release_rows(rows, now_ms).await
            }

            async fn insert(&self, events: &[$crate::store::NewEvent]) -> Result<(), $crate::store::StoreError> {
                let mut tx = self.pool.begin().await?;
                // Several rows per statement; a clash names the event when it can.
                for chunk in events.chunks($crate::store::INSERT_CHUNK) {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO {} (app_code, event_id, event_type, room_id, status, envelope, created_at_ms) ",
                        self.table
                    ));
                    q.push_values(chunk, |mut row, e| {
                        row.push_bind(&e.app_code)
                            .push_bind(&e.event_id)
                            .push_bind(&e.event_type)
                            .push_bind(&e.room_id)
                            .push_bind(e.status.as_str())
                            .push_bind(&e.envelope)
                            .push_bind(e.created_at_ms);
                    });
                    let named = match chunk {
                        [one] => one.event_id.clone(),
                        [first, .., last] => format!("(one of {} … {})", first.event_id, last.event_id),
                        [] => String::new(),
                    };
                    q.build().execute(&mut *tx).await.map_err(|err| $crate::store::name_duplicate(err, &named))?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn get(&self, event_id: &str) -> Result<Option<$crate::store::Row>, $crate::store::StoreError> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {} FROM {} WHERE event_id = ",
                    $crate::store::ROW_COLUMNS,
                    self.table
                ));
                q.push_bind(event_id);
                let row = q.build().fetch_optional(&self.pool).await?;
                Ok(row.as_ref().map(|r| $crate::store::decode_row!(r)).transpose()?)
            }

            async fn stats(&self) -> Result<$crate::store::Stats, $crate::store::StoreError> {
                let [counts, oldest, errors] = $crate::store::stats_sql(&self.table);
                let counts: Vec<(String, i64)> = sqlx::query_as(&counts).fetch_all(&self.pool).await?;
                let oldest: Option<i64> = sqlx::query_scalar(&oldest).fetch_one(&self.pool).await?;
                let errors: Vec<(String, i64)> = sqlx::query_as(&errors).fetch_all(&self.pool).await?;
                let mut recent = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT COUNT(*) FROM {} WHERE status = 'delivered' AND delivered_at_ms >= ",
                    self.table
                ));
                recent.push_bind($crate::store::now_ms() - 60_000);
                let last_minute: i64 = recent.build_query_scalar().fetch_one(&self.pool).await?;
                Ok($crate::store::stats_from(counts, oldest, errors, last_minute))
            }

            async fn history(&self, since_ms: i64) -> Result<Vec<$crate::store::Minute>, $crate::store::StoreError> {
                let t = &self.table;
                // `x - x % 60000` floors to the minute, and COUNT is a BIGINT, in every dialect.
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT m, COUNT(CASE WHEN k = 1 THEN 1 END), COUNT(CASE WHEN k = 2 THEN 1 END) FROM (\
                       SELECT delivered_at_ms - delivered_at_ms % 60000 AS m, 1 AS k FROM {t} \
                       WHERE status = 'delivered' AND delivered_at_ms >= "
                ));
                q.push_bind(since_ms);
                q.push(format!(
                    " UNION ALL SELECT updated_at_ms - updated_at_ms % 60000 AS m, 2 AS k FROM {t} \
                       WHERE status = 'failed' AND updated_at_ms >= "
                ));
                q.push_bind(since_ms);
                q.push(") per_row GROUP BY m ORDER BY m");
                let rows: Vec<(i64, i64, i64)> = q.build_query_as().fetch_all(&self.pool).await?;
                Ok(rows
                    .into_iter()
                    .map(|(start_ms, delivered, failed)| $crate::store::Minute { start_ms, delivered, failed })
                    .collect())
            }

            async fn recent_failures(&self, limit: u32) -> Result<Vec<$crate::store::Row>, $crate::store::StoreError> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {} FROM {} WHERE status IN ('failed', 'retryable') ORDER BY updated_at_ms DESC, id DESC LIMIT ",
                    $crate::store::ROW_COLUMNS,
                    self.table
                ));
                q.push_bind(i64::from(limit));
                let rows = q.build().fetch_all(&self.pool).await?;
                Ok(rows.iter().map(|r| $crate::store::decode_row!(r)).collect::<Result<_, _>>()?)
            }

            async fn count_failed(&self, filter: &$crate::store::RetryFilter) -> Result<i64, $crate::store::StoreError> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!("SELECT COUNT(*) FROM {}", self.table));
                Self::push_failed_filter(&mut q, filter);
                Ok(q.build_query_scalar().fetch_one(&self.pool).await?)
            }

            async fn retry_failed(
                &self,
                filter: &$crate::store::RetryFilter,
                now_ms: i64,
            ) -> Result<u64, $crate::store::StoreError> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "UPDATE {} SET status = 'pending', retry_count = 0, next_retry_at_ms = 0, worker_id = NULL, \
                     lock_until_ms = 0, updated_at_ms = ",
                    self.table
                ));
                q.push_bind(now_ms);
                Self::push_failed_filter(&mut q, filter);
                Ok(q.build().execute(&self.pool).await?.rows_affected())
            }

            async fn purge_delivered(&self, before_ms: i64, limit: u32) -> Result<u64, $crate::store::StoreError> {
                // Pick the ids first, then delete them: one bounded statement each, and the
                // same in every dialect (MySQL cannot delete from a subquery on its table).
                let mut pick = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT id FROM {} WHERE status = 'delivered' AND updated_at_ms < ",
                    self.table
                ));
                pick.push_bind(before_ms).push(" ORDER BY id LIMIT ").push_bind(i64::from(limit));
                let ids: Vec<i64> = pick.build_query_scalar().fetch_all(&self.pool).await?;
                if ids.is_empty() {
                    return Ok(0);
                }
                let mut delete = sqlx::QueryBuilder::<$db>::new(format!(
                    "DELETE FROM {} WHERE status = 'delivered' AND id IN (",
                    self.table
                ));
                let mut list = delete.separated(", ");
                for id in &ids {
                    list.push_bind(*id);
                }
                delete.push(")");
                Ok(delete.build().execute(&self.pool).await?.rows_affected())
            }

            async fn ping(&self) -> Result<(), $crate::store::StoreError> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }

            async fn close(&self) {
                self.pool.close().await;
            }
        }
    };
}
pub(super) use common_store;
