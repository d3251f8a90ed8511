//! One `POST /kv_cache_events` answer (JSON) → [`TrtllmEvent`]s.
//!
//! Nothing here panics, whatever the bytes: the answer is bounded in size before it is
//! parsed, `serde_json` bounds nesting (128 levels), and every field is checked for its type
//! rather than trusted. A malformed event is a [`Malformed`] in its place — with its
//! `event_id` when that much could be read, so the caller knows which event it lost — and the
//! rest of the list still decodes. Unknown fields are ignored and unknown event types kept as
//! [`TrtllmData::Unknown`]: a newer TensorRT-LLM adding either must not stop the stream.

use serde_json::{Map, Value};

use super::error::{DecodeError, EventError};
use super::event::{TrtllmBlock, TrtllmData, TrtllmEvent};

/// Bounds on the work and memory one answer may cost. [`Limits::DEFAULT`] fits any real
/// answer polled every few seconds with a wide margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest answer accepted, in bytes. The parsed tree costs a small multiple of it.
    pub max_body_bytes: usize,
    /// Most events in one answer.
    pub max_events: usize,
    /// Most blocks (or hashes) in one event.
    pub max_blocks_per_event: usize,
    /// Most tokens in one block.
    pub max_tokens_per_block: usize,
}

impl Limits {
    /// 32 MiB answers, 100,000 events, 100,000 blocks per event, 65,536 tokens per block.
    /// A stored token takes about 50 bytes of JSON, so a 1,000-token prompt's event is about
    /// 50 KB.
    pub const DEFAULT: Limits = Limits {
        max_body_bytes: 32 << 20,
        max_events: 100_000,
        max_blocks_per_event: 100_000,
        max_tokens_per_block: 65_536,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// An event that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// Its `event_id`, if that much was readable.
    pub event_id: Option<u64>,
    /// What is wrong.
    pub error: EventError,
}

/// One item of an answer.
pub type Decoded = Result<TrtllmEvent, Malformed>;

/// Decodes one answer with `limits`.
///
/// # Errors
/// [`DecodeError`] when the answer as a whole is unusable (too large, not JSON, not a list,
/// too many events); a bad event is a [`Malformed`] item instead.
pub fn decode_body(body: &[u8], limits: &Limits) -> Result<Vec<Decoded>, DecodeError> {
    if body.len() > limits.max_body_bytes {
        return Err(DecodeError::TooLarge {
            got: body.len(),
            max: limits.max_body_bytes,
        });
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| DecodeError::NotJson(e.to_string()))?;
    let Value::Array(items) = value else {
        return Err(DecodeError::NotAList(kind(&value)));
    };
    if items.len() > limits.max_events {
        return Err(DecodeError::TooManyEvents {
            got: items.len(),
            max: limits.max_events,
        });
    }
    Ok(items
        .iter()
        // TensorRT-LLM's serializer writes `{}` for an absent event: nothing to read. (Had a
        // real event been lost there, its id's gap shows it.)
        .filter(|item| !matches!(item, Value::Object(fields) if fields.is_empty()))
        .map(|item| event(item, limits))
        .collect())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn event(value: &Value, limits: &Limits) -> Decoded {
    let Value::Object(fields) = value else {
        return Err(Malformed {
            event_id: None,
            error: EventError::NotAnObject(kind(value)),
        });
    };
    let event_id = required(fields, "event_id")
        .and_then(|v| u64_of(v, "event_id", "a non-negative integer"))
        .map_err(|error| Malformed {
            event_id: None,
            error,
        })?;
    let rest = || -> Result<TrtllmEvent, EventError> {
        Ok(TrtllmEvent {
            event_id,
            window_size: optional(fields, "window_size")
                .map(|v| u64_of(v, "window_size", "a non-negative integer"))
                .transpose()?,
            attention_dp_rank: optional(fields, "attention_dp_rank")
                .map(|v| {
                    v.as_i64().ok_or(EventError::Field {
                        field: "attention_dp_rank",
                        expected: "an integer",
                    })
                })
                .transpose()?,
            data: data(required(fields, "data")?, limits)?,
        })
    };
    rest().map_err(|error| Malformed {
        event_id: Some(event_id),
        error,
    })
}

/// A field's value; `null` counts as absent.
fn optional<'v>(fields: &'v Map<String, Value>, name: &'static str) -> Option<&'v Value> {
    fields.get(name).filter(|v| !v.is_null())
}

fn required<'v>(
    fields: &'v Map<String, Value>,
    name: &'static str,
) -> Result<&'v Value, EventError> {
    optional(fields, name).ok_or(EventError::MissingField(name))
}

fn u64_of(value: &Value, field: &'static str, expected: &'static str) -> Result<u64, EventError> {
    value.as_u64().ok_or(EventError::Field { field, expected })
}

/// A 64-bit hash: the engine's `size_t`, sent unsigned; a signed form (as some relays
/// re-encode it) is taken as the same 64 bits.
fn hash_of(value: &Value, field: &'static str) -> Result<u64, EventError> {
    value
        .as_u64()
        .or_else(|| value.as_i64().map(|h| u64::from_ne_bytes(h.to_ne_bytes())))
        .ok_or(EventError::Field {
            field,
            expected: "a 64-bit integer",
        })
}

fn list<'v>(
    value: &'v Value,
    field: &'static str,
    max: usize,
) -> Result<&'v Vec<Value>, EventError> {
    let Value::Array(items) = value else {
        return Err(EventError::Field {
            field,
            expected: "a list",
        });
    };
    if items.len() > max {
        return Err(EventError::TooLong {
            field,
            got: items.len(),
            max,
        });
    }
    Ok(items)
}

fn data(value: &Value, limits: &Limits) -> Result<TrtllmData, EventError> {
    let Value::Object(fields) = value else {
        return Err(EventError::Field {
            field: "data",
            expected: "an object",
        });
    };
    let kind = required(fields, "type")?
        .as_str()
        .ok_or(EventError::Field {
            field: "type",
            expected: "a string",
        })?;
    match kind {
        "created" => Ok(TrtllmData::Created {
            num_blocks_per_cache_level: match optional(fields, "num_blocks_per_cache_level") {
                None => Vec::new(),
                Some(v) => list(v, "num_blocks_per_cache_level", limits.max_blocks_per_event)?
                    .iter()
                    .map(|n| u64_of(n, "num_blocks_per_cache_level", "non-negative integers"))
                    .collect::<Result<_, _>>()?,
            },
        }),
        "stored" => Ok(TrtllmData::Stored {
            parent_hash: optional(fields, "parent_hash")
                .map(|v| hash_of(v, "parent_hash"))
                .transpose()?,
            blocks: list(
                required(fields, "blocks")?,
                "blocks",
                limits.max_blocks_per_event,
            )?
            .iter()
            .map(|b| block(b, limits))
            .collect::<Result<_, _>>()?,
        }),
        "removed" => Ok(TrtllmData::Removed {
            block_hashes: list(
                required(fields, "block_hashes")?,
                "block_hashes",
                limits.max_blocks_per_event,
            )?
            .iter()
            .map(|h| hash_of(h, "block_hashes"))
            .collect::<Result<_, _>>()?,
        }),
        // Only the block matters (and not even that: an update leaves the block cached).
        "updated" => Ok(TrtllmData::Updated {
            block_hash: optional(fields, "block_hash")
                .map(|v| hash_of(v, "block_hash"))
                .transpose()?,
        }),
        other => Ok(TrtllmData::Unknown {
            kind: shorten(other),
        }),
    }
}

fn block(value: &Value, limits: &Limits) -> Result<TrtllmBlock, EventError> {
    let Value::Object(fields) = value else {
        return Err(EventError::Field {
            field: "blocks",
            expected: "a list of objects",
        });
    };
    let block_hash = hash_of(required(fields, "block_hash")?, "block_hash")?;
    let tokens = list(
        required(fields, "tokens")?,
        "tokens",
        limits.max_tokens_per_block,
    )?;
    let mut token_ids = Vec::with_capacity(tokens.len());
    // Newer engines key a block by its multimodal items and its request's salt too; a text
    // block sends `"mm_keys": []` and `"cache_salt": null`.
    let mm_keys =
        optional(fields, "mm_keys").map(|v| list(v, "mm_keys", limits.max_tokens_per_block));
    let mut hashed_with_extra_keys = match mm_keys.transpose()? {
        Some(keys) => !keys.is_empty(),
        None => false,
    } || optional(fields, "cache_salt").is_some();
    for token in tokens {
        let Value::Object(token) = token else {
            return Err(EventError::Field {
                field: "tokens",
                expected: "a list of objects",
            });
        };
        let id = required(token, "token_id")?
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or(EventError::Field {
                field: "token_id",
                expected: "an integer in 0..2^32",
            })?;
        token_ids.push(id);
        if let Some(extra) = optional(token, "token_extra_id") {
            let extra =
                extra
                    .as_i64()
                    .or_else(|| extra.as_u64().map(|_| 1))
                    .ok_or(EventError::Field {
                        field: "token_extra_id",
                        expected: "an integer",
                    })?;
            hashed_with_extra_keys |= extra != 0;
        }
    }
    Ok(TrtllmBlock {
        block_hash,
        token_ids,
        hashed_with_extra_keys,
    })
}

/// At most 64 bytes of `text`, cut at a character boundary.
fn shorten(text: &str) -> String {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    text.get(..end).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(json: &str) -> Vec<Decoded> {
        decode_body(json.as_bytes(), &Limits::DEFAULT).unwrap()
    }

    #[test]
    fn every_event_type_decodes() {
        let json = r#"[
          {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [4096, 0]},
           "window_size": 4096},
          {"event_id": 1, "window_size": 4096, "data": {"type": "stored", "parent_hash": null,
            "blocks": [{"type": "stored_block", "block_hash": 18446744073709551615,
              "tokens": [{"type": "unique_token", "token_id": 1, "token_extra_id": 0},
                         {"type": "unique_token", "token_id": 2, "token_extra_id": 0}],
              "cache_level": 0, "priority": 35}]}},
          {"event_id": 2, "window_size": 4096, "attention_dp_rank": 1,
           "data": {"type": "removed", "block_hashes": [7, -1]}},
          {"event_id": 3, "window_size": 4096, "data": {"type": "updated", "block_hash": 7,
            "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0}}},
          {"event_id": 4, "data": {"type": "teleported", "where": "mars"}}
        ]"#;
        let events: Vec<TrtllmEvent> = decode(json).into_iter().map(Result::unwrap).collect();
        assert_eq!(
            events[0].data,
            TrtllmData::Created {
                num_blocks_per_cache_level: vec![4096, 0]
            }
        );
        assert_eq!(events[0].window_size, Some(4096));
        assert_eq!(
            events[1].data,
            TrtllmData::Stored {
                parent_hash: None,
                blocks: vec![TrtllmBlock {
                    block_hash: u64::MAX,
                    token_ids: vec![1, 2],
                    hashed_with_extra_keys: false,
                }],
            }
        );
        assert_eq!(
            events[2].data,
            TrtllmData::Removed {
                block_hashes: vec![7, u64::MAX]
            },
            "a signed hash is the same 64 bits"
        );
        assert_eq!(events[2].attention_dp_rank, Some(1));
        assert_eq!(
            events[3].data,
            TrtllmData::Updated {
                block_hash: Some(7)
            }
        );
        assert_eq!(
            events[4].data,
            TrtllmData::Unknown {
                kind: "teleported".into()
            }
        );
        assert_eq!(events[4].window_size, None);
    }

    /// TensorRT-LLM's serializer now writes `mm_keys` and `cache_salt` on every stored block
    /// (`[]` and `null` for a text block without a salt, as its own tests assert).
    #[test]
    fn multimodal_keys_and_cache_salts_are_noted() {
        let stored = |extra: &str| {
            let json = format!(
                r#"[{{"event_id": 1, "data": {{"type": "stored", "parent_hash": null, "blocks": [
                   {{"block_hash": 6, "tokens": [{{"token_id": 3, "token_extra_id": 0}}]{extra}}}]}}}}]"#
            );
            match decode(&json).remove(0) {
                Ok(TrtllmEvent {
                    data: TrtllmData::Stored { blocks, .. },
                    ..
                }) => Ok(blocks[0].hashed_with_extra_keys),
                Ok(other) => panic!("{other:?}"),
                Err(bad) => Err(bad.error.to_string()),
            }
        };
        assert_eq!(stored(""), Ok(false));
        assert_eq!(stored(r#", "mm_keys": [], "cache_salt": null"#), Ok(false));
        assert_eq!(
            stored(r#", "mm_keys": [], "cache_salt": "tenant-a""#),
            Ok(true)
        );
        let image = r#"{"type": "mm_key", "hash": "0102", "start_offset": 0}"#;
        assert_eq!(
            stored(&format!(r#", "mm_keys": [{image}], "cache_salt": null"#)),
            Ok(true)
        );
        assert!(stored(r#", "mm_keys": 7"#).unwrap_err().contains("mm_keys"));
    }

    #[test]
    fn extra_token_ids_are_noted() {
        let json = r#"[{"event_id": 9, "data": {"type": "stored", "parent_hash": 5, "blocks": [
            {"block_hash": 6, "tokens": [{"token_id": 3, "token_extra_id": 12}]}]}}]"#;
        let Ok(event) = &decode(json)[0] else {
            panic!("decodes")
        };
        let TrtllmData::Stored {
            parent_hash,
            blocks,
        } = &event.data
        else {
            panic!("stored")
        };
        assert_eq!(*parent_hash, Some(5));
        assert!(blocks[0].hashed_with_extra_keys);
    }

    #[test]
    fn a_bad_event_is_an_error_in_its_place_with_its_id() {
        let json = r#"[
          {"event_id": 1, "data": {"type": "removed", "block_hashes": [1]}},
          {"event_id": 2, "data": {"type": "stored", "blocks": [{"block_hash": 1,
             "tokens": [{"token_id": -4}]}]}},
          {"data": {"type": "removed", "block_hashes": []}},
          "hello",
          {"event_id": 3, "data": {"type": "removed", "block_hashes": "all"}},
          {"event_id": 4, "data": {"type": 7}},
          {"event_id": 5, "data": {"type": "removed", "block_hashes": [1.5]}}
        ]"#;
        let decoded = decode(json);
        assert!(decoded[0].is_ok());
        let errors: Vec<_> = decoded[1..]
            .iter()
            .map(|d| d.clone().unwrap_err())
            .collect();
        assert_eq!(errors[0].event_id, Some(2));
        assert_eq!(
            errors[0].error,
            EventError::Field {
                field: "token_id",
                expected: "an integer in 0..2^32"
            }
        );
        assert_eq!(errors[1].event_id, None);
        assert_eq!(errors[1].error, EventError::MissingField("event_id"));
        assert_eq!(errors[2].error, EventError::NotAnObject("a string"));
        assert_eq!(errors[3].event_id, Some(3));
        assert_eq!(errors[4].event_id, Some(4));
        assert_eq!(errors[5].event_id, Some(5));
    }

    #[test]
    fn unusable_answers_are_errors() {
        let limits = Limits {
            max_body_bytes: 64,
            max_events: 1,
            ..Limits::DEFAULT
        };
        assert!(matches!(
            decode_body(&[b' '; 65], &limits),
            Err(DecodeError::TooLarge { got: 65, max: 64 })
        ));
        assert!(matches!(
            decode_body(b"[1,", &limits),
            Err(DecodeError::NotJson(_))
        ));
        assert_eq!(
            decode_body(b"{}", &limits),
            Err(DecodeError::NotAList("an object"))
        );
        assert_eq!(
            decode_body(b"[1, 2]", &limits),
            Err(DecodeError::TooManyEvents { got: 2, max: 1 })
        );
        assert_eq!(decode_body(b"[]", &limits), Ok(Vec::new()));
        assert_eq!(
            decode_body(b"[{}]", &limits),
            Ok(Vec::new()),
            "an absent event"
        );
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(matches!(
            decode_body(deep.as_bytes(), &Limits::DEFAULT),
            Err(DecodeError::NotJson(_))
        ));
    }

    #[test]
    fn lists_longer_than_the_limits_are_refused() {
        let limits = Limits {
            max_blocks_per_event: 2,
            ..Limits::DEFAULT
        };
        let json = br#"[{"event_id": 1, "data": {"type": "removed", "block_hashes": [1, 2, 3]}}]"#;
        let decoded = decode_body(json, &limits).unwrap();
        assert_eq!(
            decoded[0].clone().unwrap_err().error,
            EventError::TooLong {
                field: "block_hashes",
                got: 3,
                max: 2
            }
        );
    }

    proptest::proptest! {
        #[test]
        fn no_bytes_make_it_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode_body(&bytes, &Limits::DEFAULT);
        }

        #[test]
        fn no_json_of_the_right_shape_makes_it_panic(
            id in proptest::num::i64::ANY,
            hash in proptest::num::i64::ANY,
            token in proptest::num::i64::ANY,
            kind in "created|stored|removed|updated|x",
        ) {
            let json = format!(
                r#"[{{"event_id": {id}, "data": {{"type": "{kind}", "parent_hash": {hash},
                   "block_hashes": [{hash}], "block_hash": {hash},
                   "blocks": [{{"block_hash": {hash}, "tokens": [{{"token_id": {token}, "token_extra_id": {token}}}]}}]}}}}]"#
            );
            let decoded = decode_body(json.as_bytes(), &Limits::DEFAULT).unwrap();
            proptest::prop_assert_eq!(decoded.len(), 1);
        }
    }
}
