//! A fresh database per measured run: a SQLite file, a PostgreSQL schema, a MySQL database
//! (named `outbox_t_…`, which `make test` clears away).

use std::sync::Arc;

use outbox_host::store::Store;

/// Which database.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Mysql,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
        }
    }
}

/// One fresh database.
pub struct Db {
    pub backend: Backend,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

fn fresh_name() -> String {
    format!("outbox_t_bench_{:012x}", outbox_host::clock::random_u64() >> 16)
}

impl Db {
    pub async fn fresh(backend: Backend) -> anyhow::Result<Db> {
        Ok(match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                let url = format!("sqlite://{}", dir.path().join("bench.db").display());
                Db { backend, url, _dir: Some(dir) }
            }
            Backend::Postgres => {
                let base = std::env::var("TEST_POSTGRES_URL")?;
                let schema = fresh_name();
                let admin = sqlx::PgPool::connect(&base).await?;
                sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await?;
                admin.close().await;
                let sep = if base.contains('?') { '&' } else { '?' };
                Db { backend, url: format!("{base}{sep}options=-c%20search_path%3D{schema}"), _dir: None }
            }
            Backend::Mysql => {
                let base = std::env::var("TEST_MYSQL_URL")?;
                let database = fresh_name();
                let admin = sqlx::MySqlPool::connect(&base).await?;
                sqlx::query(&format!("CREATE DATABASE {database}")).execute(&admin).await?;
                admin.close().await;
                let mut url = reqwest::Url::parse(&base)?;
                url.set_path(&database);
                Db { backend, url: url.to_string(), _dir: None }
            }
        })
    }

    /// A store with a pool of its own, migrated.
    pub async fn open(&self) -> anyhow::Result<Arc<dyn Store>> {
        let store = outbox_host::store::open(&self.url, 8, "room_outbox").await?;
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
                let pool = sqlx::PgPool::connect(&self.url).await?;
                sqlx::query_scalar::<_, String>("SELECT version()").fetch_one(&pool).await?
            }
            Backend::Mysql => {
                let pool = sqlx::MySqlPool::connect(&self.url).await?;
                sqlx::query_scalar::<_, String>("SELECT version()").fetch_one(&pool).await?
            }
        })
    }

    /// `delivered_at_ms - created_at_ms` of every delivered row.
    pub async fn latencies_ms(&self) -> anyhow::Result<Vec<i64>> {
        const SQL: &str = "SELECT delivered_at_ms - created_at_ms FROM room_outbox WHERE status = 'delivered'";
        Ok(match self.backend {
            Backend::Sqlite => sqlx::query_scalar(SQL).fetch_all(&sqlx::SqlitePool::connect(&self.url).await?).await?,
            Backend::Postgres => sqlx::query_scalar(SQL).fetch_all(&sqlx::PgPool::connect(&self.url).await?).await?,
            Backend::Mysql => sqlx::query_scalar(SQL).fetch_all(&sqlx::MySqlPool::connect(&self.url).await?).await?,
        })
    }
}
