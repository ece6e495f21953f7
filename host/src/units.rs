//! Parsing of the human units used in the YAML file: durations ("1s", "500ms") and byte
//! sizes ("64MiB").

use std::time::Duration;

/// Parses a duration such as `"500ms"`, `"1s"`, `"1.5s"`, `"2m"`, `"1h"` or `"7d"`.
///
/// A leading `-` is accepted so that the caller can apply the seed's rule for
/// non-positive values (fall back to the default) instead of failing.
/// Returns the signed number of milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let split = digits
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} needs a unit: ms, s, m, h or d (e.g. \"1s\")"))?;
    let (number, unit) = digits.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration (e.g. \"500ms\", \"3s\")"))?;
    let factor = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return Err(format!("{text:?} has unknown unit {unit:?}: use ms, s, m, h or d")),
    };
    let ms = (value * factor).round();
    if ms > i64::MAX as f64 / 2.0 {
        return Err(format!("{text:?} is too long"));
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
