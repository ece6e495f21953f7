//! my-sink: POSTs each room event as JSON to `url`, with a bearer `token` if one is set.
//! Event types listed in `skip` are not sent.

use outbox_sink::http::{Request, classify};
use outbox_sink::{Config, Delivery, Event, Outcome, Sink};

struct MySink {
    url: String,
    token: Option<String>,
    skip: Vec<String>,
}

impl Sink for MySink {
    fn configure(config: &mut Config) -> Self {
        let url: String = config.required("url", "where to POST events, e.g. https://example.com/events");
        config.check(
            "url",
            url.is_empty() || url.starts_with("https://") || url.starts_with("http://"),
            "must be an http(s) URL",
        );
        config.endpoint("url", &url); // the host checks it against allowed_hosts before it starts
        MySink { url, token: config.get("token"), skip: config.list("skip").unwrap_or_default() }
    }

    fn deliver(&self, event: &Event) -> Delivery {
        if self.skip.contains(&event.event_type) {
            return Ok(Outcome::Skipped(format!("{} is in skip", event.event_type)));
        }
        let mut request = Request::post(&self.url).header("idempotency-key", &event.event_id);
        if let Some(token) = &self.token {
            request = request.header("authorization", &format!("Bearer {token}"));
        }
        classify("my-sink", request.json(&event.to_json()).send())
    }
}

outbox_sink::export!(MySink);

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_sink::http::Response;
    use outbox_sink::testing::Harness;

    #[test]
    fn posts_the_event_and_reads_the_reply() {
        let mut host = Harness::new().config("url", "https://example.com/events").reply(Response::new(202, ""));
        let event = Event::new("RoomHeatChanged", "room-1", outbox_sink::serde_json::json!({"heat": 1200}));
        assert_eq!(host.deliver::<MySink>(&event), Ok(Outcome::Delivered));
        let sent: outbox_sink::serde_json::Value =
            outbox_sink::serde_json::from_slice(&host.requests()[0].body).unwrap();
        assert_eq!((sent["room_id"].as_str(), sent["body"]["heat"].as_i64()), (Some("room-1"), Some(1200)));
        assert_eq!(
            Harness::new().check_config::<MySink>(),
            ["url: is required (where to POST events, e.g. https://example.com/events)"]
        );
    }
}
