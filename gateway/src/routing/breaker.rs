//! Circuit breakers for config targets (`cb_config`).
//!
//! A breaker is keyed by the config (a fingerprint of its JSON) and the target's node path, so
//! the same saved or inline config shares breakers across requests. States:
//! - closed: answers are counted over a window of `cooldown_interval`; once at least
//!   `minimum_requests` were seen and the failures reach `failure_threshold` (a count) or
//!   `failure_threshold_percentage`, it opens;
//! - open: fallback and load balancing skip the target until the cooldown has passed;
//! - half-open: one request probes the target; success closes the breaker, failure opens it
//!   again for another cooldown.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::config::CircuitBreaker;

/// A breaker's state, as reported to metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug)]
struct Breaker {
    state: BreakerState,
    window_start: Instant,
    total: u32,
    failures: u32,
    open_until: Instant,
    probing: bool,
}

impl Breaker {
    fn new(now: Instant) -> Self {
        Breaker {
            state: BreakerState::Closed,
            window_start: now,
            total: 0,
            failures: 0,
            open_until: now,
            probing: false,
        }
    }
}

/// Every breaker of the gateway.
#[derive(Default)]
pub struct Breakers {
    map: Mutex<HashMap<String, Breaker>>,
}

/// The most breakers kept; the map starts over beyond it (keys come from client configs).
const BREAKERS_KEPT: usize = 10_000;

impl Breakers {
    /// Whether the target may be tried now. An open breaker whose cooldown has passed turns
    /// half-open and lets exactly one probe through. Returns a state change, if any.
    pub fn allow(&self, key: &str, now: Instant) -> (bool, Option<BreakerState>) {
        let Ok(mut map) = self.map.lock() else {
            return (true, None);
        };
        let Some(b) = map.get_mut(key) else {
            return (true, None);
        };
        match b.state {
            BreakerState::Closed => (true, None),
            BreakerState::Open if now >= b.open_until => {
                b.state = BreakerState::HalfOpen;
                b.probing = true;
                (true, Some(BreakerState::HalfOpen))
            }
            BreakerState::Open => (false, None),
            BreakerState::HalfOpen if !b.probing => {
                b.probing = true;
                (true, None)
            }
            BreakerState::HalfOpen => (false, None),
        }
    }

    /// Whether the target's breaker is open right now (without claiming a probe).
    pub fn is_open(&self, key: &str, now: Instant) -> bool {
        self.map.lock().ok().is_some_and(|map| {
            map.get(key).is_some_and(|b| match b.state {
                BreakerState::Open => now < b.open_until,
                BreakerState::HalfOpen => b.probing,
                BreakerState::Closed => false,
            })
        })
    }

    /// Records an answer (`failed` per the config's failure statuses). Returns a state change.
    pub fn record(
        &self,
        key: &str,
        config: &CircuitBreaker,
        failed: bool,
        now: Instant,
    ) -> Option<BreakerState> {
        let mut map = self.map.lock().ok()?;
        if !map.contains_key(key) && map.len() >= BREAKERS_KEPT {
            map.clear();
        }
        let b = map
            .entry(key.to_owned())
            .or_insert_with(|| Breaker::new(now));
        let cooldown = Duration::from_millis(config.cooldown_interval_ms);
        match b.state {
            BreakerState::HalfOpen => {
                b.probing = false;
                if failed {
                    b.state = BreakerState::Open;
                    b.open_until = now + cooldown;
                    Some(BreakerState::Open)
                } else {
                    *b = Breaker::new(now);
                    Some(BreakerState::Closed)
                }
            }
            BreakerState::Open => None,
            BreakerState::Closed => {
                if now.duration_since(b.window_start) > cooldown {
                    b.window_start = now;
                    b.total = 0;
                    b.failures = 0;
                }
                b.total += 1;
                b.failures += u32::from(failed);
                let by_count = config.failure_threshold.is_some_and(|t| b.failures >= t);
                let by_share = config
                    .failure_threshold_percentage
                    .is_some_and(|p| f64::from(b.failures) * 100.0 >= p * f64::from(b.total));
                if failed && b.total >= config.minimum_requests && (by_count || by_share) {
                    b.state = BreakerState::Open;
                    b.open_until = now + cooldown;
                    Some(BreakerState::Open)
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cb(threshold: Option<u32>, pct: Option<f64>, min: u32) -> CircuitBreaker {
        CircuitBreaker {
            failure_threshold: threshold,
            failure_threshold_percentage: pct,
            minimum_requests: min,
            cooldown_interval_ms: 1000,
            failure_status_codes: vec![500, 503],
        }
    }

    #[test]
    fn opens_after_the_threshold_then_half_opens_and_closes_on_a_good_probe() {
        let b = Breakers::default();
        let c = cb(Some(2), None, 1);
        let t0 = Instant::now();
        assert_eq!(b.allow("k", t0), (true, None));
        assert_eq!(b.record("k", &c, true, t0), None);
        assert_eq!(b.record("k", &c, true, t0), Some(BreakerState::Open));
        assert!(b.is_open("k", t0));
        assert_eq!(b.allow("k", t0 + Duration::from_millis(500)), (false, None));
        // After the cooldown: one probe only.
        let t1 = t0 + Duration::from_millis(1001);
        assert_eq!(b.allow("k", t1), (true, Some(BreakerState::HalfOpen)));
        assert_eq!(b.allow("k", t1), (false, None));
        assert_eq!(b.record("k", &c, false, t1), Some(BreakerState::Closed));
        assert_eq!(b.allow("k", t1), (true, None));
        assert!(!b.is_open("k", t1));
    }

    #[test]
    fn a_failed_probe_opens_again_and_percentages_need_the_minimum() {
        let b = Breakers::default();
        let c = cb(None, Some(50.0), 4);
        let t0 = Instant::now();
        assert_eq!(b.record("k", &c, true, t0), None);
        assert_eq!(b.record("k", &c, false, t0), None);
        assert_eq!(b.record("k", &c, true, t0), None, "3 requests < minimum 4");
        assert_eq!(b.record("k", &c, true, t0), Some(BreakerState::Open));
        let t1 = t0 + Duration::from_millis(1001);
        assert!(b.allow("k", t1).0);
        assert_eq!(b.record("k", &c, true, t1), Some(BreakerState::Open));
        assert!(b.is_open("k", t1 + Duration::from_millis(10)));
        // Other keys are independent.
        assert!(!b.is_open("other", t1));
    }
}
