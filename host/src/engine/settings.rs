//! `outbox_worker:`: the worker's settings, with the room-service defaults. The config
//! module reads them from YAML; everything here only describes them.

use std::time::Duration;

/// Default `outbox_worker.poll_interval` (room-service's): the idle wait between empty claims.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default `outbox_worker.batch_size` (room-service's): rows claimed at most per claim.
pub const DEFAULT_BATCH_SIZE: u32 = 100;
/// Default `outbox_worker.publish_timeout` (room-service's): the bound on one delivery.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(3);
/// Default `outbox_worker.max_retry_interval`: the longest wait of the exponential strategy.
pub const DEFAULT_MAX_RETRY_INTERVAL: Duration = Duration::from_secs(300);

/// `sink.rate_limit` and `sink.rate_burst`: deliveries this host starts, at most.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained starts per second.
    pub per_second: f64,
    /// Starts allowed at once after a quiet spell.
    pub burst: u32,
}

/// `outbox_worker.ordering`: whether a room's events are delivered strictly in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomOrdering {
    /// A room's event is attempted only when every earlier one is finished, across retries
    /// and hosts: what an IM relay needs, so the default. A claim takes each room's run
    /// (its head and the next events behind it).
    PerRoom,
    /// Any claimable event, in creation order; one host still runs a room's events one at a
    /// time, but a retry can be overtaken. For sinks that do not care about order and want
    /// every event per second they can get.
    None,
}

impl RoomOrdering {
    /// Its name in the config.
    pub fn name(self) -> &'static str {
        match self {
            RoomOrdering::PerRoom => "per_room",
            RoomOrdering::None => "none",
        }
    }
}

/// `outbox_worker.retry_strategy`: how long a `retryable` row waits before its next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryStrategy {
    /// room-service's, and the default: `retry_interval` every time, forever unless
    /// `max_attempts` is set.
    FixedInterval,
    /// `retry_interval × 2^(attempt-1)`, at most `max_retry_interval`, with full jitter (a
    /// random wait between 0 and that), so that a backlog that failed together does not
    /// come back together.
    Exponential,
}

impl RetryStrategy {
    /// Every strategy, by its config value.
    pub const ALL: [(&str, RetryStrategy); 2] =
        [("fixed_interval", RetryStrategy::FixedInterval), ("exponential", RetryStrategy::Exponential)];
}
/// Default `outbox_worker.concurrency`: deliveries in flight at once (events of one room
/// always go one after another).
pub const DEFAULT_CONCURRENCY: u32 = 16;
/// `batch_size` above this is refused: a claim that large holds locks for too long. A
/// grown claim stays within it too.
pub const MAX_BATCH_SIZE: u32 = 10_000;
/// The most rows a claim of `base` may grow to with `growth`: `base × growth`, within
/// [`MAX_BATCH_SIZE`] (but never below `base`).
pub fn largest_claim(base: u32, growth: u32) -> u32 {
    base.saturating_mul(growth.max(1)).min(MAX_BATCH_SIZE).max(base)
}
/// Default `outbox_worker.claim_growth` on PostgreSQL and MySQL/MariaDB: behind a backlog a
/// claim grows to at most this many times `batch_size` (SQLite's default is 1).
pub const DEFAULT_CLAIM_GROWTH: u32 = 4;
/// Safety margin added to the computed minimum lease.
pub const LEASE_MARGIN: Duration = Duration::from_secs(5);
/// Default `outbox_worker.probe_interval`: how often an idle worker that probes checks for
/// pending rows.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_millis(20);

/// How an idle worker learns of new rows before its next `poll_interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeUp {
    /// `notify` on PostgreSQL, `probe` elsewhere (the default).
    Auto,
    /// PostgreSQL's `LISTEN`/`NOTIFY`, sent by a trigger on every insert.
    Notify,
    /// An index-only check for pending rows every `probe_interval`.
    Probe,
    /// Nothing but `poll_interval` (and inserts made through this process's own store).
    Poll,
}

impl WakeUp {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            WakeUp::Auto => "auto",
            WakeUp::Notify => "notify",
            WakeUp::Probe => "probe",
            WakeUp::Poll => "poll",
        }
    }
}

/// Default `outbox_worker.partitions`: rooms hash to this many partitions per sink, which
/// hosts lease. 64 spreads evenly over up to 8 hosts (8 each) and still gives 16 or more
/// hosts a few each; an idle partition costs one small row, rewritten at each heartbeat
/// (its lease renewed) while a host holds it.
pub const DEFAULT_PARTITIONS: u32 = crate::store::partitions::DEFAULT_PARTITIONS;
/// The most partitions a sink may have.
pub const MAX_PARTITIONS: u32 = 4_096;
/// Default `outbox_worker.partition_lease`: how long a partition stays with a host that
/// stopped renewing it (a heartbeat every third of it), so how long a SIGKILLed host's rooms
/// wait.
pub const DEFAULT_PARTITION_LEASE: Duration = Duration::from_secs(10);

/// `lease_duration` is at least this by default, above the computed minimum.
pub const DEFAULT_LEASE_FLOOR: Duration = Duration::from_secs(30);
/// Default `outbox_worker.shutdown_grace`: how long outcomes may take to be written after
/// the in-flight deliveries have finished, before the host gives up on a database that is away.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// `outbox_worker:`.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Whether `run` delivers at all (room-service lets tests turn it off).
    pub enabled: bool,
    /// Idle wait after a claim that was not full.
    pub poll_interval: Duration,
    /// Rows per claim.
    pub batch_size: u32,
    /// Behind a backlog, how many times `batch_size` a claim may grow to; `None`: the
    /// backend's default (4 on the server databases, 1 on SQLite).
    pub claim_growth: Option<u32>,
    /// Bound on one delivery, sandbox and HTTP included.
    pub publish_timeout: Duration,
    /// Wait before a `retryable` row may be claimed again (default: `poll_interval`); the
    /// exponential strategy's base.
    pub retry_interval: Duration,
    /// How the wait grows with the attempts.
    pub retry_strategy: RetryStrategy,
    /// The exponential strategy's longest wait.
    pub max_retry_interval: Duration,
    /// Deliveries in flight at once.
    pub concurrency: u32,
    /// How long a claim holds its rows (`lock_until_ms - now`).
    pub lease: Duration,
    /// After this many failed attempts a row becomes `failed`; 0 retries forever (as room-service did).
    pub max_attempts: u32,
    /// How an idle worker learns of new rows before its next poll.
    pub wake_up: WakeUp,
    /// How often an idle worker that probes checks for pending rows.
    pub probe_interval: Duration,
    /// Whether a room's events keep their order across retries and hosts.
    pub ordering: RoomOrdering,
    /// With per-room order, whether a `failed` event holds its room's later ones back.
    pub failed_blocks_room: bool,
    /// With per-room order, how many partitions a new sink's rooms hash to.
    pub partitions: u32,
    /// With per-room order, how long a partition's lease lasts without a heartbeat.
    pub partition_lease: Duration,
    /// The sink's `rate_limit` (set from the `sink:` section): none by default.
    pub rate_limit: Option<RateLimit>,
    /// The sink's `rate_limit.per_room`: each room's deliveries this host starts, at most
    /// (under `ordering: per_room`, which a room's partition gives to one host at a time).
    pub room_rate_limit: Option<RateLimit>,
    /// The sink's circuit breaker (set from `sink.breaker`).
    pub breaker: super::breaker::BreakerSettings,
    /// After shutdown begins and in-flight deliveries have finished, how long the host keeps
    /// trying to write their outcomes and hand back unstarted rows before it gives up.
    pub shutdown_grace: Duration,
}

impl WorkerConfig {
    /// How many times `batch_size` a claim may grow to behind a backlog on `backend`:
    /// `claim_growth`, by default [`DEFAULT_CLAIM_GROWTH`] on the server databases and 1
    /// (never) on SQLite, where larger claims measured slower; 1 under a rate limit, whose
    /// claims are already sized to it.
    pub fn claim_growth_on(&self, backend: crate::store::Backend) -> u32 {
        if self.rate_limit.is_some() {
            return 1;
        }
        self.claim_growth.unwrap_or(match backend {
            crate::store::Backend::Sqlite => 1,
            crate::store::Backend::Postgres | crate::store::Backend::Mysql => DEFAULT_CLAIM_GROWTH,
        })
    }

    /// The shortest partition lease for deliveries of `publish_timeout`: an owner starts a
    /// delivery only while its lease has `publish_timeout` and a second left, and renews it
    /// every third, so twice that leaves a third of it to spare for a late heartbeat.
    pub fn min_partition_lease(publish_timeout: Duration) -> Duration {
        (publish_timeout + Duration::from_secs(1)) * 2
    }

    /// The shortest lease that covers a healthy batch: every delivery slot runs its share
    /// of the batch back to back, each taking up to `publish_timeout`.
    pub fn min_lease(batch_size: u32, concurrency: u32, publish_timeout: Duration) -> Duration {
        let rounds = batch_size.div_ceil(concurrency.max(1));
        publish_timeout * rounds + LEASE_MARGIN
    }

    /// The lease when `lease_duration` is not set: the minimum, but at least
    /// [`DEFAULT_LEASE_FLOOR`].
    pub fn default_lease(batch_size: u32, concurrency: u32, publish_timeout: Duration) -> Duration {
        Self::min_lease(batch_size, concurrency, publish_timeout).max(DEFAULT_LEASE_FLOOR)
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            enabled: true,
            poll_interval: DEFAULT_POLL_INTERVAL,
            batch_size: DEFAULT_BATCH_SIZE,
            claim_growth: None,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            retry_interval: DEFAULT_POLL_INTERVAL,
            retry_strategy: RetryStrategy::FixedInterval,
            max_retry_interval: DEFAULT_MAX_RETRY_INTERVAL,
            rate_limit: None,
            room_rate_limit: None,
            breaker: super::breaker::BreakerSettings::default(),
            ordering: RoomOrdering::PerRoom,
            failed_blocks_room: false,
            partitions: DEFAULT_PARTITIONS,
            partition_lease: DEFAULT_PARTITION_LEASE,
            concurrency: DEFAULT_CONCURRENCY,
            lease: Self::default_lease(DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, DEFAULT_PUBLISH_TIMEOUT),
            max_attempts: 0,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            wake_up: WakeUp::Auto,
            probe_interval: DEFAULT_PROBE_INTERVAL,
        }
    }
}
