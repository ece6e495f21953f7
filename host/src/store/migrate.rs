//! Applies the SQL files under `migrations/<dialect>/` to the configured table.
//!
//! The files are embedded with `sqlx::migrate!` (one folder per dialect, the same version
//! numbers in each) and written for the table `room_outbox`; the runner renames it to the
//! configured `outbox.table` and keeps its own bookkeeping table `<table>_migrations`, so
//! two outbox tables can live in one database.

use sqlx::migrate::Migrator;

/// The SQLite migrations.
pub static SQLITE: Migrator = sqlx::migrate!("../migrations/sqlite");
/// The PostgreSQL migrations.
pub static POSTGRES: Migrator = sqlx::migrate!("../migrations/postgres");
/// The MySQL / MariaDB migrations.
pub static MYSQL: Migrator = sqlx::migrate!("../migrations/mysql");

/// A migration with the table name filled in.
pub struct Step {
    /// Version number, equal across dialects.
    pub version: i64,
    /// From the file name.
    pub description: String,
    /// Statements to run.
    pub sql: String,
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
        })
        .collect()
}

/// Whether every migration of `migrator` is among `applied`.
pub fn up_to_date(migrator: &Migrator, applied: &[i64]) -> bool {
    versions(migrator).iter().all(|v| applied.contains(v))
}

/// The version numbers of every dialect's migrations, for the check that they agree.
pub fn versions(migrator: &Migrator) -> Vec<i64> {
    migrator.iter().filter(|m| m.migration_type.is_up_migration()).map(|m| m.version).collect()
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
    }
}
