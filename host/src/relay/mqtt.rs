//! MQTT 5: each record published at QoS 1 to the topic its destination names, its headers
//! as user properties (with `outbox-dedup-id` and, when it has one, `outbox-key`), and
//! delivered once the broker's PUBACK for it has come with a success code. MQTT has no
//! dedup: an event delivered again is a second message with the same `outbox-dedup-id`.
//!
//! One client per broker, its event loop driven by a task of its own. Publishes enter the
//! client's queue in order and leave it in order, so each `Outgoing::Publish(pkid)` the
//! loop reports belongs to the oldest publish still unsent; its PUBACK then settles it.
//! When the connection breaks, every unsettled publish fails (push-back) and the client is
//! replaced by a fresh one: its own resend of them and the publishes still in its queue go
//! with it, so that none of them can go out after the reconnect and take the settle of a
//! later event (which the old client's queue let happen: an event could be settled by an
//! earlier one's PUBACK). The fresh loop connects on its first poll.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};
use tokio::sync::oneshot;

use super::confine::Destinations;
use super::settings::{BrokerConfig, BrokerKind};
use super::{Acks, Publish, PublishError, dedup_id};
use crate::sandbox::relay::Record;

/// Publishes waiting in the client's queue at most; past it a publish is push-back.
const QUEUE: usize = 4_096;
/// How long the loop waits before it reconnects after a broken connection.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

type Settle = oneshot::Sender<Result<(), PublishError>>;

/// Publishes not yet settled: in the client's queue (in order), and sent awaiting a PUBACK.
/// Also whether the connection is up, or why not, and the client whose queue `queued`
/// mirrors: a connection that breaks fails every unsettled publish and replaces the client,
/// so that the publishes its queue still held are dropped with it and can never take the
/// settles of later ones.
struct Unsettled {
    queued: VecDeque<Settle>,
    sent: HashMap<u16, Settle>,
    connection: Result<(), String>,
    client: AsyncClient,
}

impl Unsettled {
    fn new(client: AsyncClient) -> Unsettled {
        Unsettled { queued: VecDeque::new(), sent: HashMap::new(), connection: Ok(()), client }
    }
}

/// An MQTT 5 publisher.
pub struct MqttPublisher {
    name: String,
    unsettled: Arc<Mutex<Unsettled>>,
    driver: tokio::task::JoinHandle<()>,
    destinations: Destinations,
}

impl Drop for MqttPublisher {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl MqttPublisher {
    /// Connects (with `user` and `password` when given) and waits for the broker's CONNACK.
    pub async fn connect(config: &BrokerConfig) -> anyhow::Result<MqttPublisher> {
        let name = config.name.clone();
        let shown = crate::redact::url(&config.url);
        let url = url::Url::parse(&config.url).map_err(|e| anyhow::anyhow!("broker {name}: {shown}: {e}"))?;
        let host = url.host_str().ok_or_else(|| anyhow::anyhow!("broker {name}: {shown} names no host"))?;
        let client_id = format!("outbox-host-{}-{:08x}", std::process::id(), crate::clock::random_u64() as u32);
        let mut options = MqttOptions::new(client_id, host, url.port().unwrap_or(1883));
        options.set_keep_alive(Duration::from_secs(15)).set_clean_start(true);
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            options.set_credentials(user.clone(), password.clone());
        }
        let (client, mut events) = AsyncClient::new(options.clone(), QUEUE);
        let connecting = async {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
            }
        };
        super::reach(&name, &shown, connecting, |e| matches!(e, ConnectionError::Io(_) | ConnectionError::Timeout(_)))
            .await?;
        let unsettled = Arc::new(Mutex::new(Unsettled::new(client)));
        let driver = tokio::spawn(drive(name.clone(), options, events, unsettled.clone()));
        tracing::info!(broker = %name, "relaying to MQTT");
        // Required in the config: no default.
        let destinations = Destinations::of(config, Vec::new());
        Ok(MqttPublisher { name, unsettled, driver, destinations })
    }

    /// Queues one record; its settlement comes through the returned receiver.
    fn queue(&self, id: &str, record: Record) -> Result<oneshot::Receiver<Result<(), PublishError>>, PublishError> {
        let mut properties = PublishProperties::default();
        for (name, value) in record.headers {
            if name.eq_ignore_ascii_case("content-type") {
                properties.content_type = Some(value.clone());
            }
            properties.user_properties.push((name, value));
        }
        properties.user_properties.push(("outbox-dedup-id".into(), id.to_string()));
        if let Some(key) = record.key {
            properties.user_properties.push(("outbox-key".into(), key));
        }
        let (settle, settled) = oneshot::channel();
        // In the client's queue and in `queued` in the same order: under the lock.
        let mut unsettled = self.unsettled.lock().unwrap_or_else(|e| e.into_inner());
        unsettled
            .client
            .try_publish_with_properties(record.destination, QoS::AtLeastOnce, false, record.payload, properties)
            .map_err(|e| PublishError::Unavailable(e.to_string()))?;
        unsettled.queued.push_back(settle);
        Ok(settled)
    }
}

/// Drives the client's event loop: matches sent publishes to their packet ids and PUBACKs
/// to their publishes, and when the connection breaks fails every unsettled publish and
/// starts over with a fresh client and loop (see [`Unsettled`]).
async fn drive(name: String, options: MqttOptions, mut events: EventLoop, unsettled: Arc<Mutex<Unsettled>>) {
    loop {
        let event = events.poll().await;
        let lost = {
            let mut waiting = unsettled.lock().unwrap_or_else(|e| e.into_inner());
            let lost = settle(&mut waiting, event);
            if lost.is_some() {
                // Under the lock that `queue` holds while it queues: nothing is queued on
                // the old client from here on, and what it still held goes with it.
                let (client, fresh) = AsyncClient::new(options.clone(), QUEUE);
                waiting.client = client;
                events = fresh;
            }
            lost
        };
        if let Some(error) = lost {
            tracing::warn!(broker = %name, error = %error, "MQTT connection lost; reconnecting");
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
    }
}

/// Settles what `event` settles; a broken connection fails everything unsettled, and is
/// returned.
fn settle(waiting: &mut Unsettled, event: Result<Event, ConnectionError>) -> Option<ConnectionError> {
    match event {
        Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
            if let Some(settle) = waiting.queued.pop_front() {
                waiting.sent.insert(pkid, settle);
            }
        }
        Ok(Event::Incoming(Packet::PubAck(ack))) => {
            if let Some(settle) = waiting.sent.remove(&ack.pkid) {
                let result = match ack.reason {
                    PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
                    refused => Err(PublishError::Refused(format!("the broker refused it: {refused:?}"))),
                };
                let _ = settle.send(result);
            }
        }
        Ok(Event::Incoming(Packet::ConnAck(_))) => waiting.connection = Ok(()),
        Ok(_) => {}
        Err(error) => {
            let message = format!("connection lost: {error}");
            waiting.connection = Err(message.clone());
            let Unsettled { queued, sent, .. } = waiting;
            for settle in queued.drain(..).chain(sent.drain().map(|(_, s)| s)) {
                let _ = settle.send(Err(PublishError::Unavailable(message.clone())));
            }
            return Some(error);
        }
    }
    None
}

#[async_trait::async_trait]
impl Publish for MqttPublisher {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> BrokerKind {
        BrokerKind::Mqtt
    }

    fn destinations(&self) -> &Destinations {
        &self.destinations
    }

    /// What the event loop last saw: a CONNACK, or the connection breaking.
    async fn probe(&self) -> Result<(), String> {
        let connection = self.unsettled.lock().unwrap_or_else(|e| e.into_inner()).connection.clone();
        connection.map_err(|e| format!("broker {}: {e}", self.name))
    }

    /// Queues every record; the PUBACKs are awaited in order.
    async fn send(&self, event_id: &str, records: Vec<Record>) -> Result<Acks, PublishError> {
        let count = records.len();
        let mut settled = Vec::with_capacity(count);
        for (i, record) in records.into_iter().enumerate() {
            settled.push(self.queue(&dedup_id(event_id, i, count), record)?);
        }
        Ok(Box::pin(async move {
            for one in settled {
                one.await.map_err(|_| PublishError::Unavailable("the client stopped".into()))??;
            }
            Ok(0) // it reports no duplicates
        }))
    }
}
