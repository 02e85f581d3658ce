//! Helpers for tests that start servers of their own.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port [`free_local_port`] hands out.
const LOWEST_PORT: u32 = 10_000;

/// A port on 127.0.0.1 that nothing listens on now, for a test server that binds it moments later.
///
/// Ports come from below the kernel's ephemeral range, one after another within this process.
/// A port from `bind(0)` can be handed to another server of the same test run (a mock provider, a
/// client connection's source port) between the check and the bind, and a test would then talk to
/// the wrong server; the kernel never picks ports from below its ephemeral range, and within this
/// process no port is handed out twice. Each process starts at an offset drawn from its id, so
/// test binaries running side by side rarely meet.
pub fn free_local_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let below = ephemeral_range_start();
    if below <= LOWEST_PORT + 1_000 {
        return kernel_picked_port();
    }
    let span = below - LOWEST_PORT;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOWEST_PORT + (start + n) % span;
        let port = u16::try_from(port).expect("ports below the ephemeral range fit in u16");
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
    kernel_picked_port()
}

/// `127.0.0.1:{free_local_port()}`.
pub fn free_local_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, free_local_port()))
}

/// The first port of Linux's ephemeral range (`ip_local_port_range`); 32768 elsewhere.
fn ephemeral_range_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

fn kernel_picked_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_bindable_outside_the_ephemeral_range_and_never_repeat() {
        let ports: Vec<u16> = (0..50).map(|_| free_local_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        let below = ephemeral_range_start();
        for p in ports {
            assert!(u32::from(p) >= LOWEST_PORT && u32::from(p) < below, "{p}");
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).expect("the port is free");
        }
    }
}
