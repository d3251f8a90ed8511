//! One ZMQ message from vLLM's KV event PUB socket → a [`VllmBatch`].
//!
//! The message has three frames: the topic (UTF-8), the sequence number (8 bytes,
//! big-endian) and the msgpack payload `[ts, events, data_parallel_rank?]`. Every malformed
//! input is a [`DecodeError`]; nothing here panics, whatever the bytes. Unknown event types and
//! fields are not errors: they are left out and listed in [`VllmBatch::skipped`].

use rmpv::ValueRef;

use super::batch::{Skipped, VllmBatch};
use super::error::{DecodeError, Kind, MsgpackFault};
use super::event;

/// Bounds on the work and memory one message may cost. [`Limits::DEFAULT`] fits any real
/// vLLM batch with a wide margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload frame accepted. The decoded tree costs up to about
    /// `size_of::<rmpv::ValueRef>()` (32) bytes per payload byte, reached only by a payload of
    /// one-byte values (8 MiB of nils peaks at ~270 MB; a real payload of integer-heavy events
    /// costs a few bytes per byte), so this bounds memory too. Set the SUB socket's
    /// `ZMQ_MAXMSGSIZE` alike so that ZMQ drops larger messages early.
    pub max_payload_bytes: usize,
    /// Most events in one batch.
    pub max_events: usize,
    /// Most block hashes in one event.
    pub max_hashes_per_event: usize,
    /// Most token ids in one event.
    pub max_token_ids_per_event: usize,
    /// Deepest nesting of msgpack values, as counted by
    /// [`rmpv::decode::read_value_ref_with_max_depth`] (about two per level). vLLM's payloads
    /// nest 5-7 levels.
    pub max_depth: usize,
}

impl Limits {
    /// 8 MiB payloads, 100,000 events per batch, 100,000 hashes and 1,000,000 token ids per
    /// event, depth 64. vLLM publishes one batch per engine step; a 1,000-token prompt's
    /// event takes about 3.5 KB, and 1,000,000 token ids fit in 8 MiB.
    pub const DEFAULT: Limits = Limits {
        max_payload_bytes: 8 << 20,
        max_events: 100_000,
        max_hashes_per_event: 100_000,
        max_token_ids_per_event: 1_000_000,
        max_depth: 64,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Decodes one message, `[topic, seq, payload]`, with [`Limits::DEFAULT`].
///
/// # Errors
/// [`DecodeError`] for anything malformed; see [`decode_parts`].
pub fn decode_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<VllmBatch, DecodeError> {
    decode_message_with(frames, &Limits::DEFAULT)
}

/// Decodes one message, `[topic, seq, payload]`, within `limits`.
///
/// # Errors
/// [`DecodeError::FrameCount`] unless there are exactly 3 frames; otherwise see
/// [`decode_parts`].
pub fn decode_message_with<F: AsRef<[u8]>>(
    frames: &[F],
    limits: &Limits,
) -> Result<VllmBatch, DecodeError> {
    match frames {
        [topic, seq, payload] => {
            decode_parts(topic.as_ref(), seq.as_ref(), payload.as_ref(), limits)
        }
        _ => Err(DecodeError::FrameCount { got: frames.len() }),
    }
}

/// Decodes a sequence number frame: exactly 8 bytes, big-endian.
///
/// # Errors
/// [`DecodeError::SeqLength`] for any other length.
pub fn decode_seq(frame: &[u8]) -> Result<u64, DecodeError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| DecodeError::SeqLength { got: frame.len() })?;
    Ok(u64::from_be_bytes(bytes))
}

/// Decodes the three parts of a message (also used for replayed batches).
///
/// # Errors
/// [`DecodeError::TopicNotUtf8`], [`DecodeError::SeqLength`], and for the payload:
/// too large, not msgpack, trailing bytes, not `[ts, events, data_parallel_rank?]`, too many
/// events, or a malformed event ([`DecodeError::Event`]).
pub fn decode_parts(
    topic: &[u8],
    seq: &[u8],
    payload: &[u8],
    limits: &Limits,
) -> Result<VllmBatch, DecodeError> {
    let topic = std::str::from_utf8(topic).map_err(|_| DecodeError::TopicNotUtf8)?;
    let seq = decode_seq(seq)?;
    if payload.len() > limits.max_payload_bytes {
        return Err(DecodeError::PayloadTooLarge {
            got: payload.len(),
            max: limits.max_payload_bytes,
        });
    }
    let mut rest = payload;
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut rest, limits.max_depth)
        .map_err(|e| DecodeError::NotMsgpack(fault(&e)))?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes { count: rest.len() });
    }
    let mut batch = VllmBatch {
        topic: topic.to_owned(),
        seq,
        ts: 0.0,
        events: Vec::new(),
        data_parallel_rank: None,
        skipped: Vec::new(),
    };
    read_body(&value, limits, &mut batch)?;
    Ok(batch)
}

fn fault(error: &rmpv::decode::Error) -> MsgpackFault {
    match error {
        rmpv::decode::Error::DepthLimitExceeded => MsgpackFault::TooDeep,
        // Reading from a slice fails only when the slice ends too early.
        rmpv::decode::Error::InvalidMarkerRead(_) | rmpv::decode::Error::InvalidDataRead(_) => {
            MsgpackFault::Truncated
        }
    }
}

/// Fills `batch` from the payload `[ts, events, data_parallel_rank?, ...]`.
fn read_body(
    value: &ValueRef<'_>,
    limits: &Limits,
    batch: &mut VllmBatch,
) -> Result<(), DecodeError> {
    let ValueRef::Array(items) = value else {
        return Err(DecodeError::PayloadNotArray {
            got: Kind::of(value),
        });
    };
    let [ts, events, rest @ ..] = items.as_slice() else {
        return Err(DecodeError::PayloadTooShort { got: items.len() });
    };
    batch.ts = read_ts(ts)?;
    if let Some((rank, extra)) = rest.split_first() {
        batch.data_parallel_rank = read_rank(rank)?;
        if !extra.is_empty() {
            batch
                .skipped
                .push(Skipped::ExtraPayloadItems { count: extra.len() });
        }
    }
    let ValueRef::Array(events) = events else {
        return Err(DecodeError::PayloadField {
            field: "events",
            expected: "an array",
            got: Kind::of(events),
        });
    };
    if events.len() > limits.max_events {
        return Err(DecodeError::TooManyEvents {
            got: events.len(),
            max: limits.max_events,
        });
    }
    for (index, value) in events.iter().enumerate() {
        let decoded = event::decode(index, value, limits, &mut batch.skipped)
            .map_err(|error| DecodeError::Event { index, error })?;
        batch.events.extend(decoded);
    }
    Ok(())
}

/// `ts` is a float in vLLM; an integer is accepted too (an encoder may shorten whole seconds).
fn read_ts(value: &ValueRef<'_>) -> Result<f64, DecodeError> {
    match value {
        ValueRef::F64(v) => Ok(*v),
        ValueRef::F32(v) => Ok(f64::from(*v)),
        ValueRef::Integer(i) => i.as_f64().ok_or(DecodeError::PayloadField {
            field: "ts",
            expected: "a number",
            got: Kind::Int,
        }),
        other => Err(DecodeError::PayloadField {
            field: "ts",
            expected: "a number",
            got: Kind::of(other),
        }),
    }
}

fn read_rank(value: &ValueRef<'_>) -> Result<Option<i64>, DecodeError> {
    let wrong = |got| DecodeError::PayloadField {
        field: "data_parallel_rank",
        expected: "an i64 or nil",
        got,
    };
    match value {
        ValueRef::Nil => Ok(None),
        ValueRef::Integer(i) => i.as_i64().map(Some).ok_or(wrong(Kind::Int)),
        other => Err(wrong(Kind::of(other))),
    }
}
