//! Property tests: no route-call answer and no header set makes the filter's logic panic, and
//! the outcome always respects the verdict or fails open.

use proptest::prelude::*;
use switchyard_filter::request::{choose_request_id, headers_to_strip, is_client_routing_header};
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
        let outcome = classify_route_response(status.as_deref(), &body);
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
        let outcome = classify_route_response(Some("200"), &verdict_body(&mode, &address, &extra));
        match outcome {
            RouteOutcome::Routed { mode: routed_mode, destination } => {
                prop_assert_eq!(destination, address);
                prop_assert_eq!(routed_mode.as_str(), mode.as_str());
            }
            RouteOutcome::FailOpen(_) => {
                let known = ["bypass", "disagg", "agg"].contains(&mode.as_str());
                prop_assert!(!known || !is_valid_endpoint_address(&address));
            }
        }
    }

    #[test]
    fn non_200_statuses_never_route(code in 100u16..1000, body in proptest::collection::vec(any::<u8>(), 0..128)) {
        prop_assume!(code != 200);
        let outcome = classify_route_response(Some(&code.to_string()), &body);
        prop_assert!(matches!(outcome, RouteOutcome::FailOpen(_)));
    }

    #[test]
    fn stripping_removes_every_routing_header_and_nothing_else(names in proptest::collection::vec("(x-switchyard-|x-gateway-destination-endpoint|x-|)[a-zA-Z-]{0,10}", 0..16)) {
        let stripped = headers_to_strip(names.iter().map(String::as_str));
        for name in &names {
            let removed = stripped.iter().any(|s| s.eq_ignore_ascii_case(name));
            prop_assert_eq!(removed, is_client_routing_header(name));
        }
    }

    #[test]
    fn request_ids_are_always_header_safe(existing in proptest::option::of(".{0,200}"), ctx in any::<u32>(), now in any::<u128>()) {
        let (id, _) = choose_request_id(existing.as_deref(), ctx, now);
        prop_assert!(!id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic()));
    }
}
