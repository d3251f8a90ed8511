//! nats-server with JetStream on 127.0.0.1: the one way the stack and the tests start it.
//!
//! [`NatsServer::launch`] starts it from a [`NatsConfig`] and waits (bounded) until it accepts
//! connections; the stack uses it with the store and log in its run directory.
//! [`NatsServer::start`] is the test fixture: the workspace's nats-server on a free port, store
//! and log in a scratch directory, panicking with the log's end if it cannot start.
//! Dropping a [`NatsServer`] stops the process by PID (SIGTERM, then SIGKILL), then removes
//! the scratch directory if it has one.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::Process;
use crate::{Error, TempDir};

/// The process name used in logs and errors.
pub const NAME: &str = "nats-server";
/// The environment variable naming the nats-server binary.
pub const PROGRAM_ENV: &str = "SWITCHYARD_NATS_SERVER";
/// How long the test fixture waits for nats-server to accept connections.
pub const FIXTURE_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The nats-server binary: `$SWITCHYARD_NATS_SERVER`, else the workspace's
/// `.venv/bin/nats-server` (installed by `scripts/setup.sh`).
pub fn default_program() -> PathBuf {
    std::env::var_os(PROGRAM_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../.venv/bin/nats-server"
            ))
        })
}

/// How to run one nats-server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// The nats-server binary.
    pub program: PathBuf,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// The JetStream store directory.
    pub store_dir: PathBuf,
    /// Where its output goes; `None` discards it.
    pub log: Option<PathBuf>,
}

impl NatsConfig {
    /// The command line: JetStream on, bound to 127.0.0.1 only.
    pub fn args(&self) -> Vec<String> {
        vec![
            "-js".into(),
            "-a".into(),
            Ipv4Addr::LOCALHOST.to_string(),
            "-p".into(),
            self.port.to_string(),
            "-sd".into(),
            self.store_dir.to_string_lossy().into_owned(),
        ]
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        (Ipv4Addr::LOCALHOST, self.port).into()
    }
}

/// A running nats-server, stopped by PID on drop.
#[derive(Debug)]
pub struct NatsServer {
    // Declared first: dropped (the server stopped) before the scratch directory goes.
    process: Process,
    addr: SocketAddr,
    /// `nats://127.0.0.1:<port>`.
    pub url: String,
    scratch: Option<TempDir>,
}

impl NatsServer {
    /// Starts nats-server as `config` says, without waiting for it.
    ///
    /// # Errors
    /// [`Error::Spawn`] or [`Error::Io`] if it cannot be started.
    pub fn spawn(config: &NatsConfig) -> Result<NatsServer, Error> {
        let process = Process::spawn(NAME, &config.program, &config.args(), config.log.as_deref())?;
        Ok(NatsServer {
            process,
            addr: config.addr(),
            url: format!("nats://{}", config.addr()),
            scratch: None,
        })
    }

    /// Waits, at most `timeout`, until the server accepts TCP connections.
    ///
    /// # Errors
    /// [`Error::Exited`] with its log's end if it exits first, [`Error::NotReady`] on timeout.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), Error> {
        self.process.wait_for_listener(self.addr, timeout)
    }

    /// Starts nats-server and waits, at most `timeout`, until it accepts connections. On an
    /// error the process is already stopped.
    ///
    /// # Errors
    /// As [`NatsServer::spawn`] and [`NatsServer::wait_ready`].
    pub fn launch(config: &NatsConfig, timeout: Duration) -> Result<NatsServer, Error> {
        let mut server = NatsServer::spawn(config)?;
        server.wait_ready(timeout)?;
        Ok(server)
    }

    /// The test fixture: the workspace's nats-server ([`default_program`]) on a free port,
    /// ready to accept connections.
    ///
    /// # Panics
    /// If nats-server is missing or does not come up within [`FIXTURE_READY_TIMEOUT`]; the
    /// message names the binary and quotes the end of its log.
    pub fn start() -> NatsServer {
        NatsServer::start_on(crate::free_port())
    }

    /// [`NatsServer::start`] on a given port (for tests that start NATS after its clients).
    ///
    /// # Panics
    /// As [`NatsServer::start`].
    pub fn start_on(port: u16) -> NatsServer {
        let program = default_program();
        assert!(
            program.exists(),
            "nats-server not found at {} (run scripts/setup.sh or set {PROGRAM_ENV})",
            program.display()
        );
        let scratch = TempDir::new("nats").expect("a scratch directory for nats-server");
        let config = NatsConfig {
            program,
            port,
            store_dir: scratch.path().join("store"),
            log: Some(scratch.path().join("nats-server.log")),
        };
        let mut server = NatsServer::launch(&config, FIXTURE_READY_TIMEOUT)
            .unwrap_or_else(|e| panic!("nats-server did not start: {e}"));
        server.scratch = Some(scratch);
        server
    }

    /// Its client port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Its PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Its log file, if its output is kept.
    pub fn log_path(&self) -> Option<&Path> {
        self.process.log_path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_enables_jetstream_on_loopback_only() {
        let config = NatsConfig {
            program: PathBuf::from("nats-server"),
            port: 4333,
            store_dir: PathBuf::from("/tmp/store"),
            log: None,
        };
        assert_eq!(
            config.args(),
            ["-js", "-a", "127.0.0.1", "-p", "4333", "-sd", "/tmp/store"]
        );
        assert_eq!(config.addr().to_string(), "127.0.0.1:4333");
    }

    #[test]
    fn the_fixture_accepts_connections_and_drop_stops_it_and_removes_its_store() {
        let server = NatsServer::start();
        let pid = server.pid().expect("running");
        assert_eq!(server.url, format!("nats://127.0.0.1:{}", server.port()));
        std::net::TcpStream::connect(("127.0.0.1", server.port())).expect("accepts connections");
        let log = server.log_path().expect("a log").to_path_buf();
        let scratch = log.parent().expect("in the scratch dir").to_path_buf();
        assert!(scratch.join("store").is_dir(), "JetStream made its store");
        drop(server);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "nats-server {pid} still exists after drop"
        );
        assert!(!scratch.exists(), "{} not removed", scratch.display());
    }

    #[test]
    fn a_server_that_cannot_bind_is_reported_with_its_log() {
        // Port taken by a listener of ours: nats-server exits and says why.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let scratch = TempDir::new("nats-test").expect("scratch");
        let config = NatsConfig {
            program: default_program(),
            port,
            store_dir: scratch.path().join("store"),
            log: Some(scratch.path().join("nats.log")),
        };
        // The listener accepts, so readiness alone would pass: the exit check must win.
        let mut server = NatsServer::spawn(&config).expect("spawned");
        let exited = (0..250).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            server.process.check_running().is_err()
        });
        assert!(exited, "nats-server kept running on a taken port");
        let message = server
            .wait_ready(Duration::from_secs(1))
            .expect_err("exited")
            .to_string();
        assert!(message.contains("address already in use"), "{message}");
    }
}
