//! Server-sent events body with pacing and mid-stream disconnects.
//!
//! Events are produced lazily by an iterator, one body frame per event, so a
//! long stream costs no memory up front and a paced stream is really paced on
//! the wire. Format-independent: the wire formats only supply the events.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Frame;
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;

/// How long to wait after the last event before dropping the connection,
/// so hyper flushes the events already written before the abort.
const FLUSH_GRACE: Duration = Duration::from_millis(5);

/// A source of complete SSE events (`[event: ...\n]data: ...\n\n`).
pub(crate) type Events = Box<dyn Iterator<Item = Bytes> + Send>;

/// Pacing and fault settings for one stream.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StreamFaults {
    /// Sleep between consecutive events.
    pub chunk_delay: Option<Duration>,
    /// Send this many events, then abort the connection without the
    /// terminating chunk.
    pub disconnect_after: Option<u64>,
}

/// Error that makes hyper drop the connection mid-body.
#[derive(Debug)]
pub(crate) struct InjectedDisconnect;

impl fmt::Display for InjectedDisconnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mock injected disconnect")
    }
}

impl std::error::Error for InjectedDisconnect {}

/// Body that yields one frame per event, sleeping `chunk_delay` between
/// events and aborting after `disconnect_after` events when asked to.
pub(crate) struct SseBody {
    events: Events,
    faults: StreamFaults,
    sent: u64,
    /// The next event, taken from the iterator before pacing so the end of
    /// the stream is not delayed by a pointless final sleep.
    next: Option<Bytes>,
    /// Whether the pacing sleep before `next` already ran.
    paced: bool,
    /// Reused timer for both pacing and the pre-disconnect grace period.
    sleep: Option<Pin<Box<Sleep>>>,
    sleeping: bool,
    disconnecting: bool,
}

impl SseBody {
    pub(crate) fn new(events: Events, faults: StreamFaults) -> Self {
        SseBody {
            events,
            faults,
            sent: 0,
            next: None,
            paced: false,
            sleep: None,
            sleeping: false,
            disconnecting: false,
        }
    }

    fn start_sleep(&mut self, duration: Duration) {
        let deadline = Instant::now() + duration;
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().reset(deadline),
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        self.sleeping = true;
    }

    pub(crate) fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.sleeping {
                if let Some(sleep) = &mut this.sleep {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                this.sleeping = false;
                if this.disconnecting {
                    return Poll::Ready(Some(Err(Box::new(InjectedDisconnect))));
                }
                this.paced = true;
                continue;
            }
            if this.faults.disconnect_after.is_some_and(|n| this.sent >= n) {
                // Returning Pending first lets hyper flush what it has
                // buffered; erroring right away would discard it.
                this.disconnecting = true;
                this.start_sleep(FLUSH_GRACE);
                continue;
            }
            if this.next.is_none() {
                match this.events.next() {
                    Some(event) => this.next = Some(event),
                    None => return Poll::Ready(None),
                }
            }
            if let Some(delay) = this.faults.chunk_delay {
                if this.sent > 0 && !this.paced && !delay.is_zero() {
                    this.start_sleep(delay);
                    continue;
                }
            }
            this.paced = false;
            this.sent += 1;
            return Poll::Ready(this.next.take().map(|event| Ok(Frame::data(event))));
        }
    }
}

/// Frames one `data: <json>\n\n` event.
pub(crate) fn data_event<T: serde::Serialize>(value: &T) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"data: ");
    // Serializing our own plain structs into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut buf, value);
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

/// Frames one `event: <name>\ndata: <json>\n\n` event, the form of
/// providers (such as Anthropic) that name their events.
pub(crate) fn named_event<T: serde::Serialize>(name: &str, value: &T) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"event: ");
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b"\ndata: ");
    // Serializing our own plain structs into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut buf, value);
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}
