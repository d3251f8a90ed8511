//! A trace file of either form, read into a workload: Mooncake rows (open loop, each at its
//! timestamp, [`crate::trace`]) or session rows (closed loop, [`crate::sessions`]). The form
//! is given, or detected: a `session_id` field in any row that is a JSON object makes the
//! file a session trace.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use super::sessions::{parse_sessions, plan_sessions};
use super::trace::{
    merge_by_line, parse_trace, plan_trace, read_trace_text, MalformedLine, TraceError,
};
use super::{ArrivalScale, Workload};

/// The two trace forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TraceForm {
    /// Mooncake rows: `timestamp`, lengths, `hash_ids`; open loop.
    Mooncake,
    /// Session rows: `session_id`, `timestamp` or `delay`, optional `parent_session_id`,
    /// lengths, `hash_ids`; closed loop.
    Sessions,
}

impl fmt::Display for TraceForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceForm::Mooncake => "mooncake",
            TraceForm::Sessions => "sessions",
        })
    }
}

/// A trace read into a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedTrace {
    /// The form it was read as.
    pub form: TraceForm,
    /// One request per usable row.
    pub workload: Workload,
    /// Unusable lines, with their line numbers and why (the caller reports and counts them).
    pub malformed: Vec<MalformedLine>,
}

/// The form of `text`: [`TraceForm::Sessions`] if any of its JSON-object rows has a
/// `session_id` field, else [`TraceForm::Mooncake`] (also when no row parses: the Mooncake
/// reader then reports every line). Not the first row alone: a session trace whose first row
/// lost its `session_id` was read as a Mooncake trace, every other row refused for its missing
/// `timestamp`. Not the first 100 rows either: session rows after them were read as Mooncake
/// rows, a first turn silently as an open-loop request.
pub fn detect_form(text: &str) -> TraceForm {
    let sessions = text
        .lines()
        // Only a line naming the field can have it: a long Mooncake trace is not parsed twice.
        .filter(|line| line.contains("session_id"))
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .any(|value| {
            value
                .as_object()
                .is_some_and(|row| row.contains_key("session_id"))
        });
    if sessions {
        TraceForm::Sessions
    } else {
        TraceForm::Mooncake
    }
}

/// Reads trace text as `form` (`None`: detected).
///
/// # Errors
/// [`TraceError::ZeroBlockSize`] if `block_tokens` is 0.
pub fn load_trace_text(
    text: &str,
    form: Option<TraceForm>,
    block_tokens: u32,
    content_seed: u64,
) -> Result<LoadedTrace, TraceError> {
    if block_tokens == 0 {
        return Err(TraceError::ZeroBlockSize);
    }
    // A byte-order mark (editors on Windows write one) is not part of the first row.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let form = form.unwrap_or_else(|| detect_form(text));
    let (mut workload, malformed) = match form {
        TraceForm::Mooncake => {
            let parsed = parse_trace(text, block_tokens)?;
            (
                plan_trace(&parsed, block_tokens, content_seed),
                parsed.malformed,
            )
        }
        TraceForm::Sessions => {
            let parsed = parse_sessions(text, block_tokens);
            (plan_sessions(&parsed, content_seed), parsed.malformed)
        }
    };
    workload.start_at_zero();
    workload
        .check_span(ArrivalScale::PLANNED)
        .map_err(TraceError::Span)?;
    Ok(LoadedTrace {
        form,
        workload,
        malformed,
    })
}

/// Reads the trace file at `path` as `form` (`None`: detected).
///
/// # Errors
/// [`TraceError::Read`] if the file cannot be read, [`TraceError::ZeroBlockSize`].
pub fn load_trace(
    path: &Path,
    form: Option<TraceForm>,
    block_tokens: u32,
    content_seed: u64,
) -> Result<LoadedTrace, TraceError> {
    let (text, not_utf8) = read_trace_text(path)?;
    let mut loaded = load_trace_text(&text, form, block_tokens, content_seed)?;
    loaded.malformed = merge_by_line(not_utf8, loaded.malformed);
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_that_add_up_beyond_the_bound_are_refused() {
        let delay = crate::trace::MAX_ROW_MS / 2 + 1;
        let row = |first: bool| {
            if first {
                r#"{"session_id": "a", "timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#.to_string()
            } else {
                format!(
                    r#"{{"session_id": "a", "delay": {delay}, "input_length": 3, "output_length": 1, "hash_ids": [0]}}"#
                )
            }
        };
        let two = [row(true), row(false)].join("\n");
        assert!(
            load_trace_text(&two, None, 4, 0).is_ok(),
            "one delay is within"
        );
        let three = [row(true), row(false), row(false)].join("\n");
        let e = load_trace_text(&three, None, 4, 0).unwrap_err();
        assert!(matches!(e, TraceError::Span(_)), "{e}");
    }

    /// A session trace plans the same arrivals whatever its first timestamp: Unix
    /// milliseconds or an offset shift the whole trace, later turns included. Before, the
    /// turns after a session's first kept arrivals planned from the unshifted timestamps,
    /// and every send waited for them (a 10 s offset held each later turn 10 s back).
    #[test]
    fn a_session_traces_first_timestamp_moves_every_turn() {
        let trace = |origin: u64| {
            let row = |session: &str, time: &str| {
                format!(
                    r#"{{"session_id": "{session}", {time}, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}}"#
                )
            };
            [
                row("a", &format!(r#""timestamp": {origin}"#)),
                row("a", r#""delay": 1000"#),
                row("b", &format!(r#""timestamp": {}"#, origin + 2000)),
                row("b", r#""delay": 500"#),
            ]
            .join("\n")
        };
        let from_zero = load_trace_text(&trace(0), None, 512, 0).unwrap().workload;
        let arrivals: Vec<u64> = from_zero.requests.iter().map(|r| r.arrival_ms).collect();
        assert_eq!(arrivals, [0, 1000, 2000, 2500]);
        for origin in [10_000, 1_765_000_000_000] {
            let loaded = load_trace_text(&trace(origin), None, 512, 0)
                .unwrap()
                .workload;
            assert_eq!(
                loaded.requests, from_zero.requests,
                "first timestamp {origin}"
            );
            assert_eq!(loaded.span_warning(), None, "first timestamp {origin}");
        }
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_row() {
        let rows = concat!(
            "\u{feff}",
            r#"{"session_id": "a", "timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#,
            "\n",
            r#"{"session_id": "a", "delay": 5, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#,
        );
        let loaded = load_trace_text(rows, None, 4, 0).unwrap();
        assert_eq!(loaded.form, TraceForm::Sessions);
        assert_eq!(
            (loaded.workload.requests.len(), loaded.malformed.len()),
            (2, 0)
        );
        let mooncake = concat!(
            "\u{feff}",
            r#"{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#
        );
        let loaded = load_trace_text(mooncake, None, 4, 0).unwrap();
        assert_eq!(
            (loaded.workload.requests.len(), loaded.malformed.len()),
            (1, 0)
        );
    }

    #[test]
    fn a_session_row_anywhere_makes_a_session_trace() {
        let mooncake =
            r#"{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#;
        let session = r#"{"session_id": "a", "timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#;
        let late = format!("{}{session}\n", format!("{mooncake}\n").repeat(150));
        assert_eq!(detect_form(&late), TraceForm::Sessions);
        // Then the Mooncake rows are the ones reported, not the session row taken silently.
        let loaded = load_trace_text(&late, None, 512, 0).unwrap();
        assert_eq!(
            (loaded.workload.requests.len(), loaded.malformed.len()),
            (1, 150)
        );
        // A value that merely mentions the name is no session row.
        let mentions = r#"{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0], "note": "session_id"}"#;
        assert_eq!(detect_form(mentions), TraceForm::Mooncake);
    }

    #[test]
    fn the_first_object_row_decides_the_form() {
        let mooncake =
            r#"{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#;
        let session = r#"{"session_id": "a", "timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#;
        assert_eq!(detect_form(mooncake), TraceForm::Mooncake);
        assert_eq!(
            detect_form(&format!("not json\n\n[1]\n{session}\n{mooncake}")),
            TraceForm::Sessions
        );
        assert_eq!(detect_form("garbage"), TraceForm::Mooncake);
        // A session trace whose first row lost its session_id is still one: that row is
        // the one reported.
        let loaded = load_trace_text(&format!("{mooncake}\n{session}"), None, 512, 0).unwrap();
        assert_eq!(loaded.form, TraceForm::Sessions);
        assert_eq!(loaded.malformed.len(), 1);
        assert_eq!(loaded.malformed[0].line, 1);
        assert!(
            loaded.malformed[0].reason.contains("session_id"),
            "{:?}",
            loaded.malformed[0]
        );
        let forced = load_trace_text(session, Some(TraceForm::Mooncake), 512, 0).unwrap();
        assert_eq!(forced.form, TraceForm::Mooncake);
        assert_eq!(
            forced.workload.requests.len(),
            1,
            "extra fields are ignored"
        );
        let auto = load_trace_text(session, None, 512, 0).unwrap();
        assert_eq!(
            (auto.form, auto.workload.name.as_str()),
            (TraceForm::Sessions, "sessions")
        );
        assert!(load_trace_text(session, None, 0, 0).is_err());
    }

    #[test]
    fn arrivals_are_measured_from_the_earliest_row() {
        // Unix-epoch milliseconds: the replay starts at once, not in 56 years.
        let epoch = r#"{"timestamp": 1765000001000, "input_length": 3, "output_length": 1, "hash_ids": [1]}
{"timestamp": 1765000000000, "input_length": 3, "output_length": 1, "hash_ids": [0]}"#;
        let arrivals = |text: &str| -> Vec<u64> {
            load_trace_text(text, None, 512, 0)
                .unwrap()
                .workload
                .requests
                .iter()
                .map(|r| r.arrival_ms)
                .collect()
        };
        assert_eq!(arrivals(epoch), [0, 1_000]);
        let sessions = r#"{"session_id": "a", "timestamp": 1765000000500, "input_length": 3, "output_length": 1, "hash_ids": [0]}
{"session_id": "b", "timestamp": 1765000000000, "input_length": 3, "output_length": 1, "hash_ids": [1]}
{"session_id": "a", "delay": 200, "input_length": 3, "output_length": 1, "hash_ids": [0, 2]}"#;
        let planned = load_trace_text(sessions, None, 512, 0).unwrap().workload;
        let roots: Vec<u64> = planned
            .requests
            .iter()
            .filter(|r| r.after.is_empty())
            .map(|r| r.arrival_ms)
            .collect();
        assert_eq!(roots, [0, 500], "session starts keep their spacing");
    }
}
