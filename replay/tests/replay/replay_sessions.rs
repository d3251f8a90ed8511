//! Session traces in virtual time: every turn is sent no earlier than what it waits for
//! completed plus its delay (a later turn after its session's previous turn, a sub-agent after
//! its parent's turn, a joining turn after every sub-agent it joins), in every mode; a
//! workload written as a session trace replays with the same closed-loop structure.

use switchyard_loadgen::agentic::{generate_agentic, AgenticConfig};
use switchyard_loadgen::sessions::session_trace_rows;
use switchyard_loadgen::trace_file::{load_trace, load_trace_text};
use switchyard_loadgen::Workload;
use switchyard_replay::{run_mode, PromptSource, StackSpec};
use switchyard_router::config::ServingMode;

const SMALL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/session_trace_small.jsonl"
);

/// Replays `workload` in `mode` and checks the closed loop on its records; returns how many
/// dependent turns were checked.
fn assert_closed_loop(workload: &Workload, mode: ServingMode) -> usize {
    let source = PromptSource::synthetic(workload.content_seed);
    let prefill = if mode == ServingMode::Agg { 0 } else { 1 };
    let run = run_mode(workload, &source, StackSpec::new(mode, 3, prefill)).unwrap();
    assert_eq!(run.records.len(), workload.requests.len());
    assert!(
        run.records.iter().all(|r| r.ok()),
        "{mode:?}: every turn completes"
    );
    let mut checked = 0;
    for r in &workload.requests {
        let sent = run.records[r.id].sent_ms;
        if r.after.is_empty() {
            assert_eq!(
                sent, r.arrival_ms as f64,
                "{mode:?}: first turn {} at its timestamp",
                r.id
            );
            continue;
        }
        let latest = r
            .after
            .iter()
            .map(|&d| run.records[d].done_ms().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        let due = latest + r.think_ms as f64;
        assert!(
            (sent - due).abs() < 1e-6,
            "{mode:?}: request {} sent at {sent}, due at {due} (dependencies {:?} + {} ms)",
            r.id,
            r.after,
            r.think_ms
        );
        checked += 1;
    }
    checked
}

#[test]
fn the_small_session_trace_is_replayed_closed_loop_in_every_mode() {
    let loaded = load_trace(std::path::Path::new(SMALL), None, 512, 0).unwrap();
    for mode in [
        ServingMode::Agg,
        ServingMode::Disagg,
        ServingMode::Conditional,
    ] {
        assert_eq!(assert_closed_loop(&loaded.workload, mode), 7);
    }
    // The join (chat-a's third turn) waits for both sub-agents, so it goes after the later.
    let join = &loaded.workload.requests[7];
    assert_eq!(join.after, vec![3, 6]);
}

#[test]
fn an_agentic_workload_written_as_a_trace_replays_closed_loop() {
    let config = AgenticConfig {
        sessions: 4,
        turns: 6,
        session_rate_per_s: 2.0,
        initial_context_tokens: (2_000, 20_000),
        subagent_probability: 0.5,
        ..AgenticConfig::default()
    };
    let original = generate_agentic(&config, 11).unwrap();
    let rows = session_trace_rows(&original, 64).unwrap();
    let text: String = rows
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    let replayed = load_trace_text(&text, None, 64, 11).unwrap().workload;
    assert!(replayed.requests.iter().any(|r| r.agent > 0 && r.turn == 0));
    assert!(replayed.requests.iter().any(|r| r.after.len() > 1));
    let checked = assert_closed_loop(&replayed, ServingMode::Conditional);
    assert_eq!(
        checked,
        replayed
            .requests
            .iter()
            .filter(|r| !r.after.is_empty())
            .count()
    );
}
