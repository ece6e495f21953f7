//! What tracing costs the WASM drain: the same drain with tracing off and on (every attempt
//! sampled, its span exported over OTLP/HTTP to a receiver in the benchmark), `--relay-rounds`
//! times each, which goes first alternating; the medians and their ratio.
//!
//! The receiver only reads each request and answers: decoding the spans is a collector's
//! work, on its own machine, and would be counted against the host here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::ensure;
use outbox_host::ops::traces::{self, TracingConfig};
use outbox_host::store::Backend;
use serde_json::json;

use crate::db::{self, Db};
use crate::{Report, Setup, drain, row};

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
    let (mut exported, mut dropped, mut failed) = (0, 0, 0);
    for round in 1..=rounds {
        // Which goes first alternates: a drain runs a little slower after another (the
        // server still writes out the last one's rows), which would otherwise count against one side.
        let order = if round % 2 == 1 { [false, true] } else { [true, false] };
        eprintln!("{name}: tracing off and on, round {round} of {rounds}, {} events each …", args.events);
        for traced in order {
            if !traced {
                off.push(drain(&Db::fresh(backend).await?, args.events, 1, config, wasm.clone()).await?.per_second());
                continue;
            }
            let before = traces::span_counts();
            let exporting = traces::start(&tracing)?.expect("tracing is enabled");
            let drained = drain(&Db::fresh(backend).await?, args.events, 1, config, wasm.clone()).await;
            exporting.shutdown().await;
            on.push(drained?.per_second());
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
    let ratio = on / off;
    let bytes = sink.bytes.load(Ordering::Relaxed) as f64 / exported.max(1) as f64;
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
             (queue full), {failed} failed; {bytes:.0} OTLP bytes per span"
        ),
    );
    results.push(json!({
        "backend": name,
        "tracing": { "events": args.events, "rounds": rounds, "off_per_s": off, "on_per_s": on, "ratio_on_over_off": ratio,
                     "spans_exported": exported, "spans_dropped": dropped, "spans_failed": failed,
                     "otlp_bytes_per_span": bytes },
    }));
    Ok(())
}
