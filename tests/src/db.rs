//! A database of a test's (or a benchmark run's) own: a SQLite file, a PostgreSQL schema or
//! a MySQL database, named `outbox_t_<created>_…` so that `make test` can clear old ones away.
//!
//! The server databases come from `TEST_POSTGRES_URL` and `TEST_MYSQL_URL`, by default the
//! local servers `make test` starts. A server that cannot be reached fails the test; only
//! [`SKIP_VAR`]`=1` skips the tests that need one (see [`crate::skip`]).

pub use crate::skip::SKIP_VAR;

/// One fresh database.
pub struct TestDb {
    /// Its URL, as the host's `database.url`.
    pub url: String,
    name: String,
    /// The server's URL this database was made on (empty for SQLite).
    server: String,
    _dir: Option<tempfile::TempDir>,
}

/// `outbox_t_<unix seconds>_<random>`: the creation time lets `make test` clear away only
/// what earlier runs left (over 6 hours old, `scripts/test-databases.sh`), never the
/// database of a run still going beside it (a soak while the tests run, two checkouts on
/// one machine).
fn fresh_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(now.as_nanos());
    format!("outbox_t_{}_{:08x}", now.as_secs(), h.finish() as u32)
}

impl TestDb {
    /// A SQLite file in a temporary directory.
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        TestDb { url, name: "main".into(), server: String::new(), _dir: Some(dir) }
    }

    /// A fresh schema on `TEST_POSTGRES_URL`, or `None` when the server tests are skipped.
    pub async fn postgres() -> Option<TestDb> {
        let base = server_url("TEST_POSTGRES_URL", POSTGRES)?;
        let schema = fresh_name();
        let admin = sqlx::PgPool::connect(&base).await.unwrap_or_else(|e| unreachable_server("PostgreSQL", &base, e));
        sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
        admin.close().await;
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}&application_name={schema}");
        Some(TestDb { url, name: schema, server: base, _dir: None })
    }

    /// A fresh database on `TEST_MYSQL_URL`, or `None` when the server tests are skipped.
    pub async fn mysql() -> Option<TestDb> {
        let base = server_url("TEST_MYSQL_URL", MYSQL)?;
        let database = fresh_name();
        let admin = sqlx::MySqlPool::connect(&base).await.unwrap_or_else(|e| unreachable_server("MariaDB", &base, e));
        sqlx::query(&format!("CREATE DATABASE {database}")).execute(&admin).await.unwrap();
        admin.close().await;
        let mut url = reqwest::Url::parse(&base).unwrap();
        url.set_path(&database);
        Some(TestDb { url: url.to_string(), name: database, server: base, _dir: None })
    }

    /// Runs one statement on this database over a connection of its own, as an operator or
    /// another service would; returns the rows it affected.
    pub async fn execute(&self, sql: &str) -> Result<u64, sqlx::Error> {
        use sqlx::Connection as _;
        if self.url.starts_with("sqlite:") {
            let mut c = sqlx::SqliteConnection::connect(&self.url).await?;
            Ok(sqlx::raw_sql(sql).execute(&mut c).await?.rows_affected())
        } else if self.url.starts_with("postgres") {
            let mut c = sqlx::PgConnection::connect(&self.url).await?;
            Ok(sqlx::raw_sql(sql).execute(&mut c).await?.rows_affected())
        } else {
            let mut c = sqlx::MySqlConnection::connect(&self.url).await?;
            Ok(sqlx::raw_sql(sql).execute(&mut c).await?.rows_affected())
        }
    }

    /// The server's URL, outside this test's schema or database (an operator's connection).
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The schema (PostgreSQL) or database (MySQL) name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The local PostgreSQL server `make test` starts.
pub const POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The local MariaDB server `make test` starts.
pub const MYSQL: &str = "mysql://root@127.0.0.1:3306/test";

/// The server URL from `var` (else `default`), or `None` when the server tests are skipped.
fn server_url(var: &str, default: &str) -> Option<String> {
    if crate::skip::skipping("a PostgreSQL or MariaDB server") {
        return None;
    }
    Some(std::env::var(var).ok().filter(|url| !url.is_empty()).unwrap_or_else(|| default.to_string()))
}

fn unreachable_server(what: &str, url: &str, e: sqlx::Error) -> ! {
    panic!("{what} at {url} is unreachable ({e}): `make test` starts it; {SKIP_VAR}=1 skips the tests that need it")
}
