//! An OpenTelemetry collector stand-in: receives OTLP exports over HTTP/protobuf (`POST
//! /v1/traces`) or gRPC (`TraceService/Export`, served by tonic) and decodes them with the
//! official protobuf definitions (the `opentelemetry-proto` crate's messages and service,
//! generated from opentelemetry-proto), not with anything of the host's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;

/// The OTLP span kinds the tests look for (`opentelemetry.proto.trace.v1.Span.SpanKind`).
pub const KIND_CLIENT: i32 = 3;
/// A producer span.
pub const KIND_PRODUCER: i32 = 4;
/// A span's status code ERROR.
pub const STATUS_ERROR: i32 = 2;

/// One span as exported, with its ids as lower-case hex.
#[derive(Debug, Clone)]
pub struct Span {
    /// `service.name` of the resource it came with.
    pub service: String,
    /// Its name.
    pub name: String,
    /// Its kind ([`KIND_PRODUCER`], [`KIND_CLIENT`], …).
    pub kind: i32,
    /// The trace id, 32 hex digits.
    pub trace_id: String,
    /// The span id, 16 hex digits.
    pub span_id: String,
    /// The parent's span id, empty for a root span.
    pub parent_span_id: String,
    /// Attributes, each value as text (strings as they are, numbers in decimal).
    pub attributes: HashMap<String, String>,
    /// The status code (0 unset, 1 ok, 2 error).
    pub status: i32,
}

impl Span {
    /// Attribute `key`, or the empty string.
    pub fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }
}

#[derive(Default)]
struct Shared {
    spans: Vec<Span>,
    requests: usize,
    /// Each request's headers (gRPC: its ASCII metadata), names lower-case.
    headers: Vec<HashMap<String, String>>,
    /// Spans of each request answered as rejected (a partial success).
    reject: i64,
}

/// The receiver.
pub struct OtlpReceiver {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
}

impl OtlpReceiver {
    /// Starts an OTLP/gRPC receiver on a free loopback port.
    pub async fn start_grpc() -> OtlpReceiver {
        use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(Grpc { shared: shared.clone() });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        OtlpReceiver { addr, shared }
    }

    /// Starts an OTLP/HTTP receiver on a free loopback port.
    pub async fn start() -> OtlpReceiver {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let app = Router::new().route("/v1/traces", post(export)).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        OtlpReceiver { addr, shared }
    }

    /// The collector's base URL (`tracing.endpoint`; the exporter adds `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.shared.lock().unwrap().spans.clone()
    }

    /// How many export requests arrived.
    pub fn requests(&self) -> usize {
        self.shared.lock().unwrap().requests
    }

    /// Header `name` of each request so far, in order (`None` where one lacked it).
    pub fn header(&self, name: &str) -> Vec<Option<String>> {
        self.shared.lock().unwrap().headers.iter().map(|h| h.get(name).cloned()).collect()
    }

    /// From now on, answers each request with a partial success rejecting `spans` of its
    /// spans (at most as many as it held).
    pub fn reject(&self, spans: i64) {
        self.shared.lock().unwrap().reject = spans;
    }
}

/// The gRPC service.
struct Grpc {
    shared: Arc<Mutex<Shared>>,
}

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers = request
            .metadata()
            .iter()
            .filter_map(|entry| match entry {
                tonic::metadata::KeyAndValueRef::Ascii(key, value) => {
                    Some((key.as_str().to_string(), value.to_str().ok()?.to_string()))
                }
                tonic::metadata::KeyAndValueRef::Binary(..) => None,
            })
            .collect();
        let answer = keep(&self.shared, request.into_inner(), headers);
        Ok(tonic::Response::new(answer))
    }
}

async fn export(
    State(shared): State<Arc<Mutex<Shared>>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
        return (StatusCode::BAD_REQUEST, "not an ExportTraceServiceRequest").into_response();
    };
    let headers = headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str().to_string(), value.to_str().ok()?.to_string())))
        .collect();
    let answer = keep(&shared, request, headers).encode_to_vec();
    ([("content-type", "application/x-protobuf")], answer).into_response()
}

/// Keeps the spans of one export and its headers; the answer to send.
fn keep(
    shared: &Mutex<Shared>,
    request: ExportTraceServiceRequest,
    headers: HashMap<String, String>,
) -> ExportTraceServiceResponse {
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(Span {
                    service: service.clone(),
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    status: span.status.map_or(0, |s| s.code),
                });
            }
        }
    }
    let mut shared = shared.lock().unwrap();
    let rejected = shared.reject.min(spans.len() as i64);
    shared.requests += 1;
    shared.headers.push(headers);
    shared.spans.extend(spans);
    ExportTraceServiceResponse {
        partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
            rejected_spans: rejected,
            error_message: "rejected by the test".to_string(),
        }),
    }
}

fn attributes(list: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> HashMap<String, String> {
    list.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
