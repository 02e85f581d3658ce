//! The background writer: settled usage (`UsageCharge`) and budget events (`AuditEvent`)
//! handed over by the request path through a bounded channel, merged, and sent to the
//! control plane's sink in batches. Nothing on the request path waits for it.
//!
//! Charges of the same counter are summed before they are sent. A batch the sink refuses is
//! kept for the next flush while fewer than the queue's capacity are waiting, else dropped
//! (and counted): the gateway's own counters are not affected, only what the control plane
//! shows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus::IntCounterVec;
use std::sync::Arc;

use tokio::sync::{mpsc, Notify};

use plugin_sdk::sinks::{AuditEvent, SharedSink, UsageCharge};

/// What one request's settlement hands to the writer.
#[derive(Debug, Default)]
pub struct Report {
    pub charges: Vec<UsageCharge>,
    pub events: Vec<AuditEvent>,
}

impl Report {
    pub fn is_empty(&self) -> bool {
        self.charges.is_empty() && self.events.is_empty()
    }
}

/// A batch is sent early once this many charges and events wait.
const FLUSH_AT: usize = 512;

/// Charges merged by counter: `(budget_id, value_key, period, reset_epoch)`.
type ChargeKey = (String, String, i64, i64);

#[derive(Default)]
struct Pending {
    charges: HashMap<ChargeKey, f64>,
    events: Vec<AuditEvent>,
}

impl Pending {
    fn len(&self) -> usize {
        self.charges.len() + self.events.len()
    }

    fn add_charges(&mut self, charges: Vec<UsageCharge>) {
        for c in charges {
            *self
                .charges
                .entry((c.budget_id, c.value_key, c.period, c.reset_epoch))
                .or_default() += c.amount;
        }
    }
}

/// Runs until every sender is gone, then sends what is left and returns. It wakes every
/// `flush_every` and when `wake` is notified (the senders do so once the queue holds many
/// reports), never for each report: a wake-up per request would cost the request threads a
/// context switch each on a busy machine.
///
/// `in_flight` counts the reports handed over and not yet sent (the process waits for it at
/// exit, see [`crate::limits::batches::flush_all`]); once shutdown begins, each wake-up sends
/// at once.
pub async fn run(
    mut rx: mpsc::Receiver<Report>,
    wake: Arc<Notify>,
    in_flight: Arc<AtomicUsize>,
    sink: SharedSink,
    dropped: IntCounterVec,
    flush_every: Duration,
    capacity: usize,
) {
    let mut pending = Pending::default();
    let mut taken = 0;
    let mut tick = tokio::time::interval(flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let on_tick = tokio::select! {
            _ = wake.notified() => false,
            _ = tick.tick() => true,
        };
        let gone = loop {
            match rx.try_recv() {
                Ok(report) => {
                    taken += 1;
                    pending.add_charges(report.charges);
                    pending.events.extend(report.events);
                }
                Err(mpsc::error::TryRecvError::Empty) => break false,
                Err(mpsc::error::TryRecvError::Disconnected) => break true,
            }
        };
        if gone {
            flush(&mut pending, &sink, &dropped, 0).await;
            in_flight.fetch_sub(taken, Ordering::SeqCst);
            return;
        }
        let draining = crate::limits::batches::draining();
        if on_tick || draining || pending.len() >= FLUSH_AT {
            // At exit nothing is kept for a later flush: there is none.
            let keep = if draining { 0 } else { capacity };
            flush(&mut pending, &sink, &dropped, keep).await;
            // What a refused flush keeps for the next one is still in flight.
            if pending.len() == 0 {
                in_flight.fetch_sub(std::mem::take(&mut taken), Ordering::SeqCst);
            }
        }
    }
}

/// Sends what waits; a refused batch is kept while fewer than `keep_up_to` wait.
async fn flush(
    pending: &mut Pending,
    sink: &SharedSink,
    dropped: &IntCounterVec,
    keep_up_to: usize,
) {
    if !pending.charges.is_empty() {
        let batch: Vec<UsageCharge> = pending
            .charges
            .drain()
            .map(
                |((budget_id, value_key, period, reset_epoch), amount)| UsageCharge {
                    budget_id,
                    value_key,
                    amount,
                    period,
                    reset_epoch,
                },
            )
            .collect();
        if let Err(e) = sink.charge_usage(batch.clone()).await {
            if pending.len() + batch.len() <= keep_up_to {
                tracing::warn!(target: "gateway::usage_limit", error = %e, charges = batch.len(),
                    "the control plane refused settled usage; retrying at the next flush");
                pending.add_charges(batch);
            } else {
                tracing::error!(target: "gateway::usage_limit", error = %e, charges = batch.len(),
                    "the control plane refused settled usage; dropped");
                dropped
                    .with_label_values(&["charge"])
                    .inc_by(batch.len() as u64);
            }
        }
    }
    if !pending.events.is_empty() {
        let batch = std::mem::take(&mut pending.events);
        if let Err(e) = sink.audit(batch.clone()).await {
            if pending.len() + batch.len() <= keep_up_to {
                tracing::warn!(target: "gateway::usage_limit", error = %e, events = batch.len(),
                    "the control plane refused budget events; retrying at the next flush");
                pending.events.extend(batch);
            } else {
                tracing::error!(target: "gateway::usage_limit", error = %e, events = batch.len(),
                    "the control plane refused budget events; dropped");
                dropped
                    .with_label_values(&["event"])
                    .inc_by(batch.len() as u64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use prometheus::Opts;

    use plugin_sdk::sinks::{ControlPlaneSink, LogRecord};

    use super::*;

    /// Refuses the first `failures` charge batches, then records.
    #[derive(Default)]
    struct FlakySink {
        failures: AtomicUsize,
        batches: Mutex<Vec<Vec<UsageCharge>>>,
    }

    #[async_trait]
    impl ControlPlaneSink for FlakySink {
        async fn audit(&self, _events: Vec<AuditEvent>) -> Result<(), String> {
            Ok(())
        }
        async fn charge_usage(&self, charges: Vec<UsageCharge>) -> Result<(), String> {
            if self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
                .is_ok()
            {
                return Err("database down".into());
            }
            self.batches.lock().unwrap().push(charges);
            Ok(())
        }
        async fn write_logs(&self, _records: Vec<LogRecord>) -> Result<(), String> {
            Ok(())
        }
    }

    fn charge(budget: &str, amount: f64) -> UsageCharge {
        UsageCharge {
            budget_id: budget.into(),
            value_key: String::new(),
            amount,
            period: 0,
            reset_epoch: 0,
        }
    }

    #[tokio::test]
    async fn charges_are_merged_and_a_refused_batch_is_sent_again() {
        let sink = Arc::new(FlakySink::default());
        sink.failures.store(1, Ordering::SeqCst);
        let dropped = IntCounterVec::new(Opts::new("d", "d"), &["what"]).unwrap();
        let (tx, rx) = mpsc::channel(16);
        let wake = Arc::new(Notify::new());
        let writer = tokio::spawn(run(
            rx,
            wake.clone(),
            Arc::default(),
            sink.clone(),
            dropped.clone(),
            Duration::from_millis(20),
            100,
        ));
        for amount in [1.0, 2.0] {
            tx.send(Report {
                charges: vec![charge("api_key:a", amount), charge("api_key:b", 1.0)],
                events: vec![],
            })
            .await
            .unwrap();
        }
        // The first flush is refused; the next one sends the merged charges.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sink.batches.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never sent");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // What the plugin's `Shared` does when dropped.
        drop(tx);
        wake.notify_one();
        writer.await.unwrap();
        let batches = sink.batches.lock().unwrap().clone();
        let mut all: Vec<(String, f64)> = batches
            .into_iter()
            .flatten()
            .map(|c| (c.budget_id, c.amount))
            .collect();
        all.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            all,
            vec![
                ("api_key:a".to_string(), 3.0),
                ("api_key:b".to_string(), 2.0)
            ]
        );
        assert_eq!(dropped.with_label_values(&["charge"]).get(), 0);
    }

    #[tokio::test]
    async fn what_cannot_be_sent_at_the_end_is_dropped_and_counted() {
        let sink = Arc::new(FlakySink::default());
        sink.failures.store(usize::MAX, Ordering::SeqCst);
        let dropped = IntCounterVec::new(Opts::new("d", "d"), &["what"]).unwrap();
        let (tx, rx) = mpsc::channel(16);
        let wake = Arc::new(Notify::new());
        let writer = tokio::spawn(run(
            rx,
            wake.clone(),
            Arc::default(),
            sink.clone(),
            dropped.clone(),
            Duration::from_secs(3600),
            100,
        ));
        tx.send(Report {
            charges: vec![charge("api_key:a", 1.0), charge("api_key:b", 1.0)],
            events: vec![],
        })
        .await
        .unwrap();
        // What the plugin's `Shared` does when dropped.
        drop(tx);
        wake.notify_one();
        writer.await.unwrap();
        assert!(sink.batches.lock().unwrap().is_empty());
        assert_eq!(dropped.with_label_values(&["charge"]).get(), 2);
    }
}
