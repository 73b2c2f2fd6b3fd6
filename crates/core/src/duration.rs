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
/// e.g. `2026-11-23T10:04:05.123Z`.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
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
