//! Arbitrary request bodies through the filter's body logic: the validity check, the
//! prefill/decode rewrites and the client-params strip. Nothing may panic, and every rewrite
//! of a parsed object must be a JSON object again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_filter::body::{may_steer, screen, RequestDoc, Screened};
use switchyard_protocol::handoff::Handoff;
use switchyard_protocol::openai::CLIENT_STEERING_KEYS;

fuzz_target!(|data: &[u8]| {
    let _ = may_steer(data);
    let passed = match screen(data) {
        Screened::Clean => Some(data.to_vec()),
        Screened::Stripped { body, .. } => Some(body),
        Screened::Invalid(_) => None,
    };
    if let Some(passed) = passed {
        let value: serde_json::Value = serde_json::from_slice(&passed).expect("what passes is JSON");
        for key in CLIENT_STEERING_KEYS {
            assert!(value.get(key).is_none(), "{key} passed the screen");
        }
    }
    if let Ok(mut doc) = RequestDoc::parse(data) {
        let prefill = doc.prefill_body(Handoff::VllmNixl, None, None).expect("a parsed object serialises");
        let prefill: serde_json::Value = serde_json::from_slice(&prefill).expect("valid JSON");
        assert_eq!(prefill["max_tokens"], 1);
        let answer = br#"{"kv_transfer_params":{"remote_host":"h"}}"#;
        let decode = doc
            .decode_leg(Handoff::VllmNixl, answer, None)
            .expect("a parsed object serialises")
            .expect("params hand over")
            .body;
        assert!(serde_json::from_slice::<serde_json::Value>(&decode)
            .expect("valid JSON")
            .is_object());
        doc.strip_steering_keys();
        let _ = doc.to_bytes();
    }
});
