//! Redis Streams: each record `XADD`ed to the stream its destination names, its headers,
//! key and payload as the entry's fields. Redis 7.0 has no idempotent `XADD`, so a Lua
//! script adds an entry only if the record's dedup marker is absent, and sets the marker
//! (`outbox-dedup:{<stream>}:<dedup id>`, expiring after `dedup_window`) in the same atomic
//! step: an event delivered again within the window adds nothing. An event's records are
//! added one after another, each acknowledged by the script's reply.

use std::time::Duration;

use anyhow::Context as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::confine::{Destinations, REDIS_MARKER_PREFIX};
use super::settings::{BrokerConfig, BrokerKind};
use super::{Acks, Publish, PublishError, dedup_id};
use crate::sandbox::relay::Record;

/// KEYS: the stream, the dedup marker. ARGV: the window in seconds, MAXLEN (0: none), then
/// field, value, field, value… Replies 1 when the entry was added, 0 when the marker was
/// already there (a duplicate).
const ADD_ONCE: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local add = {KEYS[1]}
if tonumber(ARGV[2]) > 0 then
  add[#add + 1] = 'MAXLEN'; add[#add + 1] = '~'; add[#add + 1] = ARGV[2]
end
add[#add + 1] = '*'
for i = 3, #ARGV do add[#add + 1] = ARGV[i] end
redis.call('XADD', unpack(add))
redis.call('SET', KEYS[2], '1', 'EX', ARGV[1])
return 1
";

/// How the connection comes back after the server went away: a few quick tries, each
/// connect bounded, then the next command (a publish, or the 2 s probe) starts another
/// round. The client's default backs off up to 6.4 s between tries, so a server back in a
/// moment could wait seconds more before the first publish reached it, and the breaker's
/// trial met the stale backoff and doubled its cool-down.
fn reconnect() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_number_of_retries(3)
        .set_max_delay(500)
        .set_connection_timeout(Duration::from_secs(2))
}

/// Whether `e` says the server could not be reached (as opposed to answered and refused).
fn away(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_refusal() || e.is_timeout() || e.is_connection_dropped()
}

/// The entry field that holds a record's key, and the one that holds its payload.
pub const KEY_FIELD: &str = "key";
/// See [`KEY_FIELD`].
pub const PAYLOAD_FIELD: &str = "payload";

/// A Redis Streams publisher on one multiplexed, self-reconnecting connection.
pub struct RedisPublisher {
    name: String,
    connection: ConnectionManager,
    script: redis::Script,
    window_s: u64,
    max_len: u64,
    destinations: Destinations,
}

impl RedisPublisher {
    /// Connects (with `user` and `password` when given) and checks the server answers.
    pub async fn connect(config: &BrokerConfig) -> anyhow::Result<RedisPublisher> {
        let name = &config.name;
        let url = crate::redact::url(&config.url);
        let mut info = redis::IntoConnectionInfo::into_connection_info(config.url.as_str())
            .with_context(|| format!("broker {name}: {url} is not a Redis address"))?;
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            info.redis.username = Some(user.clone());
            info.redis.password = Some(password.clone());
        }
        let client = redis::Client::open(info).with_context(|| format!("broker {name}: {url}"))?;
        let mut connection =
            super::reach(name, &url, ConnectionManager::new_with_config(client, reconnect()), away).await?;
        let _: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .with_context(|| format!("broker {name}: {url} does not answer PING"))?;
        tracing::info!(broker = %name, dedup_window = ?config.dedup_window, "relaying to Redis Streams");
        Ok(RedisPublisher {
            name: name.clone(),
            connection,
            script: redis::Script::new(ADD_ONCE),
            window_s: config.dedup_window.as_secs().max(1),
            max_len: config.max_len.unwrap_or(0),
            // Required in the config: no default.
            destinations: Destinations::of(config, Vec::new()),
        })
    }

    /// The dedup marker of record `id` on `stream`: in the stream's hash slot, so the script
    /// touches one slot on a cluster too (for a stream name without braces).
    fn marker(stream: &str, id: &str) -> String {
        format!("{REDIS_MARKER_PREFIX}{{{stream}}}:{id}")
    }
}

#[async_trait::async_trait]
impl Publish for RedisPublisher {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> BrokerKind {
        BrokerKind::Redis
    }

    fn destinations(&self) -> &Destinations {
        &self.destinations
    }

    /// A PING on the connection, which reconnects by itself.
    async fn probe(&self) -> Result<(), String> {
        let mut connection = self.connection.clone();
        redis::cmd("PING").query_async::<()>(&mut connection).await.map_err(|e| format!("broker {}: {e}", self.name))
    }

    /// Adds the records one after another, each acknowledged by the script's reply: what
    /// is handed back has every ack already.
    async fn send(&self, event_id: &str, records: Vec<Record>) -> Result<Acks, PublishError> {
        let (count, mut duplicates) = (records.len(), 0);
        for (i, record) in records.into_iter().enumerate() {
            let id = dedup_id(event_id, i, count);
            let mut call = self.script.key(&record.destination);
            call.key(Self::marker(&record.destination, &id)).arg(self.window_s).arg(self.max_len);
            for (field, value) in &record.headers {
                call.arg(field).arg(value);
            }
            if let Some(key) = &record.key {
                call.arg(KEY_FIELD).arg(key);
            }
            call.arg(PAYLOAD_FIELD).arg(record.payload);
            let mut connection = self.connection.clone();
            let added: i64 = call.invoke_async(&mut connection).await.map_err(|e| {
                let message = format!("XADD to {}: {e}", record.destination);
                if away(&e) { PublishError::Unavailable(message) } else { PublishError::Refused(message) }
            })?;
            duplicates += u64::from(added == 0);
        }
        Ok(Box::pin(std::future::ready(Ok(duplicates))))
    }
}
