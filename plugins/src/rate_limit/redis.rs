//! The Redis counter backend (`GW_REDIS_URL`): one limit shared exactly by every gateway
//! instance that uses the same Redis.
//!
//! Each counter is two keys, the count of the current fixed window and of the previous one:
//! `<prefix><id>:<window index>` (prefix `gw:rl:` by default; an id longer than 200 bytes is
//! replaced by its SHA-256). A key expires two windows after it was last charged, when it no
//! longer counts.
//!
//! A request's check-and-charge of all its counters is ONE Lua script ([`CHECK_AND_CHARGE`]):
//! Redis runs a script without interleaving any other command, so concurrent requests on any
//! number of instances cannot both take the last slot. The time is the gateway's (`now` in
//! milliseconds is an argument, and picks the window keys), so instances agree within their
//! clocks' skew.
//!
//! A script touching several keys needs them on one node: a Redis Cluster is not supported
//! (a single server, or one with replicas, is).

use std::sync::Arc;

use async_trait::async_trait;
use redis::Script;

use super::counters::{latest_refusal, CounterError, CounterSpec, Counters, Decision};
use crate::limits::redis::{key_part, RedisConn};
use crate::limits::window;

/// The check-and-charge script.
///
/// KEYS: for counter i (from 1), `KEYS[2i-1]` its current window, `KEYS[2i]` its previous one.
/// ARGV: `now` (ms), then for each counter its window length (ms), limit and cost.
/// Returns `{all allowed (1|0), then per counter: allowed (1|0), current, previous}` with the
/// counts before this call. Charges (INCRBY cost, expiry two windows) only when all allow.
/// The estimate and comparison are those of [`window::estimate`] and [`window::allows`].
pub const CHECK_AND_CHARGE: &str = r"
local now = tonumber(ARGV[1])
local n = #KEYS / 2
local out = {1}
for i = 1, n do
  local length = tonumber(ARGV[3 * i - 1])
  local limit = tonumber(ARGV[3 * i])
  local cost = tonumber(ARGV[3 * i + 1])
  local cur = tonumber(redis.call('GET', KEYS[2 * i - 1]) or '0')
  local prev = tonumber(redis.call('GET', KEYS[2 * i]) or '0')
  local elapsed = now % length
  local estimate = prev * (length - elapsed) / length + cur
  local ok
  if cost == 0 then
    ok = estimate < limit
  else
    ok = estimate + cost <= limit
  end
  if not ok then
    out[1] = 0
  end
  out[3 * i - 1] = ok and 1 or 0
  out[3 * i] = cur
  out[3 * i + 1] = prev
end
if out[1] == 1 then
  for i = 1, n do
    local length = tonumber(ARGV[3 * i - 1])
    local cost = tonumber(ARGV[3 * i + 1])
    if cost > 0 then
      redis.call('INCRBY', KEYS[2 * i - 1], cost)
      redis.call('PEXPIRE', KEYS[2 * i - 1], 2 * length)
    end
  end
end
return out
";

/// Sliding-window counters in Redis.
pub struct RedisCounters {
    conn: Arc<RedisConn>,
    prefix: String,
    script: Script,
}

impl RedisCounters {
    /// Counters under `prefix` on `conn`.
    pub fn new(conn: Arc<RedisConn>, prefix: impl Into<String>) -> RedisCounters {
        RedisCounters {
            conn,
            prefix: prefix.into(),
            script: Script::new(CHECK_AND_CHARGE),
        }
    }

    /// The key of counter `id`'s fixed window `index`.
    pub fn key(&self, id: &str, index: u64) -> String {
        format!("{}{}:{}", self.prefix, key_part(id), index)
    }
}

#[async_trait]
impl Counters for RedisCounters {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn check_and_charge(
        &self,
        specs: &[CounterSpec],
        now_ms: u64,
    ) -> Result<Decision, CounterError> {
        if specs.is_empty() {
            return Ok(Decision::Allowed);
        }
        let mut invocation = self.script.prepare_invoke();
        invocation.arg(now_ms);
        for spec in specs {
            let length = spec.window_ms();
            let index = window::index(now_ms, length);
            invocation
                .key(self.key(&spec.id, index))
                .key(self.key(&spec.id, index.wrapping_sub(1)));
            // f64's Display is the shortest text that reads back as the same double.
            invocation
                .arg(length)
                .arg(spec.limit.to_string())
                .arg(spec.cost);
        }
        let reply: Vec<i64> = self
            .conn
            .run(|mut c| async move { invocation.invoke_async(&mut c).await })
            .await
            .map_err(CounterError)?;
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
        let length = window_secs.saturating_mul(1000).max(1);
        let key = self.key(id, window::index(now_ms, length));
        let amount = i64::try_from(amount).unwrap_or(i64::MAX);
        self.conn
            .run(|mut c| async move {
                redis::pipe()
                    .atomic()
                    .cmd("INCRBY")
                    .arg(&key)
                    .arg(amount)
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(&key)
                    .arg(2 * length)
                    .ignore()
                    .query_async::<()>(&mut c)
                    .await
            })
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
        let a = Arc::new(RedisCounters::new(
            Arc::new(test_conn(&url).await),
            prefix.clone(),
        ));
        let b = Arc::new(RedisCounters::new(Arc::new(test_conn(&url).await), prefix));
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
        let conn = Arc::new(test_conn(&url).await);
        let c = RedisCounters::new(conn.clone(), prefix());
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
        let c = RedisCounters::new(Arc::new(test_conn(&url).await), prefix());
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
        let redis = RedisCounters::new(Arc::new(test_conn(&url).await), prefix());
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
        let c = RedisCounters::new(Arc::new(conn), "gw:rl:");
        let err = c
            .check_and_charge(&[spec("x", 1.0, 1)], NOW)
            .await
            .expect_err("no server");
        assert!(err.0.contains("Redis"), "{err}");
        assert!(c.charge("x", 60, 5, NOW).await.is_err());
    }
}
