//! What tracing costs the WASM drain: the same drain with tracing off and on (every attempt
//! sampled, its span exported over OTLP/HTTP to a receiver in the benchmark), `--relay-rounds`
//! times each, which goes first alternating; the medians and their ratio. Every row carries
//! a producer's trace context, as room-service writes them.
//!
//! The receiver only reads each request and answers: decoding the spans is a collector's
//! work, on its own machine, and would be counted against the host here.
//!
//! Beside the ratio, where it goes: the host's processor time per event in each drain, and
//! the spans alone (made, ended, queued, encoded and sent with no drain around them), per span.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::ensure;
use outbox_host::ops::traces::{self, TracingConfig};
use outbox_host::store::Backend;
use serde_json::json;

use crate::db::{self, Db};
use crate::{Report, Setup, row};

/// A collector stand-in that counts what it is sent.
struct Sink {
    addr: SocketAddr,
    bytes: Arc<AtomicU64>,
}

impl Sink {
    async fn start() -> anyhow::Result<Sink> {
        let bytes = Arc::new(AtomicU64::new(0));
        let counted = bytes.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                counted.fetch_add(body.len() as u64, Ordering::Relaxed);
                // An empty body is an ExportTraceServiceResponse with nothing to say.
                async { ([("content-type", "application/x-protobuf")], Vec::<u8>::new()) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Sink { addr, bytes })
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The WASM drain of `args.events` with tracing off and on, alternating.
pub(crate) async fn tracing_cost(r: &mut Report, backend: Backend, setup: Setup<'_>) -> anyhow::Result<()> {
    let (table, results, name) = (&mut r.table, &mut r.results, db::name(backend));
    let Setup { args, config, wasm } = setup;
    let sink = Sink::start().await?;
    let tracing = TracingConfig {
        enabled: true,
        endpoint: Some(format!("http://{}", sink.addr)),
        service_name: Some("outbox-bench".into()),
        ..TracingConfig::default()
    };
    let rounds = args.relay_rounds.max(1);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    // Host processor µs per event, off and on.
    let (mut off_cpu, mut on_cpu) = (Vec::new(), Vec::new());
    let (mut exported, mut dropped, mut failed) = (0, 0, 0);
    for round in 1..=rounds {
        // Which goes first alternates: a drain runs a little slower after another (the
        // server still writes out the last one's rows), which would otherwise count against one side.
        let order = if round % 2 == 1 { [false, true] } else { [true, false] };
        eprintln!("{name}: tracing off and on, round {round} of {rounds}, {} events each …", args.events);
        for traced in order {
            if !traced {
                let drained = drain_traced(backend, args.events, config, wasm.clone()).await?;
                off_cpu.push(host_micros_per_event(&drained));
                off.push(drained.per_second());
                continue;
            }
            let before = traces::span_counts();
            let exporting = traces::start(&tracing)?.expect("tracing is enabled");
            let drained = drain_traced(backend, args.events, config, wasm.clone()).await;
            exporting.shutdown().await;
            let drained = drained?;
            on_cpu.push(host_micros_per_event(&drained));
            on.push(drained.per_second());
            let after = traces::span_counts();
            let delta = |i: usize| after[i].1 - before[i].1;
            exported += delta(0);
            dropped += delta(1);
            failed += delta(2);
        }
    }
    let spans = (args.events * rounds) as u64;
    ensure!(exported + dropped + failed == spans, "{spans} attempts made {exported} + {dropped} + {failed} spans");
    let (off, on) = (median(off), median(on));
    let (off_cpu, on_cpu) = (median(off_cpu), median(on_cpu));
    let ratio = on / off;
    let bytes = sink.bytes.load(Ordering::Relaxed) as f64 / exported.max(1) as f64;
    // Five times the drain's count: the processor's clock ticks 100 times a second.
    let alone_spans = args.events * 5;
    let (alone_seconds, alone) = spans_alone(&tracing, alone_spans).await?;
    row(
        table,
        name,
        "drain, WASM no-op sink, tracing off",
        args.events,
        args.events as f64 / off,
        format!("median of {rounds}"),
    );
    row(
        table,
        name,
        "drain, WASM no-op sink, tracing on",
        args.events,
        args.events as f64 / on,
        format!(
            "{ratio:.2}× off; median of {rounds}; every attempt sampled: {exported} spans exported, {dropped} dropped \
             (queue full), {failed} failed; {bytes:.0} OTLP bytes per span; host CPU {on_cpu:.1} µs per \
             event against {off_cpu:.1} off"
        ),
    );
    row(
        table,
        name,
        "spans alone: made, ended, queued, exported",
        alone_spans,
        alone_seconds,
        format!("{alone:.2} µs of host CPU per span, no drain around them"),
    );
    results.push(json!({
        "backend": name,
        "tracing": { "events": args.events, "rounds": rounds, "off_per_s": off, "on_per_s": on, "ratio_on_over_off": ratio,
                     "spans_exported": exported, "spans_dropped": dropped, "spans_failed": failed,
                     "otlp_bytes_per_span": bytes, "host_cpu_us_per_event_off": off_cpu,
                     "host_cpu_us_per_event_on": on_cpu, "host_cpu_us_per_span_alone": alone },
    }));
    Ok(())
}

/// A drain of `n` events on a fresh database, each written with a producer's trace context
/// (its own trace), as room-service writes them.
async fn drain_traced(
    backend: Backend,
    n: usize,
    config: &outbox_host::config::WorkerConfig,
    sink: std::sync::Arc<dyn outbox_host::sandbox::Deliver>,
) -> anyhow::Result<crate::Drain> {
    let db = Db::fresh(backend).await?;
    let producer = db.open().await?;
    let mut events = crate::events("bench", n, 1_000);
    for (i, event) in events.iter_mut().enumerate() {
        event.trace_context = Some(format!("00-{:032x}-{:016x}-01", i + 1, i + 1));
    }
    crate::insert_all(producer.as_ref(), &events).await?;
    crate::drain_filled(&db, producer, n, 1, config, sink).await
}

/// The host's processor µs per event of one drain.
fn host_micros_per_event(drained: &crate::Drain) -> f64 {
    drained.cores.host / drained.per_second() * 1e6
}

/// The host processor µs one attempt's span costs with no drain around it: `n` spans made
/// as an attempt makes them (a child of a producer's context), ended, queued and exported
/// to the bench's receiver; measured from start to the last export. The wall seconds, and
/// the µs per span. The queue holds them all: a span dropped on a full queue would cost
/// less than one exported, and every one is checked exported.
async fn spans_alone(tracing: &TracingConfig, n: usize) -> anyhow::Result<(f64, f64)> {
    use outbox_host::ops::traces::{AttemptInfo, Messaging};
    let counts = traces::span_counts();
    // Time for the whole queue to go out at shutdown.
    let all = TracingConfig { queue_size: n, export_timeout: Some(Duration::from_secs(300)), ..tracing.clone() };
    let exporting = traces::start(&all)?.expect("tracing is enabled");
    let messaging = Messaging { operation: "deliver", system: "outbox-host", destination: "bench" };
    let before = crate::cpu::host_seconds();
    let started = std::time::Instant::now();
    for i in 0..n {
        let event_id = format!("bench-{i}");
        let info = AttemptInfo {
            trace_context: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            event_id: &event_id,
            event_type: "RoomGiftSent",
            room_id: "room-1",
            attempt: 1,
            waited_ms: 3,
        };
        let span = traces::start_attempt(messaging, &info).expect("tracing is on");
        span.scope(std::future::ready(())).await;
        span.end("delivered", None);
        if i % 256 == 0 {
            // As a drain would, give the export task its turn.
            tokio::task::yield_now().await;
        }
    }
    exporting.shutdown().await;
    let used = crate::cpu::host_seconds() - before;
    let exported = traces::span_counts()[0].1 - counts[0].1;
    ensure!(exported == n as u64, "{n} spans alone made, {exported} exported");
    Ok((started.elapsed().as_secs_f64(), used * 1e6 / n as f64))
}
