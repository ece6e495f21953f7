//! RabbitMQ: each record published to the broker's `exchange` with its destination as the
//! routing key, persistent, `mandatory`, with `message_id` = its dedup id and its headers as
//! AMQP headers, on a channel in publisher-confirm mode. Delivered means every record was
//! confirmed; a record returned as unroutable (no queue bound for its routing key) fails the
//! attempt even though the broker then confirms it. RabbitMQ has no dedup of its own: an
//! event delivered again is a second message with the same `message_id`.

use anyhow::Context as _;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use super::confine::Destinations;
use super::settings::{BrokerConfig, BrokerKind};
use super::{Acks, Publish, PublishError, dedup_id};
use crate::sandbox::relay::Record;

/// AMQP's limit on a short string: a routing key, a header's name, a message id.
const SHORT_STRING: usize = 255;
/// Persistent delivery mode.
const PERSISTENT: u8 = 2;

/// A RabbitMQ publisher: one connection and one confirm channel, opened again after the
/// broker has gone away.
pub struct RabbitPublisher {
    name: String,
    uri: lapin::uri::AMQPUri,
    exchange: String,
    open: tokio::sync::Mutex<Option<(Connection, Channel)>>,
    destinations: Destinations,
}

impl RabbitPublisher {
    /// Connects (with `user` and `password` when given) and, for a named exchange, checks
    /// that it exists.
    pub async fn connect(config: &BrokerConfig) -> anyhow::Result<RabbitPublisher> {
        let name = &config.name;
        let shown = crate::redact::url(&config.url);
        let mut uri: lapin::uri::AMQPUri =
            config.url.parse().map_err(|e| anyhow::anyhow!("broker {name}: {shown} is not an AMQP address: {e}"))?;
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            uri.authority.userinfo.username = user.clone();
            uri.authority.userinfo.password = password.clone();
        }
        let publisher = RabbitPublisher {
            name: name.clone(),
            uri,
            exchange: config.exchange.clone(),
            open: tokio::sync::Mutex::new(None),
            // A named exchange: any routing key on it (its bindings decide the rest); the
            // default exchange reaches every queue by name, so its patterns are required.
            destinations: Destinations::of(config, vec!["#".to_string()]),
        };
        let (connection, channel) =
            super::reach(name, &shown, publisher.open(), |e| matches!(e, lapin::Error::IOError(_))).await?;
        if !config.exchange.is_empty() {
            let check = connection.create_channel().await.with_context(|| format!("broker {name}: a channel"))?;
            let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
            check
                .exchange_declare(&config.exchange, lapin::ExchangeKind::Topic, passive, FieldTable::default())
                .await
                .map_err(|e| anyhow::anyhow!("broker {name}: exchange {} does not exist ({e})", config.exchange))?;
            let _ = check.close(200, "checked").await;
        }
        tracing::info!(broker = %name, exchange = %config.exchange, "relaying to RabbitMQ");
        *publisher.open.lock().await = Some((connection, channel));
        Ok(publisher)
    }

    /// A new connection and confirm channel.
    async fn open(&self) -> lapin::Result<(Connection, Channel)> {
        let connection = Connection::connect_uri(self.uri.clone(), ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok((connection, channel))
    }

    /// The open channel, or a new one when there is none or it has closed.
    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut open = self.open.lock().await;
        if let Some((connection, channel)) = open.as_ref()
            && connection.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        *open = None;
        let (connection, channel) =
            self.open().await.map_err(|e| PublishError::Unavailable(format!("cannot connect: {e}")))?;
        *open = Some((connection, channel.clone()));
        Ok(channel)
    }

    /// The AMQP properties of record `id`.
    fn properties(&self, id: &str, record: &Record) -> Result<BasicProperties, PublishError> {
        let mut headers = FieldTable::default();
        let mut content_type = None;
        for (name, value) in &record.headers {
            if name.len() > SHORT_STRING {
                return Err(PublishError::Refused(format!("a header name is longer than {SHORT_STRING} bytes")));
            }
            if name.eq_ignore_ascii_case("content-type") {
                content_type = Some(value.clone());
            }
            headers.insert(ShortString::from(name.clone()), AMQPValue::LongString(value.clone().into()));
        }
        if let Some(key) = &record.key {
            headers.insert(ShortString::from("outbox-key".to_string()), AMQPValue::LongString(key.clone().into()));
        }
        let mut properties = BasicProperties::default()
            .with_message_id(ShortString::from(id.to_string()))
            .with_delivery_mode(PERSISTENT)
            .with_headers(headers);
        if let Some(content_type) = content_type.filter(|c| c.len() <= SHORT_STRING) {
            properties = properties.with_content_type(ShortString::from(content_type));
        }
        Ok(properties)
    }
}

#[async_trait::async_trait]
impl Publish for RabbitPublisher {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> BrokerKind {
        BrokerKind::Rabbitmq
    }

    fn destinations(&self) -> &Destinations {
        &self.destinations
    }

    /// The open channel, opened again when it has closed.
    async fn probe(&self) -> Result<(), String> {
        self.channel().await.map(drop).map_err(|e| match e {
            PublishError::Unavailable(message) | PublishError::Refused(message) => {
                format!("broker {}: {message}", self.name)
            }
        })
    }

    /// Publishes every record; the confirms are awaited in order.
    async fn send(&self, event_id: &str, records: Vec<Record>) -> Result<Acks, PublishError> {
        let channel = self.channel().await?;
        let (count, mut confirms) = (records.len(), Vec::with_capacity(records.len()));
        for (i, record) in records.into_iter().enumerate() {
            if record.destination.len() > SHORT_STRING {
                return Err(PublishError::Refused(format!("a routing key is longer than {SHORT_STRING} bytes")));
            }
            let properties = self.properties(&dedup_id(event_id, i, count), &record)?;
            let mandatory = BasicPublishOptions { mandatory: true, ..Default::default() };
            let confirm = channel
                .basic_publish(&self.exchange, &record.destination, mandatory, &record.payload, properties)
                .await
                .map_err(|e| PublishError::Unavailable(format!("publish to {}: {e}", record.destination)))?;
            confirms.push((confirm, record.destination));
        }
        let exchange = self.exchange.clone();
        Ok(Box::pin(async move {
            for (confirm, destination) in confirms {
                let confirmation =
                    confirm.await.map_err(|e| PublishError::Unavailable(format!("confirm of {destination}: {e}")))?;
                match confirmation {
                    Confirmation::Ack(None) => {}
                    Confirmation::Ack(Some(returned)) => {
                        return Err(PublishError::Refused(format!(
                            "unroutable: {} ({}) for routing key {destination} on exchange {exchange:?}",
                            returned.reply_text, returned.reply_code
                        )));
                    }
                    Confirmation::Nack(_) => {
                        return Err(PublishError::Unavailable(format!("{destination}: the broker nacked it")));
                    }
                    Confirmation::NotRequested => {
                        return Err(PublishError::Unavailable("the channel is not confirming".into()));
                    }
                }
            }
            Ok(0) // it reports no duplicates
        }))
    }
}
