//! Budget counters: the [`Ledger`] trait and its in-process backend ([`MemoryLedger`]); the
//! Redis backend is in `redis.rs`.
//!
//! Each counter holds two numbers: `used` (settled spend) and `held` (reservations of requests
//! in flight). A counter that does not exist yet starts with `used` = its seed (what the
//! control plane had counted), so a restart does not forget spend.
//!
//! - `reserve`: for all the request's counters at once, or none: refused when for any counter
//!   `used + held >= limit` or `used + held + amount > limit`; else `held += amount` on each.
//! - `settle`: `used += actual`, `held -= reserved` (never below zero).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use plugin_sdk::FastMap;

/// Slack for sums of dollar amounts that are not exact in binary (ten reservations of 0.1
/// against a limit of 1 must all pass).
pub const EPSILON: f64 = 1e-9;

/// One counter to reserve against.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    pub key: String,
    /// `used` of a counter that does not exist yet.
    pub seed: f64,
    pub amount: f64,
    /// The credit limit, read from the snapshot on every request.
    pub limit: f64,
    /// How long an unused counter is kept; `None`: for ever (a lifetime budget).
    pub ttl: Option<Duration>,
}

/// One counter to settle.
#[derive(Debug, Clone, PartialEq)]
pub struct Settle {
    pub key: String,
    pub seed: f64,
    /// The request's real spend.
    pub actual: f64,
    /// What its reservation held (0 when nothing was reserved).
    pub reserved: f64,
    pub ttl: Option<Duration>,
}

/// The outcome of a reservation.
#[derive(Debug, Clone, PartialEq)]
pub enum Reserve {
    /// Every counter holds its amount.
    Held,
    /// Nothing was reserved: the counter at `index` (of the holds given) has no room.
    Refused { index: usize, used: f64, held: f64 },
    /// Nothing was reserved: the in-process store holds `max_counters` counters and the
    /// request needs new ones (a store a client can fill must not stop counting).
    Full { max_counters: usize },
}

/// Where budget counters live. Every method is atomic over all the counters it is given.
#[async_trait]
pub trait Ledger: Send + Sync {
    /// Reserves every hold, or none.
    async fn reserve(&self, holds: &[Hold]) -> Result<Reserve, String>;

    /// Settles every item; returns each counter's `used` afterwards, in order. `token` names
    /// this settlement: settling again with the same token (a retry after a lost reply)
    /// changes nothing.
    async fn settle(&self, token: &str, items: &[Settle]) -> Result<Vec<f64>, String>;

    /// Settles without waiting, when this ledger can (it is in-process): `None` when the
    /// caller must run [`settle`](Ledger::settle) on a task instead.
    fn settle_now(&self, _items: &[Settle]) -> Option<Result<Vec<f64>, String>> {
        None
    }

    /// `memory` or `redis`, for logs.
    fn name(&self) -> &'static str;

    /// The Redis ledger, whose reservation joins shared mode's one-round-trip admission
    /// ([`crate::limits::admission`]); `None` for the others.
    fn redis(&self) -> Option<&super::redis::RedisLedger> {
        None
    }
}

/// Whether a counter with `used` and `held` has room for `amount` more under `limit`.
pub fn has_room(used: f64, held: f64, amount: f64, limit: f64) -> bool {
    let current = used + held;
    current < limit - EPSILON && current + amount <= limit + EPSILON
}

#[derive(Debug, Clone, Copy)]
struct Counter {
    used: f64,
    held: f64,
    /// `None`: kept for ever.
    expires: Option<Instant>,
}

/// In-process counters: exact for one instance (one lock over all of them, held for a few
/// map operations), not shared between instances.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    inner: Mutex<MemoryInner>,
}

#[derive(Debug)]
struct MemoryInner {
    counters: FastMap<String, Counter>,
    ops: u64,
    /// The most counters kept: a policy grouped by a client-chosen value (`metadata._user`)
    /// must not grow memory without bound.
    max_counters: usize,
    /// When a full ledger last swept every counter: at most once a second, so that a ledger
    /// kept full by made-up values does not cost every request a sweep.
    last_full_sweep: Option<Instant>,
}

/// The in-process ledger's default bound on counters.
pub const DEFAULT_MAX_COUNTERS: usize = 1_000_000;

impl Default for MemoryInner {
    fn default() -> Self {
        MemoryInner {
            counters: FastMap::default(),
            ops: 0,
            max_counters: DEFAULT_MAX_COUNTERS,
            last_full_sweep: None,
        }
    }
}

/// Expired counters are swept every this many operations.
const SWEEP_EVERY: u64 = 4096;

impl MemoryInner {
    fn counter(
        &mut self,
        key: &str,
        seed: f64,
        ttl: Option<Duration>,
        now: Instant,
    ) -> &mut Counter {
        let fresh = Counter {
            used: seed,
            held: 0.0,
            expires: ttl.map(|t| now + t),
        };
        let c = self.counters.entry(key.to_owned()).or_insert(fresh);
        if c.expires.is_some_and(|e| e <= now) {
            *c = fresh;
        }
        c
    }

    fn tick(&mut self, now: Instant) {
        self.ops += 1;
        if self.ops.is_multiple_of(SWEEP_EVERY) {
            self.counters
                .retain(|_, c| c.expires.is_none_or(|e| e > now));
        }
    }

    /// Room for the counters `holds` would add; sweeps expired ones when the bound is reached.
    fn room_for(&mut self, holds: &[Hold], now: Instant) -> bool {
        let new = holds
            .iter()
            .filter(|h| !self.counters.contains_key(&h.key))
            .count();
        if self.counters.len() + new <= self.max_counters {
            return true;
        }
        if self
            .last_full_sweep
            .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
        {
            return false;
        }
        self.last_full_sweep = Some(now);
        self.counters
            .retain(|_, c| c.expires.is_none_or(|e| e > now));
        self.counters.len() + new <= self.max_counters
    }

    fn reserve(&mut self, holds: &[Hold], now: Instant) -> Reserve {
        self.tick(now);
        for (index, h) in holds.iter().enumerate() {
            let c = *self.counter(&h.key, h.seed, h.ttl, now);
            if !has_room(c.used, c.held, h.amount, h.limit) {
                return Reserve::Refused {
                    index,
                    used: c.used,
                    held: c.held,
                };
            }
        }
        for h in holds {
            let c = self.counter(&h.key, h.seed, h.ttl, now);
            c.held += h.amount;
            c.expires = h.ttl.map(|t| now + t);
        }
        Reserve::Held
    }

    fn settle(&mut self, items: &[Settle], now: Instant) -> Vec<f64> {
        self.tick(now);
        items
            .iter()
            .map(|s| {
                let c = self.counter(&s.key, s.seed, s.ttl, now);
                c.used += s.actual;
                c.held = (c.held - s.reserved).max(0.0);
                c.expires = s.ttl.map(|t| now + t);
                c.used
            })
            .collect()
    }
}

impl MemoryLedger {
    pub fn new() -> MemoryLedger {
        MemoryLedger::default()
    }

    /// A ledger that keeps at most `max_counters` counters; a reservation that needs more (after
    /// expired ones are swept) is refused ([`Reserve::Full`]).
    pub fn with_max_counters(max_counters: usize) -> MemoryLedger {
        MemoryLedger {
            inner: Mutex::new(MemoryInner {
                max_counters: max_counters.max(1),
                ..MemoryInner::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        // A panic while holding the lock leaves consistent numbers (each step is one
        // assignment): keep counting.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `(used, held)` of a counter, if it exists (tests, diagnostics).
    pub fn get(&self, key: &str) -> Option<(f64, f64)> {
        self.lock().counters.get(key).map(|c| (c.used, c.held))
    }
}

#[async_trait]
impl Ledger for MemoryLedger {
    async fn reserve(&self, holds: &[Hold]) -> Result<Reserve, String> {
        let now = Instant::now();
        let mut inner = self.lock();
        if !inner.room_for(holds, now) {
            return Ok(Reserve::Full {
                max_counters: inner.max_counters,
            });
        }
        Ok(inner.reserve(holds, now))
    }

    async fn settle(&self, _token: &str, items: &[Settle]) -> Result<Vec<f64>, String> {
        // In-process settlements cannot lose their reply: nothing is ever retried.
        Ok(self.lock().settle(items, Instant::now()))
    }

    fn settle_now(&self, items: &[Settle]) -> Option<Result<Vec<f64>, String>> {
        Some(Ok(self.lock().settle(items, Instant::now())))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    fn hold(key: &str, amount: f64, limit: f64) -> Hold {
        Hold {
            key: key.into(),
            seed: 0.0,
            amount,
            limit,
            ttl: None,
        }
    }

    fn settle(key: &str, actual: f64, reserved: f64) -> Settle {
        Settle {
            key: key.into(),
            seed: 0.0,
            actual,
            reserved,
            ttl: None,
        }
    }

    #[test]
    fn room_is_checked_with_slack_for_dollar_sums() {
        assert!(has_room(0.0, 0.0, 1.0, 1.0));
        assert!(!has_room(0.0, 0.0, 1.1, 1.0));
        assert!(
            !has_room(1.0, 0.0, 0.0, 1.0),
            "a spent budget refuses even a free request"
        );
        let mut sum = 0.0;
        for _ in 0..9 {
            sum += 0.1;
        }
        assert!(has_room(sum, 0.0, 0.1, 1.0));
    }

    #[tokio::test]
    async fn reserve_is_all_or_nothing_and_seeds_new_counters() {
        let l = MemoryLedger::new();
        let mut a = hold("a", 1.0, 10.0);
        a.seed = 8.0;
        let b = hold("b", 1.0, 1.0);
        assert_eq!(
            l.reserve(&[a.clone(), b.clone()]).await.unwrap(),
            Reserve::Held
        );
        assert_eq!(l.get("a"), Some((8.0, 1.0)));
        // b is full: a must not move.
        assert_eq!(
            l.reserve(&[a.clone(), b.clone()]).await.unwrap(),
            Reserve::Refused {
                index: 1,
                used: 0.0,
                held: 1.0
            }
        );
        assert_eq!(l.get("a"), Some((8.0, 1.0)));
        // The seed only applies to a counter that does not exist yet.
        let mut again = a.clone();
        again.seed = 0.0;
        assert_eq!(l.reserve(&[again]).await.unwrap(), Reserve::Held);
        assert_eq!(l.get("a"), Some((8.0, 2.0)));
    }

    #[tokio::test]
    async fn settle_moves_reservations_to_spend() {
        let l = MemoryLedger::new();
        l.reserve(&[hold("k", 5.0, 10.0)]).await.unwrap();
        assert_eq!(
            l.settle("t", &[settle("k", 2.0, 5.0)]).await.unwrap(),
            vec![2.0]
        );
        assert_eq!(l.get("k"), Some((2.0, 0.0)));
        // Held never goes below zero (a counter that expired in between).
        assert_eq!(
            l.settle_now(&[settle("k", 1.0, 5.0)]).unwrap().unwrap(),
            vec![3.0]
        );
        assert_eq!(l.get("k"), Some((3.0, 0.0)));
    }

    #[tokio::test]
    async fn expired_counters_start_again_from_their_seed() {
        let l = MemoryLedger::new();
        let mut h = hold("k", 1.0, 10.0);
        h.ttl = Some(Duration::from_millis(20));
        l.reserve(&[h.clone()]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
        h.seed = 4.0;
        l.reserve(&[h]).await.unwrap();
        assert_eq!(l.get("k"), Some((4.0, 1.0)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_reservations_never_overspend() {
        let l = Arc::new(MemoryLedger::new());
        let granted = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let (l, granted) = (l.clone(), granted.clone());
            tasks.push(tokio::spawn(async move {
                let holds = [hold("shared", 1.0, 37.0), hold("other", 0.5, 1000.0)];
                if l.reserve(&holds).await.unwrap() == Reserve::Held {
                    granted.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(granted.load(Ordering::SeqCst), 37);
        assert_eq!(l.get("shared"), Some((0.0, 37.0)));
        // Only the granted requests hold on the other counter.
        assert_eq!(l.get("other"), Some((0.0, 18.5)));
    }

    #[tokio::test]
    async fn the_counters_are_bounded_and_expired_ones_make_room() {
        let l = MemoryLedger::with_max_counters(2);
        let hold = |key: &str, ttl: Option<Duration>| Hold {
            key: key.into(),
            seed: 0.0,
            amount: 1.0,
            limit: 10.0,
            ttl,
        };
        assert!(l.reserve(&[hold("a", None)]).await.is_ok());
        assert!(l
            .reserve(&[hold("b", Some(Duration::from_millis(1)))])
            .await
            .is_ok());
        // Counters it already has go on at the bound.
        assert!(l.reserve(&[hold("a", None)]).await.is_ok());
        std::thread::sleep(Duration::from_millis(5));
        // `b` expired: swept to make room for `c`.
        assert!(l.reserve(&[hold("c", None)]).await.is_ok());
        assert_eq!(
            l.reserve(&[hold("d", None)]).await.unwrap(),
            Reserve::Full { max_counters: 2 }
        );
        assert!(l.get("b").is_none());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Reserve { counter: usize, amount: f64 },
        Settle { which: usize, actual: f64 },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0usize..3, 0.0f64..6.0).prop_map(|(counter, amount)| Op::Reserve { counter, amount }),
            (0usize..50, 0.0f64..6.0).prop_map(|(which, actual)| Op::Settle { which, actual }),
        ]
    }

    proptest::proptest! {
        /// Under any sequence of reservations and settlements: nothing is held below zero,
        /// what is held is exactly what reservations in flight hold, what is used is exactly
        /// what was settled, and a reservation never takes a counter past its limit.
        #[test]
        fn the_ledger_neither_loses_spend_nor_holds_below_zero(
            ops in proptest::collection::vec(op(), 0..60),
        ) {
            const LIMIT: f64 = 20.0;
            let now = Instant::now();
            let mut inner = MemoryInner::default();
            let keys = ["a", "b", "c"];
            let mut in_flight: Vec<(usize, f64)> = Vec::new();
            let mut used = [0.0f64; 3];
            for op in ops {
                match op {
                    Op::Reserve { counter, amount } => {
                        let h = Hold { key: keys[counter].into(), seed: 0.0, amount, limit: LIMIT, ttl: None };
                        if inner.reserve(std::slice::from_ref(&h), now) == Reserve::Held {
                            in_flight.push((counter, amount));
                            let (u, held) = (inner.counters[keys[counter]].used, inner.counters[keys[counter]].held);
                            proptest::prop_assert!(u + held <= LIMIT + EPSILON || u >= LIMIT - EPSILON);
                        }
                    }
                    Op::Settle { which, actual } => {
                        if in_flight.is_empty() {
                            continue;
                        }
                        let (counter, reserved) = in_flight.remove(which % in_flight.len());
                        let s = Settle { key: keys[counter].into(), seed: 0.0, actual, reserved, ttl: None };
                        inner.settle(std::slice::from_ref(&s), now);
                        used[counter] += actual;
                    }
                }
                for (i, key) in keys.iter().enumerate() {
                    let Some(c) = inner.counters.get(*key) else { continue };
                    let holding: f64 = in_flight.iter().filter(|(k, _)| *k == i).map(|(_, a)| a).sum();
                    proptest::prop_assert!(c.held >= 0.0);
                    proptest::prop_assert!((c.held - holding).abs() < 1e-6, "held {} != {}", c.held, holding);
                    proptest::prop_assert!((c.used - used[i]).abs() < 1e-6);
                }
            }
        }
    }
}
