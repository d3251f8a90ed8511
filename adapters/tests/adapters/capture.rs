//! The five messages captured from a real vLLM 0.32.0 decode as the capture file's
//! "decoded:" lines say (tests/fixtures/*.hex carry those lines in their headers).

use crate::common;

use switchyard_adapters::vllm::block_hash;
use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::{VllmBatch, VllmEvent};

fn decode(name: &str) -> VllmBatch {
    let frames = common::fixture(name);
    decode_message(&frames).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The fields of a `BlockStored`, for assertions.
struct Stored<'a> {
    hashes: &'a [u64],
    parent: Option<u64>,
    tokens: &'a [u32],
    block_size: u32,
}

fn stored(event: &VllmEvent) -> Stored<'_> {
    match event {
        VllmEvent::BlockStored {
            block_hashes,
            parent,
            token_ids,
            block_size,
            lora_id,
            medium,
            group_idx,
            hashed_with_extra_keys,
        } => {
            // Every captured store: lora_id None, medium 'GPU', extra_keys all None, group 0.
            assert_eq!(*lora_id, None);
            assert_eq!(medium.as_deref(), Some("GPU"));
            assert_eq!(*group_idx, Some(0));
            assert!(!hashed_with_extra_keys);
            Stored {
                hashes: block_hashes,
                parent: *parent,
                tokens: token_ids,
                block_size: *block_size,
            }
        }
        other => panic!("expected BlockStored, got {other:?}"),
    }
}

fn assert_header(batch: &VllmBatch, seq: u64, ts: f64, events: usize) {
    assert_eq!(batch.topic, "kv-events");
    assert_eq!(batch.seq, seq);
    assert_eq!(batch.ts.to_bits(), ts.to_bits(), "ts {} != {ts}", batch.ts);
    assert_eq!(batch.events.len(), events);
    assert_eq!(batch.data_parallel_rank, Some(0));
    // vLLM 0.32 sends only fields we know: nothing skipped.
    assert_eq!(batch.skipped, vec![]);
}

#[test]
fn block_stored_with_parent() {
    let batch = decode("vllm_0.32_block_stored_with_parent.hex");
    assert_header(&batch, 1, 1796153746.1530416, 1);
    let s = stored(&batch.events[0]);
    assert_eq!(s.hashes, [5393811771742899763]);
    assert_eq!(s.parent, Some(4075680988474975667));
    assert_eq!(s.tokens.len(), 32);
    assert_eq!(s.tokens[..2], [13440, 6500]);
    assert_eq!(s.block_size, 32);
}

#[test]
fn block_stored_31_prompt_blocks_without_parent() {
    let batch = decode("vllm_0.32_block_stored_31_blocks.hex");
    assert_header(&batch, 0, 1796153955.1092532, 1);
    let s = stored(&batch.events[0]);
    assert_eq!(s.hashes.len(), 31);
    assert_eq!(s.hashes[..2], [755658221973407087, 106280556192718310]);
    // The 4th hash is ≥ 2^63, sent as msgpack uint64 (0xcf 8e3d4ff45ac957cb).
    assert_eq!(s.hashes[3], 0x8e3d_4ff4_5ac9_57cb);
    assert_eq!(s.parent, None);
    assert_eq!(s.tokens.len(), 992);
    assert_eq!(s.tokens[..2], [151644, 872]);
    assert_eq!(s.block_size, 32);
}

#[test]
fn evictions_batched_with_the_next_store() {
    let batch = decode("vllm_0.32_removed_then_stored.hex");
    assert_header(&batch, 5, 1796154065.2827532, 29);
    let (removals, rest) = batch.events.split_at(28);
    let removed: Vec<u64> = removals
        .iter()
        .map(|e| match e {
            VllmEvent::BlockRemoved {
                block_hashes,
                medium,
                group_idx,
            } => {
                assert_eq!(medium.as_deref(), Some("GPU"));
                assert_eq!(*group_idx, Some(0));
                assert_eq!(block_hashes.len(), 1, "one event per block");
                block_hashes[0]
            }
            other => panic!("expected BlockRemoved, got {other:?}"),
        })
        .collect();
    assert_eq!(
        removed[..3],
        [
            7491651369935826594,
            9662601411090179880,
            15892237816038316157
        ]
    );
    let s = stored(&rest[0]);
    assert_eq!(s.hashes.len(), 31);
    assert_eq!(s.tokens.len(), 31 * 32);
}

#[test]
fn binary_hashes_keep_vllms_own_low_64_bits() {
    let batch = decode("vllm_0.32_block_stored_bin_hashes.hex");
    assert_header(&batch, 0, 1796154390.6405373, 1);
    let s = stored(&batch.events[0]);
    assert_eq!(s.hashes.len(), 31);
    // The first two digests exactly as the capture's decoding prints them (Python repr).
    let first: &[u8; 32] =
        b"\xaaU\xc6\x17|\xe1\xd0{\x8b\xac\xb5\xa3zy\x92,\xf3`\xb8\xbf\x86\xc7D,\xef\xe7i\tz\xb1\xaa\xff";
    let second: &[u8; 32] =
        b"\xef\x8bkfb\xae\xd0I\xd1\x1c\xeb\xff\xbe\x0c\xe3\xc1.-n\xd9\x14\x97fA\xd5\xd5\xf3Yf\xe8\x86\xfc";
    assert_eq!(s.hashes[0], 0xefe7_6909_7ab1_aaff);
    assert_eq!(s.hashes[1], 0xd5d5_f359_66e8_86fc);
    assert_eq!(Some(s.hashes[0]), block_hash::from_bytes(first));
    assert_eq!(Some(s.hashes[1]), block_hash::from_bytes(second));
    assert_eq!(s.parent, None);
    assert_eq!(s.tokens.len(), 992);
    assert_eq!(s.tokens[..2], [151644, 872]);
    assert_eq!(s.block_size, 32);
}

#[test]
fn all_blocks_cleared() {
    let batch = decode("vllm_0.32_all_blocks_cleared.hex");
    assert_header(&batch, 3, 1796154636.7031484, 1);
    assert_eq!(batch.events, [VllmEvent::AllBlocksCleared]);
}
