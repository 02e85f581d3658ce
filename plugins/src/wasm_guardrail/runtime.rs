//! The wasmtime side of wasm guardrails: one engine for the process, components compiled once
//! and pre-instantiated, and a fresh store for every check, bounded in time and memory.
//!
//! - **Engine**: one per process, made the first time a guardrail is loaded, with the pooling
//!   allocator ([`POOL_INSTANCES`] instances at once, each memory at most [`MAX_MEMORY_MB`]) and
//!   epoch interruption. One thread ([`TICK`]) advances the epoch; a call's deadline is a number
//!   of ticks.
//! - **Components** are compiled when the config is checked and kept by content hash, so
//!   `config check`, the build that follows, and a later reload of an unchanged file compile
//!   once.
//! - **A fresh store per check**: instantiate from the `InstancePre`, call `init(config)`, then
//!   the check. Nothing a guest keeps survives into another request (no data of one client can
//!   reach another's), and a trapped instance is simply dropped. The price: instantiating from
//!   the pool plus the guest's `init` on every check. The `a_check_costs_microseconds` test
//!   prints it. In a release build: about 10 us per check for a minimal component, 30 us for
//!   `pii-redactor` (Rust, std, its config parsed by serde_json in `init`), against 0.4 us for a
//!   call on a live instance (a debug build: about 0.5 ms and 40 us). A stream keeps its store
//!   for the stream's life, so each delta costs a call on a live instance.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, Linker, ResourceAny};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    Trap,
};

use super::abi::{v1, v2, Answer, Request, Verdict, Version};
use super::metrics;
use super::wasi::{self, Grant};

/// The largest `memory_limit_mb` a guardrail may have: the size of each memory slot of the pool.
pub const MAX_MEMORY_MB: u64 = 256;
/// Guardrail instances that may be alive at once in the process (checks in flight plus open
/// streams). Past this, a check fails with an `unavailable` error (and `on_error` applies).
pub const POOL_INSTANCES: u32 = 1000;
/// How often the epoch advances: the granularity of `timeout_ms`.
pub const TICK: Duration = Duration::from_millis(1);
/// The longest a log line of a guest may be; longer ones are cut.
const MAX_LOG_BYTES: usize = 1024;
/// Distinct counter names kept per guardrail, and their longest length.
pub const MAX_COUNTERS: usize = 32;
const MAX_COUNTER_NAME: usize = 64;
/// Compiled components kept for reuse; the cache is emptied when it grows past this.
const MAX_CACHED_COMPONENTS: usize = 64;

/// The process's engine, made on first use (with its epoch thread).
pub fn engine() -> Result<&'static Engine, String> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let memory_bytes = MAX_MEMORY_MB << 20;
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(POOL_INSTANCES)
                // A component built from Rust holds a few core instances (its code and the
                // small shims that link its imports) and one memory.
                .total_core_instances(POOL_INSTANCES * 4)
                .total_memories(POOL_INSTANCES)
                .total_tables(POOL_INSTANCES * 4)
                .max_memory_size(memory_bytes as usize);
            let mut config = Config::new();
            config
                .epoch_interruption(true)
                .memory_reservation(memory_bytes)
                .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            let engine = Engine::new(&config)
                .map_err(|e| format!("cannot start the WebAssembly engine: {e:#}"))?;
            let ticker = engine.clone();
            std::thread::Builder::new()
                .name("gw-wasm-epoch".into())
                .spawn(move || loop {
                    std::thread::sleep(TICK);
                    ticker.increment_epoch();
                })
                .map_err(|e| format!("cannot start the WebAssembly epoch thread: {e}"))?;
            Ok(engine)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Reads and compiles a component (binary, or WAT text), reusing an earlier compilation of the
/// same bytes.
pub fn compile(path: &Path) -> Result<Component, String> {
    static CACHE: OnceLock<Mutex<HashMap<u64, Component>>> = OnceLock::new();
    let engine = engine()?;
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    let key = h.finish();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(c) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(c);
    }
    if bytes.starts_with(b"\0asm") && bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
        return Err(format!(
            "{} is a core WebAssembly module, not a component: build it for wasm32-wasip2 \
             (or wrap it with `wasm-tools component new`)",
            path.display()
        ));
    }
    let component = Component::new(engine, &bytes)
        .map_err(|e| format!("{} is not a valid component: {e:#}", path.display()))?;
    if let Ok(mut c) = cache.lock() {
        if c.len() >= MAX_CACHED_COMPONENTS {
            c.clear();
        }
        c.insert(key, component.clone());
    }
    Ok(component)
}

/// What every instance of one guardrail shares: its id (for logs and metrics) and the counter
/// names it has used.
#[derive(Debug)]
pub struct Shared {
    pub id: String,
    counters: Mutex<HashSet<String>>,
    /// Whether the guest's stderr goes to the log (`grants: [stderr]`) or nowhere.
    pub stderr_to_log: bool,
}

impl Shared {
    pub fn new(id: String, grants: &[Grant]) -> Shared {
        Shared {
            id,
            counters: Mutex::new(HashSet::new()),
            stderr_to_log: grants.contains(&Grant::Stderr),
        }
    }

    /// How many counter names the guardrail has used.
    pub fn counter_names(&self) -> usize {
        self.counters.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Adds to a guest counter, unless the name is new and the guardrail has used up its names.
    pub fn count(&self, name: &str, delta: u64) {
        if name.is_empty() || name.len() > MAX_COUNTER_NAME {
            return;
        }
        let Ok(mut names) = self.counters.lock() else {
            return;
        };
        if !names.contains(name) {
            if names.len() >= MAX_COUNTERS {
                return;
            }
            names.insert(name.to_owned());
        }
        drop(names);
        metrics::guest_counter(&self.id, name, delta);
    }
}

/// Per-call memory accounting: growth past the limit is refused and remembered, so that the
/// trap that usually follows is reported as what it is.
#[derive(Debug)]
pub struct MemoryLimit {
    pub max_bytes: usize,
    pub refused: bool,
}

/// Tables are small in guardrails; this bounds them anyway.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for MemoryLimit {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.refused = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// The data of one store: what the host functions need.
pub struct HostState {
    pub shared: Arc<Shared>,
    pub memory: MemoryLimit,
    /// The guest's last error-level log line (the SDK logs a panic's message there), quoted
    /// when the call then traps.
    pub last_error: Option<String>,
    /// Bytes written to stderr and not yet logged (a partial line).
    pub stderr: Vec<u8>,
}

/// Severity of a guest's log line, in either version of the world.
#[derive(Clone, Copy)]
enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl HostState {
    fn log(&mut self, level: Level, message: &str) {
        let message = truncate(message, MAX_LOG_BYTES);
        let plugin = self.shared.id.as_str();
        match level {
            Level::Trace => tracing::trace!(target: "gateway::wasm_guardrail", plugin, "{message}"),
            Level::Debug => tracing::debug!(target: "gateway::wasm_guardrail", plugin, "{message}"),
            Level::Info => tracing::info!(target: "gateway::wasm_guardrail", plugin, "{message}"),
            Level::Warn => tracing::warn!(target: "gateway::wasm_guardrail", plugin, "{message}"),
            Level::Error => {
                tracing::error!(target: "gateway::wasm_guardrail", plugin, "{message}");
                self.last_error = Some(message.to_owned());
            }
        }
    }
}

/// The `host` interface of one version of the world: the same functions in each.
macro_rules! host_of_version {
    ($version:ident) => {
        impl $version::gateway::guardrail::host::Host for HostState {
            fn log(&mut self, level: $version::gateway::guardrail::host::Level, message: String) {
                use $version::gateway::guardrail::host::Level as L;
                let level = match level {
                    L::Trace => Level::Trace,
                    L::Debug => Level::Debug,
                    L::Info => Level::Info,
                    L::Warn => Level::Warn,
                    L::Error => Level::Error,
                };
                HostState::log(self, level, &message);
            }

            fn counter_add(&mut self, name: String, delta: u64) {
                self.shared.count(&name, delta);
            }
        }
    };
}

host_of_version!(v1);
host_of_version!(v2);

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Why a call produced no verdict. Each maps to `on_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The call ran past its deadline.
    Timeout(u64),
    /// The guest asked for more memory than its limit (MiB).
    Memory(u64),
    /// The guest trapped (a panic, `unreachable`, an out-of-bounds access, a host call it was
    /// not granted).
    Trap(String),
    /// The verdict does not fit the check (a request rewrite with a different number of
    /// messages, a response rewrite from `check-request`...).
    BadVerdict(String),
    /// `init` refused the config.
    Init(String),
    /// No instance could be made (the pool is full).
    Unavailable(String),
}

impl CallError {
    /// The `outcome` label of the calls metric.
    pub fn label(&self) -> &'static str {
        match self {
            CallError::Timeout(_) => "timeout",
            CallError::Memory(_) => "memory",
            CallError::Trap(_) => "trap",
            CallError::BadVerdict(_) => "bad_verdict",
            CallError::Init(_) => "init_error",
            CallError::Unavailable(_) => "unavailable",
        }
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Timeout(ms) => write!(f, "the guardrail ran past its deadline of {ms} ms"),
            CallError::Memory(mb) => {
                write!(f, "the guardrail ran past its memory limit of {mb} MiB")
            }
            CallError::Trap(m) => write!(f, "the guardrail trapped: {m}"),
            CallError::BadVerdict(m) => write!(f, "the guardrail returned a bad verdict: {m}"),
            CallError::Init(m) => write!(f, "the guardrail's init refused its config: {m}"),
            CallError::Unavailable(m) => write!(f, "the guardrail could not be started: {m}"),
        }
    }
}

/// Bounds of each call of a guardrail.
#[derive(Debug, Clone, Copy)]
pub struct CallLimits {
    pub timeout_ms: u64,
    pub memory_mb: u64,
}

/// A component pre-instantiated for the version of the world it implements.
enum Pre {
    V1(v1::GuardrailPluginPre<HostState>),
    V2(v2::GuardrailPluginPre<HostState>),
}

/// A live instance, by version.
enum Guest {
    V1(v1::GuardrailPlugin),
    V2(v2::GuardrailPlugin),
}

/// A guardrail ready to run: its component linked and pre-instantiated.
pub struct Loaded {
    pre: Pre,
    config: String,
    pub shared: Arc<Shared>,
    pub limits: CallLimits,
}

impl Loaded {
    /// Links a compiled component: the `host` interface, the granted WASI functions, and a
    /// trap for every other import. Fails, naming it, when the component lacks an export of the
    /// world or imports something with a type the host does not offer.
    pub fn link(
        component: &Component,
        config: String,
        shared: Arc<Shared>,
        grants: &[Grant],
        limits: CallLimits,
    ) -> Result<Loaded, String> {
        let engine = engine()?;
        let mut linker: Linker<HostState> = Linker::new(engine);
        v1::GuardrailPlugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .and_then(|()| {
                v2::GuardrailPlugin::add_to_linker::<HostState, HasSelf<HostState>>(
                    &mut linker,
                    |s| s,
                )
            })
            .map_err(|e| format!("cannot link the host interface: {e:#}"))?;
        wasi::add_to_linker(&mut linker, component, grants)?;
        linker
            .define_unknown_imports_as_traps(component)
            .map_err(|e| format!("cannot link the component's imports: {e:#}"))?;
        let pre = linker
            .instantiate_pre(component)
            .map_err(|e| format!("the component does not fit the host: {e:#}"))?;
        // The newest version the component exports.
        let pre = match v2::GuardrailPluginPre::new(pre.clone()) {
            Ok(v2) => Pre::V2(v2),
            Err(_) => Pre::V1(v1::GuardrailPluginPre::new(pre).map_err(|e| {
                format!(
                    "the component implements neither gateway:guardrail/guardrail-plugin@0.2.0 \
                     nor @0.1.0: {e:#}"
                )
            })?),
        };
        Ok(Loaded {
            pre,
            config,
            shared,
            limits,
        })
    }

    /// The version of the world the component implements.
    pub fn version(&self) -> Version {
        match self.pre {
            Pre::V1(_) => Version::V0_1,
            Pre::V2(_) => Version::V0_2,
        }
    }

    /// A fresh instance with `init(config)` done, within one deadline.
    pub fn session(&self) -> Result<Session, CallError> {
        let engine = engine().map_err(CallError::Unavailable)?;
        let state = HostState {
            shared: self.shared.clone(),
            memory: MemoryLimit {
                max_bytes: (self.limits.memory_mb << 20) as usize,
                refused: false,
            },
            last_error: None,
            stderr: Vec::new(),
        };
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.memory);
        store.set_epoch_deadline(self.limits.timeout_ms);
        let made = match &self.pre {
            Pre::V1(pre) => pre.instantiate(&mut store).map(Guest::V1),
            Pre::V2(pre) => pre.instantiate(&mut store).map(Guest::V2),
        };
        let guest = match made {
            Ok(g) => g,
            Err(e) => {
                let error = classify(&store, self.limits, e);
                // A failure that is not the guest's own doing is the pool's.
                return Err(match error {
                    CallError::Trap(m) => CallError::Unavailable(m),
                    other => other,
                });
            }
        };
        let mut session = Session {
            store,
            guest,
            limits: self.limits,
        };
        let result = match &session.guest {
            Guest::V1(g) => g
                .gateway_guardrail_guardrail()
                .call_init(&mut session.store, &self.config),
            Guest::V2(g) => g
                .gateway_guardrail_guardrail()
                .call_init(&mut session.store, &self.config),
        };
        match result {
            Ok(Ok(())) => Ok(session),
            Ok(Err(message)) => Err(CallError::Init(message)),
            Err(e) => Err(session.classify(e)),
        }
    }
}

/// One live instance of a guardrail.
pub struct Session {
    store: Store<HostState>,
    guest: Guest,
    limits: CallLimits,
}

impl Session {
    /// Gives the next call its own deadline.
    pub fn arm(&mut self) {
        self.store.set_epoch_deadline(self.limits.timeout_ms);
    }

    fn classify(&self, e: wasmtime::Error) -> CallError {
        classify(&self.store, self.limits, e)
    }

    pub fn version(&self) -> Version {
        match self.guest {
            Guest::V1(_) => Version::V0_1,
            Guest::V2(_) => Version::V0_2,
        }
    }

    pub fn check_request(&mut self, request: &Request) -> Result<Verdict, CallError> {
        let store = &mut self.store;
        let done = match &self.guest {
            Guest::V1(g) => g
                .gateway_guardrail_guardrail()
                .call_check_request(&mut *store, &request.v1())
                .map(Verdict::from),
            Guest::V2(g) => g
                .gateway_guardrail_guardrail()
                .call_check_request(&mut *store, &request.v2())
                .map(Verdict::from),
        };
        done.map_err(|e| self.classify(e))
    }

    /// Checks one choice. A 0.1.0 guest sees its text; a choice without text (only tool calls)
    /// is not shown to it.
    pub fn check_response(
        &mut self,
        request: &Request,
        answer: &Answer,
    ) -> Result<Verdict, CallError> {
        let store = &mut self.store;
        let done = match &self.guest {
            Guest::V1(_) if answer.text.is_empty() => return Ok(Verdict::Allow),
            Guest::V1(g) => g
                .gateway_guardrail_guardrail()
                .call_check_response(&mut *store, &request.v1(), &answer.text)
                .map(Verdict::from),
            Guest::V2(g) => g
                .gateway_guardrail_guardrail()
                .call_check_response(&mut *store, &request.v2(), &answer.v2())
                .map(Verdict::from),
        };
        done.map_err(|e| self.classify(e))
    }

    pub fn open_stream(&mut self, request: &Request) -> Result<ResourceAny, CallError> {
        let store = &mut self.store;
        let done = match &self.guest {
            Guest::V1(g) => g
                .gateway_guardrail_guardrail()
                .stream_checker()
                .call_constructor(&mut *store, &request.v1()),
            Guest::V2(g) => g
                .gateway_guardrail_guardrail()
                .stream_checker()
                .call_constructor(&mut *store, &request.v2()),
        };
        done.map_err(|e| self.classify(e))
    }

    pub fn push(&mut self, checker: ResourceAny, delta: &str) -> Result<Verdict, CallError> {
        let store = &mut self.store;
        let done = match &self.guest {
            Guest::V1(g) => g
                .gateway_guardrail_guardrail()
                .stream_checker()
                .call_push(&mut *store, checker, delta)
                .map(Verdict::from),
            Guest::V2(g) => g
                .gateway_guardrail_guardrail()
                .stream_checker()
                .call_push(&mut *store, checker, delta)
                .map(Verdict::from),
        };
        done.map_err(|e| self.classify(e))
    }

    /// Pushes a piece of a streamed tool call's arguments (0.2.0; a 0.1.0 guest does not see
    /// them: allowed).
    pub fn push_tool_arguments(
        &mut self,
        checker: ResourceAny,
        index: u32,
        name: Option<&str>,
        delta: &str,
    ) -> Result<Verdict, CallError> {
        let store = &mut self.store;
        let done = match &self.guest {
            Guest::V1(_) => return Ok(Verdict::Allow),
            Guest::V2(g) => g
                .gateway_guardrail_guardrail()
                .stream_checker()
                .call_push_tool_arguments(&mut *store, checker, index, name, delta)
                .map(Verdict::from),
        };
        done.map_err(|e| self.classify(e))
    }

    /// Drops a checker the guest no longer needs (its destructor runs); errors are moot.
    pub fn drop_checker(&mut self, checker: ResourceAny) {
        let _ = checker.resource_drop(&mut self.store);
    }

    pub fn finish(&mut self, checker: ResourceAny) -> Result<Verdict, CallError> {
        let store = &mut self.store;
        let done = match &self.guest {
            Guest::V1(g) => g
                .gateway_guardrail_guardrail()
                .stream_checker()
                .call_finish(&mut *store, checker)
                .map(Verdict::from),
            Guest::V2(g) => g
                .gateway_guardrail_guardrail()
                .stream_checker()
                .call_finish(&mut *store, checker)
                .map(Verdict::from),
        };
        done.map_err(|e| self.classify(e))
    }
}

/// What went wrong in a call, from the error and what the store saw.
fn classify(store: &Store<HostState>, limits: CallLimits, e: wasmtime::Error) -> CallError {
    let state = store.data();
    if state.memory.refused {
        return CallError::Memory(limits.memory_mb);
    }
    let panic = state
        .last_error
        .as_deref()
        .map(|m| format!(" (the guest logged: {m})"))
        .unwrap_or_default();
    // The full error carries the guest's backtrace: logged, not shown to clients.
    tracing::debug!(
        target: "gateway::wasm_guardrail",
        plugin = state.shared.id.as_str(),
        "guardrail call failed: {e:?}"
    );
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => CallError::Timeout(limits.timeout_ms),
        Some(trap) => CallError::Trap(format!("{trap}{panic}")),
        None => {
            let message = e.root_cause().to_string();
            if message.contains("unknown import") {
                CallError::Trap(format!(
                    "{message}: guardrails reach only the host interface and the WASI \
                     functions that `grants` names{panic}"
                ))
            } else {
                CallError::Trap(format!("{message}{panic}"))
            }
        }
    }
}
