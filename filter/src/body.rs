//! Request bodies: the screen every body the filter passes gets, and the rewrites of the
//! disaggregated path.
//!
//! **The screen.** Some body keys make a worker reach out to another host
//! ([`CLIENT_STEERING_KEYS`]: vLLM's `kv_transfer_params` would make a decode worker pull KV
//! from any `remote_host` a client names). Only the gateway may set them, so every body the
//! filter passes — on every path, routed or not — is screened: a JSON object loses those keys;
//! a body that is not a JSON object cannot be stripped, so on the API paths it is refused with
//! a 400, and elsewhere it is refused only when it might still carry such a key for a more
//! lenient parser (Python's `json` reads `NaN`, for one) ([`may_steer`]). A routed body the
//! control plane parsed may skip the filter's own screen: its verdict vouches that the body
//! named none of those keys (`Verdict::steering_free`), and without that the filter screens it
//! when the answer comes, before any worker sees it.
//!
//! Screening costs one pass over the bytes when no steering key is present: a probe
//! deserializes only those keys and skips the rest without building a tree. Anything else
//! (a key found, a duplicated key, not JSON) takes the slow path: a full parse.
//!
//! Pure and panic-free on any input (property tests and a fuzz target drive arbitrary bytes
//! through it). The workspace builds `serde_json` with `preserve_order`, so a parsed body keeps
//! its key order and a replaced key keeps its position: the body the worker renders with the
//! chat template is the client's, key for key, apart from the keys named here.

use std::fmt;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};
use switchyard_protocol::handoff::{insert_disagg_request_id, BootstrapRoom, DecodeLeg, Handoff};
use switchyard_protocol::json_values::{parse_bounded, BoundedParseError};
use switchyard_protocol::openai::CLIENT_STEERING_KEYS;
use switchyard_protocol::route::is_header_safe_model;

/// Why a body cannot be passed on (the client gets a [`InvalidBody::status`] from the gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvalidBody {
    /// Not JSON (syntax error, truncated, `NaN`).
    NotJson,
    /// JSON, but not an object.
    NotAnObject,
    /// Sent with a `content-encoding` (gzip, ...): the prompt cannot be read to route it, and
    /// no engine decompresses request bodies either.
    Encoded,
    /// A JSON object of more than
    /// [`MAX_JSON_VALUES`](switchyard_protocol::json_values::MAX_JSON_VALUES) values: its tree would not fit the VM (the
    /// disaggregated path holds the client's and a leg's at once), and a crashed VM let
    /// requests through unscreened until Envoy restarted. Or nested
    /// [`MAX_JSON_DEPTH`](switchyard_protocol::json_values::MAX_JSON_DEPTH) levels deep or
    /// more, past the parser's recursion bound.
    TooComplex,
    /// No body at all: a chat or completion request is a JSON object (the engine answers 400
    /// too).
    Empty,
    /// A `content-type` other than `application/json`, or none: vLLM refuses such a request
    /// before reading its body
    /// ([`is_json_content_type`](switchyard_protocol::openai::is_json_content_type)).
    NotJsonContentType,
}

impl InvalidBody {
    /// Label for logs, stats and the response header.
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidBody::NotJson => "not_json",
            InvalidBody::NotAnObject => "not_an_object",
            InvalidBody::Encoded => "encoded",
            InvalidBody::TooComplex => "too_complex",
            InvalidBody::Empty => "empty_body",
            InvalidBody::NotJsonContentType => "not_json_content_type",
        }
    }

    /// The status the client is answered: 400, or 415 for an encoded body.
    pub fn status(self) -> u16 {
        match self {
            InvalidBody::NotJson
            | InvalidBody::NotAnObject
            | InvalidBody::TooComplex
            | InvalidBody::Empty
            | InvalidBody::NotJsonContentType => 400,
            InvalidBody::Encoded => 415,
        }
    }
}

/// Whether a request's `content-encoding` header says its body is encoded: anything but
/// `identity` (the header may list several codings, applied in order).
pub fn is_encoded(content_encoding: Option<&str>) -> bool {
    content_encoding.is_some_and(|codings| {
        codings
            .split(',')
            .map(str::trim)
            .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
    })
}

/// The most body the filter reads before it answers a request it refused on its headers.
///
/// A refusal sent while the client is still uploading ends the request early: Envoy then
/// closes an HTTP/1 connection (`connection: close`, so the client reconnects for its next
/// request) and resets an HTTP/2 stream after the answer (RST_STREAM NO_ERROR, RFC 9113
/// 8.1), which some clients take as a failed request and drop the answer with it (curl 7.88,
/// Debian 12's, exits 92). An ordinary request's body is small and mostly in flight already,
/// so reading it to its end first costs nothing and keeps both the answer and the connection;
/// a body past this size is answered at once, as before, rather than waited for.
pub const REFUSED_BODY_READ_LIMIT: u64 = 64 << 10;

/// Whether a request refused on its headers is answered only once its body has arrived:
/// when its declared `content-length` is at most [`REFUSED_BODY_READ_LIMIT`], or it declares
/// none (chunked, or HTTP/2 without the header: answered when the body ends or passes the
/// limit, whichever is first).
pub fn refusal_waits_for_body(content_length: Option<u64>) -> bool {
    content_length.is_none_or(|length| length <= REFUSED_BODY_READ_LIMIT)
}

/// Whether a request refused on its headers, whose body is being read, is answered now: its
/// body ended, or more of it came than the filter reads of a refused body. That is
/// [`REFUSED_BODY_READ_LIMIT`], or `max_body_bytes` when an operator set it lower: the
/// gateway keeps no more of any body than that, a refused one included.
pub fn refused_body_read_enough(received: u64, end_of_stream: bool, max_body_bytes: u64) -> bool {
    end_of_stream || received > REFUSED_BODY_READ_LIMIT.min(max_body_bytes)
}

impl fmt::Display for InvalidBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the screen found.
#[derive(Debug, Clone, PartialEq)]
pub enum Screened {
    /// A JSON object without steering keys: pass the bytes on as they are.
    Clean,
    /// A JSON object whose steering keys (`removed` of them) were dropped: pass `body` on.
    Stripped {
        /// The parsed body without them.
        doc: RequestDoc,
        /// `doc` serialized.
        body: Vec<u8>,
        /// How many keys were removed.
        removed: usize,
    },
    /// Not a JSON object: nothing could be stripped.
    Invalid(InvalidBody),
}

/// The keys the fast path looks at: every steering key. A duplicated one fails the probe,
/// which sends the body down the slow path, where the last duplicate wins as in the
/// worker's own parser.
#[derive(Deserialize)]
struct Probe {
    kv_transfer_params: Option<IgnoredAny>,
    ec_transfer_params: Option<IgnoredAny>,
    disaggregated_params: Option<IgnoredAny>,
    bootstrap_host: Option<IgnoredAny>,
    bootstrap_port: Option<IgnoredAny>,
    bootstrap_room: Option<IgnoredAny>,
    bootstrap_pair_key: Option<IgnoredAny>,
}

impl Probe {
    fn any(&self) -> bool {
        self.kv_transfer_params.is_some()
            || self.ec_transfer_params.is_some()
            || self.disaggregated_params.is_some()
            || self.bootstrap_host.is_some()
            || self.bootstrap_port.is_some()
            || self.bootstrap_room.is_some()
            || self.bootstrap_pair_key.is_some()
    }
}

// The probe must know every steering key.
const _: () = assert!(CLIENT_STEERING_KEYS.len() == 7);

/// Screens a body (see the module docs).
pub fn screen(body: &[u8]) -> Screened {
    if let Ok(probe) = serde_json::from_slice::<Probe>(body) {
        if !probe.any() {
            return Screened::Clean;
        }
    }
    let mut doc = match RequestDoc::parse(body) {
        Ok(doc) => doc,
        Err(invalid) => return Screened::Invalid(invalid),
    };
    let removed = doc.strip_steering_keys();
    if removed == 0 {
        // The probe failed on something else (a duplicated key): the object is fine as is.
        return Screened::Clean;
    }
    match doc.to_bytes() {
        Ok(body) => Screened::Stripped { doc, body, removed },
        Err(_) => Screened::Invalid(InvalidBody::NotJson),
    }
}

/// The `model` a body names, if it is a JSON object whose `model` is a string that can be a
/// header value ([`is_header_safe_model`]). Read only when a request fails open, to keep it
/// on its model's decode cluster: one pass that builds nothing but that string.
pub fn model_of(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct ModelProbe {
        model: Option<String>,
    }
    // A derived struct also reads a JSON array positionally (`["m"]`); only an object is a
    // request body.
    if !starts_as_object(body) {
        return None;
    }
    let model = serde_json::from_slice::<ModelProbe>(body).ok()?.model?;
    is_header_safe_model(&model).then_some(model)
}

/// Whether `body`'s first non-whitespace byte opens a JSON object: what a request body can be,
/// before a parse says whether it is one.
pub fn starts_as_object(body: &[u8]) -> bool {
    body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// Whether a body that is not a JSON object might still carry a steering key for a parser
/// more lenient than ours: it names one, or holds a `\u` escape that could spell one.
pub fn may_steer(body: &[u8]) -> bool {
    let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    has(b"\\u") || CLIENT_STEERING_KEYS.iter().any(|k| has(k.as_bytes()))
}

/// The decode leg of a handoff, serialized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeBody {
    /// The decode leg's body.
    pub body: Vec<u8>,
    /// The hold to release should the decode leg fail or never come.
    pub hold: Option<String>,
}

/// A parsed request body (a JSON object in the client's key order).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestDoc(Map<String, Value>);

impl RequestDoc {
    /// Parses a body.
    ///
    /// # Errors
    /// The [`InvalidBody`] reason when it is not a JSON object.
    pub fn parse(body: &[u8]) -> Result<RequestDoc, InvalidBody> {
        if !starts_as_object(body) {
            // Not an object, or not JSON: say which without building a tree.
            return Err(match serde_json::from_slice::<IgnoredAny>(body) {
                Ok(_) => InvalidBody::NotAnObject,
                Err(_) => InvalidBody::NotJson,
            });
        }
        match parse_bounded(body) {
            Ok(Value::Object(map)) => Ok(RequestDoc(map)),
            Ok(_) => Err(InvalidBody::NotAnObject),
            Err(BoundedParseError::TooMany | BoundedParseError::TooDeep) => {
                Err(InvalidBody::TooComplex)
            }
            Err(BoundedParseError::Json(_)) => Err(InvalidBody::NotJson),
        }
    }

    /// The body's `model`, if it is a string that can name a header value or a cluster
    /// ([`is_header_safe_model`]).
    pub fn model(&self) -> Option<&str> {
        self.0
            .get("model")
            .and_then(Value::as_str)
            .filter(|model| is_header_safe_model(model))
    }

    /// The body as bytes.
    ///
    /// # Errors
    /// A serialization error (not expected for a parsed value; kept so nothing unwraps).
    pub fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&self.0)
    }

    /// Removes every client steering key; returns how many there were.
    pub fn strip_steering_keys(&mut self) -> usize {
        CLIENT_STEERING_KEYS
            .iter()
            .filter(|k| self.0.shift_remove(**k).is_some())
            .count()
    }

    /// The prefill leg's body under `handoff` (`room` ties SGLang's two legs;
    /// `disagg_request_id` TensorRT-LLM's, when its servers need one).
    ///
    /// # Errors
    /// A serialization error (not expected).
    pub fn prefill_body(
        &self,
        handoff: Handoff,
        room: Option<&BootstrapRoom<'_>>,
        disagg_request_id: Option<u64>,
    ) -> Result<Vec<u8>, serde_json::Error> {
        let mut body = handoff.prefill_body(&self.0, room);
        if let Some(id) = disagg_request_id {
            insert_disagg_request_id(&mut body, id);
        }
        serde_json::to_vec(&body)
    }

    /// The decode leg of a concurrent handoff (SGLang), sent at once with the prefill leg;
    /// `None` for a sequential one.
    ///
    /// # Errors
    /// A serialization error (not expected).
    pub fn concurrent_decode_body(
        &self,
        handoff: Handoff,
        room: &BootstrapRoom<'_>,
    ) -> Result<Option<Vec<u8>>, serde_json::Error> {
        handoff
            .concurrent_decode_body(&self.0, room)
            .map(|body| serde_json::to_vec(&body))
            .transpose()
    }

    /// The decode leg from the prefill worker's answer, or `None` when the decode worker is
    /// to prefill locally (the answer hands nothing over).
    ///
    /// # Errors
    /// Why the answer cannot be used (not the engine's: the prefill leg failed), or a
    /// serialization error (not expected).
    pub fn decode_leg(
        &self,
        handoff: Handoff,
        prefill_answer: &[u8],
        disagg_request_id: Option<u64>,
    ) -> Result<Option<DecodeBody>, String> {
        match handoff.decode_leg(&self.0, prefill_answer) {
            DecodeLeg::Local => Ok(None),
            DecodeLeg::Handoff { mut body, hold } => {
                if let Some(id) = disagg_request_id {
                    insert_disagg_request_id(&mut body, id);
                }
                Ok(Some(DecodeBody {
                    body: serde_json::to_vec(&body).map_err(|e| e.to_string())?,
                    hold,
                }))
            }
            DecodeLeg::Unusable(why) => Err(why),
        }
    }
}

/// An OpenAI-style error body the filter answers itself.
fn error_body(status: u16, kind: &str, message: String) -> Vec<u8> {
    serde_json::json!({
        "error": { "message": message, "type": kind, "param": null, "code": status }
    })
    .to_string()
    .into_bytes()
}

/// The body of the 502 a concurrent handoff's client gets when the prefill leg failed
/// (`failure` says how) while the decode worker waited for its KV.
pub fn prefill_lost_error(failure: &str) -> Vec<u8> {
    error_body(
        502,
        "prefill_failed",
        format!(
            "the prefill worker failed ({failure}) while the decode worker waited for its KV; \
             the request was not served and can be retried"
        ),
    )
}

/// The body of a 413 the filter answers itself.
pub fn too_large_error(size: u64, limit: u64) -> Vec<u8> {
    error_body(
        413,
        "BadRequestError",
        format!("request body of {size} bytes exceeds the gateway's limit of {limit} bytes"),
    )
}

/// The body of the error ([`InvalidBody::status`]) for a body the filter refuses.
pub fn invalid_body_error(invalid: InvalidBody) -> Vec<u8> {
    let message = match invalid {
        InvalidBody::NotJson => "the request body is not valid JSON",
        InvalidBody::NotAnObject => "the request body must be a JSON object",
        InvalidBody::Empty => "the request has no body: a chat or completion request is a JSON object",
        InvalidBody::TooComplex => {
            "the request body holds more JSON values than the gateway parses (524,288), or nests arrays and objects 128 levels deep or more: a chat request needs a few values per message, a prompt of token ids one per token"
        }
        InvalidBody::Encoded => {
            "the request body is content-encoded (content-encoding header): the gateway reads the prompt to route it, so send the body uncompressed, or decompress it in the gateway before the Switchyard filter"
        }
        InvalidBody::NotJsonContentType => {
            "Unsupported Media Type: only 'application/json' is allowed: send the request with content-type: application/json"
        }
    };
    error_body(invalid.status(), "BadRequestError", message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_protocol::json_values::MAX_JSON_VALUES;

    #[test]
    fn a_refusal_waits_for_a_small_or_unsized_body_only() {
        assert!(refusal_waits_for_body(None));
        assert!(refusal_waits_for_body(Some(0)));
        assert!(refusal_waits_for_body(Some(REFUSED_BODY_READ_LIMIT)));
        assert!(!refusal_waits_for_body(Some(REFUSED_BODY_READ_LIMIT + 1)));
        assert!(!refusal_waits_for_body(Some(u64::MAX)));
    }

    #[test]
    fn a_refused_body_is_read_to_its_end_or_its_limit_whichever_is_lower() {
        let max = 16 << 20;
        assert!(!refused_body_read_enough(0, false, max));
        assert!(refused_body_read_enough(0, true, max));
        assert!(!refused_body_read_enough(
            REFUSED_BODY_READ_LIMIT,
            false,
            max
        ));
        assert!(refused_body_read_enough(
            REFUSED_BODY_READ_LIMIT + 1,
            false,
            max
        ));
        // A body limit below the read limit bounds the read too.
        assert!(!refused_body_read_enough(1024, false, 1024));
        assert!(refused_body_read_enough(1025, false, 1024));
    }

    #[test]
    fn a_content_encoding_other_than_identity_is_an_encoded_body() {
        assert!(!is_encoded(None));
        assert!(!is_encoded(Some("identity")));
        assert!(!is_encoded(Some(" Identity ")));
        assert!(!is_encoded(Some("")));
        assert!(is_encoded(Some("gzip")));
        assert!(is_encoded(Some("identity, br")));
        let error: serde_json::Value =
            serde_json::from_slice(&invalid_body_error(InvalidBody::Encoded)).unwrap();
        assert_eq!(error["error"]["code"], 415);
        assert_eq!(InvalidBody::Encoded.as_str(), "encoded");
    }

    #[test]
    fn only_a_body_opening_an_object_can_wait_for_the_verdict() {
        assert!(starts_as_object(b"{}"));
        assert!(starts_as_object(b" \r\n\t{\"model\": "));
        for body in [&b""[..], b"   ", b"[{}]", b"\"{\"", b"null", b"x{"] {
            assert!(!starts_as_object(body), "{body:?}");
        }
    }

    #[test]
    fn the_model_is_read_when_it_can_be_a_header() {
        let chat = br#"{"messages":[{"role":"user","content":"hi"}],"model":"org/m-1.0"}"#;
        assert_eq!(model_of(chat).as_deref(), Some("org/m-1.0"));
        for no in [
            &br#"{"messages":[]}"#[..],
            br#"{"model":3}"#,
            br#"{"model":"a\nb"}"#,
            br#"{"model":""}"#,
            br#"{"model":"a","model":"b"}"#,
            br#"["model"]"#,
            b"not json",
        ] {
            assert_eq!(model_of(no), None, "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn clean_objects_pass_as_they_are() {
        let chat = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(screen(chat), Screened::Clean);
        assert_eq!(
            screen(br#"{"model":"m"}"#),
            Screened::Clean,
            "the control plane checks the rest"
        );
        assert_eq!(
            screen(br#"{"messages":[],"messages":[1]}"#),
            Screened::Clean,
            "a duplicate of another key"
        );
    }

    #[test]
    fn every_steering_key_is_stripped_however_it_is_spelled() {
        let cases: [&[u8]; 6] = [
            br#"{"kv_transfer_params":{"remote_host":"evil"},"prompt":"p"}"#,
            br#"{"prompt":"p","ec_transfer_params":{"ec_items":[{"transfer_id":"x"}]}}"#,
            br#"{"prompt":"p","kv\u005ftransfer_params":{"remote_host":"evil"}}"#,
            br#"{"prompt":"p","kv_transfer_params":null,"kv_transfer_params":{"remote_port":1}}"#,
            br#"{"prompt":"p","bootstrap_host":"evil","bootstrap_port":1,"bootstrap_room":7}"#,
            br#"{"prompt":"p","disaggregated_params":{"request_type":"generation_only"}}"#,
        ];
        for body in cases {
            match screen(body) {
                Screened::Stripped {
                    body: out, removed, ..
                } => {
                    assert!(removed >= 1);
                    assert_eq!(
                        out,
                        br#"{"prompt":"p"}"#,
                        "{}",
                        String::from_utf8_lossy(body)
                    );
                }
                other => panic!("{other:?} for {}", String::from_utf8_lossy(body)),
            }
        }
    }

    #[test]
    fn what_is_not_an_object_is_named() {
        assert_eq!(
            screen(b"{\"model\": \"q\", "),
            Screened::Invalid(InvalidBody::NotJson)
        );
        assert_eq!(screen(b""), Screened::Invalid(InvalidBody::NotJson));
        assert_eq!(
            screen(br#"{"a":NaN,"kv_transfer_params":{}}"#),
            Screened::Invalid(InvalidBody::NotJson)
        );
        assert_eq!(
            screen(b"[1,2]"),
            Screened::Invalid(InvalidBody::NotAnObject)
        );
        assert_eq!(screen(b"42"), Screened::Invalid(InvalidBody::NotAnObject));
    }

    #[test]
    fn unparsable_bodies_that_could_still_steer_are_flagged() {
        assert!(may_steer(br#"{"a":NaN,"kv_transfer_params":{}}"#));
        assert!(may_steer(br#"{"a":NaN,"kv\u005ftransfer_params":{}}"#));
        assert!(!may_steer(b"--boundary\r\nplain form data"));
    }

    #[test]
    fn a_body_of_more_values_than_a_tree_may_hold_is_too_complex() {
        let mut body = br#"{"model":"m","prompt":[1],"x":["#.to_vec();
        body.extend(std::iter::repeat_n(&b"{},"[..], MAX_JSON_VALUES).flatten());
        body.extend(br#"{}],"kv_transfer_params":{}}"#);
        assert_eq!(RequestDoc::parse(&body), Err(InvalidBody::TooComplex));
        assert_eq!(screen(&body), Screened::Invalid(InvalidBody::TooComplex));
        // So is one nested past the parser's bound: valid JSON, not "not JSON".
        let deep = format!(
            r#"{{"model":"m","kv_transfer_params":{{}},"x":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        assert_eq!(
            RequestDoc::parse(deep.as_bytes()),
            Err(InvalidBody::TooComplex)
        );
        // A prompt of 262,144 token ids is well within it.
        let ids = vec!["7"; 262_144].join(",");
        let prompt = format!(r#"{{"model":"m","prompt":[{ids}],"kv_transfer_params":{{}}}}"#);
        assert!(matches!(
            screen(prompt.as_bytes()),
            Screened::Stripped { removed: 1, .. }
        ));
        // Not JSON or not an object is still said as such.
        assert_eq!(RequestDoc::parse(b"{\"a\":"), Err(InvalidBody::NotJson));
        assert_eq!(RequestDoc::parse(b"[1]"), Err(InvalidBody::NotAnObject));
        assert_eq!(RequestDoc::parse(b" nope"), Err(InvalidBody::NotJson));
    }

    #[test]
    fn legs_follow_the_handoff() {
        let doc = RequestDoc::parse(br#"{"model":"m","max_tokens":8,"stream":true}"#).unwrap();
        let prefill: Value =
            serde_json::from_slice(&doc.prefill_body(Handoff::VllmNixl, None, None).unwrap())
                .unwrap();
        assert_eq!(prefill["max_tokens"], 1);
        assert_eq!(prefill["stream"], false);
        let answer = br#"{"kv_transfer_params":{"remote_request_id":"h"}}"#;
        let DecodeBody { body, hold } = doc
            .decode_leg(Handoff::VllmNixl, answer, None)
            .unwrap()
            .unwrap();
        assert_eq!(body, br#"{"model":"m","max_tokens":8,"stream":true,"kv_transfer_params":{"remote_request_id":"h"}}"#);
        assert_eq!(hold.as_deref(), Some("h"));
        assert_eq!(
            doc.decode_leg(Handoff::VllmNixl, b"{}", None).unwrap(),
            None
        );
    }

    #[test]
    fn the_gateways_own_errors_are_openai_shaped() {
        let body: Value = serde_json::from_slice(&too_large_error(20, 10)).unwrap();
        assert_eq!(body["error"]["code"], 413);
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("20 bytes"));
        let body: Value =
            serde_json::from_slice(&invalid_body_error(InvalidBody::NotJson)).unwrap();
        assert_eq!(body["error"]["code"], 400);
        assert_eq!(body["error"]["type"], "BadRequestError");
    }
}
