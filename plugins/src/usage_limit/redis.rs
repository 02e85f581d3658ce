//! Budget counters in Redis, shared by every gateway instance that uses the same server.
//!
//! A counter is a hash `{used, held}` (see `ledger.rs`). Reserving is ONE Lua script over all
//! of a request's counters (seed the missing ones, check every one, then add to every one), so
//! concurrent requests on any number of instances cannot overspend; settling is another.
//! Each write refreshes the counter's expiry (`ttl`).
//!
//! The scripts touch several keys, so the counters of one request must live on one server:
//! a single Redis (or a primary with replicas/Sentinel), not Redis Cluster.
//!
//! The connection is opened at the first request, on the plugin's own runtime (`spawn_on`),
//! so that its driver task lives as long as the plugin whichever runtime serves requests.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use tokio::runtime::Handle;
use tokio::sync::OnceCell;

use super::ledger::{Hold, Ledger, Reserve, Settle, EPSILON};

/// After a failed connection attempt, requests fail fast for this long instead of each
/// waiting for its own attempt.
const RETRY_CONNECT_AFTER: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A budget check waits at most this long for Redis.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// KEYS: the counters. ARGV, four per key: seed, amount, limit, ttl in ms (0: none); then
/// the slack. Returns {"0"} when every counter holds its amount, else {index (1-based), used,
/// held} of the first counter without room.
const RESERVE: &str = r#"
local n = #KEYS
local eps = tonumber(ARGV[n * 4 + 1])
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('HSET', KEYS[i], 'used', ARGV[(i - 1) * 4 + 1], 'held', '0')
  end
end
local refused = nil
for i = 1, n do
  local b = (i - 1) * 4
  local used = tonumber(redis.call('HGET', KEYS[i], 'used')) or 0
  local held = tonumber(redis.call('HGET', KEYS[i], 'held')) or 0
  local amount = tonumber(ARGV[b + 2])
  local limit = tonumber(ARGV[b + 3])
  local current = used + held
  if current >= limit - eps or current + amount > limit + eps then
    refused = {tostring(i), tostring(used), tostring(held)}
    break
  end
end
for i = 1, n do
  local b = (i - 1) * 4
  if refused == nil then
    redis.call('HINCRBYFLOAT', KEYS[i], 'held', ARGV[b + 2])
  end
  local ttl = tonumber(ARGV[b + 4])
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
if refused then
  return refused
end
return {'0'}
"#;

/// KEYS: the counters, then the settlement's token. ARGV, four per key: seed, actual, minus
/// the reserved amount, ttl in ms (0: none). A token already seen (a retry whose first try did
/// run; retries end within seconds, a token is kept a minute) changes nothing. Returns each
/// counter's `used` afterwards.
const SETTLE: &str = r#"
local n = #KEYS - 1
local first = redis.call('SET', KEYS[n + 1], '1', 'NX', 'PX', 60000)
local out = {}
for i = 1, n do
  local b = (i - 1) * 4
  if first then
    if redis.call('EXISTS', KEYS[i]) == 0 then
      redis.call('HSET', KEYS[i], 'used', ARGV[b + 1], 'held', '0')
    end
    redis.call('HINCRBYFLOAT', KEYS[i], 'used', ARGV[b + 2])
    local held = tonumber(redis.call('HINCRBYFLOAT', KEYS[i], 'held', ARGV[b + 3]))
    if held < 0 then
      redis.call('HSET', KEYS[i], 'held', '0')
    end
    local ttl = tonumber(ARGV[b + 4])
    if ttl > 0 then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
  out[i] = redis.call('HGET', KEYS[i], 'used') or '0'
end
return out
"#;

pub struct RedisLedger {
    client: redis::Client,
    spawn_on: Option<Handle>,
    conn: OnceCell<ConnectionManager>,
    last_failure: Mutex<Option<Instant>>,
    reserve: Script,
    settle: Script,
}

impl RedisLedger {
    /// A ledger over the server at `url` (not contacted yet). The error never repeats the URL
    /// (it may hold a password).
    pub fn new(url: &str, spawn_on: Option<Handle>) -> Result<RedisLedger, String> {
        let client = redis::Client::open(url)
            .map_err(|e| format!("GW_REDIS_URL is not a usable Redis URL ({:?})", e.kind()))?;
        Ok(RedisLedger {
            client,
            spawn_on,
            conn: OnceCell::new(),
            last_failure: Mutex::new(None),
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
        })
    }

    async fn connection(&self) -> Result<ConnectionManager, String> {
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        let failed_recently = self
            .last_failure
            .lock()
            .ok()
            .and_then(|f| *f)
            .is_some_and(|at| at.elapsed() < RETRY_CONNECT_AFTER);
        if failed_recently {
            return Err("Redis is unreachable (retrying shortly)".into());
        }
        let result = self
            .conn
            .get_or_try_init(|| async {
                let client = self.client.clone();
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(2);
                let connect =
                    async move { client.get_connection_manager_with_config(config).await };
                let connected = match &self.spawn_on {
                    Some(handle) => handle
                        .spawn(connect)
                        .await
                        .map_err(|e| format!("the Redis connection task failed: {e}"))?,
                    None => connect.await,
                };
                connected.map_err(|e| format!("cannot connect to Redis: {e}"))
            })
            .await
            .cloned();
        if result.is_err() {
            if let Ok(mut f) = self.last_failure.lock() {
                *f = Some(Instant::now());
            }
        }
        result
    }
}

/// A number as Redis and Lua read it (`{}` never uses an exponent); non-finite values are 0.
fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "0".into()
    }
}

fn ttl_ms(ttl: Option<Duration>) -> u64 {
    ttl.map_or(0, |t| t.as_millis().clamp(1, u128::from(u64::MAX)) as u64)
}

#[async_trait]
impl Ledger for RedisLedger {
    async fn reserve(&self, holds: &[Hold]) -> Result<Reserve, String> {
        if holds.is_empty() {
            return Ok(Reserve::Held);
        }
        let mut conn = self.connection().await?;
        let mut call = self.reserve.prepare_invoke();
        for h in holds {
            call.key(&h.key)
                .arg(num(h.seed))
                .arg(num(h.amount))
                .arg(num(h.limit))
                .arg(ttl_ms(h.ttl));
        }
        call.arg(num(EPSILON));
        let reply: Vec<String> = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("Redis budget reservation failed: {e}"))?;
        let field = |i: usize| -> Result<f64, String> {
            reply
                .get(i)
                .and_then(|s| s.parse::<f64>().ok())
                .ok_or_else(|| format!("unexpected reply from the reservation script: {reply:?}"))
        };
        match field(0)? as usize {
            0 => Ok(Reserve::Held),
            i if i <= holds.len() => Ok(Reserve::Refused {
                index: i - 1,
                used: field(1)?,
                held: field(2)?,
            }),
            _ => Err(format!(
                "unexpected reply from the reservation script: {reply:?}"
            )),
        }
    }

    async fn settle(&self, token: &str, items: &[Settle]) -> Result<Vec<f64>, String> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.connection().await?;
        let mut call = self.settle.prepare_invoke();
        for s in items {
            call.key(&s.key);
        }
        call.key(token);
        for s in items {
            call.arg(num(s.seed))
                .arg(num(s.actual))
                .arg(num(-s.reserved))
                .arg(ttl_ms(s.ttl));
        }
        let reply: Vec<String> = call
            .invoke_async(&mut conn)
            .await
            .map_err(|e| format!("Redis budget settlement failed: {e}"))?;
        if reply.len() != items.len() {
            return Err(format!(
                "unexpected reply from the settlement script: {reply:?}"
            ));
        }
        reply
            .iter()
            .map(|s| {
                s.parse::<f64>()
                    .map_err(|_| format!("unexpected reply from the settlement script: {reply:?}"))
            })
            .collect()
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// `GW_TEST_REDIS_URL`, or `None` (the test is skipped) when unset.
    fn redis_url() -> Option<String> {
        match std::env::var("GW_TEST_REDIS_URL") {
            Ok(url) if !url.is_empty() => Some(url),
            _ => {
                eprintln!("GW_TEST_REDIS_URL is not set: skipping the Redis ledger test");
                None
            }
        }
    }

    fn prefix() -> String {
        format!("gw:test:budget:{}:", uuid::Uuid::new_v4())
    }

    fn hold(key: &str, amount: f64, limit: f64) -> Hold {
        Hold {
            key: key.into(),
            seed: 0.0,
            amount,
            limit,
            ttl: Some(Duration::from_secs(60)),
        }
    }

    async fn ledger(url: &str) -> RedisLedger {
        let l = RedisLedger::new(url, None).expect("a valid URL");
        // Fail loudly when the variable is set but the server is not there.
        l.connection()
            .await
            .unwrap_or_else(|e| panic!("GW_TEST_REDIS_URL is set but Redis is unreachable: {e}"));
        l
    }

    #[test]
    fn a_bad_url_is_a_clear_error_without_the_url() {
        let err = RedisLedger::new("nope://user:hunter2@host", None)
            .err()
            .expect("refused");
        assert!(err.contains("GW_REDIS_URL"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn numbers_are_written_without_exponents() {
        assert_eq!(num(1e-7), "0.0000001");
        assert_eq!(num(2.0), "2");
        assert_eq!(num(f64::NAN), "0");
        assert_eq!(ttl_ms(None), 0);
        assert_eq!(ttl_ms(Some(Duration::from_secs(2))), 2000);
    }

    #[tokio::test]
    async fn reserve_and_settle_in_redis() {
        let Some(url) = redis_url() else { return };
        let l = ledger(&url).await;
        let p = prefix();
        let (a, b) = (format!("{p}a"), format!("{p}b"));
        let mut ha = hold(&a, 1.0, 10.0);
        ha.seed = 7.0;
        let hb = hold(&b, 1.0, 1.0);
        assert_eq!(
            l.reserve(&[ha.clone(), hb.clone()]).await.unwrap(),
            Reserve::Held
        );
        // b is full now: a must not move either.
        assert_eq!(
            l.reserve(&[ha.clone(), hb.clone()]).await.unwrap(),
            Reserve::Refused {
                index: 1,
                used: 0.0,
                held: 1.0
            }
        );
        // a has 7 used + 1 held: 3 more does not fit 10 (the seed applied once only).
        let mut big = ha.clone();
        big.amount = 3.0;
        assert_eq!(
            l.reserve(&[big]).await.unwrap(),
            Reserve::Refused {
                index: 0,
                used: 7.0,
                held: 1.0
            }
        );
        let token = format!("{p}settled:1");
        let used = l
            .settle(
                &token,
                &[
                    Settle {
                        key: a.clone(),
                        seed: 0.0,
                        actual: 0.5,
                        reserved: 1.0,
                        ttl: Some(Duration::from_secs(60)),
                    },
                    Settle {
                        key: b.clone(),
                        seed: 0.0,
                        actual: 0.0,
                        reserved: 1.0,
                        ttl: Some(Duration::from_secs(60)),
                    },
                ],
            )
            .await
            .unwrap();
        assert_eq!(used, vec![7.5, 0.0]);
        // A retry of the same settlement changes nothing.
        let again = l
            .settle(
                &token,
                &[Settle {
                    key: a.clone(),
                    seed: 0.0,
                    actual: 0.5,
                    reserved: 1.0,
                    ttl: Some(Duration::from_secs(60)),
                }],
            )
            .await
            .unwrap();
        assert_eq!(again, vec![7.5]);
        assert_eq!(l.reserve(&[ha, hb]).await.unwrap(), Reserve::Held);
        // Counters expire.
        let mut conn = l.connection().await.unwrap();
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&a)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
        let _: () = redis::cmd("DEL")
            .arg(&a)
            .arg(&b)
            .arg(&token)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    /// Two connection managers stand for two gateway instances.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_instances_never_overspend() {
        let Some(url) = redis_url() else { return };
        let instances = [Arc::new(ledger(&url).await), Arc::new(ledger(&url).await)];
        let p = prefix();
        let key = format!("{p}shared");
        let granted = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..120 {
            let l = instances[i % 2].clone();
            let (key, granted) = (key.clone(), granted.clone());
            tasks.push(tokio::spawn(async move {
                // 0.1 dollars each against 2.5: 25 fit, summing binary-inexact tenths.
                if l.reserve(&[hold(&key, 0.1, 2.5)]).await.unwrap() == Reserve::Held {
                    granted.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(granted.load(Ordering::SeqCst), 25);
        let mut conn = instances[0].connection().await.unwrap();
        let held: f64 = redis::cmd("HGET")
            .arg(&key)
            .arg("held")
            .query_async::<String>(&mut conn)
            .await
            .unwrap()
            .parse()
            .unwrap();
        assert!((held - 2.5).abs() < 1e-9, "{held}");
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}
