//! JWTs instead of API keys: a token signed by a key of the configured JWKS is a caller of its
//! workspace with its own limits; refused tokens (401, or 403 without the gateway's scope) are
//! recorded in the audit log.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{expect_error, hello, Env, TempDir, ADMIN_KEY};

const RSA: &[u8] = include_bytes!("../../../plugins/src/auth/testdata/rsa_a.pem");
const OTHER_RSA: &[u8] = include_bytes!("../../../plugins/src/auth/testdata/rsa_b.pem");

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn sign(pem: &[u8], claims: &Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("key-a".into());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_pem(pem).unwrap()).unwrap()
}

fn jwks() -> String {
    let mut jwk =
        Jwk::from_encoding_key(&EncodingKey::from_rsa_pem(RSA).unwrap(), Algorithm::RS256).unwrap();
    jwk.common.key_id = Some("key-a".into());
    jwk.common.key_algorithm = Some(KeyAlgorithm::RS256);
    serde_json::to_string(&JwkSet { keys: vec![jwk] }).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_callers_with_their_own_limits_and_refusals_are_audited() {
    let dir = TempDir::new("jwks");
    let file = dir.0.join("jwks.json");
    std::fs::write(&file, jwks()).unwrap();
    let env = Env::start_with(&format!(
        "pipeline:
  - kind: auth
    jwt: {{jwks_file: \"{}\", issuer: \"https://idp.test/\", audience: gateway}}
  - kind: provider_select
  - kind: rate_limit
",
        file.display()
    ))
    .await;
    let ws = env.default_workspace().await;
    let claims = |extra: Value| {
        let mut c = json!({"sub": "ann", "iss": "https://idp.test/", "aud": "gateway", "exp": now() + 600,
                           "workspace_id": ws, "scope": "completions.write",
                           "rate_limits": [{"type": "requests", "unit": "rpm", "value": 1}]});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };

    // A valid token: its own limit of one request a minute holds.
    let token = sign(RSA, &claims(json!({})));
    assert_eq!(env.chat_as(&token, &hello("x"), &[]).await.status(), 200);
    expect_error(env.chat_as(&token, &hello("x"), &[]).await, 429, None).await;

    // Expired, signed by another key, for another audience: 401 with the reason; a valid token
    // without completions.write: 403.
    let mut refused = Vec::new();
    for (token, status, reason) in [
        (
            sign(RSA, &claims(json!({"sub": "bob", "exp": now() - 3600}))),
            401,
            "expired",
        ),
        (
            sign(OTHER_RSA, &claims(json!({"sub": "bob"}))),
            401,
            "signature",
        ),
        (
            sign(RSA, &claims(json!({"sub": "bob", "aud": "elsewhere"}))),
            401,
            "audience",
        ),
        (
            sign(RSA, &claims(json!({"sub": "bob", "scope": "logs.list"}))),
            403,
            "completions.write",
        ),
    ] {
        let body = expect_error(env.chat_as(&token, &hello("x"), &[]).await, status, None).await;
        let message = body["error"]["message"].as_str().unwrap().to_lowercase();
        assert!(message.contains(reason), "{reason}: {body}");
        refused.push(token);
    }
    assert_eq!(env.mock.request_count(), 1);

    // Each refusal is in the audit log (written in the background), without the token.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (status, logs) = env
            .admin_call(
                Method::GET,
                "/v1/audit-logs?start_time=2020-01-01T00:00:00Z&end_time=2100-01-01T00:00:00Z&action=auth.jwt_rejected",
                Some(ADMIN_KEY),
                None,
            )
            .await;
        assert_eq!(status, 200, "{logs}");
        if logs["total"] == 4 {
            let text = logs.to_string();
            for token in &refused {
                assert!(
                    !text.contains(token.as_str()),
                    "a refused token was recorded"
                );
            }
            let mut statuses: Vec<i64> = logs["records"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["response_status_code"].as_i64().unwrap())
                .collect();
            statuses.sort_unstable();
            assert_eq!(statuses, [401, 401, 401, 403], "{logs}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{logs}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The control plane takes the data plane's JWTs: a token reads and lists its own workspace's
/// resources with the `*.read` / `*.list` scopes it carries, and nothing more; refused tokens
/// are audited as on the data plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_lets_tokens_read_their_workspace() {
    let dir = TempDir::new("jwks");
    let file = dir.0.join("jwks.json");
    std::fs::write(&file, jwks()).unwrap();
    let env = Env::start_with(&format!(
        "pipeline:
  - kind: auth
    jwt: {{jwks_file: \"{}\", issuer: \"https://idp.test/\"}}
  - kind: provider_select
",
        file.display()
    ))
    .await;
    let ws = env.default_workspace().await;
    let (status, other) = env
        .admin_call(
            Method::POST,
            "/v1/admin/workspaces",
            Some(ADMIN_KEY),
            Some(json!({"name": "Other"})),
        )
        .await;
    assert_eq!(status, 200, "{other}");
    let other = other["id"].as_str().unwrap().to_owned();
    for (name, workspace) in [("mine", &ws), ("theirs", &other)] {
        let (status, body) = env
            .admin_call(
                Method::POST,
                "/v1/configs",
                Some(ADMIN_KEY),
                Some(json!({"name": name, "config": {"provider": "openai"}, "workspace_id": workspace})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let token = |workspace: Option<&str>, scope: &str, exp: i64| {
        let mut claims = json!({"sub": "ann", "iss": "https://idp.test/", "exp": now() + exp,
                                "scope": scope});
        if let Some(ws) = workspace {
            claims["workspace_id"] = json!(ws);
        }
        sign(RSA, &claims)
    };
    let reader = token(Some(&ws), "configs.list configs.read configs.create", 600);

    // Its own workspace's configs, in x-gw-api-key or Authorization: Bearer.
    let (status, body) = env
        .admin_call(Method::GET, "/v1/configs", Some(&reader), None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["total"], 1, "{body}");
    assert_eq!(body["data"][0]["name"], "mine");
    let resp = env
        .bare
        .get(env.url("/v1/configs"))
        .bearer_auth(&reader)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Not another workspace's, and no write even with a create scope; no scope, no read.
    let (status, body) = env
        .admin_call(
            Method::GET,
            &format!("/v1/configs?workspace_id={other}"),
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = env
        .admin_call(
            Method::POST,
            "/v1/configs",
            Some(&reader),
            Some(json!({"name": "x", "config": {"provider": "openai"}})),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = env
        .admin_call(Method::GET, "/v1/guardrails", Some(&reader), None)
        .await;
    assert_eq!(status, 403);
    // A token without a workspace reaches nothing; an expired one is a 401, audited.
    let (status, body) = env
        .admin_call(
            Method::GET,
            "/v1/configs",
            Some(&token(None, "configs.list", 600)),
            None,
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let expired = token(Some(&ws), "configs.list", -3600);
    let (status, body) = env
        .admin_call(Method::GET, "/v1/configs", Some(&expired), None)
        .await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["data"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{body}"
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (_, logs) = env
            .admin_call(
                Method::GET,
                "/v1/audit-logs?start_time=2020-01-01T00:00:00Z&end_time=2100-01-01T00:00:00Z&action=auth.jwt_rejected",
                Some(ADMIN_KEY),
                None,
            )
            .await;
        if logs["total"] == 1 {
            let record = &logs["records"][0];
            assert_eq!(record["uri"], "/v1/configs", "{logs}");
            assert!(!logs.to_string().contains(expired.as_str()));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{logs}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // API keys work as before.
    let (status, _) = env
        .admin_call(Method::GET, "/v1/configs", Some(ADMIN_KEY), None)
        .await;
    assert_eq!(status, 200);
}
