//! Log output, set by `GW_LOG` / `log:`: comma-separated filter directives (`info`,
//! `gateway::request=debug`...) plus the word `json` for one JSON object per line.
//!
//! Lines are appended to an in-memory batch that a background thread writes to stdout every
//! 100 ms (or as soon as 64 KiB are waiting): a request never waits on the terminal, and one
//! log line costs a lock and a copy rather than a thread wake-up. When stdout stalls and 8 MiB
//! are waiting, further lines are dropped and counted rather than blocking requests.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

const FLUSH_EVERY: Duration = Duration::from_millis(100);
const FLUSH_AT_BYTES: usize = 64 * 1024;
const DROP_AT_BYTES: usize = 8 * 1024 * 1024;

struct Batch {
    pending: Mutex<Vec<u8>>,
    wake: Condvar,
    dropped: AtomicU64,
}

/// The writer handed to the subscriber.
#[derive(Clone)]
pub struct BatchedStdout(Arc<Batch>);

/// Flushes what is pending when dropped; keep it alive for the life of the process.
pub struct FlushGuard(Arc<Batch>);

impl Drop for FlushGuard {
    fn drop(&mut self) {
        flush(&self.0);
    }
}

fn flush(batch: &Batch) {
    let lines = match batch.pending.lock() {
        Ok(mut pending) => std::mem::take(&mut *pending),
        Err(_) => return,
    };
    let mut out = std::io::stdout().lock();
    if !lines.is_empty() {
        let _ = out.write_all(&lines);
    }
    let dropped = batch.dropped.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        let _ = writeln!(out, "WARN log output stalled: {dropped} lines dropped");
    }
    let _ = out.flush();
}

impl BatchedStdout {
    fn start() -> (BatchedStdout, FlushGuard) {
        let batch = Arc::new(Batch {
            pending: Mutex::new(Vec::with_capacity(FLUSH_AT_BYTES)),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        let worker = batch.clone();
        std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || loop {
                if let Ok(pending) = worker.pending.lock() {
                    let _ = worker.wake.wait_timeout(pending, FLUSH_EVERY);
                }
                flush(&worker);
            })
            .expect("spawn the log writer");
        (BatchedStdout(batch.clone()), FlushGuard(batch))
    }
}

impl Write for BatchedStdout {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut pending) = self.0.pending.lock() {
            if pending.len() + line.len() > DROP_AT_BYTES {
                self.0.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                pending.extend_from_slice(line);
                if pending.len() >= FLUSH_AT_BYTES {
                    self.0.wake.notify_one();
                }
            }
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchedStdout {
    type Writer = BatchedStdout;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Installs the global subscriber. Keep the guard alive: dropping it flushes pending lines.
pub fn init(spec: &str) -> Result<FlushGuard, String> {
    let mut json = false;
    let mut directives = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("json") {
            json = true;
        } else {
            directives.push(part);
        }
    }
    let directives = if directives.is_empty() {
        "info".to_owned()
    } else {
        directives.join(",")
    };
    let filter = EnvFilter::try_new(&directives)
        .map_err(|e| format!("invalid log filter {directives:?}: {e}"))?;
    let (writer, guard) = BatchedStdout::start();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal())
        .with_writer(writer);
    let result = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))?;
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_kept_until_the_batch_is_full_then_dropped_and_counted() {
        let batch = Arc::new(Batch {
            pending: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        let mut w = BatchedStdout(batch.clone());
        w.write_all(b"one\n").unwrap();
        w.write_all(b"two\n").unwrap();
        assert_eq!(&batch.pending.lock().unwrap()[..], b"one\ntwo\n");
        let big = vec![b'x'; DROP_AT_BYTES];
        w.write_all(&big).unwrap();
        assert_eq!(batch.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(batch.pending.lock().unwrap().len(), 8);
    }
}
