//! The running gateway: shared state, the Pingora server around it, and shutdown.
//!
//! Shutdown: Ctrl-C (SIGINT) and SIGTERM both start a graceful stop. The listeners (the main
//! one and the control plane's own, `admin_listen`) stop accepting, idle keep-alive connections
//! close, and in-flight requests and open streams run on for up to
//! `shutdown.drain_timeout_secs`; the process exits as soon as none is left.
//! SIGHUP reloads what plugins loaded at start (wasm guardrail components) without a restart.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use prometheus::{Encoder, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

use plugin_sdk::store::ProviderStore;
use plugin_sdk::{BuildCx, ConfigIssue};

use crate::config::{ConfigErrors, GatewayConfig};
use crate::pipeline::Pipeline;
use crate::proxy::GatewayProxy;
use crate::routing::breaker::Breakers;
use crate::routing::Endpoints;
use crate::stores::{
    saved_config_check, saved_guardrail_check, FileFirst, YamlConfigs, YamlProviders,
};
use crate::upstream::Upstream;

/// Everything a request needs, built once at start.
pub struct Gateway {
    pub config: GatewayConfig,
    /// Circuit breakers of config targets.
    pub breakers: Breakers,
    pub routing_metrics: RoutingMetrics,
    /// Saved providers, for config targets that name one.
    pub providers: Arc<dyn ProviderStore>,
    pub pipeline: Pipeline,
    pub endpoints: Endpoints,
    pub upstream: Upstream,
    pub metrics: Registry,
    /// The control plane, served under its `/v1` paths ([`admin::CONTROL_PLANE_PREFIXES`]) on
    /// the main listener (unless `admin_on_main_listener` is false) and on `admin_listen`.
    pub control_plane: admin::ControlPlane,
    in_flight: IntGauge,
}

/// Counters of the router, by provider: retries, fallbacks, and circuit breaker state changes.
pub struct RoutingMetrics {
    pub retries: IntCounterVec,
    pub fallbacks: IntCounterVec,
    pub breaker: IntCounterVec,
}

impl RoutingMetrics {
    fn register(registry: &Registry) -> RoutingMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("a fresh registry has no routing metrics yet");
            c
        };
        RoutingMetrics {
            retries: counter(
                "gw_retries_total",
                "Upstream attempts retried",
                &["provider"],
            ),
            fallbacks: counter(
                "gw_fallbacks_total",
                "Targets given up for the next one of a fallback group",
                &["provider"],
            ),
            breaker: counter(
                "gw_circuit_breaker_transitions_total",
                "Circuit breaker state changes, by the state entered",
                &["provider", "state"],
            ),
        }
    }
}

/// Counts one request as in flight until dropped.
pub struct InFlight(IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Gateway {
    /// Starts the control plane (opens `database_url`, applies its migrations, bootstraps an
    /// empty database, starts the key expiry and rotation workers, the watcher of saved
    /// providers and configs, and its own listener on `admin_listen` if set), then builds the
    /// stores and plugins of a validated config.
    pub fn new(config: GatewayConfig) -> Result<Gateway, ConfigErrors> {
        plugins::link();
        let metrics = Registry::new();
        let in_flight = IntGauge::new(
            "gw_requests_in_flight",
            "Gateway requests currently being handled (streams included)",
        )
        .expect("a valid metric name");
        metrics
            .register(Box::new(in_flight.clone()))
            .expect("a fresh registry has no metrics yet");
        let routing_metrics = RoutingMetrics::register(&metrics);
        // The control plane first: the stores read its snapshot of saved providers and configs
        // (after the YAML file's own, which win).
        // The `auth` plugin offers its JWT verifier here when it is built, after the control
        // plane has started.
        let tokens = plugin_sdk::access::TokenSlot::default();
        let mut control_plane = admin::ControlPlane::start(admin::Options {
            bootstrap: admin::BootstrapOptions {
                admin_key: config.bootstrap_admin_key.as_ref().map(|k| k.0.clone()),
                ..admin::BootstrapOptions::default()
            },
            secret_key: config.secret_key.as_ref().map(|k| k.0.clone()),
            config_check: Some(saved_config_check()),
            guardrail_check: Some(saved_guardrail_check()),
            tokens: tokens.clone(),
            on_gateway_listener: config.admin_on_main_listener,
            ..admin::Options::new(config.database_url.clone())
        })
        .map_err(|e| {
            let setting = if e.message.contains(admin::crypto::SECRET_KEY_VAR) {
                admin::crypto::SECRET_KEY_VAR
            } else {
                "database_url"
            };
            ConfigErrors(vec![ConfigIssue::new(setting, e.message)])
        })?;
        if let Some(addr) = config.admin_listen {
            control_plane
                .listen(addr)
                .map_err(|e| ConfigErrors(vec![ConfigIssue::new("admin_listen", e.message)]))?;
        }
        if let Some(url) = &config.redis_url {
            plugins::limits::redis::refuse_a_cluster_node(url, Duration::from_secs(2))
                .map_err(|e| ConfigErrors(vec![ConfigIssue::new("redis_url", e)]))?;
        }
        let saved = control_plane.store().published();
        metrics
            .register(Box::new(crate::control_plane::SnapshotMetrics::new(
                saved.clone(),
            )))
            .expect("a fresh registry has no snapshot metrics yet");
        let providers: Arc<dyn ProviderStore> = Arc::new(FileFirst(
            YamlProviders::from_config(&config),
            saved.clone(),
        ));
        let build = BuildCx {
            providers: providers.clone(),
            configs: Arc::new(FileFirst(YamlConfigs::from_config(&config), saved.clone())),
            metrics: metrics.clone(),
            access: Arc::new(saved.clone()),
            sink: control_plane.sink(),
            redis_url: config.redis_url.clone(),
            egress: config.egress.clone(),
            tokens,
        };
        let pipeline = Pipeline::build(&config.pipeline, &build)?;
        Ok(Gateway {
            breakers: Breakers::default(),
            routing_metrics,
            providers,
            upstream: Upstream::new(config.upstream, config.egress.clone()),
            endpoints: Endpoints::new(&config.provider_base_urls),
            config,
            pipeline,
            metrics,
            control_plane,
            in_flight,
        })
    }

    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// Requests currently in flight.
    pub fn in_flight_count(&self) -> i64 {
        self.in_flight.get()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render_metrics(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * 1024);
        if let Err(e) = TextEncoder::new().encode(&self.metrics.gather(), &mut out) {
            tracing::warn!(error = %e, "could not encode metrics");
        }
        out
    }
}

/// Builds the Pingora server with the gateway's proxy service on `config.listen`.
pub fn build_server(gw: Arc<Gateway>) -> Server {
    let config = &gw.config;
    let conf = ServerConf {
        threads: config.threads,
        // The grace period is the drain window: in-flight requests and streams may finish.
        grace_period_seconds: Some(config.drain_timeout.as_secs()),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        GatewayProxy { gw: gw.clone() },
        "gateway",
    );
    service.add_listener(
        ListenerConfig::tcp(config.listen.to_string())
            .l4_buffer(L4BufferSettings::default().write(CLIENT_WRITE_BUFFER)),
    );
    server.add_service(service);
    server
}

/// The write buffer of each client connection, in bytes (allocated per connection, beside
/// Pingora's 64 KiB read buffer). A whole answer (not a stream) leaves in one send when its
/// head and body fit. With Pingora's default of 1,460 bytes, an answer whose head and body
/// together pass it goes out as two sends, and the gateway's own headers push even a small
/// answer past it. Streams are not held back: Pingora flushes after each chunk.
const CLIENT_WRITE_BUFFER: usize = 16 * 1024;

/// Ctrl-C and SIGTERM both drain gracefully; SIGQUIT too (there is no socket hand-over).
pub struct DrainOnSignal {
    pub started: Arc<AtomicBool>,
}

#[async_trait]
impl ShutdownSignalWatch for DrainOnSignal {
    async fn recv(&self) -> ShutdownSignal {
        use tokio::signal::unix::{signal, SignalKind};
        let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
        let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut quit = signal(SignalKind::quit()).expect("SIGQUIT handler");
        let name = tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
            _ = quit.recv() => "SIGQUIT",
        };
        tracing::info!(signal = name, "shutting down: draining in-flight requests");
        self.started.store(true, Ordering::SeqCst);
        ShutdownSignal::GracefulTerminate
    }
}

/// Runs the gateway until a signal stops it. Once shutdown has begun, the process exits as soon
/// as nothing is in flight (Pingora's grace period is the upper bound).
pub fn run_until_signal(gw: Arc<Gateway>, on_drained: impl FnOnce() + Send + 'static) {
    let started = Arc::new(AtomicBool::new(false));
    let server = build_server(gw.clone());
    let gw_for_reload = gw.clone();
    let drain_timeout = gw.config.drain_timeout;
    let watch_started = started.clone();
    std::thread::Builder::new()
        .name("drain-watch".into())
        .spawn(move || {
            while !watch_started.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
            // The control plane's own listener drains beside the main one.
            if !gw.control_plane.stop_listener(gw.config.drain_timeout) {
                tracing::warn!(
                    "control-plane requests still running at the end of the drain timeout"
                );
            }
            // Let the listener close before counting.
            std::thread::sleep(Duration::from_millis(100));
            while gw.in_flight_count() > 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            tracing::info!("drained; exiting");
            // The exit skips destructors: write what the background writers hold first.
            write_out(gw.config.drain_timeout);
            on_drained();
            std::process::exit(0);
        })
        .expect("spawn the drain watcher");
    watch_reload(gw_for_reload);
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainOnSignal { started }),
    });
    write_out(drain_timeout);
}

/// Writes out what the background writers hold before the process exits: request log lines,
/// Redis settlements and token charges, budget charges and events for the control plane, the
/// audit events of refused tokens, and the log store's queue. Each wait is bounded by 5 s, and
/// by the drain timeout when that is shorter.
fn write_out(drain_timeout: Duration) {
    let bound = drain_timeout.clamp(Duration::from_millis(100), Duration::from_secs(5));
    plugins::request_log::flush();
    if !plugins::limits::batches::flush_all(bound) {
        tracing::warn!("exiting before every budget and audit write was made");
    }
    if !plugins::log_store::flush_all(bound) {
        tracing::warn!("exiting before every request log was written");
    }
}

/// SIGHUP asks every plugin to reload what it loaded at start (wasm components...); a plugin
/// whose reload fails keeps what it had, and says why in the log. The handler is installed
/// before this returns, so a SIGHUP sent once the gateway listens never kills it.
fn watch_reload(gw: Arc<Gateway>) {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP reload: cannot start its runtime");
            return;
        }
    };
    let hangup = {
        let _entered = runtime.enter();
        signal(SignalKind::hangup())
    };
    let mut hangup = match hangup {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "no SIGHUP reload: cannot watch the signal");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("reload-watch".into())
        .spawn(move || {
            runtime.block_on(async move {
                while hangup.recv().await.is_some() {
                    let failures = gw.pipeline.reload();
                    if failures.is_empty() {
                        tracing::info!("SIGHUP: pipeline reloaded");
                    }
                    for failure in failures {
                        tracing::warn!(%failure, "SIGHUP: reload failed; the previous version stays");
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no SIGHUP reload: cannot start its thread");
    }
}

/// Stops a gateway started by [`spawn`].
struct Trigger(tokio::sync::watch::Receiver<Option<bool>>);

#[async_trait]
impl ShutdownSignalWatch for Trigger {
    async fn recv(&self) -> ShutdownSignal {
        let mut rx = self.0.clone();
        loop {
            if let Some(graceful) = *rx.borrow_and_update() {
                return if graceful {
                    ShutdownSignal::GracefulTerminate
                } else {
                    ShutdownSignal::FastShutdown
                };
            }
            if rx.changed().await.is_err() {
                return ShutdownSignal::FastShutdown;
            }
        }
    }
}

/// A gateway running on its own threads in this process (tests and benchmarks).
pub struct RunningGateway {
    pub gateway: Arc<Gateway>,
    stop: tokio::sync::watch::Sender<Option<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts the gateway on background threads and waits until it accepts connections.
pub fn spawn(gw: Gateway) -> RunningGateway {
    let gateway = Arc::new(gw);
    let (stop, rx) = tokio::sync::watch::channel(None);
    let server = build_server(gateway.clone());
    let thread = std::thread::Builder::new()
        .name("gateway".into())
        .spawn(move || {
            server.run(RunArgs {
                shutdown_signal: Box::new(Trigger(rx)),
            })
        })
        .expect("spawn the gateway thread");
    let addr = gateway.config.listen;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway did not start listening on {addr}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    RunningGateway {
        gateway,
        stop,
        thread: Some(thread),
    }
}

impl RunningGateway {
    pub fn addr(&self) -> std::net::SocketAddr {
        self.gateway.config.listen
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Starts a graceful stop (as SIGTERM would) and waits until the server, and the control
    /// plane's own listener if any, have stopped.
    pub fn shutdown_gracefully(mut self) {
        let _ = self.stop.send(Some(true));
        self.gateway
            .control_plane
            .stop_listener(self.gateway.config.drain_timeout);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        let _ = self.stop.send(Some(false));
        // Fast: the control plane's own listener stops accepting without waiting.
        self.gateway.control_plane.stop_listener(Duration::ZERO);
    }
}

/// A free port on 127.0.0.1 for a test server to listen on (see
/// [`plugin_sdk::testing::free_local_addr`] for why it is not simply `bind(0)`).
pub fn free_local_addr() -> std::net::SocketAddr {
    plugin_sdk::testing::free_local_addr()
}
