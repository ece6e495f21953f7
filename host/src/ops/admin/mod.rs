//! The admin listener (loopback by default): `/healthz`, `/readyz`, `/metrics`, the operator
//! console (`/`, `/sinks/{name}`, `/events/{id}`: [`crate::ops::console`]), and the operator
//! API under `/api`. Readiness means the database answers and
//! the worker runs (503 while draining); a failing sink never makes the host unready, as IM
//! trouble must not take the producer's service down with it.
//!
//! A browser can reach this listener, so nothing a web page does may change state (see
//! [`guard`]): only allowed `Host` names are answered, every state change needs the admin
//! token and a same-origin request, and the page cannot be framed.

pub mod settings;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::{Form, Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub use guard::Guard;

use crate::ops;
use crate::ops::console::{self, Frame, SinkLine};
use crate::ops::metrics::Metrics;

mod guard;
use crate::store::{Status, Store, now_ms};

/// What the admin endpoints read and act on.
pub struct AdminState {
    /// The outbox store.
    pub store: Arc<dyn Store>,
    /// The host's metrics.
    pub metrics: Arc<Metrics>,
    /// Set while the worker loop runs (or when the worker is disabled by config).
    pub worker_running: AtomicBool,
    /// Set once shutdown has begun.
    pub draining: AtomicBool,
    /// Outbox table name, for the page.
    pub table: String,
    /// This host, for the page.
    pub node_id: String,
    /// Who may do what: allowed hosts, the admin token, the form token.
    pub guard: Guard,
    /// `admin.unready_after_db_failures`.
    pub unready_after_db_failures: u32,
    /// Reloads this host's sinks.
    pub reloader: Arc<dyn crate::ops::Reload>,
    /// What the console and `/api/status` last read of the tables (see [`table_view`]).
    pub views: tokio::sync::Mutex<Views>,
}

/// What the console and `/api/status` last read of the tables, each kept for
/// [`VIEW_FRESH_FOR`].
#[derive(Default)]
pub struct Views {
    overview: Option<Arc<TableView>>,
    /// By sink name: only registered sinks get here.
    sinks: std::collections::HashMap<String, Arc<SinkView>>,
}

/// What the overview and `/api/status` show of the tables.
pub struct TableView {
    read_at: std::time::Instant,
    /// The first sink's counts (the outbox's own `status`).
    stats: crate::store::Stats,
    /// `None` when the sinks' counts could not be read.
    sinks: Option<Vec<crate::ops::SinkSummary>>,
}

/// What a sink's page shows of the tables.
pub struct SinkView {
    read_at: std::time::Instant,
    summary: crate::ops::SinkSummary,
    history: Vec<crate::store::Minute>,
    failures: Vec<crate::store::Row>,
}

/// How long a view is served before the tables are read again.
const VIEW_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// The tables' counts, read at most about once a second however often the overview or
/// `/api/status` is asked (requests meanwhile share one read): a page that reloads in a
/// loop cannot make the host scan its tables in a loop.
async fn table_view(s: &AdminState) -> Result<Arc<TableView>, crate::store::StoreError> {
    let mut views = s.views.lock().await;
    if let Some(view) = views.overview.as_ref().filter(|v| v.read_at.elapsed() < VIEW_FRESH_FOR) {
        return Ok(view.clone());
    }
    let stats = s.store.stats().await?;
    let sinks = crate::ops::sink_summaries(s.store.clone(), &stats).await.ok();
    let view = Arc::new(TableView { read_at: std::time::Instant::now(), stats, sinks });
    // A read that failed in part is served once, not kept: the next ask tries again.
    views.overview = view.sinks.is_some().then(|| view.clone());
    Ok(view)
}

/// Why a sink's page cannot be shown.
enum SinkViewError {
    Unknown(ops::ReplayError),
    Store(crate::store::StoreError),
}

/// One sink's counts, owners, history and failures, read at most about once a second per
/// sink (as [`table_view`]).
async fn sink_view(s: &AdminState, name: &str) -> Result<Arc<SinkView>, SinkViewError> {
    let mut views = s.views.lock().await;
    if let Some(view) = views.sinks.get(name).filter(|v| v.read_at.elapsed() < VIEW_FRESH_FOR) {
        return Ok(view.clone());
    }
    let (summary, own) = ops::sink_summary(s.store.clone(), name).await.map_err(|e| match e {
        ops::ReplayError::Store(e) => SinkViewError::Store(e),
        other => SinkViewError::Unknown(other),
    })?;
    let read = async {
        let history = own.history(now_ms() - 3_600_000).await?;
        let failures = own.recent_failures(20).await?;
        Ok::<_, crate::store::StoreError>(SinkView { read_at: std::time::Instant::now(), summary, history, failures })
    };
    let view = Arc::new(read.await.map_err(SinkViewError::Store)?);
    views.sinks.insert(name.to_string(), view.clone());
    Ok(view)
}

/// After a change made over HTTP, the next view reads the tables again.
async fn forget_view(s: &AdminState) {
    *s.views.lock().await = Views::default();
}

/// What this host knows of `summary`'s sink beyond the table.
fn sink_line<'a>(s: &AdminState, summary: &'a ops::SinkSummary) -> SinkLine<'a> {
    let name = &summary.name;
    SinkLine {
        summary,
        breaker: s.metrics.breaker_of(name),
        brokers: s.metrics.brokers_of(name),
        misconfigured: s.metrics.misconfigured().into_iter().find(|(n, _)| n == name).map(|(_, why)| why),
    }
}

/// The top of every console page.
fn frame<'a>(s: &'a AdminState, flash: Option<&'a str>) -> Frame<'a> {
    Frame {
        table: &s.table,
        node_id: &s.node_id,
        now_ms: now_ms(),
        flash,
        db_failure: s.metrics.db_health().last_failure(),
    }
}

/// Binds the admin address, so that a port already taken fails start-up.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("admin.listen: cannot listen on {addr}: {e}"))
}

/// Serves the admin endpoints on `listener` until `stop`.
pub fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/", get(overview_page))
        .route("/sinks/{name}", get(sink_page))
        .route("/events", get(search_page))
        .route("/events/{event_id}", get(event_page))
        .route("/api/events", get(search_api))
        .route("/events/bulk", post(bulk_form))
        .route("/api/events/bulk", post(bulk_api))
        .route("/retry", post(retry_form))
        .route("/api/status", get(status_json))
        .route("/api/events/{event_id}", get(show_event))
        .route("/api/retry", post(retry_api))
        .route("/api/purge", post(purge_api))
        .route("/replay", post(replay_form))
        .route("/api/sinks/{name}/replay", post(replay_api))
        .route("/api/sinks/{name}/reload", post(reload_api))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::screen))
        .with_state(state);
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin listener failed");
        }
    })
}

/// A database failure as a 503 with its (SQL-free, password-free) message.
fn unavailable(e: impl std::fmt::Display) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": e.to_string() }))).into_response()
}

async fn ready(State(s): State<Arc<AdminState>>) -> (StatusCode, String) {
    if s.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n".into());
    }
    if !s.worker_running.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "worker not running\n".into());
    }
    // A sink whose config denies where it sends delivers nothing until an operator acts.
    if let Some((sink, why)) = s.metrics.misconfigured().into_iter().next() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("sink {sink} is misconfigured: {why}\n"));
    }
    // A relay whose broker cannot be reached delivers nothing until it is back.
    if let Some((name, broker)) = s.metrics.brokers().into_iter().find(|(_, b)| !b.up) {
        let why = broker.error.unwrap_or_default();
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("broker {name} ({}) cannot be reached: {why}\n", broker.kind),
        );
    }
    let health = s.metrics.db_health();
    let in_a_row = health.failures_in_a_row();
    if in_a_row >= s.unready_after_db_failures
        && let Some(last) = health.last_failure()
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "database: the last {in_a_row} claims or outcome writes failed; last ({}): {}\n",
                last.operation, last.error
            ),
        );
    }
    match s.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, crate::ops::metrics::CONTENT_TYPE)], s.metrics.render())
}

#[derive(Deserialize)]
struct Flash {
    moved: Option<u64>,
    replayed: Option<u64>,
    sink: Option<String>,
    bulk: Option<String>,
    changed: Option<u64>,
}

impl Flash {
    fn text(self) -> Option<String> {
        if let (Some(action), Some(n)) = (self.bulk.as_deref(), self.changed) {
            return Some(match action {
                "retry" => format!("Moved {n} failed event(s) back to pending."),
                "discard" => format!("Discarded {n} waiting event(s): marked failed."),
                _ => format!("Replaying {n} event(s) to this sink."),
            });
        }
        match (self.moved, self.replayed) {
            (Some(n), _) => Some(format!("Moved {n} failed event(s) back to pending.")),
            (None, Some(n)) => Some(format!("Replaying {n} event(s) to sink {}.", self.sink.unwrap_or_default())),
            (None, None) => None,
        }
    }
}

async fn overview_page(State(s): State<Arc<AdminState>>, Query(flash): Query<Flash>) -> Response {
    let view = match table_view(&s).await {
        Ok(view) => view,
        Err(e) => return unavailable(e),
    };
    let flash = flash.text();
    let overview = console::overview::Overview {
        sinks: view.sinks.as_ref().map(|sinks| sinks.iter().map(|summary| sink_line(&s, summary)).collect()),
        brokers: s.metrics.brokers(),
        misconfigured: s.metrics.misconfigured(),
    };
    Html(console::overview::render(&frame(&s, flash.as_deref()), &overview)).into_response()
}

/// A page that says what was not found, escaped.
fn not_found(what: String) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>not found</title></head><body>\
         <p id=\"not-found\">{}</p><p><a href=\"/\">overview</a></p></body></html>",
        console::show(&what)
    );
    (StatusCode::NOT_FOUND, Html(body)).into_response()
}

async fn sink_page(State(s): State<Arc<AdminState>>, Path(name): Path<String>, Query(flash): Query<Flash>) -> Response {
    let view = match sink_view(&s, &name).await {
        Ok(view) => view,
        Err(SinkViewError::Unknown(e)) => return not_found(e.to_string()),
        Err(SinkViewError::Store(e)) => return unavailable(e),
    };
    let flash = flash.text();
    let page = console::sink::SinkPage {
        line: sink_line(&s, &view.summary),
        history: &view.history,
        failures: &view.failures,
        form_token: s.guard.mutations_allowed().then(|| s.guard.form_token()),
        held_rooms: s.metrics.rooms_held_of(&name),
    };
    Html(console::sink::render(&frame(&s, flash.as_deref()), &page)).into_response()
}

/// The pairs of a query string (a key may repeat).
fn query_pairs(query: Option<String>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect()
}

/// A search's outcome: its sink and page, or why not (a sink not registered is the
/// caller's mistake; a database failure is not).
async fn run_search(s: &AdminState, request: &ops::SearchRequest) -> Result<(String, crate::store::Found), Response> {
    ops::search(s.store.clone(), request).await.map_err(|e| match e {
        ops::ReplayError::Store(e) => unavailable(e),
        other => (StatusCode::NOT_FOUND, Json(json!({ "error": other.to_string() }))).into_response(),
    })
}

async fn search_page(State(s): State<Arc<AdminState>>, RawQuery(query): RawQuery) -> Response {
    let asked = query.as_deref().is_some_and(|q| !q.is_empty());
    let (request, outcome) = match ops::search_request(query_pairs(query)) {
        Ok(request) if !asked => (request, None),
        Ok(request) => {
            let outcome = match ops::search(s.store.clone(), &request).await {
                Ok(found) => Ok(found),
                Err(ops::ReplayError::Store(e)) => return unavailable(e),
                Err(other) => Err(other.to_string()),
            };
            (request, Some(outcome))
        }
        Err(why) => (
            ops::SearchRequest {
                search: crate::store::Search { limit: ops::SEARCH_PAGE, ..Default::default() },
                sink: None,
            },
            Some(Err(why)),
        ),
    };
    let sinks = match s.store.sinks().await {
        Ok(sinks) => sinks.into_iter().map(|sink| sink.name).collect::<Vec<_>>(),
        Err(e) => return unavailable(e),
    };
    let form_token = s.guard.mutations_allowed().then(|| s.guard.form_token());
    let page = console::search::SearchPage { sinks: &sinks, request: &request, outcome, form_token };
    Html(console::search::render(&frame(&s, None), &page)).into_response()
}

async fn search_api(State(s): State<Arc<AdminState>>, RawQuery(query): RawQuery) -> Response {
    let request = match ops::search_request(query_pairs(query)) {
        Ok(request) => request,
        Err(why) => return (StatusCode::BAD_REQUEST, Json(json!({ "error": why }))).into_response(),
    };
    match run_search(&s, &request).await {
        Ok((sink, found)) => Json(json!({
            "sink": sink,
            "events": found.rows.iter().map(ops::actions::describe_state).collect::<Vec<_>>(),
            "next_cursor": found.next.as_ref().map(crate::store::Cursor::encode),
            "scanned": found.scanned,
        }))
        .into_response(),
        Err(response) => response,
    }
}

/// A bulk action as asked: its own keys, and the search it acts on.
struct BulkAsk {
    action: String,
    target: Option<String>,
    confirm: Option<usize>,
    request: ops::SearchRequest,
}

impl BulkAsk {
    fn parse(pairs: Vec<(String, String)>) -> Result<BulkAsk, String> {
        let (mut action, mut target, mut confirm) = (None, None, None);
        let mut rest = Vec::new();
        for (key, value) in pairs {
            match key.as_str() {
                "action" => action = Some(value),
                "target" => target = Some(value),
                "confirm" => {
                    confirm = Some(value.trim().parse().map_err(|_| "confirm: the number of events shown".to_string())?)
                }
                // The form's tokens, checked before.
                "token" | "csrf" => {}
                _ => rest.push((key, value)),
            }
        }
        let action = action.ok_or("action: retry, replay or discard")?;
        Ok(BulkAsk { action, target, confirm, request: ops::search_request(rest)? })
    }
}

/// What a bulk action came to.
enum BulkOutcome {
    /// Not confirmed with this count: nothing done.
    Count { sink: String, action: ops::Bulk, matching: usize },
    /// Done.
    Done { sink: String, action: ops::Bulk, matching: usize, changed: u64 },
}

fn bad_request(why: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": why.to_string() }))).into_response()
}

/// Selects what `ask` acts on, then acts when `ask.confirm` is that count.
async fn bulk_run(s: &AdminState, ask: &BulkAsk) -> Result<BulkOutcome, Response> {
    let (sink, rows) = ops::bulk_selection(s.store.clone(), &ask.request).await.map_err(|e| match e {
        ops::ReplayError::Store(e) => unavailable(e),
        other => (StatusCode::NOT_FOUND, Json(json!({ "error": other.to_string() }))).into_response(),
    })?;
    let action = ops::Bulk::parse(&ask.action, ask.target.clone(), &sink).map_err(bad_request)?;
    if rows.len() > ops::BULK_MAX {
        let error = format!("more than {} events match: narrow the search; nothing done", ops::BULK_MAX);
        return Err((StatusCode::CONFLICT, Json(json!({ "error": error, "sink": sink }))).into_response());
    }
    let matching = rows.len();
    if ask.confirm != Some(matching) {
        return Ok(BulkOutcome::Count { sink, action, matching });
    }
    let who = s.guard.token_id().unwrap_or_default();
    let changed = ops::bulk(s.store.clone(), &sink, &rows, &action, &who).await.map_err(|e| match e {
        ops::ReplayError::Store(e) => unavailable(e),
        other => (StatusCode::NOT_FOUND, Json(json!({ "error": other.to_string() }))).into_response(),
    })?;
    tracing::info!(
        who = %who,
        action = action.name(),
        sink = %sink,
        target = ?ask.target,
        matching,
        changed,
        search = ?ask.request.search,
        "operator bulk action"
    );
    forget_view(s).await;
    Ok(BulkOutcome::Done { sink, action, matching, changed })
}

async fn bulk_api(State(s): State<Arc<AdminState>>, headers: HeaderMap, RawQuery(query): RawQuery) -> Response {
    if let Err(refused) = s.guard.check_api(&headers) {
        return refused.into_response();
    }
    let ask = match BulkAsk::parse(query_pairs(query)) {
        Ok(ask) => ask,
        Err(why) => return bad_request(why),
    };
    match bulk_run(&s, &ask).await {
        Ok(BulkOutcome::Count { sink, action, matching }) => (
            StatusCode::CONFLICT,
            Json(json!({
                "error": format!("{matching} events match: send confirm={matching} to {} them", action.name()),
                "sink": sink,
                "action": action.name(),
                "matching": matching,
            })),
        )
            .into_response(),
        Ok(BulkOutcome::Done { sink, action, matching, changed }) => {
            Json(json!({ "sink": sink, "action": action.name(), "matching": matching, "changed": changed }))
                .into_response()
        }
        Err(response) => response,
    }
}

/// The search page's bulk form: first the count and a confirm button, then the action, then
/// the page of the sink it changed (post/redirect/get).
async fn bulk_form(
    State(s): State<Arc<AdminState>>,
    headers: HeaderMap,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let field = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    if let Err(refused) = s.guard.check_form(&headers, field("token"), field("csrf")) {
        return refused.into_response();
    }
    let ask = match BulkAsk::parse(pairs.clone()) {
        Ok(ask) => ask,
        Err(why) => return bad_request(why),
    };
    match bulk_run(&s, &ask).await {
        Ok(BulkOutcome::Count { sink, action, matching }) => {
            let kept: Vec<(String, String)> =
                pairs.into_iter().filter(|(k, _)| !["token", "csrf", "confirm"].contains(&k.as_str())).collect();
            let to = match &action {
                ops::Bulk::Replay { to } => to.clone(),
                _ => sink,
            };
            let csrf = s.guard.form_token();
            Html(console::search::confirm(&frame(&s, None), &kept, action.name(), &to, matching, &csrf)).into_response()
        }
        Ok(BulkOutcome::Done { sink, action, changed, .. }) => {
            let sink = match &action {
                ops::Bulk::Replay { to } => to.clone(),
                _ => sink,
            };
            let name = console::percent_encode(&sink);
            Redirect::to(&format!("/sinks/{name}?bulk={}&changed={changed}", action.name())).into_response()
        }
        Err(response) => response,
    }
}

async fn event_page(State(s): State<Arc<AdminState>>, Path(event_id): Path<String>) -> Response {
    match ops::story(s.store.clone(), &event_id).await {
        Ok(Some(story)) => Html(console::event::render(&frame(&s, None), &story)).into_response(),
        Ok(None) => not_found(format!("no event {event_id:?} in the outbox")),
        Err(e) => unavailable(e),
    }
}

async fn status_json(State(s): State<Arc<AdminState>>) -> Response {
    let view = match table_view(&s).await {
        Ok(view) => view,
        Err(e) => return unavailable(e),
    };
    let stats = &view.stats;
    let counts: serde_json::Map<String, serde_json::Value> =
        Status::ALL.iter().map(|st| (st.as_str().to_string(), json!(stats.count(*st)))).collect();
    Json(json!({
        "table": s.table,
        "counts": counts,
        "unknown_statuses": stats.unknown_statuses.iter().map(|(st, n)| json!({ "status": st, "count": n })).collect::<Vec<_>>(),
        "oldest_waiting_age_ms": stats.oldest_waiting_created_at_ms.map(|c| (now_ms() - c).max(0)),
        "delivered_last_minute": stats.delivered_last_minute,
        "top_errors": stats.top_errors.iter().map(|(e, n)| json!({ "error": e, "count": n })).collect::<Vec<_>>(),
        "db_failures_in_a_row": s.metrics.db_health().failures_in_a_row(),
        "breaker": breaker_json(&s.metrics.breaker()),
        "brokers": s.metrics.brokers().into_iter().map(|(name, b)| json!({
            "name": name,
            "kind": b.kind,
            "up": b.up,
            "for_ms": (now_ms() - b.since_ms).max(0),
            "error": b.error,
        })).collect::<Vec<_>>(),
        "sinks": view.sinks.as_deref().map_or(serde_json::Value::Null, |sinks| sinks_json(&s, sinks)),
        "last_db_error": s.metrics.db_health().last_failure().map(|f| json!({
            "operation": f.operation,
            "error": f.error,
            "age_ms": (now_ms() - f.at_ms).max(0),
        })),
    }))
    .into_response()
}

/// Every registered sink's counts and state for `/api/status`.
fn sinks_json(s: &AdminState, sinks: &[crate::ops::SinkSummary]) -> serde_json::Value {
    let now = now_ms();
    sinks
        .iter()
        .map(|sink| {
            let line = sink_line(s, sink);
            let counts: serde_json::Map<String, serde_json::Value> =
                Status::ALL.iter().map(|st| (st.as_str().to_string(), json!(sink.stats.count(*st)))).collect();
            json!({
                "name": sink.name,
                "table": sink.table,
                "counts": counts,
                "oldest_waiting_age_ms": sink.stats.oldest_waiting_created_at_ms.map(|c| (now - c).max(0)),
                "delivered_last_minute": sink.stats.delivered_last_minute,
                "owners": sink.owners,
                "state": line.state(),
                "breaker": line.breaker.as_ref().map(breaker_json),
                "brokers": line.brokers.iter().map(|(name, _)| name).collect::<Vec<_>>(),
                "misconfigured": line.misconfigured,
                "top_errors": sink.stats.top_errors.iter().map(|(e, n)| json!({ "error": e, "count": n })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// The sink's circuit breaker for `/api/status`.
fn breaker_json(b: &crate::ops::metrics::BreakerReport) -> serde_json::Value {
    let now = now_ms();
    json!({
        "state": b.state.as_str(),
        "for_ms": (b.since_ms > 0).then(|| (now - b.since_ms).max(0)),
        "reason": b.reason,
        "next_probe_in_ms": b.next_probe_at_ms.map(|at| (at - now).max(0)),
    })
}

async fn show_event(State(s): State<Arc<AdminState>>, Path(event_id): Path<String>) -> Response {
    match s.store.get(&event_id).await {
        Ok(Some(row)) => match ops::describe_everywhere(s.store.clone(), &row).await {
            Ok(described) => Json(described).into_response(),
            Err(e) => unavailable(e),
        },
        Ok(None) => (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no event {event_id}") }))).into_response(),
        Err(e) => unavailable(e),
    }
}

/// Which failed rows to retry: exactly one of these (and, from the page's form, its tokens).
#[derive(Deserialize)]
struct RetryParams {
    token: Option<String>,
    csrf: Option<String>,
    event_id: Option<String>,
    event_type: Option<String>,
    error: Option<String>,
    error_is: Option<String>,
    #[serde(default)]
    all: bool,
    /// The sink whose failed rows (default: the first's, the outbox's own).
    sink: Option<String>,
}

async fn retry_rows(s: &AdminState, p: RetryParams) -> Result<u64, Response> {
    let filter = ops::retry_filter(p.event_id, p.event_type, p.error, p.error_is, p.all)
        .map_err(|why| (StatusCode::BAD_REQUEST, Json(json!({ "error": why }))).into_response())?;
    let store = match p.sink.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => ops::sink_state(s.store.clone(), name).await.map_err(|e| match e {
            ops::ReplayError::UnknownSink { .. } => {
                (StatusCode::NOT_FOUND, Json(json!({ "error": e.to_string() }))).into_response()
            }
            other => unavailable(other),
        })?,
        None => s.store.clone(),
    };
    let moved = ops::retry(store.as_ref(), &filter).await.map_err(unavailable)?;
    tracing::info!(moved, ?filter, "operator retry over HTTP");
    forget_view(s).await;
    Ok(moved)
}

async fn retry_api(State(s): State<Arc<AdminState>>, headers: HeaderMap, Query(p): Query<RetryParams>) -> Response {
    if let Err(refused) = s.guard.check_api(&headers) {
        return refused.into_response();
    }
    match retry_rows(&s, p).await {
        Ok(moved) => Json(json!({ "moved": moved })).into_response(),
        Err(response) => response,
    }
}

/// The status page's buttons: act, then show the page again (post/redirect/get).
async fn retry_form(State(s): State<Arc<AdminState>>, headers: HeaderMap, Form(p): Form<RetryParams>) -> Response {
    if let Err(refused) = s.guard.check_form(&headers, p.token.as_deref(), p.csrf.as_deref()) {
        return refused.into_response();
    }
    let back = match p.sink.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => format!("/sinks/{}", console::percent_encode(name)),
        None => "/".to_string(),
    };
    match retry_rows(&s, p).await {
        Ok(moved) => Redirect::to(&format!("{back}?moved={moved}")).into_response(),
        Err(response) => response,
    }
}

/// Which events to deliver again to one sink (and, from the page's form, its tokens).
#[derive(Deserialize)]
struct ReplayParams {
    token: Option<String>,
    csrf: Option<String>,
    sink: Option<String>,
    from: String,
    to: Option<String>,
    event_type: Option<String>,
    room: Option<String>,
    /// The most events this replay may deliver again: required, so that a replay over HTTP
    /// never moves more than its caller expected.
    limit: Option<u64>,
}

async fn replay_rows(s: &AdminState, sink: &str, p: ReplayParams) -> Result<u64, Response> {
    let refused = |e: ops::ReplayError| {
        let status = match &e {
            ops::ReplayError::UnknownSink { .. } => StatusCode::NOT_FOUND,
            ops::ReplayError::BadRange(_) => StatusCode::BAD_REQUEST,
            ops::ReplayError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, Json(json!({ "error": e.to_string() }))).into_response()
    };
    let filter = ops::replay_filter(&p.from, p.to.as_deref(), p.event_type, p.room).map_err(refused)?;
    let matching = ops::count_replay(s.store.clone(), sink, &filter).await.map_err(refused)?;
    let over = |status: StatusCode, error: String| {
        (status, Json(json!({ "error": error, "sink": sink, "matching": matching }))).into_response()
    };
    match p.limit {
        None => {
            return Err(over(
                StatusCode::BAD_REQUEST,
                format!("limit is required: the most events to deliver again ({matching} match)"),
            ));
        }
        Some(limit) if matching > limit => {
            return Err(over(
                StatusCode::CONFLICT,
                format!("{matching} events match, more than the limit of {limit}: nothing replayed"),
            ));
        }
        Some(_) => {}
    }
    let replayed = ops::replay(s.store.clone(), sink, &filter).await.map_err(refused)?;
    tracing::info!(sink, replayed, "operator replay over HTTP");
    forget_view(s).await;
    Ok(replayed)
}

async fn replay_api(
    State(s): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(p): Query<ReplayParams>,
) -> Response {
    if let Err(refused) = s.guard.check_api(&headers) {
        return refused.into_response();
    }
    match replay_rows(&s, &name, p).await {
        Ok(replayed) => Json(json!({ "sink": name, "replayed": replayed })).into_response(),
        Err(response) => response,
    }
}

/// The page's replay form: act, then show the page again.
async fn replay_form(State(s): State<Arc<AdminState>>, headers: HeaderMap, Form(p): Form<ReplayParams>) -> Response {
    if let Err(refused) = s.guard.check_form(&headers, p.token.as_deref(), p.csrf.as_deref()) {
        return refused.into_response();
    }
    let sink = p.sink.clone().unwrap_or_default();
    match replay_rows(&s, &sink, p).await {
        Ok(replayed) => {
            let name = console::percent_encode(&sink);
            Redirect::to(&format!("/sinks/{name}?replayed={replayed}&sink={name}")).into_response()
        }
        Err(response) => response,
    }
}

/// Compiles and checks the sink's plugin file anew and swaps it in if it is a new build.
async fn reload_api(State(s): State<Arc<AdminState>>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    use crate::ops::{ReloadError, Reloaded};
    if let Err(refused) = s.guard.check_api(&headers) {
        return refused.into_response();
    }
    match s.reloader.reload(&name, "admin API").await {
        Ok(Reloaded::Swapped { from, to }) => {
            Json(json!({ "sink": name, "reloaded": true, "from": from.as_deref(), "plugin_digest": &*to }))
                .into_response()
        }
        Ok(Reloaded::Unchanged(digest)) => {
            Json(json!({ "sink": name, "reloaded": false, "plugin_digest": &*digest })).into_response()
        }
        Err(e @ ReloadError::UnknownSink(_)) => {
            (StatusCode::NOT_FOUND, Json(json!({ "error": e.to_string() }))).into_response()
        }
        Err(ReloadError::Refused(why)) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({ "error": format!("the new build was refused; the old one keeps delivering: {why}") })),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct PurgeParams {
    delivered_before: String,
}

async fn purge_api(State(s): State<Arc<AdminState>>, headers: HeaderMap, Query(p): Query<PurgeParams>) -> Response {
    if let Err(refused) = s.guard.check_api(&headers) {
        return refused.into_response();
    }
    let age = match crate::units::parse_duration_ms(&p.delivered_before) {
        Ok(ms) if ms > 0 => ms,
        Ok(_) => {
            return (StatusCode::BAD_REQUEST, Json(json!({ "error": "delivered_before must be positive" })))
                .into_response();
        }
        Err(why) => return (StatusCode::BAD_REQUEST, Json(json!({ "error": why }))).into_response(),
    };
    match ops::purge(s.store.as_ref(), now_ms() - age, ops::PURGE_BATCH).await {
        Ok(deleted) => {
            tracing::info!(deleted, delivered_before = %p.delivered_before, "operator purge over HTTP");
            forget_view(&s).await;
            Json(json!({ "deleted": deleted, "tables": { s.store.table(): deleted } })).into_response()
        }
        Err(e) => unavailable(e),
    }
}
