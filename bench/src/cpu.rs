//! Where a drain's processor time went: the host (this process, whose workers run in it)
//! and the database server when it runs on this machine. On two shared cores the sum says
//! whether a drain is bound by the processors or by a serial path (a claim waited on), and
//! the split says which side to make cheaper.
//!
//! Read from `/proc`, in the kernel's clock ticks (`USER_HZ`, which Linux reports as 100 a
//! second whatever the kernel's own tick).

use std::time::Instant;

use outbox_host::store::Backend;

use crate::db::Db;

const TICKS_PER_SECOND: f64 = 100.0;

/// Cores used on average over a measured span: processor seconds over wall seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cores {
    pub host: f64,
    /// `None` when the server is not a process of this machine this benchmark can read
    /// (SQLite runs inside the host).
    pub server: Option<f64>,
}

impl Cores {
    /// "host 0.31, server 1.10 cores", or "host 0.93 cores".
    pub fn describe(&self) -> String {
        match self.server {
            Some(server) => format!("host {:.2}, server {server:.2} cores", self.host),
            None => format!("host {:.2} cores", self.host),
        }
    }
}

/// Started before a drain, read after it.
pub struct Meter {
    started: Instant,
    host_ticks: u64,
    /// The server's process and its ticks at the start.
    server: Option<(u32, u64)>,
}

impl Meter {
    pub async fn start(db: &Db) -> Meter {
        let server = server_pid(db).await.and_then(|pid| Some((pid, tree_ticks(pid)?)));
        Meter { started: Instant::now(), host_ticks: tree_ticks(std::process::id()).unwrap_or(0), server }
    }

    pub fn read(&self) -> Cores {
        let wall = self.started.elapsed().as_secs_f64().max(f64::EPSILON);
        let cores = |before: u64, after: u64| after.saturating_sub(before) as f64 / TICKS_PER_SECOND / wall;
        Cores {
            host: tree_ticks(std::process::id()).map_or(0.0, |now| cores(self.host_ticks, now)),
            server: self.server.and_then(|(pid, before)| tree_ticks(pid).map(|now| cores(before, now))),
        }
    }
}

/// The processor seconds this process (and its children) used so far.
pub fn host_seconds() -> f64 {
    tree_ticks(std::process::id()).unwrap_or(0) as f64 / TICKS_PER_SECOND
}

/// The server's process on this machine, from the pid file it names: MariaDB/MySQL is one
/// process, PostgreSQL's postmaster the parent of its backends. `None` for SQLite, for a
/// server elsewhere, or when the file cannot be read.
async fn server_pid(db: &Db) -> Option<u32> {
    let (file, process) = match db.backend {
        Backend::Sqlite => return None,
        Backend::Mysql => {
            let pool = sqlx::MySqlPool::connect(db.url()).await.ok()?;
            let file: String = sqlx::query_scalar("SELECT @@pid_file").fetch_one(&pool).await.ok()?;
            pool.close().await;
            (file, ["mariadbd", "mysqld"].as_slice())
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(db.url()).await.ok()?;
            let dir: String = sqlx::query_scalar("SHOW data_directory").fetch_one(&pool).await.ok()?;
            pool.close().await;
            (format!("{dir}/postmaster.pid"), ["postgres", "postmaster"].as_slice())
        }
    };
    let pid: u32 = std::fs::read_to_string(file).ok()?.lines().next()?.trim().parse().ok()?;
    // A pid file of a server on another machine can name a process of this one.
    let (name, _) = stat(pid)?;
    process.iter().any(|p| name.starts_with(p)).then_some(pid)
}

/// Ticks `pid` has used, with those of its children (live ones read directly, reaped ones
/// from the parent's `cutime` and `cstime`): a PostgreSQL backend that exits during the
/// drain still counts.
fn tree_ticks(pid: u32) -> Option<u64> {
    let (_, own) = stat(pid)?;
    let mut total = own.self_ticks + own.reaped_ticks;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Some((_, c)) = stat(child).filter(|(_, c)| c.parent == pid) {
            total += c.self_ticks + c.reaped_ticks;
        }
    }
    Some(total)
}

#[derive(Debug, PartialEq)]
struct Times {
    parent: u32,
    self_ticks: u64,
    reaped_ticks: u64,
}

fn stat(pid: u32) -> Option<(String, Times)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `/proc/<pid>/stat`: the command name sits in parentheses and may hold spaces and
/// parentheses itself, so the fields are counted from the last `)`.
fn parse_stat(line: &str) -> Option<(String, Times)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let name = line.get(open + 1..close)?.to_string();
    // After the name: state (field 3), ppid (4), … utime (14), stime (15), cutime (16), cstime (17).
    let fields: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some((
        name,
        Times {
            parent: u32::try_from(field(4)?).ok()?,
            self_ticks: field(14)? + field(15)?,
            reaped_ticks: field(16)? + field(17)?,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_a_name_with_spaces_and_parentheses() {
        let line = "4242 (tokio (rt) worker) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 31 7 2 20 0 9 0 \
                    123 4096 100 18446744073709551615";
        let (name, times) = parse_stat(line).expect("parsed");
        assert_eq!(name, "tokio (rt) worker");
        assert_eq!(times, Times { parent: 17, self_ticks: 281, reaped_ticks: 9 });
    }

    #[test]
    fn a_child_that_burned_processor_time_and_exited_still_counts() {
        let me = std::process::id();
        let (_, own_before) = stat(me).expect("this process's stat");
        let before = tree_ticks(me).expect("this process's ticks");
        // About half a second of a shell's arithmetic, in a child this process reaps.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(status.success());
        let (_, own_after) = stat(me).expect("this process's stat");
        let after = tree_ticks(me).expect("this process's ticks");
        let reaped = own_after.reaped_ticks - own_before.reaped_ticks;
        assert!(reaped >= 5, "the reaped child's time is in cutime/cstime: {own_before:?} → {own_after:?}");
        assert!(after - before >= reaped, "the tree's ticks {before} → {after} hold the child's {reaped}");
    }
}
