//! The connection to the Redis server that holds the state shared by several gateway
//! instances (`GW_REDIS_URL`): the rate limits' counters, the budgets and the cache.
//!
//! [`RedisConn::shared`] only parses the URL (plugins are built before the gateway's runtime
//! serves anything) and shares one [`Server`] among every plugin built with the same URL, so
//! that their work can travel in one round trip ([`crate::limits::admission`]). Connections
//! are opened on first use, one multiplexed [`ConnectionManager`] per thread that uses the
//! server (a request-path worker, a background writer): commands from one worker pipeline on
//! its connection without a hop to another thread, and a connection lives on the runtime of
//! the thread that opened it. Every command is bounded by the handle's timeout.
//!
//! After a failed connection attempt, a lost connection or a command that timed out, calls fail
//! at once for [`RECONNECT_BACKOFF`] instead of each waiting for a timeout: during an outage
//! requests pay no extra latency (the caller's fail-open or fail-closed choice applies), and
//! Redis is tried again after the pause.
//!
//! The URL may hold a password: it is never logged nor put in an error message.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Value};

/// How long calls fail fast after Redis could not be reached.
pub const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

const UNREACHABLE: &str = "Redis is unreachable (retrying shortly)";

/// One Redis server (one URL): its client, its failure state and its id in the per-thread
/// connection tables.
pub struct Server {
    id: u64,
    client: redis::Client,
    last_failure: Mutex<Option<Instant>>,
}

thread_local! {
    /// This thread's connections, by server id.
    static CONNECTIONS: RefCell<Vec<(u64, ConnectionManager)>> = const { RefCell::new(Vec::new()) };
}

/// The servers plugins share, by URL.
fn registry() -> &'static Mutex<HashMap<String, Weak<Server>>> {
    static SERVERS: OnceLock<Mutex<HashMap<String, Weak<Server>>>> = OnceLock::new();
    SERVERS.get_or_init(Default::default)
}

/// A handle on a Redis server with its own command timeout. Cheap to clone.
#[derive(Clone)]
pub struct RedisConn {
    server: Arc<Server>,
    timeout: Duration,
}

impl RedisConn {
    /// Parses `url` (`redis://[user:password@]host[:port][/db]`); no I/O. `timeout` bounds
    /// every command. A connection of its own, shared with no other handle (tests). The
    /// error never repeats the URL.
    pub fn new(url: &str, timeout: Duration) -> Result<RedisConn, String> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let client = redis::Client::open(url)
            .map_err(|e| format!("GW_REDIS_URL is not a usable Redis URL ({})", e.category()))?;
        Ok(RedisConn {
            server: Arc::new(Server {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                client,
                last_failure: Mutex::new(None),
            }),
            timeout,
        })
    }

    /// Like [`RedisConn::new`], but every handle made from the same URL while one is alive
    /// shares the server: its connections and its failure state.
    pub fn shared(url: &str, timeout: Duration) -> Result<RedisConn, String> {
        let mut servers = registry()
            .lock()
            .map_err(|_| "the Redis registry is poisoned")?;
        if let Some(server) = servers.get(url).and_then(Weak::upgrade) {
            return Ok(RedisConn { server, timeout });
        }
        servers.retain(|_, s| s.strong_count() > 0);
        let conn = RedisConn::new(url, timeout)?;
        servers.insert(url.to_owned(), Arc::downgrade(&conn.server));
        Ok(conn)
    }

    /// The same server with another command timeout.
    pub fn with_timeout(&self, timeout: Duration) -> RedisConn {
        RedisConn {
            server: self.server.clone(),
            timeout,
        }
    }

    /// Whether both handles talk to the same server through the same connections.
    pub fn same_server(&self, other: &RedisConn) -> bool {
        Arc::ptr_eq(&self.server, &other.server)
    }

    /// Whether Redis failed within [`RECONNECT_BACKOFF`].
    fn tripped(&self) -> bool {
        self.server
            .last_failure
            .lock()
            .map(|last| last.is_some_and(|at| at.elapsed() < RECONNECT_BACKOFF))
            .unwrap_or(false)
    }

    /// Records that Redis could not be reached now.
    fn trip(&self) {
        if let Ok(mut last) = self.server.last_failure.lock() {
            *last = Some(Instant::now());
        }
    }

    /// This thread's connection, opened on its first call. Fails fast (without trying) within
    /// [`RECONNECT_BACKOFF`] of a failure. Must be called inside a Tokio runtime.
    pub async fn connection(&self) -> Result<ConnectionManager, String> {
        if self.tripped() {
            return Err(UNREACHABLE.to_owned());
        }
        let id = self.server.id;
        let found = CONNECTIONS.with(|c| {
            c.borrow()
                .iter()
                .find(|(server, _)| *server == id)
                .map(|(_, m)| m.clone())
        });
        if let Some(m) = found {
            return Ok(m);
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(self.timeout.max(Duration::from_secs(1))))
            // Reconnection after a lost connection happens in the background; a request does
            // not wait for a long series of attempts.
            .set_number_of_retries(2);
        let opened = match tokio::time::timeout(
            CONNECT_TIMEOUT.min(self.timeout.max(Duration::from_millis(100))),
            ConnectionManager::new_with_config(self.server.client.clone(), config),
        )
        .await
        {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                self.trip();
                return Err(format!("cannot connect to Redis: {e}"));
            }
            Err(_) => {
                self.trip();
                return Err(format!(
                    "cannot connect to Redis: no answer within {} ms",
                    self.timeout.as_millis()
                ));
            }
        };
        // Two first calls on one thread may both connect: the first one kept wins.
        Ok(CONNECTIONS.with(|c| {
            let mut c = c.borrow_mut();
            if let Some((_, m)) = c.iter().find(|(server, _)| *server == id) {
                return m.clone();
            }
            c.push((id, opened.clone()));
            opened
        }))
    }

    /// Runs `op` on this thread's connection within the timeout. A lost connection or a
    /// timeout makes the next calls fail fast for [`RECONNECT_BACKOFF`].
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

    /// Sends `commands` in one round trip (a pipeline, not a transaction) and returns one
    /// reply per command; a command's own error is its reply ([`Value::ServerError`]). A
    /// script a command calls by hash ([`LuaScript::call`]) that the server does not know yet
    /// is loaded, and the commands sent once more (only the script calls failed, none ran).
    pub async fn pipeline(
        &self,
        commands: &[Cmd],
        scripts: &[&LuaScript],
    ) -> Result<Vec<Value>, String> {
        let send = || {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for c in commands {
                pipe.add_command(c.clone());
            }
            pipe
        };
        let pipe = send();
        let replies: Vec<Value> = self
            .run(|mut c| async move { pipe.query_async(&mut c).await })
            .await?;
        if !replies.iter().any(is_noscript) {
            return Ok(replies);
        }
        let mut load = redis::pipe();
        for s in scripts {
            load.cmd("SCRIPT").arg("LOAD").arg(s.code).ignore();
        }
        let pipe = send();
        self.run(|mut c| async move {
            load.query_async::<()>(&mut c).await?;
            pipe.query_async(&mut c).await
        })
        .await
    }

    /// The command timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

/// A Lua script that runs by its hash (`EVALSHA`), loaded on the server when missing.
pub struct LuaScript {
    code: &'static str,
    hash: String,
}

impl LuaScript {
    pub fn new(code: &'static str) -> LuaScript {
        LuaScript {
            code,
            hash: redis::Script::new(code).get_hash().to_owned(),
        }
    }

    /// The `EVALSHA` command with `keys` and `args`; send it with [`RedisConn::pipeline`].
    pub fn call<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(
        &self,
        keys: &[K],
        args: &[A],
    ) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.hash).arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}

/// A reply that is a server error, as a message.
pub fn reply_error(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(format!(
            "Redis answered an error: {} {}",
            e.code(),
            e.details().unwrap_or_default()
        )),
        _ => None,
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

/// A loopback proxy in front of the Redis at `redis_url`, for tests: every chunk a client
/// sends is shown to `tap` first, which returns how long to hold it before passing it on.
/// Returns the proxy's URL.
#[cfg(test)]
pub async fn test_proxy(
    redis_url: &str,
    tap: impl Fn(&[u8]) -> Duration + Send + Sync + 'static,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = redis_url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let tap = Arc::new(tap);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
            let tap = tap.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = client_read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let hold = tap(&buf[..n]);
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    format!("redis://{addr}")
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
