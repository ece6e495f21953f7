//! Applies the SQL files under `migrations/<dialect>/` to the configured table.
//!
//! The files are embedded with `sqlx::migrate!` (one folder per dialect, the same version
//! numbers in each) and written for the table `room_outbox`; the runner renames it to the
//! configured `outbox.table` and keeps its own bookkeeping table `<table>_migrations`, so
//! two outbox tables can live in one database.

use sqlx::migrate::Migrator;

/// The SQLite migrations.
pub static SQLITE: Migrator = sqlx::migrate!("../migrations/sqlite");

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
            sql: m.sql.replace(crate::config::DEFAULT_TABLE, table),
        })
        .collect()
}

/// The version numbers of every dialect's migrations, for the check that they agree.
pub fn versions(migrator: &Migrator) -> Vec<i64> {
    migrator
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .map(|m| m.version)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_versions_count_up_from_one() {
        let versions = versions(&SQLITE);
        assert_eq!(versions, (1..=versions.len() as i64).collect::<Vec<_>>());
    }

    #[test]
    fn steps_rename_the_table_and_its_indexes() {
        let steps = steps(&SQLITE, "events_out");
        assert!(
            steps[0]
                .sql
                .contains("CREATE TABLE IF NOT EXISTS events_out (")
        );
        assert!(steps[0].sql.contains("events_out_claim_idx"));
        assert!(!steps[0].sql.contains("room_outbox"));
    }
}
