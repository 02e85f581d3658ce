//! The connection to the Redis server that holds counters shared by several gateway instances
//! (`GW_REDIS_URL`).
//!
//! [`RedisConn::new`] only parses the URL (plugins are built before the gateway's runtime
//! serves anything, and may be built outside one); the connection is opened on first use, from
//! inside a request, as a [`ConnectionManager`] that reconnects by itself after a failure. Every
//! command is bounded by the timeout given to [`RedisConn::new`].
//!
//! After a failed connection attempt, a lost connection or a command that timed out, calls fail
//! at once for [`RECONNECT_BACKOFF`] instead of each waiting for a timeout: during an outage
//! requests pay no extra latency (the caller's fail-open or fail-closed choice applies), and
//! Redis is tried again after the pause.
//!
//! The URL may hold a password: it is never logged nor put in an error message.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

/// How long calls fail fast after Redis could not be reached.
pub const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

const UNREACHABLE: &str = "Redis is unreachable (retrying shortly)";

/// A lazily opened, shared connection to Redis. Cheap to share behind an `Arc`.
pub struct RedisConn {
    client: redis::Client,
    manager: OnceCell<ConnectionManager>,
    last_failure: Mutex<Option<Instant>>,
    timeout: Duration,
}

impl RedisConn {
    /// Parses `url` (`redis://[user:password@]host[:port][/db]`); no I/O. `timeout` bounds the
    /// connection attempt and every command. The error never repeats the URL.
    pub fn new(url: &str, timeout: Duration) -> Result<RedisConn, String> {
        let client = redis::Client::open(url)
            .map_err(|e| format!("GW_REDIS_URL is not a usable Redis URL ({})", e.category()))?;
        Ok(RedisConn {
            client,
            manager: OnceCell::new(),
            last_failure: Mutex::new(None),
            timeout,
        })
    }

    /// Whether Redis failed within [`RECONNECT_BACKOFF`].
    fn tripped(&self) -> bool {
        self.last_failure
            .lock()
            .map(|last| last.is_some_and(|at| at.elapsed() < RECONNECT_BACKOFF))
            .unwrap_or(false)
    }

    /// Records that Redis could not be reached now.
    fn trip(&self) {
        if let Ok(mut last) = self.last_failure.lock() {
            *last = Some(Instant::now());
        }
    }

    /// The shared connection, opened on the first call. Fails fast (without trying) within
    /// [`RECONNECT_BACKOFF`] of a failure. Must be called inside a Tokio runtime.
    pub async fn connection(&self) -> Result<ConnectionManager, String> {
        if self.tripped() {
            return Err(UNREACHABLE.to_owned());
        }
        if let Some(m) = self.manager.get() {
            return Ok(m.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            // Reconnection after a lost connection happens in the background; a request does
            // not wait for a long series of attempts.
            .set_number_of_retries(2);
        let opened = self
            .manager
            .get_or_try_init(|| async {
                // Callers that queued behind a failed attempt do not each try again.
                if self.tripped() {
                    return Err(UNREACHABLE.to_owned());
                }
                let result = match tokio::time::timeout(
                    self.timeout,
                    ConnectionManager::new_with_config(self.client.clone(), config),
                )
                .await
                {
                    Ok(Ok(m)) => Ok(m),
                    Ok(Err(e)) => Err(format!("cannot connect to Redis: {e}")),
                    Err(_) => Err(format!(
                        "cannot connect to Redis: no answer within {} ms",
                        self.timeout.as_millis()
                    )),
                };
                if result.is_err() {
                    self.trip();
                }
                result
            })
            .await;
        opened.cloned()
    }

    /// Runs `op` on the shared connection within the timeout. A lost connection or a timeout
    /// makes the next calls fail fast for [`RECONNECT_BACKOFF`].
    pub async fn run<T, F, Fut>(&self, op: F) -> Result<T, String>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.connection().await?;
        match tokio::time::timeout(self.timeout, op(conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                {
                    self.trip();
                }
                Err(format!("Redis command failed: {e}"))
            }
            Err(_) => {
                self.trip();
                Err(format!(
                    "Redis did not answer within {} ms",
                    self.timeout.as_millis()
                ))
            }
        }
    }

    /// The command timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// A Redis key part for a counter id: the id itself, or for a long id (metadata values come
/// from clients) `sha256:` and its SHA-256 in hex, so that keys stay short.
pub fn key_part(id: &str) -> std::borrow::Cow<'_, str> {
    const LONGEST: usize = 200;
    if id.len() <= LONGEST {
        return std::borrow::Cow::Borrowed(id);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest.as_ref() {
        out.push_str(&format!("{b:02x}"));
    }
    std::borrow::Cow::Owned(out)
}

/// The Redis URL for tests: `GW_TEST_REDIS_URL`, or `None` (the caller skips, saying so).
#[cfg(test)]
pub fn test_url() -> Option<String> {
    match std::env::var("GW_TEST_REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            eprintln!("GW_TEST_REDIS_URL is not set: skipping a Redis test");
            None
        }
    }
}

/// A connection for tests: panics (the test fails) when the server cannot be reached.
#[cfg(test)]
pub async fn test_conn(url: &str) -> RedisConn {
    let conn = RedisConn::new(url, Duration::from_secs(2)).expect("GW_TEST_REDIS_URL parses");
    if let Err(e) = conn.connection().await {
        panic!("GW_TEST_REDIS_URL is set but Redis is unreachable: {e}");
    }
    conn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_refused_without_repeating_it() {
        let err = RedisConn::new("http://user:s3cret@host", Duration::from_secs(1))
            .err()
            .expect("not a redis url");
        assert!(err.contains("GW_REDIS_URL"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn long_ids_are_hashed() {
        assert_eq!(
            key_part("policy:p1:metadata._user:alice"),
            "policy:p1:metadata._user:alice"
        );
        let long = "x".repeat(500);
        let k = key_part(&long);
        assert!(k.starts_with("sha256:") && k.len() == 71, "{k}");
        assert_eq!(key_part(&long), k, "stable");
        assert_ne!(key_part(&"y".repeat(500)), k);
    }

    #[tokio::test]
    async fn an_unreachable_server_fails_fast_after_the_first_attempt() {
        // Port 1 on loopback: connection refused at once.
        let conn = RedisConn::new("redis://127.0.0.1:1", Duration::from_millis(500)).unwrap();
        let first = conn.connection().await.expect_err("refused");
        assert!(first.contains("cannot connect"), "{first}");
        let started = Instant::now();
        let second = conn.connection().await.expect_err("still refused");
        assert!(second.contains("retrying shortly"), "{second}");
        assert!(started.elapsed() < Duration::from_millis(50));
    }

    #[tokio::test]
    async fn a_silent_server_times_out_then_fails_fast() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let conn = RedisConn::new(&format!("redis://{addr}"), Duration::from_millis(200)).unwrap();
        let started = Instant::now();
        let err = conn
            .run(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .expect_err("no answer");
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "bounded by the timeout: {took:?}"
        );
        assert!(err.contains("Redis"), "{err}");
        let started = Instant::now();
        let err = conn
            .run(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .expect_err("still no answer");
        assert!(err.contains("retrying shortly"), "{err}");
        assert!(started.elapsed() < Duration::from_millis(50));
    }

    #[tokio::test]
    async fn connects_and_runs_commands() {
        let Some(url) = test_url() else { return };
        let conn = test_conn(&url).await;
        let key = format!("gw:test:conn:{}", uuid::Uuid::new_v4());
        let v: i64 = conn
            .run(|mut c| {
                let key = key.clone();
                async move {
                    redis::pipe()
                        .cmd("INCRBY")
                        .arg(&key)
                        .arg(5)
                        .cmd("PEXPIRE")
                        .arg(&key)
                        .arg(10_000)
                        .ignore()
                        .query_async::<(i64,)>(&mut c)
                        .await
                        .map(|(v,)| v)
                }
            })
            .await
            .expect("redis answers");
        assert_eq!(v, 5);
    }
}
