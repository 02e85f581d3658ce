//! Writes that leave the request path: shared mode's budget settlements and token-limit
//! charges are queued by `on_log` and sent by a background task, many per round trip.
//!
//! The task waits [`LINGER`] after the first job of a batch for others to join it, takes what
//! is queued (at most [`MAX_BATCH`] jobs) and hands it to its flush function, which sends it in
//! one round trip and retries a failure itself; while it waits, new jobs queue behind it. So
//! in normal operation a job is written within [`LINGER`] and two round trips of being queued,
//! and a busy gateway sends one write for many requests. The queue is bounded: when it is full, [`Batches::send`] refuses the job and
//! the caller counts the loss (a budget's reservation then stays held until its counter
//! expires: the loss can only refuse requests early, never let them overspend).
//!
//! At shutdown the gateway exits without running destructors: [`flush_all`] first waits (within
//! a bound) for every queue to be written, and for the other background writers that
//! registered what they hold with [`track`] (budget charges for the control plane, the audit
//! events of refused tokens).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};

/// The most jobs one flush sends.
pub const MAX_BATCH: usize = 128;

/// How long a batch waits for more jobs after its first.
pub const LINGER: Duration = Duration::from_millis(2);

/// The sending side of a batch queue. Dropping it lets the task write what is queued and stop.
pub struct Batches<J> {
    tx: mpsc::Sender<J>,
    /// Jobs queued or being written.
    pending: Arc<AtomicUsize>,
}

/// A background writer's count of what it holds, and what wakes it.
type Tracked = (Weak<AtomicUsize>, Option<Weak<Notify>>);

/// Every live writer's pending count, for [`flush_all`].
fn live() -> &'static Mutex<Vec<Tracked>> {
    static LIVE: OnceLock<Mutex<Vec<Tracked>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
}

static DRAINING: AtomicBool = AtomicBool::new(false);

/// Has [`flush_all`] wait for a background writer too: `pending` counts what it was handed
/// and has not written yet; `wake`, notified when shutdown begins, makes a writer that writes
/// on a timer write at once (it checks [`draining`]).
pub fn track(pending: &Arc<AtomicUsize>, wake: Option<&Arc<Notify>>) {
    if let Ok(mut live) = live().lock() {
        live.retain(|(p, _)| p.strong_count() > 0);
        live.push((Arc::downgrade(pending), wake.map(Arc::downgrade)));
    }
}

/// True once shutdown has begun: writers write what they hold without waiting.
pub fn draining() -> bool {
    DRAINING.load(Ordering::SeqCst)
}

impl<J: Send + 'static> Batches<J> {
    /// Starts the task on `runtime`: it calls `flush` with each batch, one at a time, until
    /// the queue is dropped and empty.
    pub fn start<F, Fut>(runtime: &Handle, capacity: usize, flush: F) -> Batches<J>
    where
        F: FnMut(Vec<J>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (batches, task) = Batches::new(capacity, flush);
        runtime.spawn(task);
        batches
    }

    /// Starts the task on a thread of its own (named `name`), which ends with the task.
    pub fn start_thread<F, Fut>(name: &str, capacity: usize, flush: F) -> Result<Batches<J>, String>
    where
        F: FnMut(Vec<J>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the {name} runtime: {e}"))?;
        let (batches, task) = Batches::new(capacity, flush);
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || runtime.block_on(task))
            .map_err(|e| format!("cannot start the {name} thread: {e}"))?;
        Ok(batches)
    }

    fn new<F, Fut>(
        capacity: usize,
        mut flush: F,
    ) -> (Batches<J>, impl Future<Output = ()> + Send + 'static)
    where
        F: FnMut(Vec<J>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<J>(capacity.max(1));
        let pending = Arc::new(AtomicUsize::new(0));
        track(&pending, None);
        let in_task = pending.clone();
        let task = async move {
            while let Some(first) = rx.recv().await {
                let mut batch = Vec::with_capacity(16);
                batch.push(first);
                tokio::time::sleep(LINGER).await;
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                let n = batch.len();
                flush(batch).await;
                in_task.fetch_sub(n, Ordering::SeqCst);
            }
        };
        (Batches { tx, pending }, task)
    }

    /// Queues `job` without waiting; `false` when the queue is full (or its task is gone).
    pub fn send(&self, job: J) -> bool {
        self.pending.fetch_add(1, Ordering::SeqCst);
        if self.tx.try_send(job).is_ok() {
            return true;
        }
        self.pending.fetch_sub(1, Ordering::SeqCst);
        false
    }
}

/// Waits until every queue is written, for `within` at most; `false` if some were not.
pub fn flush_all(within: Duration) -> bool {
    let started = Instant::now();
    DRAINING.store(true, Ordering::SeqCst);
    if let Ok(live) = live().lock() {
        for wake in live.iter().filter_map(|(_, w)| w.as_ref()?.upgrade()) {
            wake.notify_one();
        }
    }
    loop {
        let left: usize = live()
            .lock()
            .map(|live| {
                live.iter()
                    .filter_map(|(p, _)| p.upgrade())
                    .map(|p| p.load(Ordering::SeqCst))
                    .sum()
            })
            .unwrap_or(0);
        if left == 0 {
            return true;
        }
        if started.elapsed() >= within {
            tracing::warn!(target: "gateway::limits", left, "exiting with settlements not written");
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
