//! Budget counters in Redis, shared by every gateway instance that uses the same server.
//!
//! A counter is a hash `{used, held}` (see `ledger.rs`). Reserving is the budget part of ONE
//! Lua script over all of a request's counters (seed the missing ones, check every one, then
//! add to every one; see [`crate::limits::admission`], which on the request path also checks
//! the rate limits in the same call), so concurrent requests on any number of instances cannot
//! overspend; settling is another script ([`SETTLE`]), which the plugin runs in the
//! background for many settlements at once. Each write refreshes the counter's expiry (`ttl`).
//!
//! The scripts touch several keys, so the counters of one call must live on one node: a
//! counter's key carries its organisation's hash tag (`<prefix>{org-id}<budget id>:...`), so
//! a request's budgets share a slot, and in a Redis Cluster the plugin settles a batch one
//! call per tag.

use std::time::Duration;

use async_trait::async_trait;

use super::ledger::{Hold, Ledger, Reserve, Settle, EPSILON};
use crate::limits::admission::{Admission, BudgetCall};
use crate::limits::redis::{reply_error, LuaScript, RedisConn};

/// A budget check waits at most this long for Redis.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// KEYS: the counters, then the settlement's token. ARGV, four per key: seed, actual, minus
/// the reserved amount, ttl in ms (0: none). A token already seen (a retry whose first try did
/// run; retries end within seconds, a token is kept a minute) changes nothing. Returns each
/// counter's `used` afterwards. Four commands per counter: Redis spends a few microseconds on
/// each call a script makes.
pub const SETTLE: &str = r#"
local n = #KEYS - 1
local out = {}
if not redis.call('SET', KEYS[n + 1], '1', 'NX', 'PX', 60000) then
  for i = 1, n do
    out[i] = redis.call('HGET', KEYS[i], 'used') or '0'
  end
  return out
end
for i = 1, n do
  local b = (i - 1) * 4
  redis.call('HSETNX', KEYS[i], 'used', ARGV[b + 1])
  out[i] = redis.call('HINCRBYFLOAT', KEYS[i], 'used', ARGV[b + 2])
  if tonumber(redis.call('HINCRBYFLOAT', KEYS[i], 'held', ARGV[b + 3])) < 0 then
    redis.call('HSET', KEYS[i], 'held', '0')
  end
  local ttl = tonumber(ARGV[b + 4])
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return out
"#;

pub struct RedisLedger {
    conn: RedisConn,
    settle: LuaScript,
}

impl RedisLedger {
    /// A ledger over the server at `url` (not contacted yet), sharing its connections with
    /// the other plugins that use the same URL. The error never repeats the URL (it may hold
    /// a password).
    pub fn new(url: &str) -> Result<RedisLedger, String> {
        Ok(RedisLedger::on(RedisConn::shared(url, RESPONSE_TIMEOUT)?))
    }

    /// A ledger on `conn`.
    pub fn on(conn: RedisConn) -> RedisLedger {
        RedisLedger {
            conn,
            settle: LuaScript::new(SETTLE),
        }
    }

    /// The connection, for an [`Admission`] to join.
    pub fn conn(&self) -> &RedisConn {
        &self.conn
    }

    /// The budget part of the admission script for `holds`.
    pub fn prepare(holds: &[Hold]) -> BudgetCall {
        let mut keys = Vec::with_capacity(holds.len());
        let mut args = Vec::with_capacity(4 * holds.len() + 1);
        for h in holds {
            keys.push(h.key.clone());
            args.push(num(h.seed));
            args.push(num(h.amount));
            args.push(num(h.limit));
            args.push(ttl_ms(h.ttl).to_string());
        }
        args.push(num(EPSILON));
        BudgetCall { keys, args }
    }

    /// What the script's budget reply says about `holds` holds.
    pub fn outcome(holds: usize, reply: &[String]) -> Result<Reserve, String> {
        let field = |i: usize| -> Result<f64, String> {
            reply
                .get(i)
                .and_then(|s| s.parse::<f64>().ok())
                .ok_or_else(|| format!("unexpected reply from the reservation script: {reply:?}"))
        };
        match field(0)? as usize {
            0 => Ok(Reserve::Held),
            i if i <= holds => Ok(Reserve::Refused {
                index: i - 1,
                used: field(1)?,
                held: field(2)?,
            }),
            _ => Err(format!(
                "unexpected reply from the reservation script: {reply:?}"
            )),
        }
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
        let call = RedisLedger::prepare(holds);
        let (_, reply) = Admission::run(&self.conn, None, Some(&call))
            .await
            .map_err(|e| format!("Redis budget reservation failed: {e}"))?;
        RedisLedger::outcome(holds.len(), &reply)
    }

    async fn settle(&self, token: &str, items: &[Settle]) -> Result<Vec<f64>, String> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let mut keys: Vec<&str> = items.iter().map(|s| s.key.as_str()).collect();
        keys.push(token);
        let mut args = Vec::with_capacity(4 * items.len());
        for s in items {
            args.push(num(s.seed));
            args.push(num(s.actual));
            args.push(num(-s.reserved));
            args.push(ttl_ms(s.ttl).to_string());
        }
        let mut replies = self
            .conn
            .pipeline(vec![self.settle.call(&keys, &args)], &[&self.settle])
            .await
            .map_err(|e| format!("Redis budget settlement failed: {e}"))?;
        let reply = replies.pop().unwrap_or(redis::Value::Nil);
        if let Some(e) = reply_error(&reply) {
            return Err(format!("Redis budget settlement failed: {e}"));
        }
        let reply: Vec<String> = redis::from_redis_value(reply)
            .map_err(|e| format!("unexpected reply from the settlement script: {e}"))?;
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

    fn redis(&self) -> Option<&RedisLedger> {
        Some(self)
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
        // Each ledger on connections of its own, as another instance would be.
        let l = RedisLedger::on(RedisConn::new(url, Duration::from_secs(2)).expect("a valid URL"));
        // Fail loudly when the variable is set but the server is not there.
        l.conn()
            .connection()
            .await
            .unwrap_or_else(|e| panic!("GW_TEST_REDIS_URL is set but Redis is unreachable: {e}"));
        l
    }

    #[test]
    fn a_bad_url_is_a_clear_error_without_the_url() {
        let err = RedisLedger::new("nope://user:hunter2@host")
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
        let mut conn = l.conn().connection().await.unwrap();
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
        let mut conn = instances[0].conn().connection().await.unwrap();
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
