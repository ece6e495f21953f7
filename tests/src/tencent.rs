//! A local HTTP server standing in for Tencent Cloud IM's `send_group_msg`. It checks what
//! a real one would (path, query, a UserSig that verifies with the key, the JSON body) and
//! answers as each group's script says.

use std::collections::HashMap;
use std::io::Read as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::post;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};

/// The application the server expects.
pub const SDK_APP_ID: u64 = 1_400_000_001;
/// The admin identifier the server expects.
pub const IDENTIFIER: &str = "administrator";
/// The secret key UserSigs must verify with.
pub const SECRET_KEY: &str = "5bd2850fff3ecb11d7c805251c51ee463a25727bddc2385f3fa8bfee1bb93b5e";

/// How the server answers for one group.
#[derive(Debug, Clone)]
pub enum Script {
    /// `ErrorCode` 0.
    Ok,
    /// `ErrorCode` 0 with `MsgDropReason: MsgFreqCtrl`.
    FreqCtrl,
    /// This `ErrorCode`.
    Code(u32),
    /// This HTTP status, empty body.
    Http(u16),
    /// Answer OK after this long.
    Slow(Duration),
    /// These, one per request, then OK.
    Sequence(Vec<Script>),
}

/// One request as received, with what was wrong with it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The query parameters.
    pub query: HashMap<String, String>,
    /// The JSON body.
    pub body: Value,
    /// `MsgBody[0].MsgContent.Data`, parsed.
    pub data: Value,
    /// Everything that a real server would have refused; empty when the request is right.
    pub problems: Vec<String>,
    /// The `ErrorCode` of the answer (0, also for a `MsgFreqCtrl` drop), or the HTTP status
    /// when not 200, or `u32::MAX` when the request itself was refused.
    pub answered: u32,
}

#[derive(Default)]
struct Shared {
    scripts: HashMap<String, Script>,
    received: Vec<Received>,
    /// Every group's answer until then, whatever its script.
    outage: Option<(std::time::Instant, Script)>,
}

/// The stand-in server.
pub struct TencentIm {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
}

impl TencentIm {
    /// Starts on a free loopback port; `scripts` maps a `GroupId` to its answers.
    pub async fn start(scripts: impl IntoIterator<Item = (String, Script)>) -> TencentIm {
        let shared =
            Arc::new(Mutex::new(Shared { scripts: scripts.into_iter().collect(), received: vec![], outage: None }));
        let app = Router::new()
            .route("/v4/group_open_http_svc/send_group_msg", post(send_group_msg))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        TencentIm { addr, shared }
    }

    /// The base URL for the sink's `endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `host:port` for `allowed_hosts`.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// Answers every request with `script` for `lasting` from now (an app-wide rate limit,
    /// an outage), then each group's script again.
    pub fn outage(&self, script: Script, lasting: Duration) {
        self.shared.lock().unwrap().outage = Some((std::time::Instant::now() + lasting, script));
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.shared.lock().unwrap().received.clone()
    }

    /// The requests whose `Data` names this event.
    pub fn received_for(&self, event_id: &str) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.data["event_id"] == event_id).collect()
    }
}

async fn send_group_msg(
    State(shared): State<Arc<Mutex<Shared>>>,
    Query(query): Query<HashMap<String, String>>,
    body: String,
) -> (StatusCode, String) {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let data = body["MsgBody"][0]["MsgContent"]["Data"]
        .as_str()
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or(Value::Null);
    let problems = check(&query, &body, &data);
    let group = body["GroupId"].as_str().unwrap_or_default().to_string();
    let script = {
        let mut guard = shared.lock().unwrap();
        let shared = &mut *guard;
        let script = match (&shared.outage, shared.scripts.get_mut(&group)) {
            (Some((until, script)), _) if std::time::Instant::now() < *until => script.clone(),
            (_, Some(Script::Sequence(steps))) if !steps.is_empty() => steps.remove(0),
            (_, Some(Script::Sequence(_)) | None) => Script::Ok,
            (_, Some(other)) => other.clone(),
        };
        let answered = match (&script, problems.is_empty()) {
            (_, false) => u32::MAX,
            (Script::Code(code), true) => *code,
            (Script::Http(status), true) => u32::from(*status),
            _ => 0,
        };
        shared.received.push(Received { query, body, data, problems: problems.clone(), answered });
        script
    };
    if !problems.is_empty() {
        let code = if problems.iter().any(|p| p.contains("usersig")) { 70003 } else { 10004 };
        return (StatusCode::OK, reply(code, &problems.join("; "), None));
    }
    match script {
        Script::Ok | Script::Sequence(_) => (StatusCode::OK, reply(0, "", None)),
        Script::FreqCtrl => (StatusCode::OK, reply(0, "", Some("MsgFreqCtrl"))),
        Script::Code(code) => (StatusCode::OK, reply(code, "scripted error", None)),
        Script::Http(status) => (StatusCode::from_u16(status).unwrap(), String::new()),
        Script::Slow(delay) => {
            tokio::time::sleep(delay).await;
            (StatusCode::OK, reply(0, "", None))
        }
    }
}

fn reply(code: u32, info: &str, drop_reason: Option<&str>) -> String {
    let mut reply = json!({
        "ActionStatus": if code == 0 { "OK" } else { "FAIL" },
        "ErrorCode": code,
        "ErrorInfo": info,
        "MsgTime": 1_700_000_000,
        "MsgSeq": 1,
    });
    if let Some(reason) = drop_reason {
        reply["MsgDropReason"] = json!(reason);
    }
    reply.to_string()
}

/// What a real server would refuse.
fn check(query: &HashMap<String, String>, body: &Value, data: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if query.get("sdkappid").map(String::as_str) != Some(&SDK_APP_ID.to_string()) {
        problems.push(format!("sdkappid {:?}", query.get("sdkappid")));
    }
    if query.get("identifier").map(String::as_str) != Some(IDENTIFIER) {
        problems.push(format!("identifier {:?}", query.get("identifier")));
    }
    if query.get("contenttype").map(String::as_str) != Some("json") {
        problems.push("contenttype is not json".into());
    }
    if query.get("random").and_then(|r| r.parse::<u32>().ok()).is_none() {
        problems.push("random is not a 32-bit number".into());
    }
    match query.get("usersig").map(|s| verify_usersig(s)) {
        Some(Ok(())) => {}
        Some(Err(why)) => problems.push(format!("usersig: {why}")),
        None => problems.push("usersig missing".into()),
    }
    if !body["GroupId"].is_string() {
        problems.push("GroupId missing".into());
    }
    if body["Random"].as_u64().is_none_or(|r| r > u64::from(u32::MAX)) {
        problems.push("Random is not a 32-bit number".into());
    }
    if body["MsgBody"][0]["MsgType"] != "TIMCustomElem" {
        problems.push("MsgBody[0] is not a TIMCustomElem".into());
    }
    for field in ["event_id", "event_type", "room_id", "room_version", "occurred_at_ms"] {
        if data.get(field).is_none() {
            problems.push(format!("Data lacks {field}"));
        }
    }
    problems
}

/// Decodes Tencent's base64 variant, inflates, and recomputes the HMAC with the key.
fn verify_usersig(usersig: &str) -> Result<(), String> {
    let standard = usersig.replace('*', "+").replace('-', "/").replace('_', "=");
    let compressed = base64::engine::general_purpose::STANDARD.decode(standard).map_err(|e| format!("base64: {e}"))?;
    let mut json = String::new();
    flate2::read::ZlibDecoder::new(compressed.as_slice())
        .read_to_string(&mut json)
        .map_err(|e| format!("zlib: {e}"))?;
    let doc: Value = serde_json::from_str(&json).map_err(|e| format!("json: {e}"))?;
    let (id, app, time, expire) = (
        doc["TLS.identifier"].as_str(),
        doc["TLS.sdkappid"].as_u64(),
        doc["TLS.time"].as_u64(),
        doc["TLS.expire"].as_u64(),
    );
    let (Some(id), Some(app), Some(time), Some(expire)) = (id, app, time, expire) else {
        return Err(format!("fields missing in {doc}"));
    };
    if (id, app) != (IDENTIFIER, SDK_APP_ID) {
        return Err(format!("signed for {id}@{app}"));
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    if time > now + 60 || time + expire < now {
        return Err("expired or from the future".into());
    }
    let content = format!("TLS.identifier:{id}\nTLS.sdkappid:{app}\nTLS.time:{time}\nTLS.expire:{expire}\n");
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET_KEY.as_bytes()).unwrap();
    mac.update(content.as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    if doc["TLS.sig"] != expected.as_str() {
        return Err("TLS.sig does not verify with the key".into());
    }
    Ok(())
}
