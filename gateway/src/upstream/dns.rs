//! Asynchronous, cached host name resolution.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use plugin_sdk::{ErrorKind, GatewayError};

/// How long a resolved address is reused.
const TTL: Duration = Duration::from_secs(60);
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

/// Resolves host names, caching answers for a minute. IP literals need no lookup.
pub struct Resolver {
    cache: Mutex<HashMap<(String, u16), (SocketAddr, Instant)>>,
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
            cache: Mutex::new(HashMap::new()),
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
        if let Some((addr, at)) = self.cache.lock().ok().and_then(|c| c.get(&key).copied()) {
            if at.elapsed() < TTL {
                return Ok(addr);
            }
        }
        let unreachable = |why: String| {
            GatewayError::new(
                ErrorKind::UpstreamUnreachable,
                format!("cannot resolve upstream host {host:?}: {why}"),
            )
        };
        let addr = tokio::time::timeout(LOOKUP_TIMEOUT, self.lookup.lookup(host, port))
            .await
            .map_err(|_| unreachable("the lookup timed out".into()))?
            .map_err(|e| unreachable(e.to_string()))?
            .into_iter()
            .next()
            .ok_or_else(|| unreachable("no addresses".into()))?;
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(key, (addr, Instant::now()));
        }
        Ok(addr)
    }
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
}
