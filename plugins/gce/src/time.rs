//! Compute Engine's RFC 3339 timestamps (`creationTimestamp`,
//! `2024-05-01T05:34:56.789-07:00`) as milliseconds since the Unix epoch,
//! without a date library (one would grow the driver; see ARCHITECTURE.md).

/// Parses `YYYY-MM-DDTHH:MM:SS[.fff…](Z|±HH:MM|±HHMM)`; `None` if malformed.
pub(crate) fn parse_ms(text: &str) -> Option<u64> {
    let b = text.trim().as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(range)?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut millis = 0;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        // Milliseconds from the first three digits, padded.
        let frac = &b[start..i];
        for k in 0..3 {
            millis = millis * 10 + frac.get(k).map_or(0, |d| i64::from(d - b'0'));
        }
    }
    let offset_minutes = match &b[i..] {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), rest @ ..] => {
            let (h, m) = match rest {
                [h1, h2, b':', m1, m2] | [h1, h2, m1, m2] => ([*h1, *h2], [*m1, *m2]),
                _ => return None,
            };
            let h: i64 = std::str::from_utf8(&h).ok()?.parse().ok()?;
            let m: i64 = std::str::from_utf8(&m).ok()?.parse().ok()?;
            let total = h * 60 + m;
            if *sign == b'-' { -total } else { total }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    u64::try_from(secs * 1000 + millis).ok()
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (Howard
/// Hinnant's `days_from_civil`).
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
    fn parses_gce_timestamps() {
        for (text, want) in [
            ("1970-01-01T00:00:00Z", Some(0)),
            ("1970-01-01T00:00:00.000Z", Some(0)),
            ("2024-05-01T12:34:56.789Z", Some(1_714_566_896_789)),
            ("2024-05-01T12:34:56.7Z", Some(1_714_566_896_700)),
            ("2024-05-01T12:34:56.123456Z", Some(1_714_566_896_123)),
            ("2024-05-01T14:34:56+02:00", Some(1_714_566_896_000)),
            ("2024-05-01T05:34:56.789-07:00", Some(1_714_566_896_789)),
            ("2024-05-01T12:04:56-0030", Some(1_714_566_896_000)),
            ("2000-02-29T00:00:00Z", Some(951_782_400_000)),
            ("2026-11-23T11:58:13.000Z", Some(1_795_435_093_000)),
            ("2023-02-29T00:00:00Z", None),
            ("2024-13-01T00:00:00Z", None),
            ("2024-05-01T12:34:56", None),
            ("2024-05-01T12:34:56.Z", None),
            ("2024-05-01 12:34", None),
            ("1969-12-31T23:59:59Z", None),
            ("", None),
            ("yesterday", None),
        ] {
            assert_eq!(parse_ms(text), want, "{text}");
        }
    }
}
