//! Tests of the auth plugin: API keys against an in-memory access store, JWTs against JWKS
//! files and a JWKS served by a local HTTP server, with the PEM keys in `testdata/`.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use jsonwebtoken::jwk::{Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use plugin_sdk::access::{
    ApiKeyRecord, AuthMethod, CountedUsage, Defaults, KeyKind, KeyStatus, RateLimit, RateLimitKind,
    RateLimitPolicy, RateUnit, UsageKind, UsageLimit, UsageLimitPolicy, WorkspaceRecord,
};
use plugin_sdk::headers::GwHeaders;
use plugin_sdk::sinks::{AuditEvent, ControlPlaneSink, LogRecord, UsageCharge};
use plugin_sdk::{
    AccessStore, BuildCx, Flow, GatewayError, Plugin, PluginDescriptor, Principal, RequestCx, Route,
};

use super::api_key::{digest, digests_equal};
use super::config::AuthConfig;
use super::jwt::{identity, looks_like_jwt};
use super::Auth;

// ---------------------------------------------------------------------------------------------
// An in-memory access store and a recording sink.

/// A key as the store finds it: the record and the digest it is stored under.
type KeyEntry = (Arc<ApiKeyRecord>, [u8; 32]);

#[derive(Default)]
struct MemStore {
    /// By presented digest.
    keys: Mutex<HashMap<[u8; 32], KeyEntry>>,
    workspaces: Mutex<HashMap<String, Arc<WorkspaceRecord>>>,
    version: AtomicI64,
}

impl MemStore {
    fn add_key(&self, raw: &str, record: ApiKeyRecord) -> Arc<ApiKeyRecord> {
        let record = Arc::new(record);
        let d = digest(raw);
        self.keys.lock().unwrap().insert(d, (record.clone(), d));
        self.bump();
        record
    }

    /// A rotated key: its previous value finds the same record.
    fn add_previous(&self, raw: &str, record: &Arc<ApiKeyRecord>) {
        let d = digest(raw);
        self.keys.lock().unwrap().insert(d, (record.clone(), d));
        self.bump();
    }

    fn add_workspace(&self, ws: WorkspaceRecord) {
        self.workspaces
            .lock()
            .unwrap()
            .insert(ws.id.clone(), Arc::new(ws));
        self.bump();
    }

    fn bump(&self) {
        self.version.fetch_add(1, Ordering::SeqCst);
    }
}

impl AccessStore for MemStore {
    fn api_key(&self, digest: &[u8; 32]) -> Option<Arc<ApiKeyRecord>> {
        self.api_key_with_digest(digest).map(|(r, _)| r)
    }
    fn api_key_with_digest(&self, digest: &[u8; 32]) -> Option<(Arc<ApiKeyRecord>, [u8; 32])> {
        self.keys.lock().unwrap().get(digest).cloned()
    }
    fn workspace(&self, id: &str) -> Option<Arc<WorkspaceRecord>> {
        self.workspaces.lock().unwrap().get(id).cloned()
    }
    fn rate_limit_policies(&self) -> Arc<[RateLimitPolicy]> {
        Arc::from(Vec::new())
    }
    fn usage_limit_policies(&self) -> Arc<[UsageLimitPolicy]> {
        Arc::from(Vec::new())
    }
    fn version(&self) -> i64 {
        self.version.load(Ordering::SeqCst)
    }
}

#[derive(Default)]
struct RecordingSink {
    audit: Mutex<Vec<AuditEvent>>,
}

#[async_trait]
impl ControlPlaneSink for RecordingSink {
    async fn audit(&self, events: Vec<AuditEvent>) -> Result<(), String> {
        self.audit.lock().unwrap().extend(events);
        Ok(())
    }
    async fn charge_usage(&self, _charges: Vec<UsageCharge>) -> Result<(), String> {
        Ok(())
    }
    async fn write_logs(&self, _records: Vec<LogRecord>) -> Result<(), String> {
        Ok(())
    }
}

impl RecordingSink {
    /// Waits for the background writer to deliver `n` events.
    async fn wait_for(&self, n: usize) -> Vec<AuditEvent> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let events = self.audit.lock().unwrap().clone();
            if events.len() >= n || Instant::now() > deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures.

const ORG: &str = "org-1";
const WS: &str = "ws-1";

fn key_record(id: &str) -> ApiKeyRecord {
    ApiKeyRecord {
        id: id.into(),
        organisation_id: ORG.into(),
        workspace_id: Some(WS.into()),
        user_id: None,
        kind: KeyKind::WorkspaceService,
        status: KeyStatus::Active,
        expires_at: None,
        scopes: Arc::from([]),
        defaults: Arc::default(),
        rate_limits: Vec::new(),
        usage_limits: None,
        counted: CountedUsage::default(),
    }
}

fn workspace() -> WorkspaceRecord {
    WorkspaceRecord {
        id: WS.into(),
        slug: "main".into(),
        organisation_id: ORG.into(),
        defaults: Defaults::default(),
        rate_limits: Vec::new(),
        usage_limits: Vec::new(),
        counted: Vec::new(),
    }
}

fn rpm(value: f64) -> RateLimit {
    RateLimit {
        kind: RateLimitKind::Requests,
        unit: RateUnit::Rpm,
        value,
    }
}

fn budget(limit: f64) -> UsageLimit {
    UsageLimit {
        credit_limit: limit,
        kind: UsageKind::Cost,
        alert_threshold: None,
        periodic_reset: None,
        periodic_reset_days: None,
        next_usage_reset_at: None,
    }
}

struct Fixture {
    store: Arc<MemStore>,
    sink: Arc<RecordingSink>,
    metrics: prometheus::Registry,
}

impl Fixture {
    fn new() -> Fixture {
        let store = Arc::new(MemStore::default());
        store.add_workspace(workspace());
        Fixture {
            store,
            sink: Arc::new(RecordingSink::default()),
            metrics: prometheus::Registry::new(),
        }
    }

    fn build_cx(&self) -> BuildCx {
        BuildCx {
            access: self.store.clone(),
            sink: self.sink.clone(),
            metrics: self.metrics.clone(),
            ..BuildCx::standalone()
        }
    }

    fn plugin(&self, config: Value) -> Auth {
        let config: AuthConfig = serde_json::from_value(config).expect("a valid config");
        assert!(super::config::validate(&config).is_empty());
        match Auth::build(config, &self.build_cx()) {
            Ok(a) => a,
            Err(e) => panic!("build: {e}"),
        }
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.metrics
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| {
                labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}

fn request(route: Route, headers: &[(&str, &str)]) -> RequestCx {
    let mut cx = RequestCx::new(
        "trace-1".into(),
        route,
        http::Method::POST,
        "/v1/chat/completions".into(),
    );
    for (k, v) in headers {
        cx.headers.insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    cx.gw = GwHeaders::parse(&cx.headers).expect("valid headers");
    cx
}

fn chat(headers: &[(&str, &str)]) -> RequestCx {
    request(Route::ChatCompletions, headers)
}

async fn run(plugin: &Auth, cx: &mut RequestCx) -> Result<(), GatewayError> {
    match plugin.on_request(cx).await? {
        Flow::Continue => Ok(()),
        Flow::Respond(r) => panic!("auth answered {} instead of continuing", r.status),
    }
}

async fn refused(plugin: &Auth, cx: &mut RequestCx) -> GatewayError {
    match run(plugin, cx).await {
        Ok(()) => panic!("the request was let through"),
        Err(e) => e,
    }
}

fn principal(cx: &RequestCx) -> &Principal {
    cx.extensions.get::<Principal>().expect("a principal")
}

// ---------------------------------------------------------------------------------------------
// API keys.

#[tokio::test]
async fn a_valid_key_attaches_its_principal_limits_and_budgets() {
    let f = Fixture::new();
    let mut ws = workspace();
    ws.rate_limits = vec![rpm(100.0)];
    ws.usage_limits = vec![budget(50.0), budget(5.0)];
    ws.counted = vec![CountedUsage {
        current_usage: 7.5,
        period: 0,
        reset_epoch: 2,
    }];
    f.store.add_workspace(ws);
    let mut k = key_record("key-1");
    k.user_id = Some("user-9".into());
    k.kind = KeyKind::WorkspaceUser;
    k.rate_limits = vec![rpm(10.0), rpm(20.0)];
    k.usage_limits = Some(budget(3.0));
    k.counted = CountedUsage {
        current_usage: 1.25,
        period: 0,
        reset_epoch: 1,
    };
    f.store.add_key("sk-good", k);
    let plugin = f.plugin(json!({}));

    let mut cx = chat(&[("x-gw-api-key", "sk-good")]);
    run(&plugin, &mut cx).await.unwrap();
    let p = principal(&cx);
    assert_eq!(p.method, AuthMethod::ApiKey(KeyKind::WorkspaceUser));
    assert_eq!(p.organisation_id.as_deref(), Some(ORG));
    assert_eq!(p.workspace_id.as_deref(), Some(WS));
    assert_eq!(p.api_key_id.as_deref(), Some("key-1"));
    assert_eq!(p.user_id.as_deref(), Some("user-9"));
    let ids: Vec<&str> = p.rate_limits.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        ids,
        ["api_key:key-1:0", "api_key:key-1:1", "workspace:ws-1:0"]
    );
    assert_eq!(p.rate_limits[1].limit.value, 20.0);
    let ids: Vec<&str> = p.budgets.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(
        ids,
        ["api_key:key-1", "workspace:ws-1:0", "workspace:ws-1:1"]
    );
    assert_eq!(p.budgets[0].counted.current_usage, 1.25);
    assert_eq!(p.budgets[0].counted.reset_epoch, 1);
    assert_eq!(p.budgets[1].counted.current_usage, 7.5);
    // No usage counted for the second workspace budget yet.
    assert_eq!(p.budgets[2].counted, CountedUsage::default());
    assert_eq!(p.budgets[2].limit.credit_limit, 5.0);

    // The x-portkey- spelling works too.
    let mut cx = chat(&[("x-portkey-api-key", "sk-good")]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(principal(&cx).api_key_id.as_deref(), Some("key-1"));
    assert_eq!(
        f.counter(
            "gw_auth_requests_total",
            &[("method", "api_key"), ("outcome", "ok")]
        ),
        2
    );
}

#[tokio::test]
async fn unknown_or_missing_credentials_are_401_unless_anonymous_use_is_allowed() {
    let f = Fixture::new();
    f.store.add_key("sk-good", key_record("key-1"));
    let plugin = f.plugin(json!({}));

    let mut cx = chat(&[("x-gw-api-key", "sk-wrong")]);
    let e = refused(&plugin, &mut cx).await;
    assert_eq!(e.status().as_u16(), 401);
    let body = e.body();
    assert_eq!(body["error"]["type"], "authentication_error");
    assert_eq!(body["error"]["param"], Value::Null);
    assert_eq!(body["error"]["code"], Value::Null);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid API key"),
        "{body}"
    );
    assert!(!body.to_string().contains("sk-wrong"), "the key is echoed");
    assert!(cx.extensions.get::<Principal>().is_none());

    let mut cx = chat(&[]);
    let e = refused(&plugin, &mut cx).await;
    assert_eq!(e.status().as_u16(), 401);
    assert!(e.message.contains("missing credentials"), "{}", e.message);
    assert_eq!(
        f.counter(
            "gw_auth_requests_total",
            &[("method", "none"), ("outcome", "unauthorized")]
        ),
        1
    );

    // required: false lets a request without credentials through, but not a wrong key.
    let f2 = Fixture::new();
    let open = f2.plugin(json!({"required": false}));
    let mut cx = chat(&[]);
    run(&open, &mut cx).await.unwrap();
    assert!(cx.extensions.get::<Principal>().is_none());
    let mut cx = chat(&[("x-gw-api-key", "sk-wrong")]);
    assert_eq!(refused(&open, &mut cx).await.status().as_u16(), 401);
}

#[tokio::test]
async fn expired_keys_are_401_by_status_and_by_time_and_exhausted_ones_pass() {
    let f = Fixture::new();
    let mut by_status = key_record("key-a");
    by_status.status = KeyStatus::Expired;
    f.store.add_key("sk-a", by_status);
    let mut by_time = key_record("key-b");
    by_time.expires_at = Some(SystemTime::now() - Duration::from_secs(1));
    f.store.add_key("sk-b", by_time);
    let mut later = key_record("key-c");
    later.expires_at = Some(SystemTime::now() + Duration::from_secs(3600));
    f.store.add_key("sk-c", later);
    let mut exhausted = key_record("key-d");
    exhausted.status = KeyStatus::Exhausted;
    f.store.add_key("sk-d", exhausted);
    let plugin = f.plugin(json!({}));

    for raw in ["sk-a", "sk-b"] {
        let mut cx = chat(&[("x-gw-api-key", raw)]);
        let e = refused(&plugin, &mut cx).await;
        assert_eq!(e.status().as_u16(), 401, "{raw}");
        assert!(e.message.contains("expired"), "{raw}: {}", e.message);
    }
    for raw in ["sk-c", "sk-d"] {
        let mut cx = chat(&[("x-gw-api-key", raw)]);
        run(&plugin, &mut cx).await.unwrap();
    }
}

#[tokio::test]
async fn a_key_without_completions_write_is_403_on_llm_and_passthrough_routes() {
    let f = Fixture::new();
    let mut narrow = key_record("key-narrow");
    narrow.scopes = Arc::from(["logs.list".to_owned(), "logs.view".to_owned()]);
    f.store.add_key("sk-narrow", narrow);
    let mut wide = key_record("key-wide");
    wide.scopes = Arc::from(["logs.list".to_owned(), "completions.write".to_owned()]);
    f.store.add_key("sk-wide", wide);
    // No scopes: the kind's default rights, which include calling the gateway.
    for (raw, kind) in [
        ("sk-org", KeyKind::OrganisationService),
        ("sk-svc", KeyKind::WorkspaceService),
        ("sk-usr", KeyKind::WorkspaceUser),
    ] {
        let mut k = key_record(raw);
        k.kind = kind;
        if kind == KeyKind::OrganisationService {
            k.workspace_id = None;
        }
        f.store.add_key(raw, k);
    }
    let plugin = f.plugin(json!({}));

    for route in [Route::ChatCompletions, Route::Passthrough] {
        let mut cx = request(route, &[("x-gw-api-key", "sk-narrow")]);
        let e = refused(&plugin, &mut cx).await;
        assert_eq!(e.status().as_u16(), 403);
        assert_eq!(e.body()["error"]["type"], "permission_error");
        assert!(e.message.contains("completions.write"), "{}", e.message);
        for raw in ["sk-wide", "sk-org", "sk-svc", "sk-usr"] {
            let mut cx = request(route, &[("x-gw-api-key", raw)]);
            run(&plugin, &mut cx).await.unwrap();
        }
    }
    let mut cx = chat(&[("x-gw-api-key", "sk-org")]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(principal(&cx).workspace_id, None);
    assert_eq!(
        f.counter(
            "gw_auth_requests_total",
            &[("method", "api_key"), ("outcome", "forbidden")]
        ),
        2
    );
}

#[tokio::test]
async fn defaults_merge_metadata_and_set_the_config_when_the_request_chose_none() {
    let f = Fixture::new();
    let mut ws = workspace();
    ws.defaults.metadata = BTreeMap::from([
        ("team".into(), "ws-team".into()),
        ("env".into(), "ws-env".into()),
        ("region".into(), "eu".into()),
    ]);
    ws.defaults.config_id = Some("pc-workspace".into());
    f.store.add_workspace(ws);
    let mut k = key_record("key-1");
    Arc::make_mut(&mut k.defaults).metadata = BTreeMap::from([
        ("team".into(), "key-team".into()),
        ("_user".into(), "key-user".into()),
    ]);
    Arc::make_mut(&mut k.defaults).config_id = Some("pc-key".into());
    f.store.add_key("sk-1", k);
    f.store.add_key("sk-2", key_record("key-2"));
    let plugin = f.plugin(json!({}));

    let mut cx = chat(&[
        ("x-gw-api-key", "sk-1"),
        (
            "x-gw-metadata",
            r#"{"_user":"alice","env":"dev","trace":"t1"}"#,
        ),
    ]);
    run(&plugin, &mut cx).await.unwrap();
    let m = &cx.gw.metadata;
    // Limits are keyed on metadata: what the credential sets, the caller cannot change.
    assert_eq!(
        m["_user"], "key-user",
        "the key's value beats the request's"
    );
    assert_eq!(
        m["team"], "key-team",
        "the key's value beats the workspace's"
    );
    assert_eq!(m["env"], "ws-env", "the workspace's beats the request's");
    assert_eq!(m["region"], "eu");
    assert_eq!(m["trace"], "t1", "what no default sets is the request's");
    assert_eq!(cx.gw.config.as_deref(), Some("pc-key"));

    // The workspace's config when the key has none.
    let mut cx = chat(&[("x-gw-api-key", "sk-2")]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(cx.gw.config.as_deref(), Some("pc-workspace"));

    // Overrides are allowed by default: the request's own choice stays.
    let mut cx = chat(&[("x-gw-api-key", "sk-1"), ("x-gw-config", "pc-mine")]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(cx.gw.config.as_deref(), Some("pc-mine"));
    let mut cx = chat(&[("x-gw-api-key", "sk-1"), ("x-gw-provider", "@prod")]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(cx.gw.config, None);
}

#[tokio::test]
async fn a_request_config_is_403_when_the_default_config_may_not_be_overridden() {
    let f = Fixture::new();
    let mut k = key_record("key-1");
    let defaults = Arc::make_mut(&mut k.defaults);
    defaults.config_id = Some("pc-locked".into());
    defaults.allow_config_override = Some(false);
    f.store.add_key("sk-locked", k);
    let plugin = f.plugin(json!({}));

    let mut cx = chat(&[("x-gw-api-key", "sk-locked"), ("x-gw-config", "pc-other")]);
    let e = refused(&plugin, &mut cx).await;
    assert_eq!(e.status().as_u16(), 403);
    assert!(e.message.contains("x-gw-config"), "{}", e.message);
    let mut cx = chat(&[
        ("x-gw-api-key", "sk-locked"),
        ("x-gw-provider", "openai"),
        ("authorization", "Bearer sk-provider"),
    ]);
    let e = refused(&plugin, &mut cx).await;
    assert_eq!(e.status().as_u16(), 403);
    assert!(e.message.contains("x-gw-provider"), "{}", e.message);

    let mut cx = chat(&[("x-gw-api-key", "sk-locked")]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(cx.gw.config.as_deref(), Some("pc-locked"));
}

#[tokio::test]
async fn a_rotated_key_s_previous_value_works_and_a_digest_mismatch_does_not() {
    let f = Fixture::new();
    let record = f.store.add_key("sk-new", key_record("key-rot"));
    f.store.add_previous("sk-old", &record);
    let plugin = f.plugin(json!({}));
    for raw in ["sk-new", "sk-old"] {
        let mut cx = chat(&[("x-gw-api-key", raw)]);
        run(&plugin, &mut cx).await.unwrap();
        assert_eq!(principal(&cx).api_key_id.as_deref(), Some("key-rot"));
    }
    // The previous value's transition ended: the store no longer finds it.
    f.store.keys.lock().unwrap().remove(&digest("sk-old"));
    let mut cx = chat(&[("x-gw-api-key", "sk-old")]);
    assert_eq!(refused(&plugin, &mut cx).await.status().as_u16(), 401);

    // A store that hands back a record under another digest is not believed.
    f.store
        .keys
        .lock()
        .unwrap()
        .insert(digest("sk-odd"), (record.clone(), digest("sk-new")));
    let mut cx = chat(&[("x-gw-api-key", "sk-odd")]);
    assert_eq!(refused(&plugin, &mut cx).await.status().as_u16(), 401);
}

#[tokio::test]
async fn a_key_whose_workspace_is_gone_is_401() {
    let f = Fixture::new();
    let mut k = key_record("key-1");
    k.workspace_id = Some("ws-deleted".into());
    f.store.add_key("sk-1", k);
    let plugin = f.plugin(json!({}));
    let mut cx = chat(&[("x-gw-api-key", "sk-1")]);
    let e = refused(&plugin, &mut cx).await;
    assert_eq!(e.status().as_u16(), 401);
    assert!(e.message.contains("workspace"), "{}", e.message);
}

#[test]
fn digests_compare_equal_only_when_every_byte_is() {
    let a = digest("sk-1");
    assert!(digests_equal(&a, &digest("sk-1")));
    for i in [0, 15, 31] {
        let mut b = a;
        b[i] ^= 1;
        assert!(!digests_equal(&a, &b), "byte {i}");
    }
    // The digest is SHA-256, as the control plane stores it (hex there).
    let hex: String = digest("abc").iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

// ---------------------------------------------------------------------------------------------
// JWT fixtures.

const RSA_A: &[u8] = include_bytes!("testdata/rsa_a.pem");
const RSA_B: &[u8] = include_bytes!("testdata/rsa_b.pem");
const EC_A: &[u8] = include_bytes!("testdata/ec_a.pem");

fn encoding_key(pem: &[u8]) -> EncodingKey {
    if pem == EC_A {
        EncodingKey::from_ec_pem(pem).unwrap()
    } else {
        EncodingKey::from_rsa_pem(pem).unwrap()
    }
}

/// The public JWK of a test key, with its id.
fn jwk(pem: &[u8], kid: &str) -> Jwk {
    let alg = if pem == EC_A {
        Algorithm::ES256
    } else {
        Algorithm::RS256
    };
    let mut jwk = Jwk::from_encoding_key(&encoding_key(pem), alg).unwrap();
    jwk.common.key_id = Some(kid.into());
    jwk.common.key_algorithm = Some(if alg == Algorithm::ES256 {
        KeyAlgorithm::ES256
    } else {
        KeyAlgorithm::RS256
    });
    jwk
}

fn jwks(keys: &[(&[u8], &str)]) -> String {
    serde_json::to_string(&JwkSet {
        keys: keys.iter().map(|(pem, kid)| jwk(pem, kid)).collect(),
    })
    .unwrap()
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A token signed with `pem`, naming `kid`.
fn token(pem: &[u8], kid: Option<&str>, claims: Value) -> String {
    let alg = if pem == EC_A {
        Algorithm::ES256
    } else {
        Algorithm::RS256
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, &claims, &encoding_key(pem)).unwrap()
}

fn claims(extra: Value) -> Value {
    let mut c = json!({
        "sub": "user-1",
        "exp": now() + 600,
        "iat": now(),
        "iss": "https://idp.test/",
        "aud": "gateway",
        "workspace_id": WS,
        "scope": "openid completions.write",
    });
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            c.insert(k.clone(), v.clone());
        }
    }
    c
}

struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(contents: &str) -> TempFile {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "gw-auth-jwks-{}-{}.json",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn jwt_config(jwks_file: &TempFile) -> Value {
    json!({"jwt": {
        "jwks_file": jwks_file.0,
        "issuer": "https://idp.test/",
        "audience": "gateway",
    }})
}

fn file_with_a_keys() -> TempFile {
    TempFile::new(&jwks(&[(RSA_A, "rsa-a"), (EC_A, "ec-a")]))
}

// ---------------------------------------------------------------------------------------------
// JWT.

#[test]
fn jwt_shapes_are_told_from_api_keys() {
    let t = token(RSA_A, Some("rsa-a"), claims(json!({})));
    assert!(looks_like_jwt(&t));
    for not in [
        "sk-abc",
        "Xk3aZ_-0abc",
        "a.b",
        "a..c",
        "a.b.c.d",
        "a.b.c=",
        "a b.c.d",
    ] {
        assert!(!looks_like_jwt(not), "{not}");
    }
    assert!(looks_like_jwt("a.b.c"));
}

#[tokio::test]
async fn a_valid_jwt_in_either_header_attaches_its_claims() {
    let f = Fixture::new();
    let mut ws = workspace();
    ws.rate_limits = vec![rpm(1000.0)];
    ws.defaults.metadata = BTreeMap::from([("env".into(), "prod".into())]);
    ws.defaults.input_guardrails = vec![json!({"id": "ws-in", "checks": [
        {"id": "default.wordCount", "parameters": {"minWords": 1}}
    ]})];
    f.store.add_workspace(ws);
    let file = file_with_a_keys();
    let plugin = f.plugin(jwt_config(&file));

    let rs = token(
        RSA_A,
        Some("rsa-a"),
        claims(json!({
            "organisation_id": ORG,
            "rate_limits": [{"type": "requests", "unit": "rpm", "value": 5}],
            "usage_limits": {"credit_limit": 2.5, "type": "cost"},
        })),
    );
    let mut cx = chat(&[
        ("x-gw-api-key", rs.as_str()),
        ("x-gw-metadata", r#"{"_user":"mallory"}"#),
    ]);
    run(&plugin, &mut cx).await.unwrap();
    // The token's user is the request's `_user`, whatever the request says.
    assert_eq!(cx.gw.metadata["_user"], "user-1");
    let p = principal(&cx);
    assert_eq!(p.method, AuthMethod::Jwt);
    assert_eq!(p.workspace_id.as_deref(), Some(WS));
    assert_eq!(p.organisation_id.as_deref(), Some(ORG));
    assert_eq!(p.user_id.as_deref(), Some("user-1"));
    assert_eq!(p.api_key_id, None);
    assert_eq!(p.scopes, ["openid", "completions.write"]);
    let ids: Vec<&str> = p.rate_limits.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["jwt:user-1:0", "workspace:ws-1:0"]);
    assert_eq!(p.budgets.len(), 1);
    assert_eq!(p.budgets[0].id, "jwt:user-1:0");
    assert_eq!(p.budgets[0].limit.credit_limit, 2.5);
    assert_eq!(p.budgets[0].counted, CountedUsage::default());
    assert_eq!(cx.gw.metadata["env"], "prod");

    // ES256 in Authorization: Bearer, which is then no longer among the headers.
    let es = token(
        EC_A,
        Some("ec-a"),
        claims(json!({"scope": null, "scopes": ["completions.write"]})),
    );
    let bearer = format!("Bearer {es}");
    let mut cx = chat(&[
        ("authorization", bearer.as_str()),
        ("x-gw-provider", "openai"),
    ]);
    run(&plugin, &mut cx).await.unwrap();
    assert!(cx.headers.get(http::header::AUTHORIZATION).is_none());
    let p = principal(&cx);
    assert_eq!(p.scopes, ["completions.write"]);
    // Without an organisation claim, the workspace's.
    assert_eq!(p.organisation_id.as_deref(), Some(ORG));

    // A provider key in Authorization with an API key beside it stays for the provider.
    f.store.add_key("sk-1", key_record("key-1"));
    let mut cx = chat(&[
        ("x-gw-api-key", "sk-1"),
        ("authorization", "Bearer sk-provider"),
    ]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(
        cx.headers[http::header::AUTHORIZATION],
        "Bearer sk-provider"
    );
    // ...and one that is not a JWT, without any credential, is no credential.
    let mut cx = chat(&[("authorization", "Bearer sk-provider")]);
    assert_eq!(refused(&plugin, &mut cx).await.status().as_u16(), 401);
    assert_eq!(
        cx.headers[http::header::AUTHORIZATION],
        "Bearer sk-provider"
    );

    assert_eq!(
        f.counter(
            "gw_auth_requests_total",
            &[("method", "jwt"), ("outcome", "ok")]
        ),
        2
    );
}

/// Sends `token` and returns the 401's message.
async fn jwt_refused(plugin: &Auth, token: &str) -> String {
    let mut cx = chat(&[("x-gw-api-key", token)]);
    let e = refused(plugin, &mut cx).await;
    assert_eq!(e.status().as_u16(), 401, "{}", e.message);
    assert_eq!(e.body()["error"]["type"], "authentication_error");
    assert!(cx.extensions.get::<Principal>().is_none());
    e.message
}

#[tokio::test]
async fn refused_jwts_are_401_with_the_reason_and_an_audit_event() {
    let f = Fixture::new();
    let file = file_with_a_keys();
    let plugin = f.plugin(jwt_config(&file));

    let cases: Vec<(&str, String, &str)> = vec![
        (
            "expired",
            // Past the 30 s leeway.
            token(RSA_A, Some("rsa-a"), claims(json!({"exp": now() - 120}))),
            "expired",
        ),
        (
            "not_yet_valid",
            token(RSA_A, Some("rsa-a"), claims(json!({"nbf": now() + 300}))),
            "not valid yet",
        ),
        (
            "bad_signature",
            // Signed with a key the JWKS does not hold, under a kid it does.
            token(RSA_B, Some("rsa-a"), claims(json!({}))),
            "bad signature",
        ),
        (
            "wrong_issuer",
            token(
                RSA_A,
                Some("rsa-a"),
                claims(json!({"iss": "https://evil.test/"})),
            ),
            "issuer",
        ),
        (
            "wrong_audience",
            token(EC_A, Some("ec-a"), claims(json!({"aud": "someone-else"}))),
            "audience",
        ),
        (
            "unknown_kid",
            token(RSA_B, Some("rsa-b"), claims(json!({}))),
            "rsa-b",
        ),
        (
            "missing_claim",
            token(RSA_A, Some("rsa-a"), claims(json!({"exp": null}))),
            "exp",
        ),
        (
            "bad_claim",
            token(
                RSA_A,
                Some("rsa-a"),
                claims(json!({"rate_limits": [{"type": "requests", "unit": "rpw", "value": 1}]})),
            ),
            "rate_limits",
        ),
        (
            "malformed",
            "bm90IGpzb24.bm90IGpzb24.c2ln".to_string(),
            "well-formed",
        ),
    ];
    for (code, t, fragment) in &cases {
        let message = jwt_refused(&plugin, t).await;
        assert!(
            message.starts_with("invalid JWT: ") && message.contains(fragment),
            "{code}: {message}"
        );
    }

    let events = f.sink.wait_for(cases.len()).await;
    assert_eq!(events.len(), cases.len());
    for ((code, _, _), event) in cases.iter().zip(&events) {
        assert_eq!(event.action, "auth.jwt_rejected");
        assert_eq!(event.resource_type, "jwt");
        assert_eq!(event.status, 401);
        assert_eq!(event.request_id, "trace-1");
        assert_eq!(event.method, "POST");
        assert_eq!(event.uri, "/v1/chat/completions");
        assert_eq!(event.details["reason"], *code, "{:?}", event.details);
    }
    assert_eq!(events[2].resource_id.as_deref(), Some("rsa-a"));
    // No token text in what is recorded.
    let recorded = format!("{events:?}");
    for (_, t, _) in &cases {
        assert!(!recorded.contains(t.as_str()));
    }
    assert_eq!(
        f.counter(
            "gw_auth_requests_total",
            &[("method", "jwt"), ("outcome", "unauthorized")]
        ),
        cases.len() as u64
    );
    assert_eq!(
        f.counter("gw_auth_audit_events_total", &[("outcome", "written")]),
        cases.len() as u64
    );
}

#[tokio::test]
async fn algorithms_leeway_and_unchecked_audience_follow_the_config() {
    let f = Fixture::new();
    let file = file_with_a_keys();
    let plugin = f.plugin(json!({"jwt": {
        "jwks_file": file.0,
        "issuer": "https://idp.test/",
        "algorithms": ["ES256"],
        "leeway_secs": 120,
    }}));
    // RS256 is not accepted here.
    let message = jwt_refused(&plugin, &token(RSA_A, Some("rsa-a"), claims(json!({})))).await;
    assert!(message.contains("RS256"), "{message}");
    // Within the leeway, an expired token still passes; the audience is not checked.
    let t = token(
        EC_A,
        Some("ec-a"),
        claims(json!({"exp": now() - 60, "aud": "anyone"})),
    );
    let mut cx = chat(&[("x-gw-api-key", t.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    // The issuer is.
    let t = token(EC_A, Some("ec-a"), claims(json!({"iss": "anywhere"})));
    let message = jwt_refused(&plugin, &t).await;
    assert!(message.contains("issuer"), "{message}");
    // A token without a kid is tried against every key that fits its algorithm.
    let t = token(EC_A, None, claims(json!({})));
    let mut cx = chat(&[("x-gw-api-key", t.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    // An HMAC token is never accepted.
    let hs = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims(json!({})),
        &EncodingKey::from_secret(b"secret"),
    )
    .unwrap();
    let message = jwt_refused(&plugin, &hs).await;
    assert!(message.contains("HS256"), "{message}");
}

#[tokio::test]
async fn jwt_scopes_claims_and_workspaces_are_checked() {
    let f = Fixture::new();
    let mut other_org = workspace();
    other_org.id = "ws-other".into();
    other_org.organisation_id = "org-2".into();
    f.store.add_workspace(other_org);
    let file = file_with_a_keys();
    let plugin = f.plugin(jwt_config(&file));

    // Scopes without completions.write: 403.
    let t = token(RSA_A, Some("rsa-a"), claims(json!({"scope": "logs.view"})));
    let mut cx = chat(&[("x-gw-api-key", t.as_str())]);
    let e = refused(&plugin, &mut cx).await;
    assert_eq!(e.status().as_u16(), 403);
    assert!(e.message.contains("completions.write"), "{}", e.message);
    // No scopes claim at all: no rights...
    let t = token(RSA_A, Some("rsa-a"), claims(json!({"scope": null})));
    let mut cx = chat(&[("x-gw-api-key", t.as_str())]);
    let e = refused(&plugin, &mut cx).await;
    assert_eq!(e.status().as_u16(), 403);
    assert!(e.message.contains("completions.write"), "{}", e.message);
    // ...unless the config gives such tokens default scopes.
    let mut config = jwt_config(&file);
    config["jwt"]["default_scopes"] = json!("completions.write");
    let with_defaults = Fixture::new().plugin(config);
    let mut cx = chat(&[("x-gw-api-key", t.as_str())]);
    run(&with_defaults, &mut cx).await.unwrap();
    // A workspace the snapshot does not know still names the caller.
    let t = token(
        RSA_A,
        Some("rsa-a"),
        claims(json!({"workspace_id": "ws-elsewhere"})),
    );
    let mut cx = chat(&[("x-gw-api-key", t.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(principal(&cx).workspace_id.as_deref(), Some("ws-elsewhere"));
    assert!(principal(&cx).rate_limits.is_empty());
    // A workspace of another organisation than the token's: 401.
    let t = token(
        RSA_A,
        Some("rsa-a"),
        claims(json!({"workspace_id": "ws-other", "organisation_id": ORG})),
    );
    let message = jwt_refused(&plugin, &t).await;
    assert!(message.contains("another organisation"), "{message}");
    // Limits without a subject to name their counters: 401.
    let t = token(
        RSA_A,
        Some("rsa-a"),
        claims(json!({"sub": null, "usage_limits": [{"credit_limit": 1}]})),
    );
    let message = jwt_refused(&plugin, &t).await;
    assert!(message.contains("sub"), "{message}");
}

#[test]
fn claims_map_by_the_configured_names() {
    let names: super::config::ClaimsConfig = serde_json::from_value(json!({
        "workspace_id": "https://example.com/ws",
        "user": "email",
        "scopes": "permissions",
        "usage_limits": "budgets",
    }))
    .unwrap();
    let claims = json!({
        "https://example.com/ws": "ws-9",
        "email": "ann@example.com",
        "sub": 42,
        "permissions": ["completions.write", "logs.view"],
        "scope": "ignored",
        "budgets": [{"credit_limit": 10, "type": "tokens"}, {"credit_limit": 1}],
    });
    let id = identity(claims.as_object().unwrap(), &names, &[]).unwrap();
    assert_eq!(id.workspace_id.as_deref(), Some("ws-9"));
    assert_eq!(id.user.as_deref(), Some("ann@example.com"));
    assert_eq!(id.scopes, ["completions.write", "logs.view"]);
    assert_eq!(id.usage_limits.len(), 2);
    assert_eq!(id.usage_limits[0].kind, UsageKind::Tokens);
    assert_eq!(id.usage_limits[1].kind, UsageKind::Cost);

    let defaults = super::config::ClaimsConfig::default();
    for (bad, claim) in [
        (json!({"sub": "u", "scope": 3}), "scope"),
        (json!({"sub": "u", "scopes": ["a", 1]}), "scopes"),
        (json!({"sub": ["u"]}), "sub"),
        (
            json!({"sub": "u", "rate_limits": [{"type": "requests", "unit": "rpm", "value": -1}]}),
            "rate_limits",
        ),
        (json!({"sub": "u", "usage_limits": "lots"}), "usage_limits"),
    ] {
        match identity(bad.as_object().unwrap(), &defaults, &[]) {
            Err(super::jwt::Failure::BadClaim { claim: c, .. }) => assert_eq!(c, claim),
            other => panic!("{bad}: {other:?}"),
        }
    }
    // A numeric subject is taken as its text.
    let id = identity(json!({"sub": 42}).as_object().unwrap(), &defaults, &[]).unwrap();
    assert_eq!(id.user.as_deref(), Some("42"));
    // No scopes claim: the configured default scopes, else none; a claim, even empty, wins.
    assert!(id.scopes.is_empty());
    let given = ["completions.write".to_owned()];
    let id = identity(json!({"sub": "u"}).as_object().unwrap(), &defaults, &given).unwrap();
    assert_eq!(id.scopes, given);
    let id = identity(
        json!({"sub": "u", "scope": ""}).as_object().unwrap(),
        &defaults,
        &given,
    )
    .unwrap();
    assert!(id.scopes.is_empty());
}

#[tokio::test]
async fn a_jwks_file_is_reread_on_reload_and_a_broken_one_keeps_the_old_keys() {
    let f = Fixture::new();
    let file = TempFile::new(&jwks(&[(RSA_A, "rsa-a")]));
    let plugin = f.plugin(jwt_config(&file));
    let a = token(RSA_A, Some("rsa-a"), claims(json!({})));
    let b = token(RSA_B, Some("rsa-b"), claims(json!({})));
    let mut cx = chat(&[("x-gw-api-key", a.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    jwt_refused(&plugin, &b).await;

    std::fs::write(&file.0, jwks(&[(RSA_B, "rsa-b")])).unwrap();
    plugin.reload().unwrap();
    let mut cx = chat(&[("x-gw-api-key", b.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    let message = jwt_refused(&plugin, &a).await;
    assert!(message.contains("rsa-a"), "{message}");

    std::fs::write(&file.0, "{\"keys\": \"nope\"}").unwrap();
    let err = plugin.reload().unwrap_err();
    assert!(err.contains("keys"), "{err}");
    let mut cx = chat(&[("x-gw-api-key", b.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(
        f.counter("gw_auth_jwks_refresh_total", &[("outcome", "error")]),
        1
    );
    assert_eq!(
        f.counter("gw_auth_jwks_refresh_total", &[("outcome", "ok")]),
        2
    );
}

// ---------------------------------------------------------------------------------------------
// JWKS over HTTP.

/// A tiny HTTP server on its own thread (the plugin's build waits for the first fetch, so the
/// server must not share the test's runtime), answering every request with the current
/// status and body and counting requests.
struct JwksServer {
    url: String,
    answer: Arc<Mutex<(u16, String)>>,
    hits: Arc<AtomicUsize>,
}

impl JwksServer {
    fn start(body: String) -> JwksServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!(
            "http://{}/.well-known/jwks.json",
            listener.local_addr().unwrap()
        );
        let answer = Arc::new(Mutex::new((200u16, body)));
        let hits = Arc::new(AtomicUsize::new(0));
        let (a, h) = (answer.clone(), hits.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                h.fetch_add(1, Ordering::SeqCst);
                let (status, body) = a.lock().unwrap().clone();
                let response = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes());
            }
        });
        JwksServer { url, answer, hits }
    }

    fn serve(&self, status: u16, body: String) {
        *self.answer.lock().unwrap() = (status, body);
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_jwks_url_is_fetched_early_for_an_unknown_kid_at_most_once_per_interval() {
    let server = JwksServer::start(jwks(&[(RSA_A, "rsa-a")]));
    let f = Fixture::new();
    let plugin = f.plugin(json!({"jwt": {
        "jwks_url": server.url,
        "audience": "gateway",
        "refresh_secs": 3600,
        "min_refresh_secs": 3600,
    }}));
    assert_eq!(server.hits(), 1, "fetched once at build");
    let a = token(RSA_A, Some("rsa-a"), claims(json!({})));
    let mut cx = chat(&[("x-gw-api-key", a.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(server.hits(), 1);

    // The identity provider adds a key; a token under its id makes the gateway fetch early.
    server.serve(200, jwks(&[(RSA_A, "rsa-a"), (RSA_B, "rsa-b")]));
    let b = token(RSA_B, Some("rsa-b"), claims(json!({})));
    let mut cx = chat(&[("x-gw-api-key", b.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(server.hits(), 2);

    // Made-up ids do not make it fetch again within min_refresh_secs.
    for i in 0..3 {
        let t = token(RSA_B, Some(&format!("made-up-{i}")), claims(json!({})));
        let message = jwt_refused(&plugin, &t).await;
        assert!(message.contains("made-up"), "{message}");
    }
    assert_eq!(server.hits(), 2);
    assert_eq!(
        f.counter("gw_auth_jwks_refresh_total", &[("outcome", "ok")]),
        2
    );
}

#[tokio::test]
async fn a_jwks_url_is_refreshed_in_the_background_and_keeps_the_last_good_set() {
    let server = JwksServer::start(jwks(&[(RSA_A, "rsa-a")]));
    let f = Fixture::new();
    let plugin = f.plugin(json!({"jwt": {
        "jwks_url": server.url,
        "audience": "gateway",
        "refresh_secs": 1,
        "min_refresh_secs": 3600,
    }}));
    let a = token(RSA_A, Some("rsa-a"), claims(json!({})));
    let ec = token(EC_A, Some("ec-a"), claims(json!({})));

    // A failing identity provider: the keys in use stay.
    server.serve(503, "down".into());
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.counter("gw_auth_jwks_refresh_total", &[("outcome", "error")]) == 0 {
        assert!(Instant::now() < deadline, "no background refresh happened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut cx = chat(&[("x-gw-api-key", a.as_str())]);
    run(&plugin, &mut cx).await.unwrap();

    // It comes back with a new set, picked up without any request asking for it.
    server.serve(200, jwks(&[(EC_A, "ec-a")]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.counter("gw_auth_jwks_refresh_total", &[("outcome", "ok")]) < 2 {
        assert!(Instant::now() < deadline, "the new set was not fetched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut cx = chat(&[("x-gw-api-key", ec.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    // The token verified (and kept) under the old set lost its key with the refresh.
    let message = jwt_refused(&plugin, &a).await;
    assert!(message.contains("rsa-a"), "{message}");
}

#[test]
fn a_jwks_url_that_cannot_be_fetched_at_start_refuses_the_build() {
    let server = JwksServer::start("not json".into());
    let f = Fixture::new();
    let config: AuthConfig =
        serde_json::from_value(json!({"jwt": {"jwks_url": server.url}})).unwrap();
    let err = Auth::build(config, &f.build_cx()).err().expect("refused");
    assert!(err.starts_with("jwt.jwks_url: "), "{err}");
    server.serve(404, String::new());
    let config: AuthConfig =
        serde_json::from_value(json!({"jwt": {"jwks_url": server.url}})).unwrap();
    let err = Auth::build(config, &Fixture::new().build_cx())
        .err()
        .expect("refused");
    assert!(err.contains("404"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Config.

fn check(config: Value) -> Vec<(String, String)> {
    let d = PluginDescriptor::find("auth").expect("auth is registered");
    match d.check(&config) {
        Ok(()) => Vec::new(),
        Err(issues) => issues.into_iter().map(|i| (i.path, i.message)).collect(),
    }
}

#[test]
fn the_config_is_validated_with_the_field_named() {
    assert!(check(json!({})).is_empty());
    assert!(check(json!({"required": false})).is_empty());
    assert!(check(json!({"jwt": {"jwks_file": "/etc/jwks.json", "audience": "gw"}})).is_empty());
    assert!(check(json!({"jwt": {"jwks_file": "/etc/jwks.json", "issuer": "i"}})).is_empty());
    assert!(check(json!({"jwt": {
        "jwks_url": "https://idp.example.com/jwks",
        "issuer": ["a", "b"],
        "audience": "gw",
        "claims": {"scopes": "permissions"}
    }}))
    .is_empty());

    let cases = [
        (json!({"requried": true}), "requried"),
        (json!({"jwt": {}}), "jwt"),
        // Neither issuer nor audience: any token of the identity provider would do.
        (json!({"jwt": {"jwks_file": "f"}}), "jwt.audience"),
        (
            json!({"jwt": {"jwks_file": "f", "audience": "a", "default_scopes": [""]}}),
            "jwt.default_scopes",
        ),
        (
            json!({"jwt": {"jwks_url": "https://x/", "jwks_file": "f"}}),
            "jwt.jwks_file",
        ),
        (json!({"jwt": {"jwks_url": "ftp://x/keys"}}), "jwt.jwks_url"),
        (json!({"jwt": {"jwks_url": "not a url"}}), "jwt.jwks_url"),
        (
            json!({"jwt": {"jwks_file": "f", "refresh_secs": 0}}),
            "jwt.refresh_secs",
        ),
        (
            json!({"jwt": {"jwks_file": "f", "min_refresh_secs": 0}}),
            "jwt.min_refresh_secs",
        ),
        (
            json!({"jwt": {"jwks_file": "f", "algorithms": []}}),
            "jwt.algorithms",
        ),
        (
            json!({"jwt": {"jwks_file": "f", "algorithms": ["HS256"]}}),
            "jwt.algorithms[0]",
        ),
        (
            json!({"jwt": {"jwks_file": "f", "leeway_secs": 3600}}),
            "jwt.leeway_secs",
        ),
        (
            json!({"jwt": {"jwks_file": "f", "issuer": ""}}),
            "jwt.issuer",
        ),
        (
            json!({"jwt": {"jwks_file": "f", "audience": 5}}),
            "jwt.audience",
        ),
        (
            json!({"jwt": {"jwks_file": "f", "claims": {"user": ""}}}),
            "jwt.claims.user",
        ),
        (
            json!({"jwt": {"jwks_file": "f", "claims": {"tenant": "t"}}}),
            "jwt.claims.tenant",
        ),
    ];
    for (config, path) in cases {
        let issues = check(config.clone());
        assert!(
            issues.iter().any(|(p, _)| p == path),
            "{config}: expected an issue at {path:?}, got {issues:?}"
        );
    }
}

#[test]
fn a_missing_jwks_file_refuses_the_build() {
    let f = Fixture::new();
    let config: AuthConfig =
        serde_json::from_value(json!({"jwt": {"jwks_file": "/nonexistent/jwks.json"}})).unwrap();
    let err = Auth::build(config, &f.build_cx()).err().expect("refused");
    assert!(err.contains("jwt.jwks_file"), "{err}");
    // A set with no usable key is refused too.
    let file = TempFile::new(r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}"#);
    let config: AuthConfig = serde_json::from_value(json!({"jwt": {"jwks_file": file.0}})).unwrap();
    let err = Auth::build(config, &Fixture::new().build_cx())
        .err()
        .expect("refused");
    assert!(err.contains("no RS256 or ES256"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// The audit queue.

/// A sink whose writes wait until the test opens the gate.
struct GatedSink {
    gate: tokio::sync::Semaphore,
    written: Mutex<usize>,
    /// Batches handed to the sink, written or waiting at the gate.
    entered: AtomicUsize,
}

#[async_trait]
impl ControlPlaneSink for GatedSink {
    async fn audit(&self, events: Vec<AuditEvent>) -> Result<(), String> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let _permit = self.gate.acquire().await.map_err(|e| e.to_string())?;
        *self.written.lock().unwrap() += events.len();
        Ok(())
    }
    async fn charge_usage(&self, _charges: Vec<UsageCharge>) -> Result<(), String> {
        Ok(())
    }
    async fn write_logs(&self, _records: Vec<LogRecord>) -> Result<(), String> {
        Ok(())
    }
}

fn audit_event(n: usize) -> AuditEvent {
    AuditEvent {
        action: "auth.jwt_rejected".into(),
        resource_type: "jwt".into(),
        resource_id: None,
        organisation_id: None,
        workspace_id: None,
        user_id: None,
        method: "POST".into(),
        uri: "/v1/chat/completions".into(),
        request_id: format!("trace-{n}"),
        status: 401,
        client_ip: None,
        details: json!({}),
    }
}

#[tokio::test]
async fn a_full_audit_queue_drops_and_counts_instead_of_waiting() {
    use super::background::{AuditQueue, Background};
    let background = Background::start().unwrap();
    let sink = Arc::new(GatedSink {
        gate: tokio::sync::Semaphore::new(0),
        written: Mutex::new(0),
        entered: AtomicUsize::new(0),
    });
    let events = prometheus::IntCounterVec::new(
        prometheus::Opts::new("gw_auth_audit_events_total", "test"),
        &["outcome"],
    )
    .unwrap();
    let queue = AuditQueue::start(&background, sink.clone(), events.clone(), 2);
    // The writer takes a first event and waits at the gated sink with it.
    queue.send(audit_event(0));
    let deadline = Instant::now() + Duration::from_secs(5);
    while sink.entered.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the writer never took the event");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    for n in 1..10 {
        queue.send(audit_event(n));
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "sending waited for the sink"
    );
    let count = |o: &str| events.with_label_values(&[o]).get();
    let (queued, dropped) = (count("queued"), count("dropped"));
    // The writer holds one event while the sink waits; the queue takes two more.
    assert_eq!((queued, dropped), (3, 7));

    sink.gate.add_permits(100);
    let deadline = Instant::now() + Duration::from_secs(5);
    while count("written") < queued {
        assert!(
            Instant::now() < deadline,
            "the queued events were not written"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(*sink.written.lock().unwrap() as u64, queued);
    assert_eq!(count("written"), queued);
}

// ---------------------------------------------------------------------------------------------
// Verified tokens kept.

#[tokio::test]
async fn a_token_is_verified_once_and_kept_until_its_exp_or_a_new_key_set() {
    let f = Fixture::new();
    let file = file_with_a_keys();
    let mut config = jwt_config(&file);
    config["jwt"]["leeway_secs"] = json!(0);
    let plugin = f.plugin(config);
    let hits = || f.counter("gw_auth_jwt_cache_total", &[("outcome", "hit")]);
    let misses = || f.counter("gw_auth_jwt_cache_total", &[("outcome", "miss")]);

    // Two tokens, two callers: each is verified once, and never answers for the other.
    let ann = token(RSA_A, Some("rsa-a"), claims(json!({"sub": "ann"})));
    let bob = token(EC_A, Some("ec-a"), claims(json!({"sub": "bob"})));
    for round in 0..3 {
        for (t, user) in [(&ann, "ann"), (&bob, "bob")] {
            let mut cx = chat(&[("x-gw-api-key", t.as_str())]);
            run(&plugin, &mut cx).await.unwrap();
            assert_eq!(
                principal(&cx).user_id.as_deref(),
                Some(user),
                "round {round}"
            );
        }
    }
    assert_eq!((misses(), hits()), (2, 4));

    // A kept token is still held to its exp.
    let soon = token(
        RSA_A,
        Some("rsa-a"),
        claims(json!({"sub": "cat", "exp": now() + 1})),
    );
    let mut cx = chat(&[("x-gw-api-key", soon.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let message = jwt_refused(&plugin, &soon).await;
    assert!(message.contains("expired"), "{message}");
    assert_eq!(hits(), 5, "refused from the cache, not verified again");

    // A new key set (the same file read again): kept tokens are verified again, and a key
    // that left takes its tokens with it.
    plugin.reload().unwrap();
    let mut cx = chat(&[("x-gw-api-key", ann.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
    assert_eq!(misses(), 4);
    std::fs::write(&file.0, jwks(&[(EC_A, "ec-a")])).unwrap();
    plugin.reload().unwrap();
    let message = jwt_refused(&plugin, &ann).await;
    assert!(message.contains("rsa-a"), "{message}");
    let mut cx = chat(&[("x-gw-api-key", bob.as_str())]);
    run(&plugin, &mut cx).await.unwrap();
}

#[tokio::test]
async fn the_kept_tokens_stay_within_their_memory_bound() {
    let file = file_with_a_keys();
    let config: AuthConfig = serde_json::from_value(jwt_config(&file)).unwrap();
    let registry = prometheus::Registry::new();
    let metrics = super::AuthMetrics::register(&registry).unwrap();
    const BOUND: u64 = 8 * 1024;
    let jwt = super::jwt::JwtAuth::build_with_cache(
        config.jwt.as_ref().unwrap(),
        Arc::new(plugin_sdk::sinks::Discard),
        &metrics,
        BOUND,
    )
    .unwrap();
    for i in 0..100 {
        let t = token(
            EC_A,
            Some("ec-a"),
            claims(json!({"sub": format!("user-{i}")})),
        );
        let checked = jwt.check(&t).await.unwrap();
        assert_eq!(
            checked.identity.user.as_deref(),
            Some(format!("user-{i}").as_str())
        );
    }
    let (entries, bytes) = jwt.cache_usage();
    assert!(bytes <= BOUND, "{bytes} bytes kept");
    assert!((1..100).contains(&entries), "{entries} entries kept");
}
