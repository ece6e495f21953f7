//! A local webhook receiver that verifies Standard Webhooks signatures the way a receiver's
//! library does (its own implementation, not the sink's): `webhook-id`, a
//! `webhook-timestamp` within five minutes, and a `v1,` signature over `id.timestamp.body`
//! with the key inside a `whsec_` secret. A request that does not verify gets 401; the rest
//! are answered as each room's script says.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::Value;

/// The secret the receiver verifies with (the specification's example secret).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// How the receiver answers for one room.
#[derive(Debug, Clone)]
pub enum Answer {
    /// 204.
    Ok,
    /// This status, empty body.
    Status(u16),
    /// This status with `Retry-After: <seconds>`.
    RetryAfter(u16, u64),
    /// 204 after this long.
    Slow(Duration),
    /// These, one per request, then 204.
    Sequence(Vec<Answer>),
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `webhook-id`.
    pub id: String,
    /// Headers, names in lower case.
    pub headers: HashMap<String, String>,
    /// The body, parsed.
    pub body: Value,
    /// Why the signature did not verify; empty when it did.
    pub problems: Vec<String>,
    /// The status answered.
    pub status: u16,
}

#[derive(Default)]
struct Shared {
    answers: HashMap<String, Answer>,
    received: Vec<Received>,
}

/// The receiver.
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
}

impl Receiver {
    /// Starts on a free loopback port; `answers` maps a room id to its script (others: 204).
    pub async fn start(answers: impl IntoIterator<Item = (&'static str, Answer)>) -> Receiver {
        let answers = answers.into_iter().map(|(room, answer)| (room.to_string(), answer)).collect();
        let shared = Arc::new(Mutex::new(Shared { answers, received: Vec::new() }));
        let app = Router::new().route("/hooks/{path}", post(receive)).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { addr, shared }
    }

    /// A URL on the receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/hooks/{path}", self.addr)
    }

    /// `host:port` for `allowed_hosts`.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.shared.lock().unwrap().received.clone()
    }

    /// The requests for one event.
    pub fn received_for(&self, event_id: &str) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.id == event_id).collect()
    }
}

async fn receive(
    State(shared): State<Arc<Mutex<Shared>>>,
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let headers: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let problems = verify(&headers, &body);
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let room = parsed["data"]["room_id"].as_str().unwrap_or_default().to_string();
    let answer = {
        let mut shared = shared.lock().unwrap();
        let answer = match shared.answers.get_mut(&room) {
            Some(Answer::Sequence(steps)) if !steps.is_empty() => steps.remove(0),
            Some(Answer::Sequence(_)) | None => Answer::Ok,
            Some(other) => other.clone(),
        };
        let status = match (&answer, problems.is_empty()) {
            (_, false) => 401,
            (Answer::Status(s) | Answer::RetryAfter(s, _), true) => *s,
            _ => 204,
        };
        let id = headers.get("webhook-id").cloned().unwrap_or_default();
        let mut headers = headers.clone();
        headers.insert(":path".into(), path);
        shared.received.push(Received { id, headers, body: parsed, problems: problems.clone(), status });
        answer
    };
    if !problems.is_empty() {
        return (StatusCode::UNAUTHORIZED, problems.join("; ")).into_response();
    }
    match answer {
        Answer::Ok | Answer::Sequence(_) => StatusCode::NO_CONTENT.into_response(),
        Answer::Status(status) => StatusCode::from_u16(status).unwrap().into_response(),
        Answer::RetryAfter(status, seconds) => {
            (StatusCode::from_u16(status).unwrap(), [("retry-after", seconds.to_string())]).into_response()
        }
        Answer::Slow(delay) => {
            tokio::time::sleep(delay).await;
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

/// What a Standard Webhooks verifier would refuse.
fn verify(headers: &HashMap<String, String>, body: &[u8]) -> Vec<String> {
    let mut problems = Vec::new();
    let (Some(id), Some(timestamp), Some(signatures)) =
        (headers.get("webhook-id"), headers.get("webhook-timestamp"), headers.get("webhook-signature"))
    else {
        return vec!["a webhook-id, webhook-timestamp or webhook-signature header is missing".into()];
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    match timestamp.parse::<i64>() {
        Ok(ts) if (now - ts).abs() <= 300 => {}
        _ => problems.push(format!("webhook-timestamp {timestamp:?} is not within five minutes of now")),
    }
    let key = base64::engine::general_purpose::STANDARD.decode(SECRET.trim_start_matches("whsec_")).unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let matches = signatures.split(' ').any(|s| s.strip_prefix("v1,") == Some(expected.as_str()));
    if !matches {
        problems.push("no v1 signature matches".into());
    }
    if headers.get("content-type").map(String::as_str) != Some("application/json") {
        problems.push("content-type is not application/json".into());
    }
    problems
}
