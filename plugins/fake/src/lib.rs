//! A scripted sink for tests and demos. What it does with an event comes from its config:
//!
//! - `room.<room_id>`, else `type.<event_type>`, else `default` (else `ok`) names a behaviour:
//!   `ok`, `skip`, `retryable`, `permanent`, `fail-then-ok:N` (retryable while the attempt is
//!   at most N), `retry-after:MS` (retryable with that hint), `trap`, `loop`, `oom`,
//!   `sleep:MS` (then ok), `http:URL` (GET through the host; ok on 2xx), `log` (log a line, ok),
//!   `remember` (skipped, saying how many deliveries this instance's static counter and heap
//!   have seen: 1 in a fresh instance), `push-back:PRESSURE[:MS]` (`flow.push-back` with
//!   `room-throttled`, `throttled` or `unavailable`, then retryable with that hint),
//!   `push-back-delivered:PRESSURE` (pushes back, then delivered: the host ignores it),
//!   `leak:KEY` (a careless sink: logs the value of its config key KEY and posts it in a
//!   request body to `collector`, then delivered), `leak-fail:KEY` (logs the value of config
//!   key KEY, then fails retryable with it in the message), `trace:URL` (POSTs
//!   `{"traceparent": …}`, the attempt's trace context from the host, then ok on 2xx).
//! - Hostile ones, for the host's hardening tests: `log-flood` (log without end),
//!   `log-flood:N` (N lines, then ok), `log-big:BYTES` (one huge line, ok), `log-forge` (a line
//!   with a newline, ESC, NUL and U+202E, ok), `print:BYTES` (that much to stdout, ok),
//!   `skip-big:BYTES` (skipped with a huge reason), `fail-forge` (retryable, with control
//!   characters in the message), `http-many:N:URL` (N GETs), `http-post:BYTES:URL` (one POST
//!   of that size), `http-headers:URL` (a GET that tries to set `Host`, `Connection` and
//!   `Proxy-Authorization`).
//! - `check.problems`: `|`-separated lines that `check-config` reports verbatim.
//! - `collector`: a URL; every attempt is reported to it as a line
//!   `<event_id> <attempt> <behaviour>` before the outcome is returned, so a test can count
//!   exactly what the sink received.

use outbox_sink::http::{self, Request, Response};
use outbox_sink::{Config, Delivery, Event, Failure, Outcome, Pressure, Sink, config, log};

/// The behaviours `run` knows.
const BEHAVIOURS: &[&str] = &[
    "ok",
    "skip",
    "retryable",
    "permanent",
    "fail-then-ok",
    "retry-after",
    "trap",
    "loop",
    "oom",
    "sleep",
    "http",
    "log",
    "remember",
    "push-back",
    "push-back-delivered",
    "leak",
    "leak-fail",
    "log-flood",
    "log-big",
    "log-forge",
    "print",
    "skip-big",
    "fail-forge",
    "http-many",
    "http-post",
    "http-headers",
    "trace",
];

/// Text that would forge a log line, drive a terminal and reverse what is shown.
const FORGERY: &str =
    "ok\n2026-01-01T00:00:00.000000Z  INFO deliver{event_id=FORGED}: event delivered\u{1b}[2J\0\u{202E}";

struct FakeSink;

impl Sink for FakeSink {
    fn configure(config: &mut Config) -> Self {
        if let Some(behaviour) = config.get("default") {
            let name = behaviour.split(':').next().unwrap_or_default();
            config.check("default", BEHAVIOURS.contains(&name), format!("unknown behaviour {behaviour:?}"));
        }
        for line in config.get("check.problems").unwrap_or_default().split('|').filter(|l| !l.is_empty()) {
            let (key, message) = line.split_once(": ").unwrap_or((line, "is wrong"));
            config.problem(key, message);
        }
        FakeSink
    }

    fn deliver(&self, event: &Event) -> Delivery {
        let behaviour = config::get(&format!("room.{}", event.room_id))
            .or_else(|| config::get(&format!("type.{}", event.event_type)))
            .or_else(|| config::get("default"))
            .unwrap_or_else(|| "ok".to_string());
        if let Some(collector) = config::get("collector") {
            let line = format!("{} {} {}\n", event.event_id, event.attempt, behaviour);
            let request = Request::post(&collector).header("content-type", "text/plain").body(line);
            success(request.send()).map_err(|e| Failure::retryable(format!("collector unreachable: {e}")))?;
        }
        run(&behaviour, event)
    }
}

outbox_sink::export!(FakeSink);

fn run(behaviour: &str, event: &Event) -> Delivery {
    let (name, arg) = behaviour.split_once(':').unwrap_or((behaviour, ""));
    match name {
        "ok" => Ok(Outcome::Delivered),
        "skip" => Ok(Outcome::Skipped(format!("fake sink does not carry {}", event.event_type))),
        "retryable" => Err(Failure::retryable("fake: scripted retryable failure")),
        "permanent" => Err(Failure::permanent("fake: scripted permanent failure")),
        "fail-then-ok" => {
            let failures: u32 = arg.parse().unwrap_or(1);
            if event.attempt <= failures {
                Err(Failure::retryable(format!("fake: failing attempt {} of {failures}", event.attempt)))
            } else {
                Ok(Outcome::Delivered)
            }
        }
        "retry-after" => Err(hinted(Failure::retryable("fake: asked to wait"), arg.parse().ok())),
        "trap" => panic!("fake: scripted trap"),
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "oom" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        "sleep" => {
            std::thread::sleep(std::time::Duration::from_millis(arg.parse().unwrap_or(1_000)));
            Ok(Outcome::Delivered)
        }
        "http" => checked("http", Request::get(arg).send()),
        "push-back" => {
            let (pressure, hint) = arg.split_once(':').map_or((arg, None), |(p, ms)| (p, ms.parse().ok()));
            let failure =
                Failure::retryable(format!("fake: pushed back ({pressure})")).pressure(pressure_named(pressure));
            Err(hinted(failure, hint))
        }
        "push-back-delivered" => {
            // Pushes back, then succeeds: the host ignores a push-back that came with success.
            outbox_sink::push_back(pressure_named(arg));
            Ok(Outcome::Delivered)
        }
        "remember" => {
            // A counter in the data segment and a list on the heap: both start empty in a
            // fresh instance, so anything above 1 means state crossed deliveries.
            static SEEN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            static HEAP: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
            let seen = SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let mut heap = HEAP.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            heap.push(event.event_id.clone());
            Ok(Outcome::Skipped(format!("seen {seen}, heap {}", heap.len())))
        }
        "log" => {
            log::info(&format!("fake sink got {} for room {}", event.event_type, event.room_id));
            Ok(Outcome::Delivered)
        }
        "leak" => {
            let value = config::get(arg).unwrap_or_default();
            log::info(&format!("config {arg} is {value}"));
            if let Some(collector) = config::get("collector") {
                let _ = Request::post(&collector).body(format!("{arg}={value}")).send();
            }
            Ok(Outcome::Delivered)
        }
        "leak-fail" => {
            let value = config::get(arg).unwrap_or_default();
            log::warn(&format!("config {arg} is {value}"));
            Err(Failure::retryable(format!("fake: rejected with {arg}={value}")))
        }
        "log-flood" => {
            for i in 0..arg.parse::<u64>().unwrap_or(u64::MAX) {
                log::info(&format!("flood line {i}"));
            }
            Ok(Outcome::Delivered)
        }
        "log-big" => {
            log::warn(&"x".repeat(arg.parse().unwrap_or(1 << 20)));
            Ok(Outcome::Delivered)
        }
        "log-forge" => {
            log::info(FORGERY);
            Ok(Outcome::Delivered)
        }
        "print" => {
            let line = "p".repeat(99);
            for _ in 0..arg.parse::<usize>().unwrap_or(100 << 10) / 100 {
                println!("{line}");
            }
            Ok(Outcome::Delivered)
        }
        "skip-big" => Ok(Outcome::Skipped("s".repeat(arg.parse().unwrap_or(10 << 20)))),
        "fail-forge" => Err(Failure::retryable(FORGERY)),
        "http-many" => {
            let (count, url) = arg.split_once(':').unwrap_or(("1", arg));
            for i in 0..count.parse::<u32>().unwrap_or(1) {
                success(Request::get(url).send())
                    .map_err(|e| Failure::retryable(format!("http-many: request {} failed: {e}", i + 1)))?;
            }
            Ok(Outcome::Delivered)
        }
        "http-post" => {
            let (size, url) = arg.split_once(':').unwrap_or(("0", arg));
            checked("http-post", Request::post(url).body(vec![b'b'; size.parse().unwrap_or(0)]).send())
        }
        "http-headers" => {
            let request = Request::get(arg)
                .header("Host", "evil.example")
                .header("Connection", "upgrade")
                .header("Proxy-Authorization", "Basic c2VjcmV0")
                .header("X-Sink", "fake");
            success(request.send()).map_err(|e| Failure::retryable(format!("http-headers: {e}")))?;
            Ok(Outcome::Delivered)
        }
        "trace" => {
            // Posts the attempt's trace context as the host hands it to a sink.
            let context = outbox_sink::serde_json::json!({ "traceparent": outbox_sink::traceparent() });
            checked("trace", Request::post(arg).json(&context).send())
        }
        other => Err(Failure::permanent(format!("fake: unknown behaviour {other:?}"))),
    }
}

fn hinted(failure: Failure, retry_after_ms: Option<u64>) -> Failure {
    match retry_after_ms {
        Some(ms) => failure.after_ms(ms),
        None => failure,
    }
}

/// Delivered on 2xx; otherwise retryable, saying why after `what`.
fn checked(what: &str, reply: Result<Response, http::HttpError>) -> Delivery {
    success(reply).map(|()| Outcome::Delivered).map_err(|e| Failure::retryable(format!("{what}: {e}")))
}

fn success(reply: Result<Response, http::HttpError>) -> Result<(), String> {
    match reply {
        Ok(response) if response.is_success() => Ok(()),
        Ok(response) => Err(format!("status {}", response.status)),
        Err(e) => Err(e.to_string()),
    }
}

/// The pressure a config value names (`unavailable` for anything else).
fn pressure_named(name: &str) -> Pressure {
    match name {
        "room-throttled" => Pressure::RoomThrottled,
        "throttled" => Pressure::Throttled,
        _ => Pressure::Unavailable,
    }
}
