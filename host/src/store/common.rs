//! Statements that read the same in every dialect, written once. They are built with
//! `QueryBuilder`, which writes each database's own placeholders; the macro stamps them out
//! as inherent methods of each backend, which its `Store` impl calls.

/// Generates `applied_all`, `apply_missing`, `insert_rows`, `get_row` and `read_stats` for a
/// backend `$store` with a `pool` and a `table`, on database `$db`, with migrations `$migrator`.
macro_rules! common_queries {
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
                    let mut check = sqlx::QueryBuilder::<$db>::new(format!("SELECT version FROM {t}_migrations WHERE version = "));
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
                        row.push_bind(step.version).push_bind(step.description.clone()).push_bind($crate::store::now_ms());
                    });
                    record.build().execute(&mut *conn).await?;
                }
                Ok(())
            }

            /// Inserts rows as a producer would, in one transaction.
            async fn insert_rows(&self, events: &[$crate::store::NewEvent]) -> Result<(), $crate::store::StoreError> {
                let mut tx = self.pool.begin().await?;
                for e in events {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO {} (app_code, event_id, event_type, room_id, status, envelope, created_at_ms) ",
                        self.table
                    ));
                    q.push_values([e], |mut row, e| {
                        row.push_bind(&e.app_code)
                            .push_bind(&e.event_id)
                            .push_bind(&e.event_type)
                            .push_bind(&e.room_id)
                            .push_bind(e.status.as_str())
                            .push_bind(&e.envelope)
                            .push_bind(e.created_at_ms);
                    });
                    q.build().execute(&mut *tx).await.map_err(|err| $crate::store::name_duplicate(err, &e.event_id))?;
                }
                tx.commit().await?;
                Ok(())
            }

            /// One whole row by `event_id`.
            async fn get_row(&self, event_id: &str) -> Result<Option<$crate::store::Row>, $crate::store::StoreError> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT {} FROM {} WHERE event_id = ",
                    $crate::store::ROW_COLUMNS,
                    self.table
                ));
                q.push_bind(event_id);
                let row = q.build().fetch_optional(&self.pool).await?;
                Ok(row.as_ref().map(|r| $crate::store::decode_row!(r)).transpose()?)
            }

            /// Counts per status, the oldest waiting row, the most frequent errors.
            async fn read_stats(&self) -> Result<$crate::store::Stats, $crate::store::StoreError> {
                let [counts, oldest, errors] = $crate::store::stats_sql(&self.table);
                let counts: Vec<(String, i64)> = sqlx::query_as(&counts).fetch_all(&self.pool).await?;
                let oldest: Option<i64> = sqlx::query_scalar(&oldest).fetch_one(&self.pool).await?;
                let errors: Vec<(String, i64)> = sqlx::query_as(&errors).fetch_all(&self.pool).await?;
                Ok($crate::store::stats_from(counts, oldest, errors))
            }
        }
    };
}
pub(super) use common_queries;
