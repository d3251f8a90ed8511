//! Mooncake traces: parsing and planning.
//!
//! A row is `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids":
//! [...]}`; hash id `i` of a row stands for tokens `[i·B, (i+1)·B)` of its prompt (`B` = 512 in
//! the published traces), the last block possibly partial. Two rows that share a hash id share
//! that block's content. Planning maps hash ids one-to-one onto content blocks
//! ([`super::prompts`]), so the synthesized prompts have exactly the trace's lengths and reuse.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::prompts::{PromptSpec, Segment};
use super::{PlannedRequest, Workload};

/// Default tokens per hash id in the Mooncake traces.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// One trace row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRow {
    /// Arrival in ms since the start of the trace.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Generated tokens.
    pub output_length: u32,
    /// One id per block of the prompt, in order.
    pub hash_ids: Vec<u64>,
}

/// A line that could not be used, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MalformedLine {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

/// The usable rows of a trace and the lines that were not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ParsedTrace {
    /// Usable rows, in file order.
    pub rows: Vec<TraceRow>,
    /// Malformed lines (bad JSON, missing fields, lengths that contradict the hash ids).
    pub malformed: Vec<MalformedLine>,
}

/// Errors that make a whole trace unusable.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The block size is zero.
    #[error("block size must be positive")]
    ZeroBlockSize,
    /// The rows' arrivals, once planned, span too long (`Workload::check_span`).
    #[error("{0}")]
    Span(String),
}

/// Parses trace text. Blank lines are skipped; every other unusable line is reported with its
/// line number and reason, never silently dropped.
///
/// # Errors
/// [`TraceError::ZeroBlockSize`] if `block_tokens` is 0.
pub fn parse_trace(text: &str, block_tokens: u32) -> Result<ParsedTrace, TraceError> {
    if block_tokens == 0 {
        return Err(TraceError::ZeroBlockSize);
    }
    let mut parsed = ParsedTrace::default();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let checked = parse_row_object::<TraceRow>(line)
            .and_then(|row| check_row(&row, block_tokens).map(|()| row));
        match checked {
            Ok(row) => parsed.rows.push(row),
            Err(reason) => parsed.malformed.push(MalformedLine {
                line: index + 1,
                reason,
            }),
        }
    }
    Ok(parsed)
}

/// Reads and parses a trace file (lines that are not UTF-8 are reported like other malformed
/// lines).
///
/// # Errors
/// [`TraceError::Read`] if the file cannot be read.
pub fn read_trace(path: &std::path::Path, block_tokens: u32) -> Result<ParsedTrace, TraceError> {
    let (text, not_utf8) = read_trace_text(path)?;
    let mut parsed = parse_trace(&text, block_tokens)?;
    parsed.malformed = merge_by_line(not_utf8, parsed.malformed);
    Ok(parsed)
}

/// The text of a trace file, each line that is not UTF-8 left blank and reported: one bad line
/// does not cost the rest of the file.
///
/// # Errors
/// [`TraceError::Read`] if the file cannot be read.
pub(crate) fn read_trace_text(
    path: &std::path::Path,
) -> Result<(String, Vec<MalformedLine>), TraceError> {
    let bytes = std::fs::read(path).map_err(|source| TraceError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let bytes = match String::from_utf8(bytes) {
        Ok(text) => return Ok((text, Vec::new())),
        Err(e) => e.into_bytes(),
    };
    let mut text = String::with_capacity(bytes.len());
    let mut not_utf8 = Vec::new();
    for (index, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if index > 0 {
            text.push('\n');
        }
        match std::str::from_utf8(line) {
            Ok(line) => text.push_str(line),
            Err(e) => not_utf8.push(MalformedLine {
                line: index + 1,
                reason: format!("not valid UTF-8 (byte {})", e.valid_up_to() + 1),
            }),
        }
    }
    Ok((text, not_utf8))
}

/// Two line-ordered lists of malformed lines as one.
pub(crate) fn merge_by_line(a: Vec<MalformedLine>, b: Vec<MalformedLine>) -> Vec<MalformedLine> {
    let mut all = a;
    all.extend(b);
    all.sort_by_key(|m| m.line);
    all
}

/// One row of a trace file read as `T`, or why not, naming the field it broke at
/// (`delay: invalid value: integer `-5`, expected u64 at column 31`). Each row is parsed
/// alone, so serde's "at line 1" would contradict the line number the report gives: only the
/// column is kept.
pub(crate) fn parse_row_object<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, String> {
    let located =
        |e: &serde_json::Error| e.to_string().replace(" at line 1 column ", " at column ");
    // Not an object: the protocol's own check says what it is instead (an object passes it
    // and is read below, where the field that breaks is named).
    switchyard_protocol::from_json_object::<serde::de::IgnoredAny>(line.as_bytes())
        .map_err(|e| located(&e))?;
    let mut json = serde_json::Deserializer::from_str(line);
    let row = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        let error = located(e.inner());
        if path == "." || path.is_empty() {
            error
        } else {
            format!("{path}: {error}")
        }
    })?;
    json.end().map_err(|e| located(&e))?;
    Ok(row)
}

/// The longest prompt a row may ask for: above every model's context, and small enough that
/// its token ids (4 bytes each) fit in memory.
pub const MAX_ROW_INPUT_TOKENS: u32 = 1 << 24;

/// The latest arrival (`timestamp`) or longest `delay` a row may give, in ms: over a thousand
/// years, and small enough that virtual time, a float of milliseconds, still resolves the
/// replay's sub-second steps there (at 2^63 ms one step of the float is two seconds, and the
/// replay's periodic work never moved time on).
pub const MAX_ROW_MS: u64 = 1 << 45;

/// A row is usable when its lengths are positive and within bounds, its arrival within
/// [`MAX_ROW_MS`], and its hash ids cover exactly its input length (session-trace rows are held
/// to the same rule).
pub(crate) fn check_row(row: &TraceRow, block_tokens: u32) -> Result<(), String> {
    if row.input_length == 0 {
        return Err("input_length is 0".into());
    }
    if row.input_length > MAX_ROW_INPUT_TOKENS {
        return Err(format!(
            "input_length {} is above {MAX_ROW_INPUT_TOKENS} tokens",
            row.input_length
        ));
    }
    if row.timestamp > MAX_ROW_MS {
        return Err(format!(
            "timestamp {} is above {MAX_ROW_MS} ms",
            row.timestamp
        ));
    }
    if row.output_length == 0 {
        return Err("output_length is 0".into());
    }
    let blocks = row.input_length.div_ceil(block_tokens) as usize;
    if blocks != row.hash_ids.len() {
        return Err(format!(
            "input_length {} needs {blocks} blocks of {block_tokens} tokens but hash_ids has {}",
            row.input_length,
            row.hash_ids.len()
        ));
    }
    Ok(())
}

/// The prompt of a row: one segment per hash id, the last one partial.
pub fn row_prompt(row: &TraceRow, block_tokens: u32) -> PromptSpec {
    let mut remaining = row.input_length;
    let segments = row
        .hash_ids
        .iter()
        .map(|&block| {
            let tokens = remaining.min(block_tokens);
            remaining -= tokens;
            Segment { block, tokens }
        })
        .collect();
    PromptSpec { segments }
}

/// Plans a trace: one request per row at its timestamp, open loop (no dependencies).
///
/// The trace has no session ids; sessions are inferred for reporting only: a row that shares
/// at least its first two blocks with an earlier row continues that row's session (the first
/// block alone is a system prompt many conversations share), otherwise it starts one.
pub fn plan_trace(trace: &ParsedTrace, block_tokens: u32, content_seed: u64) -> Workload {
    let mut rows: Vec<&TraceRow> = trace.rows.iter().collect();
    rows.sort_by_key(|r| r.timestamp); // stable: equal timestamps keep file order
                                       // For each hash id, the session whose request last ended a shared prefix with it.
    let mut session_of_block: HashMap<u64, u64> = HashMap::new();
    let mut turns: HashMap<u64, u32> = HashMap::new();
    let mut next_session = 0u64;
    let mut requests = Vec::with_capacity(rows.len());
    for (id, row) in rows.into_iter().enumerate() {
        let shared = row
            .hash_ids
            .iter()
            .take_while(|h| session_of_block.contains_key(h))
            .count();
        let session = if shared >= 2 {
            session_of_block[&row.hash_ids[shared - 1]]
        } else {
            next_session += 1;
            next_session - 1
        };
        for h in &row.hash_ids {
            session_of_block.insert(*h, session);
        }
        let turn = turns.entry(session).or_insert(0);
        requests.push(PlannedRequest {
            id,
            arrival_ms: row.timestamp,
            session,
            turn: *turn,
            agent: 0,
            after: Vec::new(),
            think_ms: 0,
            prompt: row_prompt(row, block_tokens),
            osl: row.output_length,
        });
        *turn += 1;
    }
    Workload {
        name: "mooncake".into(),
        content_seed,
        requests,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_that_is_not_utf8_is_reported_and_the_rest_read() {
        let path = std::env::temp_dir().join(format!("trace-utf8-{}.jsonl", std::process::id()));
        let mut bytes =
            br#"{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#.to_vec();
        bytes.extend(b"\n{\"timestamp\": \xff}\n");
        bytes
            .extend(br#"{"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [1]}"#);
        bytes.extend(b"\n[1,\n");
        std::fs::write(&path, &bytes).unwrap();
        let parsed = read_trace(&path, 4).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(parsed.rows.len(), 2);
        let lines: Vec<usize> = parsed.malformed.iter().map(|m| m.line).collect();
        assert_eq!(lines, [2, 4]);
        assert!(parsed.malformed[0].reason.contains("UTF-8"), "{parsed:?}");
        // One row per line: the JSON error gives the column, not a contradicting line.
        assert!(
            parsed.malformed[1].reason.contains("at column 3")
                && !parsed.malformed[1].reason.contains("line"),
            "{parsed:?}"
        );
    }

    #[test]
    fn rows_beyond_the_bounds_are_refused_with_why() {
        let row = |timestamp: u64, input: u32| {
            format!(
                r#"{{"timestamp": {timestamp}, "input_length": {input}, "output_length": 1, "hash_ids": [{}]}}"#,
                vec!["0"; input.div_ceil(1 << 20) as usize].join(",")
            )
        };
        let text = [
            row(MAX_ROW_MS, 1),
            row(MAX_ROW_MS + 1, 1),
            row(u64::MAX, 1),
            row(0, MAX_ROW_INPUT_TOKENS),
            row(0, MAX_ROW_INPUT_TOKENS + 1),
        ]
        .join("\n");
        let parsed = parse_trace(&text, 1 << 20).unwrap();
        assert_eq!(parsed.rows.len(), 2, "{parsed:?}");
        let reasons: Vec<(usize, &str)> = parsed
            .malformed
            .iter()
            .map(|m| (m.line, m.reason.as_str()))
            .collect();
        assert_eq!(reasons.len(), 3);
        assert!(reasons[0].0 == 2 && reasons[0].1.contains("timestamp"));
        assert!(reasons[1].0 == 3 && reasons[1].1.contains("timestamp"));
        assert!(reasons[2].0 == 5 && reasons[2].1.contains("input_length"));
    }

    #[test]
    fn row_prompt_has_the_input_length_and_a_partial_tail() {
        let row = TraceRow {
            timestamp: 0,
            input_length: 1100,
            output_length: 5,
            hash_ids: vec![4, 5, 6],
        };
        let p = row_prompt(&row, 512);
        assert_eq!(p.tokens(), 1100);
        assert_eq!(
            p.segments[2],
            Segment {
                block: 6,
                tokens: 76
            }
        );
    }

    #[test]
    fn sessions_follow_shared_prefixes() {
        let text = r#"{"timestamp": 0, "input_length": 1024, "output_length": 3, "hash_ids": [0, 1]}
{"timestamp": 5, "input_length": 1024, "output_length": 3, "hash_ids": [0, 2]}
{"timestamp": 9, "input_length": 1500, "output_length": 3, "hash_ids": [0, 1, 3]}"#;
        let w = plan_trace(&parse_trace(text, 512).unwrap(), 512, 0);
        let s: Vec<_> = w.requests.iter().map(|r| (r.session, r.turn)).collect();
        assert_eq!(s, vec![(0, 0), (1, 0), (0, 1)]);
    }
}
