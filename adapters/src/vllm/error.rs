//! What can be wrong with a vLLM KV event message.

use std::fmt;

/// Why a message could not be decoded. Nothing is returned in part: a batch decodes whole or
/// not at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A KV event message has exactly 3 frames: topic, sequence number, payload.
    #[error("a vLLM KV event message has 3 frames (topic, seq, payload), got {got}")]
    FrameCount {
        /// Frames received.
        got: usize,
    },
    /// The sequence number frame is not 8 bytes.
    #[error("the sequence number frame must be 8 bytes (big-endian u64), got {got}")]
    SeqLength {
        /// Its length.
        got: usize,
    },
    /// The topic frame is not UTF-8.
    #[error("the topic frame is not UTF-8")]
    TopicNotUtf8,
    /// The payload is larger than [`super::frame::Limits::max_payload_bytes`].
    #[error("the payload has {got} bytes, more than the limit of {max}")]
    PayloadTooLarge {
        /// Its length.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// The payload is not one well-formed msgpack value.
    #[error("the payload is not msgpack: {0}")]
    NotMsgpack(MsgpackFault),
    /// Bytes follow the payload's msgpack value.
    #[error("{count} bytes follow the payload's msgpack value")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// The payload is not an array `[ts, events, data_parallel_rank?]`.
    #[error("the payload must be an array [ts, events, data_parallel_rank?], got {got}")]
    PayloadNotArray {
        /// What it is instead.
        got: Kind,
    },
    /// The payload array lacks `ts` or `events`.
    #[error("the payload array needs at least [ts, events], got {got} items")]
    PayloadTooShort {
        /// Its length.
        got: usize,
    },
    /// `ts`, `events` or `data_parallel_rank` has the wrong type.
    #[error("payload field {field} should be {expected}, got {got}")]
    PayloadField {
        /// Which field.
        field: &'static str,
        /// What it should be.
        expected: &'static str,
        /// What it is.
        got: Kind,
    },
    /// More events in one batch than [`super::frame::Limits::max_events`].
    #[error("{got} events in one batch, more than the limit of {max}")]
    TooManyEvents {
        /// How many.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// One event is malformed.
    #[error("event {index}: {error}")]
    Event {
        /// Its position in the batch.
        index: usize,
        /// What is wrong with it.
        error: EventError,
    },
}

/// What is wrong with one event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// An event is a map (vLLM 0.32) or a tag-first array (older vLLM).
    #[error("an event must be a map or an array, got {got}")]
    NotMapOrArray {
        /// What it is instead.
        got: Kind,
    },
    /// No `type` key (map form), or an empty array.
    #[error("the event has no type tag")]
    MissingType,
    /// The type tag is not a string.
    #[error("the event's type tag must be a string, got {got}")]
    TypeNotString {
        /// What it is instead.
        got: Kind,
    },
    /// A field the event type requires is absent.
    #[error("missing field {field}")]
    MissingField {
        /// Which.
        field: &'static str,
    },
    /// A map-form event names a field twice.
    #[error("field {field} appears more than once")]
    DuplicateField {
        /// Which.
        field: &'static str,
    },
    /// A field (or an item of a list field) has the wrong msgpack type.
    #[error("field {field} should be {expected}, got {got}")]
    FieldType {
        /// Which.
        field: &'static str,
        /// What it should be.
        expected: &'static str,
        /// What it is.
        got: Kind,
    },
    /// An integer field (or item) is outside the range of its type.
    #[error("field {field} is out of range for {expected}")]
    OutOfRange {
        /// Which.
        field: &'static str,
        /// The type it must fit.
        expected: &'static str,
    },
    /// A byte-string hash is empty or longer than [`super::block_hash::MAX_HASH_BYTES`].
    #[error("field {field}: a byte hash of {got} bytes (must be 1 to 64)")]
    HashBytesLength {
        /// Which.
        field: &'static str,
        /// Its length.
        got: usize,
    },
    /// A list field has more items than the limit (see [`super::frame::Limits`]).
    #[error("field {field} has {got} items, more than the limit of {max}")]
    TooMany {
        /// Which.
        field: &'static str,
        /// How many.
        got: usize,
        /// The limit.
        max: usize,
    },
}

/// Why bytes are not msgpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MsgpackFault {
    /// The input ends inside a value (a marker, a length or the data it announces).
    #[error("truncated value")]
    Truncated,
    /// Values nest deeper than [`super::frame::Limits::max_depth`].
    #[error("nested too deeply")]
    TooDeep,
}

/// A msgpack value's type, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `nil`.
    Nil,
    /// `true` / `false`.
    Bool,
    /// An integer.
    Int,
    /// A float (32 or 64 bits).
    Float,
    /// A string (UTF-8 or not).
    Str,
    /// A byte string.
    Bin,
    /// An array.
    Array,
    /// A map.
    Map,
    /// An extension value.
    Ext,
}

impl Kind {
    /// The type of `value`.
    pub(crate) fn of(value: &rmpv::ValueRef<'_>) -> Self {
        use rmpv::ValueRef as V;
        match value {
            V::Nil => Kind::Nil,
            V::Boolean(_) => Kind::Bool,
            V::Integer(_) => Kind::Int,
            V::F32(_) | V::F64(_) => Kind::Float,
            V::String(_) => Kind::Str,
            V::Binary(_) => Kind::Bin,
            V::Array(_) => Kind::Array,
            V::Map(_) => Kind::Map,
            V::Ext(..) => Kind::Ext,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Nil => "nil",
            Kind::Bool => "a boolean",
            Kind::Int => "an integer",
            Kind::Float => "a float",
            Kind::Str => "a string",
            Kind::Bin => "bytes",
            Kind::Array => "an array",
            Kind::Map => "a map",
            Kind::Ext => "an extension value",
        })
    }
}
