//! The decisions of the routing strategies, kept free of I/O so they can be tested alone:
//! which target a condition or a weighted draw picks, whether a status is retried or falls
//! back, and how long to wait before a retry.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::HeaderMap;
use serde_json::Value;

use super::config::{Node, Op, Query, Strategy};

/// The longest a request may spend waiting between retries, all waits together.
pub const MAX_TOTAL_BACKOFF: Duration = Duration::from_secs(60);
/// The first backoff; each further attempt doubles it.
pub const BASE_BACKOFF: Duration = Duration::from_millis(100);

/// What conditions are evaluated against.
pub struct RequestFacts<'a> {
    pub metadata: &'a BTreeMap<String, String>,
    /// The request body as JSON (`Value::Null` when it has none).
    pub params: &'a Value,
    pub pathname: &'a str,
}

impl RequestFacts<'_> {
    fn field(&self, field: &str) -> Option<Value> {
        if field == "url.pathname" {
            return Some(Value::String(self.pathname.to_owned()));
        }
        if let Some(key) = field.strip_prefix("metadata.") {
            return self.metadata.get(key).map(|v| Value::String(v.clone()));
        }
        let path = field.strip_prefix("params.")?;
        let mut at = self.params;
        for part in path.split('.') {
            at = at.get(part)?;
        }
        Some(at.clone())
    }
}

/// Whether the query holds for the request.
pub fn matches(query: &Query, facts: &RequestFacts<'_>) -> bool {
    match query {
        Query::All(qs) => qs.iter().all(|q| matches(q, facts)),
        Query::Any(qs) => qs.iter().any(|q| matches(q, facts)),
        Query::Field { field, op } => {
            let value = facts.field(field);
            match (op, value) {
                (Op::Eq(want), Some(v)) => loose_eq(&v, want),
                (Op::Eq(_), None) => false,
                (Op::Ne(want), Some(v)) => !loose_eq(&v, want),
                (Op::Ne(_), None) => true,
                (Op::In(list), Some(v)) => list.iter().any(|w| loose_eq(&v, w)),
                (Op::In(_), None) => false,
                (Op::Nin(list), Some(v)) => !list.iter().any(|w| loose_eq(&v, w)),
                (Op::Nin(_), None) => true,
                (Op::Regex(re), Some(v)) => re.is_match(&as_text(&v)),
                (Op::Gt(n), Some(v)) => as_number(&v).is_some_and(|x| x > *n),
                (Op::Gte(n), Some(v)) => as_number(&v).is_some_and(|x| x >= *n),
                (Op::Lt(n), Some(v)) => as_number(&v).is_some_and(|x| x < *n),
                (Op::Lte(n), Some(v)) => as_number(&v).is_some_and(|x| x <= *n),
                (_, None) => false,
            }
        }
    }
}

/// Equality that lets metadata (always strings) match numbers and booleans written in a config.
fn loose_eq(value: &Value, want: &Value) -> bool {
    value == want || as_text(value) == as_text(want)
}

fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A uniform number in [0, 1): a SplitMix64 stream over a process-wide counter (routing needs
/// spread, not secrecy).
pub fn random_unit() -> f64 {
    static STATE: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let seed = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64);
    let mut z = seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The index of the target a weighted draw picks among the allowed ones (`unit` in [0, 1));
/// weight 0 is never picked.
pub fn pick_weighted(targets: &[Node], allowed: &[bool], unit: f64) -> Option<usize> {
    let weight = |i: usize, t: &Node| if allowed[i] { t.weight.max(0.0) } else { 0.0 };
    let total: f64 = targets.iter().enumerate().map(|(i, t)| weight(i, t)).sum();
    if total <= 0.0 {
        return None;
    }
    let mut point = unit * total;
    for (i, t) in targets.iter().enumerate() {
        let w = weight(i, t);
        if w <= 0.0 {
            continue;
        }
        if point < w {
            return Some(i);
        }
        point -= w;
    }
    (0..targets.len())
        .rev()
        .find(|&i| weight(i, &targets[i]) > 0.0)
}

/// The sticky key of a request: the values of the `hash_fields`, joined.
pub fn sticky_key(fields: &[String], facts: &RequestFacts<'_>) -> String {
    fields
        .iter()
        .map(|f| facts.field(f).map(|v| as_text(&v)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\u{1f}")
}

/// The target a sticky key goes to among the allowed ones: weighted rendezvous hashing, so the
/// same key keeps its target while that target stays available, and only the keys of a target
/// that drops out move.
pub fn pick_sticky(targets: &[Node], allowed: &[bool], key: &str) -> Option<usize> {
    targets
        .iter()
        .enumerate()
        .filter(|(i, t)| allowed[*i] && t.weight > 0.0)
        .map(|(i, t)| {
            let unit = (fnv1a(key.as_bytes(), i as u64) >> 11) as f64 / (1u64 << 53) as f64;
            // -ln(u)/w: the smallest score wins; weights scale the odds.
            (i, -(unit.max(f64::MIN_POSITIVE)).ln() / t.weight)
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

fn fnv1a(bytes: &[u8], salt: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // A final mix so that neighbouring salts spread.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// Which targets of a group may be tried now: those whose circuit breaker is not open. When
/// every target's breaker is open, all are tried rather than failing the request outright.
pub fn available(targets: &[Node], is_open: &dyn Fn(&Node) -> bool) -> Vec<bool> {
    let allowed: Vec<bool> = targets.iter().map(|t| !is_open(t)).collect();
    if allowed.iter().any(|a| *a) {
        allowed
    } else {
        vec![true; targets.len()]
    }
}

/// Whether choosing under this strategy reads the request (conditions, sticky fields), so that
/// callers parse the body only when it is needed.
pub fn reads_request(strategy: &Strategy) -> bool {
    matches!(
        strategy,
        Strategy::Conditional { .. } | Strategy::LoadBalance { sticky: Some(_) }
    )
}

/// The target a group's strategy chooses: the first for `single`; the first available for
/// `fallback` (which then goes on by status); a weighted or sticky draw among the available
/// ones for `loadbalance`; the target named by the first matching condition, else `default`,
/// for `conditional`. `None` when nothing can be chosen.
pub fn choose(
    strategy: &Strategy,
    targets: &[Node],
    facts: &RequestFacts<'_>,
    is_open: &dyn Fn(&Node) -> bool,
) -> Option<usize> {
    match strategy {
        Strategy::Single => Some(0),
        Strategy::Fallback { .. } => available(targets, is_open).iter().position(|a| *a),
        Strategy::LoadBalance { sticky } => {
            let allowed = available(targets, is_open);
            match sticky {
                Some(fields) => pick_sticky(targets, &allowed, &sticky_key(fields, facts)),
                None => pick_weighted(targets, &allowed, random_unit()),
            }
        }
        Strategy::Conditional {
            conditions,
            default,
        } => conditions
            .iter()
            .find(|c| matches(&c.query, facts))
            .map(|c| c.then.as_str())
            .or(default.as_deref())
            .and_then(|name| targets.iter().position(|t| t.name.as_deref() == Some(name))),
    }
}

/// Whether a fallback group goes on to its next target after this status.
pub fn falls_back(status: u16, on_status_codes: Option<&[u16]>) -> bool {
    match on_status_codes {
        Some(codes) => codes.contains(&status),
        None => !(200..300).contains(&status),
    }
}

/// The wait before retry number `retry` (1 for the first retry): exponential from
/// [`BASE_BACKOFF`] with up to 50% jitter, or what the provider asked for when
/// `use_retry_after` is set and it said so.
pub fn backoff(
    retry: u32,
    headers: Option<&HeaderMap>,
    use_retry_after: bool,
    unit: f64,
) -> Duration {
    if use_retry_after {
        if let Some(wait) = headers.and_then(retry_after) {
            return wait.min(MAX_TOTAL_BACKOFF);
        }
    }
    let exp = BASE_BACKOFF * 2u32.saturating_pow(retry.saturating_sub(1).min(10));
    let jitter = exp.mul_f64(unit * 0.5);
    (exp + jitter).min(MAX_TOTAL_BACKOFF)
}

/// `retry-after-ms`, `x-ms-retry-after-ms` (milliseconds) or `retry-after` (seconds).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    number("retry-after-ms")
        .or_else(|| number("x-ms-retry-after-ms"))
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        .or_else(|| number("retry-after").map(Duration::from_secs_f64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::config::{NodeKind, RoutingConfig};
    use serde_json::json;

    fn condition(query: Value) -> Query {
        let c = RoutingConfig::parse(&json!({
            "strategy": {"mode": "conditional", "conditions": [{"query": query, "then": "a"}]},
            "targets": [{"name": "a", "provider": "openai"}]
        }))
        .unwrap();
        let NodeKind::Group {
            strategy: super::super::config::Strategy::Conditional { conditions, .. },
            ..
        } = c.root.kind
        else {
            panic!()
        };
        conditions.into_iter().next().unwrap().query
    }

    #[test]
    fn operators() {
        let metadata: BTreeMap<String, String> =
            [("tier".into(), "paid".into()), ("age".into(), "42".into())].into();
        let params = json!({"model": "gpt-4o", "temperature": 0.2, "nested": {"x": 1}});
        let facts = RequestFacts {
            metadata: &metadata,
            params: &params,
            pathname: "/v1/chat/completions",
        };
        let yes = |q: Value| assert!(matches(&condition(q.clone()), &facts), "{q}");
        let no = |q: Value| assert!(!matches(&condition(q.clone()), &facts), "{q}");
        yes(json!({"metadata.tier": "paid"}));
        yes(json!({"metadata.tier": {"$eq": "paid"}}));
        no(json!({"metadata.tier": {"$ne": "paid"}}));
        yes(json!({"metadata.missing": {"$ne": "x"}}));
        yes(json!({"metadata.age": {"$gt": 40}}));
        no(json!({"metadata.age": {"$lt": 40}}));
        yes(json!({"metadata.age": {"$gte": 42, "$lte": 42}}));
        yes(json!({"metadata.age": 42}));
        yes(json!({"params.model": {"$in": ["gpt-4o", "gpt-4o-mini"]}}));
        no(json!({"params.model": {"$nin": ["gpt-4o"]}}));
        yes(json!({"params.model": {"$regex": "^gpt-4"}}));
        yes(json!({"params.nested.x": 1}));
        yes(json!({"url.pathname": {"$regex": "chat"}}));
        yes(json!({"$or": [{"metadata.tier": "free"}, {"params.temperature": {"$lt": 0.5}}]}));
        no(json!({"$and": [{"metadata.tier": "paid"}, {"params.temperature": {"$gt": 0.5}}]}));
        no(json!({"metadata.tier": "paid", "params.model": "other"}));
        no(json!({"metadata.missing": {"$gt": 1}}));
    }

    #[test]
    fn weighted_draws_never_pick_zero_and_follow_weights() {
        let c = RoutingConfig::parse(&json!({"strategy": {"mode": "loadbalance"}, "targets": [
            {"provider": "openai", "weight": 0.75}, {"provider": "groq", "weight": 0}, {"provider": "groq", "weight": 0.25}
        ]}))
        .unwrap();
        let NodeKind::Group { targets, .. } = c.root.kind else {
            panic!()
        };
        let all = [true; 3];
        assert_eq!(pick_weighted(&targets, &all, 0.0), Some(0));
        assert_eq!(pick_weighted(&targets, &all, 0.74), Some(0));
        assert_eq!(pick_weighted(&targets, &all, 0.76), Some(2));
        assert_eq!(pick_weighted(&targets, &all, 0.999), Some(2));
        assert_eq!(pick_weighted(&targets, &[false, true, true], 0.1), Some(2));
        assert_eq!(pick_weighted(&targets, &[false, true, false], 0.1), None);
        let mut counts = [0usize; 3];
        for _ in 0..10_000 {
            counts[pick_weighted(&targets, &all, random_unit()).unwrap()] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!((7_000..8_000).contains(&counts[0]), "{counts:?}");

        // Sticky: the same key keeps its target; a key moves only when its target drops out.
        let mut moved = 0;
        let mut spread = [0usize; 3];
        for k in 0..1000 {
            let key = format!("user-{k}");
            let first = pick_sticky(&targets, &all, &key).unwrap();
            assert_eq!(pick_sticky(&targets, &all, &key), Some(first));
            spread[first] += 1;
            let without_2 = pick_sticky(&targets, &[true, true, false], &key).unwrap();
            if first == 2 {
                moved += 1;
            } else {
                assert_eq!(without_2, first);
            }
        }
        assert_eq!(spread[1], 0);
        assert!((650..850).contains(&spread[0]), "{spread:?}");
        assert!(moved == spread[2] && moved > 0);
    }

    #[test]
    fn fallback_and_backoff_rules() {
        assert!(falls_back(503, None));
        assert!(falls_back(404, None));
        assert!(!falls_back(200, None));
        assert!(falls_back(429, Some(&[429, 503])));
        assert!(!falls_back(500, Some(&[429, 503])));

        assert_eq!(backoff(1, None, false, 0.0), Duration::from_millis(100));
        assert_eq!(backoff(2, None, false, 0.0), Duration::from_millis(200));
        assert_eq!(backoff(3, None, false, 1.0), Duration::from_millis(600));
        assert_eq!(backoff(30, None, false, 1.0), MAX_TOTAL_BACKOFF);

        let mut h = HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(backoff(1, Some(&h), true, 0.0), Duration::from_secs(2));
        assert_eq!(backoff(1, Some(&h), false, 0.0), Duration::from_millis(100));
        h.insert("x-ms-retry-after-ms", "250".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        h.insert("retry-after-ms", "40".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(40)));
        h.insert("retry-after", "9999".parse().unwrap());
        h.remove("retry-after-ms");
        h.remove("x-ms-retry-after-ms");
        assert_eq!(backoff(1, Some(&h), true, 0.0), MAX_TOTAL_BACKOFF);
    }
}
