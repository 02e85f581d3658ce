//! The Redis backend: one cache shared by every gateway instance that uses the same Redis.
//!
//! An entry is one string key, `{key_prefix}{hex sha-256}`, holding the entry framed by
//! [`Entry::encode`], written with `SET ... PX <ttl ms>` and read with `GET`. The connection
//! (a `redis` connection manager, which reconnects by itself) is opened at the first use, so
//! the gateway starts while Redis is down; every command is bounded by `redis_timeout_ms`.
//! After a failed command the store answers with an error at once for [`PAUSE_AFTER_FAILURE`],
//! so that an unreachable Redis does not add its timeout to every request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::key::CacheKey;
use super::store::{CacheStore, Entry, StoreError};

/// How long commands are skipped after one failed.
pub const PAUSE_AFTER_FAILURE: Duration = Duration::from_secs(1);

pub struct RedisStore {
    client: redis::Client,
    conn: OnceLock<ConnectionManager>,
    prefix: String,
    timeout: Duration,
    /// The store's clock start, for `paused_until_ms`.
    epoch: Instant,
    /// Commands are skipped until this time (ms since `epoch`; 0: not paused).
    paused_until_ms: AtomicU64,
}

impl RedisStore {
    /// Parses the URL (nothing is connected yet). The error never repeats the URL, which may
    /// hold a password.
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<RedisStore, String> {
        let client = redis::Client::open(url)
            .map_err(|e| format!("the Redis URL (GW_REDIS_URL) is not valid: {:?}", e.kind()))?;
        Ok(RedisStore {
            client,
            conn: OnceLock::new(),
            prefix: prefix.to_owned(),
            timeout,
            epoch: Instant::now(),
            paused_until_ms: AtomicU64::new(0),
        })
    }

    /// The Redis key of a cache key.
    pub fn redis_key(&self, key: &CacheKey) -> String {
        format!("{}{}", self.prefix, key.hex())
    }

    fn connection(&self) -> Result<ConnectionManager, StoreError> {
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let manager = self
            .client
            .get_connection_manager_lazy(config)
            .map_err(|e| StoreError(format!("redis: {e}")))?;
        // Two first requests may race here; one manager wins and the other is dropped.
        Ok(self.conn.get_or_init(|| manager).clone())
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
        let mut conn = self.connection()?;
        let result = match tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut conn)).await
        {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => Err(StoreError(format!("redis: {e}"))),
            Err(_) => Err(StoreError(format!(
                "redis: no answer within {} ms",
                self.timeout.as_millis()
            ))),
        };
        let resume = self.now_ms() + u64::try_from(PAUSE_AFTER_FAILURE.as_millis()).unwrap_or(0);
        self.paused_until_ms.store(resume, Ordering::Relaxed);
        result
    }
}

#[async_trait]
impl CacheStore for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn get(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.redis_key(key));
        let value: Option<Vec<u8>> = self.run(cmd).await?;
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
