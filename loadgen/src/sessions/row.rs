//! One row of a session trace, read on its own: its fields and the checks that need no other
//! row (lengths against hash ids, as for a Mooncake row). Which of `timestamp`, `delay` and
//! `parent_session_id` a row may carry depends on the rows before it; [`super::link`] checks
//! that.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::trace::{check_row, parse_row_object, TraceRow, MAX_ROW_MS};

/// A session's name in the file: a string, or a non-negative integer read as its decimal
/// text (so `7` and `"7"` name the same session).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub String);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for SessionId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SessionId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = SessionId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a session id (a non-empty string or a non-negative integer)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SessionId, E> {
                // An empty name is a field left blank, not a session.
                if v.is_empty() {
                    return Err(E::invalid_value(de::Unexpected::Str(v), &self));
                }
                Ok(SessionId(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SessionId, E> {
                Ok(SessionId(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SessionId, E> {
                u64::try_from(v)
                    .map(|v| SessionId(v.to_string()))
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
        }
        deserializer.deserialize_any(IdVisitor)
    }
}

/// One row: `{"session_id", "timestamp" | "delay", "parent_session_id"?, "input_length",
/// "output_length", "hash_ids"}`; other fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    /// The session (conversation or agent) this turn belongs to.
    pub session_id: SessionId,
    /// On a sub-agent's first turn: the session that spawned it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<SessionId>,
    /// A session's first turn: its send time, ms from the start of the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    /// Any other turn: ms between the completion of what it waits for and its send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<u64>,
    /// Prompt tokens.
    pub input_length: u32,
    /// Generated tokens.
    pub output_length: u32,
    /// One id per block of the prompt, in order (a Mooncake row's hash ids).
    pub hash_ids: Vec<u64>,
}

impl SessionRow {
    /// The row's prompt and output as a Mooncake row (for the shared length checks and
    /// prompt layout).
    pub fn as_trace_row(&self) -> TraceRow {
        TraceRow {
            timestamp: self.timestamp.unwrap_or(0),
            input_length: self.input_length,
            output_length: self.output_length,
            hash_ids: self.hash_ids.clone(),
        }
    }
}

/// Reads one line; the error says why it is unusable.
pub fn parse_row(line: &str, block_tokens: u32) -> Result<SessionRow, String> {
    let row: SessionRow = parse_row_object(line)?;
    check_row(&row.as_trace_row(), block_tokens)?;
    if let Some(delay) = row.delay.filter(|&d| d > MAX_ROW_MS) {
        return Err(format!("delay {delay} is above {MAX_ROW_MS} ms"));
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_beyond_the_bound_is_refused() {
        let row = |delay: u64| {
            format!(
                r#"{{"session_id": "a", "delay": {delay}, "input_length": 3, "output_length": 1, "hash_ids": [0]}}"#
            )
        };
        assert!(parse_row(&row(MAX_ROW_MS), 512).is_ok());
        let e = parse_row(&row(u64::MAX), 512).unwrap_err();
        assert!(e.contains("delay"), "{e}");
    }

    #[test]
    fn ids_are_strings_or_non_negative_integers() {
        let row = parse_row(
            r#"{"session_id": 7, "timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [0], "x": null}"#,
            512,
        )
        .unwrap();
        assert_eq!(row.session_id, SessionId("7".into()));
        let text = r#"{"session_id": "7", "delay": 1, "parent_session_id": "a", "input_length": 3, "output_length": 1, "hash_ids": [0]}"#;
        let row = parse_row(text, 512).unwrap();
        assert_eq!(row.session_id, SessionId("7".into()));
        assert_eq!(row.parent_session_id, Some(SessionId("a".into())));
        for bad in ["-1", "1.5", "true", "null", "[1]"] {
            let text = format!(
                r#"{{"session_id": {bad}, "timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}}"#
            );
            let e = parse_row(&text, 512).unwrap_err();
            assert!(e.contains("session id"), "{bad}: {e}");
        }
        let e = parse_row(
            r#"{"session_id": "a", "timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}"#,
            512,
        )
        .unwrap_err();
        assert!(e.contains("needs 2 blocks"), "{e}");
    }

    #[test]
    fn writing_leaves_absent_fields_out() {
        let row = SessionRow {
            session_id: SessionId("s".into()),
            parent_session_id: None,
            timestamp: None,
            delay: Some(4),
            input_length: 3,
            output_length: 1,
            hash_ids: vec![9],
        };
        assert_eq!(
            serde_json::to_string(&row).unwrap(),
            r#"{"session_id":"s","delay":4,"input_length":3,"output_length":1,"hash_ids":[9]}"#
        );
    }
}
