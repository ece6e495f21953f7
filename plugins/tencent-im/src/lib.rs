//! The Tencent Cloud IM sink: each room event becomes one `send_group_msg` call on the
//! room's group, signed with a UserSig made in the sink, with a `Random` derived from
//! `event_id` so Tencent drops a retry it already has, and the reply classified as
//! delivered, retryable or permanent. Event types IM does not carry are `skipped`.
//!
//! The parts (settings, signing, mapping, classification) are plain modules tested natively.

pub mod classify;
pub mod message;
pub mod settings;
pub mod usersig;

use outbox_sink::http::{Request, failure_of};
use outbox_sink::{Config, Delivery, Event, Outcome, Sink};

use settings::Settings;

impl Sink for Settings {
    fn configure(config: &mut Config) -> Self {
        Settings::read(config)
    }

    fn deliver(&self, event: &Event) -> Delivery {
        if self.skips(&event.event_type) {
            return Ok(Outcome::Skipped(format!("{} is not sent to Tencent IM", event.event_type)));
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let usersig =
            usersig::generate(self.sdk_app_id, &self.secret_key, &self.identifier, now, self.usersig_expire_seconds);
        let url = message::url(self, &usersig, message::random_of(&format!("{}#{now}", event.event_id)));
        let reply = Request::post(&url).json(&message::body(self, event)).send();
        let response = reply.map_err(|e| failure_of("Tencent IM", &e))?;
        classify::reply(response.status, &response.body)
    }
}

outbox_sink::export!(Settings);
