//! What a `send_group_msg` reply means for the event: delivered, worth retrying, or
//! permanently failed; and whether a retry concerns more than the event (the host's
//! `flow.push-back`): the app's rate limits and server errors concern every event, a
//! group's frequency control only that group's.

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

/// What a retry concerns beyond its event (mirrors the host's `flow.pressure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    /// The group is over its frequency limit (`MsgFreqCtrl`).
    RoomThrottled,
    /// The app is over a rate limit.
    Throttled,
    /// Tencent IM cannot be reached or answers with server errors.
    Unavailable,
}

/// The outcome of one reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Tencent accepted the message.
    Delivered,
    /// Try again (after `retry_after_ms` at the earliest, if given).
    Retry {
        /// Short reason for `last_error`.
        message: String,
        /// The earliest next attempt.
        retry_after_ms: Option<u64>,
        /// An error code this sink does not know (worth a log line).
        unknown: bool,
        /// Whether it concerns the group or the whole app, not only the event.
        pressure: Option<Pressure>,
    },
    /// Retrying cannot help.
    Permanent {
        /// Short reason for `last_error`.
        message: String,
    },
}

fn retry(message: String, retry_after_ms: Option<u64>) -> Verdict {
    Verdict::Retry { message, retry_after_ms, unknown: false, pressure: None }
}

fn pushed_back(message: String, pressure: Pressure) -> Verdict {
    let retry_after_ms = (pressure != Pressure::Unavailable).then_some(BACKOFF_MS);
    Verdict::Retry { message, retry_after_ms, unknown: false, pressure: Some(pressure) }
}

/// Classifies an HTTP reply from the REST API.
pub fn reply(status: u16, body: &[u8]) -> Verdict {
    match status {
        200 => {}
        429 => return pushed_back("HTTP 429 from Tencent IM".into(), Pressure::Throttled),
        408 => return retry(format!("HTTP {status} from Tencent IM"), None),
        500..=599 => return pushed_back(format!("HTTP {status} from Tencent IM"), Pressure::Unavailable),
        _ => return Verdict::Permanent { message: format!("HTTP {status} from Tencent IM (check endpoint)") },
    }
    let Ok(reply) = serde_json::from_slice::<serde_json::Value>(body) else {
        return retry("Tencent IM sent a reply that is not JSON".into(), None);
    };
    let code = reply["ErrorCode"].as_u64().map_or(u32::MAX, |c| u32::try_from(c).unwrap_or(u32::MAX));
    let info: String = reply["ErrorInfo"].as_str().unwrap_or("").chars().take(200).collect();
    if code == 0 {
        return if reply["MsgDropReason"] == "MsgFreqCtrl" {
            pushed_back(
                "Tencent IM dropped the message for frequency control (MsgFreqCtrl)".into(),
                Pressure::RoomThrottled,
            )
        } else {
            Verdict::Delivered
        };
    }
    let message = format!("Tencent IM error {code}: {info}");
    if RATE_LIMITED.contains(&code) {
        pushed_back(message, Pressure::Throttled)
    } else if RETRYABLE.contains(&code) {
        retry(message, None)
    } else if PERMANENT.iter().any(|(lo, hi)| (*lo..=*hi).contains(&code)) {
        Verdict::Permanent { message }
    } else {
        Verdict::Retry { message, retry_after_ms: None, unknown: true, pressure: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(code: u32) -> Verdict {
        reply(200, format!(r#"{{"ActionStatus":"FAIL","ErrorCode":{code},"ErrorInfo":"info"}}"#).as_bytes())
    }

    #[test]
    fn ok_is_delivered_unless_dropped_for_frequency_control() {
        assert_eq!(reply(200, br#"{"ActionStatus":"OK","ErrorCode":0,"MsgSeq":1}"#), Verdict::Delivered);
        let dropped = reply(200, br#"{"ActionStatus":"OK","ErrorCode":0,"MsgDropReason":"MsgFreqCtrl"}"#);
        assert!(
            matches!(
                dropped,
                Verdict::Retry { retry_after_ms: Some(BACKOFF_MS), pressure: Some(Pressure::RoomThrottled), .. }
            ),
            "only the group is held back: {dropped:?}"
        );
    }

    #[test]
    fn every_listed_retryable_code_is_retried() {
        for c in RETRYABLE {
            let v = code(*c);
            assert!(matches!(v, Verdict::Retry { unknown: false, .. }), "{c}: {v:?}");
        }
        for c in RATE_LIMITED {
            let v = code(*c);
            assert!(
                matches!(
                    v,
                    Verdict::Retry { retry_after_ms: Some(BACKOFF_MS), pressure: Some(Pressure::Throttled), .. }
                ),
                "{c}: the app's rate limit holds back the whole sink: {v:?}"
            );
        }
        assert!(matches!(code(70500), Verdict::Retry { retry_after_ms: None, pressure: None, .. }));
    }

    #[test]
    fn every_listed_permanent_code_fails() {
        let listed = [
            10003, 10004, 10007, 10010, 10015, 10016, 10017, 60002, 60003, 60004, 60005, 60006, 60009, 60010, 60012,
            60015, 60016, 60017, 60020, 60021, 70001, 70010, 70020, 80001, 80002, 90001, 90002, 90010,
        ];
        for c in listed {
            assert_eq!(code(c), Verdict::Permanent { message: format!("Tencent IM error {c}: info") }, "{c}");
        }
    }

    #[test]
    fn unknown_codes_are_retried_and_flagged() {
        assert!(matches!(code(12345), Verdict::Retry { unknown: true, pressure: None, .. }));
        assert!(matches!(code(70021), Verdict::Retry { unknown: true, .. }));
    }

    #[test]
    fn http_statuses() {
        assert!(matches!(
            reply(502, b""),
            Verdict::Retry { retry_after_ms: None, pressure: Some(Pressure::Unavailable), .. }
        ));
        assert!(matches!(
            reply(429, b""),
            Verdict::Retry { retry_after_ms: Some(_), pressure: Some(Pressure::Throttled), .. }
        ));
        assert!(matches!(reply(408, b""), Verdict::Retry { pressure: None, .. }), "a timeout is about one request");
        assert!(matches!(reply(404, b""), Verdict::Permanent { .. }));
        assert!(matches!(reply(200, b"<html>"), Verdict::Retry { .. }));
    }
}
