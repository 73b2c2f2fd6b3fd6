//! Human-written durations (`"250ms"`, `"2s"`, `"1m"`) for flags and config
//! files, and instants written as RFC 3339.

use std::time::Duration;

/// Why a duration string was not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseDurationError {
    #[error("empty duration")]
    Empty,
    #[error("duration `{0}` has no unit; use ms, s, m or h (for example `250ms` or `2s`)")]
    MissingUnit(String),
    #[error("duration `{0}` does not start with a whole number")]
    BadNumber(String),
    #[error("duration `{0}` has an unknown unit; use ms, s, m or h")]
    UnknownUnit(String),
    #[error("duration `{0}` is too long")]
    Overflow(String),
}

/// Parses a whole number followed by `ms`, `s`, `m` or `h`. A bare `0` is
/// accepted because "no delay" needs no unit; any other bare number is refused
/// so that `--boot-delay 2` cannot silently mean two milliseconds.
pub fn parse(text: &str) -> Result<Duration, ParseDurationError> {
    if text.is_empty() {
        return Err(ParseDurationError::Empty);
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(ParseDurationError::BadNumber(text.to_owned()));
    }
    if unit.is_empty() {
        return Err(ParseDurationError::MissingUnit(text.to_owned()));
    }
    let value: u64 = number
        .parse()
        .map_err(|_| ParseDurationError::Overflow(text.to_owned()))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(ParseDurationError::UnknownUnit(text.to_owned())),
    };
    value
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| ParseDurationError::Overflow(text.to_owned()))
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds,
/// e.g. `2026-11-23T10:04:05.123Z`. Instants past the last that `jiff`
/// holds (late on 9999-12-30) are written as that last one.
pub fn rfc3339(ms: u64) -> String {
    let at = i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    format!("{at:.3}")
}

/// Reads an RFC 3339 time (any offset, with or without fractions of a
/// second; [`rfc3339`] writes one) as milliseconds since the Unix epoch.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let t: jiff::Timestamp = text.parse().ok()?;
    u64::try_from(t.as_millisecond()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expect: Result<Duration, ParseDurationError>) {
        assert_eq!(parse(input), expect, "input {input:?}");
    }

    #[test]
    fn accepts_units() {
        check("250ms", Ok(Duration::from_millis(250)));
        check("2s", Ok(Duration::from_secs(2)));
        check("1m", Ok(Duration::from_secs(60)));
        check("3h", Ok(Duration::from_secs(3 * 3600)));
        check("0ms", Ok(Duration::ZERO));
        check("0", Ok(Duration::ZERO));
    }

    #[test]
    fn writes_instants_with_milliseconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1), "1970-01-01T00:00:00.001Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_431_845_123), "2026-11-23T11:04:05.123Z");
        assert_eq!(rfc3339(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(253_402_207_199_999), "9999-12-30T21:59:59.999Z");
        assert_eq!(rfc3339(253_402_300_799_999), "9999-12-30T22:00:00.999Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-30T22:00:00.999Z");
    }

    #[test]
    fn instants_read_back_as_written() {
        let mut ms: u64 = 0;
        for i in 0..20_000u64 {
            assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms), "{ms}");
            ms = ms.wrapping_mul(6364136223846793005).wrapping_add(i) % 13_000_000_000_000;
        }
        for ms in [0, 951_782_400_000, 1_795_431_845_123, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms));
        }
        // Any RFC 3339 form reads, not only the one berth writes.
        assert_eq!(
            parse_rfc3339("2026-11-23T10:04:05Z"),
            parse_rfc3339("2026-11-23T11:04:05.000+01:00")
        );
        for bad in [
            "2026-02-29T00:00:00.000Z",
            "2026-13-01T00:00:00.000Z",
            "2026-11-23T24:00:00.000Z",
            "2026-11-23T10:04:05.12xZ",
            "2026-11-2éT10:04:05.12Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn refuses_nonsense() {
        use ParseDurationError::*;
        check("", Err(Empty));
        check("2", Err(MissingUnit("2".into())));
        check("s", Err(BadNumber("s".into())));
        check("-1s", Err(BadNumber("-1s".into())));
        check("1.5s", Err(UnknownUnit("1.5s".into())));
        check("2 s", Err(UnknownUnit("2 s".into())));
        check("2d", Err(UnknownUnit("2d".into())));
        check(
            "99999999999999999999s",
            Err(Overflow("99999999999999999999s".into())),
        );
        check(
            "18446744073709551615h",
            Err(Overflow("18446744073709551615h".into())),
        );
    }
}
