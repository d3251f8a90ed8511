//! What can be wrong with a `POST /kv_cache_events` answer.

/// Why an answer could not be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Larger than [`super::decode::Limits::max_body_bytes`].
    #[error("the answer has {got} bytes, more than the limit of {max}")]
    TooLarge {
        /// Its length.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// Not JSON (or nested deeper than the JSON reader allows).
    #[error("the answer is not JSON: {0}")]
    NotJson(String),
    /// JSON, but not a list of events.
    #[error("the answer must be a JSON list of events, got {0}")]
    NotAList(&'static str),
    /// More events than [`super::decode::Limits::max_events`].
    #[error("{got} events in one answer, more than the limit of {max}")]
    TooManyEvents {
        /// How many.
        got: usize,
        /// The limit.
        max: usize,
    },
}

/// Why one event could not be read; the other events of the answer still are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The event is not a JSON object.
    #[error("an event must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    /// A field the event needs is absent.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A field has the wrong type or an impossible value.
    #[error("field {field} should be {expected}")]
    Field {
        /// Which field.
        field: &'static str,
        /// What it should be.
        expected: &'static str,
    },
    /// A list is longer than the [`super::decode::Limits`] allow.
    #[error("field {field} has {got} items, more than the limit of {max}")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// How many items.
        got: usize,
        /// The limit.
        max: usize,
    },
}
