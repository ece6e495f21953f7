//! Parsing of the human units used in the YAML file: durations in Go's syntax ("1s",
//! "500ms", "1m30s") and byte sizes ("64MiB").

use std::time::Duration;

/// Parses a duration in Go's `time.ParseDuration` syntax, as room-service's config wrote
/// them: a possibly signed sequence of decimal numbers, each with an optional fraction and a
/// unit: `"500ms"`, `"1.5s"`, `"1m30s"`, `"1h2m3s"`, `"-1.5h"`, `"0"`. Units are `ns`, `us`
/// (`µs`), `ms`, `s`, `m`, `h`, and (beyond Go) `d` for days, as in `purge
/// --delivered-before 7d`.
///
/// Returns signed milliseconds (a sub-millisecond remainder is rounded), so that the caller
/// can apply room-service's rule for non-positive values: fall back to the default.
///
/// Written here rather than taken from a crate: the maintained ones read another grammar
/// (no fractions or signs in `humantime`, expressions in `duration-str`), and the one that
/// reads Go's has not been maintained since 2021 (see docs/decisions.md).
pub fn parse_duration_ms(text: &str) -> Result<i64, String> {
    let original = text;
    let text = text.trim();
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(format!("{original:?} is not a duration (e.g. \"500ms\", \"3s\", \"1m30s\")"));
    }
    let mut total_ns: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(format!("{original:?} is not a duration (e.g. \"500ms\", \"3s\", \"1m30s\")"));
        }
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let ns_per_unit: f64 = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3_600e9,
            "d" => 86_400e9,
            "" => return Err(format!("{original:?} needs a unit: ns, us, ms, s, m, h or d (e.g. \"1s\")")),
            other => return Err(format!("{original:?} has unknown unit {other:?}: use ns, us, ms, s, m, h or d")),
        };
        let value: f64 = number.parse().map_err(|_| format!("{original:?} is not a duration"))?;
        total_ns += value * ns_per_unit;
        rest = tail;
    }
    let ms = (total_ns / 1e6).round();
    if ms > i64::MAX as f64 / 2.0 {
        return Err(format!("{original:?} is too long"));
    }
    Ok(if negative { -(ms as i64) } else { ms as i64 })
}

/// Renders milliseconds the way a person writes them in the config.
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

/// Parses a byte size such as `"64MiB"`, `"512KiB"`, `"1GiB"` or a plain number of bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number.parse().map_err(|_| format!("{text:?} is not a size (e.g. \"64MiB\")"))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "KB" | "K" => 1 << 10,
        "MiB" | "MB" | "M" => 1 << 20,
        "GiB" | "GB" | "G" => 1 << 30,
        other => {
            return Err(format!("{text:?} has unknown unit {other:?}: use KiB, MiB or GiB"));
        }
    };
    value.checked_mul(factor).ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("3s"), Ok(3_000));
        assert_eq!(parse_duration_ms("1.5s"), Ok(1_500));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_duration_ms("-1s"), Ok(-1_000));
        assert_eq!(parse_duration_ms("0s"), Ok(0));
    }

    #[test]
    fn go_durations_as_room_service_wrote_them() {
        for (text, ms) in [
            ("1m30s", 90_000),
            ("1h2m3s", 3_723_000),
            ("2h45m", 9_900_000),
            ("1.5h", 5_400_000),
            ("-1.5h", -5_400_000),
            (".5s", 500),
            ("1.s", 1_000),
            ("300ms", 300),
            ("1500us", 2),
            ("1500µs", 2),
            ("2000000ns", 2),
            ("+5s", 5_000),
            ("0", 0),
            ("-0", 0),
            ("1d12h", 129_600_000),
        ] {
            assert_eq!(parse_duration_ms(text), Ok(ms), "{text}");
        }
        for bad in ["", "-", ".", "1..5s", "s", "1m30", "1x", "one second"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn durations_without_a_known_unit_are_refused() {
        assert!(parse_duration_ms("5").unwrap_err().contains("needs a unit"));
        assert!(parse_duration_ms("5w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration_ms("fast").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("512KiB"), Ok(512 << 10));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }

    #[test]
    fn formatting_round_trips() {
        assert_eq!(format_duration(Duration::from_millis(1_500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(3)), "3s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
    }
}
