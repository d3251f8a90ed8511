//! The workload a replay binary's flags describe: a trace file of either form (every row must
//! be usable: a virtual run on a silently thinned trace would not be the trace's) or the
//! synthetic agentic sessions, cut to the first `max_requests`.

use std::path::PathBuf;

use switchyard_loadgen::agentic::generate_agentic;
use switchyard_loadgen::trace::TraceError;
use switchyard_loadgen::trace_file::load_trace;
use switchyard_loadgen::{Workload, WorkloadArgs};

/// Why the workload could not be had.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A row of the trace is unusable.
    #[error(
        "{path}: {count} malformed line(s) in this {form} trace, first at line {line}: {reason}"
    )]
    Malformed {
        /// The trace.
        path: String,
        /// The form it was read as.
        form: String,
        /// Unusable lines.
        count: usize,
        /// The first one's line number.
        line: usize,
        /// Why it is unusable.
        reason: String,
    },
    /// No rows at all.
    #[error("{0} has no requests")]
    Empty(String),
    /// Bad agentic knobs.
    #[error("{0}")]
    Agentic(String),
    /// `--max-requests 0`.
    #[error("--max-requests must be at least 1")]
    NoRequests,
}

/// Loads the workload `args` describe (`default_trace` when neither `--trace` nor
/// `--agentic` is given) and keeps its first `max_requests`.
///
/// # Errors
/// [`WorkloadError`] naming the file, line and reason, or the bad knob.
pub fn load_workload(
    args: &WorkloadArgs,
    default_trace: impl FnOnce() -> PathBuf,
    max_requests: Option<usize>,
) -> Result<Workload, WorkloadError> {
    let mut workload = match args.trace_or(default_trace) {
        Some(path) => {
            let loaded = load_trace(&path, args.trace_form, args.block_tokens, args.seed)?;
            if let Some(first) = loaded.malformed.first() {
                return Err(WorkloadError::Malformed {
                    path: path.display().to_string(),
                    form: loaded.form.to_string(),
                    count: loaded.malformed.len(),
                    line: first.line,
                    reason: first.reason.clone(),
                });
            }
            if loaded.workload.requests.is_empty() {
                return Err(WorkloadError::Empty(path.display().to_string()));
            }
            loaded.workload
        }
        None => {
            let config = args.agentic_config().map_err(WorkloadError::Agentic)?;
            generate_agentic(&config, args.seed)
                .map_err(|e| WorkloadError::Agentic(e.to_string()))?
        }
    };
    if let Some(n) = max_requests {
        if n == 0 {
            return Err(WorkloadError::NoRequests);
        }
        workload.truncate(n);
    }
    Ok(workload)
}
