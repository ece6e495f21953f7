//! The webhook sink: each event is POSTed as JSON to the endpoint configured for its type,
//! signed per the Standard Webhooks specification (<https://www.standardwebhooks.com>), so
//! a receiver verifies it with any Standard Webhooks library.
//!
//! Config (`sink.config`):
//! - `url`: where events go; `url.<EventType>` sends that type elsewhere. Types with no URL
//!   are `skipped`. At least one is required.
//! - `secret`: the signing secret, `whsec_` followed by base64 (required; never logged).
//! - `headers`: extra request headers, one `Name: value` per line.
//!
//! The body is `{"type": <event_type>, "timestamp": <occurred_at, RFC 3339>, "data": <the
//! event's fields and decoded body>}`; `webhook-id` is the `event_id`, so a receiver drops a
//! retry it already has. Replies are classified by [`outbox_sink::http::classify`].

pub mod signature;

use outbox_sink::http::{Request, classify};
use outbox_sink::serde_json::json;
use outbox_sink::{Config, Delivery, Event, Outcome, Sink, proto};

/// A configured webhook.
pub struct Webhook {
    url: Option<String>,
    by_type: Vec<(&'static str, String)>,
    key: Vec<u8>,
    headers: Vec<(String, String)>,
}

impl Sink for Webhook {
    fn configure(config: &mut Config) -> Self {
        let url_at = |config: &mut Config, key: &str| {
            let url = config.get(key)?;
            let http = url.starts_with("https://") || url.starts_with("http://");
            config.check(key, http, "must be an http(s) URL");
            if http {
                config.endpoint(key, &url);
            }
            Some(url)
        };
        let url = url_at(config, "url");
        let by_type: Vec<_> =
            proto::EVENT_TYPES.iter().filter_map(|t| Some((*t, url_at(config, &format!("url.{t}"))?))).collect();
        if url.is_none() && by_type.is_empty() {
            config.required::<String>("url", "where to POST events; url.<EventType> for one type");
        }
        let key = match config.get("secret") {
            None => {
                config.required::<String>("secret", "the signing secret, whsec_ followed by base64");
                Vec::new()
            }
            Some(secret) => signature::decode_secret(&secret).unwrap_or_else(|why| {
                config.problem("secret", why);
                Vec::new()
            }),
        };
        let mut headers = Vec::new();
        for line in config.get("headers").unwrap_or_default().lines().filter(|l| !l.trim().is_empty()) {
            match line.split_once(':') {
                Some((name, value)) if !name.trim().is_empty() => {
                    headers.push((name.trim().into(), value.trim().into()))
                }
                _ => config.problem("headers", "each line must be `Name: value`"),
            }
        }
        Webhook { url, by_type, key, headers }
    }

    fn deliver(&self, event: &Event) -> Delivery {
        let typed = self.by_type.iter().find(|(t, _)| *t == event.event_type).map(|(_, url)| url);
        let Some(url) = typed.or(self.url.as_ref()) else {
            return Ok(Outcome::Skipped(format!("no webhook url for {}", event.event_type)));
        };
        let body = json!({
            "type": event.event_type,
            "timestamp": signature::rfc3339(event.occurred_at_ms),
            "data": event.to_json(),
        })
        .to_string();
        let timestamp = signature::now_secs();
        let mut request = Request::post(url)
            .header("content-type", "application/json")
            .header("webhook-id", &event.event_id)
            .header("webhook-timestamp", &timestamp.to_string())
            .header("webhook-signature", &signature::sign(&self.key, &event.event_id, timestamp, body.as_bytes()));
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        classify("webhook", request.body(body).send())
    }
}

outbox_sink::export!(Webhook);

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_sink::http::{HttpError, Response};
    use outbox_sink::serde_json::{Value, json};
    use outbox_sink::testing::Harness;
    use outbox_sink::{Failure, Pressure};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn harness() -> Harness {
        Harness::new()
            .config("url", "https://hooks.example.com/in")
            .config("url.RoomGiftSent", "https://gifts.example.com/in")
            .config("secret", SECRET)
            .config("headers", "X-Tenant: acme\nAuthorization: Bearer t0k3n")
    }

    fn header<'a>(request: &'a Request, name: &str) -> &'a str {
        request.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).unwrap_or_default()
    }

    #[test]
    fn every_configured_url_is_declared_for_the_hosts_egress_check() {
        let mut h = harness();
        assert!(h.check_config::<Webhook>().is_empty());
        let declared: Vec<(&str, &str)> = h.declared().iter().map(|(k, u)| (k.as_str(), u.as_str())).collect();
        assert_eq!(
            declared,
            [("url", "https://hooks.example.com/in"), ("url.RoomGiftSent", "https://gifts.example.com/in")]
        );
    }

    #[test]
    fn an_event_is_posted_signed_to_its_types_url() {
        let mut h = harness().reply(Response::new(204, ""));
        let event = Event::new("RoomGiftSent", "room-1", json!({"gift_id": "rose", "gift_count": 2}));
        assert_eq!(h.deliver::<Webhook>(&event), Ok(Outcome::Delivered));
        let request = &h.requests()[0];
        assert_eq!((request.method.as_str(), request.url.as_str()), ("POST", "https://gifts.example.com/in"));
        assert_eq!(header(request, "webhook-id"), event.event_id);
        assert_eq!(header(request, "X-Tenant"), "acme");
        let timestamp: u64 = header(request, "webhook-timestamp").parse().unwrap();
        let key = signature::decode_secret(SECRET).unwrap();
        assert_eq!(
            header(request, "webhook-signature"),
            signature::sign(&key, &event.event_id, timestamp, &request.body)
        );
        let body: Value = outbox_sink::serde_json::from_slice(&request.body).unwrap();
        assert_eq!(body["type"], "RoomGiftSent");
        assert_eq!(body["data"]["body"]["gift_id"], "rose");
        assert_eq!(body["data"]["room_id"], "room-1");
        assert!(h.logs().iter().all(|(_, line)| !line.contains("MfKQ")), "the secret was logged");
    }

    #[test]
    fn other_types_go_to_the_default_url_or_are_skipped() {
        let mut h = harness().reply(Response::new(200, "ok"));
        let heat = Event::new("RoomHeatChanged", "room-1", json!({"heat": 9}));
        assert_eq!(h.deliver::<Webhook>(&heat), Ok(Outcome::Delivered));
        assert_eq!(h.requests()[0].url, "https://hooks.example.com/in");

        let mut only_gifts =
            Harness::new().config("url.RoomGiftSent", "https://gifts.example.com/in").config("secret", SECRET);
        assert!(only_gifts.check_config::<Webhook>().is_empty());
        assert!(matches!(only_gifts.deliver::<Webhook>(&heat), Ok(Outcome::Skipped(_))));
        assert!(only_gifts.requests().is_empty());
    }

    #[test]
    fn replies_are_classified() {
        let event = Event::new("RoomHeatChanged", "room-1", json!({"heat": 9}));
        let mut h = harness().reply(Response::new(429, "").header("Retry-After", "3"));
        assert_eq!(
            h.deliver::<Webhook>(&event),
            Err(Failure::retryable("HTTP 429 from webhook").pressure(Pressure::Throttled).after_ms(3000))
        );
        assert_eq!(h.pushed_back(), Some(Pressure::Throttled));
        let mut h = harness().reply(Response::new(410, "gone"));
        assert_eq!(h.deliver::<Webhook>(&event), Err(Failure::permanent("HTTP 410 from webhook")));
        let mut h = harness().fail(HttpError::Timeout);
        assert_eq!(h.deliver::<Webhook>(&event).unwrap_err().kind, outbox_sink::FailureKind::Retryable);
    }

    #[test]
    fn config_problems_name_every_key_and_never_the_secret() {
        let problems = Harness::new().check_config::<Webhook>();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("url: is required") && problems[1].starts_with("secret: is required"));
        let problems = Harness::new()
            .config("url", "ftp://x")
            .config("secret", "whsec_###not-base64-TOPSECRET")
            .config("headers", "no colon here")
            .check_config::<Webhook>();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().all(|p| !p.contains("TOPSECRET")), "{problems:?}");
    }
}
