//! Mooncake trace parsing and planning.

use switchyard_loadgen::reuse::prefix_reuse;
use switchyard_loadgen::trace::{parse_trace, plan_trace, read_trace, TraceError};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/mooncake_conversation_trace.jsonl"
);

#[test]
fn malformed_lines_are_reported_with_their_line_numbers() {
    let text = r#"{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
not json

{"timestamp": 3, "input_length": 600, "output_length": 5}
{"timestamp": 4, "input_length": 600, "output_length": 5, "hash_ids": [1]}
{"timestamp": 5, "input_length": 600, "output_length": 0, "hash_ids": [1, 2]}
{"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 9, "input_length": 100, "output_length": 7, "hash_ids": [1], "extra": true}
[10, 100, 7, [1]]"#;
    let parsed = parse_trace(text, 512).unwrap();
    assert_eq!(parsed.rows.len(), 2, "first and last rows are usable");
    let lines: Vec<usize> = parsed.malformed.iter().map(|m| m.line).collect();
    assert_eq!(
        lines,
        vec![2, 4, 5, 6, 7, 9],
        "blank line 3 is skipped silently"
    );
    let reasons: Vec<&str> = parsed.malformed.iter().map(|m| m.reason.as_str()).collect();
    assert!(reasons[1].contains("hash_ids"), "{}", reasons[1]);
    assert!(reasons[2].contains("needs 2 blocks"), "{}", reasons[2]);
    assert!(reasons[3].contains("output_length"), "{}", reasons[3]);
    // A row written as an array is not read field by field, though serde would take it so.
    assert_eq!(reasons[5], "expected a JSON object, found an array");
}

#[test]
fn a_missing_file_and_a_zero_block_size_are_errors() {
    let err = read_trace(std::path::Path::new("/nonexistent/trace.jsonl"), 512).unwrap_err();
    assert!(matches!(err, TraceError::Read { .. }));
    assert!(err.to_string().contains("/nonexistent/trace.jsonl"));
    assert!(matches!(parse_trace("", 0), Err(TraceError::ZeroBlockSize)));
}

#[test]
fn the_mooncake_conversation_trace_plans_with_its_lengths_and_reuse() {
    let parsed = read_trace(std::path::Path::new(TRACE), 512)
        .expect("the Mooncake trace in data/ (docs/loadgen.md, \"Mooncake traces\")");
    assert_eq!(parsed.rows.len(), 12_031);
    assert!(parsed.malformed.is_empty());
    let workload = plan_trace(&parsed, 512, 0);
    assert_eq!(workload.requests.len(), 12_031);
    for (r, row) in workload.requests.iter().zip(&parsed.rows) {
        // The trace is sorted by timestamp, so planning keeps file order.
        assert_eq!(r.isl(), u64::from(row.input_length));
        assert_eq!(r.osl, row.output_length);
        assert_eq!(r.arrival_ms, row.timestamp);
        assert!(r.after.is_empty(), "trace replay is open loop");
    }
    // data/README.md and docs/loadgen.md: with an unlimited cache about 37 % of input tokens are
    // reusable.
    let reuse = prefix_reuse(&workload, 512);
    assert!((0.36..0.39).contains(&reuse.share), "{}", reuse.share);
    // Inferred multi-turn sessions: many conversations continue, most requests start one.
    let follow_ups = workload.requests.iter().filter(|r| r.turn > 0).count();
    assert!(
        follow_ups > 1_000 && follow_ups < 12_031 / 2,
        "{follow_ups}"
    );
}
