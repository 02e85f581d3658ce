//! The Redis backend: one cache shared by every gateway instance that uses the same Redis.
//!
//! An entry is one string key, `{key_prefix}{hex sha-256}`, holding the entry framed by
//! [`Entry::encode`], written with `SET ... PX <ttl ms>` and read with `GET`. The connections
//! are those the limits use for the same URL ([`RedisConn::shared`]: one multiplexed
//! connection per thread, which reconnects by itself), opened at the first use, so the gateway
//! starts while Redis is down; every command is bounded by `redis_timeout_ms`.
//! After a failed command the store answers with an error at once for [`PAUSE_AFTER_FAILURE`],
//! so that an unreachable Redis does not add its timeout to every request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;

use super::key::CacheKey;
use super::store::{CacheStore, Entry, StoreError};
use crate::limits::redis::RedisConn;

/// How long commands are skipped after one failed.
pub const PAUSE_AFTER_FAILURE: Duration = Duration::from_secs(1);

pub struct RedisStore {
    conn: RedisConn,
    prefix: String,
    /// The store's clock start, for `paused_until_ms`.
    epoch: Instant,
    /// Commands are skipped until this time (ms since `epoch`; 0: not paused).
    paused_until_ms: AtomicU64,
}

impl RedisStore {
    /// Parses the URL (nothing is connected yet). The error never repeats the URL, which may
    /// hold a password.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<RedisStore, String> {
        Ok(RedisStore {
            conn: RedisConn::shared(url, timeout)
                .map_err(|e| format!("the Redis URL is not valid: {e}"))?,
            prefix: prefix.to_owned(),
            epoch: Instant::now(),
            paused_until_ms: AtomicU64::new(0),
        })
    }

    /// The Redis key of a cache key.
    pub fn redis_key(&self, key: &CacheKey) -> String {
        format!("{}{}", self.prefix, key.hex())
    }

    /// The connection, for the lookup to join an [`Admission`](crate::limits::admission).
    pub fn conn(&self) -> &RedisConn {
        &self.conn
    }

    /// The command that reads `key`'s entry.
    pub fn get_command(&self, key: &CacheKey) -> redis::Cmd {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.redis_key(key));
        cmd
    }

    /// The entry in the reply to [`RedisStore::get_command`] sent some other way (with an
    /// admission); a failure pauses the store as a failed [`CacheStore::get`] does.
    pub fn read_reply(
        &self,
        reply: Result<redis::Value, String>,
    ) -> Result<Option<Entry>, StoreError> {
        let value = match reply {
            Ok(value) => value,
            Err(e) => {
                self.pause();
                return Err(StoreError(format!("redis: {e}")));
            }
        };
        let value: Option<Vec<u8>> = redis::from_redis_value(value)
            .map_err(|e| StoreError(format!("redis: unexpected reply: {e}")))?;
        value.map(|v| Entry::decode(Bytes::from(v))).transpose()
    }

    /// Skips commands for [`PAUSE_AFTER_FAILURE`].
    fn pause(&self) {
        let resume = self.now_ms() + u64::try_from(PAUSE_AFTER_FAILURE.as_millis()).unwrap_or(0);
        self.paused_until_ms.store(resume, Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    async fn run<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        if self.now_ms() < self.paused_until_ms.load(Ordering::Relaxed) {
            return Err(StoreError(
                "redis: skipped, a command failed less than a second ago".to_owned(),
            ));
        }
        let result = match self
            .conn
            .run(|mut c| async move { cmd.query_async::<T>(&mut c).await })
            .await
        {
            Ok(v) => return Ok(v),
            Err(e) => Err(StoreError(format!("redis: {e}"))),
        };
        self.pause();
        result
    }
}

#[async_trait]
impl CacheStore for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn redis(&self) -> Option<&RedisStore> {
        Some(self)
    }

    async fn get(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError> {
        let value: Option<Vec<u8>> = self.run(self.get_command(key)).await?;
        value.map(|v| Entry::decode(Bytes::from(v))).transpose()
    }

    async fn put(&self, key: &CacheKey, entry: Entry, ttl: Duration) -> Result<(), StoreError> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.redis_key(key))
            .arg(entry.encode().as_ref())
            .arg("PX")
            .arg(ms);
        self.run::<()>(cmd).await
    }
}
