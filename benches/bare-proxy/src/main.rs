//! A bare Pingora passthrough proxy: the baseline the gateway is measured against.
//!
//! Same Pingora version and thread count as the gateway, no plugins, no body handling: every
//! request goes to one fixed upstream with its path untouched.
//!
//! `bare-proxy --listen 127.0.0.1:8788 --upstream 127.0.0.1:9000 [--threads N]`

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

// mimalloc: the request path allocates many small, short-lived objects, which glibc's malloc
// serves markedly slower. The bare baseline uses the same allocator, so comparisons stay fair.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Bare {
    upstream: SocketAddr,
    host: String,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.upstream, false, String::new());
        // The same per-peer timeouts the gateway sets, so both do the same work.
        peer.options.connection_timeout = Some(Duration::from_secs(10));
        peer.options.read_timeout = Some(Duration::from_secs(600));
        peer.options.write_timeout = Some(Duration::from_secs(60));
        peer.options.idle_timeout = Some(Duration::from_secs(90));
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        request: &mut RequestHeader,
        _ctx: &mut (),
    ) -> Result<()> {
        request.insert_header("host", self.host.as_str())?;
        Ok(())
    }
}

struct Args {
    listen: String,
    upstream: SocketAddr,
    threads: usize,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut listen = "127.0.0.1:8788".to_owned();
    let mut upstream = None;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => listen = value()?,
            "--upstream" => {
                let v = value()?;
                upstream = Some(v.parse().map_err(|e| format!("--upstream {v}: {e}"))?);
            }
            "--threads" => {
                let v = value()?;
                threads = v.parse().map_err(|e| format!("--threads {v}: {e}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        listen,
        upstream: upstream.ok_or("--upstream HOST:PORT is required")?,
        threads,
    })
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "bare-proxy: {e}\nusage: bare-proxy --listen ADDR --upstream ADDR [--threads N]"
            );
            std::process::exit(2);
        }
    };
    let conf = ServerConf {
        threads: args.threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = http_proxy_service(
        &server.configuration,
        Bare {
            upstream: args.upstream,
            host: args.upstream.to_string(),
        },
    );
    service.add_tcp(&args.listen);
    server.add_service(service);
    println!("listening on {}", args.listen);
    server.run_forever();
}
