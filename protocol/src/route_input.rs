//! The compact route input: what the filter sends instead of the body when it tokenizes
//! itself (filter config `"tokenize": "filter"`, docs/tokenization.md "Tokenizing in the
//! filter").
//!
//! The control plane needs three things from a request to decide: the prompt's block hashes
//! and length (the KV match and the policy), and the fields it validates as the engine would
//! (`model`, `max_tokens`, `n`, `stream`, ...: [`crate::openai::generation_params`]). So the
//! compact input is the block hashes, the ISL, the block size they were hashed at, and the
//! body's JSON object **without its prompt keys** ([`PROMPT_KEYS`]), but for the tools' names. The control plane runs
//! the same validation on those fields as on a whole body, so there is one validation code
//! path; a body the filter cannot tokenize (a client error, or no tokenizer yet) goes as a
//! body, and the control plane answers it exactly as before.
//!
//! Binary, little-endian, because 8,000 block hashes (a 128k-token prompt) are 64 KB this way
//! and about 160 KB as JSON numbers, and the VM writes them with no formatting:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `SYH1` (the format's version is its last byte) |
//! | 4 | ISL (prompt tokens), u32 |
//! | 4 | block size the hashes were made at, u32 |
//! | 4 | number of hashes, u32: exactly `isl / block_size` (full blocks) |
//! | 4 | length of the fields JSON, u32 |
//! | 8 × n | the sequence hashes ([`crate::hash::sequence_hashes`]), u64 each |
//! | rest | the fields: a JSON object (UTF-8), exactly the length above |

use crate::hash::{BlockSize, SequenceHash};

/// Header on a route call whose body is a [`HashedPrompt`] (value [`ROUTE_INPUT_HASHES`]);
/// without it the body is the client's.
pub const ROUTE_INPUT_HEADER: &str = "x-switchyard-route-input";
/// [`ROUTE_INPUT_HEADER`]'s value for a [`HashedPrompt`] body.
pub const ROUTE_INPUT_HASHES: &str = "hashes";
/// Content type of an encoded [`HashedPrompt`].
pub const HASHED_PROMPT_CONTENT_TYPE: &str = "application/x-switchyard-hashed-prompt";
/// The body keys that carry the prompt: the filter leaves them out of
/// [`HashedPrompt::fields`], all but `tools`' names, which a chat's `tool_choice` is checked
/// against. Nothing else the control plane validates reads them (it reads `model` and the
/// generation fields); chat templates do, and the filter has rendered them.
pub const PROMPT_KEYS: [&str; 4] = ["messages", "prompt", "tools", "documents"];

/// Path of the tokenizer bundle on the control plane (`GET`; the model in
/// [`crate::route::MODEL_HEADER`], none for the default model): a JSON `TokenizerBundle`
/// (feature `tokenizer`), 404 for a model the gateway does not serve.
pub const TOKENIZER_PATH: &str = "/v1/tokenizer";

const MAGIC: [u8; 4] = *b"SYH1";
const HEADER_LEN: usize = 20;

/// A tokenized, hashed prompt and the request fields the control plane validates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashedPrompt {
    /// Prompt length in tokens.
    pub isl: u32,
    /// The block size of [`HashedPrompt::hashes`].
    pub block_size: BlockSize,
    /// Sequence hashes of the prompt's full blocks.
    pub hashes: Vec<SequenceHash>,
    /// The request body's JSON object without [`PROMPT_KEYS`], serialised.
    pub fields: Vec<u8>,
}

/// Why bytes are not a [`HashedPrompt`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashedPromptError {
    /// Shorter than the fixed header, or than the lengths it declares.
    #[error("truncated: {len} bytes, {needed} needed")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Bytes the header (or its lengths) call for.
        needed: usize,
    },
    /// Longer than the lengths the header declares.
    #[error("{extra} bytes after the declared end")]
    TrailingBytes {
        /// Bytes beyond the fields.
        extra: usize,
    },
    /// Not this format, or another version of it.
    #[error("not a hashed prompt (magic {0:?}, expected \"SYH1\")")]
    BadMagic([u8; 4]),
    /// The block size is 0 or above [`BlockSize::MAX`].
    #[error("block size {0} out of range")]
    BadBlockSize(u32),
    /// The hash count is not the number of full blocks of the ISL.
    #[error("{hashes} hashes for {isl} tokens in blocks of {block_size}")]
    HashCount {
        /// Hashes declared.
        hashes: u32,
        /// ISL declared.
        isl: u32,
        /// Block size declared.
        block_size: u32,
    },
}

impl HashedPrompt {
    /// The hashed prompt of a request whose prompt is `tokens` and whose body is `body`:
    /// the tokens' sequence hashes at `block_size` and the body's non-prompt fields.
    pub fn of(
        tokens: &[u32],
        block_size: BlockSize,
        body: &serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        HashedPrompt {
            isl: u32::try_from(tokens.len()).unwrap_or(u32::MAX),
            block_size,
            hashes: crate::hash::sequence_hashes(
                tokens,
                block_size,
                crate::hash::HashSeed::default(),
            ),
            fields: non_prompt_fields(body),
        }
    }

    /// The wire bytes (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + 8 * self.hashes.len() + self.fields.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.isl.to_le_bytes());
        out.extend_from_slice(&self.block_size.get().to_le_bytes());
        out.extend_from_slice(&len_u32(self.hashes.len()).to_le_bytes());
        out.extend_from_slice(&len_u32(self.fields.len()).to_le_bytes());
        for hash in &self.hashes {
            out.extend_from_slice(&hash.0.to_le_bytes());
        }
        out.extend_from_slice(&self.fields);
        out
    }

    /// Reads the wire bytes. The fields are not parsed here (the control plane parses them as
    /// it parses a body).
    ///
    /// # Errors
    /// [`HashedPromptError`] naming what is wrong; never panics on any input.
    pub fn decode(bytes: &[u8]) -> Result<Self, HashedPromptError> {
        let truncated = |needed| HashedPromptError::Truncated {
            len: bytes.len(),
            needed,
        };
        let header = bytes.get(..HEADER_LEN).ok_or(truncated(HEADER_LEN))?;
        let word = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&header[i * 4..i * 4 + 4]);
            w
        };
        if word(0) != MAGIC {
            return Err(HashedPromptError::BadMagic(word(0)));
        }
        let [isl, block_size, count, fields_len] =
            [1, 2, 3, 4].map(|i| u32::from_le_bytes(word(i)));
        let block_size = BlockSize::try_new(block_size)
            .map_err(|_| HashedPromptError::BadBlockSize(block_size))?;
        if count != isl / block_size.get() {
            return Err(HashedPromptError::HashCount {
                hashes: count,
                isl,
                block_size: block_size.get(),
            });
        }
        // u64 arithmetic: no overflow on 32-bit targets (the filter's wasm).
        let needed = HEADER_LEN as u64 + 8 * u64::from(count) + u64::from(fields_len);
        let needed = usize::try_from(needed).unwrap_or(usize::MAX);
        if bytes.len() < needed {
            return Err(truncated(needed));
        }
        if bytes.len() > needed {
            return Err(HashedPromptError::TrailingBytes {
                extra: bytes.len() - needed,
            });
        }
        let hashes_end = needed - fields_len as usize;
        let hashes = bytes[HEADER_LEN..hashes_end]
            .chunks_exact(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                SequenceHash(u64::from_le_bytes(w))
            })
            .collect();
        Ok(HashedPrompt {
            isl,
            block_size,
            hashes,
            fields: bytes[hashes_end..].to_vec(),
        })
    }
}

/// A length as the format's u32 (saturating: a request body is at most a few hundred MiB, so
/// saturation would only make `decode` refuse it).
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// The body object without [`PROMPT_KEYS`], serialised (key order kept): the fields of a
/// [`HashedPrompt`]. One prompt key stays in a reduced form: `tools`, as each tool's `type`
/// and `function.name` only, because the chat validation checks `tool_choice` against the
/// tools it chooses from (their schemas and descriptions are in the hashes).
pub fn non_prompt_fields(body: &serde_json::Map<String, serde_json::Value>) -> Vec<u8> {
    let rest: serde_json::Map<String, serde_json::Value> = body
        .iter()
        .filter_map(|(k, v)| match k.as_str() {
            "tools" => Some((k.clone(), tool_names(v))),
            k if PROMPT_KEYS.contains(&k) => None,
            _ => Some((k.clone(), v.clone())),
        })
        .collect();
    serde_json::to_vec(&rest).unwrap_or_else(|_| b"{}".to_vec())
}

/// `tools` as far as validation reads it: each tool's `type` and `function.name`. Anything
/// not shaped as a list of tool objects is kept as it is, so that it is refused as the body
/// would be.
fn tool_names(tools: &serde_json::Value) -> serde_json::Value {
    use serde_json::{Map, Value};
    let Value::Array(tools) = tools else {
        return tools.clone();
    };
    let reduced = tools.iter().map(|tool| {
        let Value::Object(tool) = tool else {
            return tool.clone();
        };
        let mut kept = Map::new();
        if let Some(kind) = tool.get("type") {
            kept.insert("type".to_owned(), kind.clone());
        }
        if let Some(Value::Object(function)) = tool.get("function") {
            let name: Map<String, Value> = function
                .get("name")
                .map(|name| ("name".to_owned(), name.clone()))
                .into_iter()
                .collect();
            kept.insert("function".to_owned(), Value::Object(name));
        }
        Value::Object(kept)
    });
    Value::Array(reduced.collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::{sequence_hashes, HashSeed};

    fn sample(isl: u32) -> HashedPrompt {
        let tokens: Vec<u32> = (0..isl).collect();
        let block_size = BlockSize::try_new(16).unwrap();
        HashedPrompt {
            isl,
            block_size,
            hashes: sequence_hashes(&tokens, block_size, HashSeed::default()),
            fields: br#"{"model":"m","max_tokens":4}"#.to_vec(),
        }
    }

    #[test]
    fn round_trips() {
        for isl in [0, 15, 16, 17, 4_096] {
            let prompt = sample(isl);
            let bytes = prompt.encode();
            assert_eq!(
                bytes.len(),
                20 + 8 * (isl as usize / 16) + prompt.fields.len()
            );
            assert_eq!(HashedPrompt::decode(&bytes), Ok(prompt));
        }
    }

    #[test]
    fn bad_input_is_a_named_error() {
        let good = sample(100).encode();
        assert!(matches!(
            HashedPrompt::decode(&good[..10]),
            Err(HashedPromptError::Truncated {
                len: 10,
                needed: 20
            })
        ));
        assert!(matches!(
            HashedPrompt::decode(&good[..good.len() - 1]),
            Err(HashedPromptError::Truncated { .. })
        ));
        let mut long = good.clone();
        long.push(b' ');
        assert_eq!(
            HashedPrompt::decode(&long),
            Err(HashedPromptError::TrailingBytes { extra: 1 })
        );
        let mut magic = good.clone();
        magic[3] = b'2';
        assert_eq!(
            HashedPrompt::decode(&magic),
            Err(HashedPromptError::BadMagic(*b"SYH2"))
        );
        let mut zero_block = good.clone();
        zero_block[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            HashedPrompt::decode(&zero_block),
            Err(HashedPromptError::BadBlockSize(0))
        );
        let mut count = good.clone();
        count[4..8].copy_from_slice(&200u32.to_le_bytes());
        assert!(matches!(
            HashedPrompt::decode(&count),
            Err(HashedPromptError::HashCount {
                hashes: 6,
                isl: 200,
                block_size: 16
            })
        ));
        // Lengths near u32::MAX are refused, not allocated.
        let mut huge = good;
        huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        huge[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            HashedPrompt::decode(&huge),
            Err(HashedPromptError::Truncated { .. })
        ));
    }

    #[test]
    fn fields_leave_out_the_prompt_and_keep_key_order() {
        let body: serde_json::Value = serde_json::from_str(
            r#"{"stream":true,"messages":[{"role":"user","content":"hi"}],"model":"m","documents":[],"n":2}"#,
        )
        .unwrap();
        let fields = non_prompt_fields(body.as_object().unwrap());
        assert_eq!(fields, br#"{"stream":true,"model":"m","n":2}"#);
    }

    /// The control plane validates a hashed prompt's fields as it validates the body: a
    /// chat's `tool_choice` is checked against the tools, so their names must survive.
    #[test]
    fn fields_validate_as_the_body_does() {
        use crate::openai::generation_params;
        use crate::route::ApiKind;
        let tools = serde_json::json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "search"}}
        ]);
        let mut bodies = Vec::new();
        for tools in [
            None,
            Some(tools),
            Some(serde_json::json!([])),
            Some(serde_json::json!("x")),
        ] {
            for choice in [
                None,
                Some(serde_json::json!("none")),
                Some(serde_json::json!("auto")),
                Some(serde_json::json!("required")),
                Some(serde_json::json!({"type": "function", "function": {"name": "search"}})),
                Some(serde_json::json!({"type": "function", "function": {"name": "other"}})),
                Some(serde_json::json!({"type": "function"})),
            ] {
                let mut body = serde_json::json!({
                    "model": "m", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "weather in Paris?"}]
                });
                if let Some(tools) = &tools {
                    body["tools"] = tools.clone();
                }
                if let Some(choice) = choice {
                    body["tool_choice"] = choice;
                }
                bodies.push(body);
            }
        }
        let mut accepted = 0;
        for body in bodies {
            let body = body.as_object().unwrap();
            let fields: serde_json::Value =
                serde_json::from_slice(&non_prompt_fields(body)).unwrap();
            let from_body = generation_params(ApiKind::Chat, body, 4096);
            let from_fields = generation_params(ApiKind::Chat, fields.as_object().unwrap(), 4096);
            assert_eq!(
                from_body.as_ref().map_err(|e| e.param.clone()),
                from_fields.as_ref().map_err(|e| e.param.clone()),
                "{body:?}"
            );
            accepted += usize::from(from_body.is_ok());
        }
        assert!(accepted >= 4, "the cases include accepted tool choices");
    }

    #[test]
    fn fields_keep_only_the_tool_names() {
        let body: serde_json::Value = serde_json::from_str(
            r#"{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"model":"m"}"#,
        )
        .unwrap();
        let fields = non_prompt_fields(body.as_object().unwrap());
        assert_eq!(
            fields,
            br#"{"tools":[{"type":"function","function":{"name":"f"}}],"model":"m"}"#
        );
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = HashedPrompt::decode(&bytes);
        }
    }
}
