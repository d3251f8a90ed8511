//! What can go wrong bringing the stack up, as variants a caller can act on.

use std::path::PathBuf;

/// Why the stack could not start (or a process could not be controlled).
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// A binary or artifact is missing; `hint` names the command that produces it.
    #[error("{what} not found at {path}: {hint}")]
    MissingArtifact {
        /// What is missing (e.g. "control plane binary").
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// How to get it.
        hint: String,
    },
    /// A process could not be spawned.
    #[error("cannot start {name} ({program}): {source}")]
    Spawn {
        /// Component name.
        name: String,
        /// The program.
        program: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A process of the stack exited (while starting, or later).
    #[error("{name} exited ({status}); last log lines from {log}:\n{tail}")]
    Exited {
        /// Component name.
        name: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of that log.
        tail: String,
    },
    /// A readiness check did not pass in time.
    #[error("{name} not ready after {waited_ms} ms: {detail} (logs in {run_dir})")]
    NotReady {
        /// Component name.
        name: String,
        /// How long the stack waited.
        waited_ms: u128,
        /// The last check's result.
        detail: String,
        /// The run directory with every log.
        run_dir: PathBuf,
    },
    /// Envoy's admin interface did not do what was asked.
    #[error("envoy admin {call}: {detail}")]
    EnvoyAdmin {
        /// The admin endpoint (e.g. "drain_listeners").
        call: String,
        /// What went wrong.
        detail: String,
    },
    /// A bad builder setting.
    #[error("invalid stack setting: {0}")]
    InvalidSetting(String),
    /// File-system trouble in the run directory.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl StackError {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StackError {
        let context = context.into();
        move |source| StackError::Io { context, source }
    }
}
