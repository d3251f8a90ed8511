//! The prefill -> decode handoff of a disaggregated request, per engine protocol.
//!
//! A [`Handoff`] says how a client's request becomes the prefill leg's body, how the prefill
//! worker's answer becomes the decode leg's body, which client keys must never reach a worker
//! (they would steer it to a host of the client's choosing), whether the two legs run one
//! after the other or at once, and how to give up KV that a prefill worker holds for a decode
//! leg that will not come. The filter drives the legs with it; the simulated worker reads
//! the same types, so both sides of the protocol are written once.
//!
//! - [`Handoff::VllmNixl`]: vLLM's NIXL connector (`docs/vllm.md` has the wire protocol as a
//!   real vLLM 0.32 speaks it; verified against vLLM itself).
//! - [`Handoff::TrtllmDisagg`]: TensorRT-LLM's `trtllm-serve` context-only and
//!   generation-only legs (`docs/engines.md`; verified against the documented protocol).
//! - [`Handoff::SglangBootstrap`]: SGLang's PD disaggregation, both legs at once tied by a
//!   bootstrap room (`docs/engines.md`; verified against the documented protocol).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The request-body key of vLLM's KV connector handshake.
pub const KV_TRANSFER_PARAMS: &str = "kv_transfer_params";
/// The request- and answer-body key of TensorRT-LLM's disaggregated legs.
pub const DISAGGREGATED_PARAMS: &str = "disaggregated_params";
/// `disaggregated_params.request_type` of TensorRT-LLM's prefill leg.
pub const TRTLLM_CONTEXT_ONLY: &str = "context_only";
/// `disaggregated_params.request_type` of TensorRT-LLM's decode leg.
pub const TRTLLM_GENERATION_ONLY: &str = "generation_only";
/// SGLang's request keys naming the prefill worker's bootstrap server and the room that
/// ties the two legs together.
pub const BOOTSTRAP_HOST: &str = "bootstrap_host";
/// See [`BOOTSTRAP_HOST`].
pub const BOOTSTRAP_PORT: &str = "bootstrap_port";
/// See [`BOOTSTRAP_HOST`].
pub const BOOTSTRAP_ROOM: &str = "bootstrap_room";

/// `disaggregated_params` key of the id a gateway draws for both of a TensorRT-LLM request's
/// legs, when the servers move KV with the Python transceiver (it needs one; a 1.0 server
/// refuses the field).
pub const DISAGG_REQUEST_ID: &str = "disagg_request_id";
/// The smallest `disagg_request_id`: TensorRT-LLM keeps a server's own request ids below it
/// and a gateway's at or above, so the two never collide.
pub const MIN_DISAGG_REQUEST_ID: u64 = 1 << 40;

/// A `disagg_request_id` from 64 random bits: in `[2^40, 2^63)` (a non-negative 64-bit
/// integer, as TensorRT-LLM's are), with 62 bits drawn. TensorRT-LLM's own orchestrator packs
/// a clock, a node id and a counter instead; it only needs the id not to repeat among the
/// requests a context server holds at once, and without coordination between gateways
/// random bits are the safe way to get that.
pub fn disagg_request_id(bits: u64) -> u64 {
    (bits >> 1) | MIN_DISAGG_REQUEST_ID
}

/// Puts `id` into a TensorRT-LLM leg's `disaggregated_params` (a body without them, as a
/// decode worker's local prefill, is left alone).
pub fn insert_disagg_request_id(body: &mut Map<String, Value>, id: u64) {
    if let Some(Value::Object(params)) = body.get_mut(DISAGGREGATED_PARAMS) {
        params.insert(DISAGG_REQUEST_ID.to_string(), Value::from(id));
    }
}

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
    /// TensorRT-LLM: the prefill leg carries `disaggregated_params.request_type:
    /// "context_only"`; the answer's `choices[0].disaggregated_params` go into the decode leg
    /// with `request_type: "generation_only"`.
    TrtllmDisagg,
    /// SGLang: both legs carry the prefill worker's `bootstrap_host` and `bootstrap_port` and
    /// one `bootstrap_room`, and are sent at once; the decode worker fetches the KV from the
    /// prefill worker through the room.
    SglangBootstrap,
}

/// Where an SGLang decode worker finds its KV: the prefill worker's bootstrap server and the
/// request's room on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootstrapRoom<'a> {
    /// The prefill worker's host (the host of its `host:port` address).
    pub host: &'a str,
    /// Its bootstrap server's port.
    pub port: u16,
    /// The room: 63 random bits, unique per request.
    pub room: u64,
}

impl BootstrapRoom<'_> {
    /// A room from 64 random bits: SGLang's rooms are non-negative 63-bit integers.
    pub fn room_from_bits(bits: u64) -> u64 {
        bits & (u64::MAX >> 1)
    }

    fn insert_into(&self, body: &mut Map<String, Value>) {
        body.insert(BOOTSTRAP_HOST.to_string(), Value::from(self.host));
        body.insert(BOOTSTRAP_PORT.to_string(), Value::from(self.port));
        body.insert(BOOTSTRAP_ROOM.to_string(), Value::from(self.room));
    }
}

/// The host part of a `host:port` address (`[::1]:80` gives `::1`).
pub fn address_host(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
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

/// `disaggregated_params` as TensorRT-LLM's OpenAI server reads and writes them. Unknown
/// fields are kept (`extra`), so newer versions' fields pass through to the decode leg.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrtllmDisaggregatedParams {
    /// `context_only` (prefill leg, and its answer) or `generation_only` (decode leg).
    #[serde(default)]
    pub request_type: Option<String>,
    /// The token(s) the context server generated: the decode leg's first output.
    #[serde(default)]
    pub first_gen_tokens: Option<Vec<u32>>,
    /// The context request's id on the context server.
    #[serde(default)]
    pub ctx_request_id: Option<u64>,
    /// The context server's transfer state (base64), opaque to everyone but the engines.
    #[serde(default)]
    pub encoded_opaque_state: Option<String>,
    /// Draft tokens (speculative decoding).
    #[serde(default)]
    pub draft_tokens: Option<Vec<u32>>,
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
    /// The prefill answer is not one the engine gives (not JSON, or its handoff field of the
    /// wrong type): the prefill leg failed, whatever its status said.
    Unusable(String),
}

impl Handoff {
    /// Whether the legs are sequential or concurrent.
    pub fn order(self) -> LegOrder {
        match self {
            Handoff::VllmNixl | Handoff::TrtllmDisagg => LegOrder::Sequential,
            Handoff::SglangBootstrap => LegOrder::Concurrent,
        }
    }

    /// The prefill leg's body: the client's request without streaming (`stream: false`, no
    /// `stream_options`: the gateway reads the answer, the client never sees it), plus the
    /// engine's request for a remote decode (`room` for SGLang, ignored by the others). vLLM's
    /// leg asks for one output token, as vLLM's own proxy does (`max_completion_tokens` too
    /// when the client set it: it wins over `max_tokens` for chat); TensorRT-LLM's and
    /// SGLang's keep the client's, as their orchestrators do (their prefill servers generate
    /// one token whatever it says). Every other key stays where it was.
    pub fn prefill_body(
        self,
        client: &Map<String, Value>,
        room: Option<&BootstrapRoom<'_>>,
    ) -> Map<String, Value> {
        let mut map = client.clone();
        map.insert("stream".to_string(), Value::Bool(false));
        map.shift_remove("stream_options");
        match self {
            Handoff::VllmNixl => {
                map.insert("max_tokens".to_string(), Value::from(1));
                if map.contains_key("max_completion_tokens") {
                    map.insert("max_completion_tokens".to_string(), Value::from(1));
                }
                // vLLM refuses `min_tokens` above `max_tokens`: a client's `min_tokens: 10`
                // made every prefill leg a 400, and the request fell back to local prefill.
                // The leg's one token is thrown away; the decode leg keeps the client's.
                map.shift_remove("min_tokens");
                map.insert(KV_TRANSFER_PARAMS.to_string(), vllm_prefill_request());
            }
            Handoff::TrtllmDisagg => {
                map.insert(
                    DISAGGREGATED_PARAMS.to_string(),
                    serde_json::json!({ "request_type": TRTLLM_CONTEXT_ONLY }),
                );
            }
            Handoff::SglangBootstrap => {
                if let Some(room) = room {
                    room.insert_into(&mut map);
                }
            }
        }
        map
    }

    /// The decode leg of a sequential handoff, from the client's request and the prefill
    /// worker's answer body. A concurrent handoff's decode leg does not wait for an answer
    /// ([`Handoff::concurrent_decode_body`]): here it is [`DecodeLeg::Local`].
    pub fn decode_leg(self, client: &Map<String, Value>, prefill_answer: &[u8]) -> DecodeLeg {
        match self {
            Handoff::VllmNixl => {
                let params = match vllm_answer_params(prefill_answer) {
                    Ok(Some(params)) => params,
                    Ok(None) => return DecodeLeg::Local,
                    Err(why) => return DecodeLeg::Unusable(why),
                };
                let hold = params
                    .get("remote_request_id")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let mut body = client.clone();
                body.insert(KV_TRANSFER_PARAMS.to_string(), Value::Object(params));
                DecodeLeg::Handoff { body, hold }
            }
            Handoff::TrtllmDisagg => {
                let mut params = match trtllm_answer_params(prefill_answer) {
                    Ok(Some(params)) => params,
                    Ok(None) => return DecodeLeg::Local,
                    Err(why) => return DecodeLeg::Unusable(why),
                };
                // No hold to release: TensorRT-LLM frees context KV nobody fetched after its
                // `kv_transfer_timeout_ms`, and has no call to free it sooner.
                params.insert(
                    "request_type".to_string(),
                    Value::from(TRTLLM_GENERATION_ONLY),
                );
                let mut body = client.clone();
                body.insert(DISAGGREGATED_PARAMS.to_string(), Value::Object(params));
                DecodeLeg::Handoff { body, hold: None }
            }
            Handoff::SglangBootstrap => DecodeLeg::Local,
        }
    }

    /// The decode leg of a concurrent handoff (SGLang): the client's request, streaming as
    /// the client asked, with the same bootstrap fields as the prefill leg. `None` for a
    /// sequential handoff.
    pub fn concurrent_decode_body(
        self,
        client: &Map<String, Value>,
        room: &BootstrapRoom<'_>,
    ) -> Option<Map<String, Value>> {
        match self.order() {
            LegOrder::Sequential => None,
            LegOrder::Concurrent => {
                let mut body = client.clone();
                room.insert_into(&mut body);
                Some(body)
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

/// The `kv_transfer_params` object of a vLLM prefill answer, verbatim; `None` when absent or
/// `null` (the prefill finished the request).
///
/// # Errors
/// Why the answer is not vLLM's: not a JSON object, or `kv_transfer_params` not an object.
fn vllm_answer_params(body: &[u8]) -> Result<Option<Map<String, Value>>, String> {
    let answer: VllmAnswer = crate::from_json_object(body)
        .map_err(|e| format!("the prefill answer is not vLLM's: {e}"))?;
    match answer.kv_transfer_params {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(params)) => Ok(Some(params)),
        Some(_) => Err("the prefill answer's kv_transfer_params is not an object".into()),
    }
}

#[derive(Deserialize)]
struct TrtllmAnswer {
    choices: Vec<TrtllmChoice>,
}

#[derive(Deserialize)]
struct TrtllmChoice {
    disaggregated_params: Option<Value>,
    finish_reason: Option<String>,
}

/// The `choices[0].disaggregated_params` object of a TensorRT-LLM context answer, verbatim.
/// `None` (the decode worker serves the request whole) when absent or `null`; when the answer
/// has not exactly one choice (TensorRT-LLM's own orchestrator refuses several); or when the
/// context server already finished the request (a `finish_reason` other than `length` or
/// `not_finished`: EOS or a stop string on the first token, where TensorRT-LLM's
/// orchestrator runs no generation leg either).
///
/// # Errors
/// Why the answer is not TensorRT-LLM's: not a JSON object of `choices`, or
/// `disaggregated_params` not an object.
fn trtllm_answer_params(body: &[u8]) -> Result<Option<Map<String, Value>>, String> {
    let answer: TrtllmAnswer = crate::from_json_object(body)
        .map_err(|e| format!("the context answer is not TensorRT-LLM's: {e}"))?;
    let Ok([choice]) = <[TrtllmChoice; 1]>::try_from(answer.choices) else {
        return Ok(None);
    };
    if !matches!(
        choice.finish_reason.as_deref(),
        Some("length" | "not_finished")
    ) {
        return Ok(None);
    }
    match choice.disaggregated_params {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(params)) => Ok(Some(params)),
        Some(_) => Err("the context answer's disaggregated_params is not an object".into()),
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
        let prefill = Value::Object(Handoff::VllmNixl.prefill_body(&client, None)).to_string();
        assert_eq!(
            prefill,
            r#"{"model":"m","messages":[],"max_tokens":1,"stream":false,"tools":[{"b":1,"a":2}],"temperature":0.5,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}"#
        );
        let capped =
            Handoff::VllmNixl.prefill_body(&object(json!({"max_completion_tokens": 9})), None);
        assert_eq!(capped["max_completion_tokens"], 1);
        assert!(!Handoff::VllmNixl
            .prefill_body(&object(json!({})), None)
            .contains_key("max_completion_tokens"));
        // vLLM refuses min_tokens > max_tokens: the leg drops it, the decode leg keeps it.
        let client = object(json!({"max_tokens": 64, "min_tokens": 10}));
        assert!(!Handoff::VllmNixl
            .prefill_body(&client, None)
            .contains_key("min_tokens"));
        let answer = br#"{"kv_transfer_params":{"remote_request_id":"h"}}"#;
        match Handoff::VllmNixl.decode_leg(&client, answer) {
            DecodeLeg::Handoff { body, .. } => assert_eq!(body["min_tokens"], 10),
            other => panic!("{other:?}"),
        }
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
        for no_handoff in [&br#"{"id":"x"}"#[..], br#"{"kv_transfer_params":null}"#] {
            assert_eq!(
                Handoff::VllmNixl.decode_leg(&client, no_handoff),
                DecodeLeg::Local
            );
        }
        // Not an answer vLLM gives: the prefill leg failed, whatever its status said.
        for broken in [
            &br#"{"kv_transfer_params":3}"#[..],
            br#"{"kv_transfer_params":"x"}"#,
            b"not json",
            b"<html>ok</html>",
            br#"["kv_transfer_params"]"#,
        ] {
            assert!(
                matches!(
                    Handoff::VllmNixl.decode_leg(&client, broken),
                    DecodeLeg::Unusable(_)
                ),
                "{}",
                String::from_utf8_lossy(broken)
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

    #[test]
    fn the_trtllm_context_leg_asks_for_context_only_and_keeps_max_tokens() {
        let client = object(
            json!({"model":"m","messages":[],"max_tokens":64,"stream":true,
            "stream_options":{"include_usage":true}}),
        );
        let prefill = Value::Object(Handoff::TrtllmDisagg.prefill_body(&client, None)).to_string();
        assert_eq!(
            prefill,
            r#"{"model":"m","messages":[],"max_tokens":64,"stream":false,"disaggregated_params":{"request_type":"context_only"}}"#
        );
    }

    #[test]
    fn a_disagg_request_id_goes_into_both_trtllm_legs_and_is_a_gateway_id() {
        let client = object(json!({"model": "m", "messages": [], "stream": true}));
        let mut prefill = Handoff::TrtllmDisagg.prefill_body(&client, None);
        insert_disagg_request_id(&mut prefill, disagg_request_id(u64::MAX));
        assert_eq!(
            prefill[DISAGGREGATED_PARAMS],
            json!({"request_type": "context_only", "disagg_request_id": (1u64 << 63) - 1})
        );
        let answer = br#"{"choices":[{"index":0,"finish_reason":"length","disaggregated_params":{"request_type":"context_only","ctx_request_id":42}}]}"#;
        let DecodeLeg::Handoff { mut body, .. } = Handoff::TrtllmDisagg.decode_leg(&client, answer)
        else {
            panic!("a handoff");
        };
        insert_disagg_request_id(&mut body, disagg_request_id(0));
        assert_eq!(
            body[DISAGGREGATED_PARAMS][DISAGG_REQUEST_ID],
            json!(MIN_DISAGG_REQUEST_ID)
        );
        // A body without the params (a local prefill) is left alone.
        let mut local = client.clone();
        insert_disagg_request_id(&mut local, 1 << 50);
        assert_eq!(local, client);
        for bits in [0, 1, 1 << 40, u64::MAX >> 1, u64::MAX] {
            let id = disagg_request_id(bits);
            assert!(
                (MIN_DISAGG_REQUEST_ID..1 << 63).contains(&id),
                "{bits}: {id}"
            );
        }
    }

    #[test]
    fn the_trtllm_answer_params_become_the_generation_only_leg() {
        let client = object(json!({"model":"m","max_tokens":8,"stream":true}));
        let answer = br#"{"id":"x","choices":[{"index":0,"text":"a","finish_reason":"length","disaggregated_params":{"request_type":"context_only","first_gen_tokens":[7],"ctx_request_id":42,"encoded_opaque_state":"AAE=","draft_tokens":null,"ctx_dp_rank":0}}]}"#;
        match Handoff::TrtllmDisagg.decode_leg(&client, answer) {
            DecodeLeg::Handoff { body, hold } => {
                assert_eq!(hold, None);
                assert_eq!(
                    Value::Object(body).to_string(),
                    r#"{"model":"m","max_tokens":8,"stream":true,"disaggregated_params":{"request_type":"generation_only","first_gen_tokens":[7],"ctx_request_id":42,"encoded_opaque_state":"AAE=","draft_tokens":null,"ctx_dp_rank":0}}"#
                );
            }
            other => panic!("{other:?}"),
        }
        let params = r#""disaggregated_params":{"ctx_request_id":1}"#;
        for no_handoff in [
            // Finished on the first token: no generation leg.
            format!(r#"{{"choices":[{{"finish_reason":"stop",{params}}}]}}"#),
            format!(r#"{{"choices":[{{"finish_reason":null,{params}}}]}}"#),
            // Two choices, none, no params, params not an object, not JSON.
            format!(
                r#"{{"choices":[{{"finish_reason":"length",{params}}},{{"finish_reason":"length",{params}}}]}}"#
            ),
            r#"{"choices":[]}"#.to_string(),
            r#"{"choices":[{"finish_reason":"length"}]}"#.to_string(),
        ] {
            assert_eq!(
                Handoff::TrtllmDisagg.decode_leg(&client, no_handoff.as_bytes()),
                DecodeLeg::Local,
                "{no_handoff}"
            );
        }
        // Not an answer TensorRT-LLM gives: the context leg failed.
        for broken in [
            r#"{"choices":[{"finish_reason":"length","disaggregated_params":[1]}]}"#,
            // vLLM's answer shape is not TensorRT-LLM's.
            r#"{"kv_transfer_params":{"remote_request_id":"h"}}"#,
            "not json",
        ] {
            assert!(
                matches!(
                    Handoff::TrtllmDisagg.decode_leg(&client, broken.as_bytes()),
                    DecodeLeg::Unusable(_)
                ),
                "{broken}"
            );
        }
        let not_finished =
            format!(r#"{{"choices":[{{"finish_reason":"not_finished",{params}}}]}}"#);
        assert!(matches!(
            Handoff::TrtllmDisagg.decode_leg(&client, not_finished.as_bytes()),
            DecodeLeg::Handoff { .. }
        ));
    }

    #[test]
    fn sglang_legs_carry_the_same_bootstrap_fields_and_run_at_once() {
        let client = object(json!({"model":"m","messages":[],"max_tokens":64,"stream":true}));
        let room = BootstrapRoom {
            host: address_host("[::1]:30000"),
            port: 8998,
            room: BootstrapRoom::room_from_bits(u64::MAX),
        };
        assert_eq!(room.host, "::1");
        assert_eq!(room.room, (1 << 63) - 1);
        let prefill = Handoff::SglangBootstrap.prefill_body(&client, Some(&room));
        let decode = Handoff::SglangBootstrap
            .concurrent_decode_body(&client, &room)
            .unwrap();
        assert_eq!(
            Value::Object(decode).to_string(),
            r#"{"model":"m","messages":[],"max_tokens":64,"stream":true,"bootstrap_host":"::1","bootstrap_port":8998,"bootstrap_room":9223372036854775807}"#
        );
        assert_eq!(prefill["stream"], false);
        assert_eq!(prefill["max_tokens"], 64);
        assert_eq!(prefill["bootstrap_room"], 9223372036854775807u64);
        assert_eq!(Handoff::SglangBootstrap.order(), LegOrder::Concurrent);
        assert_eq!(
            Handoff::SglangBootstrap.decode_leg(&client, b"{}"),
            DecodeLeg::Local
        );
        assert_eq!(
            Handoff::VllmNixl.concurrent_decode_body(&client, &room),
            None
        );
        assert_eq!(address_host("10.0.0.1:80"), "10.0.0.1");
        assert_eq!(address_host("worker-3"), "worker-3");
    }

    #[test]
    fn every_engine_names_its_handoff() {
        use crate::worker::Engine;
        assert_eq!(Engine::Vllm.handoff(), Handoff::VllmNixl);
        assert_eq!(Engine::Trtllm.handoff(), Handoff::TrtllmDisagg);
        assert_eq!(Engine::Sglang.handoff(), Handoff::SglangBootstrap);
        for engine in Engine::ALL {
            assert_eq!(engine.as_str().parse::<Engine>(), Ok(engine));
            assert_eq!(
                serde_json::to_value(engine).unwrap(),
                Value::from(engine.as_str())
            );
        }
        assert!("tensorrt".parse::<Engine>().is_err());
    }
}
