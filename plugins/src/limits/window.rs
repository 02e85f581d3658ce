//! Sliding-window counter arithmetic, shared by the in-process and Redis backends.
//!
//! Time is cut into fixed windows of `length` milliseconds (window `i` spans
//! `[i * length, (i + 1) * length)`), and each counter keeps the count of the current window and
//! of the previous one. The number of events in the sliding window that ends `now` is
//! estimated as the current count plus the previous count weighted by the part of the previous
//! window still inside the sliding window:
//!
//! ```text
//! estimate = previous * (length - elapsed) / length + current,   elapsed = now mod length
//! ```
//!
//! Unlike a fixed window, this does not allow a burst of twice the limit around a window edge:
//! a limit filled at the end of window N still counts almost fully at the start of N+1 and
//! frees up gradually as window N slides out.
//!
//! The Redis script computes the estimate with the same operations in the same order (IEEE
//! doubles both sides), so both backends decide alike.

/// The index of the fixed window `now_ms` falls in.
pub fn index(now_ms: u64, length_ms: u64) -> u64 {
    now_ms / length_ms.max(1)
}

/// Milliseconds since the start of the fixed window `now_ms` falls in.
pub fn elapsed(now_ms: u64, length_ms: u64) -> u64 {
    now_ms % length_ms.max(1)
}

/// The estimated count of the sliding window ending at `now_ms`, from the counts of the
/// current and the previous fixed window.
pub fn estimate(now_ms: u64, length_ms: u64, current: u64, previous: u64) -> f64 {
    let length = length_ms.max(1);
    let elapsed = elapsed(now_ms, length);
    // Keep this expression identical to the Redis script's.
    previous as f64 * (length - elapsed) as f64 / length as f64 + current as f64
}

/// Whether adding `cost` keeps the sliding window within `limit`.
///
/// A cost of 0 is a check only (token limits, charged after the response): it is allowed
/// while the window is not spent, that is while the estimate is below the limit.
pub fn allows(estimate: f64, limit: f64, cost: u64) -> bool {
    if cost == 0 {
        estimate < limit
    } else {
        estimate + cost as f64 <= limit
    }
}

/// Milliseconds from `now_ms` until [`allows`] would hold for `cost` if nothing more were
/// counted: 0 when it holds now; `None` when it never can (a cost above the limit).
pub fn retry_after_ms(
    now_ms: u64,
    length_ms: u64,
    current: u64,
    previous: u64,
    limit: f64,
    cost: u64,
) -> Option<u64> {
    let length = length_ms.max(1);
    if allows(estimate(now_ms, length, current, previous), limit, cost) {
        return Some(0);
    }
    // The largest estimate that allows the cost (a check only must get below it).
    let target = limit - cost as f64;
    if target < 0.0 || (cost == 0 && limit <= 0.0) {
        return None;
    }
    let w = length as f64;
    let e = elapsed(now_ms, length) as f64;
    let (cur, prev) = (current as f64, previous as f64);
    let wait = if cur <= target {
        // Within this window: prev * (w - e') / w + cur <= target.
        // prev > 0 here, or the estimate would already be at most the target.
        let e_needed = w - (target - cur) * w / prev.max(f64::MIN_POSITIVE);
        (e_needed - e).max(0.0)
    } else {
        // This window's count alone is too much: wait for the next window, where it becomes
        // the previous count: cur * (w - e') / w <= target.
        let e_needed = w - target * w / cur;
        (w - e) + e_needed.max(0.0)
    };
    // The closed form is exact in real numbers; settle the last millisecond (rounding, and the
    // strict comparison of a check only) against `allows` itself.
    let allowed_after = |wait: u64| {
        let t = now_ms + wait;
        let (cur, prev) = match index(t, length) - index(now_ms, length) {
            0 => (current, previous),
            1 => (0, current),
            _ => (0, 0),
        };
        allows(estimate(t, length, cur, prev), limit, cost)
    };
    let mut wait = (wait.ceil() as u64).min(2 * length);
    while !allowed_after(wait) && wait < 2 * length {
        wait += 1;
    }
    while wait > 0 && allowed_after(wait - 1) {
        wait -= 1;
    }
    Some(wait)
}

/// Whole seconds for a `retry-after` header: [`retry_after_ms`] rounded up, at least 1; a cost
/// that can never be allowed waits one window.
pub fn retry_after_secs(
    now_ms: u64,
    length_ms: u64,
    current: u64,
    previous: u64,
    limit: f64,
    cost: u64,
) -> u64 {
    let ms = retry_after_ms(now_ms, length_ms, current, previous, limit, cost).unwrap_or(length_ms);
    ms.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    /// A fixed-window counter driven through time with the module's functions, as a backend
    /// would: rolls the current count into the previous one when a window passes.
    struct Counter {
        length: u64,
        index: u64,
        current: u64,
        previous: u64,
        limit: f64,
    }

    impl Counter {
        fn new(length: u64, limit: f64) -> Self {
            Counter {
                length,
                index: 0,
                current: 0,
                previous: 0,
                limit,
            }
        }

        fn roll(&mut self, now: u64) {
            let i = index(now, self.length);
            if i == self.index + 1 {
                self.previous = self.current;
                self.current = 0;
            } else if i > self.index + 1 {
                self.previous = 0;
                self.current = 0;
            }
            self.index = i;
        }

        fn hit(&mut self, now: u64, cost: u64) -> bool {
            self.roll(now);
            let ok = allows(
                estimate(now, self.length, self.current, self.previous),
                self.limit,
                cost,
            );
            if ok {
                self.current += cost;
            }
            ok
        }

        fn retry(&mut self, now: u64, cost: u64) -> Option<u64> {
            self.roll(now);
            retry_after_ms(
                now,
                self.length,
                self.current,
                self.previous,
                self.limit,
                cost,
            )
        }
    }

    #[test]
    fn index_and_elapsed() {
        assert_eq!(index(0, MIN), 0);
        assert_eq!(index(59_999, MIN), 0);
        assert_eq!(index(60_000, MIN), 1);
        assert_eq!(elapsed(61_500, MIN), 1_500);
        // A zero length is treated as 1 ms rather than dividing by zero.
        assert_eq!(index(5, 0), 5);
    }

    #[test]
    fn estimate_weights_the_previous_window() {
        assert_eq!(estimate(60_000, MIN, 0, 10), 10.0);
        assert_eq!(estimate(90_000, MIN, 0, 10), 5.0);
        assert_eq!(estimate(90_000, MIN, 3, 10), 8.0);
        assert_eq!(estimate(119_999, MIN, 0, 60_000), 1.0);
    }

    #[test]
    fn allows_requests_up_to_the_limit_and_checks_below_it() {
        assert!(allows(9.0, 10.0, 1));
        assert!(!allows(9.5, 10.0, 1));
        assert!(allows(9.99, 10.0, 0));
        assert!(!allows(10.0, 10.0, 0));
        assert!(!allows(0.0, 0.0, 1), "a zero limit refuses everything");
    }

    #[test]
    fn no_double_burst_at_a_window_edge() {
        let mut c = Counter::new(MIN, 10.0);
        // Fill the limit at the very end of window 0.
        for _ in 0..10 {
            assert!(c.hit(59_900, 1));
        }
        assert!(!c.hit(59_950, 1));
        // A fixed window would allow 10 more at the start of window 1: the sliding one refuses.
        assert!(!c.hit(60_100, 1));
        assert!(!c.hit(65_999, 1));
        // One slot frees when a tenth of window 0 has slid out (at 66 s), not before.
        assert_eq!(c.retry(60_100, 1), Some(5_900));
        assert!(c.hit(66_000, 1));
        assert!(!c.hit(66_000, 1));
        // Halfway through window 1 half of window 0 still counts: 5 + 1 already taken.
        let allowed = (0..10).filter(|_| c.hit(90_000, 1)).count();
        assert_eq!(allowed, 4);
    }

    #[test]
    fn old_windows_slide_out_completely() {
        let mut c = Counter::new(MIN, 10.0);
        for _ in 0..10 {
            assert!(c.hit(30_000, 1));
        }
        assert!(!c.hit(59_999, 1));
        // Two windows later nothing of window 0 counts.
        let allowed = (0..11).filter(|_| c.hit(120_000, 1)).count();
        assert_eq!(allowed, 10);
    }

    #[test]
    fn retry_after_waits_for_the_next_window_when_this_one_is_full() {
        let mut c = Counter::new(MIN, 10.0);
        for _ in 0..10 {
            assert!(c.hit(10_000, 1));
        }
        // cur = 10 > 9: wait 50 s for window 1, then until 10 * (60 - e) / 60 <= 9: e = 6 s.
        assert_eq!(c.retry(10_000, 1), Some(56_000));
        assert!(!c.hit(65_999, 1));
        assert!(c.hit(66_000, 1));
    }

    #[test]
    fn retry_after_is_exact_for_checks_only() {
        // A token limit of 1000 per minute, fully spent in window 0.
        let mut c = Counter::new(MIN, 1_000.0);
        assert!(c.hit(1_000, 0));
        c.current = 1_000;
        assert!(!c.hit(1_000, 0));
        // Strictly below the limit one millisecond into window 1.
        let wait = c.retry(1_000, 0).expect("possible");
        assert_eq!(wait, 59_001);
        assert!(!c.hit(60_000, 0));
        assert!(c.hit(1_000 + wait, 0));
    }

    #[test]
    fn retry_after_secs_rounds_up_and_is_at_least_one() {
        assert_eq!(retry_after_secs(60_100, MIN, 0, 10, 10.0, 1), 6);
        // Allowed now: still at least 1 for a header.
        assert_eq!(retry_after_secs(0, MIN, 0, 0, 10.0, 1), 1);
        // Never allowed (cost above the limit): one window.
        assert_eq!(retry_after_ms(0, MIN, 0, 0, 0.0, 1), None);
        assert_eq!(retry_after_secs(0, MIN, 0, 0, 0.0, 1), 60);
        assert_eq!(retry_after_secs(0, 3_600_000, 5, 0, 0.5, 1), 3_600);
    }

    #[test]
    fn retry_after_is_when_the_request_is_allowed() {
        // Property: for many states, waiting exactly retry_after allows, one ms less does not.
        let limits = [1.0, 3.0, 10.0, 7.5];
        for &limit in &limits {
            for previous in 0..12u64 {
                for current in 0..12u64 {
                    for now in [60_000u64, 60_001, 75_000, 100_000, 119_999] {
                        for cost in [0u64, 1] {
                            let Some(wait) =
                                retry_after_ms(now, MIN, current, previous, limit, cost)
                            else {
                                continue;
                            };
                            let at = |t: u64| {
                                // Past the window the counts roll like a backend's would.
                                let (cur, prev) = match index(t, MIN) - index(now, MIN) {
                                    0 => (current, previous),
                                    1 => (0, current),
                                    _ => (0, 0),
                                };
                                allows(estimate(t, MIN, cur, prev), limit, cost)
                            };
                            assert!(
                                at(now + wait),
                                "limit {limit} cur {current} prev {previous} now {now} cost {cost}: \
                                 not allowed after {wait} ms"
                            );
                            if wait > 0 {
                                assert!(
                                    !at(now + wait - 1),
                                    "limit {limit} cur {current} prev {previous} now {now} \
                                     cost {cost}: allowed before {wait} ms"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// With nothing more counted, the sliding window's estimate never grows as time goes
        /// on, and once the wait `retry_after_ms` names has passed the cost is allowed.
        #[test]
        fn windows_slide_monotonically_and_retry_after_is_enough(
            length in 1u64..120_000,
            now in 0u64..10_000_000,
            step in 0u64..300_000,
            current in 0u64..50,
            previous in 0u64..50,
            limit in 1u64..60,
            cost in 0u64..5,
        ) {
            let at = |t: u64| {
                // The counts as they stand at `t`: windows roll over.
                match index(t, length) - index(now, length) {
                    0 => estimate(t, length, current, previous),
                    1 => estimate(t, length, 0, current),
                    _ => 0.0,
                }
            };
            proptest::prop_assert!(at(now + step) <= at(now) + 1e-9);
            if let Some(wait) = retry_after_ms(now, length, current, previous, limit as f64, cost) {
                proptest::prop_assert!(
                    allows(at(now + wait), limit as f64 + 1e-9, cost),
                    "after {} ms: {}", wait, at(now + wait)
                );
            }
        }
    }
}
