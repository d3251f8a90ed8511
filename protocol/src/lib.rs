//! The contract every Switchyard part shares.
//!
//! Switchyard routes OpenAI-style requests behind Envoy: a proxy-wasm filter asks the control
//! plane for a [`route::Verdict`], the control plane keeps a view of every worker's KV cache
//! built from [`kv`] events, [`worker`] heartbeats and load reports that travel over NATS on
//! the [`subjects`] named here. Everything in this crate builds for native targets and for
//! `wasm32-wasip1` (the filter), so it depends on serde and xxhash only; prompt tokenization
//! lives behind the `tokenizer` feature (which builds for `wasm32-wasip1` too: the filter's
//! `tokenize: filter` mode runs it).
//!
//! # Layout
//! - [`hash`]: token ids -> block hashes (the scheme NVIDIA Dynamo's router uses).
//! - [`handoff`]: the prefill -> decode handoff of each engine protocol (vLLM's NIXL).
//! - [`route`]: the route request the filter sends and the verdict it gets back.
//! - [`route_input`]: the compact route input (block hashes, ISL, the fields the control plane
//!   validates) a filter that tokenizes itself sends instead of the body.
//! - [`worker`]: worker identity, registration/heartbeat, load reports.
//! - [`kv`]: KV cache events and resync requests.
//! - [`lifecycle`]: the filter's per-request lifecycle reports.
//! - [`replica`]: what control-plane replicas share (routing decisions, lifecycle reports,
//!   the config bucket).
//! - [`openai`]: the request fields that change what an engine does, validated as vLLM does,
//!   and the OpenAI error a refused request gets.
//! - `registration` (feature `registration`): signed worker registrations.
//! - [`subjects`]: NATS subject names.
//! - `tokenize` (feature `tokenizer`): prompt -> token ids as vLLM computes them (chat
//!   template rendering, HF tokenizer, segment cache).
#![deny(missing_docs)]

pub mod handoff;
pub mod hash;
pub mod json_values;
pub mod kv;
pub mod lifecycle;
pub mod openai;
#[cfg(feature = "registration")]
pub mod registration;
pub mod replica;
pub mod route;
pub mod route_input;
pub mod subjects;
#[cfg(feature = "tokenizer")]
pub mod tokenize;
pub mod worker;

/// `body` without a leading UTF-8 byte-order mark. Python's `json.loads` accepts one in bytes
/// (vLLM's OpenAI server reads bodies so), serde_json does not; every reader of a request body
/// that an engine would accept goes through here.
pub fn without_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body)
}

/// Reads `bytes` as a JSON object into `T`.
///
/// serde's derived structs also accept a JSON array, taking its items as the fields in
/// declaration order. No Switchyard message, API body or file row is written that way, and a
/// positional row that happened to fit would be read as something its writer did not mean,
/// so every reader of untrusted JSON objects goes through here.
///
/// # Errors
/// serde_json's error for bad JSON or a wrong field; "expected a JSON object" for valid JSON
/// of another kind.
pub fn from_json_object<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
) -> Result<T, serde_json::Error> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        // Bad JSON keeps serde_json's own message, which says where it broke.
        let value: serde_json::Value = serde_json::from_slice(bytes)?;
        let kind = match value {
            serde_json::Value::Array(_) => "an array",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::Bool(_) => "a boolean",
            serde_json::Value::Null => "null",
            serde_json::Value::Object(_) => "an object",
        };
        return Err(serde::de::Error::custom(format!(
            "expected a JSON object, found {kind}"
        )));
    }
    serde_json::from_slice(bytes)
}

/// Version of the wire messages in this crate. Every message carries it as `v`; a receiver
/// rejects messages from a newer major version it cannot understand.
pub const PROTOCOL_VERSION: u32 = 1;

/// Why a message's `v` is not one this build reads (versions start at 1 and go up to
/// [`PROTOCOL_VERSION`]); `None` when it is.
pub fn unsupported_version(v: u32) -> Option<String> {
    match v {
        0 => Some(format!(
            "v: 0 is not a version; they start at 1 (this build reads 1 to {PROTOCOL_VERSION})"
        )),
        v if v > PROTOCOL_VERSION => Some(format!(
            "v: {v} is newer than this build reads ({PROTOCOL_VERSION})"
        )),
        _ => None,
    }
}

/// Default for serde: messages without `v` are version 1.
fn default_version() -> u32 {
    PROTOCOL_VERSION
}

#[cfg(test)]
mod tests {
    use super::{from_json_object, unsupported_version, without_bom, PROTOCOL_VERSION};

    #[test]
    fn versions_run_from_one_to_this_builds() {
        assert_eq!(unsupported_version(1), None);
        assert_eq!(unsupported_version(PROTOCOL_VERSION), None);
        assert!(unsupported_version(0).unwrap().contains("not a version"));
        assert!(unsupported_version(PROTOCOL_VERSION + 1)
            .unwrap()
            .contains("newer"));
    }

    #[test]
    fn a_leading_byte_order_mark_is_dropped_and_nothing_else() {
        let body = b"\xEF\xBB\xBF{\"a\": 1}";
        assert!(serde_json::from_slice::<serde_json::Value>(body).is_err());
        assert_eq!(without_bom(body), b"{\"a\": 1}");
        assert_eq!(without_bom(b"{}"), b"{}");
        // Only at the start: one inside a string is content.
        assert_eq!(without_bom(b" \xEF\xBB\xBF{}"), b" \xEF\xBB\xBF{}");
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Row {
        a: u32,
        b: String,
    }

    #[test]
    fn only_a_json_object_is_read_as_a_struct() {
        let row: Row = from_json_object(b" \n{\"a\": 1, \"b\": \"x\"}").unwrap();
        assert_eq!(
            row,
            Row {
                a: 1,
                b: "x".into()
            }
        );
        // serde_json alone reads this array as the struct above.
        assert!(serde_json::from_slice::<Row>(b"[1, \"x\"]").is_ok());
        let e = from_json_object::<Row>(b"[1, \"x\"]")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "expected a JSON object, found an array");
        let e = from_json_object::<Row>(b"7").unwrap_err().to_string();
        assert_eq!(e, "expected a JSON object, found a number");
        // Bad JSON keeps serde_json's message, with where it broke.
        let e = from_json_object::<Row>(b"[1,").unwrap_err().to_string();
        assert!(e.contains("line 1 column 3"), "{e}");
        let e = from_json_object::<Row>(b"").unwrap_err().to_string();
        assert!(e.contains("EOF"), "{e}");
        // A wrong field in an object is serde_json's error as before.
        let e = from_json_object::<Row>(b"{\"a\": \"1\"}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid type"), "{e}");
    }
}
