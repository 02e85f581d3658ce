//! Log output, set by `GW_LOG` / `log:`: comma-separated filter directives (`info`,
//! `gateway::request=debug`...) plus the word `json` for one JSON object per line.
//!
//! Lines are appended to an in-memory batch that a background thread writes to stdout every
//! 100 ms (or as soon as 64 KiB are waiting): a request never waits on the terminal, and one
//! log line costs a lock and a copy rather than a thread wake-up. When stdout stalls and 8 MiB
//! are waiting, further lines are dropped and counted rather than blocking requests.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
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
        builder.event_format(LineFormat).try_init()
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))?;
    Ok(guard)
}

/// The text line format: `2026-01-02T03:04:05.678901Z  INFO target: message key=value ...`.
///
/// Written field by field without the general formatter's machinery, because one request line
/// per request is on the hot path. Values that are not plain words are quoted and escaped, so a
/// client-supplied value (a model name, a path) cannot forge a line.
pub struct LineFormat;

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        write_utc_now(&mut writer)?;
        let meta = event.metadata();
        write!(writer, " {:>5} {}:", meta.level().as_str(), meta.target())?;
        let mut fields = LineFields {
            out: &mut writer,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writer.write_char('\n')
    }
}

struct LineFields<'w, 'a> {
    out: &'w mut Writer<'a>,
    result: std::fmt::Result,
}

impl LineFields<'_, '_> {
    fn key(&mut self, field: &Field) -> std::fmt::Result {
        self.out.write_char(' ')?;
        if field.name() != "message" {
            self.out.write_str(field.name())?;
            self.out.write_char('=')?;
        }
        Ok(())
    }
}

impl Visit for LineFields<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_ok() {
            self.result = self.key(field).and_then(|()| {
                if field.name() == "message" {
                    self.out.write_str(value)
                } else {
                    write_value(self.out, value)
                }
            });
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.result.is_ok() {
            let mut digits = itoa::Buffer::new();
            self.result = self
                .key(field)
                .and_then(|()| self.out.write_str(digits.format(value)));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.result.is_ok() {
            let mut digits = itoa::Buffer::new();
            self.result = self
                .key(field)
                .and_then(|()| self.out.write_str(digits.format(value)));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.result.is_ok() {
            self.result = self
                .key(field)
                .and_then(|()| self.out.write_str(if value { "true" } else { "false" }));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if self.result.is_ok() {
            self.result = self.key(field).and_then(|()| {
                if field.name() == "message" {
                    write!(self.out, "{value:?}")
                } else {
                    let text = format!("{value:?}");
                    write_value(self.out, &text)
                }
            });
        }
    }
}

/// A plain word as it is; anything else quoted, with quotes, backslashes and control characters
/// escaped.
fn write_value(out: &mut Writer<'_>, value: &str) -> std::fmt::Result {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' && b != b'=');
    if plain {
        return out.write_str(value);
    }
    out.write_char('"')?;
    for c in value.chars() {
        match c {
            '"' => out.write_str("\\\"")?,
            '\\' => out.write_str("\\\\")?,
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if c.is_control() => write!(out, "\\u{{{:x}}}", c as u32)?,
            c => out.write_char(c)?,
        }
    }
    out.write_char('"')
}

/// The current UTC time as RFC 3339 with microseconds. The date and time up to the second are
/// formatted once per second and thread, since every request writes a line.
fn write_utc_now(out: &mut Writer<'_>) -> std::fmt::Result {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> =
            const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    SECOND.with_borrow_mut(|(second, text)| {
        if *second != secs {
            *second = secs;
            text.clear();
            let (year, month, day) = civil_from_days((secs / 86_400) as i64);
            let rem = secs % 86_400;
            let _ = write!(
                text,
                "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.",
                rem / 3600,
                rem / 60 % 60,
                rem % 60,
            );
        }
        out.write_str(text)
    })?;
    let micros = now.subsec_micros();
    let mut fraction = [b'0'; 7];
    fraction[6] = b'Z';
    let mut rest = micros;
    for digit in fraction[..6].iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    // Only ASCII digits and 'Z' were written.
    out.write_str(std::str::from_utf8(&fraction).map_err(|_| std::fmt::Error)?)
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_778), (2026, 11, 21));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn timestamps_are_rfc3339_with_microseconds() {
        let mut first = String::new();
        write_utc_now(&mut Writer::new(&mut first)).unwrap();
        let mut second = String::new();
        write_utc_now(&mut Writer::new(&mut second)).unwrap();
        for stamp in [&first, &second] {
            assert_eq!(stamp.len(), 27, "{stamp}");
            let shape: String = stamp
                .chars()
                .map(|c| if c.is_ascii_digit() { '9' } else { c })
                .collect();
            assert_eq!(shape, "9999-99-99T99:99:99.999999Z");
        }
        // The cached second is reused, and the line's time does not run backwards.
        assert!(first <= second, "{first} then {second}");
    }

    #[test]
    fn client_values_cannot_forge_a_line() {
        let mut out = String::new();
        write_value(&mut Writer::new(&mut out), "gpt-4o").unwrap();
        write_value(&mut Writer::new(&mut out), "a b\n INFO fake").unwrap();
        write_value(&mut Writer::new(&mut out), "").unwrap();
        assert_eq!(out, "gpt-4o\"a b\\n INFO fake\"\"\"");
    }

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
