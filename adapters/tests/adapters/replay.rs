//! The replay protocol on vLLM's ROUTER socket: the client's and the server's frames.

use crate::common;

use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::replay::{
    decode_reply, decode_request, encode_reply_batch, encode_reply_end, encode_request,
    request_seq_frame, ReplayError, ReplayFrame, END_SEQ,
};
use switchyard_adapters::vllm::{DecodeError, VllmEvent};

#[test]
fn a_dealer_request_is_the_delimiter_and_the_big_endian_seq() {
    let frames = encode_request(0x0102_0304_0506_0708);
    assert_eq!(frames, [vec![], vec![1, 2, 3, 4, 5, 6, 7, 8]]);
    assert_eq!(request_seq_frame(5), [0, 0, 0, 0, 0, 0, 0, 5]);
    // What vLLM's ROUTER reads after the identity frame is exactly that.
    assert_eq!(decode_request(&frames), Ok(0x0102_0304_0506_0708));
}

#[test]
fn malformed_requests() {
    assert_eq!(
        decode_request(&[vec![0u8; 8]]),
        Err(ReplayError::FrameCount { got: 1 })
    );
    assert_eq!(
        decode_request(&[vec![1u8], vec![0; 8]]),
        Err(ReplayError::MissingDelimiter { got: 1 })
    );
    assert_eq!(
        decode_request(&[vec![], vec![0; 4]]),
        Err(ReplayError::Decode(DecodeError::SeqLength { got: 4 }))
    );
}

#[test]
fn a_replayed_capture_decodes_like_the_live_message() {
    let live = common::fixture("vllm_0.32_removed_then_stored.hex");
    let reply = encode_reply_batch(&live[0], 5, &live[2]);
    assert_eq!(reply[0], b"");
    assert_eq!(reply[1], b"kv-events");
    assert_eq!(reply[2], live[1]);
    match decode_reply(&reply) {
        Ok(ReplayFrame::Batch(batch)) => assert_eq!(batch, decode_message(&live).unwrap()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_end_marker() {
    let end = encode_reply_end();
    assert_eq!(end, [vec![], vec![], vec![0xff; 8], vec![]]);
    assert_eq!(END_SEQ.to_be_bytes(), [0xff; 8]);
    assert_eq!(decode_reply(&end), Ok(ReplayFrame::End));
    let mut with_payload = end.clone();
    with_payload[3] = vec![0x90];
    assert_eq!(decode_reply(&with_payload), Err(ReplayError::EndNotEmpty));
}

#[test]
fn older_replies_without_the_topic_frame() {
    let live = common::fixture("vllm_0.32_all_blocks_cleared.hex");
    let reply = [vec![], live[1].clone(), live[2].clone()];
    match decode_reply(&reply) {
        Ok(ReplayFrame::Batch(batch)) => {
            assert_eq!(batch.topic, "");
            assert_eq!(batch.seq, 3);
            assert_eq!(batch.events, [VllmEvent::AllBlocksCleared]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        decode_reply(&[vec![], vec![0xff; 8], vec![]]),
        Ok(ReplayFrame::End)
    );
}

#[test]
fn malformed_replies() {
    let live = common::fixture("vllm_0.32_all_blocks_cleared.hex");
    assert_eq!(
        decode_reply(&live[..2]),
        Err(ReplayError::FrameCount { got: 2 })
    );
    // A REQ socket strips the delimiter, so it would receive `[topic, seq, payload]`: not
    // what a DEALER receives, and refused rather than misread.
    let req_received = encode_reply_batch(&live[0], 3, &live[2])[1..].to_vec();
    assert_eq!(
        decode_reply(&req_received),
        Err(ReplayError::MissingDelimiter { got: 9 })
    );
    let bad_payload = encode_reply_batch(b"t", 1, &[0xc1, 0x00]);
    assert_eq!(
        decode_reply(&bad_payload),
        Err(ReplayError::Decode(DecodeError::TrailingBytes { count: 1 }))
    );
}
