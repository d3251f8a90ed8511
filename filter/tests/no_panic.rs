//! Property tests: no route-call answer and no header set makes the filter's logic panic, and
//! the outcome always respects the verdict or fails open.

use proptest::prelude::*;
use switchyard_filter::request::{
    canonical_path, choose_request_id, headers_to_strip, routable_api,
};
use switchyard_filter::verdict::{
    classify_route_response, is_valid_endpoint_address, RouteOutcome,
};

fn verdict_body(mode: &str, address: &str, extra: &str) -> Vec<u8> {
    serde_json::json!({
        "request_id": "r", "mode": mode,
        "decode": {"worker_id": "w", "address": address},
        "isl": 1, "cached_tokens": 0, "eff_isl": 1, "reason": extra
    })
    .to_string()
    .into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_answers_never_panic(status in proptest::option::of(".{0,6}"), body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let outcome = classify_route_response(status.as_deref(), None, &body);
        // Whatever came back, a destination is only ever a usable address.
        if let Some(destination) = outcome.destination() {
            prop_assert!(is_valid_endpoint_address(destination));
        }
        let header = outcome.route_header_value();
        prop_assert!(header.bytes().all(|b| b.is_ascii_graphic()));
    }

    #[test]
    fn a_200_verdict_routes_exactly_where_it_says_or_fails_open(
        mode in prop_oneof!["bypass", "disagg", "agg", ".{0,8}"],
        address in prop_oneof!["127\\.0\\.0\\.1:[0-9]{1,6}", "[a-z0-9.:\\[\\]-]{0,20}", ".{0,20}"],
        extra in ".{0,40}",
    ) {
        let outcome = classify_route_response(Some("200"), None, &verdict_body(&mode, &address, &extra));
        match outcome {
            RouteOutcome::Routed { mode: routed_mode, destination, .. } => {
                prop_assert_eq!(destination, address);
                prop_assert_eq!(routed_mode.as_str(), mode.as_str());
            }
            RouteOutcome::FailOpen(_) => {
                let known = ["bypass", "disagg", "agg"].contains(&mode.as_str());
                prop_assert!(!known || !is_valid_endpoint_address(&address));
            }
            RouteOutcome::Rejected { .. } => prop_assert!(false, "a 200 is never a refusal"),
        }
    }

    #[test]
    fn non_200_statuses_never_route(code in 100u16..1000, reject in proptest::option::of("[a-z_]{0,16}"), body in proptest::collection::vec(any::<u8>(), 0..128)) {
        prop_assume!(code != 200);
        let outcome = classify_route_response(Some(&code.to_string()), reject.as_deref(), &body);
        match outcome {
            RouteOutcome::FailOpen(_) => {}
            RouteOutcome::Rejected { status, .. } => prop_assert!((400..500).contains(&status) && status == code),
            RouteOutcome::Routed { .. } => prop_assert!(false, "{code} routed"),
        }
    }

    #[test]
    fn stripping_removes_every_routing_header_and_nothing_else(names in proptest::collection::vec("(x-switchyard-|X-Switchyard-|x-gateway-destination-endpoint|X-Gateway-Destination-Endpoint|x-bypass-remote-prefill|X-Bypass-Remote-Prefill|x-|)[a-zA-Z-]{0,10}", 0..16)) {
        let stripped = headers_to_strip(names.iter().map(String::as_str));
        for name in &names {
            let removed = stripped.iter().any(|s| s.eq_ignore_ascii_case(name));
            // The rule, written out independently of the filter's own predicate.
            let lower = name.to_ascii_lowercase();
            let routing = lower.starts_with("x-switchyard-")
                || lower == "x-gateway-destination-endpoint"
                || lower == "x-bypass-remote-prefill";
            prop_assert_eq!(removed, routing, "{}", name);
        }
        // Each name at most once, lower-case.
        let mut unique = stripped.clone();
        unique.sort();
        unique.dedup();
        prop_assert_eq!(unique.len(), stripped.len());
        prop_assert!(stripped.iter().all(|n| n.bytes().all(|b| !b.is_ascii_uppercase())));
    }

    #[test]
    fn canonical_paths_are_fixed_points_and_never_panic(path in "(/|%2[fF]|%2[35]|%3[fF]|#|\\.|\\.\\.|[a-z]{1,3}|%[0-9a-fA-F]{2}|%|\\?[a-z=]{0,4}){0,12}") {
        if let Some(canonical) = canonical_path(&path) {
            prop_assert!(canonical.starts_with('/'));
            prop_assert!(!canonical.contains("//"));
            prop_assert!(canonical == "/" || !canonical.ends_with('/'));
            // Canonicalizing again changes nothing (decoded `%`, `?`, `#` stay escaped).
            let again = canonical_path(&canonical);
            prop_assert_eq!(again.as_deref(), Some(canonical.as_str()));
            // A routed path's canonical form is exactly the API's path: what the filter
            // rewrites `:path` to, and the worker decodes no further.
            if let Some(api) = routable_api(Some("POST"), Some(&path)) {
                let exact = match api {
                    switchyard_protocol::route::ApiKind::Chat => "/v1/chat/completions",
                    switchyard_protocol::route::ApiKind::Completions => "/v1/completions",
                };
                prop_assert_eq!(canonical, exact);
            }
        }
    }

    #[test]
    fn request_ids_are_always_header_safe(existing in proptest::option::of(".{0,200}"), ctx in any::<u32>(), now in any::<u128>()) {
        let (id, _) = choose_request_id(existing.as_deref(), ctx, now);
        prop_assert!(!id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic()));
    }
}

mod bodies {
    use proptest::prelude::*;
    use serde_json::Value;
    use switchyard_filter::body::{may_steer, screen, RequestDoc, Screened};
    use switchyard_filter::lifecycle::{usage_from_tail, Tail};
    use switchyard_filter::prefill::{classify_prefill_answer, PrefillStep};
    use switchyard_protocol::handoff::Handoff;

    /// JSON-ish bytes: fragments of request bodies glued at random, so the parser sees
    /// near-valid input, not only noise.
    fn jsonish() -> impl Strategy<Value = Vec<u8>> {
        let fragment = prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(",".to_string()),
            Just(":".to_string()),
            Just("\"messages\"".to_string()),
            Just("\"prompt\"".to_string()),
            Just("\"kv_transfer_params\"".to_string()),
            Just("\"usage\"".to_string()),
            Just("\"max_tokens\"".to_string()),
            Just("null".to_string()),
            Just("1".to_string()),
            "\"[a-z\\\\\"]{0,6}\"",
            ".{0,4}",
        ];
        proptest::collection::vec(fragment, 0..40).prop_map(|parts| parts.concat().into_bytes())
    }

    /// A valid request object with arbitrary extra keys in arbitrary order.
    fn request_object() -> impl Strategy<Value = Value> {
        let extra = proptest::collection::vec(("[a-z_]{1,12}", any::<i64>()), 0..8);
        (extra, any::<bool>(), proptest::option::of(0u32..100)).prop_map(
            |(extra, stream, max_completion)| {
                let mut map = serde_json::Map::new();
                for (key, value) in extra {
                    map.insert(key, Value::from(value));
                }
                map.insert(
                    "messages".into(),
                    serde_json::json!([{"role": "user", "content": "hi"}]),
                );
                map.insert("stream".into(), Value::Bool(stream));
                if let Some(n) = max_completion {
                    map.insert("max_completion_tokens".into(), Value::from(n));
                }
                Value::Object(map)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn no_body_makes_the_body_logic_panic(body in prop_oneof![jsonish(), proptest::collection::vec(any::<u8>(), 0..256)]) {
            let screened = screen(&body);
            let _ = may_steer(&body);
            let _ = usage_from_tail(&body);
            let mut tail = Tail::default();
            tail.push(&body);
            let _ = usage_from_tail(tail.as_bytes());
            for status in [Some("200"), Some("503"), None] {
                let _ = classify_prefill_answer(status, 0, 1);
            }
            // Whatever passes the screen carries no steering key for the worker's parser.
            let passed = match &screened {
                Screened::Clean => Some(body.clone()),
                Screened::Stripped { body, .. } => Some(body.clone()),
                Screened::Invalid(_) => None,
            };
            if let Some(passed) = passed {
                let value: Value = serde_json::from_slice(&passed).expect("what passes is JSON");
                for key in switchyard_protocol::openai::CLIENT_STEERING_KEYS {
                    prop_assert!(value.get(key).is_none(), "{} passed in {}", key, String::from_utf8_lossy(&passed));
                }
            }
            if let Ok(doc) = RequestDoc::parse(&body) {
                // Whatever parses as an object rewrites into JSON objects again.
                let prefill: Value = serde_json::from_slice(&doc.prefill_body(Handoff::VllmNixl, None, None).unwrap()).unwrap();
                prop_assert_eq!(&prefill["max_tokens"], &Value::from(1));
                prop_assert_eq!(&prefill["stream"], &Value::Bool(false));
                let answer = br#"{"kv_transfer_params":{"x":1}}"#;
                let decode = doc.decode_leg(Handoff::VllmNixl, answer, None).unwrap().unwrap().body;
                prop_assert!(serde_json::from_slice::<Value>(&decode).unwrap().is_object());
            }
        }

        #[test]
        fn rewrites_keep_every_other_key_in_order(request in request_object(), params in proptest::collection::btree_map("[a-z]{1,6}", any::<u32>(), 0..4)) {
            let body = serde_json::to_vec(&request).unwrap();
            prop_assert_eq!(screen(&body), Screened::Clean);
            let doc = RequestDoc::parse(&body).unwrap();
            let original: Vec<String> = request.as_object().unwrap().keys().cloned().collect();

            let prefill: Value = serde_json::from_slice(&doc.prefill_body(Handoff::VllmNixl, None, None).unwrap()).unwrap();
            let prefill = prefill.as_object().unwrap();
            let kept: Vec<&String> = prefill.keys().filter(|k| original.contains(k)).collect();
            let expected: Vec<&String> = original.iter().filter(|k| *k != "stream_options").collect();
            prop_assert_eq!(kept, expected, "client keys keep their order");
            prop_assert_eq!(&prefill["max_tokens"], &Value::from(1));
            if request.get("max_completion_tokens").is_some() {
                prop_assert_eq!(&prefill["max_completion_tokens"], &Value::from(1));
            }
            prop_assert_eq!(&prefill["kv_transfer_params"]["do_remote_decode"], &Value::Bool(true));
            for (key, value) in request.as_object().unwrap() {
                if !["max_tokens", "max_completion_tokens", "stream", "kv_transfer_params"].contains(&key.as_str()) {
                    prop_assert_eq!(&prefill[key], value, "{} unchanged", key);
                }
            }

            let params = serde_json::to_value(&params).unwrap();
            let answer = serde_json::json!({"id": "x", "kv_transfer_params": params});
            let decode = doc
                .decode_leg(Handoff::VllmNixl, answer.to_string().as_bytes(), None)
                .unwrap()
                .expect("params hand the KV over")
                .body;
            let decode: Value = serde_json::from_slice(&decode).unwrap();
            let decode = decode.as_object().unwrap();
            let mut without: serde_json::Map<String, Value> = decode.clone();
            prop_assert_eq!(without.shift_remove("kv_transfer_params"), Some(params));
            prop_assert_eq!(&Value::Object(without), &request, "the decode body is the client's plus the params");
        }

        #[test]
        fn prefill_steps_respect_the_retry_bound(code in 100u16..600, done in 0u32..8, max in 0u32..6) {
            let step = classify_prefill_answer(Some(&code.to_string()), done, max);
            if step == PrefillStep::Retry {
                prop_assert!((502..=504).contains(&code) && done < max);
            }
        }
    }
}
