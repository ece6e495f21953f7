//! A scripted sink for tests and demos. What it does with an event comes from its config:
//!
//! - `room.<room_id>`, else `type.<event_type>`, else `default` (else `ok`) names a behaviour:
//!   `ok`, `skip`, `retryable`, `permanent`, `fail-then-ok:N` (retryable while the attempt is
//!   at most N), `retry-after:MS` (retryable with that hint), `trap`, `loop`, `oom`,
//!   `sleep:MS` (then ok), `http:URL` (GET through the host; ok on 2xx), `log` (log a line, ok),
//!   `remember` (skipped, saying how many deliveries this instance's static counter and heap
//!   have seen: 1 in a fresh instance), `push-back:PRESSURE[:MS]` (`flow.push-back` with
//!   `room-throttled`, `throttled` or `unavailable`, then retryable with that hint),
//!   `push-back-delivered:PRESSURE` (pushes back, then delivered: the host ignores it).
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

mod bindings {
    #![allow(missing_docs, clippy::too_many_arguments)] // generated from wit/sink.wit
    wit_bindgen::generate!({ path: "../../wit", world: "sink" });
}

use bindings::outbox::sink::config;
use bindings::outbox::sink::flow::{self, Pressure};
use bindings::outbox::sink::http::{self, HttpError, Request};
use bindings::outbox::sink::log::{self, Level};
use bindings::outbox::sink::types::FailureKind;
use bindings::{Event, Failure, Guest, Outcome};

struct FakeSink;

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
    "log-flood",
    "log-big",
    "log-forge",
    "print",
    "skip-big",
    "fail-forge",
    "http-many",
    "http-post",
    "http-headers",
];

/// Text that would forge a log line, drive a terminal and reverse what is shown.
const FORGERY: &str =
    "ok\n2026-01-01T00:00:00.000000Z  INFO deliver{event_id=FORGED}: event delivered\u{1b}[2J\0\u{202E}";

impl Guest for FakeSink {
    fn check_config() -> Vec<String> {
        let mut problems = Vec::new();
        for key in ["default"] {
            if let Some(behaviour) = config::get(key) {
                let name = behaviour.split(':').next().unwrap_or_default();
                if !BEHAVIOURS.contains(&name) {
                    problems.push(format!("sink.config.{key}: unknown behaviour {behaviour:?}"));
                }
            }
        }
        if let Some(scripted) = config::get("check.problems") {
            problems.extend(scripted.split('|').map(str::to_string));
        }
        problems
    }

    fn deliver(event: Event) -> Result<Outcome, Failure> {
        let behaviour = config::get(&format!("room.{}", event.room_id))
            .or_else(|| config::get(&format!("type.{}", event.event_type)))
            .or_else(|| config::get("default"))
            .unwrap_or_else(|| "ok".to_string());
        if let Some(collector) = config::get("collector") {
            let line = format!("{} {} {}\n", event.event_id, event.attempt, behaviour);
            post(&collector, line.into_bytes()).map_err(|e| retryable(format!("collector unreachable: {e}"), None))?;
        }
        run(&behaviour, &event)
    }
}

fn run(behaviour: &str, event: &Event) -> Result<Outcome, Failure> {
    let (name, arg) = behaviour.split_once(':').unwrap_or((behaviour, ""));
    match name {
        "ok" => Ok(Outcome::Delivered),
        "skip" => Ok(Outcome::Skipped(format!("fake sink does not carry {}", event.event_type))),
        "retryable" => Err(retryable("fake: scripted retryable failure".into(), None)),
        "permanent" => Err(Failure {
            kind: FailureKind::Permanent,
            message: "fake: scripted permanent failure".into(),
            retry_after_ms: None,
        }),
        "fail-then-ok" => {
            let failures: u32 = arg.parse().unwrap_or(1);
            if event.attempt <= failures {
                Err(retryable(format!("fake: failing attempt {} of {failures}", event.attempt), None))
            } else {
                Ok(Outcome::Delivered)
            }
        }
        "retry-after" => Err(retryable("fake: asked to wait".into(), arg.parse().ok())),
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
        "http" => match http::send(&Request { method: "GET".into(), url: arg.into(), headers: vec![], body: vec![] }) {
            Ok(resp) if (200..300).contains(&resp.status) => Ok(Outcome::Delivered),
            Ok(resp) => Err(retryable(format!("http: status {}", resp.status), None)),
            Err(e) => Err(retryable(format!("http: {}", describe(&e)), None)),
        },
        "push-back" => {
            let (pressure, hint) = arg.split_once(':').map_or((arg, None), |(p, ms)| (p, ms.parse().ok()));
            flow::push_back(pressure_named(pressure));
            Err(retryable(format!("fake: pushed back ({pressure})"), hint))
        }
        "push-back-delivered" => {
            flow::push_back(pressure_named(arg));
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
            log::log(Level::Info, &format!("fake sink got {} for room {}", event.event_type, event.room_id));
            Ok(Outcome::Delivered)
        }
        "log-flood" => {
            let lines: u64 = arg.parse().unwrap_or(u64::MAX);
            for i in 0..lines {
                log::log(Level::Info, &format!("flood line {i}"));
            }
            Ok(Outcome::Delivered)
        }
        "log-big" => {
            log::log(Level::Warn, &"x".repeat(arg.parse().unwrap_or(1 << 20)));
            Ok(Outcome::Delivered)
        }
        "log-forge" => {
            log::log(Level::Info, FORGERY);
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
        "fail-forge" => Err(retryable(FORGERY.into(), None)),
        "http-many" => {
            let (count, url) = arg.split_once(':').unwrap_or(("1", arg));
            for i in 0..count.parse::<u32>().unwrap_or(1) {
                get(url, vec![]).map_err(|e| retryable(format!("http-many: request {} failed: {e}", i + 1), None))?;
            }
            Ok(Outcome::Delivered)
        }
        "http-post" => {
            let (size, url) = arg.split_once(':').unwrap_or(("0", arg));
            let body = vec![b'b'; size.parse().unwrap_or(0)];
            let request = Request { method: "POST".into(), url: url.into(), headers: vec![], body };
            match http::send(&request) {
                Ok(resp) if (200..300).contains(&resp.status) => Ok(Outcome::Delivered),
                Ok(resp) => Err(retryable(format!("http-post: status {}", resp.status), None)),
                Err(e) => Err(retryable(format!("http-post: {}", describe(&e)), None)),
            }
        }
        "http-headers" => {
            let headers = vec![
                ("Host".into(), "evil.example".into()),
                ("Connection".into(), "upgrade".into()),
                ("Proxy-Authorization".into(), "Basic c2VjcmV0".into()),
                ("X-Sink".into(), "fake".into()),
            ];
            get(arg, headers).map_err(|e| retryable(format!("http-headers: {e}"), None))?;
            Ok(Outcome::Delivered)
        }
        other => Err(Failure {
            kind: FailureKind::Permanent,
            message: format!("fake: unknown behaviour {other:?}"),
            retry_after_ms: None,
        }),
    }
}

fn retryable(message: String, retry_after_ms: Option<u64>) -> Failure {
    Failure { kind: FailureKind::Retryable, message, retry_after_ms }
}

fn get(url: &str, headers: Vec<(String, String)>) -> Result<(), String> {
    match http::send(&Request { method: "GET".into(), url: url.into(), headers, body: vec![] }) {
        Ok(resp) if (200..300).contains(&resp.status) => Ok(()),
        Ok(resp) => Err(format!("status {}", resp.status)),
        Err(e) => Err(describe(&e)),
    }
}

fn post(url: &str, body: Vec<u8>) -> Result<(), String> {
    let request = Request {
        method: "POST".into(),
        url: url.into(),
        headers: vec![("content-type".into(), "text/plain".into())],
        body,
    };
    match http::send(&request) {
        Ok(resp) if (200..300).contains(&resp.status) => Ok(()),
        Ok(resp) => Err(format!("status {}", resp.status)),
        Err(e) => Err(describe(&e)),
    }
}

fn describe(e: &HttpError) -> String {
    match e {
        HttpError::Denied(why) => format!("denied: {why}"),
        HttpError::InvalidRequest(why) => format!("invalid request: {why}"),
        HttpError::Transport(why) => format!("transport: {why}"),
        HttpError::Timeout => "timeout".into(),
        HttpError::TooLarge(limit) => format!("response larger than {limit} bytes"),
    }
}

bindings::export!(FakeSink with_types_in bindings);

/// The `flow.pressure` a config value names (`unavailable` for anything else).
fn pressure_named(name: &str) -> Pressure {
    match name {
        "room-throttled" => Pressure::RoomThrottled,
        "throttled" => Pressure::Throttled,
        _ => Pressure::Unavailable,
    }
}
