//! Every kind of malformed message gives its own typed error.

use crate::common;

use common::{ints, map, message, pack, payload, s, stored_map, tokens};
use rmpv::Value;
use switchyard_adapters::vllm::frame::{decode_message, decode_message_with, Limits};
use switchyard_adapters::vllm::{DecodeError, EventError, Kind, MsgpackFault};

fn event_error(event: Value) -> EventError {
    match decode_message(&message(0, &payload(vec![event]))) {
        Err(DecodeError::Event { index: 0, error }) => error,
        other => panic!("expected an event error, got {other:?}"),
    }
}

fn payload_error(payload: &[u8]) -> DecodeError {
    let frames = [&b"t"[..], &[0u8; 8], payload];
    decode_message(&frames).expect_err("malformed payload")
}

fn with_entry(mut event: Value, key: &str, value: Value) -> Value {
    if let Value::Map(entries) = &mut event {
        match entries.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
            Some(entry) => entry.1 = value,
            None => entries.push((s(key), value)),
        }
    }
    event
}

fn without_entry(mut event: Value, key: &str) -> Value {
    if let Value::Map(entries) = &mut event {
        entries.retain(|(k, _)| k.as_str() != Some(key));
    }
    event
}

fn good_store() -> Value {
    stored_map(&[1], None, &tokens(0, 16), 16)
}

#[test]
fn wrong_frame_counts() {
    for n in [0, 1, 2, 4, 5] {
        let frames = vec![vec![0u8; 8]; n];
        assert_eq!(
            decode_message(&frames),
            Err(DecodeError::FrameCount { got: n })
        );
    }
}

#[test]
fn sequence_number_must_be_eight_bytes() {
    for len in [0, 7, 9] {
        let frames = [b"t".to_vec(), vec![0; len], pack(&payload(vec![]))];
        assert_eq!(
            decode_message(&frames),
            Err(DecodeError::SeqLength { got: len })
        );
    }
}

#[test]
fn topic_must_be_utf8() {
    let frames = [vec![0xff, 0xfe], vec![0; 8], pack(&payload(vec![]))];
    assert_eq!(decode_message(&frames), Err(DecodeError::TopicNotUtf8));
}

#[test]
fn payload_size_is_bounded() {
    let frames = message(0, &payload(vec![good_store()]));
    let limits = Limits {
        max_payload_bytes: 10,
        ..Limits::DEFAULT
    };
    assert_eq!(
        decode_message_with(&frames, &limits),
        Err(DecodeError::PayloadTooLarge {
            got: frames[2].len(),
            max: 10
        })
    );
}

#[test]
fn not_msgpack() {
    assert_eq!(
        payload_error(&[]),
        DecodeError::NotMsgpack(MsgpackFault::Truncated)
    );
    let mut cut = common::fixture("vllm_0.32_block_stored_with_parent.hex").remove(2);
    cut.pop();
    assert_eq!(
        payload_error(&cut),
        DecodeError::NotMsgpack(MsgpackFault::Truncated)
    );
    // An array that claims 2^32-1 items but has none: an error, and no huge allocation.
    assert_eq!(
        payload_error(&[0xdd, 0xff, 0xff, 0xff, 0xff]),
        DecodeError::NotMsgpack(MsgpackFault::Truncated)
    );
    let mut deep = vec![0x91; 10_000];
    deep.push(0xc0);
    assert_eq!(
        payload_error(&deep),
        DecodeError::NotMsgpack(MsgpackFault::TooDeep)
    );
}

#[test]
fn trailing_bytes() {
    let mut bytes = pack(&payload(vec![]));
    bytes.extend([0xc0, 0xc0]);
    assert_eq!(
        payload_error(&bytes),
        DecodeError::TrailingBytes { count: 2 }
    );
}

#[test]
fn payload_shape() {
    assert_eq!(
        payload_error(&pack(&map(vec![("ts", Value::F64(1.0))]))),
        DecodeError::PayloadNotArray { got: Kind::Map }
    );
    assert_eq!(
        payload_error(&pack(&Value::Array(vec![Value::F64(1.0)]))),
        DecodeError::PayloadTooShort { got: 1 }
    );
    let field = |ts: Value, events: Value, rank: Value| {
        payload_error(&pack(&Value::Array(vec![ts, events, rank])))
    };
    let ok_events = Value::Array(vec![]);
    assert_eq!(
        field(s("now"), ok_events.clone(), Value::Nil),
        DecodeError::PayloadField {
            field: "ts",
            expected: "a number",
            got: Kind::Str
        }
    );
    assert_eq!(
        field(Value::F64(1.0), map(vec![]), Value::Nil),
        DecodeError::PayloadField {
            field: "events",
            expected: "an array",
            got: Kind::Map
        }
    );
    assert_eq!(
        field(Value::F64(1.0), ok_events.clone(), s("0")),
        DecodeError::PayloadField {
            field: "data_parallel_rank",
            expected: "an i64 or nil",
            got: Kind::Str
        }
    );
    assert_eq!(
        field(Value::F64(1.0), ok_events, Value::from(u64::MAX)),
        DecodeError::PayloadField {
            field: "data_parallel_rank",
            expected: "an i64 or nil",
            got: Kind::Int
        }
    );
}

#[test]
fn event_count_is_bounded() {
    let frames = message(0, &payload(vec![good_store(), good_store()]));
    let limits = Limits {
        max_events: 1,
        ..Limits::DEFAULT
    };
    assert_eq!(
        decode_message_with(&frames, &limits),
        Err(DecodeError::TooManyEvents { got: 2, max: 1 })
    );
}

#[test]
fn event_shape() {
    assert_eq!(
        event_error(Value::from(5)),
        EventError::NotMapOrArray { got: Kind::Int }
    );
    assert_eq!(event_error(Value::Array(vec![])), EventError::MissingType);
    assert_eq!(
        event_error(without_entry(good_store(), "type")),
        EventError::MissingType
    );
    assert_eq!(
        event_error(with_entry(good_store(), "type", Value::from(1))),
        EventError::TypeNotString { got: Kind::Int }
    );
    let mut twice = good_store();
    if let Value::Map(entries) = &mut twice {
        entries.push((s("block_size"), Value::from(32)));
    }
    assert_eq!(
        event_error(twice),
        EventError::DuplicateField {
            field: "block_size"
        }
    );
}

#[test]
fn missing_required_fields() {
    for field in ["block_hashes", "token_ids", "block_size"] {
        assert_eq!(
            event_error(without_entry(good_store(), field)),
            EventError::MissingField { field }
        );
    }
    assert_eq!(
        event_error(map(vec![("type", s("BlockRemoved"))])),
        EventError::MissingField {
            field: "block_hashes"
        }
    );
    // Array form: BlockStored needs at least block_hashes .. block_size.
    assert_eq!(
        event_error(Value::Array(vec![
            s("BlockStored"),
            ints(&[1u64]),
            Value::Nil
        ])),
        EventError::MissingField { field: "token_ids" }
    );
}

#[test]
fn fields_of_the_wrong_type() {
    let cases: Vec<(&str, Value, &str, Kind)> = vec![
        ("block_hashes", s("x"), "an array", Kind::Str),
        (
            "block_hashes",
            Value::Array(vec![s("x")]),
            "an integer or bytes hash",
            Kind::Str,
        ),
        (
            "parent_block_hash",
            Value::F64(1.0),
            "an integer or bytes hash",
            Kind::Float,
        ),
        (
            "token_ids",
            Value::Array(vec![Value::Nil]),
            "an integer",
            Kind::Nil,
        ),
        ("block_size", s("16"), "an integer", Kind::Str),
        ("lora_id", s("a"), "an integer or nil", Kind::Str),
        ("medium", Value::from(1), "a UTF-8 string or nil", Kind::Int),
        (
            "group_idx",
            Value::Boolean(true),
            "an integer or nil",
            Kind::Bool,
        ),
        ("extra_keys", s("k"), "an array or nil", Kind::Str),
    ];
    for (field, value, expected, got) in cases {
        assert_eq!(
            event_error(with_entry(good_store(), field, value)),
            EventError::FieldType {
                field,
                expected,
                got
            },
            "{field}"
        );
    }
}

#[test]
fn integers_out_of_range() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("token_ids", ints(&[-1i64]), "u32"),
        ("token_ids", ints(&[1u64 << 32]), "u32"),
        ("block_size", Value::from(1u64 << 33), "u32"),
        ("lora_id", Value::from(u64::MAX), "i64"),
    ];
    for (field, value, expected) in cases {
        assert_eq!(
            event_error(with_entry(good_store(), field, value)),
            EventError::OutOfRange { field, expected },
            "{field}"
        );
    }
}

#[test]
fn byte_hashes_of_bad_length() {
    for len in [0, 65] {
        let value = Value::Array(vec![Value::Binary(vec![7; len])]);
        assert_eq!(
            event_error(with_entry(good_store(), "block_hashes", value)),
            EventError::HashBytesLength {
                field: "block_hashes",
                got: len
            }
        );
    }
}

#[test]
fn list_sizes_are_bounded() {
    let limits = Limits {
        max_hashes_per_event: 2,
        max_token_ids_per_event: 32,
        ..Limits::DEFAULT
    };
    let decode =
        |event: Value| match decode_message_with(&message(0, &payload(vec![event])), &limits) {
            Err(DecodeError::Event { error, .. }) => error,
            other => panic!("{other:?}"),
        };
    assert_eq!(
        decode(stored_map(&[1, 2, 3], None, &tokens(0, 48), 16)),
        EventError::TooMany {
            field: "block_hashes",
            got: 3,
            max: 2
        }
    );
    assert_eq!(
        decode(stored_map(&[1, 2], None, &tokens(0, 33), 16)),
        EventError::TooMany {
            field: "token_ids",
            got: 33,
            max: 32
        }
    );
}

#[test]
fn errors_name_the_event() {
    let frames = message(0, &payload(vec![good_store(), Value::Nil]));
    let err = decode_message(&frames).expect_err("second event is nil");
    assert_eq!(
        err,
        DecodeError::Event {
            index: 1,
            error: EventError::NotMapOrArray { got: Kind::Nil }
        }
    );
    assert_eq!(
        err.to_string(),
        "event 1: an event must be a map or an array, got nil"
    );
}
