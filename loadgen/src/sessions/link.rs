//! Linking a session trace's rows into closed-loop requests: which earlier turns each turn
//! waits for, in file order. The rules (also in `docs/loadgen.md`, "Session traces"):
//!
//! - A session's **first turn** without `parent_session_id` starts at its `timestamp` and waits
//!   for nothing. It must not carry `delay`.
//! - A **later turn** waits for the previous turn of its session (the closest row above it
//!   with the same `session_id`) to complete, then `delay` ms. It must carry `delay` and no
//!   `timestamp`.
//! - A **sub-agent** is a session whose first row names `parent_session_id`. Its first turn
//!   waits for the parent's *current turn* (the parent's closest row above it), then `delay`
//!   ms (0 if absent); the parent must have a row above it, and the row must not carry
//!   `timestamp`. Later rows of the sub-agent may repeat the same parent, no other.
//! - **Joining.** The parent's next turn waits for every sub-agent spawned from its current
//!   turn to finish: for the last row of each, as far as the file has gone, instead of the
//!   parent's own previous turn (which they already waited for), then `delay` ms. A sub-agent
//!   whose last turn spawned sub-agents it never joined finishes when they do (and so on
//!   down). A sub-agent, and every one under it, has returned from then on: a later row of it
//!   is an error, and so is a session spawned from it.
//!
//! An unusable row is reported with its line number and why, and changes no session: the
//! rows after it are linked as if it were not there.

use std::collections::HashMap;

use super::row::{parse_row, SessionId, SessionRow};
use crate::prompts::PromptSpec;
use crate::trace::{row_prompt, MalformedLine};
use crate::PlannedRequest;

/// A session trace's usable turns as requests, and the lines that were not usable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedSessions {
    /// One request per usable row, in file order: `id` is the index here, dependencies point
    /// to earlier entries, `session` is the root session's number in order of first row and
    /// `agent` the sub-agent's within it (0 = the root). Planned arrivals of turns with
    /// dependencies are not set yet (`crate::closed_loop` does it).
    pub turns: Vec<PlannedRequest>,
    /// The file line of each entry of `turns` (1-based).
    pub lines: Vec<usize>,
    /// Unusable lines, with why.
    pub malformed: Vec<MalformedLine>,
}

/// What the linker remembers of a session.
#[derive(Debug, Clone)]
struct SessionState {
    /// Number of the root session it belongs to.
    root: u64,
    /// Agent number within the root (0 = the root itself).
    agent: u32,
    parent: Option<SessionId>,
    /// Turns so far.
    turns: u32,
    /// Index (in `turns`) of its latest turn.
    current: usize,
    /// Sub-agents spawned from `current`, in order of their first row.
    spawned: Vec<SessionId>,
    /// The line at which its parent resumed, once it has.
    returned_at: Option<usize>,
}

/// How a usable row attaches to the sessions above it.
struct Link {
    after: Vec<usize>,
    think_ms: u64,
    arrival_ms: u64,
}

/// Links the rows of `text` (blank lines skipped).
pub fn parse_sessions(text: &str, block_tokens: u32) -> ParsedSessions {
    let rows = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| (index + 1, parse_row(line, block_tokens)));
    link_rows(rows, block_tokens)
}

/// Links rows already read: `(line, row or why it is unusable)`, in file order.
pub fn link_rows(
    rows: impl IntoIterator<Item = (usize, Result<SessionRow, String>)>,
    block_tokens: u32,
) -> ParsedSessions {
    let mut linker = Linker::default();
    for (line, row) in rows {
        match row.and_then(|row| linker.add(line, &row, block_tokens)) {
            Ok(()) => linker.parsed.lines.push(line),
            Err(reason) => linker.parsed.malformed.push(MalformedLine { line, reason }),
        }
    }
    linker.parsed
}

#[derive(Default)]
struct Linker {
    sessions: HashMap<SessionId, SessionState>,
    /// Agents so far per root session.
    agents: Vec<u32>,
    parsed: ParsedSessions,
}

impl Linker {
    /// Links one row, or says why it cannot be; on error nothing changes.
    fn add(&mut self, line: usize, row: &SessionRow, block_tokens: u32) -> Result<(), String> {
        let id = self.parsed.turns.len();
        let (link, state) = match self.sessions.get(&row.session_id) {
            None => self.first_turn(row)?,
            Some(state) => self.later_turn(row, state)?,
        };
        // Checked: commit.
        if let Some(parent) = &state.parent {
            if state.turns == 0 {
                if let Some(p) = self.sessions.get_mut(parent) {
                    p.spawned.push(row.session_id.clone());
                }
            }
        }
        let spawned = self
            .sessions
            .get_mut(&row.session_id)
            .map(|s| std::mem::take(&mut s.spawned))
            .unwrap_or_default();
        for child in self.outstanding(&spawned).1 {
            if let Some(c) = self.sessions.get_mut(&child) {
                c.returned_at = Some(line);
            }
        }
        if state.agent == 0 && state.turns == 0 {
            self.agents.push(1);
        }
        self.parsed.turns.push(PlannedRequest {
            id,
            arrival_ms: link.arrival_ms,
            session: state.root,
            turn: state.turns,
            agent: state.agent,
            after: link.after,
            think_ms: link.think_ms,
            prompt: prompt_of(row, block_tokens),
            osl: row.output_length,
        });
        self.sessions.insert(
            row.session_id.clone(),
            SessionState {
                turns: state.turns + 1,
                current: id,
                // A new current turn has spawned nothing yet.
                spawned: Vec::new(),
                ..state
            },
        );
        Ok(())
    }

    /// A session's first row: a root session or a sub-agent.
    fn first_turn(&mut self, row: &SessionRow) -> Result<(Link, SessionState), String> {
        let Some(parent_id) = &row.parent_session_id else {
            let Some(timestamp) = row.timestamp else {
                return Err(format!(
                    "session {:?} starts here and has no parent_session_id: its first turn \
                     needs a timestamp",
                    row.session_id.0
                ));
            };
            if row.delay.is_some() {
                return Err(format!(
                    "session {:?} starts here: a first turn has a timestamp, not a delay",
                    row.session_id.0
                ));
            }
            let state = SessionState {
                root: self.agents.len() as u64,
                agent: 0,
                parent: None,
                turns: 0,
                current: 0,
                spawned: Vec::new(),
                returned_at: None,
            };
            let link = Link {
                after: Vec::new(),
                think_ms: 0,
                arrival_ms: timestamp,
            };
            return Ok((link, state));
        };
        if *parent_id == row.session_id {
            return Err(format!(
                "session {:?} names itself as its parent",
                row.session_id.0
            ));
        }
        let Some(parent) = self.sessions.get(parent_id) else {
            return Err(format!(
                "sub-agent session {:?}: its parent session {:?} has no turn above this line",
                row.session_id.0, parent_id.0
            ));
        };
        if let Some(line) = parent.returned_at {
            return Err(format!(
                "sub-agent session {:?}: its parent session {:?} already returned to its own \
                 parent at line {line}",
                row.session_id.0, parent_id.0
            ));
        }
        if row.timestamp.is_some() {
            return Err(format!(
                "sub-agent session {:?} starts after its parent's turn: give a delay, not a \
                 timestamp",
                row.session_id.0
            ));
        }
        let root = parent.root;
        let after = vec![parent.current];
        let agents = &mut self.agents[root as usize];
        let state = SessionState {
            root,
            agent: *agents,
            parent: Some(parent_id.clone()),
            turns: 0,
            current: 0,
            spawned: Vec::new(),
            returned_at: None,
        };
        *agents += 1;
        let link = Link {
            after,
            think_ms: row.delay.unwrap_or(0),
            arrival_ms: 0,
        };
        Ok((link, state))
    }

    /// A later row of a known session: after its current turn, or after the sub-agents that
    /// turn spawned.
    fn later_turn(
        &self,
        row: &SessionRow,
        state: &SessionState,
    ) -> Result<(Link, SessionState), String> {
        let name = &row.session_id.0;
        if let Some(line) = state.returned_at {
            return Err(format!(
                "sub-agent session {name:?} has a turn after its parent resumed at line {line}"
            ));
        }
        if row.parent_session_id.is_some() && row.parent_session_id != state.parent {
            let started = match &state.parent {
                Some(parent) => format!("as a sub-agent of {:?}", parent.0),
                None => "as a main agent (no parent)".to_string(),
            };
            let named = row.parent_session_id.as_ref().map_or("", |p| p.0.as_str());
            return Err(format!(
                "session {name:?} started {started}; this row names parent {named:?} (a session \
                 keeps its parent, and sessions cannot be each other's parents)"
            ));
        }
        if row.timestamp.is_some() {
            return Err(format!(
                "a later turn of session {name:?} is sent a delay after the previous one \
                 completes: give a delay, not a timestamp"
            ));
        }
        let Some(delay) = row.delay else {
            return Err(format!(
                "a later turn of session {name:?} needs a delay (ms after the previous turn \
                 completed)"
            ));
        };
        let after = if state.spawned.is_empty() {
            vec![state.current]
        } else {
            self.outstanding(&state.spawned).0
        };
        let link = Link {
            after,
            think_ms: delay,
            arrival_ms: 0,
        };
        Ok((link, state.clone()))
    }
}

impl Linker {
    /// What a join of `spawned` waits for: each sub-agent's latest turn, or, where that turn
    /// spawned sub-agents of its own that it never joined, theirs, and so on down (a
    /// sub-agent has finished when everything it started has). Also every session that
    /// returns with it. A loop, not recursion: a file may nest sub-agents deeply.
    fn outstanding(&self, spawned: &[SessionId]) -> (Vec<usize>, Vec<SessionId>) {
        let mut turns = Vec::new();
        let mut returning = Vec::new();
        let mut pending: Vec<&SessionId> = spawned.iter().rev().collect();
        while let Some(child) = pending.pop() {
            let Some(state) = self.sessions.get(child) else {
                continue;
            };
            returning.push(child.clone());
            if state.spawned.is_empty() {
                turns.push(state.current);
            } else {
                pending.extend(state.spawned.iter().rev());
            }
        }
        (turns, returning)
    }
}

fn prompt_of(row: &SessionRow, block_tokens: u32) -> PromptSpec {
    row_prompt(&row.as_trace_row(), block_tokens)
}
