//! Times as stored and returned: RFC 3339 in UTC with microseconds and a `Z`, always the same
//! width, so that text order is time order on every database.

use chrono::{DateTime, SecondsFormat, Utc};

/// A stored time.
pub type Timestamp = DateTime<Utc>;

pub fn now() -> Timestamp {
    Utc::now()
}

/// The stored form: `2026-01-02T03:04:05.678901Z`.
pub fn format(t: Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses any RFC 3339 time (any offset) into UTC.
pub fn parse(text: &str) -> Option<Timestamp> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_times_have_one_width_and_sort_as_text() {
        let a = parse("2026-01-02T03:04:05+02:00").unwrap();
        let b = parse("2026-01-02T01:04:05.5Z").unwrap();
        assert_eq!(format(a), "2026-01-02T01:04:05.000000Z");
        assert_eq!(format(b), "2026-01-02T01:04:05.500000Z");
        assert!(format(a) < format(b));
        assert!(parse("yesterday").is_none());
    }
}
