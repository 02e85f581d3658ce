//! The little calendar arithmetic budgets need (UTC only), without a date library.

/// Seconds since 1970-01-01T00:00:00Z of an RFC 3339 time (`2026-01-02T03:04:05Z`,
/// fractions and `+hh:mm` offsets accepted); `None` if it is not one.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let s = text.get(from..to)?;
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let h: i64 = rest.get(1..3)?.parse().ok()?;
            let m: i64 = rest.get(4..6)?.parse().ok()?;
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

/// The calendar month `secs` falls in, counted from January 1970 (= 0).
pub fn month_index(secs: i64) -> i64 {
    let (y, m, _) = civil_from_days(secs.div_euclid(86_400));
    (y - 1970) * 12 + (m - 1)
}

/// Whole months from `from` to `to` (`to >= from`): a month has passed when the same day of
/// the month and time of day is reached (the last day, when the month is shorter).
pub fn whole_months_between(from: i64, to: i64) -> i64 {
    let mut months = month_index(to) - month_index(from);
    let (_, _, fd) = civil_from_days(from.div_euclid(86_400));
    let (ty, tm, td) = civil_from_days(to.div_euclid(86_400));
    let day_at = fd.min(days_in_month(ty, tm));
    let from_tod = from.rem_euclid(86_400);
    let to_tod = to.rem_euclid(86_400);
    if (td, to_tod) < (day_at, from_tod) {
        months -= 1;
    }
    months.max(0)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2026-11-21T10:00:00.123456Z"),
            Some(1_795_255_200)
        );
        assert_eq!(
            parse_rfc3339("2026-11-21T12:00:00+02:00"),
            Some(1_795_255_200)
        );
        assert_eq!(parse_rfc3339("2026-02-29T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("2026-11-21"), None);
        assert_eq!(parse_rfc3339("2026-11-21T10:00:00"), None);
    }

    #[test]
    fn months() {
        let jan31 = parse_rfc3339("2026-01-31T10:00:00Z").unwrap();
        let feb28 = parse_rfc3339("2026-02-28T10:00:00Z").unwrap();
        let feb28_early = parse_rfc3339("2026-02-28T09:59:59Z").unwrap();
        assert_eq!(whole_months_between(jan31, feb28), 1);
        assert_eq!(whole_months_between(jan31, feb28_early), 0);
        assert_eq!(month_index(0), 0);
        assert_eq!(month_index(jan31), 56 * 12);
    }
}
