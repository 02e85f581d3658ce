//! The Redis counter backend (`GW_REDIS_URL`): one limit shared exactly by every gateway
//! instance that uses the same Redis.
//!
//! Each counter is two keys, the count of the current fixed window and of the previous one:
//! `<prefix><id>:<window index>` (prefix `gw:rl:` by default; an id starts with its
//! organisation's hash tag, `{org-id}api_key:<id>:0`, so that a request's counters share one
//! Redis Cluster slot; an id longer than 200 bytes is replaced by its tag and its SHA-256). A key expires two windows after it was last charged, when it no
//! longer counts.
//!
//! A request's check-and-charge of all its counters is the rate part of ONE Lua script
//! ([`ADMIT`](crate::limits::admission::ADMIT)), which on the request path also reserves the
//! request's budgets (see [`crate::limits::admission`]): Redis runs a script without
//! interleaving any other command, so concurrent requests on any number of instances cannot
//! both take the last slot. The time is the gateway's (`now` in milliseconds is an argument,
//! and picks the window keys), so instances agree within their clocks' skew.
//!
//! Token charges after the answer ([`RedisCounters::charge_later`]) leave the request path:
//! a background thread sends the queued ones in one round trip (`INCRBY` and `PEXPIRE` for
//! each), retrying a failure after 100 ms, 1 s and 5 s.
//!
//! A script touching several keys needs them on one node: in a Redis Cluster the tag keeps a
//! request's counters together, and the background charges are sent one pipeline per tag.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::counters::{latest_refusal, CounterError, CounterSpec, Counters, Decision};
use crate::limits::admission::{Admission, RateCall};
use crate::limits::batches::Batches;
use crate::limits::redis::{key_part, reply_error, tag_of, RedisConn};
use crate::limits::window;

/// Waits before each retry of a failed batch of token charges.
const CHARGE_RETRIES: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// Token charges queued at most; beyond, a charge is dropped (and counted).
const CHARGE_QUEUE: usize = 10_000;

/// One queued token charge: a window key, the tokens, the key's expiry.
struct TokenCharge {
    key: String,
    amount: i64,
    expire_ms: u64,
}

/// Sliding-window counters in Redis.
pub struct RedisCounters {
    conn: RedisConn,
    prefix: String,
    charges: Batches<TokenCharge>,
}

impl RedisCounters {
    /// Counters under `prefix` on `conn`; `on_lost` is called with the error of each batch
    /// of token charges given up after its retries. Starts the charges' background thread.
    pub fn new(
        conn: RedisConn,
        prefix: impl Into<String>,
        on_lost: impl Fn(&CounterError) + Send + Sync + 'static,
    ) -> Result<RedisCounters, String> {
        let writer = conn.clone();
        let on_lost = Arc::new(on_lost);
        let charges = Batches::start_thread("gw-rate-limit", CHARGE_QUEUE, move |batch| {
            let (conn, on_lost) = (writer.clone(), on_lost.clone());
            async move {
                let mut result = send_charges(&conn, &batch).await;
                for wait in CHARGE_RETRIES {
                    if result.is_ok() {
                        break;
                    }
                    tokio::time::sleep(wait).await;
                    result = send_charges(&conn, &batch).await;
                }
                if let Err(e) = result {
                    on_lost(&CounterError(e));
                }
            }
        })?;
        Ok(RedisCounters {
            conn,
            prefix: prefix.into(),
            charges,
        })
    }

    /// The key of counter `id`'s fixed window `index`.
    pub fn key(&self, id: &str, index: u64) -> String {
        format!("{}{}:{}", self.prefix, key_part(id), index)
    }

    /// The connection, for an [`Admission`] to join.
    pub fn conn(&self) -> &RedisConn {
        &self.conn
    }

    /// The rate part of the admission script for `specs` at `now_ms`.
    pub fn prepare(&self, specs: &[CounterSpec], now_ms: u64) -> RateCall {
        let mut keys = Vec::with_capacity(2 * specs.len());
        let mut args = Vec::with_capacity(3 * specs.len());
        for spec in specs {
            let length = spec.window_ms();
            let index = window::index(now_ms, length);
            keys.push(self.key(&spec.id, index));
            keys.push(self.key(&spec.id, index.wrapping_sub(1)));
            // f64's Display is the shortest text that reads back as the same double.
            args.push(length.to_string());
            args.push(spec.limit.to_string());
            args.push(spec.cost.to_string());
        }
        RateCall { now_ms, keys, args }
    }

    /// What the script's rate reply says about `specs` at `now_ms`.
    pub fn decision(
        specs: &[CounterSpec],
        now_ms: u64,
        reply: &[i64],
    ) -> Result<Decision, CounterError> {
        if reply.len() != 1 + 3 * specs.len() {
            return Err(CounterError(format!(
                "the rate limit script answered {} values for {} counters",
                reply.len(),
                specs.len()
            )));
        }
        if reply[0] == 1 {
            return Ok(Decision::Allowed);
        }
        let refusals = specs.iter().enumerate().filter_map(|(i, spec)| {
            let at = 1 + 3 * i;
            (reply[at] == 0).then(|| {
                let (current, previous) =
                    (reply[at + 1].max(0) as u64, reply[at + 2].max(0) as u64);
                let secs = window::retry_after_secs(
                    now_ms,
                    spec.window_ms(),
                    current,
                    previous,
                    spec.limit,
                    spec.cost,
                );
                (i, secs)
            })
        });
        latest_refusal(refusals).ok_or_else(|| {
            CounterError("the rate limit script refused without naming a counter".to_owned())
        })
    }

    /// Queues a token charge for the background thread; `false` when its queue is full.
    pub fn charge_later(&self, id: &str, window_secs: u64, amount: u64, now_ms: u64) -> bool {
        if amount == 0 {
            return true;
        }
        self.charges
            .send(self.token_charge(id, window_secs, amount, now_ms))
    }

    /// The charge of `amount` tokens to counter `id`'s window at `now_ms`.
    fn token_charge(&self, id: &str, window_secs: u64, amount: u64, now_ms: u64) -> TokenCharge {
        let length = window_secs.saturating_mul(1000).max(1);
        TokenCharge {
            key: self.key(id, window::index(now_ms, length)),
            amount: i64::try_from(amount).unwrap_or(i64::MAX),
            expire_ms: 2 * length,
        }
    }
}

/// Sends a batch of token charges in one round trip (in a Redis Cluster, one per hash tag:
/// a pipeline's keys must share a slot there).
async fn send_charges(conn: &RedisConn, batch: &[TokenCharge]) -> Result<(), String> {
    if conn.is_cluster() {
        let mut tags: Vec<&str> = batch.iter().map(|c| tag_of(&c.key)).collect();
        tags.sort_unstable();
        tags.dedup();
        if tags.len() > 1 {
            for tag in tags {
                let group: Vec<&TokenCharge> =
                    batch.iter().filter(|c| tag_of(&c.key) == tag).collect();
                send_pipeline(conn, &group).await?;
            }
            return Ok(());
        }
    }
    send_pipeline(conn, &batch.iter().collect::<Vec<_>>()).await
}

async fn send_pipeline(conn: &RedisConn, batch: &[&TokenCharge]) -> Result<(), String> {
    let mut commands = Vec::with_capacity(2 * batch.len());
    for c in batch {
        let mut incr = redis::cmd("INCRBY");
        incr.arg(&c.key).arg(c.amount);
        let mut expire = redis::cmd("PEXPIRE");
        expire.arg(&c.key).arg(c.expire_ms);
        commands.push(incr);
        commands.push(expire);
    }
    let replies = conn.pipeline(commands, &[]).await?;
    match replies.iter().find_map(reply_error) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[async_trait]
impl Counters for RedisCounters {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn redis(&self) -> Option<&RedisCounters> {
        Some(self)
    }

    async fn check_and_charge(
        &self,
        specs: &[CounterSpec],
        now_ms: u64,
    ) -> Result<Decision, CounterError> {
        if specs.is_empty() {
            return Ok(Decision::Allowed);
        }
        let call = self.prepare(specs, now_ms);
        let (rate, _) = Admission::run(&self.conn, Some(&call), None)
            .await
            .map_err(CounterError)?;
        RedisCounters::decision(specs, now_ms, &rate)
    }

    async fn charge(
        &self,
        id: &str,
        window_secs: u64,
        amount: u64,
        now_ms: u64,
    ) -> Result<(), CounterError> {
        if amount == 0 {
            return Ok(());
        }
        let charge = self.token_charge(id, window_secs, amount, now_ms);
        send_charges(&self.conn, std::slice::from_ref(&charge))
            .await
            .map_err(CounterError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::redis::{test_conn, test_url};

    /// Mid-day, so that a daily window does not roll during a test.
    const NOW: u64 = 1_700_006_400_000 + 12 * 3_600_000;

    fn counters(conn: RedisConn, prefix: &str) -> RedisCounters {
        RedisCounters::new(conn, prefix, |e| panic!("token charges lost: {e}")).unwrap()
    }

    fn prefix() -> String {
        format!("gw:test:rl:{}:", uuid::Uuid::new_v4())
    }

    fn spec(id: &str, limit: f64, cost: u64) -> CounterSpec {
        CounterSpec {
            id: id.into(),
            window_secs: 86_400,
            limit,
            cost,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_instances_share_one_limit_exactly() {
        let Some(url) = test_url() else { return };
        let prefix = prefix();
        // Two "instances": independent connections, same Redis, same prefix.
        let a = Arc::new(counters(test_conn(&url).await, &prefix));
        let b = Arc::new(counters(test_conn(&url).await, &prefix));
        let tasks: Vec<_> = (0..300)
            .map(|i| {
                let c = if i % 2 == 0 { a.clone() } else { b.clone() };
                tokio::spawn(async move {
                    let specs = [spec("shared", 40.0, 1)];
                    c.check_and_charge(&specs, NOW)
                        .await
                        .expect("redis answers")
                        == Decision::Allowed
                })
            })
            .collect();
        let mut allowed = 0;
        for t in tasks {
            allowed += usize::from(t.await.unwrap());
        }
        assert_eq!(allowed, 40);
        match a
            .check_and_charge(&[spec("shared", 40.0, 1)], NOW)
            .await
            .unwrap()
        {
            Decision::Limited {
                retry_after_secs, ..
            } => {
                // Twelve hours to the next day, then 1/40 of it.
                assert_eq!(retry_after_secs, 12 * 3_600 + 86_400 / 40);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn all_or_nothing_and_expiry() {
        let Some(url) = test_url() else { return };
        let conn = test_conn(&url).await;
        let c = counters(conn.clone(), &prefix());
        assert_eq!(
            c.check_and_charge(&[spec("b", 1.0, 1)], NOW).await.unwrap(),
            Decision::Allowed
        );
        let both = [spec("a", 5.0, 1), spec("b", 1.0, 1)];
        assert!(matches!(
            c.check_and_charge(&both, NOW).await.unwrap(),
            Decision::Limited { spec: 1, .. }
        ));
        // "a" was not charged by the refused call.
        let index = window::index(NOW, 86_400_000);
        let key_a = c.key("a", index);
        let key_b = c.key("b", index);
        let (a, b, ttl): (Option<i64>, Option<i64>, i64) = conn
            .run(|mut r| async move {
                redis::pipe()
                    .get(&key_a)
                    .get(&key_b)
                    .cmd("PTTL")
                    .arg(&key_b)
                    .query_async(&mut r)
                    .await
            })
            .await
            .unwrap();
        assert_eq!((a, b), (None, Some(1)));
        // Expires two windows after the charge.
        assert!(ttl > 86_400_000 && ttl <= 2 * 86_400_000, "{ttl}");
    }

    #[tokio::test]
    async fn token_charge_then_refusal() {
        let Some(url) = test_url() else { return };
        let c = counters(test_conn(&url).await, &prefix());
        let check = [spec("tok", 1_000.0, 0)];
        assert_eq!(
            c.check_and_charge(&check, NOW).await.unwrap(),
            Decision::Allowed
        );
        c.charge("tok", 86_400, 999, NOW).await.unwrap();
        assert_eq!(
            c.check_and_charge(&check, NOW).await.unwrap(),
            Decision::Allowed
        );
        c.charge("tok", 86_400, 1, NOW).await.unwrap();
        assert!(matches!(
            c.check_and_charge(&check, NOW).await.unwrap(),
            Decision::Limited { .. }
        ));
        // The previous day's tokens weigh less as the next day goes on.
        let next_day = NOW + 12 * 3_600_000 + 1;
        assert_eq!(
            c.check_and_charge(&check, next_day).await.unwrap(),
            Decision::Allowed
        );
    }

    #[tokio::test]
    async fn the_same_arithmetic_as_the_memory_backend() {
        let Some(url) = test_url() else { return };
        let redis = counters(test_conn(&url).await, &prefix());
        let memory = super::super::memory::MemoryCounters::new(100);
        // A minute limit of 7 driven across a window edge at awkward times.
        let start = 1_700_000_080_000u64 + 17_000; // 57 s into a minute
        for step in 0..40u64 {
            let now = start + step * 977;
            let s = [CounterSpec {
                id: "x".into(),
                window_secs: 60,
                limit: 7.0,
                cost: 1,
            }];
            let r = redis.check_and_charge(&s, now).await.unwrap();
            let m = memory.check_and_charge(&s, now).await.unwrap();
            assert_eq!(r, m, "step {step} at {now}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_server_is_an_error() {
        let conn =
            RedisConn::new("redis://127.0.0.1:1", std::time::Duration::from_millis(300)).unwrap();
        let c = counters(conn, "gw:rl:");
        let err = c
            .check_and_charge(&[spec("x", 1.0, 1)], NOW)
            .await
            .expect_err("no server");
        assert!(err.0.contains("Redis"), "{err}");
        assert!(c.charge("x", 60, 5, NOW).await.is_err());
    }
}
