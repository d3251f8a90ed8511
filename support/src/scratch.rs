//! Free loopback ports and scratch directories that remove themselves.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A port free right now on 127.0.0.1. Another process can still take it before the caller
/// binds it; the caller's bind or readiness wait then fails and says so.
///
/// # Panics
/// If no port can be bound on 127.0.0.1 (no loopback interface).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0 to find a free port")
}

/// Ports that [`free_listen_port`] draws from: this many below the kernel's ephemeral range.
const LISTEN_PORTS: u16 = 8_192;

/// A port free right now on 127.0.0.1, below the kernel's ephemeral port range, for a server
/// that binds it seconds later (a Python engine starting up). A [`free_port`] port is in the
/// ephemeral range, so until the server binds it an outgoing connection's source port may
/// take it (a real vLLM's NIXL side channel once failed with "Address already in use" that
/// way); a port below the range is only ever taken by an explicit bind. Drawn from a random
/// place in the [`LISTEN_PORTS`] below the range, so that parallel callers rarely meet.
///
/// # Panics
/// If no port can be bound on 127.0.0.1 (no loopback interface).
pub fn free_listen_port() -> u16 {
    free_listen_ports(1)[0]
}

/// `count` distinct ports as [`free_listen_port`] picks one: each is held while the next is
/// picked, so none is handed out twice.
///
/// # Panics
/// If no port can be bound on 127.0.0.1 (no loopback interface).
pub fn free_listen_ports(count: usize) -> Vec<u16> {
    let mut held = Vec::with_capacity(count);
    if let Some(low) = ephemeral_low()
        .checked_sub(LISTEN_PORTS)
        .filter(|&l| l >= 1_024)
    {
        let start = u16::from_str_radix(&random_token()[..4], 16).unwrap_or(0) % LISTEN_PORTS;
        held.extend(
            (0..LISTEN_PORTS)
                .map(|i| low + (start + i) % LISTEN_PORTS)
                .filter_map(|port| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok())
                .take(count),
        );
    }
    while held.len() < count {
        held.push(
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .expect("bind 127.0.0.1:0 to find a free port"),
        );
    }
    held.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768)
}

/// A random 128-bit token as 32 hex digits (NATS tokens, registration secrets of a local
/// stack). Drawn from the OS-seeded keys of std's `RandomState`, so it needs no RNG crate;
/// good for one run's credentials, not for long-lived keys.
pub fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::with_capacity(32);
    for part in 0..2u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(part);
        h.write_u32(std::process::id());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// A new directory under the system temp directory, removed with its contents on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<temp>/switchyard-<tag>-<pid>-<n>`, with `n` chosen so the directory is new
    /// (`create_dir` fails on an existing one, so two callers never share it).
    ///
    /// # Errors
    /// The I/O error if no new directory can be created.
    pub fn new(tag: &str) -> std::io::Result<TempDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let base = std::env::temp_dir();
        let mut last = None;
        for _ in 0..1_000 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("switchyard-{tag}-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no free scratch directory name")))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_tokens_are_32_hex_digits_and_differ() {
        let (a, b) = (super::random_token(), super::random_token());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    use super::*;

    #[test]
    fn listen_ports_are_free_and_below_the_ephemeral_range() {
        let low = ephemeral_low();
        for _ in 0..8 {
            let port = free_listen_port();
            if low >= 1_024 + LISTEN_PORTS {
                assert!((low - LISTEN_PORTS..low).contains(&port), "{port} vs {low}");
            }
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("the port is free");
        }
    }

    #[test]
    fn listen_ports_picked_together_are_distinct_and_nonzero() {
        let ports = free_listen_ports(8);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        assert!(ports.iter().all(|p| *p != 0));
    }

    #[test]
    fn scratch_dirs_are_distinct_and_removed_on_drop() {
        let a = TempDir::new("scratch-test").expect("a");
        let b = TempDir::new("scratch-test").expect("b");
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("file"), b"x").expect("write");
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
        assert!(b.path().is_dir());
    }
}
