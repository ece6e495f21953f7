//! What the host needs of the outbox table, checked against what the database says the
//! table has. One review serves three callers:
//!
//! - `migrate` on a table that already exists (room-service's, made by its Go code): the
//!   columns the host can add with defaults that keep old rows valid, and the claim index,
//!   are added as online steps ([`Review::additions`]); a column that cannot work as declared
//!   is refused with the `ALTER` that would fix it, before anything is changed;
//! - `run`, before it claims anything: every problem at once, or none;
//! - the store itself: how to name a row in its writes ([`Key`]) and what to write where it
//!   has nothing to say (`NULL`, or `''` in a `NOT NULL DEFAULT ''` column), as a
//!   [`Profile`].
//!
//! The review is the same on every database; what it reads and writes in a database's own
//! words (types, `ALTER` and index statements) is that database's [`Ddl`], in its module.
//!
//! Column types a Go developer would declare work as they are: unsigned integers, `INT` or
//! `BIGINT` counters, binary-collation or `VARBINARY` strings, `NOT NULL DEFAULT ''`
//! strings, any `BLOB` size for the envelope, shorter `last_error` columns (the host clips
//! to fit).

use super::Backend;

/// Writes the statements that add columns (name, definition) to a table.
pub(super) type AddColumns = fn(&str, &[(&str, &str)]) -> Vec<String>;

/// What a review writes in one database's own words: the types it reads and suggests, and
/// the statements that fix or extend a table. Each database's is in the module named after
/// it ([`Backend::ddl`]); what they share is here.
pub struct Ddl {
    /// Which of a column's three definitions in [`NEEDS`] is this database's.
    pub(super) definition: usize,
    /// Reads a declared type.
    pub(super) shape: fn(&str) -> Shape,
    /// The type a fix suggests for a role.
    pub(super) suggested: fn(Role) -> &'static str,
    /// The statement that changes a column's type: table, column, type, `NULL` or `NOT NULL`.
    pub(super) fix: fn(&str, &str, &str, &str) -> String,
    /// The statement that makes `event_id` unique on a table.
    pub(super) unique_event_id: fn(&str) -> String,
    /// Whether every row has a `rowid` (SQLite): a table without `id` names rows by it, an
    /// `id` column is not asked for a unique index, and the claim walks a pick index.
    pub(super) row_id: bool,
    /// The statements that add columns to a table.
    pub(super) add_columns: AddColumns,
    /// The statement that builds the claim index: table, key column, and `, <key>` or
    /// nothing where the index ends with the row's own key anyway.
    pub(super) claim_index: fn(&str, &str, &str) -> String,
    /// The statement that drops an index a failed online build left behind (PostgreSQL's
    /// `CONCURRENTLY`), before it is built again: table, index suffix.
    pub(super) drop_invalid_index: Option<fn(&str, &str) -> String>,
    /// The directory of its migrations under `migrations/`.
    pub(super) dir: &'static str,
    /// The routines kept beside a table: name, template (`migrations/routines/`).
    pub(super) routines: &'static [(&'static str, &'static str)],
    /// In a routine of a table keyed by event id: the claimed row's id, the key as a
    /// JSON-safe value, and its type there (see `migrate::routines`).
    pub(super) event_id_key: [&'static str; 3],
}

/// One column as the database describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    /// Its name, lower case.
    pub name: String,
    /// Its type as the database prints it (`bigint(20) unsigned`, `character varying(64)`).
    pub declared: String,
    /// Whether it accepts `NULL`.
    pub nullable: bool,
}

/// One index (or the primary key) and its columns, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexInfo {
    /// Its name (`PRIMARY` for MySQL's primary key).
    pub name: String,
    /// Whether it is unique (a primary key is).
    pub unique: bool,
    /// Its columns, lower case, in index order.
    pub columns: Vec<String>,
}

/// The table as the database describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableInfo {
    /// Its columns, in table order.
    pub columns: Vec<ColumnInfo>,
    /// Its indexes, the primary key among them.
    pub indexes: Vec<IndexInfo>,
}

impl TableInfo {
    fn column(&self, name: &str) -> Option<&ColumnInfo> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Whether `column` alone is unique (a one-column primary key or unique index).
    fn unique(&self, column: &str) -> bool {
        self.indexes.iter().any(|i| i.unique && i.columns == [column])
    }
}

/// How the host names a row in its outcome writes and hand-backs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// The integer `id` column (the host's own tables).
    Id,
    /// SQLite's `rowid`, for a table without `id` (it also keeps insert order).
    RowId,
    /// The unique `event_id`, for a MySQL or PostgreSQL table without `id`: adding an
    /// auto-increment column rewrites the table and blocks the producer's inserts meanwhile.
    EventId,
}

impl Key {
    /// The column in SQL text.
    pub fn column(self) -> &'static str {
        match self {
            Key::Id => "id",
            Key::RowId => "rowid",
            Key::EventId => "event_id",
        }
    }

    /// Whether the key is a string (bound as text) rather than an integer.
    pub fn is_text(self) -> bool {
        self == Key::EventId
    }
}

/// How the store writes to this table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// How a row is named.
    pub key: Key,
    /// What "no worker" is written as: `NULL`, or `''` where the column is `NOT NULL`.
    pub no_worker: &'static str,
    /// What "no error" is written as: `NULL`, or `''` where the column is `NOT NULL`.
    pub no_error: &'static str,
    /// The longest `last_error` the column takes, in characters.
    pub last_error_chars: usize,
}

impl Profile {
    /// The host's own table, as `migrations/` create it.
    pub fn native() -> Profile {
        Profile { key: Key::Id, no_worker: "NULL", no_error: "NULL", last_error_chars: NATIVE_LAST_ERROR_CHARS }
    }
}

/// `last_error VARCHAR(512)` in the host's own table.
const NATIVE_LAST_ERROR_CHARS: usize = 512;

/// The statuses, as the host writes them; `delivering` is the longest.
const STATUSES: [&str; 5] = ["pending", "delivering", "delivered", "retryable", "failed"];

/// The outcome of [`review`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    /// How the store writes to the table as it is (after the additions).
    pub profile: Profile,
    /// Columns and the index the host adds itself, each an online step.
    pub additions: Vec<Addition>,
    /// What cannot work as declared, each with the statement that would fix it. Nothing is
    /// added while there is one.
    pub problems: Vec<String>,
}

/// One thing `migrate` adds to an existing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addition {
    /// A column, with its type and default (`BIGINT NOT NULL DEFAULT 0`).
    Column {
        /// Its name.
        name: &'static str,
        /// Type, nullability and default, in the backend's words.
        definition: String,
    },
    /// The claim index `<table>_claim_idx`.
    ClaimIndex,
    /// SQLite's `<table>_pick_idx`, over the unfinished rows in creation order: what a
    /// claim and a partition owner's read walk (PostgreSQL's partial claim index is that;
    /// MySQL's claim index starts with the status).
    PickIndex,
}

impl std::fmt::Display for Addition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addition::Column { name, .. } => write!(f, "column {name}"),
            Addition::ClaimIndex => f.write_str("the claim index"),
            Addition::PickIndex => f.write_str("the pick index"),
        }
    }
}

/// What the host does with a column, which decides the types it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Written by the producer, read by the host: any string.
    Text,
    /// `pending` … `delivering`: a string of at least 10 characters (or an `ENUM` of all five).
    Status,
    /// The protobuf envelope: bytes.
    Envelope,
    /// UTC milliseconds: a 64-bit integer.
    Millis,
    /// A retry counter: an integer of at least 32 bits.
    Counter,
    /// `worker_id`: a string long enough for the host's worker id.
    Worker,
    /// `last_error`: any string; the host clips to fit.
    Error,
}

/// A column the host relies on; `add` is its definition when the host may add it (`None`:
/// only the producer can fill it, so it must be there).
struct Need {
    name: &'static str,
    role: Role,
    add: Option<[&'static str; 3]>,
}

/// Every column but `id`, in the seed's order. `add` is per backend: SQLite, PostgreSQL, MySQL.
const NEEDS: [Need; 17] = [
    Need {
        name: "app_code",
        role: Role::Text,
        add: Some(["TEXT NOT NULL DEFAULT ''", "VARCHAR(64) NOT NULL DEFAULT ''", "VARCHAR(64) NOT NULL DEFAULT ''"]),
    },
    Need { name: "event_id", role: Role::Text, add: None },
    Need { name: "event_type", role: Role::Text, add: None },
    Need { name: "room_id", role: Role::Text, add: None },
    Need { name: "status", role: Role::Status, add: None },
    Need { name: "envelope", role: Role::Envelope, add: None },
    Need { name: "created_at_ms", role: Role::Millis, add: None },
    Need {
        name: "retry_count",
        role: Role::Counter,
        add: Some(["INTEGER NOT NULL DEFAULT 0", "INTEGER NOT NULL DEFAULT 0", "INT NOT NULL DEFAULT 0"]),
    },
    Need { name: "last_error", role: Role::Error, add: Some(["TEXT", "VARCHAR(512)", "VARCHAR(512) NULL"]) },
    Need { name: "worker_id", role: Role::Worker, add: Some(["TEXT", "VARCHAR(128)", "VARCHAR(128) NULL"]) },
    Need {
        name: "lock_until_ms",
        role: Role::Millis,
        add: Some(["INTEGER NOT NULL DEFAULT 0", "BIGINT NOT NULL DEFAULT 0", "BIGINT NOT NULL DEFAULT 0"]),
    },
    Need {
        name: "next_retry_at_ms",
        role: Role::Millis,
        add: Some(["INTEGER NOT NULL DEFAULT 0", "BIGINT NOT NULL DEFAULT 0", "BIGINT NOT NULL DEFAULT 0"]),
    },
    // 0 = "not touched by a host since it was inserted"; purge also looks at created_at_ms.
    Need {
        name: "updated_at_ms",
        role: Role::Millis,
        add: Some(["INTEGER NOT NULL DEFAULT 0", "BIGINT NOT NULL DEFAULT 0", "BIGINT NOT NULL DEFAULT 0"]),
    },
    Need { name: "delivered_at_ms", role: Role::Millis, add: Some(["INTEGER", "BIGINT", "BIGINT NULL"]) },
    // When the fan-out copied the row to the other sinks' tables (0: not yet).
    Need {
        name: "fanned_out_at_ms",
        role: Role::Millis,
        add: Some(["INTEGER NOT NULL DEFAULT 0", "BIGINT NOT NULL DEFAULT 0", "BIGINT NOT NULL DEFAULT 0"]),
    },
    // The build of the sink that wrote the row's last outcome (`sha256:<hex>`).
    Need { name: "plugin_digest", role: Role::Error, add: Some(["TEXT", "VARCHAR(80)", "VARCHAR(80) NULL"]) },
    // The producer's trace context (W3C `traceparent`, then `;` and `tracestate` when there
    // is one); `NULL` where it has none. See `ops/traces.rs`.
    Need { name: "trace_context", role: Role::Text, add: Some(["TEXT", "VARCHAR(1024)", "VARCHAR(1024) NULL"]) },
];

/// The shape of a declared type, as far as the host cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Shape {
    Int { bits: u16 },
    Text { max_chars: Option<u64>, binary: bool },
    Bytes,
    Enum(Vec<String>),
    Other,
}

fn shape(backend: Backend, declared: &str) -> Shape {
    (backend.ddl().shape)(declared)
}

/// A server's declared type by its name; `text_unbounded`: `TEXT` has no length (PostgreSQL)
/// rather than 65,535 bytes (MySQL).
pub(super) fn server_shape(declared: &str, text_unbounded: bool) -> Shape {
    let t = declared.trim().to_ascii_lowercase();
    let base = t.split(['(', ' ']).next().unwrap_or_default();
    let length =
        t.split_once('(').and_then(|(_, rest)| rest.split([')', ',']).next()).and_then(|n| n.trim().parse().ok());
    match base {
        "bigint" | "int8" => Shape::Int { bits: 64 },
        "int" | "integer" | "int4" => Shape::Int { bits: 32 },
        "mediumint" => Shape::Int { bits: 24 },
        "smallint" | "int2" => Shape::Int { bits: 16 },
        "tinyint" => Shape::Int { bits: 8 },
        "varchar" | "char" | "character" | "nvarchar" | "nchar" => Shape::Text { max_chars: length, binary: false },
        "varbinary" => Shape::Text { max_chars: length, binary: true },
        "text" if text_unbounded => Shape::Text { max_chars: None, binary: false },
        "tinytext" => Shape::Text { max_chars: Some(255), binary: false },
        "text" => Shape::Text { max_chars: Some(65_535), binary: false },
        "mediumtext" | "longtext" => Shape::Text { max_chars: None, binary: false },
        "bytea" | "tinyblob" | "blob" | "mediumblob" | "longblob" => Shape::Bytes,
        "enum" => Shape::Enum(
            t.split_once('(')
                .map(|(_, values)| {
                    values.trim_end_matches(')').split(',').map(|v| v.trim().trim_matches('\'').to_string()).collect()
                })
                .unwrap_or_default(),
        ),
        _ => Shape::Other,
    }
}

/// Why a column of `shape` cannot serve `role`, if it cannot.
fn misfit(role: Role, shape: &Shape, worker_id_chars: usize) -> Option<String> {
    let text_ok = |min: usize| match shape {
        Shape::Text { max_chars, .. } => max_chars.is_none_or(|n| n as usize >= min),
        _ => false,
    };
    match role {
        Role::Text | Role::Error => (!text_ok(1)).then(|| "needs a string type (VARCHAR, TEXT)".to_string()),
        Role::Status => match shape {
            Shape::Enum(values) if STATUSES.iter().all(|s| values.iter().any(|v| v == s)) => None,
            Shape::Enum(_) => Some(format!("needs to hold every status ({})", STATUSES.join(", "))),
            _ if text_ok(10) => None,
            _ => Some("needs a string of at least 10 characters ('delivering')".to_string()),
        },
        Role::Envelope => match shape {
            Shape::Bytes | Shape::Text { binary: true, .. } => None,
            _ => Some("needs a binary type (BLOB, BYTEA, VARBINARY): it holds protobuf bytes".to_string()),
        },
        Role::Millis => match shape {
            Shape::Int { bits } if *bits >= 64 => None,
            _ => Some("needs a 64-bit integer (BIGINT): it holds UTC milliseconds".to_string()),
        },
        Role::Counter => match shape {
            Shape::Int { bits } if *bits >= 32 => None,
            _ => Some("needs an integer of at least 32 bits (INT, BIGINT)".to_string()),
        },
        Role::Worker => (!text_ok(worker_id_chars)).then(|| {
            format!(
                "needs a string of at least {worker_id_chars} characters, the length of this host's worker ids \
                 (<node_id>-<pid>-<8 hex digits>; a shorter node_id also does)"
            )
        }),
    }
}

/// The type a server's fix statement suggests for `role`; `envelope`: its binary type.
pub(super) fn server_suggested(role: Role, envelope: &'static str) -> &'static str {
    match role {
        Role::Millis => "BIGINT",
        Role::Counter => "INTEGER",
        Role::Envelope => envelope,
        Role::Status => "VARCHAR(16)",
        Role::Worker => "VARCHAR(128)",
        Role::Error => "VARCHAR(512)",
        Role::Text => "VARCHAR(128)",
    }
}

/// The statement that would change `column` to `ty`, for an operator to review and run.
fn fix(ddl: &Ddl, table: &str, column: &ColumnInfo, ty: &str) -> String {
    (ddl.fix)(table, &column.name, ty, if column.nullable { "NULL" } else { "NOT NULL" })
}

/// Reviews `info`, the existing `table`, for what the host needs. `worker_id_chars` is the
/// length of this host's worker ids, when known (`run`); `migrate` does not know which
/// hosts will run, so it only asks for a string there.
pub fn review(backend: Backend, table: &str, info: &TableInfo, worker_id_chars: Option<usize>) -> Review {
    let ddl = backend.ddl();
    let worker_id_chars = worker_id_chars.unwrap_or(1);
    let mut problems = Vec::new();
    let mut additions = Vec::new();
    for need in &NEEDS {
        match info.column(need.name) {
            Some(column) => {
                if let Some(why) = misfit(need.role, &shape(backend, &column.declared), worker_id_chars) {
                    problems.push(format!(
                        "column {} is {}: {why}. To fix: {}",
                        need.name,
                        column.declared,
                        fix(ddl, table, column, (ddl.suggested)(need.role))
                    ));
                }
            }
            None => match need.add {
                Some(per_backend) => {
                    let definition = per_backend[ddl.definition].to_string();
                    additions.push(Addition::Column { name: need.name, definition });
                }
                None => problems.push(format!(
                    "column {} is missing: the producer writes it, so the host cannot add it with a default",
                    need.name
                )),
            },
        }
    }
    let key = match info.column("id") {
        Some(id) => {
            if !matches!(shape(backend, &id.declared), Shape::Int { .. }) {
                problems
                    .push(format!("column id is {}: the host names rows by it, so it must be an integer", id.declared));
            } else if !info.unique("id") && !ddl.row_id {
                problems.push(format!(
                    "column id is not unique: the host names rows by it. To fix: add a unique index on {table} (id)"
                ));
            }
            Key::Id
        }
        None if ddl.row_id => Key::RowId,
        None => Key::EventId,
    };
    if !info.unique("event_id") && info.column("event_id").is_some() {
        let index = (ddl.unique_event_id)(table);
        problems.push(format!(
            "event_id is not unique: it is the event's idempotency key{}. To fix (after removing duplicates): {index}",
            if key == Key::EventId { " and, without an id column, how the host names a row" } else { "" }
        ));
    }
    let pick = ddl.row_id.then_some(("pick_idx", Addition::PickIndex));
    for (suffix, index) in [("claim_idx", Addition::ClaimIndex)].into_iter().chain(pick) {
        let name = format!("{table}_{suffix}");
        if !info.indexes.iter().any(|i| i.name == name) {
            additions.push(index);
        }
    }
    let text_column = |name: &str| info.column(name).map(|c| (c.nullable, shape(backend, &c.declared)));
    let blank = |name: &str| match text_column(name) {
        Some((false, _)) => "''",
        _ => "NULL",
    };
    let last_error_chars = match text_column("last_error") {
        Some((_, Shape::Text { max_chars: Some(n), .. })) => (n as usize).min(NATIVE_LAST_ERROR_CHARS),
        _ => NATIVE_LAST_ERROR_CHARS,
    };
    let profile = Profile { key, no_worker: blank("worker_id"), no_error: blank("last_error"), last_error_chars };
    Review { profile, additions, problems }
}

/// The statements that make `additions` on `table` whose rows the host names by `key`, each
/// online where the database can: MySQL adds columns with `ALGORITHM=INSTANT` (falling back
/// to `INPLACE, LOCK=NONE`, see [`mysql_fallback`]) and the index `INPLACE, LOCK=NONE`;
/// PostgreSQL adds columns with constant defaults (no rewrite) and builds the index
/// `CONCURRENTLY`, outside any transaction.
pub fn addition_statements(backend: Backend, table: &str, key: Key, additions: &[Addition]) -> Vec<String> {
    let columns: Vec<(&str, &str)> = additions
        .iter()
        .filter_map(|a| match a {
            Addition::Column { name, definition } => Some((*name, definition.as_str())),
            Addition::ClaimIndex | Addition::PickIndex => None,
        })
        .collect();
    let ddl = backend.ddl();
    let mut out = (ddl.add_columns)(table, &columns);
    let key_last = if key == Key::RowId { String::new() } else { format!(", {}", key.column()) };
    // An index PostgreSQL lists as invalid (a CONCURRENTLY build that failed half-way) is not
    // described, so it comes back here: drop it first, or IF NOT EXISTS would keep it.
    let rebuild = |out: &mut Vec<String>, name: &str| out.extend(ddl.drop_invalid_index.map(|drop| drop(table, name)));
    if additions.contains(&Addition::PickIndex) {
        out.push(format!(
            "CREATE INDEX IF NOT EXISTS {table}_pick_idx ON {table} (created_at_ms{key_last}) \
             WHERE status IN ('pending', 'retryable', 'delivering')"
        ));
    }
    if additions.contains(&Addition::ClaimIndex) {
        let k = key.column();
        rebuild(&mut out, "claim_idx");
        out.push((ddl.claim_index)(table, k, &key_last));
    }
    out
}

/// MySQL before 8.0.29 (and MariaDB before 10.3) cannot add a column anywhere but last, or
/// at all, with `ALGORITHM=INSTANT`; the same statement `INPLACE, LOCK=NONE` still lets
/// the producer's inserts through.
pub fn mysql_fallback(statement: &str) -> Option<String> {
    statement.strip_suffix("ALGORITHM=INSTANT").map(|s| format!("{s}ALGORITHM=INPLACE, LOCK=NONE"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, declared: &str, nullable: bool) -> ColumnInfo {
        ColumnInfo { name: name.into(), declared: declared.into(), nullable }
    }

    /// room-service's table as its Go code would create it on MySQL: no id, event_id the
    /// primary key, unsigned milliseconds, NOT NULL DEFAULT '' strings, a LONGBLOB envelope.
    fn go_table() -> TableInfo {
        TableInfo {
            columns: vec![
                column("event_id", "varchar(64)", false),
                column("app_code", "varchar(32)", false),
                column("event_type", "varchar(64)", false),
                column("room_id", "varbinary(64)", false),
                column("status", "varchar(16)", false),
                column("envelope", "longblob", false),
                column("created_at_ms", "bigint(20) unsigned", false),
                column("retry_count", "int(10) unsigned", false),
                column("last_error", "varchar(255)", false),
                column("worker_id", "varchar(128)", false),
                column("lock_until_ms", "bigint(20) unsigned", false),
                column("next_retry_at_ms", "bigint(20) unsigned", false),
            ],
            indexes: vec![
                IndexInfo { name: "PRIMARY".into(), unique: true, columns: vec!["event_id".into()] },
                IndexInfo {
                    name: "idx_status".into(),
                    unique: false,
                    columns: vec!["status".into(), "created_at_ms".into()],
                },
            ],
        }
    }

    #[test]
    fn a_go_made_mysql_table_is_adopted_by_adding_columns_and_the_claim_index() {
        let review = review(Backend::Mysql, "room_outbox", &go_table(), None);
        assert_eq!(review.problems, Vec::<String>::new());
        assert_eq!(
            review.profile,
            Profile { key: Key::EventId, no_worker: "''", no_error: "''", last_error_chars: 255 }
        );
        assert_eq!(
            addition_statements(Backend::Mysql, "room_outbox", review.profile.key, &review.additions),
            vec![
                "ALTER TABLE room_outbox ADD COLUMN updated_at_ms BIGINT NOT NULL DEFAULT 0, \
                 ADD COLUMN delivered_at_ms BIGINT NULL, ADD COLUMN fanned_out_at_ms BIGINT NOT NULL DEFAULT 0, \
                 ADD COLUMN plugin_digest VARCHAR(80) NULL, ADD COLUMN trace_context VARCHAR(1024) NULL, \
                 ALGORITHM=INSTANT"
                    .to_string(),
                "ALTER TABLE room_outbox ADD INDEX room_outbox_claim_idx (status, created_at_ms, event_id, next_retry_at_ms, \
                 lock_until_ms), ALGORITHM=INPLACE, LOCK=NONE"
                    .to_string(),
            ]
        );
    }

    #[test]
    fn every_column_that_cannot_work_is_named_with_its_fix() {
        let mut table = go_table();
        table.columns[4] = column("status", "varchar(8)", false);
        table.columns[5] = column("envelope", "text", false);
        table.columns[6] = column("created_at_ms", "int(11)", false);
        table.columns.retain(|c| c.name != "room_id");
        let review = review(Backend::Mysql, "room_outbox", &table, None);
        assert_eq!(review.problems.len(), 4, "{:#?}", review.problems);
        assert!(review.problems[0].starts_with("column room_id is missing"));
        assert_eq!(
            review.problems[1],
            "column status is varchar(8): needs a string of at least 10 characters ('delivering'). \
             To fix: ALTER TABLE room_outbox MODIFY COLUMN status VARCHAR(16) NOT NULL;"
        );
        assert!(review.problems[2].contains("column envelope is text: needs a binary type"));
        assert!(review.problems[3].contains("ALTER TABLE room_outbox MODIFY COLUMN created_at_ms BIGINT NOT NULL;"));
    }

    #[test]
    fn each_database_fixes_and_extends_a_table_in_its_own_words() {
        // A go table with a short status, no unique event_id, and no retry_count column.
        let mut table = go_table();
        table.columns[4] = column("status", "varchar(8)", false);
        table.columns.retain(|c| c.name != "retry_count");
        table.indexes.retain(|i| i.columns != ["event_id"]);
        let said = |backend| {
            let review = review(backend, "t", &table, None);
            let statements = addition_statements(backend, "t", review.profile.key, &review.additions);
            (review.problems, statements)
        };
        let (problems, statements) = said(Backend::Postgres);
        assert!(problems[0].ends_with("To fix: ALTER TABLE t ALTER COLUMN status TYPE VARCHAR(16);"), "{problems:?}");
        assert!(
            problems[1].ends_with("CREATE UNIQUE INDEX CONCURRENTLY t_event_id_uq ON t (event_id);"),
            "{problems:?}"
        );
        assert_eq!(statements[0], "ALTER TABLE t ADD COLUMN IF NOT EXISTS retry_count INTEGER NOT NULL DEFAULT 0");
        let (problems, statements) = said(Backend::Mysql);
        assert!(problems[0].ends_with("MODIFY COLUMN status VARCHAR(16) NOT NULL;"), "{problems:?}");
        assert!(problems[1].ends_with("ADD UNIQUE INDEX t_event_id_uq (event_id), ALGORITHM=INPLACE, LOCK=NONE;"));
        assert!(statements[0].starts_with("ALTER TABLE t ADD COLUMN retry_count INT NOT NULL DEFAULT 0, ADD COLUMN"));
        assert!(statements[0].ends_with(", ALGORITHM=INSTANT"), "one statement for every column: {statements:?}");
        let (problems, statements) = said(Backend::Sqlite);
        // By affinity a short VARCHAR holds any length, and VARBINARY is no string at all.
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("column room_id is varbinary(64)"), "{problems:?}");
        assert!(problems[0].ends_with(
            "cannot change a column's type in place: rebuild t with room_id TEXT \
             (https://www.sqlite.org/lang_altertable.html#otheralter)"
        ));
        assert!(problems[1].ends_with("CREATE UNIQUE INDEX t_event_id_uq ON t (event_id);"), "{problems:?}");
        assert_eq!(statements[0], "ALTER TABLE t ADD COLUMN retry_count INTEGER NOT NULL DEFAULT 0");
    }

    /// The host's own table, as the baseline makes it and `migrate` completes it (the
    /// columns added since the baseline, `trace_context`, are added as to an adopted table).
    #[test]
    fn the_hosts_own_tables_need_nothing() {
        let native = |backend, columns: &[(&str, &str, bool)], indexes: Vec<IndexInfo>| {
            let info = TableInfo { columns: columns.iter().map(|(n, t, null)| column(n, t, *null)).collect(), indexes };
            review(backend, "room_outbox", &info, None)
        };
        let pg = native(
            Backend::Postgres,
            &[
                ("id", "bigint", false),
                ("app_code", "character varying(64)", false),
                ("event_id", "character varying(128)", false),
                ("event_type", "character varying(128)", false),
                ("room_id", "character varying(128)", false),
                ("status", "character varying(16)", false),
                ("envelope", "bytea", false),
                ("created_at_ms", "bigint", false),
                ("retry_count", "integer", false),
                ("last_error", "character varying(512)", true),
                ("worker_id", "character varying(128)", true),
                ("lock_until_ms", "bigint", false),
                ("next_retry_at_ms", "bigint", false),
                ("updated_at_ms", "bigint", false),
                ("delivered_at_ms", "bigint", true),
                ("fanned_out_at_ms", "bigint", false),
                ("plugin_digest", "character varying(80)", true),
                ("trace_context", "character varying(1024)", true),
            ],
            vec![
                IndexInfo { name: "room_outbox_pkey".into(), unique: true, columns: vec!["id".into()] },
                IndexInfo { name: "room_outbox_event_id_key".into(), unique: true, columns: vec!["event_id".into()] },
                IndexInfo { name: "room_outbox_claim_idx".into(), unique: false, columns: vec![] },
            ],
        );
        assert_eq!((pg.problems, pg.additions, pg.profile), (vec![], vec![], Profile::native()));
    }

    #[test]
    fn sqlite_names_rows_by_rowid_without_an_id_and_reads_types_by_affinity() {
        let info = TableInfo {
            columns: [
                "event_id TEXT",
                "event_type TEXT",
                "room_id TEXT",
                "status TEXT",
                "envelope BLOB",
                "created_at_ms INTEGER",
            ]
            .iter()
            .map(|c| {
                let (n, t) = c.split_once(' ').unwrap();
                column(n, t, false)
            })
            .collect(),
            indexes: vec![IndexInfo {
                name: "sqlite_autoindex_room_outbox_1".into(),
                unique: true,
                columns: vec!["event_id".into()],
            }],
        };
        let review = review(Backend::Sqlite, "room_outbox", &info, None);
        assert_eq!(review.problems, Vec::<String>::new());
        assert_eq!(review.profile.key, Key::RowId);
        let statements = addition_statements(Backend::Sqlite, "room_outbox", Key::RowId, &review.additions);
        assert_eq!(statements.len(), 13, "eleven columns and two indexes: {statements:#?}");
        assert_eq!(
            statements[11..],
            [
                "CREATE INDEX IF NOT EXISTS room_outbox_pick_idx ON room_outbox (created_at_ms) \
                 WHERE status IN ('pending', 'retryable', 'delivering')",
                "CREATE INDEX IF NOT EXISTS room_outbox_claim_idx ON room_outbox (status, next_retry_at_ms, created_at_ms)"
            ]
        );
    }

    #[test]
    fn a_short_worker_id_column_is_refused_for_a_host_whose_ids_do_not_fit() {
        let mut table = go_table();
        table.columns[9] = column("worker_id", "varchar(32)", true);
        assert!(review(Backend::Mysql, "room_outbox", &table, None).problems.is_empty(), "migrate cannot know");
        assert!(review(Backend::Mysql, "room_outbox", &table, Some(30)).problems.is_empty());
        let problems = review(Backend::Mysql, "room_outbox", &table, Some(40)).problems;
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("column worker_id is varchar(32): needs a string of at least 40 characters"));
    }

    #[test]
    fn enum_statuses_need_all_five() {
        assert_eq!(
            misfit(
                Role::Status,
                &shape(Backend::Mysql, "enum('pending','delivering','delivered','retryable','failed','published')"),
                0
            ),
            None
        );
        assert!(misfit(Role::Status, &shape(Backend::Mysql, "enum('pending','published')"), 0).is_some());
    }

    #[test]
    fn postgres_builds_indexes_concurrently_replacing_an_invalid_one() {
        let statements = addition_statements(Backend::Postgres, "t", Key::EventId, &[Addition::ClaimIndex]);
        assert_eq!(
            statements,
            vec![
                "DROP INDEX CONCURRENTLY IF EXISTS t_claim_idx".to_string(),
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS t_claim_idx ON t (created_at_ms, event_id) \
                 WHERE status IN ('pending', 'retryable', 'delivering')"
                    .to_string(),
            ]
        );
    }

    #[test]
    fn mysql_falls_back_from_instant_to_inplace() {
        assert_eq!(
            mysql_fallback("ALTER TABLE t ADD COLUMN x BIGINT NULL, ALGORITHM=INSTANT").as_deref(),
            Some("ALTER TABLE t ADD COLUMN x BIGINT NULL, ALGORITHM=INPLACE, LOCK=NONE")
        );
        assert_eq!(mysql_fallback("ALTER TABLE t ADD INDEX i (x), ALGORITHM=INPLACE, LOCK=NONE"), None);
    }
}
