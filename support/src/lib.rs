//! Local child processes, shared by the stack launcher (`switchyard-stack`) and the tests of
//! the control plane and the simulated workers, so that all of them start, wait for and stop
//! processes the same way.
//!
//! Every process listens on 127.0.0.1 only and is stopped by its PID when its handle is
//! dropped, also when a test panics. The crate uses the standard library only (plus
//! `thiserror`, and `clap` for [`cli`]), so depending on it costs little; the HTTP accept
//! loop and its dependencies (warp, hyper, tokio) come only with the `http-server` feature.
//!
//! # Layout
//! - [`process`]: one child with its output in a log file (or discarded), signals, a bounded
//!   wait until it accepts TCP connections, stop by PID on drop.
//! - [`nats`]: nats-server with JetStream on a free 127.0.0.1 port; [`NatsServer::start`] is
//!   the test fixture.
//! - [`scratch`]: free ports and scratch directories removed on drop.
//! - [`cli`]: flag parsing for the binaries, exiting 64 on bad flags.
//! - `http_server` (feature `http-server`): the accept loop the control plane and the
//!   simulated workers serve HTTP with (`TCP_NODELAY`, quiet about
//!   peers' connection errors).
#![deny(missing_docs)]

pub mod cli;
#[cfg(feature = "http-server")]
pub mod http_server;
pub mod nats;
pub mod process;
pub mod scratch;

pub use nats::{NatsConfig, NatsServer};
pub use process::{Process, Signal};
pub use scratch::{free_listen_port, free_listen_ports, free_port, random_token, TempDir};

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why a process could not be started, controlled, or did not come up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program could not be spawned (missing, not executable, ...).
    #[error("cannot start {name} ({program}): {source}")]
    Spawn {
        /// The process's name.
        name: String,
        /// The program.
        program: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The process has exited (or was stopped) while it should run.
    #[error("{name} exited ({status}); end of its log:\n{tail}")]
    Exited {
        /// The process's name.
        name: String,
        /// Its exit status, or why it is not running.
        status: String,
        /// Its log file, if its output was kept.
        log: Option<PathBuf>,
        /// The end of that log.
        tail: String,
    },
    /// The process did not accept TCP connections in time.
    #[error("{name} did not accept connections on {addr} within {waited_ms} ms: {detail}")]
    NotReady {
        /// The process's name.
        name: String,
        /// Where it should listen.
        addr: SocketAddr,
        /// How long the wait lasted.
        waited_ms: u128,
        /// The last connection error.
        detail: String,
    },
    /// Other I/O trouble (log files, `kill`, scratch directories).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}
