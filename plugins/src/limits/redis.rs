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
//! `redis+cluster://[user:password@]host:port[,host:port...]` names a Redis Cluster by its seed
//! nodes (`rediss+cluster://` with TLS). Every key one call touches must then hash to one slot:
//! the limits' keys carry their organisation as their hash tag ([`org_tag`], [`hash_tag`]), so
//! a request's counters live on one node; a call may not mix tags ([`RedisConn::is_cluster`]
//! tells the callers that group by tag). A request would need two slots only through a saved
//! provider that no organisation owns and that has limits of its own, which neither the
//! control plane (every saved provider has an owner) nor the YAML (no limits) makes; in a
//! cluster such a check would fail and the plugins' `on_backend_error` apply.
//!
//! The URL may hold a password: it is never logged nor put in an error message.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisFuture, Value};

/// How long calls fail fast after Redis could not be reached.
pub const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

const UNREACHABLE: &str = "Redis is unreachable (retrying shortly)";

/// One Redis server (one URL): its client, its failure state and its id in the per-thread
/// connection tables.
pub struct Server {
    id: u64,
    client: Client,
    last_failure: Mutex<Option<Instant>>,
}

/// A single server (or a primary with replicas) or a cluster.
enum Client {
    Single(redis::Client),
    Cluster(Box<ClusterClient>),
}

/// A multiplexed connection to a server or a cluster; cheap to clone.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

thread_local! {
    /// This thread's connections, by server id.
    static CONNECTIONS: RefCell<Vec<(u64, Conn)>> = const { RefCell::new(Vec::new()) };
}

/// The client for `url`: a cluster for `redis+cluster://` (`rediss+cluster://`), whose seed
/// nodes are separated by commas; else one server.
fn client(url: &str) -> Result<Client, String> {
    let unusable =
        |e: redis::RedisError| format!("GW_REDIS_URL is not a usable Redis URL ({})", e.category());
    let Some((scheme, rest)) = url
        .strip_prefix("redis+cluster://")
        .map(|r| ("redis", r))
        .or_else(|| url.strip_prefix("rediss+cluster://").map(|r| ("rediss", r)))
    else {
        return redis::Client::open(url)
            .map(Client::Single)
            .map_err(unusable);
    };
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let nodes: Vec<String> = hosts
        .trim_end_matches('/')
        .split(',')
        .filter(|h| !h.trim().is_empty())
        .map(|h| format!("{scheme}://{auth}{}", h.trim()))
        .collect();
    if nodes.is_empty() {
        return Err("GW_REDIS_URL names a Redis Cluster without any node".to_owned());
    }
    ClusterClient::builder(nodes)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(Duration::from_secs(2))
        .build()
        .map(|c| Client::Cluster(Box::new(c)))
        .map_err(unusable)
}

/// The hash tag of a key part: `{tag}` makes every key holding it hash to one Redis Cluster
/// slot. Characters that would end the tag early are replaced.
pub fn hash_tag(tag: &str) -> String {
    let mut out = String::with_capacity(tag.len() + 2);
    out.push('{');
    out.extend(
        tag.chars()
            .map(|c| if c == '{' || c == '}' { '_' } else { c }),
    );
    out.push('}');
    out
}

/// The tag of the counters `organisation` owns (its keys, workspaces, policies, providers);
/// `gateway` for what no organisation owns (a request without a caller, an operator's
/// provider). A request's counters all belong to its caller's organisation, so they share
/// one slot; a saved provider's belong to its owner's, which is the caller's (only its own
/// organisation may use it).
pub fn org_tag(organisation: Option<&str>) -> &str {
    organisation.filter(|o| !o.is_empty()).unwrap_or("gateway")
}

/// The tag of `key` as Redis Cluster reads it: what is between its first `{` and the next `}`
/// when not empty, else the whole key.
pub fn tag_of(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
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
        let client = client(url)?;
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

    /// Whether the server is a Redis Cluster: one call's keys must then share a hash tag.
    pub fn is_cluster(&self) -> bool {
        matches!(self.server.client, Client::Cluster(_))
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
    pub async fn connection(&self) -> Result<Conn, String> {
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
        let open = async {
            match &self.server.client {
                Client::Single(client) => {
                    ConnectionManager::new_with_config(client.clone(), config)
                        .await
                        .map(Conn::Single)
                }
                Client::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
            }
        };
        let opened = match tokio::time::timeout(
            CONNECT_TIMEOUT.min(self.timeout.max(Duration::from_millis(100))),
            open,
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
        F: FnOnce(Conn) -> Fut,
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
        commands: Vec<Cmd>,
        scripts: &[&LuaScript],
    ) -> Result<Vec<Value>, String> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for c in commands {
            pipe.add_command(c);
        }
        let pipe = &pipe;
        let replies: Vec<Value> = self
            .run(|mut c| async move { pipe.query_async(&mut c).await })
            .await?;
        if !replies.iter().any(is_noscript) {
            return Ok(replies);
        }
        self.run(|mut c| async move {
            // One command each, not a pipeline: a cluster sends `SCRIPT LOAD` to every primary.
            for s in scripts {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(s.code)
                    .query_async::<String>(&mut c)
                    .await?;
            }
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
    // A leading hash tag (`{workspace}`) is kept, so that the key stays in its slot.
    let tag = match id.strip_prefix('{').and_then(|rest| rest.find('}')) {
        Some(end) if end + 2 <= LONGEST => &id[..end + 2],
        _ => "",
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
    let mut out = String::with_capacity(tag.len() + 7 + 64);
    out.push_str(tag);
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

/// Refuses a plain `redis://` (`rediss://`) URL that names one node of a Redis Cluster: the
/// gateway would reach only that node's slots, and every counter elsewhere would fail as if
/// Redis were down. Asked once at start, within `timeout`; a server that cannot be reached
/// then is no reason to refuse (the plugins' `on_backend_error` applies while it is down).
pub fn refuse_a_cluster_node(url: &str, timeout: Duration) -> Result<(), String> {
    if url.contains("+cluster://") {
        return Ok(());
    }
    let Ok(client) = redis::Client::open(url) else {
        return Ok(());
    };
    let Ok(mut conn) = client.get_connection_with_timeout(timeout) else {
        return Ok(());
    };
    let _ = conn.set_read_timeout(Some(timeout));
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query(&mut conn)
        .unwrap_or_default();
    if info.contains("cluster_enabled:1") {
        return Err(
            "the Redis server is a node of a Redis Cluster: name the cluster as \
             redis+cluster://host:port[,host:port...] so that each request's counters are \
             kept on one node"
                .to_owned(),
        );
    }
    Ok(())
}

/// A private Redis Cluster for tests: three primaries on loopback ports of their own, started
/// with the machine's `redis-server` and `redis-cli` when `GW_TEST_REDIS_URL` is set (Redis
/// tests are on), stopped by PID when dropped.
#[cfg(test)]
pub struct TestCluster {
    nodes: Vec<std::process::Child>,
    dir: std::path::PathBuf,
    /// `redis+cluster://` with the three nodes.
    pub url: String,
}

#[cfg(test)]
impl Drop for TestCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a [`TestCluster`], or `None` (the caller skips) when `GW_TEST_REDIS_URL` is unset.
/// Panics when Redis tests are on and the cluster cannot be made.
#[cfg(test)]
pub fn test_cluster() -> Option<TestCluster> {
    use std::process::{Command, Stdio};
    test_url()?;
    // A free port whose cluster bus port (+10000) is free too.
    let port = || loop {
        let p = plugin_sdk::testing::free_local_port();
        if std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    };
    let dir = std::env::temp_dir().join(format!("gw-test-cluster-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let ports = [port(), port(), port()];
    let mut cluster = TestCluster {
        nodes: Vec::new(),
        dir: dir.clone(),
        url: String::new(),
    };
    for p in ports {
        let child = Command::new("redis-server")
            .args(["--port", &p.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--cluster-config-file", &format!("nodes-{p}.conf")])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("Redis tests are on (GW_TEST_REDIS_URL): redis-server must be installed");
        cluster.nodes.push(child);
    }
    let cli = |args: &[&str]| {
        Command::new("redis-cli")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("Redis tests are on (GW_TEST_REDIS_URL): redis-cli must be installed")
    };
    for p in ports {
        let p = p.to_string();
        let up = (0..100).any(|_| {
            let ok = cli(&["-p", &p, "ping"]).stdout.starts_with(b"PONG");
            if !ok {
                std::thread::sleep(Duration::from_millis(50));
            }
            ok
        });
        assert!(up, "the test cluster's node on port {p} did not start");
    }
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut create = vec!["--cluster", "create"];
    create.extend(nodes.iter().map(String::as_str));
    create.extend(["--cluster-replicas", "0", "--cluster-yes"]);
    let made = cli(&create);
    assert!(
        made.status.success(),
        "redis-cli --cluster create: {made:?}"
    );
    let ready = (0..200).any(|_| {
        let ok = ports.iter().all(|p| {
            let info = cli(&["-p", &p.to_string(), "cluster", "info"]).stdout;
            String::from_utf8_lossy(&info).contains("cluster_state:ok")
        });
        if !ok {
            std::thread::sleep(Duration::from_millis(50));
        }
        ok
    });
    assert!(ready, "the test cluster did not become ready");
    cluster.url = format!("redis+cluster://{}", nodes.join(","));
    Some(cluster)
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
    fn cluster_urls_and_hash_tags() {
        let conn = RedisConn::new(
            "redis+cluster://u:pw@10.0.0.1:7000,10.0.0.2:7001",
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(conn.is_cluster());
        assert!(
            !RedisConn::new("redis://10.0.0.1:6379", Duration::from_secs(1))
                .unwrap()
                .is_cluster()
        );
        let err = RedisConn::new("redis+cluster://", Duration::from_secs(1))
            .err()
            .expect("no node");
        assert!(err.contains("without any node"), "{err}");
        assert_eq!(hash_tag("ws-1"), "{ws-1}");
        assert_eq!(hash_tag("a{b}"), "{a_b_}");
        assert_eq!(tag_of("gw:rl:{ws-1}api_key:k:0:7"), "ws-1");
        assert_eq!(tag_of("gw:rl:{}x"), "gw:rl:{}x");
        assert_eq!(tag_of("plain"), "plain");
        assert_eq!(org_tag(Some("org-1")), "org-1");
        assert_eq!(org_tag(Some("")), "gateway");
        assert_eq!(org_tag(None), "gateway");
        // A long id keeps its tag, so its key stays in the request's slot.
        let long = format!("{{ws-1}}policy:p:{}", "x".repeat(300));
        assert!(key_part(&long).starts_with("{ws-1}sha256:"));
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

    #[test]
    fn a_node_of_a_cluster_named_as_one_server_is_refused_at_start() {
        let timeout = Duration::from_secs(2);
        // Nothing listens: no reason to refuse.
        refuse_a_cluster_node("redis://127.0.0.1:1", timeout).unwrap();
        let Some(single) = test_url() else { return };
        refuse_a_cluster_node(&single, timeout).unwrap();
        let Some(cluster) = test_cluster() else {
            return;
        };
        refuse_a_cluster_node(&cluster.url, timeout).unwrap();
        let node = cluster
            .url
            .trim_start_matches("redis+cluster://")
            .split(',')
            .next()
            .unwrap();
        let err = refuse_a_cluster_node(&format!("redis://{node}"), timeout).unwrap_err();
        assert!(err.contains("redis+cluster://"), "{err}");
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
