//! The encoder writes what vLLM writes: captured messages re-encode byte for byte, and
//! anything encoded decodes back and maps to the Switchyard hashes of its tokens.

use crate::common;

use proptest::prelude::*;
use switchyard_adapters::vllm::encode::{
    encode_batch, encode_message, encode_payload, EncodeOptions, EventEncoding, HashEncoding,
};
use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::mapper::{HashMapper, MapperConfig};
use switchyard_adapters::vllm::VllmEvent;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};
use switchyard_protocol::kv::KvEvent;

/// Every capture with integer hashes re-encodes to its exact bytes (all three frames).
#[test]
fn captured_messages_reencode_byte_for_byte() {
    for (name, text) in common::CAPTURES {
        let frames = common::parse_fixture(text);
        let batch = decode_message(&frames).unwrap_or_else(|e| panic!("{name}: {e}"));
        let binary_hashes = name.contains("bin_hashes");
        let options = EncodeOptions {
            hashes: if binary_hashes {
                HashEncoding::Bytes
            } else {
                HashEncoding::Int
            },
            ..EncodeOptions::default()
        };
        let encoded = encode_batch(&batch, options).unwrap();
        if binary_hashes {
            // vLLM's digests carry 24 more bytes than the u64 the decoder keeps: not the same
            // bytes, but the same batch once read back.
            let again = decode_message(&encoded).unwrap();
            assert_eq!(again, batch, "{name}");
            continue;
        }
        assert_eq!(encoded.len(), frames.len(), "{name}");
        for (i, (ours, theirs)) in encoded.iter().zip(&frames).enumerate() {
            assert!(
                ours == theirs,
                "{name}: frame {i} differs\nours:   {}\ntheirs: {}",
                hex(ours),
                hex(theirs)
            );
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_array_form_reads_back_without_group_idx() {
    let events = vec![
        VllmEvent::BlockStored {
            block_hashes: vec![1, 2],
            parent: Some(9),
            token_ids: (0..8).collect(),
            block_size: 4,
            lora_id: None,
            medium: Some("GPU".into()),
            group_idx: None,
            hashed_with_extra_keys: true,
        },
        VllmEvent::BlockRemoved {
            block_hashes: vec![9],
            medium: None,
            group_idx: None,
        },
        VllmEvent::AllBlocksCleared,
    ];
    let options = EncodeOptions {
        events: EventEncoding::Array,
        hashes: HashEncoding::Int,
    };
    let payload = encode_payload(2.0, &events, Some(1), options).unwrap();
    let batch = decode_message(&encode_message("", 0, payload)).unwrap();
    assert_eq!(batch.events, events);
    assert_eq!(batch.data_parallel_rank, Some(1));
    assert_eq!(batch.skipped, vec![]);
}

// === properties ===

fn options() -> impl Strategy<Value = EncodeOptions> {
    (any::<bool>(), any::<bool>()).prop_map(|(array, bytes)| EncodeOptions {
        events: if array {
            EventEncoding::Array
        } else {
            EventEncoding::Map
        },
        hashes: if bytes {
            HashEncoding::Bytes
        } else {
            HashEncoding::Int
        },
    })
}

/// A prompt of whole blocks, cut into consecutive `BlockStored` events (a chain, as vLLM
/// announces a prompt over several steps), each event in its own batch.
fn chain() -> impl Strategy<Value = (u32, Vec<u32>, Vec<usize>)> {
    (prop::sample::select(vec![1u32, 4, 16, 32]), 1usize..12).prop_flat_map(|(bs, blocks)| {
        (
            Just(bs),
            prop::collection::vec(any::<u32>(), blocks * bs as usize),
            prop::collection::vec(1usize..4, 1..=blocks),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// encode → decode → HashMapper gives the hashes the router computes from the tokens.
    #[test]
    fn encoded_chains_map_to_the_hashes_of_their_tokens(
        (bs, tokens, cuts) in chain(),
        options in options(),
        vllm_base in any::<u64>(),
        ts in any::<f64>(),
    ) {
        let block_size = BlockSize::try_new(bs).unwrap();
        let blocks = tokens.len() / bs as usize;
        // vLLM's own hashes are opaque: any distinct values will do.
        let vllm: Vec<u64> = (0..blocks as u64).map(|i| vllm_base.wrapping_add(i)).collect();
        let mut mapper = HashMapper::new(MapperConfig::new(block_size));
        let mut mapped: Vec<SequenceHash> = Vec::new();
        let mut start = 0;
        for (seq, cut) in (0u64..).zip(cuts) {
            if start == blocks {
                break;
            }
            let end = (start + cut).min(blocks);
            let event = VllmEvent::BlockStored {
                block_hashes: vllm[start..end].to_vec(),
                parent: start.checked_sub(1).map(|p| vllm[p]),
                token_ids: tokens[start * bs as usize..end * bs as usize].to_vec(),
                block_size: bs,
                lora_id: None,
                medium: Some("GPU".into()),
                group_idx: Some(0),
                hashed_with_extra_keys: false,
            };
            let payload = encode_payload(ts, std::slice::from_ref(&event), Some(0), options).unwrap();
            let batch = decode_message(&encode_message("kv-events", seq, payload)).unwrap();
            prop_assert_eq!(batch.seq, seq);
            prop_assert_eq!(batch.ts.to_bits(), ts.to_bits());
            let out = mapper.apply_batch(&batch);
            for e in out.kv_events() {
                if let KvEvent::Stored { blocks, .. } = e {
                    mapped.extend(blocks.iter().map(|b| b.seq_hash));
                }
            }
            prop_assert!(!out.resync_needed());
            start = end;
        }
        let expected = sequence_hashes(&tokens[..start * bs as usize], block_size, HashSeed::default());
        prop_assert_eq!(mapped, expected);
    }

    /// The map form reads back exactly what was written.
    #[test]
    fn map_form_round_trips(
        hashes in prop::collection::vec(any::<u64>(), 0..6),
        parent in any::<Option<u64>>(),
        lora_id in any::<Option<i64>>(),
        group_idx in any::<Option<i64>>(),
        medium in prop::option::of("[A-Z]{1,4}"),
        extra in any::<bool>(),
        bytes in any::<bool>(),
        rank in any::<Option<i64>>(),
    ) {
        let events = vec![
            VllmEvent::BlockStored {
                token_ids: (0..hashes.len() as u32 * 2).collect(),
                block_hashes: hashes.clone(),
                parent,
                block_size: 2,
                lora_id,
                medium: medium.clone(),
                group_idx,
                hashed_with_extra_keys: extra && !hashes.is_empty(),
            },
            VllmEvent::BlockRemoved { block_hashes: hashes, medium, group_idx },
            VllmEvent::AllBlocksCleared,
        ];
        let options = EncodeOptions {
            events: EventEncoding::Map,
            hashes: if bytes { HashEncoding::Bytes } else { HashEncoding::Int },
        };
        let payload = encode_payload(0.25, &events, rank, options).unwrap();
        let batch = decode_message(&encode_message("x", 7, payload)).unwrap();
        prop_assert_eq!(batch.events, events);
        prop_assert_eq!(batch.data_parallel_rank, rank);
        prop_assert!(batch.skipped.is_empty());
    }
}
