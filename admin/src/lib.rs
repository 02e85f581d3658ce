//! The control plane: organisations, workspaces, users, roles, API keys, policies, the audit
//! log, configs, integrations and providers — an axum Router over sqlx
//! (SQLite by default, PostgreSQL for shared deployments), served by the gateway on its own
//! listener under `/v1`, and on a listener of the control plane's own when one is asked for
//! ([`ControlPlane::listen`]).
//!
//! - [`db`]: the pool, write transactions, migrations (one portable SQL folder);
//! - [`store`]: every query; each write is one transaction with its audit record;
//! - [`authz`]: who may do what, in one place;
//! - [`crypto`]: provider secrets encrypted at rest;
//! - [`store::snapshot`]: what the data plane reads (saved providers and configs, API keys,
//!   workspaces and policies), published after every change and kept current across instances;
//! - [`sink`]: where the data plane's plugins send audit events, settled usage and request logs;
//! - [`api`]: the routes and their input checks ([`validate`]), errors in one place ([`error`]),
//!   calls refused with 401 or 403 recorded in the audit log (bounded per second);
//! - [`ControlPlane`]: what the gateway runs: the database, bootstrap, the key expiry and
//!   rotation workers, the data plane's snapshot watcher, the router and its own listener if
//!   any, on a runtime of their own.

pub mod api;
pub mod authz;
pub mod crypto;
pub mod db;
pub mod error;
pub mod keys;
pub mod sink;
pub mod store;
pub mod time;
pub mod validate;

use std::net::SocketAddr;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tower::ServiceExt;

pub use api::{router, router_with, ClientAddr, RouterOptions, MAX_BODY_BYTES};
pub use error::{AdminError, ErrorKind};
pub use sink::StoreSink;
pub use store::{BootstrapOptions, BootstrapOutcome, Store};
pub use store::{ConfigCheck, DataPlaneOptions, Published, Snapshot};

/// Paths the control plane owns. The gateway sends every request under one of these (the path
/// itself or below it) to the control plane; all other `/v1/` paths stay provider routes.
pub const CONTROL_PLANE_PREFIXES: &[&str] = &[
    "/v1/admin",
    "/v1/api-keys",
    "/v1/audit-logs",
    "/v1/configs",
    "/v1/integrations",
    "/v1/providers",
    "/v1/virtual-keys",
    "/v1/policies",
    "/v1/deployments",
    "/v1/guardrails",
    "/v1/logs",
    "/v1/openapi.json",
    // The reference control plane's other resources: answered 404 by the control plane until
    // they are built, never sent to a provider.
    "/v1/analytics",
    "/v1/feedback",
    "/v1/mcp-servers",
    "/v1/mcp-integrations",
    "/v1/prompts",
];

/// True for a path the control plane owns.
pub fn is_control_plane_path(path: &str) -> bool {
    CONTROL_PLANE_PREFIXES.iter().any(|prefix| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// How often the expiry worker looks for keys past their `expires_at`, and the rotation worker
/// for keys past their `next_rotation_at`.
pub const DEFAULT_EXPIRY_INTERVAL: Duration = Duration::from_secs(60);

/// What the control plane starts with.
#[derive(Debug, Clone)]
pub struct Options {
    pub database_url: String,
    pub bootstrap: BootstrapOptions,
    /// How often the expiry and rotation workers run. Default: [`DEFAULT_EXPIRY_INTERVAL`].
    pub expiry_interval: Duration,
    /// The key of stored provider secrets (`GW_SECRET_KEY`, base64 of 32 bytes). Required with
    /// PostgreSQL; a SQLite database file otherwise keeps a generated one beside it.
    pub secret_key: Option<String>,
    /// The data plane's routing-config validator, run on saved configs.
    pub config_check: Option<ConfigCheck>,
    /// The data plane's hook validator, run on saved guardrails.
    pub guardrail_check: Option<ConfigCheck>,
    /// Where the data plane's JWT verifier is offered (the `auth` plugin with `jwt:`): tokens
    /// then read and list their workspace's resources. Default: empty (API keys only).
    pub tokens: plugin_sdk::access::TokenSlot,
    /// How often the data plane's snapshot is compared with the database (changes made by
    /// other instances; with PostgreSQL they are also notified at once).
    pub refresh_interval: Duration,
    /// How often the whole snapshot is compared with the database, as a check of the changes
    /// applied to it one by one. Default: [`store::snapshot::DEFAULT_CHECK_INTERVAL`].
    pub check_interval: Duration,
    /// Whether [`ControlPlane::handle`] answers: it serves the requests the gateway receives on
    /// its main listener. `false` answers each with a 404, as for a path the gateway does not
    /// serve, so that the control plane is reachable only on its own listener
    /// ([`ControlPlane::listen`]). Default: true.
    pub on_gateway_listener: bool,
}

impl Options {
    pub fn new(database_url: impl Into<String>) -> Options {
        Options {
            database_url: database_url.into(),
            bootstrap: BootstrapOptions::default(),
            expiry_interval: DEFAULT_EXPIRY_INTERVAL,
            secret_key: None,
            config_check: None,
            guardrail_check: None,
            tokens: plugin_sdk::access::TokenSlot::default(),
            refresh_interval: store::snapshot::DEFAULT_REFRESH_INTERVAL,
            check_interval: store::snapshot::DEFAULT_CHECK_INTERVAL,
            on_gateway_listener: true,
        }
    }
}

/// The running control plane. Its database connections, its workers, its handlers and its own
/// listener (if any) live on a small runtime of their own, so they do not depend on whichever
/// runtime serves a request (Pingora runs several). Dropping it stops them all.
pub struct ControlPlane {
    runtime: Option<tokio::runtime::Runtime>,
    store: Store,
    router: axum::Router,
    bootstrap: BootstrapOutcome,
    on_gateway_listener: bool,
    listener: Option<OwnListener>,
}

/// The control plane's own listener, served by a task on its runtime.
struct OwnListener {
    addr: SocketAddr,
    /// `true` stops accepting and lets open connections finish their requests.
    stop: tokio::sync::watch::Sender<bool>,
    /// Closed (or sent to) when the server has finished.
    stopped: Mutex<mpsc::Receiver<()>>,
}

impl ControlPlane {
    /// Opens the database, applies its migrations, bootstraps it when empty, and starts the
    /// expiry worker. May be called from inside or outside an async runtime.
    pub fn start(options: Options) -> Result<ControlPlane, AdminError> {
        let data_plane = data_plane_options(&options)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gw-control-plane")
            .enable_all()
            .build()
            .map_err(|e| AdminError::internal(format!("cannot start a runtime: {e}")))?;
        let handle = runtime.handle().clone();
        let started = std::thread::scope(|s| {
            s.spawn(|| {
                handle.block_on(async {
                    let store = Store::open_with(&options.database_url, data_plane).await?;
                    let outcome = store.bootstrap(&options.bootstrap).await?;
                    Ok::<_, AdminError>((store, outcome))
                })
            })
            .join()
            .unwrap_or_else(|_| Err(AdminError::internal("control-plane start-up panicked")))
        });
        let (store, bootstrap) = match started {
            Ok(started) => started,
            Err(e) => {
                // This may run inside another runtime, where dropping one blocks: don't wait.
                runtime.shutdown_background();
                return Err(e);
            }
        };
        match &bootstrap {
            BootstrapOutcome::Created {
                organisation_id, ..
            } => tracing::info!(
                organisation = %organisation_id,
                "control plane: first start; made the organisation, its owner, the workspace \"default\" and an admin key"
            ),
            BootstrapOutcome::Existing { organisation_id } => {
                tracing::debug!(organisation = %organisation_id, "control plane: database ready")
            }
        }
        runtime.spawn(expiry_worker(store.clone(), options.expiry_interval));
        runtime.spawn(rotation_worker(store.clone(), options.expiry_interval));
        runtime.spawn(store::snapshot::watch(
            store.clone(),
            options.database_url.clone(),
            options.refresh_interval,
            options.check_interval,
        ));
        Ok(ControlPlane {
            runtime: Some(runtime),
            router: router_with(
                store.clone(),
                RouterOptions {
                    tokens: options.tokens.clone(),
                    ..RouterOptions::default()
                },
            ),
            store,
            bootstrap,
            on_gateway_listener: options.on_gateway_listener,
            listener: None,
        })
    }

    /// Serves the control plane's router on `addr` too (the gateway's `admin_listen`): plain
    /// HTTP/1.1, on the control plane's runtime, each request's peer address recorded as its
    /// [`ClientAddr`] (the audit log's `client_ip`). Only the control plane's paths are served
    /// there; any other is its 404. The address is bound before this returns (an address in
    /// use is an error naming it); returns the bound address (its port when `addr` asks for
    /// port 0). Stops with [`ControlPlane::stop_listener`], or when the control plane is
    /// dropped. One such listener per control plane.
    pub fn listen(&mut self, addr: SocketAddr) -> Result<SocketAddr, AdminError> {
        let Some(runtime) = &self.runtime else {
            return Err(AdminError::internal("the control plane has stopped"));
        };
        if let Some(own) = &self.listener {
            return Err(AdminError::internal(format!(
                "the control plane already listens on {}",
                own.addr
            )));
        }
        // Bound here, synchronously, so that the caller learns of a failure.
        let bound = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| AdminError::internal(format!("cannot listen on {addr}: {e}")))?;
        let local = bound.local_addr().unwrap_or(addr);
        let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
        let (done, stopped) = mpsc::channel();
        let app = self
            .router
            .clone()
            .layer(axum::middleware::from_fn(client_addr_from_peer))
            .into_make_service_with_connect_info::<SocketAddr>();
        runtime.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(bound) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(addr = %local, error = %e, "the control plane's listener failed");
                    return;
                }
            };
            // Ends on `true`, or when the sender is dropped with the control plane.
            let stop = async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::error!(addr = %local, error = %e, "the control plane's listener failed");
            }
            let _ = done.send(());
        });
        tracing::info!(addr = %local, "control plane listening on its own address");
        self.listener = Some(OwnListener {
            addr: local,
            stop,
            stopped: Mutex::new(stopped),
        });
        Ok(local)
    }

    /// The address of the control plane's own listener, when it has one.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().map(|l| l.addr)
    }

    /// Stops the control plane's own listener gracefully: it stops accepting at once, idle
    /// connections close, and requests under way may finish. Waits for them up to `wait`
    /// (blocking the calling thread: call it outside async code); true when all finished, or
    /// when there is no listener. The rest of the control plane runs on.
    pub fn stop_listener(&self, wait: Duration) -> bool {
        let Some(own) = &self.listener else {
            return true;
        };
        own.stop.send_replace(true);
        let stopped = own.stopped.lock().unwrap_or_else(|e| e.into_inner());
        match stopped.recv_timeout(wait) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => true,
            Err(mpsc::RecvTimeoutError::Timeout) => false,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Where the data plane's plugins send audit events, settled usage and request logs: this
    /// control plane's database, written on its own runtime (a [`StoreSink`]). After the
    /// control plane has stopped, every call fails with a message saying so.
    pub fn sink(&self) -> plugin_sdk::sinks::SharedSink {
        match &self.runtime {
            Some(runtime) => {
                std::sync::Arc::new(StoreSink::new(self.store.clone(), runtime.handle().clone()))
            }
            // Only after drop, which takes the runtime: nothing can call this then.
            None => std::sync::Arc::new(plugin_sdk::sinks::Discard),
        }
    }

    /// What the start found or made; holds the generated admin key on a first start.
    pub fn bootstrap(&self) -> &BootstrapOutcome {
        &self.bootstrap
    }

    /// The admin key generated by this start, handed out once (the caller shows it); later
    /// calls return `None`.
    pub fn take_generated_key(&mut self) -> Option<String> {
        match &mut self.bootstrap {
            BootstrapOutcome::Created { generated_key, .. } => generated_key.take(),
            BootstrapOutcome::Existing { .. } => None,
        }
    }

    /// Answers one request (its body already read) on the control plane's runtime: the
    /// gateway's main listener hands its control-plane paths here. Started with
    /// `on_gateway_listener: false`, it answers 404 instead, in the gateway's own error shape
    /// for a path it does not serve.
    pub async fn handle(&self, req: http::Request<Bytes>) -> http::Response<Bytes> {
        if !self.on_gateway_listener {
            return not_served(&req);
        }
        let Some(runtime) = &self.runtime else {
            return AdminError::internal("the control plane has stopped").to_http();
        };
        let router = self.router.clone();
        let task = runtime.spawn(async move {
            let resp = match router.oneshot(req.map(axum::body::Body::from)).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            let (parts, body) = resp.into_parts();
            match axum::body::to_bytes(body, usize::MAX).await {
                Ok(bytes) => http::Response::from_parts(parts, bytes),
                Err(e) => AdminError::internal(format!("cannot read the answer: {e}")).to_http(),
            }
        });
        match task.await {
            Ok(resp) => resp,
            Err(e) => {
                tracing::error!(error = %e, "a control-plane handler failed");
                AdminError::internal("internal error: the handler failed").to_http()
            }
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(own) = &self.listener {
            own.stop.send_replace(true);
        }
        // Dropping a runtime may happen inside another runtime: let it wind down on its own
        // (its tasks, the listener's among them, are dropped: the socket closes).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The answer of [`ControlPlane::handle`] when the control plane is not served on the
/// gateway's listener: the 404 the gateway gives a path it does not serve.
fn not_served(req: &http::Request<Bytes>) -> http::Response<Bytes> {
    let err = plugin_sdk::GatewayError::new(
        plugin_sdk::ErrorKind::NotFound,
        format!("no route for {} {}", req.method(), req.uri().path()),
    );
    let mut resp = http::Response::new(Bytes::from(err.body().to_string()));
    *resp.status_mut() = err.status();
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// On the control plane's own listener: the peer's address as the request's [`ClientAddr`]
/// (an IPv4 peer of an IPv6 socket as its IPv4 address).
async fn client_addr_from_peer(
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_canonical());
    req.extensions_mut().insert(ClientAddr(peer));
    next.run(req).await
}

/// The data plane's options of a start: the secret key, which PostgreSQL requires.
fn data_plane_options(options: &Options) -> Result<DataPlaneOptions, AdminError> {
    let secret_key = match &options.secret_key {
        Some(text) => Some(
            crypto::SecretKey::from_base64(text).map_err(|e| AdminError::internal(e.message))?,
        ),
        None if db::Backend::of_url(&options.database_url) == Some(db::Backend::Postgres) => {
            return Err(AdminError::internal(format!(
                "{} is required with a PostgreSQL database: provider secrets are stored \
                 encrypted with it, and every gateway sharing the database needs the same key \
                 (make one with `openssl rand -base64 32`)",
                crypto::SECRET_KEY_VAR
            )))
        }
        None => None,
    };
    Ok(DataPlaneOptions {
        secret_key,
        config_check: options.config_check.clone(),
        guardrail_check: options.guardrail_check.clone(),
    })
}

/// Every `every`, marks keys (and providers) past their `expires_at` as `expired`. Runs until
/// its task is dropped.
pub async fn expiry_worker(store: Store, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match store.expire_api_keys().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(keys = n, "API keys expired"),
            Err(e) => tracing::warn!(error = %e, "the key expiry sweep failed; retrying later"),
        }
        match store.expire_providers().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(providers = n, "providers expired"),
            Err(e) => {
                tracing::warn!(error = %e, "the provider expiry sweep failed; retrying later")
            }
        }
    }
}

/// Every `every`, rotates the keys whose rotation policy's `next_rotation_at` has passed
/// ([`Store::rotate_due_api_keys`]). Runs until its task is dropped. Several instances may run
/// it on one database: each key is rotated once.
pub async fn rotation_worker(store: Store, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match store.rotate_due_api_keys().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(keys = n, "API keys rotated by their rotation policy"),
            Err(e) => tracing::warn!(error = %e, "the key rotation pass failed; retrying later"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_off_the_gateway_listener_are_not_found() {
        let req = http::Request::builder()
            .method("POST")
            .uri("/v1/admin/workspaces?x=1")
            .body(Bytes::new())
            .unwrap();
        let resp = not_served(&req);
        assert_eq!(resp.status(), 404);
        assert_eq!(resp.headers()["content-type"], "application/json");
        let body: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
        assert_eq!(
            body["error"]["message"],
            "no route for POST /v1/admin/workspaces"
        );
    }

    #[test]
    fn control_plane_paths() {
        for p in [
            "/v1/admin/workspaces",
            "/v1/admin/users/1",
            "/v1/api-keys",
            "/v1/api-keys/organisation/service",
            "/v1/audit-logs",
            "/v1/configs/pc-1",
            "/v1/policies/rate-limits",
            "/v1/openapi.json",
            "/v1/virtual-keys",
            "/v1/logs",
            "/v1/logs/exports/abc/download",
            "/v1/analytics/graphs/requests",
            "/v1/feedback",
            "/v1/feedback/f-1",
            "/v1/mcp-servers/s-1/metadata",
            "/v1/mcp-integrations",
            "/v1/prompts/p-1/completions",
            "/v1/guardrails",
        ] {
            assert!(is_control_plane_path(p), "{p}");
        }
        for p in [
            "/v1/chat/completions",
            "/v1/api-keysx",
            "/v1/administrator",
            "/v1/models",
            "/v2/api-keys",
            "/v1/openapi.jsonx",
            "/v1/logsx",
        ] {
            assert!(!is_control_plane_path(p), "{p}");
        }
    }
}
