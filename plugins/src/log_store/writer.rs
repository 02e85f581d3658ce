//! The bounded queue between `on_log` and the database, and the writer that drains it.
//!
//! `on_log` hands a record over with `try_send` and returns: a full queue drops the record
//! (counted as `dropped_full`), it never waits. The writer runs on a thread of its own with a
//! small single-threaded runtime, started when the plugin is built: the gateway builds its
//! plugins outside any async runtime, and Pingora's runtimes stop before the process does, so
//! the writer depends on neither. It writes a batch when `batch_size` records have arrived or
//! `flush_interval` after the last write, whichever comes first; the work that is not needed
//! on the request's path (record ids, body redaction, cost from the price table) happens here.
//!
//! A failed write is retried [`WriterSettings::retries`] times with a doubling backoff, then
//! the batch is dropped and counted (`dropped_error`). Each attempt is bounded by
//! [`WriterSettings::attempt_timeout`], so a hung database cannot stall the writer for ever.
//!
//! Flushing: [`Queue::flush`] (and [`flush_all`], for every queue of the process) writes what
//! is queued and waits for it; dropping the [`Queue`] (the plugin, when its pipeline is
//! dropped) writes everything left and waits for it up to [`SHUTDOWN_WAIT`].

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tokio::sync::mpsc;

use plugin_sdk::sinks::{LogRecord, SharedSink};

use super::redact;

/// How long dropping a queue waits for its last records to be written.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// A record on its way to the writer, with the parts that are finished off the request's path.
#[derive(Debug)]
pub struct Entry {
    pub record: LogRecord,
    /// The request body as captured (a prefix of at most `max_body_bytes`).
    pub request_body: Option<RawBody>,
    pub response_body: Option<RawBody>,
    /// Cost to compute from the price table when the request did not set one: (provider,
    /// model) are in the record, the usage in its token counts.
    pub price_later: bool,
}

/// Captured bytes of a body: a prefix of it when `cut`.
#[derive(Debug, Clone)]
pub struct RawBody {
    pub bytes: bytes::Bytes,
    pub cut: bool,
}

/// How the writer works. Built from the plugin's config; tests shorten the backoff.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    pub queue_capacity: usize,
    pub batch_size: usize,
    pub flush_interval: Duration,
    pub max_body_bytes: usize,
    /// Attempts after the first failed write of a batch. Default: 3.
    pub retries: u32,
    /// Wait before the first retry; doubled before each next one. Default: 100 ms.
    pub backoff: Duration,
    /// The longest one write may take before it counts as failed. Default: 30 s.
    pub attempt_timeout: Duration,
}

impl WriterSettings {
    pub fn new(
        queue_capacity: usize,
        batch_size: usize,
        flush_interval: Duration,
        max_body_bytes: usize,
    ) -> Self {
        WriterSettings {
            queue_capacity,
            batch_size,
            flush_interval,
            max_body_bytes,
            retries: 3,
            backoff: Duration::from_millis(100),
            attempt_timeout: Duration::from_secs(30),
        }
    }
}

/// The log writer's metrics, registered in the gateway's registry:
/// `gw_log_queue_depth`, `gw_log_records_total{outcome}`, `gw_log_batches_total{outcome}`.
#[derive(Clone)]
pub struct LogMetrics {
    records_written: IntCounter,
    records_dropped_full: IntCounter,
    records_dropped_error: IntCounter,
    batches_written: IntCounter,
    batches_retried: IntCounter,
    batches_dropped_error: IntCounter,
    depth: IntGauge,
    records: IntCounterVec,
    batches: IntCounterVec,
}

impl LogMetrics {
    pub fn new() -> Result<LogMetrics, String> {
        let records = IntCounterVec::new(
            Opts::new(
                "gw_log_records_total",
                "Request log records by outcome: written, dropped_full (the queue was full), \
                 dropped_error (the database refused them after retries)",
            ),
            &["outcome"],
        )
        .map_err(|e| e.to_string())?;
        let batches = IntCounterVec::new(
            Opts::new(
                "gw_log_batches_total",
                "Request log batch writes by outcome: written, retried (a failed attempt that \
                 was tried again), dropped_error (failed after every retry)",
            ),
            &["outcome"],
        )
        .map_err(|e| e.to_string())?;
        let depth = IntGauge::new(
            "gw_log_queue_depth",
            "Request log records waiting for the writer",
        )
        .map_err(|e| e.to_string())?;
        // Label handles resolved once: counting is then one atomic add.
        Ok(LogMetrics {
            records_written: records.with_label_values(&["written"]),
            records_dropped_full: records.with_label_values(&["dropped_full"]),
            records_dropped_error: records.with_label_values(&["dropped_error"]),
            batches_written: batches.with_label_values(&["written"]),
            batches_retried: batches.with_label_values(&["retried"]),
            batches_dropped_error: batches.with_label_values(&["dropped_error"]),
            depth,
            records,
            batches,
        })
    }
}

/// Reads the queue's depth when the metrics are gathered, so `on_log` does no gauge work.
struct DepthCollector {
    gauge: IntGauge,
    queue: mpsc::WeakSender<Entry>,
}

impl Collector for DepthCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let depth = self
            .queue
            .upgrade()
            .map_or(0, |tx| tx.max_capacity() - tx.capacity());
        self.gauge.set(depth as i64);
        self.gauge.collect()
    }
}

enum Control {
    /// Write what is queued now, then answer.
    Flush(std::sync::mpsc::Sender<()>),
    /// Write everything left, answer, and stop.
    Shutdown(std::sync::mpsc::Sender<()>),
}

/// What [`flush_all`] reaches: the control side of a running writer.
struct WriterHandle {
    control: mpsc::UnboundedSender<Control>,
}

impl WriterHandle {
    /// Asks for a flush; `None` when the writer has stopped (after writing what it held).
    fn request(&self, make: fn(std::sync::mpsc::Sender<()>) -> Control) -> Option<Waiter> {
        let (ack, done) = std::sync::mpsc::channel();
        self.control.send(make(ack)).ok()?;
        Some(Waiter(done))
    }
}

struct Waiter(std::sync::mpsc::Receiver<()>);

impl Waiter {
    /// Waits for the writer's answer until `deadline`.
    fn answer(self, deadline: Instant) -> Result<(), std::sync::mpsc::RecvTimeoutError> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.0.recv_timeout(left)
    }

    /// True once the writer answered, or stopped (it writes everything it holds before it
    /// stops, so there is nothing left to wait for); false when the deadline passed first.
    fn done_or_stopped(self, deadline: Instant) -> bool {
        !matches!(
            self.answer(deadline),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        )
    }
}

fn writers() -> &'static Mutex<Vec<Weak<WriterHandle>>> {
    static WRITERS: OnceLock<Mutex<Vec<Weak<WriterHandle>>>> = OnceLock::new();
    WRITERS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Writes what every log queue of the process holds and waits for it, up to `timeout` in all;
/// true when every queue was flushed in time. Blocks the calling thread: call it from a plain
/// thread (the gateway's drain watcher, before the process exits), not from async code.
pub fn flush_all(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let live: Vec<Arc<WriterHandle>> = match writers().lock() {
        Ok(list) => list.iter().filter_map(Weak::upgrade).collect(),
        Err(_) => return false,
    };
    // Ask them all first, so that they flush at the same time. A writer that has stopped
    // (its plugin is being dropped) wrote everything before stopping.
    let waiters: Vec<Waiter> = live
        .iter()
        .filter_map(|w| w.request(Control::Flush))
        .collect();
    waiters.into_iter().all(|w| w.done_or_stopped(deadline))
}

/// The sending side: what the plugin holds.
pub struct Queue {
    tx: mpsc::Sender<Entry>,
    /// Woken when a batch is waiting: the writer does not wake for each record (a wake-up per
    /// request costs the request thread a context switch on a busy machine).
    full: Arc<tokio::sync::Notify>,
    batch_size: usize,
    handle: Arc<WriterHandle>,
    dropped_full: IntCounter,
    dropped_error: IntCounter,
}

impl Queue {
    /// Registers the metrics in `registry` and starts the writer thread.
    pub fn start(
        settings: WriterSettings,
        sink: SharedSink,
        metrics: LogMetrics,
        registry: &Registry,
    ) -> Result<Queue, String> {
        let (tx, rx) = mpsc::channel(settings.queue_capacity.max(1));
        let collectors: [Box<dyn Collector>; 3] = [
            Box::new(DepthCollector {
                gauge: metrics.depth.clone(),
                queue: tx.downgrade(),
            }),
            Box::new(metrics.records.clone()),
            Box::new(metrics.batches.clone()),
        ];
        for c in collectors {
            registry.register(c).map_err(|e| {
                format!("cannot register the log_store metrics (is `log_store` listed twice?): {e}")
            })?;
        }
        let (control, control_rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the log writer's runtime: {e}"))?;
        let dropped_full = metrics.records_dropped_full.clone();
        let dropped_error = metrics.records_dropped_error.clone();
        let full = Arc::new(tokio::sync::Notify::new());
        let batch_size = settings.batch_size.max(1);
        let writer_full = full.clone();
        let writer = Writer {
            sink,
            settings,
            metrics,
        };
        std::thread::Builder::new()
            .name("gw-log-writer".into())
            .spawn(move || runtime.block_on(writer.run(rx, control_rx, writer_full)))
            .map_err(|e| format!("cannot start the log writer's thread: {e}"))?;
        let handle = Arc::new(WriterHandle { control });
        if let Ok(mut list) = writers().lock() {
            list.retain(|w| w.strong_count() > 0);
            list.push(Arc::downgrade(&handle));
        }
        Ok(Queue {
            tx,
            full,
            batch_size,
            handle,
            dropped_full,
            dropped_error,
        })
    }

    /// Hands a record to the writer without waiting; a full queue drops it (counted).
    pub fn push(&self, entry: Entry) {
        match self.tx.try_send(entry) {
            Ok(()) => {
                if self.tx.max_capacity() - self.tx.capacity() >= self.batch_size {
                    self.full.notify_one();
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => self.dropped_full.inc(),
            // The writer is gone (its thread died): nothing will write this record.
            Err(mpsc::error::TrySendError::Closed(_)) => self.dropped_error.inc(),
        }
    }

    /// Writes what is queued now and waits for it, up to `timeout`; true when done in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        // The plugin is alive, so a writer that stopped has died: its records are lost.
        self.handle
            .request(Control::Flush)
            .is_some_and(|w| w.answer(deadline).is_ok())
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        let finished = self
            .handle
            .request(Control::Shutdown)
            .is_none_or(|w| w.done_or_stopped(deadline));
        if !finished {
            tracing::warn!(
                target: "gateway::log_store",
                "the request log writer did not finish within {SHUTDOWN_WAIT:?}; it goes on in the background"
            );
        }
    }
}

struct Writer {
    sink: SharedSink,
    settings: WriterSettings,
    metrics: LogMetrics,
}

impl Writer {
    async fn run(
        self,
        mut rx: mpsc::Receiver<Entry>,
        mut control: mpsc::UnboundedReceiver<Control>,
        full: Arc<tokio::sync::Notify>,
    ) {
        let batch_size = self.settings.batch_size.max(1);
        let mut buf: Vec<Entry> = Vec::with_capacity(batch_size);
        let period = self.settings.flush_interval.max(Duration::from_millis(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                order = control.recv() => match order {
                    Some(Control::Flush(ack)) => {
                        // What is queued now, not what keeps arriving: a flush under load ends.
                        let queued = rx.len();
                        for _ in 0..queued {
                            match rx.try_recv() {
                                Ok(e) => buf.push(e),
                                Err(_) => break,
                            }
                        }
                        self.write_all(&mut buf).await;
                        let _ = ack.send(());
                    }
                    Some(Control::Shutdown(ack)) => {
                        self.drain(&mut rx, &mut buf).await;
                        let _ = ack.send(());
                        return;
                    }
                    None => {
                        self.drain(&mut rx, &mut buf).await;
                        return;
                    }
                },
                // A batch is waiting: write the whole batches, keep the rest for the tick.
                _ = full.notified() => {
                    let gone = take_queued(&mut rx, &mut buf);
                    let whole = buf.len() - buf.len() % batch_size;
                    let mut rest = buf.split_off(whole);
                    self.write_all(&mut buf).await;
                    buf.append(&mut rest);
                    if gone {
                        self.write_all(&mut buf).await;
                        return;
                    }
                    tick.reset();
                }
                _ = tick.tick() => {
                    let gone = take_queued(&mut rx, &mut buf);
                    if !buf.is_empty() {
                        self.write_all(&mut buf).await;
                    }
                    if gone {
                        return;
                    }
                }
            }
        }
    }
}

/// Moves what is queued into `buf` without waiting; true when every sender is gone.
fn take_queued(rx: &mut mpsc::Receiver<Entry>, buf: &mut Vec<Entry>) -> bool {
    loop {
        match rx.try_recv() {
            Ok(e) => buf.push(e),
            Err(mpsc::error::TryRecvError::Empty) => return false,
            Err(mpsc::error::TryRecvError::Disconnected) => return true,
        }
    }
}

impl Writer {
    /// Takes everything left in the queue and writes it.
    async fn drain(&self, rx: &mut mpsc::Receiver<Entry>, buf: &mut Vec<Entry>) {
        rx.close();
        while let Ok(e) = rx.try_recv() {
            buf.push(e);
        }
        self.write_all(buf).await;
    }

    /// Writes `buf` in batches of at most `batch_size` and empties it.
    async fn write_all(&self, buf: &mut Vec<Entry>) {
        let batch_size = self.settings.batch_size.max(1);
        let mut entries = std::mem::take(buf).into_iter().peekable();
        while entries.peek().is_some() {
            let batch: Vec<LogRecord> = entries
                .by_ref()
                .take(batch_size)
                .map(|e| finish(e, self.settings.max_body_bytes))
                .collect();
            self.write_batch(batch).await;
        }
        buf.reserve(batch_size);
    }

    /// One batch: retried with backoff, then dropped and counted.
    async fn write_batch(&self, batch: Vec<LogRecord>) {
        let count = batch.len() as u64;
        let mut backoff = self.settings.backoff;
        let mut attempt = 0;
        let mut batch = Some(batch);
        while let Some(records) = batch.take() {
            let last = attempt >= self.settings.retries;
            // The sink takes the batch by value: keep a copy while a retry may need it.
            let keep = (!last).then(|| records.clone());
            let outcome =
                tokio::time::timeout(self.settings.attempt_timeout, self.sink.write_logs(records))
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "the write took longer than {:?}",
                            self.settings.attempt_timeout
                        ))
                    });
            match outcome {
                Ok(()) => {
                    self.metrics.batches_written.inc();
                    self.metrics.records_written.inc_by(count);
                }
                Err(error) if !last => {
                    self.metrics.batches_retried.inc();
                    tracing::debug!(
                        target: "gateway::log_store",
                        %error, records = count, attempt, "writing request logs failed; retrying"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2);
                    attempt += 1;
                    batch = keep;
                }
                Err(error) => {
                    self.metrics.batches_dropped_error.inc();
                    self.metrics.records_dropped_error.inc_by(count);
                    tracing::warn!(
                        target: "gateway::log_store",
                        %error, records = count, attempts = attempt + 1,
                        "writing request logs failed; the batch is dropped"
                    );
                }
            }
        }
    }
}

/// The record as it is written: its id, its cost when the request left it to the price table,
/// and its bodies redacted and cut.
fn finish(entry: Entry, max_body_bytes: usize) -> LogRecord {
    let mut record = entry.record;
    // Time-ordered, so that the store's id index grows at one end (see `insert_logs`).
    record.id = uuid::Uuid::now_v7().to_string();
    if entry.price_later && record.cost.is_none() {
        record.cost = super::computed_cost(
            record.provider.as_deref(),
            record.model.as_deref(),
            plugin_sdk::Usage {
                prompt_tokens: record.prompt_tokens,
                completion_tokens: record.completion_tokens,
            },
        );
    }
    record.request_body = entry
        .request_body
        .map(|b| redact::render(&b.bytes, b.cut, max_body_bytes));
    record.response_body = entry
        .response_body
        .map(|b| redact::render(&b.bytes, b.cut, max_body_bytes));
    record
}
