//! Request bodies: the cheap validity check every routed request gets, and the rewrites of the
//! disaggregated path (the prefill leg's body, the decode leg's injected `kv_transfer_params`).
//!
//! Pure and panic-free on any input (property tests and a fuzz target drive arbitrary bytes
//! through it). The workspace builds `serde_json` with `preserve_order`, so a parsed body keeps
//! its key order and a replaced key keeps its position: the body the worker renders with the
//! chat template is the client's, key for key, apart from the keys named here.

use std::fmt;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};
use switchyard_protocol::route::ApiKind;

/// The request-body key of vLLM's KV connector handshake.
pub const KV_TRANSFER_PARAMS: &str = "kv_transfer_params";

/// Why a body is not routed (it is passed to a worker untouched, which answers with the
/// engine's own canonical error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidBody {
    /// Not JSON (syntax error, truncated).
    NotJson,
    /// JSON, but not an object with the API's prompt field of a plausible type (also a
    /// duplicated known key).
    BadShape,
    /// A JSON object without `messages` (chat) or `prompt` (completions).
    NoPrompt,
}

impl InvalidBody {
    /// Label for logs and the response header.
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidBody::NotJson => "not_json",
            InvalidBody::BadShape => "bad_shape",
            InvalidBody::NoPrompt => "no_prompt",
        }
    }
}

impl fmt::Display for InvalidBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the cheap check found in a body worth routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidBody {
    /// The client sent its own `kv_transfer_params`. The filter removes them: they would make
    /// the decode worker pull KV from any `remote_host` the client names.
    pub has_client_kv_params: bool,
}

/// Only the keys the filter cares about; everything else is skipped without building a tree
/// (`IgnoredAny` still checks the JSON syntax), so the check costs one pass over the bytes.
#[derive(Deserialize)]
struct Probe {
    messages: Option<IgnoredAny>,
    prompt: Option<IgnoredAny>,
    kv_transfer_params: Option<IgnoredAny>,
}

/// Checks that `body` is a JSON object carrying the API's prompt field.
///
/// # Errors
/// The [`InvalidBody`] reason.
pub fn inspect(api: ApiKind, body: &[u8]) -> Result<ValidBody, InvalidBody> {
    let probe: Probe = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            InvalidBody::BadShape
        } else {
            InvalidBody::NotJson
        }
    })?;
    let has_prompt = match api {
        ApiKind::Chat => probe.messages.is_some(),
        ApiKind::Completions => probe.prompt.is_some(),
    };
    if !has_prompt {
        return Err(InvalidBody::NoPrompt);
    }
    Ok(ValidBody {
        has_client_kv_params: probe.kv_transfer_params.is_some(),
    })
}

/// Why a rewrite could not be made (the caller then sends the body as it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RewriteError {
    /// The body is not a JSON object.
    NotAnObject,
    /// Serialisation failed (not expected for a parsed value; kept so nothing unwraps).
    Serialize(String),
}

impl fmt::Display for RewriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewriteError::NotAnObject => f.write_str("the body is not a JSON object"),
            RewriteError::Serialize(e) => write!(f, "cannot serialise the body: {e}"),
        }
    }
}

/// A parsed request body (a JSON object in the client's key order).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestDoc(Map<String, Value>);

impl RequestDoc {
    /// Parses a body.
    ///
    /// # Errors
    /// [`RewriteError::NotAnObject`] if it is not a JSON object.
    pub fn parse(body: &[u8]) -> Result<RequestDoc, RewriteError> {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(RequestDoc(map)),
            _ => Err(RewriteError::NotAnObject),
        }
    }

    /// The body as bytes.
    ///
    /// # Errors
    /// [`RewriteError::Serialize`] (not expected).
    pub fn to_bytes(&self) -> Result<Vec<u8>, RewriteError> {
        serde_json::to_vec(&self.0).map_err(|e| RewriteError::Serialize(e.to_string()))
    }

    /// Removes client-supplied `kv_transfer_params`; true if there were any.
    pub fn strip_kv_params(&mut self) -> bool {
        self.0.shift_remove(KV_TRANSFER_PARAMS).is_some()
    }

    /// The prefill leg's body (vLLM's disaggregated-prefill proxy protocol): the same request
    /// with `max_tokens: 1` (and `max_completion_tokens: 1` when the client set it, since it
    /// wins over `max_tokens` for chat), `stream: false`, no `stream_options`, and
    /// `kv_transfer_params` asking the prefill worker to hold the KV for a remote decode.
    /// Every other key stays where it was.
    ///
    /// # Errors
    /// [`RewriteError::Serialize`] (not expected).
    pub fn prefill_body(&self) -> Result<Vec<u8>, RewriteError> {
        let mut map = self.0.clone();
        map.insert("max_tokens".to_string(), Value::from(1));
        if map.contains_key("max_completion_tokens") {
            map.insert("max_completion_tokens".to_string(), Value::from(1));
        }
        map.insert("stream".to_string(), Value::Bool(false));
        map.shift_remove("stream_options");
        map.insert(KV_TRANSFER_PARAMS.to_string(), prefill_kv_request());
        serde_json::to_vec(&map).map_err(|e| RewriteError::Serialize(e.to_string()))
    }

    /// The decode leg's body: the client's request with the prefill worker's
    /// `kv_transfer_params` set verbatim.
    ///
    /// # Errors
    /// [`RewriteError::Serialize`] (not expected).
    pub fn decode_body(&self, kv_params: &Value) -> Result<Vec<u8>, RewriteError> {
        let mut map = self.0.clone();
        map.insert(KV_TRANSFER_PARAMS.to_string(), kv_params.clone());
        serde_json::to_vec(&map).map_err(|e| RewriteError::Serialize(e.to_string()))
    }
}

/// `kv_transfer_params` of the prefill request (the field set vLLM's NixlConnector expects).
pub fn prefill_kv_request() -> Value {
    serde_json::json!({
        "do_remote_decode": true,
        "do_remote_prefill": false,
        "remote_engine_id": null,
        "remote_block_ids": null,
        "remote_host": null,
        "remote_port": null,
    })
}

#[derive(Deserialize)]
struct PrefillAnswer {
    kv_transfer_params: Option<Value>,
}

/// The `kv_transfer_params` object of a prefill worker's answer, if it has one. `None` (absent,
/// `null`, not an object, or the body is not JSON) means the decode worker prefills locally:
/// vLLM sends none when the prefill already finished the request (EOS on the first token).
pub fn kv_params_from_prefill_answer(body: &[u8]) -> Option<Value> {
    let answer: PrefillAnswer = serde_json::from_slice(body).ok()?;
    match answer.kv_transfer_params? {
        params @ Value::Object(_) => Some(params),
        _ => None,
    }
}

/// The OpenAI-style error body of a 413 the filter answers itself.
pub fn too_large_error(size: u64, limit: u64) -> Vec<u8> {
    serde_json::json!({
        "error": {
            "message": format!("request body of {size} bytes exceeds the gateway's limit of {limit} bytes"),
            "type": "BadRequestError",
            "param": null,
            "code": 413,
        }
    })
    .to_string()
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_bodies_need_the_apis_prompt_field() {
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            inspect(ApiKind::Chat, chat),
            Ok(ValidBody {
                has_client_kv_params: false
            })
        );
        assert_eq!(
            inspect(ApiKind::Completions, chat),
            Err(InvalidBody::NoPrompt)
        );
        assert!(inspect(ApiKind::Completions, br#"{"prompt":"x"}"#).is_ok());
        assert!(inspect(ApiKind::Completions, br#"{"prompt":[1,2,3]}"#).is_ok());
        assert_eq!(
            inspect(ApiKind::Chat, br#"{"messages":[],"kv_transfer_params":{}}"#),
            Ok(ValidBody {
                has_client_kv_params: true
            })
        );
    }

    #[test]
    fn invalid_bodies_are_named() {
        assert_eq!(
            inspect(ApiKind::Chat, b"{\"model\": \"q\", "),
            Err(InvalidBody::NotJson)
        );
        assert_eq!(inspect(ApiKind::Chat, b""), Err(InvalidBody::NotJson));
        assert_eq!(inspect(ApiKind::Chat, b"[1,2]"), Err(InvalidBody::BadShape));
        assert_eq!(inspect(ApiKind::Chat, b"42"), Err(InvalidBody::BadShape));
        assert_eq!(
            inspect(ApiKind::Chat, br#"{"messages":null}"#),
            Err(InvalidBody::NoPrompt)
        );
        assert_eq!(
            inspect(ApiKind::Chat, br#"{"messages":[],"messages":[]}"#),
            Err(InvalidBody::BadShape)
        );
    }

    const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true,"stream_options":{"include_usage":true},"tools":[{"b":1,"a":2}],"temperature":0.5}"#;

    #[test]
    fn the_prefill_body_asks_for_one_token_and_a_remote_decode_keeping_key_order() {
        let doc = RequestDoc::parse(BODY.as_bytes()).expect("object");
        let prefill = String::from_utf8(doc.prefill_body().expect("body")).expect("utf8");
        assert_eq!(
            prefill,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"stream":false,"tools":[{"b":1,"a":2}],"temperature":0.5,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}"#
        );
    }

    #[test]
    fn max_completion_tokens_is_capped_only_when_present() {
        let doc = RequestDoc::parse(br#"{"prompt":"x","max_completion_tokens":99}"#).unwrap();
        let prefill: Value = serde_json::from_slice(&doc.prefill_body().unwrap()).unwrap();
        assert_eq!(prefill["max_completion_tokens"], 1);
        assert_eq!(prefill["max_tokens"], 1);
        let doc = RequestDoc::parse(br#"{"prompt":"x"}"#).unwrap();
        let prefill: Value = serde_json::from_slice(&doc.prefill_body().unwrap()).unwrap();
        assert!(prefill.get("max_completion_tokens").is_none());
    }

    #[test]
    fn the_decode_body_carries_the_prefill_answer_verbatim() {
        let answer = br#"{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"prefill-0","remote_block_ids":[1,2],"remote_request_id":"h-1","remote_host":"127.0.0.1","remote_port":9,"tp_size":1}}"#;
        let params = kv_params_from_prefill_answer(answer).expect("params");
        let doc = RequestDoc::parse(BODY.as_bytes()).unwrap();
        let decode = String::from_utf8(doc.decode_body(&params).unwrap()).unwrap();
        assert!(decode.starts_with(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true,"stream_options":{"include_usage":true},"tools":[{"b":1,"a":2}],"temperature":0.5,"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"prefill-0""#), "{decode}");
        assert!(
            decode.ends_with(r#""remote_port":9,"tp_size":1}}"#),
            "{decode}"
        );
    }

    #[test]
    fn a_client_kv_params_key_keeps_its_place_when_replaced_and_can_be_stripped() {
        let mut doc =
            RequestDoc::parse(br#"{"kv_transfer_params":{"remote_host":"evil"},"prompt":"p"}"#)
                .unwrap();
        let decode = doc.decode_body(&serde_json::json!({"a": 1})).unwrap();
        assert_eq!(decode, br#"{"kv_transfer_params":{"a":1},"prompt":"p"}"#);
        assert!(doc.strip_kv_params());
        assert_eq!(doc.to_bytes().unwrap(), br#"{"prompt":"p"}"#);
        assert!(!doc.strip_kv_params());
    }

    #[test]
    fn prefill_answers_without_usable_params_mean_local_decode() {
        assert!(kv_params_from_prefill_answer(br#"{"id":"x"}"#).is_none());
        assert!(kv_params_from_prefill_answer(br#"{"kv_transfer_params":null}"#).is_none());
        assert!(kv_params_from_prefill_answer(br#"{"kv_transfer_params":[1]}"#).is_none());
        assert!(kv_params_from_prefill_answer(b"upstream connect error").is_none());
    }

    #[test]
    fn the_413_body_is_openai_shaped() {
        let body: Value = serde_json::from_slice(&too_large_error(20, 10)).unwrap();
        assert_eq!(body["error"]["code"], 413);
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("20 bytes"));
    }
}
