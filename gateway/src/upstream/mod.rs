//! Talking to providers: endpoints, name resolution, and HTTP exchanges over Pingora's
//! transport connector (pooled connections, TLS through rustls) and its HTTP/1 client session.
//!
//! A request's head and body leave in one write (`writev`), where Pingora's client session
//! flushes the head on its own and sends the body after it: one system call and one segment
//! fewer per request, and the provider reads the request whole in one go.
//!
//! Every peer carries connect, read, write and idle timeouts (Pingora sets none by default).
//! Host names are resolved here, asynchronously and cached, because Pingora's `HttpPeer::new`
//! resolves with a blocking lookup and panics when it fails: a user-supplied custom host must
//! never take the process down.

mod dns;
mod endpoint;

use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use pingora::connectors::TransportConnector;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::v1::client::{http_req_header_to_wire, HttpSession};
use pingora::protocols::Stream;
use pingora::upstreams::peer::{HttpPeer, Peer};
use tokio::io::AsyncWriteExt;

use plugin_sdk::egress::EgressPolicy;
use plugin_sdk::{ErrorKind, GatewayError};

pub use dns::{Lookup, Resolver, SystemLookup};
pub use endpoint::Endpoint;

/// Timeouts applied to every upstream connection.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamTimeouts {
    /// TCP connect (and TLS handshake). Default: 10 s.
    pub connect: Duration,
    /// Longest wait for any single read. Default: 600 s, since a model may think for minutes.
    pub read: Duration,
    /// Longest wait for any single write. Default: 60 s.
    pub write: Duration,
    /// How long an idle pooled connection is kept. Default: 90 s.
    pub idle: Duration,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        UpstreamTimeouts {
            connect: Duration::from_secs(10),
            read: Duration::from_secs(600),
            write: Duration::from_secs(60),
            idle: Duration::from_secs(90),
        }
    }
}

/// The gateway's HTTP client for providers.
pub struct Upstream {
    connector: TransportConnector,
    resolver: Resolver,
    egress: EgressPolicy,
    timeouts: UpstreamTimeouts,
}

/// An exchange whose response header has arrived; the body is read from it.
pub struct Exchange {
    // Both boxed, like every large piece of the request path: futures that hold an exchange
    // are moved and boxed per request, and their size is what gets copied.
    session: Box<HttpSession>,
    peer: Box<HttpPeer>,
    /// Time from sending the request to the response header.
    pub latency: Duration,
}

impl Upstream {
    pub fn new(timeouts: UpstreamTimeouts, egress: EgressPolicy) -> Self {
        Upstream::with_lookup(timeouts, egress, Arc::new(SystemLookup))
    }

    /// Like [`Upstream::new`], with names looked up by `lookup` (tests map names to the
    /// addresses a case needs).
    pub fn with_lookup(
        timeouts: UpstreamTimeouts,
        egress: EgressPolicy,
        lookup: Arc<dyn Lookup>,
    ) -> Self {
        Upstream {
            connector: TransportConnector::new(None),
            resolver: Resolver::with_lookup(lookup),
            egress,
            timeouts,
        }
    }

    /// A peer for the endpoint, its host resolved without blocking and its address checked by
    /// the egress policy: every connection, pooled or new, is made to a peer from here, so a
    /// refused address is never connected to. Boxed: a peer is several hundred bytes, and it
    /// travels by value through the exchange and its result.
    pub async fn peer(&self, endpoint: &Endpoint) -> Result<Box<HttpPeer>, GatewayError> {
        let addr = self.resolver.resolve(&endpoint.host, endpoint.port).await?;
        self.egress
            .check(&endpoint.host, endpoint.port, addr.ip())?;
        let mut peer = Box::new(HttpPeer::new(addr, endpoint.tls, endpoint.host.clone()));
        let o = &mut peer.options;
        o.connection_timeout = Some(self.timeouts.connect);
        o.total_connection_timeout = Some(self.timeouts.connect);
        o.read_timeout = Some(self.timeouts.read);
        o.write_timeout = Some(self.timeouts.write);
        o.idle_timeout = Some(self.timeouts.idle);
        Ok(peer)
    }

    /// Sends a request and waits for the response header. A pooled connection that the server
    /// closed while idle is retried once on a fresh connection, with the header built anew by
    /// `header` (built per attempt rather than copied up front, since retries are rare).
    pub async fn send(
        &self,
        peer: Box<HttpPeer>,
        header: impl Fn() -> Result<RequestHeader, GatewayError>,
        body: Bytes,
    ) -> Result<Exchange, GatewayError> {
        let mut stale_retry_left = true;
        loop {
            let request = header()?;
            let head = http_req_header_to_wire(&request).ok_or_else(|| {
                GatewayError::internal("the upstream request line holds forbidden bytes")
            })?;
            let (stream, reused) = self.connect(&peer, stale_retry_left).await?;
            let sent_at = Instant::now();
            match Box::pin(self.exchange(stream, &peer, &head, &body)).await {
                Ok(session) => {
                    return Ok(Exchange {
                        session,
                        peer,
                        latency: sent_at.elapsed(),
                    })
                }
                Err(e) if reused && stale_retry_left => {
                    tracing::debug!(error = %e, "pooled upstream connection failed; retrying on a new one");
                    stale_retry_left = false;
                }
                Err(e) => return Err(upstream_io_error(&peer, &e)),
            }
        }
    }

    /// A pooled connection when one is idle (and `pooled_ok`), else a new one. Connecting (TCP,
    /// TLS) is a large future, boxed so that the common pooled path does not carry its size.
    async fn connect(
        &self,
        peer: &HttpPeer,
        pooled_ok: bool,
    ) -> Result<(Stream, bool), GatewayError> {
        if pooled_ok {
            if let Some(stream) = self.connector.reused_stream(peer).await {
                return Ok((stream, true));
            }
        }
        let stream = Box::pin(self.connector.new_stream(peer))
            .await
            .map_err(|e| {
                // The host only: the address it resolved to is the operator's business.
                GatewayError::new(
                    ErrorKind::UpstreamUnreachable,
                    format!("cannot connect to {}: {}", peer.sni, connect_failure(&e)),
                )
            })?;
        Ok((stream, false))
    }

    /// Writes the request (head and body together) and reads the response header. The client
    /// session is made after the write, so it never saw the request: its only use of one is for
    /// `HEAD` (an answer without a body) and `Connection: close`, and the gateway's LLM routes
    /// send neither.
    async fn exchange(
        &self,
        mut stream: Stream,
        peer: &HttpPeer,
        head: &[u8],
        body: &[u8],
    ) -> pingora::Result<Box<HttpSession>> {
        write_request(&mut stream, head, body, self.timeouts.write).await?;
        let mut session = Box::new(HttpSession::new_with_options(stream, peer));
        session.read_timeout = Some(self.timeouts.read);
        session.read_response().await?;
        Ok(session)
    }

    /// Returns a finished exchange's connection to the pool.
    ///
    /// Returns a boxed future: the release holds the whole client session, and an `async fn`
    /// here would make every caller's future that much larger (and copied).
    pub fn release(&self, exchange: Exchange) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Exchange {
                mut session, peer, ..
            } = exchange;
            session.respect_keepalive();
            if let Some(stream) = session.reuse().await {
                self.connector
                    .release_stream(stream, peer.reuse_hash(), Some(self.timeouts.idle));
            }
        })
    }
}

/// Writes `head` and then `body` with as few writes as the stream allows: one `writev` on a
/// TCP connection, however large the body (nothing is copied to join them). `timeout` bounds
/// each write, as Pingora's own client does.
async fn write_request(
    stream: &mut Stream,
    head: &[u8],
    body: &[u8],
    timeout: Duration,
) -> pingora::Result<()> {
    use pingora::ErrorType::{WriteError, WriteTimedout};
    let timed_out =
        |_| pingora::Error::explain(WriteTimedout, format!("writing the request ({timeout:?})"));
    let failed = |e| pingora::Error::because(WriteError, "writing the request", e);
    let (mut head, mut body) = (head, body);
    while !head.is_empty() || !body.is_empty() {
        let slices = [IoSlice::new(head), IoSlice::new(body)];
        let n = pingora::time::timeout(timeout, stream.write_vectored(&slices))
            .await
            .map_err(timed_out)?
            .map_err(failed)?;
        if n == 0 {
            return Err(failed(std::io::ErrorKind::WriteZero.into()));
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        body = &body[n - from_head..];
    }
    pingora::time::timeout(timeout, stream.flush())
        .await
        .map_err(timed_out)?
        .map_err(failed)
}

/// Pingora's text of an upstream failure, except for a failed connection, whose text names the
/// address it tried: that is told by its kind alone (the address is the operator's business).
pub(crate) fn describe(e: &pingora::Error) -> String {
    use pingora::ErrorType::*;
    match e.etype() {
        ConnectTimedout | ConnectRefused | ConnectNoRoute | ConnectError | TLSHandshakeFailure
        | TLSHandshakeTimedout => connect_failure(e),
        // Reads and writes of an open connection: their context says what was being done.
        ReadError | ReadTimedout | WriteError | WriteTimedout | ConnectionClosed
        | InvalidHTTPHeader | H1Error | InvalidH2 | H2Error => e.to_string(),
        // Anything else (a failed bind or socket setup, say) may name the address it tried:
        // its kind and its underlying cause only.
        _ => match root_io_cause(e) {
            Some(io) => format!("{}: {io}", e.etype().as_str()),
            None => e.etype().as_str().to_owned(),
        },
    }
}

/// The operating system's error under a Pingora error, if there is one (its text names no
/// address).
fn root_io_cause(e: &pingora::Error) -> Option<&std::io::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = e.cause.as_deref().map(|c| c as _);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        cause = match c.downcast_ref::<pingora::Error>() {
            Some(p) => p.cause.as_deref().map(|c| c as _),
            None => c.source(),
        };
    }
    None
}

/// A short reason for a failed connection, without Pingora's internal context.
fn connect_failure(e: &pingora::Error) -> String {
    match e.etype() {
        pingora::ErrorType::ConnectRefused => "connection refused".into(),
        pingora::ErrorType::ConnectTimedout => "connection timed out".into(),
        pingora::ErrorType::ConnectNoRoute => "no route to host".into(),
        pingora::ErrorType::TLSHandshakeFailure => "TLS handshake failed".into(),
        pingora::ErrorType::TLSHandshakeTimedout => "TLS handshake timed out".into(),
        _ => e.etype().as_str().to_owned(),
    }
}

fn upstream_io_error(peer: &HttpPeer, e: &pingora::Error) -> GatewayError {
    let kind = match e.etype() {
        pingora::ErrorType::ReadTimedout | pingora::ErrorType::WriteTimedout => {
            ErrorKind::UpstreamTimeout
        }
        pingora::ErrorType::ConnectTimedout
        | pingora::ErrorType::ConnectRefused
        | pingora::ErrorType::ConnectNoRoute
        | pingora::ErrorType::ConnectError
        | pingora::ErrorType::TLSHandshakeFailure => ErrorKind::UpstreamUnreachable,
        _ => ErrorKind::UpstreamBadResponse,
    };
    GatewayError::new(
        kind,
        format!("upstream {} failed: {}", peer.sni, describe(e)),
    )
}

impl Exchange {
    pub fn header(&self) -> &ResponseHeader {
        self.session
            .resp_header()
            .expect("an Exchange exists only after its response header was read")
    }

    pub fn status(&self) -> u16 {
        self.header().status.as_u16()
    }

    /// The next piece of the body; `None` at its end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, GatewayError> {
        self.session
            .read_body_bytes()
            .await
            .map_err(|e| upstream_io_error(&self.peer, &e))
    }

    /// The whole body, refusing bodies larger than `limit` bytes. A body that arrives in one
    /// piece (most answers) is returned as it came; only a body in several pieces is copied
    /// into one buffer.
    pub async fn read_to_end(&mut self, limit: usize) -> Result<Bytes, GatewayError> {
        let too_large = || {
            GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!("the provider's answer is larger than {limit} bytes"),
            )
        };
        let Some(first) = self.next_chunk().await? else {
            return Ok(Bytes::new());
        };
        if first.len() > limit {
            return Err(too_large());
        }
        let Some(mut chunk) = self.next_chunk().await? else {
            return Ok(first);
        };
        let mut body = BytesMut::from(&first[..]);
        loop {
            if body.len() + chunk.len() > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
            match self.next_chunk().await? {
                Some(next) => chunk = next,
                None => return Ok(body.freeze()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::Mutex;

    use super::*;
    use plugin_sdk::egress;

    /// Names mapped to the addresses a case needs; nothing goes on the network. Each lookup
    /// takes the next answer of its name, so a name can change its address (rebinding).
    struct Table(Mutex<HashMap<String, Vec<&'static str>>>);

    impl Table {
        fn new(entries: &[(&str, &[&'static str])]) -> Arc<Table> {
            Arc::new(Table(Mutex::new(
                entries
                    .iter()
                    .map(|(name, ips)| ((*name).to_owned(), ips.to_vec()))
                    .collect(),
            )))
        }
    }

    impl Lookup for Table {
        fn lookup<'a>(
            &'a self,
            host: &'a str,
            port: u16,
        ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
            let next = self
                .0
                .lock()
                .unwrap()
                .get_mut(host)
                .filter(|answers| !answers.is_empty())
                .map(|answers| answers.remove(0));
            Box::pin(async move {
                let ip = next.ok_or_else(|| std::io::Error::other("unknown test name"))?;
                Ok(vec![SocketAddr::new(ip.parse().unwrap(), port)])
            })
        }
    }

    fn upstream(trusted: &str, table: Arc<Table>) -> Upstream {
        let policy = EgressPolicy::new(egress::parse_list(trusted).unwrap());
        let timeouts = UpstreamTimeouts {
            // Long enough that a connection, were one attempted, would show as a hang.
            ..UpstreamTimeouts::default()
        };
        Upstream::with_lookup(timeouts, policy, table)
    }

    /// `peer` is the step before any connection: a refusal there means nothing was connected.
    #[tokio::test]
    async fn internal_addresses_are_refused_before_any_connection() {
        let table = Table::new(&[
            ("metadata.test", &["169.254.169.254"]),
            ("intranet.test", &["10.1.2.3"]),
            ("cgnat.test", &["100.64.1.1"]),
            ("mapped.test", &["::ffff:192.168.0.1"]),
            ("ula.test", &["fd00::1"]),
            ("public.test", &["93.184.216.34"]),
        ]);
        let up = upstream("", table);
        for name in [
            "metadata.test",
            "intranet.test",
            "cgnat.test",
            "mapped.test",
            "ula.test",
        ] {
            let ep = Endpoint::parse(&format!("http://{name}/v1")).unwrap();
            let err = up.peer(&ep).await.unwrap_err();
            assert_eq!(err.status().as_u16(), 403, "{name}: {}", err.message);
            assert!(err.message.contains(name), "{}", err.message);
        }
        for literal in [
            "http://10.0.0.1/",
            "http://[fe80::1]/",
            "http://0.0.0.0:80/",
        ] {
            let ep = Endpoint::parse(literal).unwrap();
            assert_eq!(up.peer(&ep).await.unwrap_err().status().as_u16(), 403);
        }
        let ep = Endpoint::parse("https://public.test/v1").unwrap();
        let peer = up.peer(&ep).await.unwrap();
        assert_eq!(peer._address.to_string(), "93.184.216.34:443");
    }

    #[tokio::test]
    async fn the_address_checked_is_the_one_connected_to() {
        // A name that answers a public address, then (once the cache expires) an internal one:
        // each answer is checked as it is used, so the second never gets a peer.
        let table = Table::new(&[("rebind.test", &["93.184.216.34", "127.0.0.1"])]);
        let up = upstream("", table.clone());
        let ep = Endpoint::parse("http://rebind.test/").unwrap();
        let peer = up.peer(&ep).await.unwrap();
        assert_eq!(peer._address.to_string(), "93.184.216.34:80");
        let fresh = upstream("", table);
        let err = fresh.peer(&ep).await.unwrap_err();
        assert_eq!(err.status().as_u16(), 403);
    }

    #[tokio::test]
    async fn trusted_hosts_reach_internal_addresses() {
        let table = Table::new(&[("llm.internal", &["10.0.0.5", "10.0.0.5"])]);
        let up = upstream("llm.internal:8000", table);
        let ok = Endpoint::parse("http://llm.internal:8000/v1").unwrap();
        assert_eq!(
            up.peer(&ok).await.unwrap()._address.to_string(),
            "10.0.0.5:8000"
        );
        let other_port = Endpoint::parse("http://llm.internal:22/").unwrap();
        assert_eq!(
            up.peer(&other_port).await.unwrap_err().status().as_u16(),
            403
        );
    }
}
