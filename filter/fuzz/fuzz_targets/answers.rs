//! Arbitrary answers from the control plane, a prefill worker and a response tail: the first
//! byte picks a status, the rest is the body. Nothing may panic; a routed verdict always names
//! a usable address.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_filter::lifecycle::{usage_from_tail, Tail};
use switchyard_filter::prefill::classify_prefill_answer;
use switchyard_filter::verdict::{classify_route_response, is_valid_endpoint_address};

const STATUSES: [Option<&str>; 6] = [
    Some("200"),
    Some("503"),
    Some("504"),
    Some("400"),
    Some(" 200 "),
    None,
];

fuzz_target!(|data: &[u8]| {
    let Some((first, body)) = data.split_first() else {
        return;
    };
    let status = STATUSES[usize::from(*first) % STATUSES.len()];
    let reject = ["invalid_request", "teapot", ""][usize::from(*first) % 3];
    let outcome = classify_route_response(status, Some(reject), body);
    if let Some(destination) = outcome.destination() {
        assert!(is_valid_endpoint_address(destination));
    }
    let _ = classify_prefill_answer(status, u32::from(*first % 3), 1);
    let mut tail = Tail::default();
    for chunk in body.chunks(usize::from(*first).max(1)) {
        tail.push(chunk);
    }
    let _ = usage_from_tail(tail.as_bytes());
});
