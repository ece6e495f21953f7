//! The brokers a relay publishes to, as the config names them (`brokers:`).

/// Which broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// NATS JetStream.
    Nats,
}

impl BrokerKind {
    /// The kinds this host relays to, by their config name.
    pub const NAMES: &[&str] = &["nats"];

    /// The kind named `name` in the config.
    pub fn parse(name: &str) -> Option<BrokerKind> {
        match name {
            "nats" => Some(BrokerKind::Nats),
            _ => None,
        }
    }
}

/// One entry of `brokers:`.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// Its name, which a relay sink's `broker:` names.
    pub name: String,
    /// Which broker.
    pub kind: BrokerKind,
    /// Where it listens: `nats://host:port`.
    pub url: String,
    /// The JetStream stream the records go to.
    pub stream: String,
    /// Create the stream (with `subjects`) when it is missing; otherwise it must exist.
    pub create_stream: bool,
    /// The subjects of a stream the host creates.
    pub subjects: Vec<String>,
    /// Credentials, if the broker wants them (write them as `${ENV}`).
    pub token: Option<String>,
    /// A user name and password, if the broker wants them.
    pub user: Option<String>,
    /// See [`BrokerConfig::user`].
    pub password: Option<String>,
}

impl std::fmt::Debug for BrokerConfig {
    /// Never prints the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("url", &crate::text::redact_url(&self.url))
            .field("stream", &self.stream)
            .field("create_stream", &self.create_stream)
            .field("subjects", &self.subjects)
            .finish_non_exhaustive()
    }
}
