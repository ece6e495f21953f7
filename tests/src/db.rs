//! A database of a test's (or a benchmark run's) own: a SQLite file, a PostgreSQL schema or
//! a MySQL database, named `outbox_t_…` so that `make test` can clear old ones away.
//!
//! The server databases come from `TEST_POSTGRES_URL` and `TEST_MYSQL_URL` (`make test` and
//! `make bench` set them). Without one, its suites are skipped, said once on stderr, unless
//! `OUTBOX_REQUIRE_SERVER_TESTS=1` (CI) makes that a failure.

use std::io::Write as _;

/// One fresh database.
pub struct TestDb {
    /// Its URL, as the host's `database.url`.
    pub url: String,
    name: String,
    _dir: Option<tempfile::TempDir>,
}

fn fresh_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    format!("outbox_t_{:016x}", h.finish())
}

impl TestDb {
    /// A SQLite file in a temporary directory.
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        TestDb { url, name: "main".into(), _dir: Some(dir) }
    }

    /// A fresh schema on `TEST_POSTGRES_URL`, or `None` (skipped) when it is not set.
    pub async fn postgres() -> Option<TestDb> {
        let base = server_url("TEST_POSTGRES_URL", "PostgreSQL")?;
        let schema = fresh_name();
        let admin = sqlx::PgPool::connect(&base).await.expect("connecting to TEST_POSTGRES_URL");
        sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin).await.unwrap();
        admin.close().await;
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{schema}&application_name={schema}");
        Some(TestDb { url, name: schema, _dir: None })
    }

    /// A fresh database on `TEST_MYSQL_URL`, or `None` (skipped) when it is not set.
    pub async fn mysql() -> Option<TestDb> {
        let base = server_url("TEST_MYSQL_URL", "MySQL/MariaDB")?;
        let database = fresh_name();
        let admin = sqlx::MySqlPool::connect(&base).await.expect("connecting to TEST_MYSQL_URL");
        sqlx::query(&format!("CREATE DATABASE {database}")).execute(&admin).await.unwrap();
        admin.close().await;
        let mut url = reqwest::Url::parse(&base).unwrap();
        url.set_path(&database);
        Some(TestDb { url: url.to_string(), name: database, _dir: None })
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

    /// The schema (PostgreSQL) or database (MySQL) name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The server URL from `var`, or `None` after saying (once, past the test harness's output
/// capture) that these suites are skipped.
fn server_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("OUTBOX_REQUIRE_SERVER_TESTS").is_err(),
                "{var} is not set but OUTBOX_REQUIRE_SERVER_TESTS is: the {what} suites must run"
            );
            static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
            let mut said = SAID.lock().unwrap();
            if !said.contains(&var.to_string()) {
                said.push(var.to_string());
                let _ = writeln!(std::io::stderr(), "note: {var} is not set: the {what} suites are skipped");
            }
            None
        }
    }
}
