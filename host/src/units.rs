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
/// reads Go's has not been maintained since 2021 (see docs/decisions/0045-library-swaps.md).
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

/// Parses an RFC 3339 time, `2026-11-30T08:00:00Z` or with a fraction and an offset
/// (`2026-11-30T16:00:00.250+08:00`), into UTC milliseconds. The date alone
/// (`2026-11-30`) reads as its midnight UTC.
pub fn parse_rfc3339_ms(text: &str) -> Result<i64, String> {
    let bad = || format!("{text:?} is not an RFC 3339 time such as 2026-11-30T08:00:00Z");
    let t = text.trim();
    let digits = |s: &str| -> Option<i64> { s.bytes().all(|b| b.is_ascii_digit()).then(|| s.parse().ok())? };
    let (date, rest) =
        if t.len() == 10 { (t, None) } else { (t.get(..10).ok_or_else(bad)?, Some(t.get(10..).ok_or_else(bad)?)) };
    let [y, m, d]: [&str; 3] = date.split('-').collect::<Vec<_>>().try_into().map_err(|_| bad())?;
    let (year, month, day) = (digits(y).ok_or_else(bad)?, digits(m).ok_or_else(bad)?, digits(d).ok_or_else(bad)?);
    if y.len() != 4 || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    let mut ms = days_from_civil(year, month, day) * 86_400_000;
    if let Some(rest) = rest {
        let rest = rest.strip_prefix(['T', 't', ' ']).ok_or_else(bad)?;
        let (clock, offset_ms) = if let Some(clock) = rest.strip_suffix(['Z', 'z']) {
            (clock, 0)
        } else {
            let at = rest.rfind(['+', '-']).filter(|&i| i >= 8).ok_or_else(bad)?;
            let (h, m) = rest[at + 1..].split_once(':').ok_or_else(bad)?;
            let (h, m) = (digits(h).ok_or_else(bad)?, digits(m).ok_or_else(bad)?);
            let sign = if rest.as_bytes()[at] == b'-' { -1 } else { 1 };
            (&rest[..at], sign * (h * 3_600_000 + m * 60_000))
        };
        let (whole, fraction) = clock.split_once('.').unwrap_or((clock, ""));
        let [h, mi, s]: [&str; 3] = whole.split(':').collect::<Vec<_>>().try_into().map_err(|_| bad())?;
        let (h, mi, s) = (digits(h).ok_or_else(bad)?, digits(mi).ok_or_else(bad)?, digits(s).ok_or_else(bad)?);
        if h > 23 || mi > 59 || s > 60 || (!fraction.is_empty() && digits(fraction).is_none()) {
            return Err(bad());
        }
        let millis = format!("{fraction:0<3}")[..3].parse::<i64>().map_err(|_| bad())?;
        ms += h * 3_600_000 + mi * 60_000 + s * 1_000 + millis - offset_ms;
    }
    Ok(ms)
}

/// UTC milliseconds as RFC 3339 with milliseconds: `2026-11-30T08:00:00.250Z`.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let (days, rest) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1_000 % 60,
        rest % 1_000
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_rfc3339_ms("2026-11-30T08:00:00Z"), Ok(1_796_025_600_000));
        assert_eq!(parse_rfc3339_ms("2026-11-30T16:00:00.25+08:00"), Ok(1_796_025_600_250));
        assert_eq!(parse_rfc3339_ms("2026-11-30t07:30:00-00:30"), Ok(1_796_025_600_000));
        assert_eq!(parse_rfc3339_ms("2026-11-30"), Ok(1_795_996_800_000));
        assert_eq!(parse_rfc3339_ms("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        assert_eq!(format_rfc3339_ms(1_796_025_600_250), "2026-11-30T08:00:00.250Z");
        for ms in [0, 951_782_400_000, 1_796_025_600_250, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(ms)), Ok(ms), "{ms} round trips");
        }
        for bad in
            ["", "now", "2026-13-01", "2026-11-30T25:00:00Z", "2026-11-30T08:00Z", "2026-11-30T08:00:00", "26-11-30"]
        {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad:?} was read");
        }
    }

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
