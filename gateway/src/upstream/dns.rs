//! Asynchronous, cached host name resolution.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use plugin_sdk::{ErrorKind, GatewayError};

/// How long a resolved address is reused.
const TTL: Duration = Duration::from_secs(60);
/// How long a failed lookup is answered from memory: names a request made up (each a lookup
/// of its own) cannot keep the resolver busy.
const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// The most names remembered, each way: requests naming ever new hosts cannot grow it.
const MAX_NAMES: u64 = 10_000;
/// Longest wait for a lookup.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where names are looked up: the system resolver, or in tests a table that maps test names to
/// the addresses a case needs (private, link-local...) without any traffic.
pub trait Lookup: Send + Sync {
    fn lookup<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system resolver, on a blocking-pool thread (tokio's `lookup_host`).
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// Resolves host names, caching answers for a minute and failures for five seconds, at most
/// [`MAX_NAMES`] of each. IP literals need no lookup.
pub struct Resolver {
    cache: moka::sync::Cache<(String, u16), SocketAddr>,
    failed: moka::sync::Cache<(String, u16), String>,
    lookup: Arc<dyn Lookup>,
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver::with_lookup(Arc::new(SystemLookup))
    }
}

impl Resolver {
    pub fn with_lookup(lookup: Arc<dyn Lookup>) -> Self {
        Resolver {
            cache: bounded(TTL),
            failed: bounded(NEGATIVE_TTL),
            lookup,
        }
    }

    /// The address a connection to `host` uses. The answer is cached: the address checked by
    /// the egress policy is the one connected to.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<SocketAddr, GatewayError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        let key = (host.to_owned(), port);
        let unreachable = |why: String| {
            GatewayError::new(
                ErrorKind::UpstreamUnreachable,
                format!("cannot resolve upstream host {host:?}: {why}"),
            )
        };
        if let Some(addr) = self.cache.get(&key) {
            return Ok(addr);
        }
        if let Some(why) = self.failed.get(&key) {
            return Err(unreachable(why));
        }
        let found = match tokio::time::timeout(LOOKUP_TIMEOUT, self.lookup.lookup(host, port)).await
        {
            Err(_) => Err("the lookup timed out".to_owned()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(addrs)) => addrs
                .into_iter()
                .next()
                .ok_or_else(|| "no addresses".to_owned()),
        };
        match found {
            Ok(addr) => {
                self.cache.insert(key, addr);
                Ok(addr)
            }
            Err(why) => {
                self.failed.insert(key, why.clone());
                Err(unreachable(why))
            }
        }
    }
}

fn bounded<V: Clone + Send + Sync + 'static>(ttl: Duration) -> moka::sync::Cache<(String, u16), V> {
    moka::sync::Cache::builder()
        .max_capacity(MAX_NAMES)
        .time_to_live(ttl)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn literals_and_localhost_resolve_and_garbage_is_a_502() {
        let r = Resolver::default();
        assert_eq!(
            r.resolve("127.0.0.1", 80).await.unwrap(),
            "127.0.0.1:80".parse().unwrap()
        );
        assert!(r.resolve("localhost", 81).await.unwrap().ip().is_loopback());
        let err = r.resolve("no-such-host.invalid", 80).await.unwrap_err();
        assert_eq!(err.status().as_u16(), 502);
    }

    /// Counts lookups; every name fails but `good`.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl Lookup for Counting {
        fn lookup<'a>(
            &'a self,
            host: &'a str,
            port: u16,
        ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                match host {
                    "good" => Ok(vec![SocketAddr::from(([203, 0, 113, 7], port))]),
                    _ => Err(std::io::Error::other("NXDOMAIN")),
                }
            })
        }
    }

    #[tokio::test]
    async fn answers_and_failures_are_remembered_within_bounds() {
        let lookups = Arc::new(Counting(Default::default()));
        let r = Resolver::with_lookup(lookups.clone());
        let count = || lookups.0.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..3 {
            r.resolve("good", 443).await.unwrap();
            let err = r.resolve("made-up", 443).await.unwrap_err();
            assert!(err.message.contains("NXDOMAIN"), "{}", err.message);
        }
        assert_eq!(count(), 2, "one lookup per name, failures included");
        // Ever new names: the caches hold at most MAX_NAMES each.
        for i in 0..(MAX_NAMES + 500) {
            let _ = r.resolve(&format!("made-up-{i}"), 443).await;
        }
        r.failed.run_pending_tasks();
        assert!(r.failed.entry_count() <= MAX_NAMES);
    }
}
