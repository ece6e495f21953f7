//! The schema the host keeps, and what it knows of each version.
//!
//! - **Migrations.** The SQL files under `migrations/<dialect>/`, embedded with
//!   `sqlx::migrate!` (one folder per dialect, the same version numbers in each). Version 1 is
//!   the baseline. The files are written for the table `room_outbox`; the runner renames it
//!   to the configured `outbox.table` and keeps its bookkeeping in `<table>_migrations`, with
//!   each applied file's checksum, so that a file changed after it was applied is refused by
//!   name.
//! - **Routines.** PostgreSQL's claim function and insert notification and MySQL's claim
//!   procedure are rendered from `migrations/routines/` for the table and its key, and
//!   installed whenever the checksum recorded in `<table>_routines` differs from the
//!   rendered text's.
//!
//! Each database's folder and routine templates are named in its own module ([`super::schema::Ddl`]).
//!
//! The runner itself is in `sql.rs` (it needs the dialect's connection).

use sha2::Digest as _;
use sqlx::migrate::Migrator;

use super::Backend;
use super::schema::Key;

/// The SQLite migrations.
pub static SQLITE: Migrator = sqlx::migrate!("../migrations/sqlite");
/// The PostgreSQL migrations.
pub static POSTGRES: Migrator = sqlx::migrate!("../migrations/postgres");
/// The MySQL / MariaDB migrations.
pub static MYSQL: Migrator = sqlx::migrate!("../migrations/mysql");

/// The baseline's version.
pub const BASELINE: i64 = 1;

/// The line in each baseline after which come the outbox's own bookkeeping tables (the sink
/// registry and the partition leases), which a sink's own table does not get.
const BOOKKEEPING: &str = "-- outbox-host: the outbox's own bookkeeping follows";

/// A migration with the table name filled in.
pub struct Step {
    /// Version number, equal across dialects.
    pub version: i64,
    /// From the file name.
    pub description: String,
    /// Statements to run.
    pub sql: String,
    /// The file's checksum (hex), as recorded once it is applied.
    pub checksum: String,
}

impl Step {
    /// The step's two parts: the table itself (with its indexes), then the outbox's own
    /// bookkeeping, which is all an adopted table's baseline applies (the marker line's
    /// wording is from when sinks had tables of their own). A step without it is all table.
    pub fn parts(&self) -> (&str, &str) {
        match self.sql.find(BOOKKEEPING) {
            Some(at) => self.sql.split_at(at),
            None => (&self.sql, ""),
        }
    }

    /// The file the step comes from, for messages.
    pub fn file(&self, backend: Backend) -> String {
        format!("migrations/{}/{:04}_{}.sql", backend.ddl().dir, self.version, self.description.replace(' ', "_"))
    }
}

/// The steps of `migrator` for `table`, in version order.
pub fn steps(migrator: &Migrator, table: &str) -> Vec<Step> {
    migrator
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .map(|m| Step {
            version: m.version,
            description: m.description.to_string(),
            sql: m.sql.replace(crate::store::DEFAULT_TABLE, table),
            checksum: hex(&m.checksum),
        })
        .collect()
}

/// Whether `applied` (version, checksum) is every migration of `migrator`, unchanged.
pub fn up_to_date(migrator: &Migrator, applied: &[(i64, String)]) -> bool {
    steps(migrator, crate::store::DEFAULT_TABLE)
        .iter()
        .all(|s| applied.iter().any(|(v, sum)| *v == s.version && *sum == s.checksum))
}

/// The first applied migration whose file has changed since, as an error naming it.
pub fn changed(migrator: &Migrator, backend: Backend, table: &str, applied: &[(i64, String)]) -> Option<String> {
    steps(migrator, table).into_iter().find_map(|s| {
        let (_, recorded) = applied.iter().find(|(v, _)| *v == s.version)?;
        (*recorded != s.checksum).then(|| {
            format!(
                "{} was applied to {table} with checksum {recorded}, and the file now has {}: an applied migration \
                 must not change (put the change in a new migration); nothing was changed",
                s.file(backend),
                s.checksum
            )
        })
    })
}

/// The version numbers of every dialect's migrations, for the check that they agree.
pub fn versions(migrator: &Migrator) -> Vec<i64> {
    migrator.iter().filter(|m| m.migration_type.is_up_migration()).map(|m| m.version).collect()
}

/// One routine the host keeps beside a table, rendered for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routine {
    /// Its name in `<table>_routines` (`claim`, `notify_insert`).
    pub name: &'static str,
    /// The statements that install it (replacing what was there).
    pub sql: String,
    /// The checksum of `sql` (hex).
    pub checksum: String,
}

/// The routines of `backend` for `table`, whose rows are named by `key`. Each template
/// names the table `{table}` and the key `{key}`; `{id}` is the claimed row's id (0 where
/// rows are named by `event_id`), `{key_text}` the key as a JSON-safe value and `{key_type}`
/// its type there (MySQL's `JSON_TABLE`).
pub fn routines(backend: Backend, table: &str, key: Key) -> Vec<Routine> {
    let ddl = backend.ddl();
    let [id, key_text, key_type] = if key == Key::EventId { ddl.event_id_key } else { ["o.id", "id", "BIGINT"] };
    ddl.routines
        .iter()
        .map(|(name, template)| {
            let sql = template
                .replace("{table}", table)
                .replace("{key}", key.column())
                .replace("{key_text}", key_text)
                .replace("{key_type}", key_type)
                .replace("{id}", id);
            let checksum = hex(&sha2::Sha256::digest(sql.as_bytes()));
            Routine { name, sql, checksum }
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `make verify-migrations`: the three dialects must have the same version list.
    #[test]
    fn every_dialect_has_the_same_versions() {
        let sqlite = versions(&SQLITE);
        assert_eq!(sqlite, (1..=sqlite.len() as i64).collect::<Vec<_>>(), "versions count up from 1");
        assert_eq!(versions(&POSTGRES), sqlite, "migrations/postgres disagrees with migrations/sqlite");
        assert_eq!(versions(&MYSQL), sqlite, "migrations/mysql disagrees with migrations/sqlite");
    }

    #[test]
    fn steps_rename_the_table_and_its_indexes() {
        let steps = steps(&SQLITE, "events_out");
        assert!(steps[0].sql.contains("CREATE TABLE IF NOT EXISTS events_out ("));
        assert!(steps[0].sql.contains("events_out_claim_idx"));
        assert!(!steps[0].sql.contains("room_outbox"));
        assert_eq!(steps[0].file(Backend::Sqlite), "migrations/sqlite/0001_baseline.sql");
    }

    /// Each baseline has its bookkeeping part, and the table part creates no bookkeeping.
    #[test]
    fn each_baseline_and_version_2_split_into_the_table_and_the_bookkeeping() {
        for migrator in [&SQLITE, &POSTGRES, &MYSQL] {
            let steps = steps(migrator, "t");
            let (table, bookkeeping) = steps[0].parts();
            assert!(table.contains("CREATE TABLE IF NOT EXISTS t ("), "{table}");
            for own in ["t_sinks", "t_partitions", "t_owners"] {
                assert!(bookkeeping.contains(&format!("CREATE TABLE IF NOT EXISTS {own} (")), "{own}");
                assert!(!table.contains(own), "{own} in the table part");
            }
            // Version 2 is all bookkeeping: a sink's own table gets none of it.
            let (table, bookkeeping) = steps[1].parts();
            assert!(!table.contains("CREATE"), "{table}");
            assert!(bookkeeping.contains("CREATE TABLE IF NOT EXISTS t_claimers ("), "{bookkeeping}");
            // So is version 3, the positions and exceptions of the sinks after the first.
            let (table, bookkeeping) = steps[2].parts();
            assert!(!table.contains("CREATE"), "{table}");
            for own in ["t_positions", "t_exceptions"] {
                assert!(bookkeeping.contains(&format!("CREATE TABLE IF NOT EXISTS {own} (")), "{own}");
            }
        }
    }

    /// Every placeholder is filled for both keys, and the key decides the text (so the
    /// checksum tells a table keyed by `event_id` from one keyed by `id`).
    #[test]
    fn routines_are_rendered_for_the_table_and_its_key() {
        for backend in [Backend::Postgres, Backend::Mysql] {
            let by_id = routines(backend, "events_out", Key::Id);
            let by_event_id = routines(backend, "events_out", Key::EventId);
            assert!(by_id.iter().any(|r| r.name == "claim"), "{backend:?} has a claim routine");
            for r in by_id.iter().chain(&by_event_id) {
                for placeholder in ["{table}", "{key}", "{key_text}", "{key_type}", "{id}"] {
                    assert!(!r.sql.contains(placeholder), "{backend:?} {} keeps {placeholder}", r.name);
                }
                assert!(r.sql.contains("events_out_") && !r.sql.contains("room_outbox"), "{}", r.name);
            }
            let claim = |rs: &[Routine]| rs.iter().find(|r| r.name == "claim").unwrap().clone();
            assert!(claim(&by_event_id).sql.contains("o.event_id = "), "{backend:?}");
            assert_ne!(claim(&by_id).checksum, claim(&by_event_id).checksum);
        }
        assert!(routines(Backend::Sqlite, "t", Key::RowId).is_empty());
    }
}
