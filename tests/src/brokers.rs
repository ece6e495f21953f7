//! Brokers of a test's own: a `nats-server -js`, a `redis-server`, a `mosquitto` or a
//! `tansu` (Kafka), on a free loopback port (NATS and tansu with their store in a temporary
//! directory); killed when dropped, and restartable on the same port and store (a broker
//! restart).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Which server.
#[derive(Clone, Copy, Debug)]
pub enum Broker {
    /// Debian's `nats-server`, with JetStream.
    Nats,
    /// Debian's `redis-server`, keeping nothing on disk.
    Redis,
    /// Debian's `mosquitto`, keeping persistent sessions in its store across a clean
    /// restart.
    Mosquitto,
    /// tansu, a Kafka-protocol broker, keeping its topics in a SQLite file of the store;
    /// installed by `scripts/ensure-kafka.sh` (`make test` runs it).
    Kafka,
}

/// Where `scripts/ensure-kafka.sh` installs tansu.
pub fn tansu() -> std::path::PathBuf {
    let root = match std::env::var_os("TANSU_ROOT") {
        Some(root) => std::path::PathBuf::from(root),
        None => {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/tansu")
        }
    };
    root.join("bin/tansu")
}

impl Broker {
    fn program(self) -> &'static str {
        match self {
            Broker::Nats => "nats-server",
            Broker::Redis => "redis-server",
            Broker::Mosquitto => "mosquitto",
            Broker::Kafka => "tansu",
        }
    }

    fn scheme(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::Redis => "redis",
            Broker::Mosquitto => "mqtt",
            Broker::Kafka => "tcp",
        }
    }
}

/// A running broker of a test's own.
pub struct BrokerServer {
    broker: Broker,
    port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
    /// Kafka: clients must authenticate (SASL SCRAM, the users of [`BrokerServer::add_kafka_user`]).
    authentication: bool,
}

/// The NATS server of the relay tests.
pub type NatsServer = BrokerServer;

impl BrokerServer {
    /// A `nats-server -js`, listening.
    pub async fn start() -> BrokerServer {
        BrokerServer::of(Broker::Nats).await
    }

    /// One of `broker`, listening.
    pub async fn of(broker: Broker) -> BrokerServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut server =
            BrokerServer { broker, port, store: tempfile::tempdir().unwrap(), child: None, authentication: false };
        server.restart().await;
        server
    }

    /// `<scheme>://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.broker.scheme(), self.port)
    }

    /// Kafka: adds SCRAM-SHA-512 user `name` with `password` (through tansu's own CLI, while
    /// the broker takes clients without authentication).
    pub fn add_kafka_user(&self, name: &str, password: &str) {
        let broker = format!("tcp://127.0.0.1:{}", self.port);
        let out = Command::new(tansu())
            .args(["user", "create", name, password, "--mechanism", "scram512", "--broker", &broker])
            .output()
            .expect("running tansu user create");
        assert!(out.status.success(), "tansu user create: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Kafka: restarts the broker on its store requiring clients to authenticate.
    pub async fn require_authentication(&mut self) {
        self.authentication = true;
        self.restart().await;
    }

    /// Kafka: restarts the broker on its store taking clients without authentication again.
    pub async fn require_authentication_no_more(&mut self) {
        self.authentication = false;
        self.restart().await;
    }

    /// `127.0.0.1:<port>`: a Kafka client's bootstrap server.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Sends it `kill -<signal>` (`STOP` freezes it with its connections open, `CONT`
    /// thaws it).
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the server runs");
        let status = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill -{signal} {}", child.id());
    }

    /// Kills the server (SIGKILL: nothing is flushed beyond what it already wrote).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub async fn restart(&mut self) {
        self.stop();
        let port = self.port.to_string();
        let mut command = Command::new(self.broker.program());
        match self.broker {
            Broker::Nats => command.args(["-js", "-a", "127.0.0.1", "-p", &port, "-sd"]).arg(self.store.path()),
            Broker::Redis => command.args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]),
            Broker::Mosquitto => {
                // Persistent sessions kept in the store across a clean restart (SIGTERM).
                // Started as root, mosquitto drops to its own user: the store must let it write.
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(self.store.path(), std::fs::Permissions::from_mode(0o777))
                    .expect("opening the store to mosquitto");
                let config = self.store.path().join("mosquitto.conf");
                let text = format!(
                    "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n",
                    self.store.path().display()
                );
                std::fs::write(&config, text).expect("writing mosquitto.conf");
                command.arg("-c").arg(config)
            }
            Broker::Kafka => {
                let tansu = tansu();
                assert!(
                    tansu.exists(),
                    "{} is missing: scripts/ensure-kafka.sh installs it (make test runs it)",
                    tansu.display()
                );
                command = Command::new(tansu);
                let listener = format!("tcp://127.0.0.1:{port}");
                command.args(["broker", "--listener-url", &listener, "--advertised-listener-url", &listener]);
                // tansu reads the file's path relative to its working directory.
                if self.authentication {
                    command.arg("--authentication");
                }
                command.args(["--storage-engine", "sqlite://tansu.db"]).current_dir(self.store.path())
            }
        };
        let program = self.broker.program();
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e} (Debian's package of that name)"));
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{program} did not listen on port {} within 5 s", self.port);
    }
}

impl Drop for BrokerServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One record read back from a Kafka topic.
#[derive(Debug, Clone)]
pub struct KafkaRecord {
    /// The partition it is in.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// Its key, as text.
    pub key: Option<String>,
    /// Its headers, as text, in order.
    pub headers: Vec<(String, String)>,
    /// Its value.
    pub payload: Vec<u8>,
}

impl KafkaRecord {
    /// The value of header `name`, if it has one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Every record of `topic` on the Kafka cluster at `address`, read from the beginning of
/// each partition up to its end by a consumer of its own (no group, nothing committed), in
/// partition and offset order.
pub async fn kafka_records(address: &str, topic: &str) -> Vec<KafkaRecord> {
    let (address, topic) = (address.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || read_topic(&address, &topic)).await.expect("the Kafka reader")
}

/// How many records `topic` holds on the Kafka cluster at `address`, by its partitions'
/// watermarks (without reading them).
pub async fn kafka_record_count(address: &str, topic: &str) -> u64 {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    let (address, topic) = (address.to_string(), topic.to_string());
    let count = tokio::task::spawn_blocking(move || {
        let patience = Duration::from_secs(30);
        let consumer: BaseConsumer = kafka_consumer(&address).create().expect("a Kafka consumer");
        let metadata = consumer.fetch_metadata(Some(&topic), patience).expect("the topic's metadata");
        let partitions = metadata.topics().iter().find(|t| t.name() == topic).map(|t| t.partitions().len());
        (0..partitions.unwrap_or(0) as i32)
            .map(|p| consumer.fetch_watermarks(&topic, p, patience).expect("a partition's watermarks"))
            .map(|(low, high)| (high - low) as u64)
            .sum()
    });
    count.await.expect("the Kafka counter")
}

/// A consumer's settings for the Kafka cluster at `address`: no group work, nothing
/// committed, no topic created by asking for it.
fn kafka_consumer(address: &str) -> rdkafka::ClientConfig {
    let mut settings = rdkafka::ClientConfig::new();
    settings
        .set("bootstrap.servers", address)
        .set("group.id", format!("outbox-test-reader-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("allow.auto.create.topics", "false");
    settings
}

fn read_topic(address: &str, topic: &str) -> Vec<KafkaRecord> {
    use rdkafka::Message as _;
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::message::Headers as _;
    let patience = Duration::from_secs(30);
    let consumer: BaseConsumer = kafka_consumer(address)
        // The end of a partition is where the consumer is told so: offsets may skip (a
        // control record, an aborted batch), so the last offset can be below the high mark.
        .set("enable.partition.eof", "true")
        // Small fetches, each answered well within the socket's timeout: tansu's SQLite
        // storage answered a whole partition's megabyte slower than the default 60 s on a
        // busy machine, the client gave the request up and asked again, and nothing was
        // ever read (CI, twice in one run).
        .set("fetch.message.max.bytes", "65536")
        .set("socket.timeout.ms", "300000")
        .create()
        .expect("a Kafka consumer");
    let metadata = consumer.fetch_metadata(Some(topic), patience).expect("the topic's metadata");
    let partitions = metadata.topics().iter().find(|t| t.name() == topic).map(|t| t.partitions().len()).unwrap_or(0);
    assert!(partitions > 0, "topic {topic} has no partitions");
    let mut ends = std::collections::HashMap::new();
    let mut assignment = rdkafka::TopicPartitionList::new();
    for partition in 0..partitions as i32 {
        let (low, high) = consumer.fetch_watermarks(topic, partition, patience).expect("a partition's watermarks");
        if high > low {
            ends.insert(partition, high);
            assignment.add_partition_offset(topic, partition, rdkafka::Offset::Offset(low)).unwrap();
        }
    }
    let mut records = Vec::new();
    if ends.is_empty() {
        return records;
    }
    consumer.assign(&assignment).expect("assigning the partitions");
    // tansu's SQLite storage answers a fetch of 20,000 records in about a minute.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let mut last = std::collections::HashMap::new();
    while !ends.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the topic was not read to its end: high marks {ends:?}, last offsets read {last:?}"
        );
        let Some(message) = consumer.poll(Duration::from_millis(500)) else { continue };
        let message = match message {
            Ok(message) => message,
            Err(rdkafka::error::KafkaError::PartitionEOF(partition)) => {
                ends.remove(&partition);
                continue;
            }
            Err(e) => panic!("reading {topic}: {e}"),
        };
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        let headers = message
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.map(text).unwrap_or_default())).collect())
            .unwrap_or_default();
        let (partition, offset) = (message.partition(), message.offset());
        records.push(KafkaRecord {
            partition,
            offset,
            key: message.key().map(text),
            headers,
            payload: message.payload().unwrap_or_default().to_vec(),
        });
        if ends.get(&partition).is_some_and(|end| offset + 1 >= *end) {
            ends.remove(&partition);
        }
        last.insert(partition, offset);
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    records
}
