//! Session traces: multi-turn, closed-loop traces in the JSONL form aiperf and Dynamo's tools
//! replay (`session_id`; `timestamp` on a session's first turn, `delay` on later ones) plus
//! `parent_session_id` for sub-agents, with Mooncake's `input_length`, `output_length` and
//! `hash_ids` for each turn's prompt.
//!
//! - [`row`]: one row's fields and checks;
//! - [`link`]: which earlier turns each turn waits for (the rules, precisely);
//! - [`plan_sessions`]: the linked turns as a [`Workload`], ordered and labelled by
//!   [`crate::closed_loop`] exactly as the agentic generator's;
//! - [`write`]: a closed-loop workload written as a session trace.
//!
//! `docs/loadgen.md`, "Session traces", describes the form for users.

pub mod link;
pub mod row;
pub mod write;

pub use link::{parse_sessions, ParsedSessions};
pub use row::{SessionId, SessionRow};
pub use write::{session_trace_rows, write_session_trace, WriteError};

use super::closed_loop::finish_closed_loop;
use super::Workload;

/// The workload of a linked session trace: one request per usable row, closed loop.
pub fn plan_sessions(parsed: &ParsedSessions, content_seed: u64) -> Workload {
    Workload {
        name: "sessions".into(),
        content_seed,
        requests: finish_closed_loop(parsed.turns.clone()),
    }
}
