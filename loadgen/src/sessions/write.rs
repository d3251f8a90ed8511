//! Writing a closed-loop workload (the agentic generator's) as a session trace, so that any
//! tool that replays session traces replays the same workload, and so does
//! `--trace FILE` here.
//!
//! Names: the main agent of session `s` is `"s"`, its `k`-th sub-agent `"s.k"`. Rows are in
//! workload order, which is an order the linking rules ([`super::link`]) read back into the
//! same dependencies; the writer checks that by linking what it wrote, and refuses a
//! workload the rules cannot express (e.g. an open-loop trace with inferred sessions).
//!
//! Prompts become hash ids of `block_tokens` tokens, as in every Mooncake-form trace
//! ([`BlockNamer`]): two prompts get the same hash id for a block exactly when they hold the
//! same tokens there and before it. The workload read back therefore has the same lengths and
//! shares the same whole blocks; sharing that ends inside a block is kept when one prompt's
//! last, partial block is the start of the other's block (a turn and the next), and lost
//! otherwise (at most `block_tokens − 1` tokens where two prompts part).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use super::link::link_rows;
use super::row::{SessionId, SessionRow};
use crate::prompts::PromptSpec;
use crate::Workload;

/// Why a workload cannot be written as a session trace.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The block size is zero.
    #[error("block size must be positive")]
    ZeroBlockSize,
    /// A request's dependencies are not what the session-trace rules would give it.
    #[error(
        "request {id} ({session}) cannot be expressed as a session trace: it waits for \
         {planned:?}, the session-trace rules would make it wait for {linked:?}"
    )]
    NotExpressible {
        /// The request.
        id: usize,
        /// Its session name in the trace.
        session: String,
        /// Its dependencies in the workload.
        planned: Vec<usize>,
        /// The dependencies the written rows link to.
        linked: Vec<usize>,
    },
    /// The file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The session trace rows of `workload`, one per request in workload order.
///
/// # Errors
/// [`WriteError::ZeroBlockSize`], or [`WriteError::NotExpressible`] for a workload whose
/// dependencies the session-trace rules do not reproduce.
pub fn session_trace_rows(
    workload: &Workload,
    block_tokens: u32,
) -> Result<Vec<SessionRow>, WriteError> {
    if block_tokens == 0 {
        return Err(WriteError::ZeroBlockSize);
    }
    let name = |id: usize| {
        let r = &workload.requests[id];
        SessionId(match r.agent {
            0 => r.session.to_string(),
            k => format!("{}.{k}", r.session),
        })
    };
    let mut namer = BlockNamer::new(block_tokens);
    let mut started: HashSet<SessionId> = HashSet::new();
    let mut rows = Vec::with_capacity(workload.requests.len());
    for r in &workload.requests {
        let session_id = name(r.id);
        let first = started.insert(session_id.clone());
        let (timestamp, delay, parent) = match (first, r.after.as_slice()) {
            (true, []) => (Some(r.arrival_ms), None, None),
            (true, [spawner]) => (None, Some(r.think_ms), Some(name(*spawner))),
            // Anything else fails the link check below, which says what differs.
            _ => (None, Some(r.think_ms), None),
        };
        rows.push(SessionRow {
            session_id,
            parent_session_id: parent,
            timestamp,
            delay,
            input_length: u32::try_from(r.isl()).unwrap_or(u32::MAX),
            output_length: r.osl,
            hash_ids: namer.hash_ids(&r.prompt),
        });
    }
    check_links(workload, &rows, block_tokens)?;
    Ok(rows)
}

/// Writes `workload` to `path` as a session trace (JSONL); returns the rows written.
///
/// # Errors
/// As [`session_trace_rows`], and [`WriteError::Io`].
pub fn write_session_trace(
    path: &Path,
    workload: &Workload,
    block_tokens: u32,
) -> Result<usize, WriteError> {
    let rows = session_trace_rows(workload, block_tokens)?;
    let io = |source| WriteError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    for row in &rows {
        serde_json::to_writer(&mut out, row).map_err(|e| io(e.into()))?;
        out.write_all(b"\n").map_err(io)?;
    }
    out.flush().map_err(io)?;
    Ok(rows.len())
}

/// The written rows, linked back, must wait for exactly what the workload's requests wait
/// for: the writer's guarantee that replaying the file reproduces the workload.
fn check_links(
    workload: &Workload,
    rows: &[SessionRow],
    block_tokens: u32,
) -> Result<(), WriteError> {
    let linked = link_rows(
        rows.iter()
            .enumerate()
            .map(|(i, row)| (i + 1, Ok(row.clone()))),
        block_tokens,
    );
    if let Some(bad) = linked.malformed.first() {
        let id = bad.line - 1;
        return Err(WriteError::NotExpressible {
            id,
            session: rows[id].session_id.0.clone(),
            planned: workload.requests[id].after.clone(),
            linked: Vec::new(),
        });
    }
    for (r, turn) in workload.requests.iter().zip(&linked.turns) {
        let mut after = turn.after.clone();
        after.sort_unstable();
        if after != r.after {
            return Err(WriteError::NotExpressible {
                id: r.id,
                session: rows[r.id].session_id.0.clone(),
                planned: r.after.clone(),
                linked: after,
            });
        }
    }
    Ok(())
}

/// A piece of a block: `len` tokens of content block `block` from token `start`.
type Piece = (u64, u32, u32);

/// Names the `block_tokens`-token blocks of prompts with hash ids: a block's id stands for
/// its tokens *and* the id of the block before it, so equal ids mean an equal prefix, as in
/// the Mooncake traces. A partial last block reuses the id of a full block it is the start
/// of (and a full block the id of a partial one that is its start): a replayed hash id's
/// content is one word stream, and a partial block reads its start.
pub struct BlockNamer {
    block_tokens: u32,
    /// Per previous block id (`None` at a prompt's start): the ids that followed it, with the
    /// longest content seen under each.
    known: HashMap<Option<u64>, Vec<(u64, Vec<Piece>)>>,
    next_id: u64,
}

impl BlockNamer {
    /// A namer for blocks of `block_tokens` (> 0) tokens; ids start at 0.
    pub fn new(block_tokens: u32) -> Self {
        BlockNamer {
            block_tokens,
            known: HashMap::new(),
            next_id: 0,
        }
    }

    /// The hash ids of `prompt`: `ceil(tokens / block_tokens)` of them.
    pub fn hash_ids(&mut self, prompt: &PromptSpec) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut previous = None;
        for block in self.blocks(prompt) {
            let id = self.name(previous, block);
            ids.push(id);
            previous = Some(id);
        }
        ids
    }

    /// The prompt cut into blocks of pieces.
    fn blocks(&self, prompt: &PromptSpec) -> Vec<Vec<Piece>> {
        let mut blocks = Vec::new();
        let mut current: Vec<Piece> = Vec::new();
        let mut room = self.block_tokens;
        for segment in &prompt.segments {
            let mut start = 0;
            while start < segment.tokens {
                let len = room.min(segment.tokens - start);
                current.push((segment.block, start, len));
                start += len;
                room -= len;
                if room == 0 {
                    blocks.push(std::mem::take(&mut current));
                    room = self.block_tokens;
                }
            }
        }
        if !current.is_empty() {
            blocks.push(current);
        }
        blocks
    }

    fn name(&mut self, previous: Option<u64>, block: Vec<Piece>) -> u64 {
        let candidates = self.known.entry(previous).or_default();
        for (id, longest) in candidates.iter_mut() {
            if starts(&block, longest) {
                return *id;
            }
            if starts(longest, &block) {
                *longest = block;
                return *id;
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        candidates.push((id, block));
        id
    }
}

/// Whether the tokens of `short` are the start of the tokens of `long`.
fn starts(short: &[Piece], long: &[Piece]) -> bool {
    let Some((last, init)) = short.split_last() else {
        return true;
    };
    if init.len() >= long.len() || long[..init.len()] != *init {
        return false;
    }
    let (block, start, len) = long[init.len()];
    last.0 == block && last.1 == start && last.2 <= len
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_get_equal_ids_and_a_partial_block_its_full_blocks_id() {
        let mut namer = BlockNamer::new(4);
        // 6 tokens: a full block and a partial one.
        let turn1 = namer.hash_ids(&PromptSpec::of(&[(10, 6)]));
        // The same 6 tokens and 3 more: the partial block grows into a full one.
        let turn2 = namer.hash_ids(&PromptSpec::of(&[(10, 6), (11, 3)]));
        // The same first block, then other content.
        let other = namer.hash_ids(&PromptSpec::of(&[(10, 4), (12, 4)]));
        // Same content as block 1 of turn2 but a different block before it.
        let moved = namer.hash_ids(&PromptSpec::of(&[(13, 4), (10, 2), (11, 2)]));
        assert_eq!(turn1, vec![0, 1]);
        assert_eq!(turn2, vec![0, 1, 2]);
        assert_eq!(other, vec![0, 3]);
        assert_eq!(moved, vec![4, 5]);
    }

    #[test]
    fn piece_prefixes() {
        assert!(starts(&[(1, 0, 2)], &[(1, 0, 4)]));
        assert!(starts(&[(1, 0, 4), (2, 0, 1)], &[(1, 0, 4), (2, 0, 3)]));
        assert!(!starts(&[(1, 0, 4), (2, 0, 1)], &[(1, 0, 4)]));
        assert!(!starts(&[(1, 1, 2)], &[(1, 0, 4)]));
        assert!(!starts(&[(1, 0, 3), (2, 0, 1)], &[(1, 0, 4)]));
    }
}
