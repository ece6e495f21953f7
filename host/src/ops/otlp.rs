//! OTLP export of spans, written straight from the SDK's span records (decision 0207).
//!
//! - **Encoding.** [`encode`] writes one `ExportTraceServiceRequest` (opentelemetry-proto's
//!   `collector/trace/v1`) into one buffer: no copy of a span, no message structs in
//!   between. A test holds its output equal to what the `opentelemetry-proto` crate's own
//!   conversion encodes.
//! - **Where.** [`Target::resolve`] reads the collector's endpoint, headers and timeout from
//!   the `tracing:` block, else the standard `OTEL_EXPORTER_OTLP_*` variables (a signal's own
//!   before the general one), else the protocol's defaults.
//! - **Transport.** [`Exporter::export`] sends one encoded request: an HTTP `POST` of
//!   `application/x-protobuf` (no redirect followed, so the headers go nowhere else), or a
//!   gRPC call of `TraceService/Export` whose body is passed through as encoded. A
//!   collector's partial success counts its rejected spans as not exported.

use std::time::{Duration, SystemTime};

use bytes::{Buf as _, BufMut as _, Bytes};
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceState};
use opentelemetry::{Array, KeyValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SpanData;

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies, to `<endpoint>/v1/traces`.
    HttpProtobuf,
    /// OTLP/gRPC.
    Grpc,
}

impl Protocol {
    /// The protocol named by `text` as the `OTEL_EXPORTER_OTLP_PROTOCOL` values name them.
    pub fn parse(text: &str) -> Result<Protocol, String> {
        match text {
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "grpc" => Ok(Protocol::Grpc),
            other => Err(format!("{other:?} is not one of http/protobuf, grpc")),
        }
    }
}

/// The longest answer body read from a collector.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The gRPC method spans are exported with.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Where spans go and how: resolved once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The protocol.
    pub protocol: Protocol,
    /// The URL posted to (HTTP) or connected to (gRPC).
    pub url: String,
    /// Headers (HTTP) or metadata (gRPC) sent with each export: a collector's API key.
    pub headers: Vec<(String, String)>,
    /// The longest one export may take.
    pub timeout: Duration,
}

impl Target {
    /// The target given `protocol`, `endpoint` and `timeout` (from `tracing:`; `None`: not
    /// set there) and the environment `env` (a variable's value by name). `Err` names each
    /// variable that does not read.
    pub fn resolve(
        protocol: Option<Protocol>,
        endpoint: Option<&str>,
        timeout: Option<Duration>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Target, String> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let mut problems = Vec::new();
        let protocol = match protocol {
            Some(protocol) => protocol,
            None => ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]
                .iter()
                .find_map(|name| var(name).map(|value| (name, value)))
                .map_or(Protocol::HttpProtobuf, |(name, value)| {
                    Protocol::parse(value.trim()).unwrap_or_else(|why| {
                        problems.push(format!("{name}: {why}"));
                        Protocol::HttpProtobuf
                    })
                }),
        };
        let url = match (endpoint, var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), var("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (Some(endpoint), ..) if protocol == Protocol::HttpProtobuf => http_traces_url(endpoint),
            (Some(endpoint), ..) => endpoint.to_string(),
            // The signal's own variable is the whole URL; the general one is a base.
            (None, Some(url), _) => url,
            (None, None, Some(base)) if protocol == Protocol::HttpProtobuf => {
                format!("{}/v1/traces", base.trim_end_matches('/'))
            }
            (None, None, Some(base)) => base,
            (None, None, None) => match protocol {
                Protocol::HttpProtobuf => "http://localhost:4318/v1/traces".to_string(),
                Protocol::Grpc => "http://localhost:4317".to_string(),
            },
        };
        match url::Url::parse(&url) {
            Ok(parsed) if parsed.scheme() == "http" && parsed.host_str().is_some() => {}
            Ok(parsed) if parsed.scheme() == "https" && protocol == Protocol::HttpProtobuf => {}
            Ok(parsed) if parsed.scheme() == "https" => problems.push(format!(
                "{}: gRPC is plain text here; use protocol http/protobuf for an https:// collector",
                crate::redact::url(&url)
            )),
            _ => problems.push(format!("{:?} is not an http:// or https:// URL", crate::redact::url(&url))),
        }
        let mut headers = Vec::new();
        for name in ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"] {
            let Some(list) = var(name) else { continue };
            match parse_headers(&list) {
                Ok(parsed) => {
                    for (key, value) in parsed {
                        // The signal's own variable wins over the general one's same key.
                        headers.retain(|(k, _): &(String, String)| !k.eq_ignore_ascii_case(&key));
                        headers.push((key, value));
                    }
                }
                Err(why) => problems.push(format!("{name}: {why}")),
            }
        }
        let timeout = match timeout {
            Some(timeout) => timeout,
            None => {
                let from_env = ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
                    .iter()
                    .find_map(|name| var(name).map(|v| (name, v)));
                match from_env {
                    None => DEFAULT_TIMEOUT,
                    Some((name, ms)) => match ms.trim().parse::<u64>() {
                        Ok(ms) if ms > 0 => Duration::from_millis(ms),
                        _ => {
                            problems.push(format!("{name}: {ms:?} is not a positive number of milliseconds"));
                            DEFAULT_TIMEOUT
                        }
                    },
                }
            }
        };
        match var("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION").or_else(|| var("OTEL_EXPORTER_OTLP_COMPRESSION")) {
            None => {}
            Some(c) if c.trim() == "none" => {}
            Some(c) => problems.push(format!("compression {c:?} is not supported; only none")),
        }
        if problems.is_empty() { Ok(Target { protocol, url, headers, timeout }) } else { Err(problems.join("; ")) }
    }
}

/// An export's timeout when neither `tracing.export_timeout` nor a variable sets it (the
/// OTLP default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `tracing.endpoint` for HTTP: a collector's base URL gets `/v1/traces`; a URL with a path
/// of its own is used as it is.
fn http_traces_url(endpoint: &str) -> String {
    match url::Url::parse(endpoint) {
        Ok(url) if url.path().is_empty() || url.path() == "/" => {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        }
        _ => endpoint.to_string(),
    }
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value` pairs separated by commas, each value
/// percent-decoded. A pair without `=`, an empty or unsendable name, or a value that is not
/// sendable is an error (naming the key, never the value: it is often a credential).
fn parse_headers(list: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err("an entry has no `=` (write key=value,key2=value2)".to_string());
        };
        let key = key.trim().to_ascii_lowercase();
        let value = percent_decode(value.trim());
        if reqwest::header::HeaderName::from_bytes(key.as_bytes()).is_err()
            || tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(key.as_bytes()).is_err()
        {
            return Err(format!("{:?} is not a header name", crate::text::printable(&key, 64)));
        }
        if value.as_ref().is_none_or(|v| reqwest::header::HeaderValue::from_str(v).is_err() || !v.is_ascii()) {
            return Err(format!("the value of {key:?} is not a sendable header value"));
        }
        out.push((key, value.unwrap_or_default()));
    }
    Ok(out)
}

/// `%XX` decoded; `None` when an escape is malformed or the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Sends encoded requests to one collector.
pub struct Exporter {
    transport: Transport,
    timeout: Duration,
}

enum Transport {
    Http { client: reqwest::Client, url: String, headers: reqwest::header::HeaderMap },
    Grpc { client: tonic::client::Grpc<tonic::transport::Channel>, metadata: tonic::metadata::MetadataMap },
}

impl Exporter {
    /// The exporter for `target` (connecting lazily: a collector that is down is found out
    /// by the first export, not at start).
    pub fn new(target: &Target) -> anyhow::Result<Exporter> {
        let transport = match target.protocol {
            Protocol::HttpProtobuf => {
                let mut headers = reqwest::header::HeaderMap::new();
                for (key, value) in &target.headers {
                    headers.insert(reqwest::header::HeaderName::from_bytes(key.as_bytes())?, value.parse()?);
                }
                headers.insert(reqwest::header::CONTENT_TYPE, "application/x-protobuf".parse()?);
                let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
                Transport::Http { client, url: target.url.clone(), headers }
            }
            Protocol::Grpc => {
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (key, value) in &target.headers {
                    metadata.insert(tonic::metadata::MetadataKey::from_bytes(key.as_bytes())?, value.parse()?);
                }
                let channel = tonic::transport::Endpoint::from_shared(target.url.clone())?
                    .connect_timeout(target.timeout)
                    .connect_lazy();
                Transport::Grpc { client: tonic::client::Grpc::new(channel), metadata }
            }
        };
        Ok(Exporter { transport, timeout: target.timeout })
    }

    /// Sends one encoded request of `count` spans; `Ok(n)`: the collector took it and
    /// rejected `n` of its spans; `Err`: why nothing was taken, as printable text.
    pub async fn export(&mut self, request: Bytes, count: u64) -> Result<u64, String> {
        let answer = match tokio::time::timeout(self.timeout, self.send(request)).await {
            Ok(answer) => answer?,
            Err(_) => return Err(format!("no answer within {:?}", self.timeout)),
        };
        Ok(rejected(&answer)?.min(count))
    }

    async fn send(&mut self, request: Bytes) -> Result<Bytes, String> {
        match &mut self.transport {
            Transport::Http { client, url, headers } => {
                let response = client
                    .post(url.as_str())
                    .headers(headers.clone())
                    .body(request)
                    .send()
                    .await
                    .map_err(|e| crate::text::printable(&e.without_url().to_string(), 300))?;
                let status = response.status();
                let body = read_bounded(response).await;
                if status.is_success() {
                    Ok(body)
                } else {
                    let said = crate::text::printable(&String::from_utf8_lossy(&body), 200);
                    Err(format!("the collector answered HTTP {status}: {said}"))
                }
            }
            Transport::Grpc { client, metadata } => {
                client.ready().await.map_err(|e| format!("cannot reach the collector: {e}"))?;
                let mut call = tonic::Request::new(request);
                *call.metadata_mut() = metadata.clone();
                let path = http::uri::PathAndQuery::from_static(GRPC_EXPORT);
                match client.unary(call, path, PassThrough).await {
                    Ok(answer) => Ok(answer.into_inner()),
                    Err(status) => Err(format!(
                        "the collector answered gRPC {:?}: {}",
                        status.code(),
                        crate::text::printable(status.message(), 200)
                    )),
                }
            }
        }
    }
}

/// At most [`MAX_ANSWER_BYTES`] of a response's body; what does not arrive is left out.
async fn read_bounded(mut response: reqwest::Response) -> Bytes {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = MAX_ANSWER_BYTES - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() == MAX_ANSWER_BYTES {
            break;
        }
    }
    Bytes::from(body)
}

/// `ExportTraceServiceResponse.partial_success`: the spans the collector rejected.
#[derive(Clone, PartialEq, prost::Message)]
struct Answer {
    #[prost(message, optional, tag = "1")]
    partial_success: Option<PartialSuccess>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PartialSuccess {
    #[prost(int64, tag = "1")]
    rejected_spans: i64,
    #[prost(string, tag = "2")]
    error_message: String,
}

/// The spans an answer says were rejected (an empty answer: none).
fn rejected(answer: &[u8]) -> Result<u64, String> {
    let answer = <Answer as prost::Message>::decode(answer)
        .map_err(|e| format!("the collector's answer does not read as OTLP: {e}"))?;
    Ok(answer.partial_success.map_or(0, |p| p.rejected_spans.max(0) as u64))
}

/// The gRPC codec for bodies already encoded: sent and received as bytes.
#[derive(Debug, Clone, Copy, Default)]
struct PassThrough;

impl tonic::codec::Codec for PassThrough {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = PassThrough;
    type Decoder = PassThrough;

    fn encoder(&mut self) -> Self::Encoder {
        PassThrough
    }

    fn decoder(&mut self) -> Self::Decoder {
        PassThrough
    }
}

impl tonic::codec::Encoder for PassThrough {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl tonic::codec::Decoder for PassThrough {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        let len = src.remaining().min(MAX_ANSWER_BYTES);
        let answer = src.copy_to_bytes(len);
        src.advance(src.remaining());
        Ok(Some(answer))
    }
}

/// `spans`, of one `resource`, as one `ExportTraceServiceRequest` appended to `out`.
/// Consecutive spans of one instrumentation scope share a `ScopeSpans`.
pub fn encode(spans: &[SpanData], resource: &Resource, out: &mut Vec<u8>) {
    // ExportTraceServiceRequest.resource_spans
    nested(out, 1, |out| {
        // ResourceSpans.resource
        nested(out, 1, |out| {
            for (key, value) in resource.iter() {
                tag(out, 1, 2);
                varint(out, key_value_len(key.as_str(), value) as u64);
                key_value(out, key.as_str(), value);
            }
        });
        for run in spans.chunk_by(|a, b| a.instrumentation_scope == b.instrumentation_scope) {
            let scope = &run[0].instrumentation_scope;
            // ResourceSpans.scope_spans
            nested(out, 2, |out| {
                nested(out, 1, |out| {
                    string(out, 1, scope.name());
                    string(out, 2, scope.version().unwrap_or(""));
                    for kv in scope.attributes() {
                        attribute(out, 3, kv);
                    }
                });
                for span in run {
                    nested(out, 2, |out| encode_span(out, span));
                }
                string(out, 3, scope.schema_url().unwrap_or(""));
            });
        }
        string(out, 3, resource.schema_url().unwrap_or(""));
    });
}

/// `opentelemetry.proto.trace.v1.Span`.
fn encode_span(out: &mut Vec<u8>, span: &SpanData) {
    let sc = &span.span_context;
    bytes(out, 1, &sc.trace_id().to_bytes());
    bytes(out, 2, &sc.span_id().to_bytes());
    trace_state(out, 3, sc.trace_state());
    if span.parent_span_id != SpanId::INVALID {
        bytes(out, 4, &span.parent_span_id.to_bytes());
    }
    string(out, 5, &span.name);
    varint_field(out, 6, kind(&span.span_kind));
    fixed64(out, 7, nanos(span.start_time));
    fixed64(out, 8, nanos(span.end_time));
    for kv in &span.attributes {
        attribute(out, 9, kv);
    }
    varint_field(out, 10, u64::from(span.dropped_attributes_count));
    for event in &span.events.events {
        nested(out, 11, |out| {
            fixed64(out, 1, nanos(event.timestamp));
            string(out, 2, &event.name);
            for kv in &event.attributes {
                attribute(out, 3, kv);
            }
            varint_field(out, 4, u64::from(event.dropped_attributes_count));
        });
    }
    varint_field(out, 12, u64::from(span.events.dropped_count));
    for link in &span.links.links {
        nested(out, 13, |out| {
            let sc = &link.span_context;
            bytes(out, 1, &sc.trace_id().to_bytes());
            bytes(out, 2, &sc.span_id().to_bytes());
            trace_state(out, 3, sc.trace_state());
            for kv in &link.attributes {
                attribute(out, 4, kv);
            }
            varint_field(out, 5, u64::from(link.dropped_attributes_count));
            fixed32(out, 6, flags(sc.is_remote(), sc.trace_flags().to_u8()));
        });
    }
    varint_field(out, 14, u64::from(span.links.dropped_count));
    nested(out, 15, |out| {
        if let Status::Error { description } = &span.status {
            string(out, 2, description);
        }
        let code = match span.status {
            Status::Unset => 0,
            Status::Ok => 1,
            Status::Error { .. } => 2,
        };
        varint_field(out, 3, code);
    });
    fixed32(out, 16, flags(span.parent_span_is_remote, sc.trace_flags().to_u8()));
}

/// `Span.flags`: the W3C flags, and whether the parent is known to be remote (bit 8) and is
/// (bit 9).
fn flags(parent_is_remote: bool, trace_flags: u8) -> u32 {
    u32::from(trace_flags) | 0x100 | if parent_is_remote { 0x200 } else { 0 }
}

fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn trace_state(out: &mut Vec<u8>, field: u32, state: &TraceState) {
    if *state != TraceState::NONE {
        string(out, field, &state.header());
    }
}

/// A `KeyValue` field. Its length and its value's are worked out before they are written
/// (attributes are most of a span's fields; moving each body behind its length cost more
/// than the rest of the encoding).
fn attribute(out: &mut Vec<u8>, field: u32, kv: &KeyValue) {
    let key = kv.key.as_str();
    tag(out, field, 2);
    varint(out, key_value_len(key, &kv.value) as u64);
    key_value(out, key, &kv.value);
}

/// `KeyValue`'s fields: its key and its `AnyValue`.
fn key_value(out: &mut Vec<u8>, key: &str, value: &Value) {
    string(out, 1, key);
    tag(out, 2, 2);
    varint(out, any_value_len(value) as u64);
    any_value(out, value);
}

fn key_value_len(key: &str, value: &Value) -> usize {
    let key = if key.is_empty() { 0 } else { delimited_len(key.len()) };
    key + delimited_len(any_value_len(value))
}

/// A length-delimited field of `len` bytes, with its tag (of a field below 16) and length.
fn delimited_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

/// `AnyValue`'s one field (a oneof: written even when it holds its type's zero).
fn any_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::String(s) => length_delimited(out, 1, s.as_str().as_bytes()),
        Value::Bool(b) => {
            tag(out, 2, 0);
            varint(out, u64::from(*b));
        }
        Value::I64(i) => {
            tag(out, 3, 0);
            varint(out, *i as u64);
        }
        Value::F64(f) => {
            tag(out, 4, 1);
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        Value::Array(_) => {
            tag(out, 5, 2);
            varint(out, array_len(value) as u64);
            each_element(value, |element| {
                tag(out, 1, 2);
                varint(out, any_value_len(element) as u64);
                any_value(out, element);
            });
        }
        _ => {}
    }
}

/// What [`any_value`] writes, in bytes.
fn any_value_len(value: &Value) -> usize {
    match value {
        Value::String(s) => delimited_len(s.as_str().len()),
        Value::Bool(_) => 2,
        Value::I64(i) => 1 + varint_len(*i as u64),
        Value::F64(_) => 9,
        Value::Array(_) => delimited_len(array_len(value)),
        _ => 0,
    }
}

/// An array value's `ArrayValue` body, in bytes.
fn array_len(array: &Value) -> usize {
    let mut len = 0;
    each_element(array, |element| len += delimited_len(any_value_len(element)));
    len
}

/// Calls `f` with each element of an array value, as a value of its own.
fn each_element(array: &Value, mut f: impl FnMut(&Value)) {
    let Value::Array(array) = array else { return };
    match array {
        Array::Bool(values) => values.iter().for_each(|v| f(&Value::Bool(*v))),
        Array::I64(values) => values.iter().for_each(|v| f(&Value::I64(*v))),
        Array::F64(values) => values.iter().for_each(|v| f(&Value::F64(*v))),
        Array::String(values) => values.iter().for_each(|v| f(&Value::String(v.clone()))),
        _ => {}
    }
}

/// A message field: what `body` writes, after its tag and length (written last, then moved
/// in front of the body: one copy of it, no second buffer).
fn nested(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    body(out);
    let mut head = [0u8; 15];
    let mut n = 0;
    for mut value in [u64::from(field << 3 | 2), (out.len() - start) as u64] {
        while value >= 0x80 {
            head[n] = (value as u8) | 0x80;
            value >>= 7;
            n += 1;
        }
        head[n] = value as u8;
        n += 1;
    }
    out.splice(start..start, head[..n].iter().copied());
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint(out, u64::from(field << 3 | wire_type));
}

fn length_delimited(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    tag(out, field, 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// A proto3 scalar field: left out when it holds its type's zero, as every encoder does.
fn string(out: &mut Vec<u8>, field: u32, value: &str) {
    if !value.is_empty() {
        length_delimited(out, field, value.as_bytes());
    }
}

fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    if !value.is_empty() {
        length_delimited(out, field, value);
    }
}

fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        tag(out, field, 0);
        varint(out, value);
    }
}

fn fixed64(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        tag(out, field, 1);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

fn fixed32(out: &mut Vec<u8>, field: u32, value: u32) {
    if value != 0 {
        tag(out, field, 5);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::InstrumentationScope;
    use opentelemetry::trace::{Event, Link, SpanContext, TraceFlags, TraceId};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use prost::Message as _;
    use std::borrow::Cow;

    fn context(trace: u128, span: u64, flags: u8, remote: bool, state: &str) -> SpanContext {
        let state = if state.is_empty() { TraceState::NONE } else { state.parse().expect("a trace state") };
        SpanContext::new(TraceId::from(trace), SpanId::from(span), TraceFlags::new(flags), remote, state)
    }

    /// Spans of every shape the encoder meets: with and without a parent (local or remote),
    /// a trace state, attributes of each value type (zeros included), events, links, each
    /// status, two scopes.
    fn spans() -> Vec<SpanData> {
        let scope = InstrumentationScope::builder("outbox-host").build();
        let other = InstrumentationScope::builder("other")
            .with_version("1.2.3")
            .with_schema_url("https://opentelemetry.io/schemas/1.26.0")
            .with_attributes([KeyValue::new("scope.key", "v")])
            .build();
        let at = |ns: u64| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
        let attributes = vec![
            KeyValue::new("messaging.system", "outbox-host"),
            KeyValue::new("empty", ""),
            KeyValue::new("outbox.attempt", 3_i64),
            KeyValue::new("zero", 0_i64),
            KeyValue::new("negative", -7_i64),
            KeyValue::new("no", false),
            KeyValue::new("yes", true),
            KeyValue::new("ratio", 0.25_f64),
            KeyValue::new("nought", 0.0_f64),
            KeyValue::new("ids", Value::Array(Array::I64(vec![1, 0, -1]))),
            KeyValue::new("names", Value::Array(Array::String(vec!["a".into(), "".into()]))),
            KeyValue::new("flags", Value::Array(Array::Bool(vec![true, false]))),
            KeyValue::new("weights", Value::Array(Array::F64(vec![0.5]))),
            KeyValue::new("room", "r".repeat(300)),
        ];
        let base = SpanData {
            span_context: context(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736, 0x00f0_67aa_0ba9_02b7, 1, false, ""),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Producer,
            name: Cow::Borrowed("deliver fake"),
            start_time: at(1_765_000_000_123_456_789),
            end_time: at(1_765_000_000_223_456_789),
            attributes: attributes.clone(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: scope.clone(),
        };
        let mut remote_child = base.clone();
        remote_child.span_context = context(7, 8, 1, false, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
        remote_child.parent_span_id = SpanId::from(9);
        remote_child.parent_span_is_remote = true;
        remote_child.status = Status::error("the sink said no");
        remote_child.dropped_attributes_count = 2;
        let mut local_child = base.clone();
        local_child.span_context = context(7, 10, 0, false, "");
        local_child.parent_span_id = SpanId::from(8);
        local_child.span_kind = SpanKind::Client;
        local_child.name = Cow::Owned("POST".to_string());
        local_child.status = Status::Ok;
        local_child.attributes = Vec::new();
        local_child.events.events = vec![
            Event::new("retry", at(5), vec![KeyValue::new("n", 1_i64)], 1),
            Event::new("", SystemTime::UNIX_EPOCH, Vec::new(), 0),
        ];
        local_child.events.dropped_count = 3;
        local_child.links.links = vec![
            Link::new(context(1, 2, 1, true, "k=v"), vec![KeyValue::new("link", "x")], 4),
            Link::new(context(3, 4, 0, false, ""), Vec::new(), 0),
        ];
        local_child.links.dropped_count = 5;
        let mut others = Vec::new();
        for kind in [SpanKind::Internal, SpanKind::Server, SpanKind::Consumer] {
            let mut span = base.clone();
            span.instrumentation_scope = other.clone();
            span.span_kind = kind;
            others.push(span);
        }
        let mut all = vec![base, remote_child, local_child];
        all.extend(others);
        all
    }

    /// Scope spans ordered by scope name, attributes by key: the two encoders group alike but
    /// not in the same order.
    fn normalised(mut request: ExportTraceServiceRequest) -> ExportTraceServiceRequest {
        for resource_spans in &mut request.resource_spans {
            if let Some(resource) = &mut resource_spans.resource {
                resource.attributes.sort_by(|a, b| a.key.cmp(&b.key));
            }
            resource_spans.scope_spans.sort_by(|a, b| {
                let name =
                    |s: &opentelemetry_proto::tonic::trace::v1::ScopeSpans| s.scope.as_ref().unwrap().name.clone();
                name(a).cmp(&name(b))
            });
        }
        request
    }

    #[test]
    fn the_encoding_is_what_the_opentelemetry_crates_encode() {
        let resource = Resource::builder().with_service_name("outbox-host").build();
        let spans = spans();
        let mut ours = Vec::new();
        encode(&spans, &resource, &mut ours);
        let theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(spans, &ResourceAttributesWithSchema::from(&resource)),
        };
        let decoded = ExportTraceServiceRequest::decode(ours.as_slice()).expect("our encoding decodes");
        assert_eq!(normalised(decoded), normalised(theirs.clone()));
        // And byte for byte where the order is the same: one scope.
        let one_scope: Vec<SpanData> = super::tests::spans().into_iter().take(3).collect();
        let mut ours = Vec::new();
        encode(&one_scope, &resource, &mut ours);
        let mut theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                one_scope,
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        theirs = normalised(theirs);
        let mut decoded = ExportTraceServiceRequest::decode(ours.as_slice()).expect("decodes");
        decoded = normalised(decoded);
        assert_eq!(decoded, theirs);
        assert_eq!(decoded.encode_to_vec(), theirs.encode_to_vec());
    }

    #[test]
    fn a_varints_length_is_what_it_writes() {
        for value in [0, 1, 127, 128, 300, 16_383, 16_384, 1 << 35, u64::MAX >> 1, u64::MAX] {
            let mut out = Vec::new();
            varint(&mut out, value);
            assert_eq!(varint_len(value), out.len(), "{value}");
        }
        for value in [Value::I64(-1), Value::Array(Array::String(vec!["x".repeat(200).into(); 3]))] {
            let mut out = Vec::new();
            any_value(&mut out, &value);
            assert_eq!(any_value_len(&value), out.len(), "{value:?}");
        }
    }

    #[test]
    fn a_partial_success_counts_its_rejected_spans() {
        assert_eq!(rejected(&[]), Ok(0));
        let answer = Answer {
            partial_success: Some(PartialSuccess { rejected_spans: 3, error_message: "too old".to_string() }),
        };
        assert_eq!(rejected(&prost::Message::encode_to_vec(&answer)), Ok(3));
        assert!(rejected(b"\xff\xff\xff").unwrap_err().contains("does not read as OTLP"));
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_endpoint_comes_from_the_config_then_the_signal_then_the_base() {
        let http = Protocol::HttpProtobuf;
        let resolve = |protocol, endpoint, vars: &[(&str, &str)]| {
            Target::resolve(Some(protocol), endpoint, None, env(vars)).map(|t| t.url)
        };
        assert_eq!(resolve(http, None, &[]).unwrap(), "http://localhost:4318/v1/traces");
        assert_eq!(resolve(Protocol::Grpc, None, &[]).unwrap(), "http://localhost:4317");
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/otlp/");
        assert_eq!(resolve(http, None, &[base]).unwrap(), "http://collector:4318/otlp/v1/traces");
        assert_eq!(resolve(Protocol::Grpc, None, &[base]).unwrap(), "http://collector:4318/otlp/");
        let signal = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:9999/in");
        assert_eq!(resolve(http, None, &[base, signal]).unwrap(), "http://traces:9999/in");
        assert_eq!(resolve(http, Some("http://c:4318"), &[base, signal]).unwrap(), "http://c:4318/v1/traces");
        assert_eq!(
            resolve(http, Some("https://x.example/otlp/v1/traces"), &[]).unwrap(),
            "https://x.example/otlp/v1/traces"
        );
        assert_eq!(resolve(http, Some("http://c:4318/"), &[]).unwrap(), "http://c:4318/v1/traces");
        assert!(resolve(Protocol::Grpc, Some("https://c:4317"), &[]).unwrap_err().contains("plain text"));
        let bad = resolve(http, None, &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://user:secret@c/")]).unwrap_err();
        assert!(bad.contains("not an http") && !bad.contains("secret"), "{bad}");
    }

    #[test]
    fn headers_are_read_as_the_variables_write_them() {
        let target = Target::resolve(
            None,
            None,
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=general%20key, X-Tenant=a"),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "API-Key=traces%3Dkey"),
            ]),
        )
        .unwrap();
        assert_eq!(
            target.headers,
            vec![("x-tenant".to_string(), "a".to_string()), ("api-key".to_string(), "traces=key".to_string())]
        );
        for (list, said) in [
            ("api-key", "no `=`"),
            ("bad name=x", "not a header name"),
            ("api-key=%zzsecret", "\"api-key\" is not a sendable"),
            ("api-key=a%0Asecret", "\"api-key\" is not a sendable"),
        ] {
            let why = Target::resolve(Some(Protocol::Grpc), None, None, env(&[("OTEL_EXPORTER_OTLP_HEADERS", list)]))
                .unwrap_err();
            assert!(why.contains("OTEL_EXPORTER_OTLP_HEADERS") && why.contains(said), "{list}: {why}");
            assert!(!why.contains("secret"), "a value is never shown: {why}");
        }
    }

    #[test]
    fn the_timeout_comes_from_the_config_then_the_variables() {
        let timeout = |config, vars: &[(&str, &str)]| {
            Target::resolve(Some(Protocol::HttpProtobuf), None, config, env(vars)).map(|t| t.timeout)
        };
        assert_eq!(timeout(None, &[]), Ok(DEFAULT_TIMEOUT));
        let general = ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500");
        let signal = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "750");
        assert_eq!(timeout(None, &[general]), Ok(Duration::from_millis(2500)));
        assert_eq!(timeout(None, &[general, signal]), Ok(Duration::from_millis(750)));
        assert_eq!(timeout(Some(Duration::from_secs(3)), &[general, signal]), Ok(Duration::from_secs(3)));
        let why = timeout(None, &[("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]).unwrap_err();
        assert!(why.contains("OTEL_EXPORTER_OTLP_TIMEOUT") && why.contains("milliseconds"), "{why}");
        // Every problem is named at once.
        let why = Target::resolve(
            None,
            None,
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ]),
        )
        .unwrap_err();
        assert!(why.contains("OTEL_EXPORTER_OTLP_TIMEOUT") && why.contains("gzip"), "{why}");
        assert!(why.contains("OTEL_EXPORTER_OTLP_PROTOCOL: \"http/json\""), "{why}");
    }
}
