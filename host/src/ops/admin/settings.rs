//! `admin:`: where the admin listener binds and who may change state through it. The
//! config module reads it from YAML.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// Default `admin.stats_interval`.
pub const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(5);
/// Default `admin.unready_after_db_failures`: a few failures ride out a failover, a run
/// of them means the host cannot work.
pub const DEFAULT_UNREADY_AFTER_DB_FAILURES: u32 = 3;
/// Default `admin.listen`: loopback only.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9464";

/// `admin:`.
#[derive(Clone)]
pub struct AdminConfig {
    /// Where the listener binds (`None` when `admin.listen` is empty).
    pub listen: Option<SocketAddr>,
    /// How often the table counts behind the metrics' gauges are read.
    pub stats_interval: Duration,
    /// `/readyz` answers 503 once this many claims or outcome writes in a row have failed.
    pub unready_after_db_failures: u32,
    /// The bearer token that mutating endpoints require; without one they are refused.
    pub token: Option<String>,
    /// `Host` names answered besides IP literals and `localhost` (DNS-rebinding defence).
    pub allowed_hosts: Vec<String>,
}

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("stats_interval", &self.stats_interval)
            .field("unready_after_db_failures", &self.unready_after_db_failures)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}
