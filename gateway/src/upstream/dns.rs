//! Asynchronous, cached host name resolution.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use plugin_sdk::{ErrorKind, GatewayError};

/// How long a resolved address is reused.
const TTL: Duration = Duration::from_secs(60);
/// Longest wait for a lookup.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Resolves host names with the system resolver on a blocking-pool thread (tokio's
/// `lookup_host`), caching answers for a minute. IP literals need no lookup.
#[derive(Default)]
pub struct Resolver {
    cache: Mutex<HashMap<(String, u16), (SocketAddr, Instant)>>,
}

impl Resolver {
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
        let lookup = tokio::net::lookup_host((host, port));
        let addr = tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
            .await
            .map_err(|_| unreachable("the lookup timed out".into()))?
            .map_err(|e| unreachable(e.to_string()))?
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
