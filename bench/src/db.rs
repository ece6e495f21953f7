//! A fresh database per measured run ([`TestDb`], shared with the tests), and what the
//! benchmark reads from it besides the store.

use std::sync::Arc;

use outbox_host::store::{Backend, Store};
use outbox_test_support::db::TestDb;

/// The name a backend is reported under.
pub fn name(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
        Backend::Mysql => "mysql",
    }
}

/// One fresh database.
pub struct Db {
    pub backend: Backend,
    db: TestDb,
}

/// PostgreSQL's write counters at one moment (see [`Db::pg_writes`]).
#[derive(Debug, Clone, Copy)]
pub struct PgWrites {
    /// The outbox's row updates.
    pub updates: i64,
    /// Of them, HOT updates.
    pub hot: i64,
    /// The WAL position, bytes.
    pub wal: i64,
    /// Rows the host inserted, updated or deleted in any table of the schema.
    pub schema_rows: i64,
}

impl Db {
    pub async fn fresh(backend: Backend) -> anyhow::Result<Db> {
        let db = match backend {
            Backend::Sqlite => Some(TestDb::sqlite()),
            Backend::Postgres => TestDb::postgres().await,
            Backend::Mysql => TestDb::mysql().await,
        };
        let db = db.ok_or_else(|| anyhow::anyhow!("{} is not configured (TEST_*_URL)", name(backend)))?;
        Ok(Db { backend, db })
    }

    /// The database URL.
    pub fn url(&self) -> &str {
        &self.db.url
    }

    /// A store with a pool of its own, migrated.
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        let store = outbox_host::store::open(self.url(), 8, "room_outbox").await?;
        store.migrate().await?;
        Ok(store)
    }

    /// The server's version string.
    pub async fn version(&self) -> anyhow::Result<String> {
        Ok(match self.backend {
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
                format!("SQLite {}", sqlx::query_scalar::<_, String>("SELECT sqlite_version()").fetch_one(&pool).await?)
            }
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(self.url()).await?;
                sqlx::query_scalar::<_, String>("SELECT version()").fetch_one(&pool).await?
            }
            Backend::Mysql => {
                let pool = sqlx::MySqlPool::connect(self.url()).await?;
                sqlx::query_scalar::<_, String>("SELECT version()").fetch_one(&pool).await?
            }
        })
    }

    /// On PostgreSQL, by the server's table counters: the outbox's row updates and HOT
    /// updates so far, the WAL position in bytes, and the rows the host wrote in every table
    /// of the schema (inserted, updated and deleted; the producer's inserts into the outbox
    /// left out, whenever the server counts them: what several sinks cost, wherever their
    /// state lives). `None` elsewhere.
    pub async fn pg_writes(&self) -> anyhow::Result<Option<PgWrites>> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let pool = sqlx::PgPool::connect(self.url()).await?;
        let row: (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT COALESCE(s.n_tup_upd, 0), COALESCE(s.n_tup_hot_upd, 0), \
             pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::BIGINT, \
             COALESCE((SELECT SUM(t.n_tup_ins + t.n_tup_upd + t.n_tup_del) \
               - SUM(CASE WHEN t.relname = 'room_outbox' THEN t.n_tup_ins ELSE 0 END) \
               FROM pg_stat_user_tables t WHERE t.schemaname = current_schema()), 0)::BIGINT \
             FROM (SELECT 1) one LEFT JOIN pg_stat_user_tables s \
             ON s.relname = 'room_outbox' AND s.schemaname = current_schema()",
        )
        .fetch_one(&pool)
        .await?;
        pool.close().await;
        Ok(Some(PgWrites { updates: row.0, hot: row.1, wal: row.2, schema_rows: row.3 }))
    }

    /// [`Self::pg_writes`] once the server has counted what the connections closed just
    /// before wrote: it reports a backend's counters when the backend ends.
    pub async fn pg_writes_settled(&self) -> anyhow::Result<Option<PgWrites>> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
        self.pg_writes().await
    }

    /// The event ids of the outbox's rows in `status`.
    pub async fn event_ids_with_status(&self, status: &str) -> anyhow::Result<Vec<String>> {
        let sql = format!("SELECT event_id FROM room_outbox WHERE status = '{status}'");
        Ok(match self.backend {
            Backend::Sqlite => {
                sqlx::query_scalar(&sql).fetch_all(&sqlx::SqlitePool::connect(self.url()).await?).await?
            }
            Backend::Postgres => sqlx::query_scalar(&sql).fetch_all(&sqlx::PgPool::connect(self.url()).await?).await?,
            Backend::Mysql => sqlx::query_scalar(&sql).fetch_all(&sqlx::MySqlPool::connect(self.url()).await?).await?,
        })
    }

    /// How many of these events are `delivered`.
    pub async fn delivered_among(&self, event_ids: &[String]) -> anyhow::Result<usize> {
        if event_ids.is_empty() {
            return Ok(0);
        }
        let list = event_ids.iter().map(|id| format!("'{}'", id.replace('\'', "''"))).collect::<Vec<_>>().join(", ");
        let sql = format!("SELECT COUNT(*) FROM room_outbox WHERE status = 'delivered' AND event_id IN ({list})");
        let n: i64 = match self.backend {
            Backend::Sqlite => {
                sqlx::query_scalar(&sql).fetch_one(&sqlx::SqlitePool::connect(self.url()).await?).await?
            }
            Backend::Postgres => sqlx::query_scalar(&sql).fetch_one(&sqlx::PgPool::connect(self.url()).await?).await?,
            Backend::Mysql => sqlx::query_scalar(&sql).fetch_one(&sqlx::MySqlPool::connect(self.url()).await?).await?,
        };
        Ok(n as usize)
    }

    /// `delivered_at_ms - created_at_ms` of every delivered row.
    pub async fn latencies_ms(&self) -> anyhow::Result<Vec<i64>> {
        const SQL: &str = "SELECT delivered_at_ms - created_at_ms FROM room_outbox WHERE status = 'delivered'";
        Ok(match self.backend {
            Backend::Sqlite => sqlx::query_scalar(SQL).fetch_all(&sqlx::SqlitePool::connect(self.url()).await?).await?,
            Backend::Postgres => sqlx::query_scalar(SQL).fetch_all(&sqlx::PgPool::connect(self.url()).await?).await?,
            Backend::Mysql => sqlx::query_scalar(SQL).fetch_all(&sqlx::MySqlPool::connect(self.url()).await?).await?,
        })
    }
}
