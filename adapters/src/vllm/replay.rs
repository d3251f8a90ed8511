//! vLLM's replay protocol, on the ROUTER socket it binds at `replay_endpoint`: ask for every
//! buffered batch from a sequence number on (vLLM keeps the last `buffer_steps` batches).
//!
//! # Frames on the wire
//! vLLM's ROUTER expects `[client identity, b"", start_seq]` (`start_seq`: 8 bytes, big-endian)
//! and answers, per buffered batch with `seq >= start_seq`, `[identity, b"", topic, seq,
//! payload]`, then the end marker `[identity, b"", b"", 0xffffffffffffffff, b""]`. The ROUTER
//! adds and strips the identity frame itself; the empty delimiter frame is the client's job:
//! - a **DEALER** client (use this) adds nothing: it sends the two frames
//!   `[b"", start_seq]` that [`encode_request`] builds, and receives each answer as
//!   `[b"", topic, seq, payload]` or the end marker `[b"", b"", 0xff × 8, b""]`, which
//!   [`decode_reply`] reads;
//! - a **REQ** client adds the empty delimiter itself, so it sends the single frame
//!   `[start_seq]` ([`request_seq_frame`]) and strips the delimiter from what it receives. But
//!   REQ allows exactly one reply per request, and a replay answers with many messages: a REQ
//!   client sees only the first batch. Do not use REQ.
//!
//! vLLM sends what its buffer still holds: if the first batch's `seq` is above `start_seq`,
//! the batches in between are gone, and the worker's state cannot be rebuilt from events
//! (reset its mapper and index; see [`super::mapper::HashMapper::reset`]).
//!
//! Older vLLM answered without the topic frame (`[b"", seq, payload]`, end `[b"", 0xff × 8,
//! b""]`); [`decode_reply`] accepts that form too, with an empty topic.
//!
//! The server half ([`decode_request`], [`encode_reply_batch`], [`encode_reply_end`]) is here
//! so that a stand-in vLLM in tests speaks exactly the same frames.

use super::batch::VllmBatch;
use super::encode::encode_seq;
use super::error::DecodeError;
use super::frame::{self, Limits};

/// The sequence number of the end marker (vLLM's `END_SEQ`, `-1` as a signed 64-bit number).
pub const END_SEQ: u64 = u64::MAX;

/// One message a replay client receives.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayFrame {
    /// A buffered batch.
    Batch(VllmBatch),
    /// Nothing more for this request.
    End,
}

/// What is wrong with a replay message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// A reply has 4 frames (3 from older vLLM); a request, as the ROUTER passes it on
    /// without the identity, 2.
    #[error("unexpected number of frames: {got}")]
    FrameCount {
        /// Frames received.
        got: usize,
    },
    /// The first frame must be the empty delimiter.
    #[error("the first frame must be the empty delimiter, got {got} bytes")]
    MissingDelimiter {
        /// Its length.
        got: usize,
    },
    /// An end marker (sequence number [`END_SEQ`]) that carries a topic or a payload.
    #[error("an end marker must have an empty topic and payload")]
    EndNotEmpty,
    /// The batch itself is malformed (or the sequence number frame is not 8 bytes).
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// The frames a DEALER client sends to ask for every buffered batch from `start_seq` on.
pub fn encode_request(start_seq: u64) -> [Vec<u8>; 2] {
    [Vec::new(), request_seq_frame(start_seq).to_vec()]
}

/// The one frame a REQ client would send (its socket adds the delimiter); see the module docs
/// for why REQ is the wrong socket.
pub fn request_seq_frame(start_seq: u64) -> [u8; 8] {
    encode_seq(start_seq)
}

/// Reads one message received by a DEALER client, with [`Limits::DEFAULT`].
///
/// # Errors
/// See [`decode_reply_with`].
pub fn decode_reply<F: AsRef<[u8]>>(frames: &[F]) -> Result<ReplayFrame, ReplayError> {
    decode_reply_with(frames, &Limits::DEFAULT)
}

/// Reads one message received by a DEALER client: `[b"", topic, seq, payload]`, the end
/// marker, or the older forms without the topic frame.
///
/// # Errors
/// [`ReplayError::FrameCount`] unless 3 or 4 frames, [`ReplayError::MissingDelimiter`],
/// [`ReplayError::EndNotEmpty`], or the batch's [`DecodeError`].
pub fn decode_reply_with<F: AsRef<[u8]>>(
    frames: &[F],
    limits: &Limits,
) -> Result<ReplayFrame, ReplayError> {
    let (delimiter, topic, seq, payload) = match frames {
        [d, t, s, p] => (d.as_ref(), t.as_ref(), s.as_ref(), p.as_ref()),
        [d, s, p] => (d.as_ref(), &[][..], s.as_ref(), p.as_ref()),
        _ => return Err(ReplayError::FrameCount { got: frames.len() }),
    };
    if !delimiter.is_empty() {
        return Err(ReplayError::MissingDelimiter {
            got: delimiter.len(),
        });
    }
    if frame::decode_seq(seq)? == END_SEQ {
        if !topic.is_empty() || !payload.is_empty() {
            return Err(ReplayError::EndNotEmpty);
        }
        return Ok(ReplayFrame::End);
    }
    Ok(ReplayFrame::Batch(frame::decode_parts(
        topic, seq, payload, limits,
    )?))
}

/// Server side: the start sequence number from a request as a ROUTER receives it, minus the
/// identity frame: `[b"", start_seq]`.
///
/// # Errors
/// [`ReplayError::FrameCount`] unless 2 frames, [`ReplayError::MissingDelimiter`], or a
/// sequence number frame that is not 8 bytes.
pub fn decode_request<F: AsRef<[u8]>>(frames: &[F]) -> Result<u64, ReplayError> {
    let [delimiter, seq] = frames else {
        return Err(ReplayError::FrameCount { got: frames.len() });
    };
    if !delimiter.as_ref().is_empty() {
        return Err(ReplayError::MissingDelimiter {
            got: delimiter.as_ref().len(),
        });
    }
    Ok(frame::decode_seq(seq.as_ref())?)
}

/// Server side: the answer for one buffered batch, minus the identity frame the ROUTER routes
/// by: `[b"", topic, seq, payload]`.
pub fn encode_reply_batch(topic: &[u8], seq: u64, payload: &[u8]) -> [Vec<u8>; 4] {
    [
        Vec::new(),
        topic.to_vec(),
        encode_seq(seq).to_vec(),
        payload.to_vec(),
    ]
}

/// Server side: the end marker, minus the identity frame: `[b"", b"", 0xff × 8, b""]`.
pub fn encode_reply_end() -> [Vec<u8>; 4] {
    [
        Vec::new(),
        Vec::new(),
        encode_seq(END_SEQ).to_vec(),
        Vec::new(),
    ]
}
