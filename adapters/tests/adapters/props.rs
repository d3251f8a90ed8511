//! Properties: the decoder never panics and reads back what was encoded; the mapper's state
//! always matches a model of the engine's cache.

use crate::common;

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::sample::Index;
use rmpv::Value;
use switchyard_adapters::vllm::frame::decode_message;
use switchyard_adapters::vllm::mapper::{HashMapper, MapperConfig, Outcome};
use switchyard_adapters::vllm::VllmEvent;
use switchyard_protocol::hash::{sequence_hashes, BlockSize, HashSeed, SequenceHash};
use switchyard_protocol::kv::KvEvent;

// === the decoder ===

/// Strings that steer generated maps into the decoder's known paths.
const NAMES: &[&str] = &[
    "type",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "extra_keys",
    "group_idx",
    "GPU",
    "other",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Boolean),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..64).prop_map(Value::from),
        any::<f64>().prop_map(Value::F64),
        prop::sample::select(NAMES).prop_map(Value::from),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::Binary),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec(
                (prop::sample::select(NAMES).prop_map(Value::from), inner),
                0..8
            )
            .prop_map(Value::Map),
        ]
    })
}

/// Valid events, as [`VllmEvent`]s.
fn event() -> impl Strategy<Value = VllmEvent> {
    let hashes = prop::collection::vec(any::<u64>(), 0..6);
    let medium = prop::option::of(prop::sample::select(&["GPU", "CPU"][..]).prop_map(String::from));
    prop_oneof![
        (
            hashes.clone(),
            prop::option::of(any::<u64>()),
            prop::collection::vec(any::<u32>(), 0..40),
            1u32..64,
            prop::option::of(any::<i64>()),
            medium.clone(),
            prop::option::of(0i64..3),
            any::<bool>(),
        )
            .prop_map(|(h, parent, t, bs, lora, medium, group, extra)| {
                VllmEvent::BlockStored {
                    block_hashes: h,
                    parent,
                    token_ids: t,
                    block_size: bs,
                    lora_id: lora,
                    medium,
                    group_idx: group,
                    hashed_with_extra_keys: extra,
                }
            }),
        (hashes, medium, prop::option::of(0i64..3)).prop_map(|(h, medium, group)| {
            VllmEvent::BlockRemoved {
                block_hashes: h,
                medium,
                group_idx: group,
            }
        }),
        Just(VllmEvent::AllBlocksCleared),
    ]
}

fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map_or(Value::Nil, Into::into)
}

/// Hashes ≥ 2^63 are written as negative int64 half the time, as some encoders do.
fn hash_value(h: u64, signed: bool) -> Value {
    if signed {
        Value::from(h as i64)
    } else {
        Value::from(h)
    }
}

/// `event` encoded the way vLLM 0.32 (map) or older vLLM (array) would.
fn encode(event: &VllmEvent, as_map: bool, signed: bool) -> Value {
    let hashes = |h: &[u64]| Value::Array(h.iter().map(|&x| hash_value(x, signed)).collect());
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
            let extra = Value::Array(
                (0..block_hashes.len().max(1))
                    .map(|i| {
                        if *hashed_with_extra_keys && i == 0 {
                            Value::Array(vec![Value::from("salt")])
                        } else {
                            Value::Nil
                        }
                    })
                    .collect(),
            );
            let fields = vec![
                ("block_hashes", hashes(block_hashes)),
                (
                    "parent_block_hash",
                    parent.map_or(Value::Nil, |p| hash_value(p, signed)),
                ),
                ("token_ids", common::ints(token_ids)),
                ("block_size", Value::from(*block_size)),
                ("lora_id", opt(*lora_id)),
                ("medium", opt(medium.as_deref())),
                ("lora_name", Value::Nil),
                ("extra_keys", extra),
            ];
            if as_map {
                let mut fields = fields;
                if let Some(g) = group_idx {
                    fields.push(("group_idx", Value::from(*g)));
                }
                common::map([vec![("type", Value::from("BlockStored"))], fields].concat())
            } else {
                let mut items = vec![Value::from("BlockStored")];
                items.extend(fields.into_iter().map(|(_, v)| v));
                Value::Array(items)
            }
        }
        VllmEvent::BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        } => {
            if as_map {
                let mut fields = vec![
                    ("type", Value::from("BlockRemoved")),
                    ("block_hashes", hashes(block_hashes)),
                    ("medium", opt(medium.as_deref())),
                ];
                if let Some(g) = group_idx {
                    fields.push(("group_idx", Value::from(*g)));
                }
                common::map(fields)
            } else {
                Value::Array(vec![
                    Value::from("BlockRemoved"),
                    hashes(block_hashes),
                    opt(medium.as_deref()),
                ])
            }
        }
        VllmEvent::AllBlocksCleared if as_map => {
            common::map(vec![("type", Value::from("AllBlocksCleared"))])
        }
        VllmEvent::AllBlocksCleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
    }
}

/// The array form has no `group_idx`.
fn without_group(event: &VllmEvent) -> VllmEvent {
    let mut e = event.clone();
    match &mut e {
        VllmEvent::BlockStored { group_idx, .. } | VllmEvent::BlockRemoved { group_idx, .. } => {
            *group_idx = None
        }
        VllmEvent::AllBlocksCleared => {}
    }
    e
}

/// Fixture payloads with bytes changed, cut, or inserted.
fn mutated_fixture() -> impl Strategy<Value = Vec<Vec<u8>>> {
    (
        0..common::CAPTURES.len(),
        prop::collection::vec((any::<Index>(), any::<u8>(), 0u8..4), 1..8),
    )
        .prop_map(|(which, edits)| {
            let mut frames = common::parse_fixture(common::CAPTURES[which].1);
            let payload = &mut frames[2];
            for (at, byte, how) in edits {
                if payload.is_empty() {
                    payload.push(byte);
                    continue;
                }
                let i = at.index(payload.len());
                match how {
                    0 => payload[i] = byte,
                    1 => payload[i] ^= 1 << (byte % 8),
                    2 => payload.truncate(i),
                    _ => payload.insert(i, byte),
                }
            }
            frames
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    #[test]
    fn arbitrary_frames_never_panic(frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..5)) {
        let _ = decode_message(&frames);
    }

    #[test]
    fn arbitrary_payload_bytes_never_panic(payload in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_message(&[&b"kv-events"[..], &[0; 8], &payload]);
    }

    #[test]
    fn arbitrary_msgpack_values_never_panic(events in prop::collection::vec(value(), 0..6), ts in leaf(), rank in leaf()) {
        let payload = Value::Array(vec![ts, Value::Array(events), rank]);
        let _ = decode_message(&common::message(1, &payload));
    }

    #[test]
    fn mutated_captures_never_panic(frames in mutated_fixture()) {
        let _ = decode_message(&frames);
    }

    #[test]
    fn encoded_events_decode_back(events in prop::collection::vec(event(), 0..6), as_map: bool, signed: bool, rank in prop::option::of(any::<i64>())) {
        let payload = Value::Array(vec![
            Value::F64(1.25),
            Value::Array(events.iter().map(|e| encode(e, as_map, signed)).collect()),
            opt(rank),
        ]);
        let batch = decode_message(&common::message(9, &payload)).expect("valid events decode");
        let expected: Vec<VllmEvent> = if as_map {
            events
        } else {
            events.iter().map(without_group).collect()
        };
        prop_assert_eq!(batch.events, expected);
        prop_assert_eq!(batch.data_parallel_rank, rank);
        prop_assert_eq!(batch.seq, 9);
        prop_assert!(batch.skipped.is_empty());
    }
}

// === the mapper, against a model of the engine's cache ===

const BS: u32 = 4;

fn bs() -> BlockSize {
    BlockSize::try_new(BS).unwrap()
}

/// A stand-in for vLLM's hash of the block ending `path`: a function of the whole prefix,
/// as vLLM's is, and unlike ours (another seed).
fn vllm_hash(path: &[u32]) -> u64 {
    sequence_hashes(path, bs(), HashSeed(0xdead_beef))
        .last()
        .unwrap()
        .0
}

fn our_hash(path: &[u32]) -> SequenceHash {
    *sequence_hashes(path, bs(), HashSeed::default())
        .last()
        .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// Store blocks of `tokens` after a held block (at the root when `None` or none held).
    Store {
        after: Option<Index>,
        tokens: Vec<u32>,
    },
    /// Evict some held copies (of any block, parents included, as vLLM's LRU may).
    Remove {
        picks: Vec<Index>,
    },
    /// Evict a block the engine never had.
    RemoveUnknown(u64),
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::option::of(any::<Index>()), 1usize..4)
            .prop_flat_map(|(after, blocks)| {
                // A tiny alphabet so that identical blocks (re-stores) happen often.
                prop::collection::vec(0u32..3, blocks * BS as usize)
                    .prop_map(move |tokens| Op::Store { after, tokens })
            }),
        3 => prop::collection::vec(any::<Index>(), 1..4).prop_map(|picks| Op::Remove { picks }),
        1 => any::<u64>().prop_map(Op::RemoveUnknown),
        1 => Just(Op::Clear),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn mapper_state_and_output_follow_the_engine(ops in prop::collection::vec(op(), 1..40)) {
        let mut mapper = HashMapper::new(MapperConfig::new(bs()));
        // The engine: vLLM hash -> (the block's whole token prefix, physical copies cached).
        let mut engine: HashMap<u64, (Vec<u32>, u32)> = HashMap::new();
        // What a consumer of the mapper's output would index: engine id -> our hash.
        let mut index: HashMap<u64, SequenceHash> = HashMap::new();
        let held = |engine: &HashMap<u64, (Vec<u32>, u32)>| {
            let mut held: Vec<u64> = engine.keys().copied().collect();
            held.sort();
            held
        };
        for op in ops {
            let event = match op {
                Op::Store { after, tokens } => {
                    let held = held(&engine);
                    let parent = after.filter(|_| !held.is_empty()).map(|i| held[i.index(held.len())]);
                    let mut path = parent.map(|p| engine[&p].0.clone()).unwrap_or_default();
                    let mut hashes = Vec::new();
                    for block in tokens.chunks(BS as usize) {
                        path.extend_from_slice(block);
                        let h = vllm_hash(&path);
                        hashes.push(h);
                        // The same block again is another physical copy, as in vLLM.
                        engine.entry(h).or_insert_with(|| (path.clone(), 0)).1 += 1;
                    }
                    VllmEvent::BlockStored {
                        block_hashes: hashes,
                        parent,
                        token_ids: tokens,
                        block_size: BS,
                        lora_id: None,
                        medium: Some("GPU".into()),
                        group_idx: None,
                        hashed_with_extra_keys: false,
                    }
                }
                Op::Remove { picks } => {
                    // Each pick evicts one copy of a block held at that moment.
                    let mut victims = Vec::new();
                    for pick in picks {
                        let held = held(&engine);
                        if held.is_empty() {
                            break;
                        }
                        let v = held[pick.index(held.len())];
                        let copies = &mut engine.get_mut(&v).unwrap().1;
                        *copies -= 1;
                        if *copies == 0 {
                            engine.remove(&v);
                        }
                        victims.push(v);
                    }
                    VllmEvent::BlockRemoved { block_hashes: victims, medium: Some("GPU".into()), group_idx: Some(0) }
                }
                Op::RemoveUnknown(h) if engine.contains_key(&h) => continue,
                Op::RemoveUnknown(h) => VllmEvent::BlockRemoved { block_hashes: vec![h], medium: None, group_idx: None },
                Op::Clear => {
                    engine.clear();
                    VllmEvent::AllBlocksCleared
                }
            };
            match mapper.apply(&event) {
                Ok(Outcome::Forward { event, .. }) => match event {
                    KvEvent::Stored { blocks, .. } => {
                        for b in blocks {
                            index.insert(b.block_id.0, b.seq_hash);
                        }
                    }
                    KvEvent::Removed { block_ids } => {
                        for id in block_ids {
                            prop_assert!(index.remove(&id.0).is_some(), "removal of an unindexed block");
                        }
                    }
                    KvEvent::Cleared => index.clear(),
                },
                Ok(Outcome::Ignored(_)) => {}
                other => prop_assert!(false, "unexpected outcome {:?} for {:?}", other, event),
            }
            // The mapper knows exactly the engine's blocks, under their prefix's hash...
            prop_assert_eq!(mapper.len(), engine.len());
            for (h, (path, copies)) in &engine {
                prop_assert_eq!(mapper.seq_hash(*h), Some(our_hash(path)));
                prop_assert_eq!(mapper.copies(*h), *copies);
            }
            // ...and its output, applied in order, rebuilds the same map.
            let expected: HashMap<u64, SequenceHash> =
                engine.iter().map(|(h, (p, _))| (*h, our_hash(p))).collect();
            prop_assert_eq!(&index, &expected);
        }
    }
}
