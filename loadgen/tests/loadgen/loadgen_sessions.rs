//! Session traces: linking rules (first turns, later turns, sub-agents and the join), bad
//! rows reported by line, the form detected, and the agentic generator written as a session
//! trace and read back as the same workload.

use switchyard_loadgen::agentic::{generate_agentic, AgenticConfig};
use switchyard_loadgen::reuse::prefix_reuse;
use switchyard_loadgen::sessions::{parse_sessions, plan_sessions, session_trace_rows};
use switchyard_loadgen::trace_file::{load_trace, load_trace_text, TraceForm};
use switchyard_loadgen::Workload;

const SMALL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/session_trace_small.jsonl"
);

/// `(arrival, session, agent, turn, after, think)` of each request.
fn shape(w: &Workload) -> Vec<(u64, u64, u32, u32, Vec<usize>, u64)> {
    w.requests
        .iter()
        .map(|r| {
            (
                r.arrival_ms,
                r.session,
                r.agent,
                r.turn,
                r.after.clone(),
                r.think_ms,
            )
        })
        .collect()
}

#[test]
fn the_small_trace_links_turns_sub_agents_and_the_join() {
    let loaded = load_trace(std::path::Path::new(SMALL), None, 512, 3).unwrap();
    assert_eq!(loaded.form, TraceForm::Sessions, "detected from session_id");
    assert!(loaded.malformed.is_empty(), "{:?}", loaded.malformed);
    let w = &loaded.workload;
    // File rows 1..9 in planned-arrival order: chat-a turn 0 (0 ms), session 7 turn 0
    // (500), chat-a turn 1 (+2000), sub-agent "read" (no delay), "7" turn 1 (the same
    // session as 7, +1500), sub-agent "search" (+100), its turn 1 (+300), chat-a turn 2
    // joining both sub-agents (+800 after the later, search's), chat-a turn 3 (+1000).
    assert_eq!(
        shape(w),
        vec![
            (0, 0, 0, 0, vec![], 0),
            (500, 1, 0, 0, vec![], 0),
            (2000, 0, 0, 1, vec![0], 2000),
            (2000, 0, 1, 0, vec![2], 0),
            (2000, 1, 0, 1, vec![1], 1500),
            (2100, 0, 2, 0, vec![2], 100),
            (2400, 0, 2, 1, vec![5], 300),
            (3200, 0, 0, 2, vec![3, 6], 800),
            (4200, 0, 0, 3, vec![7], 1000),
        ]
    );
    assert_eq!(w.requests[7].isl(), 2300);
    assert_eq!(w.requests[7].osl, 90);
    let blocks: Vec<u64> = w.requests[7]
        .prompt
        .segments
        .iter()
        .map(|s| s.block)
        .collect();
    assert_eq!(blocks, vec![0, 1, 2, 3, 4]);
    assert_eq!(w.content_seed, 3);
}

#[test]
fn bad_rows_are_reported_by_line_and_do_not_change_the_sessions() {
    let rows = [
        /* 1 */
        r#"{"session_id": "a", "timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 2 */
        r#"{"session_id": "b", "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 3 */
        r#"{"session_id": "c", "timestamp": 0, "delay": 5, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 4 */
        r#"{"session_id": "a", "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 5 */
        r#"{"session_id": "a", "timestamp": 9, "delay": 1, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 6 */
        r#"{"session_id": "s", "parent_session_id": "nobody", "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 7 */
        r#"{"session_id": "s", "parent_session_id": "s", "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 8 */
        r#"{"session_id": "s", "parent_session_id": "a", "timestamp": 3, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 9 */
        r#"{"session_id": "s", "parent_session_id": "a", "delay": 7, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 10 */
        r#"{"session_id": "s", "parent_session_id": "b", "delay": 1, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 11 */
        r#"{"session_id": "a", "delay": 4, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 12 */
        r#"{"session_id": "s", "delay": 1, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 13 */
        r#"{"session_id": "t", "parent_session_id": "s", "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 14 */
        r#"{"session_id": "a", "delay": 1, "input_length": 600, "output_length": 2, "hash_ids": [0]}"#,
        /* 15 */
        r#"{"session_id": true, "timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 16 */ r#"not json"#,
        /* 17 */
        r#"{"session_id": "a", "delay": 2, "input_length": 10, "output_length": 0, "hash_ids": [0]}"#,
        /* 18: serde would read this array field by field as a valid first turn */
        r#"["z", null, 0, null, 10, 2, [0]]"#,
        /* 19: the field is named, not only a column */
        r#"{"session_id": "a", "delay": -5, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
        /* 20: a blank name is no session */
        r#"{"session_id": "", "timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#,
    ];
    let text = rows.join("\n");
    let parsed = parse_sessions(&text, 512);
    let bad: Vec<usize> = parsed.malformed.iter().map(|m| m.line).collect();
    assert_eq!(
        bad,
        vec![2, 3, 4, 5, 6, 7, 8, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    );
    assert_eq!(parsed.lines, vec![1, 9, 11]);
    let reason = |line: usize| {
        parsed
            .malformed
            .iter()
            .find(|m| m.line == line)
            .map(|m| m.reason.clone())
            .unwrap()
    };
    for (line, words) in [
        (2, "needs a timestamp"),
        (3, "not a delay"),
        (4, "needs a delay"),
        (5, "not a timestamp"),
        (6, "has no turn above this line"),
        (7, "names itself"),
        (8, "not a timestamp"),
        (10, "this row names parent"),
        (12, "after its parent resumed at line 11"),
        (13, "already returned to its own parent at line 11"),
        (14, "needs 2 blocks"),
        (15, "session id"),
        (16, "expected"),
        (17, "output_length is 0"),
        (18, "expected a JSON object, found an array"),
        (19, "delay: invalid value: integer `-5`"),
        (20, "session_id: invalid value: string \"\""),
    ] {
        assert!(
            reason(line).contains(words),
            "line {line}: {}",
            reason(line)
        );
    }
    // Line 11 joins the sub-agent of line 9 (its only spawn), with its own delay.
    let w = plan_sessions(&parsed, 0);
    assert_eq!(
        shape(&w),
        vec![
            (0, 0, 0, 0, vec![], 0),
            (7, 0, 1, 0, vec![0], 7),
            (11, 0, 0, 1, vec![1], 4)
        ]
    );
}

/// A sub-agent that spawned its own sub-agent and never joined it finishes when that one
/// does: the root's next turn waits for the grandchild, which has returned with it. Before,
/// the join waited for the child's turn alone, so the root resumed while the grandchild still
/// ran, and the grandchild could take turns and spawn after its root had resumed.
#[test]
fn a_join_waits_for_sub_agents_of_sub_agents() {
    let row = |rest: &str| {
        format!(r#"{{{rest}, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}}"#)
    };
    let rows = [
        /* 1 */ row(r#""session_id": "P", "timestamp": 0"#),
        /* 2 */ row(r#""session_id": "S", "parent_session_id": "P", "delay": 1"#),
        /* 3 */ row(r#""session_id": "T", "parent_session_id": "S", "delay": 1"#),
        /* 4 */ row(r#""session_id": "T", "delay": 1"#),
        /* 5 */ row(r#""session_id": "P", "delay": 1"#),
        /* 6 */ row(r#""session_id": "T", "delay": 1"#),
        /* 7 */ row(r#""session_id": "U", "parent_session_id": "T", "delay": 1"#),
        /* 8 */ row(r#""session_id": "S", "delay": 1"#),
    ];
    let parsed = parse_sessions(&rows.join("\n"), 512);
    assert_eq!(parsed.lines, vec![1, 2, 3, 4, 5]);
    let bad: Vec<usize> = parsed.malformed.iter().map(|m| m.line).collect();
    assert_eq!(bad, vec![6, 7, 8], "{:?}", parsed.malformed);
    assert!(
        parsed.malformed[0]
            .reason
            .contains("after its parent resumed at line 5"),
        "{:?}",
        parsed.malformed[0]
    );
    // P's second turn (file row 5, turn 4) waits for T's latest turn (turn 3), not S's.
    assert_eq!(parsed.turns[4].after, vec![3]);
}

#[test]
fn a_forced_form_overrides_detection() {
    let text = std::fs::read_to_string(SMALL).unwrap();
    let as_mooncake = load_trace_text(&text, Some(TraceForm::Mooncake), 512, 0).unwrap();
    assert_eq!(as_mooncake.form, TraceForm::Mooncake);
    // Only the two first turns have a timestamp; the Mooncake reader rejects the rest.
    assert_eq!(as_mooncake.workload.requests.len(), 2);
    assert_eq!(as_mooncake.malformed.len(), 7);
    let mooncake_row =
        r#"{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}"#;
    let forced = load_trace_text(mooncake_row, Some(TraceForm::Sessions), 512, 0).unwrap();
    assert!(
        forced.malformed[0].reason.contains("session_id"),
        "{:?}",
        forced.malformed
    );
}

fn small_agentic(seed: u64) -> Workload {
    let config = AgenticConfig {
        sessions: 6,
        turns: 12,
        session_rate_per_s: 1.0,
        initial_context_tokens: (2_000, 40_000),
        // Sub-agents in most sessions, so the join is exercised.
        subagent_probability: 0.3,
        ..AgenticConfig::default()
    };
    generate_agentic(&config, seed).unwrap()
}

#[test]
fn the_agentic_workload_written_as_a_session_trace_reads_back_the_same() {
    for (seed, block) in [(1, 512), (7, 64)] {
        let original = small_agentic(seed);
        assert!(original.requests.iter().any(|r| r.agent > 0), "sub-agents");
        assert!(original.requests.iter().any(|r| r.after.len() > 1), "joins");
        let rows = session_trace_rows(&original, block).unwrap();
        let text: String = rows
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        let loaded = load_trace_text(&text, None, block, seed).unwrap();
        assert!(loaded.malformed.is_empty(), "{:?}", loaded.malformed);
        let replayed = loaded.workload;
        // Same requests: timing, dependencies, think times, sessions, agents, turns.
        assert_eq!(shape(&replayed), shape(&original), "seed {seed}");
        for (a, b) in original.requests.iter().zip(&replayed.requests) {
            assert_eq!((a.isl(), a.osl), (b.isl(), b.osl), "request {}", a.id);
        }
        // Same prompts as hash ids: the replayed prompts are the written hash ids...
        for (row, r) in rows.iter().zip(&replayed.requests) {
            let ids: Vec<u64> = r.prompt.segments.iter().map(|s| s.block).collect();
            assert_eq!(ids, row.hash_ids);
        }
        // ...and writing the replayed workload gives the same file.
        assert_eq!(session_trace_rows(&replayed, block).unwrap(), rows);
        // Whole-block sharing is kept: reuse within a block per prompt of the original's.
        let (before, after) = (prefix_reuse(&original, 16), prefix_reuse(&replayed, 16));
        let slack =
            original.requests.len() as f64 * f64::from(block) / before.input_tokens.max(1) as f64;
        assert!(
            after.share <= before.share + 1e-9 && after.share >= before.share - slack,
            "seed {seed}: reuse {} → {}",
            before.share,
            after.share
        );
    }
}

#[test]
fn an_open_loop_workload_is_refused_by_the_writer() {
    let text = r#"{"timestamp": 0, "input_length": 1024, "output_length": 3, "hash_ids": [0, 1]}
{"timestamp": 5, "input_length": 1500, "output_length": 3, "hash_ids": [0, 1, 3]}"#;
    let w = load_trace_text(text, None, 512, 0).unwrap().workload;
    // The second row continues the first one's inferred session but waits for nothing.
    let e = session_trace_rows(&w, 512).unwrap_err().to_string();
    assert!(
        e.contains("request 1 (0)") && e.contains("cannot be expressed"),
        "{e}"
    );
}
