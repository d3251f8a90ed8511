//! The prefill -> decode handoff of a disaggregated request, per engine protocol.
//!
//! A [`Handoff`] says how a client's request becomes the prefill leg's body, how the prefill
//! worker's answer becomes the decode leg's body, which client keys must never reach a worker
//! (they would steer it to a host of the client's choosing), whether the two legs run one
//! after the other or at once, and how to give up KV that a prefill worker holds for a decode
//! leg that will not come. The filter drives the legs with it; the simulated worker reads
//! the same types, so both sides of the protocol are written once.
//!
//! Implemented: vLLM's NIXL connector ([`Handoff::VllmNixl`], `docs/vllm.md` has the wire
//! protocol as a real vLLM 0.32 speaks it).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The request-body key of vLLM's KV connector handshake.
pub const KV_TRANSFER_PARAMS: &str = "kv_transfer_params";

/// Path on a simulated prefill worker that releases a hold unpulled (real vLLM has none: it
/// frees unpulled KV after `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`).
pub const RELEASE_PATH: &str = "/switchyard/kv/release";

/// Whether the decode leg waits for the prefill leg's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegOrder {
    /// Prefill first; its answer goes into the decode leg (vLLM, TensorRT-LLM).
    Sequential,
    /// Both at once, tied by an id chosen beforehand (SGLang's bootstrap room).
    Concurrent,
}

/// An engine's handoff protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Handoff {
    /// vLLM's NixlConnector: the prefill leg carries `kv_transfer_params` asking for a remote
    /// decode; the answer's `kv_transfer_params` go verbatim into the decode leg.
    #[default]
    VllmNixl,
}

/// `kv_transfer_params` as vLLM's NixlConnector reads and writes them. Unknown fields are
/// kept (`extra`), missing ones default, so bodies from real vLLM, its proxies and our filter
/// all parse.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VllmKvTransferParams {
    /// Set on the prefill leg: compute the KV and hold it for a decode worker.
    #[serde(default)]
    pub do_remote_decode: bool,
    /// Set on the decode leg: pull the KV named below instead of prefilling.
    #[serde(default)]
    pub do_remote_prefill: bool,
    /// The prefill engine.
    #[serde(default)]
    pub remote_engine_id: Option<String>,
    /// Engine block ids held on the prefill worker (a list, or one list per KV cache group
    /// in newer vLLM; kept as JSON).
    #[serde(default)]
    pub remote_block_ids: Option<Value>,
    /// The hold's id on the prefill worker (vLLM: the prefill request's id).
    #[serde(default)]
    pub remote_request_id: Option<String>,
    /// Host of the prefill engine's side channel.
    #[serde(default)]
    pub remote_host: Option<String>,
    /// Port of the prefill engine's side channel.
    #[serde(default)]
    pub remote_port: Option<u16>,
    /// Tensor-parallel size of the prefill engine.
    #[serde(default)]
    pub tp_size: Option<u32>,
    /// Fields this version does not know, carried along.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What the prefill answer says the decode leg should do.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeLeg {
    /// Pull the prefilled KV: send this body (the client's, plus the handoff fields).
    Handoff {
        /// The decode leg's body.
        body: Map<String, Value>,
        /// The hold to release if the decode leg never takes the KV.
        hold: Option<String>,
    },
    /// Prefill locally: the prefill answer carries no handoff (vLLM's answer when the prefill
    /// already finished the request, EOS on the first token).
    Local,
}

impl Handoff {
    /// Whether the legs are sequential or concurrent.
    pub fn order(self) -> LegOrder {
        match self {
            Handoff::VllmNixl => LegOrder::Sequential,
        }
    }

    /// The prefill leg's body: the client's request with one output token, no streaming
    /// (`stream: false`, no `stream_options`), and the engine's request for a remote decode.
    /// `max_completion_tokens` is capped too when the client set it (it wins over
    /// `max_tokens` for chat). Every other key stays where it was.
    pub fn prefill_body(self, client: &Map<String, Value>) -> Map<String, Value> {
        let mut map = client.clone();
        map.insert("max_tokens".to_string(), Value::from(1));
        if map.contains_key("max_completion_tokens") {
            map.insert("max_completion_tokens".to_string(), Value::from(1));
        }
        map.insert("stream".to_string(), Value::Bool(false));
        map.shift_remove("stream_options");
        match self {
            Handoff::VllmNixl => {
                map.insert(KV_TRANSFER_PARAMS.to_string(), vllm_prefill_request());
            }
        }
        map
    }

    /// The decode leg, from the client's request and the prefill worker's answer body.
    pub fn decode_leg(self, client: &Map<String, Value>, prefill_answer: &[u8]) -> DecodeLeg {
        match self {
            Handoff::VllmNixl => {
                let Some(params) = vllm_answer_params(prefill_answer) else {
                    return DecodeLeg::Local;
                };
                let hold = params
                    .get("remote_request_id")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let mut body = client.clone();
                body.insert(KV_TRANSFER_PARAMS.to_string(), Value::Object(params));
                DecodeLeg::Handoff { body, hold }
            }
        }
    }
}

/// The `kv_transfer_params` of vLLM's prefill request: exactly the fields vLLM's own
/// disaggregated-serving proxy sends.
fn vllm_prefill_request() -> Value {
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
struct VllmAnswer {
    kv_transfer_params: Option<Value>,
}

/// The `kv_transfer_params` object of a vLLM prefill answer, verbatim; `None` when absent,
/// `null`, not an object, or the body is not JSON.
fn vllm_answer_params(body: &[u8]) -> Option<Map<String, Value>> {
    let answer: VllmAnswer = serde_json::from_slice(body).ok()?;
    match answer.kv_transfer_params? {
        Value::Object(params) => Some(params),
        _ => None,
    }
}

/// The body of a release call ([`RELEASE_PATH`]) for `hold`.
pub fn release_body(hold: &str) -> Vec<u8> {
    serde_json::json!({"remote_request_id": hold, "requester": "switchyard-gateway"})
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn the_vllm_prefill_leg_asks_for_one_token_and_a_remote_decode_keeping_key_order() {
        let client = object(
            json!({"model":"m","messages":[],"max_tokens":64,"stream":true,
            "stream_options":{"include_usage":true},"tools":[{"b":1,"a":2}],"temperature":0.5}),
        );
        let prefill = Value::Object(Handoff::VllmNixl.prefill_body(&client)).to_string();
        assert_eq!(
            prefill,
            r#"{"model":"m","messages":[],"max_tokens":1,"stream":false,"tools":[{"b":1,"a":2}],"temperature":0.5,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}"#
        );
        let capped = Handoff::VllmNixl.prefill_body(&object(json!({"max_completion_tokens": 9})));
        assert_eq!(capped["max_completion_tokens"], 1);
        assert!(!Handoff::VllmNixl
            .prefill_body(&object(json!({})))
            .contains_key("max_completion_tokens"));
    }

    #[test]
    fn the_answer_params_go_verbatim_into_the_decode_leg() {
        let client = object(json!({"model":"m","max_tokens":8}));
        let answer = br#"{"id":"x","kv_transfer_params":{"remote_request_id":"h-1","remote_host":"10.0.0.1","remote_port":5600,"transfer_mode":"pull","do_remote_prefill":true}}"#;
        match Handoff::VllmNixl.decode_leg(&client, answer) {
            DecodeLeg::Handoff { body, hold } => {
                assert_eq!(hold.as_deref(), Some("h-1"));
                assert_eq!(
                    Value::Object(body).to_string(),
                    r#"{"model":"m","max_tokens":8,"kv_transfer_params":{"remote_request_id":"h-1","remote_host":"10.0.0.1","remote_port":5600,"transfer_mode":"pull","do_remote_prefill":true}}"#
                );
            }
            other => panic!("{other:?}"),
        }
        for no_handoff in [
            &br#"{"id":"x"}"#[..],
            br#"{"kv_transfer_params":null}"#,
            br#"{"kv_transfer_params":3}"#,
            b"not json",
        ] {
            assert_eq!(
                Handoff::VllmNixl.decode_leg(&client, no_handoff),
                DecodeLeg::Local
            );
        }
    }

    #[test]
    fn vllm_params_parse_every_shape_and_keep_unknown_fields() {
        let p: VllmKvTransferParams = serde_json::from_value(json!({"do_remote_prefill": true,
            "remote_block_ids": [[1, 2]], "remote_port": 1, "transfer_mode": "pull"}))
        .unwrap();
        assert!(p.do_remote_prefill && !p.do_remote_decode);
        assert_eq!(p.extra["transfer_mode"], "pull");
        assert_eq!(Handoff::VllmNixl.order(), LegOrder::Sequential);
    }
}
