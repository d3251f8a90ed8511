//! Arbitrary request bodies through the filter's body logic: the validity check, the
//! prefill/decode rewrites and the client-params strip. Nothing may panic, and every rewrite
//! of a parsed object must be a JSON object again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_filter::body::{inspect, RequestDoc};
use switchyard_protocol::route::ApiKind;

fuzz_target!(|data: &[u8]| {
    let _ = inspect(ApiKind::Chat, data);
    let _ = inspect(ApiKind::Completions, data);
    if let Ok(mut doc) = RequestDoc::parse(data) {
        let prefill = doc.prefill_body().expect("a parsed object serialises");
        let prefill: serde_json::Value = serde_json::from_slice(&prefill).expect("valid JSON");
        assert_eq!(prefill["max_tokens"], 1);
        let decode = doc
            .decode_body(&serde_json::json!({"remote_host": "h"}))
            .expect("a parsed object serialises");
        assert!(serde_json::from_slice::<serde_json::Value>(&decode)
            .expect("valid JSON")
            .is_object());
        doc.strip_kv_params();
        let _ = doc.to_bytes();
    }
});
