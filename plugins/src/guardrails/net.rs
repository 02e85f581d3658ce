//! The HTTP client of the checks that call the network (`default.webhook`,
//! `default.validUrls`), held to the gateway's egress policy: the URLs they reach come from
//! requests (a validUrls check reads them from the text; a request's own hooks name a webhook),
//! so an internal address is reached only for a host the operator trusts. Names are checked on
//! the addresses the client then connects to (its resolver drops internal ones); IP literals,
//! which need no lookup, before the request is sent. Redirects are not followed.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use plugin_sdk::egress::{self, EgressPolicy};

/// The client and the policy it keeps to.
#[derive(Clone)]
pub struct Net {
    pub http: reqwest::Client,
    egress: Arc<EgressPolicy>,
}

impl Net {
    pub fn new(egress: EgressPolicy) -> Result<Net, String> {
        let egress = Arc::new(egress);
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            // A proxy from the environment would resolve names itself, past the policy.
            .no_proxy()
            .dns_resolver(Arc::new(EgressResolver(egress.clone())))
            .build()
            .map_err(|e| format!("cannot build the HTTP client of network checks: {e}"))?;
        Ok(Net { http, egress })
    }

    /// Refuses, before anything is sent, a URL whose host is an internal IP literal, or a host
    /// trusted on other ports only. The reason names the host, never an address.
    pub fn allows(&self, url: &reqwest::Url) -> Result<(), String> {
        let Some(host) = url.host_str() else {
            return Err("the URL has no host".into());
        };
        let port = url.port_or_known_default().unwrap_or(80);
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let refused = || {
            Err(format!(
                "the host {bare:?} is refused by the egress policy: it is internal and not \
                 trusted (egress.trusted_hosts, {})",
                egress::TRUSTED_HOSTS_VAR
            ))
        };
        match bare.parse::<IpAddr>() {
            Ok(ip) => match self.egress.check(bare, port, ip) {
                Ok(()) => Ok(()),
                Err(_) => refused(),
            },
            // The resolver sees no port: a name trusted only on other ports is refused here.
            Err(_) if self.egress.trusts_name(bare) && !self.egress.is_trusted(bare, port) => {
                refused()
            }
            Err(_) => Ok(()),
        }
    }
}

/// Resolves with the system resolver and keeps only the addresses the policy allows.
struct EgressResolver(Arc<EgressPolicy>);

impl Resolve for EgressResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let trusted = policy.trusts_name(&host);
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| trusted || !egress::is_internal(a.ip()))
                .collect();
            if allowed.is_empty() {
                let refused: Box<dyn std::error::Error + Send + Sync> = format!(
                    "the host {host:?} is refused by the egress policy: it resolves to an \
                     internal address and is not trusted (egress.trusted_hosts, {})",
                    egress::TRUSTED_HOSTS_VAR
                )
                .into();
                return Err(refused);
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn internal_hosts_are_refused_before_anything_is_sent() {
        let net = Net::new(EgressPolicy::default()).unwrap();
        for url in [
            "http://127.0.0.1:1/x",
            "http://[::1]:1/x",
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.1/",
            "http://[::ffff:127.0.0.1]:1/",
        ] {
            let parsed = reqwest::Url::parse(url).unwrap();
            let err = net.allows(&parsed).unwrap_err();
            assert!(err.contains("egress"), "{url}: {err}");
        }
        // A name that resolves to loopback is refused by the client's resolver: no connection.
        let err = net
            .http
            .get("http://localhost:1/x")
            .send()
            .await
            .unwrap_err();
        assert!(
            format!("{err:?}").contains("refused by the egress policy"),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn trusted_hosts_are_reached() {
        let policy = EgressPolicy::new(egress::parse_list("localhost:9, 127.0.0.1").unwrap());
        let net = Net::new(policy).unwrap();
        assert!(net
            .allows(&reqwest::Url::parse("http://127.0.0.1:1/").unwrap())
            .is_ok());
        assert!(net
            .allows(&reqwest::Url::parse("http://localhost:9/").unwrap())
            .is_ok());
        // Trusted on port 9 only.
        assert!(net
            .allows(&reqwest::Url::parse("http://localhost:10/").unwrap())
            .is_err());
    }
}
