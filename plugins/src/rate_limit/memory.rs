//! The in-process counter backend (the embedded default): exact within one gateway instance.
//!
//! Counters live in a fixed number of shards, each a `Mutex<HashMap>`, so that requests
//! charging different counters rarely wait on each other. A call that spans several shards
//! locks them in ascending order (no deadlock) and holds them while it checks and charges, so
//! the all-or-nothing decision is atomic. No lock is held across an `.await`.
//!
//! Memory stays bounded: a counter whose two windows are both over (older than twice its
//! window) counts nothing and is dropped, by a sweep of its shard every so many operations
//! (amortised) and of every shard when `max_counters` live counters exist. If there is still no
//! room, a request that needs a new counter is refused ([`Decision::Full`]: a store a
//! client can fill with made-up metadata values must not stop counting) and nothing is
//! charged.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use plugin_sdk::{FastMap, FastState};

use super::counters::{latest_refusal, CounterError, CounterSpec, Counters, Decision};
use crate::limits::window;

/// A full store sweeps every shard at most this often.
const FULL_SWEEP_EVERY_MS: u64 = 1_000;

/// Shards at most; fewer when `max_counters` is smaller.
const SHARDS: usize = 64;

/// One counter: the counts of its current and previous fixed window.
#[derive(Debug, Clone, Copy)]
struct Entry {
    length_ms: u64,
    /// The fixed window `current` counts.
    index: u64,
    current: u64,
    previous: u64,
}

impl Entry {
    fn new(length_ms: u64, now_ms: u64) -> Entry {
        Entry {
            length_ms,
            index: window::index(now_ms, length_ms),
            current: 0,
            previous: 0,
        }
    }

    /// `(now, current, previous)` as of `now_ms`, without changing the entry. A clock that went
    /// back is read as the start of the entry's window (the most conservative estimate).
    fn counts_at(&self, now_ms: u64, length_ms: u64) -> (u64, u64, u64) {
        if self.length_ms != length_ms {
            // The limit's window changed (a policy's unit was updated): start afresh.
            return (now_ms, 0, 0);
        }
        let now_ms = now_ms.max(self.index.saturating_mul(length_ms));
        let i = window::index(now_ms, length_ms);
        match i.saturating_sub(self.index) {
            0 => (now_ms, self.current, self.previous),
            1 => (now_ms, 0, self.current),
            _ => (now_ms, 0, 0),
        }
    }

    /// Brings the entry to `now_ms`'s window (same rules as [`Entry::counts_at`]) and adds `cost`.
    fn charge(&mut self, now_ms: u64, length_ms: u64, cost: u64) {
        let (now_ms, current, previous) = self.counts_at(now_ms, length_ms);
        *self = Entry {
            length_ms,
            index: window::index(now_ms, length_ms),
            current: current.saturating_add(cost),
            previous,
        };
    }

    /// Whether both of its windows are over: it counts nothing any more.
    fn is_dead(&self, now_ms: u64) -> bool {
        window::index(now_ms, self.length_ms) > self.index.saturating_add(1)
    }
}

#[derive(Default)]
struct Shard {
    map: FastMap<String, Entry>,
    /// Operations since the last sweep.
    ops: usize,
}

impl Shard {
    /// Drops the dead counters; returns how many.
    fn sweep(&mut self, now_ms: u64) -> usize {
        let before = self.map.len();
        self.map.retain(|_, e| !e.is_dead(now_ms));
        self.ops = 0;
        before - self.map.len()
    }

    /// Counts an operation; sweeps when as many operations as entries have passed (amortised
    /// O(1) per operation). Returns how many counters were dropped.
    fn tick(&mut self, now_ms: u64) -> usize {
        self.ops += 1;
        if self.ops >= self.map.len().max(1024) {
            self.sweep(now_ms)
        } else {
            0
        }
    }
}

/// Sliding-window counters in this process's memory.
pub struct MemoryCounters {
    shards: Box<[Mutex<Shard>]>,
    /// Live counters at most.
    max_counters: usize,
    /// Live counters now (stored and not yet swept).
    live: AtomicUsize,
    /// When a full store last swept every shard (ms): at most once a second, so that a store
    /// kept full by made-up values does not cost every request a sweep of every counter.
    last_full_sweep_ms: AtomicU64,
    hasher: FastState,
}

impl MemoryCounters {
    /// Counters for at most `max_counters` live counters (at least 1).
    pub fn new(max_counters: usize) -> MemoryCounters {
        let max_counters = max_counters.max(1);
        MemoryCounters {
            shards: (0..SHARDS.min(max_counters))
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            max_counters,
            live: AtomicUsize::new(0),
            last_full_sweep_ms: AtomicU64::new(0),
            hasher: FastState::default(),
        }
    }

    /// Takes room for `n` new counters, sweeping every shard first when full; `false` when
    /// there is still no room. Called without any shard locked.
    fn reserve(&self, n: usize, now_ms: u64) -> bool {
        if n == 0 {
            return true;
        }
        for attempt in 0..2 {
            let before = self.live.fetch_add(n, Ordering::AcqRel);
            if before + n <= self.max_counters {
                return true;
            }
            self.live.fetch_sub(n, Ordering::AcqRel);
            let last = self.last_full_sweep_ms.load(Ordering::Relaxed);
            let due = now_ms.saturating_sub(last) >= FULL_SWEEP_EVERY_MS
                && self
                    .last_full_sweep_ms
                    .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok();
            if attempt == 0 && due {
                for s in 0..self.shards.len() {
                    let dropped = self.lock(s).sweep(now_ms);
                    self.live.fetch_sub(dropped, Ordering::AcqRel);
                }
            }
        }
        false
    }

    /// Gives back room taken by [`MemoryCounters::reserve`] and not used.
    fn release(&self, n: usize) {
        if n > 0 {
            self.live.fetch_sub(n, Ordering::AcqRel);
        }
    }

    fn shard_of(&self, id: &str) -> usize {
        (self.hasher.hash_one(id) % self.shards.len() as u64) as usize
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // A panic while a shard was locked leaves whole entries behind: keep using it.
        self.shards[shard]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Live counters (those not yet swept), for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        (0..self.shards.len()).map(|s| self.lock(s).map.len()).sum()
    }

    /// The check and charge, synchronous (nothing here waits on I/O).
    pub fn check_and_charge_now(
        &self,
        specs: &[CounterSpec],
        now_ms: u64,
    ) -> Result<Decision, CounterError> {
        // Room for every counter this call may create, taken before any shard is locked (a
        // full store sweeps every shard). What is not used is given back below.
        let may_create = specs.iter().filter(|s| s.cost > 0).count();
        let mut reserved = may_create;
        let full = self.live.load(Ordering::Acquire) >= self.max_counters;
        if full || !self.reserve(may_create, now_ms) {
            // Full: counters that exist keep counting; only a request that needs new ones is
            // refused, token limits (checked at cost 0, charged after the answer) included.
            reserved = specs
                .iter()
                .filter(|s| !self.lock(self.shard_of(&s.id)).map.contains_key(&s.id))
                .count();
            if !self.reserve(reserved, now_ms) {
                return Ok(Decision::Full {
                    max_counters: self.max_counters,
                });
            }
        }

        let shard_of: Vec<usize> = specs.iter().map(|s| self.shard_of(&s.id)).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        // Ascending order: two calls never wait on each other in a cycle.
        let mut guards: Vec<MutexGuard<'_, Shard>> = order.iter().map(|&s| self.lock(s)).collect();
        let slot = |i: usize| {
            order
                .binary_search(&shard_of[i])
                .expect("every spec's shard is locked")
        };

        let mut refusals = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let length = spec.window_ms();
            let (now, current, previous) = match guards[slot(i)].map.get(&spec.id) {
                Some(e) => e.counts_at(now_ms, length),
                None => (now_ms, 0, 0),
            };
            let estimate = window::estimate(now, length, current, previous);
            if !window::allows(estimate, spec.limit, spec.cost) {
                let secs =
                    window::retry_after_secs(now, length, current, previous, spec.limit, spec.cost);
                refusals.push((i, secs));
            }
        }
        let decision = latest_refusal(refusals);
        let mut created = 0;
        if decision.is_none() {
            for (i, spec) in specs.iter().enumerate() {
                if spec.cost == 0 {
                    continue;
                }
                let length = spec.window_ms();
                let shard = &mut guards[slot(i)];
                match shard.map.get_mut(&spec.id) {
                    Some(e) => e.charge(now_ms, length, spec.cost),
                    None => {
                        let mut e = Entry::new(length, now_ms);
                        e.charge(now_ms, length, spec.cost);
                        shard.map.insert(spec.id.clone(), e);
                        created += 1;
                    }
                }
            }
        }
        let dropped: usize = guards.iter_mut().map(|g| g.tick(now_ms)).sum();
        drop(guards);
        // A counter swept since it was counted as existing was made again: it takes room too.
        if created > reserved {
            self.live.fetch_add(created - reserved, Ordering::AcqRel);
        }
        self.release(reserved.saturating_sub(created) + dropped);
        Ok(decision.unwrap_or(Decision::Allowed))
    }

    /// The charge, synchronous.
    pub fn charge_now(
        &self,
        id: &str,
        window_secs: u64,
        amount: u64,
        now_ms: u64,
    ) -> Result<(), CounterError> {
        if amount == 0 {
            return Ok(());
        }
        if !self.reserve(1, now_ms) {
            return Err(CounterError(format!(
                "the in-process rate limit counters are full ({} live counters; raise max_counters)",
                self.max_counters
            )));
        }
        let length = window_secs.saturating_mul(1000).max(1);
        let mut shard = self.lock(self.shard_of(id));
        let mut unused = 1;
        match shard.map.get_mut(id) {
            Some(e) => e.charge(now_ms, length, amount),
            None => {
                let mut e = Entry::new(length, now_ms);
                e.charge(now_ms, length, amount);
                shard.map.insert(id.to_owned(), e);
                unused = 0;
            }
        }
        let dropped = shard.tick(now_ms);
        drop(shard);
        self.release(unused + dropped);
        Ok(())
    }
}

#[async_trait]
impl Counters for MemoryCounters {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn check_and_charge(
        &self,
        specs: &[CounterSpec],
        now_ms: u64,
    ) -> Result<Decision, CounterError> {
        self.check_and_charge_now(specs, now_ms)
    }

    async fn charge(
        &self,
        id: &str,
        window_secs: u64,
        amount: u64,
        now_ms: u64,
    ) -> Result<(), CounterError> {
        self.charge_now(id, window_secs, amount, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const T0: u64 = 1_700_000_080_000; // 40 s into a minute.

    fn req(id: &str, limit: f64) -> CounterSpec {
        CounterSpec {
            id: id.into(),
            window_secs: 60,
            limit,
            cost: 1,
        }
    }

    fn tokens(id: &str, limit: f64) -> CounterSpec {
        CounterSpec {
            cost: 0,
            ..req(id, limit)
        }
    }

    #[test]
    fn counts_up_to_the_limit_then_refuses_with_retry_after() {
        let c = MemoryCounters::new(100);
        for _ in 0..3 {
            assert_eq!(
                c.check_and_charge_now(&[req("a", 3.0)], T0).unwrap(),
                Decision::Allowed
            );
        }
        match c.check_and_charge_now(&[req("a", 3.0)], T0).unwrap() {
            Decision::Limited {
                spec,
                retry_after_secs,
            } => {
                assert_eq!(spec, 0);
                // 20 s to the next window, then a third of it (20 s) for one of 3 to slide out.
                assert_eq!(retry_after_secs, 40);
            }
            other => panic!("{other:?}"),
        }
        // Other counters are independent.
        assert_eq!(
            c.check_and_charge_now(&[req("b", 3.0)], T0).unwrap(),
            Decision::Allowed
        );
        // Allowed again once the window slid far enough.
        assert_eq!(
            c.check_and_charge_now(&[req("a", 3.0)], T0 + 40_000)
                .unwrap(),
            Decision::Allowed
        );
    }

    #[test]
    fn all_or_nothing() {
        let c = MemoryCounters::new(100);
        // Spend "b" so that a request needing both is refused.
        assert_eq!(
            c.check_and_charge_now(&[req("b", 1.0)], T0).unwrap(),
            Decision::Allowed
        );
        let both = [req("a", 5.0), req("b", 1.0)];
        match c.check_and_charge_now(&both, T0).unwrap() {
            Decision::Limited { spec, .. } => assert_eq!(spec, 1),
            other => panic!("{other:?}"),
        }
        // "a" was not charged by the refused request: all 5 are still available.
        let allowed = (0..6)
            .filter(|_| c.check_and_charge_now(&[req("a", 5.0)], T0).unwrap() == Decision::Allowed)
            .count();
        assert_eq!(allowed, 5);
    }

    #[test]
    fn the_refusal_reported_is_the_one_that_frees_last() {
        let c = MemoryCounters::new(100);
        let hour = CounterSpec {
            window_secs: 3_600,
            ..req("h", 1.0)
        };
        let minute = req("m", 1.0);
        assert_eq!(
            c.check_and_charge_now(&[minute.clone(), hour.clone()], T0)
                .unwrap(),
            Decision::Allowed
        );
        match c.check_and_charge_now(&[minute, hour], T0).unwrap() {
            Decision::Limited {
                spec,
                retry_after_secs,
            } => {
                assert_eq!(spec, 1);
                assert!(retry_after_secs > 60, "{retry_after_secs}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn token_limits_check_then_charge() {
        let c = MemoryCounters::new(100);
        let spec = tokens("t", 1_000.0);
        assert_eq!(
            c.check_and_charge_now(std::slice::from_ref(&spec), T0)
                .unwrap(),
            Decision::Allowed
        );
        // Checking charges nothing.
        assert_eq!(c.len(), 0);
        c.charge_now("t", 60, 600, T0).unwrap();
        assert_eq!(
            c.check_and_charge_now(std::slice::from_ref(&spec), T0)
                .unwrap(),
            Decision::Allowed
        );
        c.charge_now("t", 60, 600, T0).unwrap();
        // 1200 of 1000 spent: refused until it slides below the limit.
        assert!(matches!(
            c.check_and_charge_now(std::slice::from_ref(&spec), T0)
                .unwrap(),
            Decision::Limited { .. }
        ));
        // Next window, 1200 * (60 - e) / 60 < 1000 from e = 10 s on.
        assert!(matches!(
            c.check_and_charge_now(std::slice::from_ref(&spec), T0 + 20_000 + 9_999)
                .unwrap(),
            Decision::Limited { .. }
        ));
        assert_eq!(
            c.check_and_charge_now(&[spec], T0 + 20_000 + 10_001)
                .unwrap(),
            Decision::Allowed
        );
    }

    #[test]
    fn a_changed_window_starts_afresh() {
        let c = MemoryCounters::new(100);
        assert_eq!(
            c.check_and_charge_now(&[req("a", 1.0)], T0).unwrap(),
            Decision::Allowed
        );
        assert!(matches!(
            c.check_and_charge_now(&[req("a", 1.0)], T0).unwrap(),
            Decision::Limited { .. }
        ));
        let hourly = CounterSpec {
            window_secs: 3_600,
            ..req("a", 1.0)
        };
        assert_eq!(
            c.check_and_charge_now(&[hourly], T0).unwrap(),
            Decision::Allowed
        );
    }

    #[test]
    fn dead_counters_are_evicted_and_memory_is_bounded() {
        let c = MemoryCounters::new(4);
        for i in 0..4 {
            assert_eq!(
                c.check_and_charge_now(&[req(&format!("k{i}"), 10.0)], T0)
                    .unwrap(),
                Decision::Allowed
            );
        }
        assert_eq!(c.len(), 4);
        // Full: a fifth counter cannot be created now...
        assert_eq!(
            c.check_and_charge_now(&[req("k4", 10.0)], T0).unwrap(),
            Decision::Full { max_counters: 4 }
        );
        // ...and nothing was charged by that refused call.
        assert_eq!(c.len(), 4);
        assert_eq!(c.live.load(Ordering::Relaxed), 4);
        // Two windows later the old counters are dead and make room.
        assert_eq!(
            c.check_and_charge_now(&[req("k4", 10.0)], T0 + 120_000)
                .unwrap(),
            Decision::Allowed
        );
        assert!(c.len() <= 4, "{}", c.len());
        // A counter still inside its previous window is not evicted.
        let c = MemoryCounters::new(1);
        c.charge_now("x", 60, 1, T0).unwrap();
        assert!(c.charge_now("y", 60, 1, T0 + 30_000).is_err());
        c.charge_now("y", 60, 1, T0 + 80_000).unwrap();
    }

    #[test]
    fn periodic_sweeps_drop_dead_counters() {
        let c = MemoryCounters::new(1_000_000);
        for i in 0..500 {
            c.charge_now(&format!("old{i}"), 60, 1, T0).unwrap();
        }
        assert_eq!(c.len(), 500);
        assert_eq!(c.live.load(Ordering::Relaxed), 500);
        // Enough operations much later that every shard sweeps at least once.
        // (Many distinct ids, so that every shard is used.)
        for i in 0..200_000 {
            c.charge_now(&format!("new{}", i % 4096), 60, 1, T0 + 600_000)
                .unwrap();
        }
        assert_eq!(c.len(), 4096);
        assert_eq!(
            c.live.load(Ordering::Relaxed),
            4096,
            "the live count follows"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn exactly_the_limit_passes_under_concurrency() {
        let c = Arc::new(MemoryCounters::new(1_000));
        let tasks: Vec<_> = (0..400)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    // Half the requests also count against a second, roomier limit.
                    let mut specs = vec![req("shared", 50.0)];
                    if i % 2 == 0 {
                        specs.push(req("side", 1_000.0));
                    }
                    c.check_and_charge(&specs, T0).await.unwrap() == Decision::Allowed
                })
            })
            .collect();
        let mut allowed = 0;
        for t in tasks {
            if t.await.unwrap() {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 50);
    }
}
