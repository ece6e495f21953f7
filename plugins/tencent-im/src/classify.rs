//! What a `send_group_msg` reply means for the event: delivered, worth retrying, or
//! permanently failed; and whether a retry concerns more than the event (the host's
//! `flow.push-back`): the app's rate limits and server errors concern every event, a
//! group's frequency control only that group's.

use outbox_sink::http::{Response, classify};
use outbox_sink::{Delivery, Failure, Outcome, Pressure, log, serde_json};

/// How long to hold off after Tencent pushes back (rate limits, frequency control).
pub const BACKOFF_MS: u64 = 1_000;

/// Error codes worth retrying: internal errors, timeouts, rate limits.
const RETRYABLE: &[u32] = &[
    10002, 10006, 10023, 60007, 60008, 60011, 60018, 60019, 70050, 70169, 70202, 70500, 80003, 90992, 90994, 90995,
    91000,
];
/// Of those, the app's rate limits: retry, but not before [`BACKOFF_MS`], and tell the
/// host to hold back the whole sink.
const RATE_LIMITED: &[u32] = &[10006, 10023, 60007, 60011];
/// Error codes retrying cannot fix: invalid group, permissions, parameters, signature, content.
const PERMANENT: &[(u32, u32)] = &[
    (10003, 10004),
    (10007, 10007),
    (10010, 10010),
    (10015, 10017),
    (60002, 60006),
    (60009, 60010),
    (60012, 60012),
    (60015, 60017),
    (60020, 60021),
    (70001, 70020),
    (80001, 80002),
    (90001, 90002),
    (90010, 90010),
];

/// Classifies an HTTP reply from the REST API.
pub fn reply(status: u16, body: &[u8]) -> Delivery {
    if status != 200 {
        // 408, 429 and 5xx are retried (429 and 5xx pushing back); anything else is permanent.
        return classify("Tencent IM", Ok(Response::new(status, body)))
            .and_then(|_| Err(Failure::permanent(format!("HTTP {status} from Tencent IM"))));
    }
    let Ok(reply) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Err(Failure::retryable("Tencent IM sent a reply that is not JSON"));
    };
    let code = reply["ErrorCode"].as_u64().map_or(u32::MAX, |c| u32::try_from(c).unwrap_or(u32::MAX));
    let info: String = reply["ErrorInfo"].as_str().unwrap_or("").chars().take(200).collect();
    if code == 0 {
        return if reply["MsgDropReason"] == "MsgFreqCtrl" {
            Err(pushed_back(
                "Tencent IM dropped the message for frequency control (MsgFreqCtrl)",
                Pressure::RoomThrottled,
            ))
        } else {
            Ok(Outcome::Delivered)
        };
    }
    let message = format!("Tencent IM error {code}: {info}");
    if RATE_LIMITED.contains(&code) {
        Err(pushed_back(&message, Pressure::Throttled))
    } else if RETRYABLE.contains(&code) {
        Err(Failure::retryable(message))
    } else if PERMANENT.iter().any(|(lo, hi)| (*lo..=*hi).contains(&code)) {
        Err(Failure::permanent(message))
    } else {
        log::warn(&format!("unknown Tencent IM error, retrying: {message}"));
        Err(Failure::retryable(message))
    }
}

fn pushed_back(message: &str, pressure: Pressure) -> Failure {
    Failure::retryable(message).pressure(pressure).after_ms(BACKOFF_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_sink::FailureKind;

    fn code(code: u32) -> Failure {
        reply(200, format!(r#"{{"ActionStatus":"FAIL","ErrorCode":{code},"ErrorInfo":"info"}}"#).as_bytes())
            .expect_err("a failure")
    }

    #[test]
    fn ok_is_delivered_unless_dropped_for_frequency_control() {
        assert_eq!(reply(200, br#"{"ActionStatus":"OK","ErrorCode":0,"MsgSeq":1}"#), Ok(Outcome::Delivered));
        let dropped = reply(200, br#"{"ActionStatus":"OK","ErrorCode":0,"MsgDropReason":"MsgFreqCtrl"}"#);
        let dropped = dropped.expect_err("only the group is held back");
        assert_eq!((dropped.retry_after_ms, dropped.pressure), (Some(BACKOFF_MS), Some(Pressure::RoomThrottled)));
    }

    #[test]
    fn every_listed_retryable_code_is_retried() {
        for c in RETRYABLE {
            assert_eq!(code(*c).kind, FailureKind::Retryable, "{c}");
        }
        for c in RATE_LIMITED {
            let f = code(*c);
            assert_eq!((f.retry_after_ms, f.pressure), (Some(BACKOFF_MS), Some(Pressure::Throttled)), "{c}: {f:?}");
        }
        assert_eq!(code(70500), Failure::retryable("Tencent IM error 70500: info"));
    }

    #[test]
    fn every_listed_permanent_code_fails() {
        let listed = [
            10003, 10004, 10007, 10010, 10015, 10016, 10017, 60002, 60003, 60004, 60005, 60006, 60009, 60010, 60012,
            60015, 60016, 60017, 60020, 60021, 70001, 70010, 70020, 80001, 80002, 90001, 90002, 90010,
        ];
        for c in listed {
            assert_eq!(code(c), Failure::permanent(format!("Tencent IM error {c}: info")), "{c}");
        }
    }

    #[test]
    fn unknown_codes_are_retried_and_logged() {
        let mut harness = outbox_sink::testing::Harness::new();
        let unknown = harness.run(|| code(12345));
        assert_eq!(unknown, Failure::retryable("Tencent IM error 12345: info"));
        assert_eq!(harness.logs()[0].1, "unknown Tencent IM error, retrying: Tencent IM error 12345: info");
        assert_eq!(code(70021).kind, FailureKind::Retryable);
    }

    #[test]
    fn http_statuses() {
        assert_eq!(
            reply(502, b""),
            Err(Failure::retryable("HTTP 502 from Tencent IM").pressure(Pressure::Unavailable))
        );
        assert_eq!(reply(429, b"").unwrap_err().pressure, Some(Pressure::Throttled));
        assert_eq!(reply(408, b"").unwrap_err().pressure, None, "a timeout is about one request");
        assert_eq!(reply(404, b""), Err(Failure::permanent("HTTP 404 from Tencent IM")));
        assert_eq!(reply(204, b""), Err(Failure::permanent("HTTP 204 from Tencent IM")));
        assert_eq!(reply(200, b"<html>").unwrap_err().kind, FailureKind::Retryable);
    }
}
