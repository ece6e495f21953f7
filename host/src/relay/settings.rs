//! The brokers a relay publishes to, as the config names them (`brokers:`).

use std::time::Duration;

/// Which broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// NATS JetStream.
    Nats,
    /// Redis Streams.
    Redis,
    /// RabbitMQ (AMQP 0-9-1).
    Rabbitmq,
    /// An MQTT 5 broker.
    Mqtt,
    /// A Kafka-protocol broker (Apache Kafka, tansu, Redpanda, …).
    Kafka,
}

impl BrokerKind {
    /// The kinds this host relays to, by their config name.
    pub const NAMES: &[&str] = &["nats", "redis", "rabbitmq", "mqtt", "kafka"];

    /// The kind named `name` in the config.
    pub fn parse(name: &str) -> Option<BrokerKind> {
        match name {
            "nats" => Some(BrokerKind::Nats),
            "redis" => Some(BrokerKind::Redis),
            "rabbitmq" => Some(BrokerKind::Rabbitmq),
            "mqtt" => Some(BrokerKind::Mqtt),
            "kafka" => Some(BrokerKind::Kafka),
            _ => None,
        }
    }

    /// Its config name.
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Nats => "nats",
            BrokerKind::Redis => "redis",
            BrokerKind::Rabbitmq => "rabbitmq",
            BrokerKind::Mqtt => "mqtt",
            BrokerKind::Kafka => "kafka",
        }
    }

    /// The URL schemes its `url` may have (a Kafka broker has `bootstrap` servers instead,
    /// shown as `kafka://host:port,…`).
    pub fn schemes(self) -> &'static [&'static str] {
        match self {
            BrokerKind::Nats => &["nats", "tls"],
            BrokerKind::Redis => &["redis"],
            BrokerKind::Rabbitmq => &["amqp"],
            BrokerKind::Mqtt => &["mqtt"],
            BrokerKind::Kafka => &["kafka"],
        }
    }
}

/// Default `room_pipeline`: how many of a room's events may be in flight to a broker at once.
pub const DEFAULT_ROOM_PIPELINE: u32 = 8;
/// The largest `room_pipeline`.
pub const MAX_ROOM_PIPELINE: u32 = 64;

/// Default `dedup_window` of a Redis broker: how long a record's dedup marker lives.
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The SASL mechanisms a Kafka broker entry may name.
pub const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];
/// Default `sasl_mechanism` of a Kafka broker with `user` and `password`.
pub const DEFAULT_SASL_MECHANISM: &str = "PLAIN";
/// The most partitions `partitions` may ask for.
pub const MAX_PARTITIONS: u32 = 10_000;

/// One entry of `brokers:`.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Its name, which a relay sink's `broker:` names.
    pub name: String,
    /// Which broker.
    pub kind: BrokerKind,
    /// Where it listens: `nats://host:port`, `redis://host:port/db`, `amqp://host:port/vhost`,
    /// `mqtt://host:port`; for Kafka `kafka://` and its `bootstrap` servers, for display.
    pub url: String,
    /// How many of a room's events may be in flight at once: each published after the one
    /// before it, their acks awaited together.
    pub room_pipeline: u32,
    /// NATS: the JetStream stream the records go to.
    pub stream: String,
    /// NATS: create the stream (with `subjects`) when it is missing; otherwise it must exist.
    pub create_stream: bool,
    /// NATS: the subjects of a stream the host creates.
    pub subjects: Vec<String>,
    /// Redis: how long a record's dedup marker is kept (an event delivered again within it
    /// adds no entry).
    pub dedup_window: Duration,
    /// Redis: trim each stream to about this many entries (`XADD MAXLEN ~`); none: no trim.
    pub max_len: Option<u64>,
    /// RabbitMQ: the exchange records are published to (`""`: the default exchange, where
    /// the destination is a queue's name).
    pub exchange: String,
    /// Kafka: the `host:port` servers the client first asks for the cluster's brokers.
    pub bootstrap: Vec<String>,
    /// Kafka: the topic records go to by default, checked at start.
    pub topic: String,
    /// Kafka: create the topic (with `partitions`) when it is missing; otherwise it must exist.
    pub create_topic: bool,
    /// Kafka: the partitions of a topic the host creates.
    pub partitions: u32,
    /// Kafka: TLS to the brokers (`ca_file`, when set, names the certificates to trust).
    pub tls: bool,
    /// Kafka: a PEM file of the certificate authorities to trust over TLS (default: the system's).
    pub ca_file: Option<std::path::PathBuf>,
    /// Kafka: the SASL mechanism with `user` and `password` (`PLAIN`, `SCRAM-SHA-256`,
    /// `SCRAM-SHA-512`).
    pub sasl_mechanism: String,
    /// NATS: a token, if the broker wants one (write it as `${ENV}`).
    pub token: Option<String>,
    /// A user name and password, if the broker wants them.
    pub user: Option<String>,
    /// See [`BrokerConfig::user`].
    pub password: Option<String>,
    /// The destinations its relays may publish to, as patterns in the broker's own wildcard
    /// syntax (`relay::confine`); empty: the kind's default (NATS: the stream's subjects;
    /// RabbitMQ on a named exchange: any routing key), required for the other kinds.
    pub allowed_destinations: Vec<String>,
}

impl BrokerConfig {
    /// A broker of `kind` at `url` with every other key at its default.
    pub fn new(name: &str, kind: BrokerKind, url: &str) -> BrokerConfig {
        BrokerConfig {
            name: name.to_string(),
            kind,
            url: url.to_string(),
            room_pipeline: DEFAULT_ROOM_PIPELINE,
            stream: String::new(),
            create_stream: false,
            subjects: Vec::new(),
            dedup_window: DEFAULT_DEDUP_WINDOW,
            max_len: None,
            exchange: String::new(),
            bootstrap: Vec::new(),
            topic: String::new(),
            create_topic: false,
            partitions: 1,
            tls: false,
            ca_file: None,
            sasl_mechanism: DEFAULT_SASL_MECHANISM.to_string(),
            token: None,
            user: None,
            password: None,
            allowed_destinations: Vec::new(),
        }
    }
}

impl std::fmt::Debug for BrokerConfig {
    /// Never prints the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("url", &crate::redact::url(&self.url))
            .field("room_pipeline", &self.room_pipeline)
            .field("stream", &self.stream)
            .field("create_stream", &self.create_stream)
            .field("subjects", &self.subjects)
            .field("dedup_window", &self.dedup_window)
            .field("max_len", &self.max_len)
            .field("exchange", &self.exchange)
            .field("topic", &self.topic)
            .field("create_topic", &self.create_topic)
            .field("partitions", &self.partitions)
            .field("tls", &self.tls)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("allowed_destinations", &self.allowed_destinations)
            .finish_non_exhaustive()
    }
}
