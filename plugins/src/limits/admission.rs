//! Shared mode's admission: a request's rate-limit counters and budget reservations checked
//! and charged in ONE Redis script call, one round trip before the provider call.
//!
//! `rate_limit` (Redis backend) does not call Redis in `on_request`: it
//! [defers](plugin_sdk::deferred) an [`Admission`] holding its counters and what to do with
//! the answer. `usage_limit` (Redis backend, same server) joins it, adds its reservation, and
//! defers it again; the pipeline completes it before the next plugin that does not join, so
//! every other plugin sees the request exactly as before. When only one of them uses Redis
//! (or they use different servers), each part is sent alone. The `cache` (Redis store, same
//! server) joins last with the lookup of the answer for the target provider selection chose:
//! its `GET` travels in the same round trip, after the script (a refused request's lookup is
//! read by no one).
//!
//! [`ADMIT`] runs the rate part first: when a counter refuses, nothing is charged and nothing
//! is reserved (the request never reaches the budgets, as when the plugins called Redis one
//! after the other); otherwise the counters are charged, then every budget is checked and, if
//! all have room, every one is reserved. Each part stays all or nothing, as before. Redis runs
//! a script without interleaving any other command, so concurrent requests on any number of
//! instances cannot both take the last slot.
//!
//! Keys: the rate counters' and the budgets' keys of one request are passed as the script's
//! KEYS, so they must live on one server (a single Redis, or a primary with replicas), as the
//! scripts of each part already required.

use async_trait::async_trait;
use redis::Value;

use plugin_sdk::{Deferred, GatewayError, RequestCx};

use super::redis::{reply_error, LuaScript, RedisConn};

/// The admission script.
///
/// ARGV[1]: the number of rate counters `nr`; ARGV[2]: the number of budgets `nb`; ARGV[3]:
/// the gateway's time in ms (it picks the window keys; instances agree within their clocks'
/// skew).
/// Rate part: KEYS[2i-1], KEYS[2i] are counter i's current and previous window; ARGV from 4,
/// three per counter: window length (ms), limit, cost.
/// Budget part: KEYS[2nr + j] is budget j's hash `{used, held}`; ARGV after the rate part,
/// four per budget: seed, amount, limit, ttl ms (0: none); then the slack.
///
/// Returns `{rate, budget}`: `rate` is `{all allowed (1|0), then per counter: allowed (1|0),
/// current, previous}` (counts before this call; `{1}` without counters); `budget` is `{"0"}`
/// when every budget holds its amount, `{index (1-based), used, held}` of the first without
/// room (then nothing is written: a refusal leaves every budget as it was), or `{}` when the
/// rate part refused (nothing charged, nothing reserved).
///
/// Redis spends a few microseconds on each call a script makes, so the script makes few: one
/// `MGET` for every rate counter's two windows and one `SET ... PX` per charged counter; per
/// budget one `HMGET`, one write and one `PEXPIRE`.
pub const ADMIT: &str = r"
local nr = tonumber(ARGV[1])
local nb = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local rate = {1}
if nr > 0 then
  local counts = redis.call('MGET', unpack(KEYS, 1, 2 * nr))
  for i = 1, nr do
    local a = 3 * i
    local length = tonumber(ARGV[a + 1])
    local limit = tonumber(ARGV[a + 2])
    local cost = tonumber(ARGV[a + 3])
    local cur = tonumber(counts[2 * i - 1]) or 0
    local prev = tonumber(counts[2 * i]) or 0
    local elapsed = now % length
    local estimate = prev * (length - elapsed) / length + cur
    local ok
    if cost == 0 then
      ok = estimate < limit
    else
      ok = estimate + cost <= limit
    end
    if not ok then
      rate[1] = 0
    end
    rate[3 * i - 1] = ok and 1 or 0
    rate[3 * i] = cur
    rate[3 * i + 1] = prev
  end
  if rate[1] == 0 then
    return {rate, {}}
  end
  for i = 1, nr do
    local a = 3 * i
    local cost = tonumber(ARGV[a + 3])
    if cost > 0 then
      redis.call('SET', KEYS[2 * i - 1], rate[3 * i] + cost, 'PX', 2 * tonumber(ARGV[a + 1]))
    end
  end
end
if nb == 0 then
  return {rate, {'0'}}
end
local base = 3 + 3 * nr
local eps = tonumber(ARGV[base + 4 * nb + 1])
local found = {}
for j = 1, nb do
  local b = base + 4 * (j - 1)
  local f = redis.call('HMGET', KEYS[2 * nr + j], 'used', 'held')
  found[j] = f[1]
  local used = tonumber(f[1] or ARGV[b + 1]) or 0
  local held = tonumber(f[2]) or 0
  local amount = tonumber(ARGV[b + 2])
  local limit = tonumber(ARGV[b + 3])
  local current = used + held
  if current >= limit - eps or current + amount > limit + eps then
    return {rate, {tostring(j), tostring(used), tostring(held)}}
  end
end
for j = 1, nb do
  local key = KEYS[2 * nr + j]
  local b = base + 4 * (j - 1)
  if found[j] then
    redis.call('HINCRBYFLOAT', key, 'held', ARGV[b + 2])
  else
    redis.call('HSET', key, 'used', ARGV[b + 1], 'held', ARGV[b + 2])
  end
  local ttl = tonumber(ARGV[b + 4])
  if ttl > 0 then
    redis.call('PEXPIRE', key, ttl)
  end
end
return {rate, {'0'}}
";

/// The script, loaded once per process.
pub fn admit_script() -> &'static LuaScript {
    static SCRIPT: std::sync::OnceLock<LuaScript> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| LuaScript::new(ADMIT))
}

/// The rate part of an admission: the counters' keys and arguments.
pub struct RateCall {
    pub now_ms: u64,
    /// Two per counter: the current window, the previous one.
    pub keys: Vec<String>,
    /// Three per counter: window length (ms), limit, cost.
    pub args: Vec<String>,
}

/// The budget part: one key and four arguments per budget.
pub struct BudgetCall {
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// What the rate part's reply does to the request: `Err` refuses it.
pub type RateConclusion = Box<
    dyn FnOnce(&mut RequestCx, Result<Vec<i64>, String>) -> Result<(), GatewayError> + Send + Sync,
>;
/// What the budget part's reply does to the request: `Err` refuses it.
pub type BudgetConclusion = Box<
    dyn FnOnce(&mut RequestCx, Result<Vec<String>, String>) -> Result<(), GatewayError>
        + Send
        + Sync,
>;

/// What the reply to a command sent with the admission does to the request (it runs only
/// when the admission let the request through).
pub type ExtraConclusion = Box<dyn FnOnce(&mut RequestCx, Result<Value, String>) + Send + Sync>;

/// A request's pending admission (see the module's documentation).
pub struct Admission {
    conn: RedisConn,
    rate: Option<(RateCall, RateConclusion)>,
    budget: Option<(BudgetCall, BudgetConclusion)>,
    extra: Option<(redis::Cmd, ExtraConclusion)>,
}

impl Admission {
    /// The admission deferred on `conn`'s server, taken out of the request; else (nothing
    /// deferred, or another check) a new one, after completing whatever was deferred.
    pub async fn join(cx: &mut RequestCx, conn: &RedisConn) -> Result<Admission, GatewayError> {
        if Admission::pending_on(cx, conn) {
            if let Some(Ok(admission)) = cx
                .deferred
                .take()
                .map(|d| d.into_any().downcast::<Admission>())
            {
                return Ok(*admission);
            }
        }
        cx.complete_deferred().await?;
        Ok(Admission {
            conn: conn.clone(),
            rate: None,
            budget: None,
            extra: None,
        })
    }

    /// Whether an admission on `conn`'s server is deferred in the request.
    pub fn pending_on(cx: &RequestCx, conn: &RedisConn) -> bool {
        cx.deferred
            .as_ref()
            .and_then(|d| d.as_any().downcast_ref::<Admission>())
            .is_some_and(|a| a.conn.same_server(conn))
    }

    pub fn set_rate(&mut self, call: RateCall, conclude: RateConclusion) {
        self.rate = Some((call, conclude));
    }

    pub fn set_budget(&mut self, call: BudgetCall, conclude: BudgetConclusion) {
        self.budget = Some((call, conclude));
    }

    /// Sends `command` in the same round trip, after the script.
    pub fn set_extra(&mut self, command: redis::Cmd, conclude: ExtraConclusion) {
        self.extra = Some((command, conclude));
    }

    /// Runs the script for the parts given: the rate reply and the budget reply.
    pub async fn run(
        conn: &RedisConn,
        rate: Option<&RateCall>,
        budget: Option<&BudgetCall>,
    ) -> Result<(Vec<i64>, Vec<String>), String> {
        Admission::send(conn, rate, budget, None).await.0
    }

    /// Runs the script, and `extra` after it in the same round trip: the script's replies,
    /// and `extra`'s when given.
    async fn send(
        conn: &RedisConn,
        rate: Option<&RateCall>,
        budget: Option<&BudgetCall>,
        extra: Option<redis::Cmd>,
    ) -> (
        Result<(Vec<i64>, Vec<String>), String>,
        Option<Result<Value, String>>,
    ) {
        let (nr, nb) = (
            rate.map_or(0, |r| r.keys.len() / 2),
            budget.map_or(0, |b| b.keys.len()),
        );
        let mut keys: Vec<&str> = Vec::with_capacity(2 * nr + nb);
        let mut args: Vec<&str> = Vec::with_capacity(3 + 3 * nr + 4 * nb + 1);
        let (nr_s, nb_s) = (nr.to_string(), nb.to_string());
        let now_s = rate.map_or(0, |r| r.now_ms).to_string();
        args.extend([nr_s.as_str(), nb_s.as_str(), now_s.as_str()]);
        if let Some(r) = rate {
            keys.extend(r.keys.iter().map(String::as_str));
            args.extend(r.args.iter().map(String::as_str));
        }
        if let Some(b) = budget {
            keys.extend(b.keys.iter().map(String::as_str));
            args.extend(b.args.iter().map(String::as_str));
        }
        let script = admit_script();
        let with_extra = extra.is_some();
        let mut commands = vec![script.call(&keys, &args)];
        commands.extend(extra);
        let sent = commands.len();
        let failed = |e: String| (Err(e.clone()), with_extra.then_some(Err(e)));
        let mut replies = match conn.pipeline(commands, &[script]).await {
            Ok(replies) if replies.len() == sent => replies.into_iter(),
            Ok(replies) => {
                return failed(format!(
                    "Redis answered {} replies to {sent} commands",
                    replies.len()
                ))
            }
            Err(e) => return failed(e),
        };
        let admitted = match replies.next() {
            Some(reply) => match reply_error(&reply) {
                Some(e) => Err(e),
                None => redis::from_redis_value(reply)
                    .map_err(|e| format!("unexpected reply from the admission script: {e}")),
            },
            None => Err("no reply from the admission script".to_owned()),
        };
        let extra = with_extra.then(|| match replies.next() {
            Some(reply) => match reply_error(&reply) {
                Some(e) => Err(e),
                None => Ok(reply),
            },
            None => Err("no reply".to_owned()),
        });
        (admitted, extra)
    }
}

#[async_trait]
impl Deferred for Admission {
    async fn complete(self: Box<Self>, cx: &mut RequestCx) -> Result<(), GatewayError> {
        let Admission {
            conn,
            rate,
            budget,
            extra,
        } = *self;
        let (extra_command, extra_conclude) = match extra {
            Some((command, conclude)) => (Some(command), Some(conclude)),
            None => (None, None),
        };
        let (reply, extra_reply) = Admission::send(
            &conn,
            rate.as_ref().map(|(call, _)| call),
            budget.as_ref().map(|(call, _)| call),
            extra_command,
        )
        .await;
        let (rate_reply, budget_reply) = match reply {
            Ok((r, b)) => (Ok(r), Ok(b)),
            Err(e) => (Err(e.clone()), Err(e)),
        };
        if let Some((_, conclude)) = rate {
            conclude(cx, rate_reply)?;
        }
        if let Some((_, conclude)) = budget {
            conclude(cx, budget_reply)?;
        }
        if let (Some(conclude), Some(reply)) = (extra_conclude, extra_reply) {
            conclude(cx, reply);
        }
        Ok(())
    }

    fn as_any(&self) -> &(dyn std::any::Any + Send + Sync) {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send + Sync> {
        self
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use http::Method;
    use plugin_sdk::{ErrorKind, Route};

    use super::*;
    use crate::limits::redis::{test_conn, test_proxy, test_url};
    use crate::rate_limit::redis::RedisCounters;
    use crate::rate_limit::{CounterSpec, Decision};
    use crate::usage_limit::{Hold, RedisLedger, Reserve};

    /// Mid-day, so that a daily window does not roll during the test.
    const NOW: u64 = 1_700_006_400_000 + 12 * 3_600_000;

    fn count(haystack: &[u8], needle: &[u8]) -> usize {
        memchr::memmem::find_iter(haystack, needle).count()
    }

    /// What the admission's parts concluded, for the test to read.
    #[derive(Clone, Default)]
    struct Seen {
        rate: Option<bool>,
        budget: Option<bool>,
        looked_up: Option<bool>,
    }

    fn cx() -> RequestCx {
        RequestCx::new(
            "t".into(),
            Route::ChatCompletions,
            Method::POST,
            "/v1/chat/completions".into(),
        )
    }

    /// Defers a rate part and a budget part the way the two plugins do (each joining the
    /// admission in turn), adds a lookup, completes, and returns what each part concluded.
    async fn admit(
        conn: &RedisConn,
        counters: &RedisCounters,
        specs: &[CounterSpec],
        holds: &[Hold],
    ) -> (Result<(), GatewayError>, Seen) {
        let mut cx = cx();
        cx.extensions.insert(Seen::default());
        let mut admission = Admission::join(&mut cx, conn).await.unwrap();
        let rate_specs = specs.to_vec();
        admission.set_rate(
            counters.prepare(specs, NOW),
            Box::new(move |cx, reply| {
                let decision = RedisCounters::decision(&rate_specs, NOW, &reply.unwrap()).unwrap();
                let allowed = decision == Decision::Allowed;
                cx.extensions.get_mut::<Seen>().unwrap().rate = Some(allowed);
                if allowed {
                    Ok(())
                } else {
                    Err(GatewayError::new(
                        ErrorKind::RateLimited {
                            retry_after_secs: 1,
                        },
                        "rate",
                    ))
                }
            }),
        );
        cx.deferred = Some(Box::new(admission));
        let mut admission = Admission::join(&mut cx, conn).await.unwrap();
        let n = holds.len();
        admission.set_budget(
            RedisLedger::prepare(holds),
            Box::new(move |cx, reply| {
                let held = RedisLedger::outcome(n, &reply.unwrap()).unwrap() == Reserve::Held;
                cx.extensions.get_mut::<Seen>().unwrap().budget = Some(held);
                if held {
                    Ok(())
                } else {
                    Err(GatewayError::new(ErrorKind::BudgetExhausted, "budget"))
                }
            }),
        );
        let mut lookup = redis::cmd("GET");
        lookup.arg("gw:test:admission:absent");
        admission.set_extra(
            lookup,
            Box::new(|cx, reply| {
                cx.extensions.get_mut::<Seen>().unwrap().looked_up =
                    Some(matches!(reply, Ok(Value::Nil)));
            }),
        );
        cx.deferred = Some(Box::new(admission));
        let result = cx.complete_deferred().await;
        (result, cx.extensions.get::<Seen>().cloned().unwrap())
    }

    #[tokio::test]
    async fn one_script_call_checks_the_rate_limits_and_reserves_the_budgets() {
        let Some(url) = test_url() else { return };
        let direct = test_conn(&url).await;
        let sent = Arc::new(Mutex::new(Vec::new()));
        let record = sent.clone();
        let proxy = test_proxy(&url, move |chunk| {
            record.lock().unwrap().extend_from_slice(chunk);
            Duration::ZERO
        })
        .await;
        let conn = RedisConn::new(&proxy, Duration::from_secs(2)).unwrap();
        let prefix = format!("gw:test:admission:{}:", uuid::Uuid::new_v4());
        let counters =
            RedisCounters::new(conn.clone(), format!("{prefix}rl:"), |e| panic!("{e}")).unwrap();
        // Loaded once, so that each admission below is exactly one script call.
        Admission::run(&conn, None, None).await.unwrap();
        sent.lock().unwrap().clear();

        // Two requests a day, three in the budget: the third request is refused by the rate
        // limit, and its budget is left as it was.
        let specs = [CounterSpec {
            id: "key".into(),
            window_secs: 86_400,
            limit: 2.0,
            cost: 1,
        }];
        let budget = format!("{prefix}budget:a");
        let holds = [Hold {
            key: budget.clone(),
            seed: 0.0,
            amount: 1.0,
            limit: 3.0,
            ttl: Some(Duration::from_secs(60)),
        }];
        for _ in 0..2 {
            let (result, seen) = admit(&conn, &counters, &specs, &holds).await;
            assert!(result.is_ok());
            assert_eq!(
                (seen.rate, seen.budget, seen.looked_up),
                (Some(true), Some(true), Some(true))
            );
        }
        let (result, seen) = admit(&conn, &counters, &specs, &holds).await;
        assert_eq!(result.unwrap_err().message, "rate");
        assert_eq!(
            (seen.rate, seen.budget, seen.looked_up),
            (Some(false), None, None)
        );
        let held: Option<String> = direct
            .run(|mut c| {
                let budget = budget.clone();
                async move {
                    redis::cmd("HGET")
                        .arg(budget)
                        .arg("held")
                        .query_async(&mut c)
                        .await
                }
            })
            .await
            .unwrap();
        assert_eq!(
            held.as_deref(),
            Some("2"),
            "the refused request reserved nothing"
        );

        // A budget without room refuses after the rate limit charged its counter, as when the
        // two plugins called Redis one after the other.
        let wide = [CounterSpec {
            id: "wide".into(),
            window_secs: 86_400,
            limit: 100.0,
            cost: 1,
        }];
        let full = [Hold {
            key: format!("{prefix}budget:b"),
            seed: 5.0,
            amount: 1.0,
            limit: 5.0,
            ttl: Some(Duration::from_secs(60)),
        }];
        let (result, seen) = admit(&conn, &counters, &wide, &full).await;
        assert_eq!(result.unwrap_err().message, "budget");
        assert_eq!((seen.rate, seen.budget), (Some(true), Some(false)));
        let index = crate::limits::window::index(NOW, 86_400_000);
        let charged: Option<i64> = direct
            .run(|mut c| {
                let key = counters.key("wide", index);
                async move { redis::cmd("GET").arg(key).query_async(&mut c).await }
            })
            .await
            .unwrap();
        assert_eq!(charged, Some(1));

        // Four admissions, four script calls: one round trip each, lookups included.
        let sent = sent.lock().unwrap();
        assert_eq!(count(&sent, b"EVALSHA"), 4);
        assert_eq!(count(&sent, b"\r\nGET\r\n"), 4);
    }
}
