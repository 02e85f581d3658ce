//! The first start, made once: twice in a row, after a restart, and from concurrent starts.

use admin::authz::Access;
use admin::{BootstrapOptions, BootstrapOutcome, Store};

use crate::common::TestDb;

async fn count(store: &Store, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(store.db().pool())
        .await
        .expect("count")
}

async fn assert_one_of_each(store: &Store) {
    for table in [
        "organisations",
        "bootstrap",
        "users",
        "workspaces",
        "api_keys",
    ] {
        assert_eq!(count(store, table).await, 1, "{table}");
    }
    let slug: String = sqlx::query_scalar("SELECT slug FROM workspaces")
        .fetch_one(store.db().pool())
        .await
        .unwrap();
    assert_eq!(slug, "default");
}

async fn bootstrap_runs_once(db: TestDb) {
    let store = Store::open(&db.url).await.unwrap();
    let first = store.bootstrap(&BootstrapOptions::default()).await.unwrap();
    let BootstrapOutcome::Created {
        organisation_id,
        generated_key: Some(key),
        ..
    } = &first
    else {
        panic!("{first:?}")
    };
    assert_eq!(key.len(), 43);
    let principal = store.authenticate(key).await.unwrap();
    assert_eq!(&principal.organisation_id, organisation_id);
    assert!(matches!(principal.access, Access::Organisation { .. }));

    let again = store.bootstrap(&BootstrapOptions::default()).await.unwrap();
    assert_eq!(
        again,
        BootstrapOutcome::Existing {
            organisation_id: organisation_id.clone()
        }
    );
    // A key supplied on a later start is not used: the organisation exists.
    let supplied = BootstrapOptions {
        admin_key: Some("a-later-key-0123456789".into()),
        ..BootstrapOptions::default()
    };
    assert!(matches!(
        store.bootstrap(&supplied).await.unwrap(),
        BootstrapOutcome::Existing { .. }
    ));
    assert!(store.authenticate("a-later-key-0123456789").await.is_err());
    store.close().await;

    // A restart: migrations are already applied, bootstrap finds the organisation.
    let store = Store::open(&db.url).await.unwrap();
    assert!(matches!(
        store.bootstrap(&BootstrapOptions::default()).await.unwrap(),
        BootstrapOutcome::Existing { .. }
    ));
    assert_one_of_each(&store).await;
    assert!(store.authenticate(key).await.is_ok());
    store.close().await;
}

async fn concurrent_starts_bootstrap_once(db: TestDb) {
    let starts = (0..4).map(|_| {
        let url = db.url.clone();
        tokio::spawn(async move {
            let store = Store::open(&url).await.expect("open");
            let outcome = store
                .bootstrap(&BootstrapOptions::default())
                .await
                .expect("bootstrap");
            store.close().await;
            outcome
        })
    });
    let outcomes: Vec<BootstrapOutcome> = futures_util::future::join_all(starts)
        .await
        .into_iter()
        .map(|r| r.expect("no panic"))
        .collect();
    let created = outcomes
        .iter()
        .filter(|o| matches!(o, BootstrapOutcome::Created { .. }))
        .count();
    assert_eq!(created, 1, "{outcomes:?}");
    let org = outcomes[0].organisation_id();
    assert!(outcomes.iter().all(|o| o.organisation_id() == org));
    let store = Store::open(&db.url).await.unwrap();
    assert_one_of_each(&store).await;
    store.close().await;
}

async fn a_supplied_key_is_checked_and_used(db: TestDb) {
    let store = Store::open(&db.url).await.unwrap();
    let short = BootstrapOptions {
        admin_key: Some("short".into()),
        ..BootstrapOptions::default()
    };
    let err = store.bootstrap(&short).await.unwrap_err();
    assert_eq!(err.code(), "AB01");
    assert!(err.message.contains("at least 16"), "{err}");
    assert_eq!(count(&store, "organisations").await, 0);
    let good = BootstrapOptions {
        admin_key: Some("a-supplied-key-0123456789".into()),
        ..BootstrapOptions::default()
    };
    let outcome = store.bootstrap(&good).await.unwrap();
    assert!(matches!(
        outcome,
        BootstrapOutcome::Created {
            generated_key: None,
            ..
        }
    ));
    assert!(store
        .authenticate("a-supplied-key-0123456789")
        .await
        .is_ok());
    store.close().await;
}

async fn an_edited_migration_is_refused(db: TestDb) {
    let store = Store::open(&db.url).await.unwrap();
    sqlx::query("UPDATE gw_schema_migrations SET checksum = 'x' WHERE version = 1")
        .execute(store.db().pool())
        .await
        .unwrap();
    store.close().await;
    let err = Store::open(&db.url).await.unwrap_err();
    assert!(err.message.contains("differs"), "{err}");
}

crate::on_both_databases!(
    bootstrap_runs_once,
    concurrent_starts_bootstrap_once,
    a_supplied_key_is_checked_and_used,
    an_edited_migration_is_refused,
);

/// `sqlite::memory:` (benchmarks, throwaway runs): one connection kept open, writes in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_database_works() {
    let store = Store::open("sqlite::memory:").await.unwrap();
    let key = "an-in-memory-key-0123456789";
    let outcome = store
        .bootstrap(&BootstrapOptions {
            admin_key: Some(key.into()),
            ..BootstrapOptions::default()
        })
        .await
        .unwrap();
    assert!(matches!(outcome, BootstrapOutcome::Created { .. }));
    let router = admin::router(store.clone());
    let calls = (0..8).map(|i| {
        let router = router.clone();
        tokio::spawn(async move {
            use tower::ServiceExt;
            let req = http::Request::post("/v1/admin/workspaces")
                .header("x-gw-api-key", key)
                .body(axum::body::Body::from(format!(r#"{{"name": "m{i}"}}"#)))
                .unwrap();
            router.oneshot(req).await.unwrap().status().as_u16()
        })
    });
    for status in futures_util::future::join_all(calls).await {
        assert_eq!(status.unwrap(), 200);
    }
    assert_eq!(count(&store, "workspaces").await, 9);
}
