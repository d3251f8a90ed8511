//! The encodings vLLM has used besides 0.32's defaults: tag-first arrays, negative int64
//! hashes, omitted fields, unknown event types and fields, extra keys.

use crate::common;

use common::{ints, map, message, pack, payload, s, stored_map, tokens};
use rmpv::Value;
use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::{Skipped, VllmBatch, VllmEvent};

fn decode(events: Vec<Value>) -> VllmBatch {
    decode_message(&message(7, &payload(events))).expect("decodes")
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], block_size: u32) -> VllmEvent {
    VllmEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent,
        token_ids: tokens.to_vec(),
        block_size,
        lora_id: None,
        medium: Some("GPU".into()),
        group_idx: None,
        hashed_with_extra_keys: false,
    }
}

#[test]
fn older_array_events_decode_like_maps() {
    let t = tokens(100, 32);
    let batch = decode(vec![
        Value::Array(vec![
            s("BlockStored"),
            ints(&[11u64, 12]),
            Value::from(10u64),
            ints(&t),
            Value::from(16),
            Value::Nil,
            s("GPU"),
            Value::Nil,
            Value::Array(vec![Value::Nil, Value::Nil]),
        ]),
        Value::Array(vec![s("BlockRemoved"), ints(&[11u64]), s("GPU")]),
        Value::Array(vec![s("AllBlocksCleared")]),
    ]);
    assert_eq!(
        batch.events,
        [
            stored(&[11, 12], Some(10), &t, 16),
            VllmEvent::BlockRemoved {
                block_hashes: vec![11],
                medium: Some("GPU".into()),
                group_idx: None,
            },
            VllmEvent::AllBlocksCleared,
        ]
    );
    assert!(batch.skipped.is_empty());
}

#[test]
fn oldest_array_events_without_medium_decode() {
    // vLLM 0.8: BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id).
    let t = tokens(0, 16);
    let batch = decode(vec![
        Value::Array(vec![
            s("BlockStored"),
            ints(&[1u64]),
            Value::Nil,
            ints(&t),
            Value::from(16),
            Value::Nil,
        ]),
        Value::Array(vec![s("BlockRemoved"), ints(&[1u64])]),
    ]);
    let VllmEvent::BlockStored { medium, .. } = &batch.events[0] else {
        panic!("not a store: {:?}", batch.events[0]);
    };
    assert_eq!(*medium, None);
    assert_eq!(
        batch.events[1],
        VllmEvent::BlockRemoved {
            block_hashes: vec![1],
            medium: None,
            group_idx: None
        }
    );
}

#[test]
fn negative_int64_hashes_are_the_same_u64() {
    let big = 0x8e3d_4ff4_5ac9_57cb_u64;
    let as_i64 = big as i64;
    assert!(as_i64 < 0);
    let event = map(vec![
        ("type", s("BlockRemoved")),
        (
            "block_hashes",
            Value::Array(vec![Value::from(as_i64), Value::from(-1i64)]),
        ),
    ]);
    let bytes = pack(&event);
    // rmpv writes it as msgpack int64 (0xd3), not uint64: the case to cover.
    let int64 = [&[0xd3][..], &as_i64.to_be_bytes()].concat();
    assert!(bytes.windows(9).any(|w| w == int64.as_slice()));
    let batch = decode(vec![event]);
    assert_eq!(
        batch.events,
        [VllmEvent::BlockRemoved {
            block_hashes: vec![big, u64::MAX],
            medium: None,
            group_idx: None
        }]
    );
}

#[test]
fn parent_may_be_a_negative_int64_or_bytes() {
    let t = tokens(0, 16);
    let mut with_negative = stored_map(&[5], None, &t, 16);
    let mut with_bytes = stored_map(&[6], None, &t, 16);
    if let (Value::Map(a), Value::Map(b)) = (&mut with_negative, &mut with_bytes) {
        a[2].1 = Value::from(-2i64);
        b[2].1 = Value::Binary(vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
    }
    let batch = decode(vec![with_negative, with_bytes]);
    let parents: Vec<Option<u64>> = batch
        .events
        .iter()
        .map(|e| match e {
            VllmEvent::BlockStored { parent, .. } => *parent,
            _ => panic!("not a store"),
        })
        .collect();
    assert_eq!(parents, [Some(u64::MAX - 1), Some(9)]);
}

#[test]
fn unknown_event_type_is_skipped_and_noted() {
    let t = tokens(0, 16);
    let batch = decode(vec![
        map(vec![
            ("type", s("BlockPinned")),
            ("block_hashes", ints(&[1u64])),
        ]),
        Value::Array(vec![s("SomethingNew"), Value::from(1)]),
        stored_map(&[2], None, &t, 16),
    ]);
    assert_eq!(batch.events.len(), 1);
    assert!(matches!(batch.events[0], VllmEvent::BlockStored { .. }));
    assert_eq!(
        batch.skipped,
        [
            Skipped::UnknownEventType {
                event: 0,
                tag: "BlockPinned".into()
            },
            Skipped::UnknownEventType {
                event: 1,
                tag: "SomethingNew".into()
            },
        ]
    );
}

#[test]
fn unknown_fields_are_ignored_and_noted() {
    let t = tokens(0, 16);
    let mut event = stored_map(&[2], None, &t, 16);
    if let Value::Map(entries) = &mut event {
        entries.push((s("session_id"), s("abc")));
        entries.push((Value::from(7), Value::Nil));
    }
    let removed = map(vec![
        ("type", s("BlockRemoved")),
        ("block_hashes", ints(&[2u64])),
        ("token_ids", ints(&[1u32])), // a BlockStored field, unknown to BlockRemoved
    ]);
    let batch = decode(vec![event, removed]);
    assert_eq!(batch.events.len(), 2);
    assert_eq!(
        batch.skipped,
        [
            Skipped::UnknownField {
                event: 0,
                field: "session_id".into()
            },
            Skipped::UnknownField {
                event: 0,
                field: "<an integer key>".into()
            },
            Skipped::UnknownField {
                event: 1,
                field: "token_ids".into()
            },
        ]
    );
}

#[test]
fn long_unknown_names_are_shortened_in_notes() {
    let name = "é".repeat(100); // 200 bytes, 2 per char
    let batch = decode(vec![map(vec![("type", s(&name))])]);
    let [Skipped::UnknownEventType { tag, .. }] = batch.skipped.as_slice() else {
        panic!("{:?}", batch.skipped);
    };
    assert_eq!(tag.len(), 64);
    assert!(name.starts_with(tag.as_str()));
}

#[test]
fn extra_array_and_payload_items_are_noted() {
    let batch = decode_message(&message(
        1,
        &Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![Value::Array(vec![
                s("AllBlocksCleared"),
                Value::from(1),
                Value::from(2),
            ])]),
            Value::Nil,
            s("future"),
        ]),
    ))
    .expect("decodes");
    assert_eq!(batch.events, [VllmEvent::AllBlocksCleared]);
    assert_eq!(batch.data_parallel_rank, None);
    assert_eq!(
        batch.skipped,
        [
            Skipped::ExtraPayloadItems { count: 1 },
            Skipped::ExtraArrayItems { event: 0, count: 2 },
        ]
    );
}

#[test]
fn omitted_default_fields_are_none() {
    // Only what has no default in vLLM's struct, and group_idx omitted at 0.
    let t = tokens(0, 16);
    let batch = decode(vec![map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", ints(&[3u64])),
        ("token_ids", ints(&t)),
        ("block_size", Value::from(16)),
    ])]);
    let mut expected = stored(&[3], None, &t, 16);
    if let VllmEvent::BlockStored { medium, .. } = &mut expected {
        *medium = None;
    }
    assert_eq!(batch.events, [expected]);
}

#[test]
fn payload_without_rank_and_integer_ts() {
    let batch = decode_message(&message(
        2,
        &Value::Array(vec![Value::from(1_700_000_000u64), Value::Array(vec![])]),
    ))
    .expect("decodes");
    assert_eq!(batch.ts, 1_700_000_000.0);
    assert_eq!(batch.data_parallel_rank, None);
    assert!(batch.events.is_empty());
}

#[test]
fn non_nil_extra_keys_and_lora_are_reported() {
    let t = tokens(0, 32);
    let mut event = stored_map(&[1, 2], None, &t, 16);
    if let Value::Map(entries) = &mut event {
        entries[5].1 = Value::from(3); // lora_id
        entries[8].1 = Value::Array(vec![Value::Array(vec![s("mm-hash")]), Value::Nil]);
    }
    let batch = decode(vec![event]);
    let VllmEvent::BlockStored {
        lora_id,
        hashed_with_extra_keys,
        group_idx,
        ..
    } = &batch.events[0]
    else {
        panic!("not a store");
    };
    assert_eq!(*lora_id, Some(3));
    assert!(hashed_with_extra_keys);
    assert_eq!(*group_idx, Some(0));
}

#[test]
fn short_byte_hashes_follow_vllms_rule() {
    let event = map(vec![
        ("type", s("BlockRemoved")),
        (
            "block_hashes",
            Value::Array(vec![
                Value::Binary(vec![0x01, 0x02]),
                Value::Binary((1..=16).collect()),
            ]),
        ),
    ]);
    let batch = decode(vec![event]);
    assert_eq!(
        batch.events,
        [VllmEvent::BlockRemoved {
            block_hashes: vec![0x0102, 0x090a_0b0c_0d0e_0f10],
            medium: None,
            group_idx: None
        }]
    );
}
