use super::*;
use crate::chains::Chain;
use switchyard_protocol::worker::WorkerId;

const D: WorkerSlot = WorkerSlot(0);
const P: WorkerSlot = WorkerSlot(1);

fn hashes(range: std::ops::Range<u64>) -> Chain {
    range.map(SequenceHash).collect()
}

fn leg(slot: WorkerSlot, prefill_tokens: u64, blocks: Chain, tail_blocks: u64) -> Leg {
    Leg {
        slot,
        prefill_tokens,
        blocks,
        tail_blocks,
    }
}

/// `D` prefills `tokens` itself; the prompt's blocks plus a partial tail stay on it.
fn bypass(blocks: std::ops::Range<u64>, tokens: u64) -> RoutedLoad {
    RoutedLoad {
        decode: leg(D, tokens, hashes(blocks), 1),
        prefill: None,
    }
}

/// `P` prefills `tokens`; both workers hold the prompt's full blocks (no tails).
fn disagg(blocks: std::ops::Range<u64>, tokens: u64) -> RoutedLoad {
    RoutedLoad {
        decode: leg(D, 0, hashes(blocks.clone()), 0),
        prefill: Some(leg(P, tokens, hashes(blocks), 0)),
    }
}

/// Prefill reports are lost after 100 ms, whole requests after 1 s.
const TIMEOUTS: LoadConfig = LoadConfig {
    prefill_timeout_ms: 100,
    request_timeout_ms: 1000,
    kv_prediction_ms: 0,
    report_grace_ms: 0,
    stale_in_flight_ms: 0,
    handoff_timeout_ms: 0,
};

fn tracker() -> LoadTracker {
    let mut t = LoadTracker::new();
    t.add_worker(D, 1000);
    t.add_worker(P, 0);
    t
}

fn report(queued: u64, used: u64, total: u64) -> LoadReport {
    LoadReport {
        v: 1,
        worker_id: WorkerId("d".into()),
        instance_id: None,
        running: 0,
        waiting: 0,
        kv_used_blocks: used,
        kv_total_blocks: total,
        queued_prefill_tokens: Some(queued),
        kv_waiting_blocks: 0,
    }
}

#[test]
fn shared_blocks_count_once_and_first_token_frees_prefill() {
    let mut t = tracker();
    t.on_route("a", bypass(0..10, 640), 0);
    t.on_route("b", bypass(0..12, 100), 0); // shares 10 blocks with a
    let l = t.load(D);
    assert_eq!(l.prefill_tokens, 740);
    assert_eq!(
        l.active_blocks,
        12 + 2,
        "12 distinct blocks + 2 partial tails"
    );
    assert_eq!(l.in_flight, 2);
    assert_eq!(l.kv_capacity_blocks, 1000);
    t.on_first_token("a");
    t.on_first_token("a"); // duplicate report: no double free
    assert_eq!(t.load(D).prefill_tokens, 100);
    t.on_done("b");
    assert_eq!(t.load(D).active_blocks, 10 + 1);
    t.on_done("a");
    assert_eq!(
        t.load(D),
        WorkerLoad {
            kv_capacity_blocks: 1000,
            ..WorkerLoad::default()
        }
    );
    assert_eq!(t.active_requests(), 0);
}

#[test]
fn disagg_puts_prefill_on_the_prefill_worker_until_first_token() {
    let mut t = tracker();
    t.on_route("r", disagg(0..4, 256), 0);
    assert_eq!(t.load(P).prefill_tokens, 256);
    assert_eq!(t.load(P).active_blocks, 4);
    assert_eq!(t.load(P).in_flight, 0);
    assert_eq!(t.load(D).prefill_tokens, 0);
    assert_eq!(t.load(D).active_blocks, 4);
    t.on_first_token("r");
    assert_eq!(t.load(P).prefill_tokens, 0);
    assert_eq!(t.load(P).active_blocks, 0);
    assert_eq!(t.load(D).active_blocks, 4);
}

#[test]
fn a_report_replaces_the_baseline_and_later_changes_add_on_top() {
    let mut t = tracker();
    t.on_route("old", bypass(0..10, 500), 0);
    t.on_report(D, &report(2000, 300, 4000), 10_000, &TIMEOUTS);
    let l = t.load(D);
    assert_eq!(
        (l.prefill_tokens, l.active_blocks, l.kv_capacity_blocks),
        (2000, 300, 4000)
    );
    assert!(l.reported);
    // Shares its first 5 blocks with "old": 10 new distinct blocks + tail.
    let new: Chain = hashes(0..5)
        .iter()
        .chain(&*hashes(100..110))
        .copied()
        .collect();
    let new = RoutedLoad {
        decode: leg(D, 100, new, 1),
        prefill: None,
    };
    t.on_route("new", new, 1);
    assert_eq!(t.load(D).prefill_tokens, 2100);
    assert_eq!(t.load(D).active_blocks, 311);
    t.on_first_token("old");
    assert_eq!(
        t.load(D).prefill_tokens,
        1600,
        "freed after the report: subtracted"
    );
    t.on_done("old");
    t.on_done("new");
    assert_eq!(t.load(D).active_blocks, 300 - 22 + 11);
    // Never below zero.
    t.on_report(D, &report(0, 0, 4000), 10_000, &TIMEOUTS);
    t.on_route("x", bypass(0..3, 10), 2);
    t.on_report(D, &report(0, 0, 4000), 10_000, &TIMEOUTS);
    t.on_done("x");
    assert_eq!(t.load(D).active_blocks, 0);
}

#[test]
fn lost_reports_expire() {
    let cfg = TIMEOUTS;
    let mut t = tracker();
    t.on_route("a", bypass(0..4, 300), 0);
    t.on_route("b", bypass(10..14, 200), 50);
    t.expire(99, &cfg);
    assert_eq!(t.load(D).prefill_tokens, 500);
    t.expire(100, &cfg);
    assert_eq!(t.load(D).prefill_tokens, 200);
    t.expire(150, &cfg);
    assert_eq!(t.load(D).prefill_tokens, 0);
    assert_eq!(t.load(D).active_blocks, 10);
    t.expire(1000, &cfg);
    assert_eq!(t.active_requests(), 1);
    t.expire(1050, &cfg);
    assert_eq!(t.active_requests(), 0);
    assert_eq!(t.load(D).active_blocks, 0);
}

/// An overdue `first_token` frees the prefill load but makes no running stream (the request
/// may never have been sent); a late `first_token` makes it one, and `done` ends it.
#[test]
fn an_overdue_first_token_frees_the_prefill_but_is_no_stream() {
    let cfg = TIMEOUTS;
    let mut t = tracker();
    t.on_route("a", bypass(0..4, 300), 0);
    t.expire(cfg.prefill_timeout_ms, &cfg);
    let load = t.load(D);
    assert_eq!(
        (load.prefill_tokens, load.decoding, load.in_flight),
        (0, 0, 1)
    );
    t.on_first_token("a");
    let load = t.load(D);
    assert_eq!(
        (load.prefill_tokens, load.decoding),
        (0, 1),
        "late, but decoding"
    );
    t.on_done("a");
    assert_eq!(t.load(D), tracker().load(D));
    // Never reported at all: nothing left once the request times out.
    t.on_route("b", bypass(0..4, 300), 0);
    t.expire(cfg.request_timeout_ms, &cfg);
    assert_eq!(t.load(D), tracker().load(D));
}

#[test]
fn requests_sharing_an_id_each_hold_their_load_and_each_report_settles_the_oldest() {
    let cfg = TIMEOUTS;
    let mut t = tracker();
    // Two requests under one client-chosen id, at once.
    t.on_route("a", bypass(0..4, 300), 0);
    t.on_route("a", bypass(20..24, 50), 90);
    assert_eq!(t.active_requests(), 2);
    assert_eq!(t.load(D).prefill_tokens, 350);
    assert_eq!(t.load(D).in_flight, 2);
    assert_eq!(t.load(D).active_blocks, 10, "4 blocks and a tail each");
    assert_eq!(
        t.routed("a").unwrap().decode.prefill_tokens,
        50,
        "the latest"
    );
    // The first token settles the oldest still prefilling, then the next.
    t.on_first_token("a");
    assert_eq!(t.load(D).prefill_tokens, 50);
    t.on_first_token("a");
    assert_eq!(t.load(D).prefill_tokens, 0);
    assert_eq!(t.load(D).decoding, 2);
    // Each done frees one.
    t.on_done("a");
    assert_eq!((t.active_requests(), t.load(D).in_flight), (1, 1));
    assert_eq!(t.load(D).active_blocks, 5);
    t.on_done("a");
    assert_eq!(t.active_requests(), 0);
    assert_eq!(t.load(D), tracker().load(D));
    // Expiry frees the one it is due for, not a newer one of the same id.
    t.on_route("b", bypass(0..4, 300), 1_000);
    t.on_route("b", bypass(0..4, 50), 1_090);
    t.expire(1_120, &cfg); // the first routing's prefill is overdue
    assert_eq!(t.load(D).prefill_tokens, 50);
    t.expire(1_190, &cfg);
    assert_eq!(t.load(D).prefill_tokens, 0);
    assert_eq!(t.active_requests(), 2);
    t.expire(2_000, &cfg);
    assert_eq!(t.active_requests(), 1);
    t.expire(2_090, &cfg);
    assert_eq!(t.active_requests(), 0);
    assert_eq!(t.load(D), tracker().load(D));
}

#[test]
fn a_failed_open_report_frees_a_routed_request_or_waits_for_its_late_call() {
    let cfg = TIMEOUTS;
    let mut t = tracker();
    // The call was routed before the report: the report frees it.
    t.on_route("early", disagg(0..4, 256), 0);
    t.on_failed_open("early", None, 10);
    assert_eq!(t.active_requests(), 0);
    assert_eq!(t.load(D), tracker().load(D));
    assert_eq!(t.load(P), tracker().load(P));
    assert!(
        !t.take_failed_open("early", None),
        "nothing left to wait for"
    );
    // The report came first: its late call is recognised, once.
    t.on_failed_open("late", None, 20);
    assert!(t.take_failed_open("late", None));
    assert!(
        !t.take_failed_open("late", None),
        "a later call of that id is a new request"
    );
    // Remembered for a minute, no longer.
    t.on_failed_open("never", None, 30);
    t.expire(30 + FAILED_OPEN_MEMORY_MS - 1, &cfg);
    assert!(t.failed_open.contains_key("never"));
    t.expire(30 + FAILED_OPEN_MEMORY_MS, &cfg);
    assert!(!t.take_failed_open("never", None));
    assert!(t.failed_open_order.is_empty());
}

#[test]
fn failed_open_ids_are_bounded_oldest_first() {
    let mut t = tracker();
    for i in 0..MAX_FAILED_OPEN + 10 {
        t.on_failed_open(&format!("r{i}"), None, i as u64);
    }
    assert_eq!(t.failed_open.len(), MAX_FAILED_OPEN);
    assert!(!t.take_failed_open("r9", None), "the oldest went first");
    assert!(t.take_failed_open("r10", None));
    assert!(t.take_failed_open(&format!("r{}", MAX_FAILED_OPEN + 9), None));
    // Taken ids leave order entries behind; expiry keeps them proportional.
    for i in 0..MAX_FAILED_OPEN + 10 {
        t.take_failed_open(&format!("r{i}"), None);
    }
    t.expire(MAX_FAILED_OPEN as u64, &TIMEOUTS);
    assert!(
        t.failed_open_order.is_empty(),
        "{}",
        t.failed_open_order.len()
    );
}

#[test]
fn removing_a_worker_drops_requests_that_touch_it() {
    let mut t = tracker();
    t.on_route("r", disagg(0..4, 256), 0);
    t.remove_worker(P);
    assert_eq!(t.active_requests(), 0);
    assert_eq!(t.load(D).active_blocks, 0);
    assert_eq!(t.load(P), WorkerLoad::default());
}

proptest::proptest! {
    #[test]
    fn every_request_finished_leaves_no_load(
        reqs in proptest::collection::vec((0u64..20, 1u64..20, 0u64..5000, proptest::bool::ANY), 1..40)
    ) {
        let mut t = tracker();
        for (i, (start, len, tokens, disagg)) in reqs.iter().enumerate() {
            let blocks = hashes(*start..start + len);
            let load = if *disagg {
                RoutedLoad {
                    decode: leg(D, 0, blocks.clone(), 1),
                    prefill: Some(leg(P, *tokens, blocks, 1)),
                }
            } else {
                RoutedLoad { decode: leg(D, *tokens, blocks, 0), prefill: None }
            };
            t.on_route(&i.to_string(), load, i as u64);
        }
        for i in 0..reqs.len() {
            if i % 2 == 0 {
                t.on_first_token(&i.to_string());
            }
            t.on_done(&i.to_string());
        }
        proptest::prop_assert_eq!(t.load(D).active_blocks, 0);
        proptest::prop_assert_eq!(t.load(D).prefill_tokens, 0);
        proptest::prop_assert_eq!(t.load(P).active_blocks, 0);
        proptest::prop_assert_eq!(t.load(P).prefill_tokens, 0);
    }
}

/// A prompt's chain: each block's hash depends on every block before it, as sequence hashes
/// do, so prompts drawn from a small alphabet share prefixes of every length.
fn prompt_chain(blocks: &[u8]) -> Chain {
    let mut h = 0x9e37_79b9_7f4a_7c15_u64;
    blocks
        .iter()
        .map(|&b| {
            h = (h ^ u64::from(b))
                .wrapping_mul(0x0100_0000_01b3)
                .rotate_left(23);
            SequenceHash(h)
        })
        .collect()
}

proptest::proptest! {
    /// The active blocks are the distinct blocks of the prompts in flight (plus tails),
    /// whatever the order requests arrive and finish in.
    #[test]
    fn active_blocks_count_each_shared_block_once(
        prompts in proptest::collection::vec(proptest::collection::vec(0u8..3, 0..12), 1..16),
        finish in proptest::collection::vec(proptest::bool::ANY, 16),
    ) {
        let mut t = tracker();
        for (i, p) in prompts.iter().enumerate() {
            let load = RoutedLoad { decode: leg(D, 0, prompt_chain(p), 1), prefill: None };
            t.on_route(&i.to_string(), load, 0);
        }
        for (i, done) in finish.iter().enumerate().take(prompts.len()) {
            if *done {
                t.on_done(&i.to_string());
            }
        }
        let live: Vec<&Vec<u8>> =
            prompts.iter().zip(&finish).filter(|(_, done)| !**done).map(|(p, _)| p).collect();
        let distinct: std::collections::HashSet<u64> =
            live.iter().flat_map(|p| prompt_chain(p).iter().map(|h| h.0).collect::<Vec<_>>()).collect();
        proptest::prop_assert_eq!(t.load(D).active_blocks, (distinct.len() + live.len()) as u64);
        for p in &prompts {
            let chain = prompt_chain(p);
            let walked = chain.iter().take_while(|h| distinct.contains(&h.0)).count() as u64;
            proptest::prop_assert_eq!(t.active_prefix(D, &chain), walked);
        }
    }
}

#[test]
fn a_report_sampled_before_a_request_arrived_does_not_erase_it() {
    let cfg = LoadConfig {
        report_grace_ms: 50,
        ..TIMEOUTS
    };
    let mut t = tracker();
    t.on_route("early", bypass(0..10, 500), 0);
    t.on_route("late", bypass(100..104, 200), 1_000);
    // Arrives 20 ms after "late" was routed: sampled, perhaps, before the worker had it.
    t.on_report(D, &report(500, 11, 4000), 1_020, &cfg);
    let l = t.load(D);
    assert_eq!(
        (l.prefill_tokens, l.active_blocks),
        (700, 16),
        "the report's 500 tokens and 11 blocks, plus the late request's 200 and 4 + tail"
    );
    // A report after the grace is taken as including it.
    t.on_report(D, &report(700, 16, 4000), 1_050, &cfg);
    let l = t.load(D);
    assert_eq!((l.prefill_tokens, l.active_blocks), (700, 16));
    // Freed after that report: subtracted from it, once.
    t.on_first_token("late");
    assert_eq!(t.load(D).prefill_tokens, 500);
    // Freed before a report within its grace: the report counts it no more.
    t.on_route("brief", bypass(200..202, 300), 2_000);
    t.on_first_token("brief");
    t.on_report(D, &report(500, 16, 4000), 2_010, &cfg);
    assert_eq!(t.load(D).prefill_tokens, 500);
}

#[test]
fn a_disaggregated_decode_leg_counts_over_reports_until_its_first_token() {
    let mut t = tracker();
    t.on_route("r", disagg(0..4, 256), 0);
    // Long after routing, the decode worker still has not got the request: its prefill leg
    // runs elsewhere.
    t.on_report(D, &report(0, 0, 4000), 5_000, &TIMEOUTS);
    assert_eq!(t.load(D).active_blocks, 4, "its blocks are coming");
    t.on_report(P, &report(256, 4, 4000), 5_000, &TIMEOUTS);
    assert_eq!(
        (t.load(P).prefill_tokens, t.load(P).active_blocks),
        (256, 4),
        "the prefill worker has it: no double count past the grace"
    );
    t.on_first_token("r");
    t.on_report(D, &report(0, 4, 4000), 6_000, &TIMEOUTS);
    assert_eq!(
        t.load(D).active_blocks,
        4,
        "handed over: the report has them"
    );
}

#[test]
fn a_report_that_does_not_know_the_prefill_queue_leaves_the_routed_tokens_counted() {
    let mut t = tracker();
    t.on_route("r", bypass(0..4, 3_000), 0);
    // A scraped engine's report: no queued prompt tokens in it.
    let scraped = LoadReport {
        queued_prefill_tokens: None,
        ..report(0, 5, 4000)
    };
    t.on_report(D, &scraped, 10_000, &TIMEOUTS);
    assert_eq!(t.load(D).prefill_tokens, 3_000, "still to prefill");
    assert_eq!(t.load(D).active_blocks, 5, "the report's blocks");
    t.on_first_token("r");
    assert_eq!(t.load(D).prefill_tokens, 0);
    t.on_report(D, &scraped, 20_000, &TIMEOUTS);
    assert_eq!(t.load(D).prefill_tokens, 0);
}

#[test]
fn requests_the_workers_reports_stop_showing_are_released_after_a_while() {
    let cfg = LoadConfig {
        report_grace_ms: 50,
        stale_in_flight_ms: 30_000,
        ..TIMEOUTS
    };
    let at_worker = |running| LoadReport {
        running,
        ..report(0, 0, 4000)
    };
    let mut t = tracker();
    // Three requests whose `done` will be lost (a gateway restarted), one that runs on.
    for (i, id) in ["lost-0", "lost-1", "lost-2", "live"].iter().enumerate() {
        t.on_route(id, bypass(i as u64 * 10..i as u64 * 10 + 4, 100), i as u64);
        t.on_first_token(id);
    }
    assert_eq!(t.load(D).in_flight, 4);
    // The worker shows 1; for a while it also showed 2 (a `done` on its way).
    t.on_report(D, &at_worker(1), 1_000, &cfg);
    t.on_report(D, &at_worker(2), 15_000, &cfg);
    t.on_report(D, &at_worker(1), 30_999, &cfg);
    assert_eq!(t.load(D).in_flight, 4, "not yet: 30 s of reports");
    t.on_report(D, &at_worker(1), 31_000, &cfg);
    assert_eq!(t.load(D).in_flight, 2, "the least shortfall seen: 2");
    assert_eq!(t.load(D).decoding, 2);
    assert_eq!(t.stale_released(), 2);
    assert!(
        t.on_done("lost-0").is_none(),
        "released: its late done is ignored"
    );
    // A report that shows them all ends the run.
    t.on_report(D, &at_worker(2), 32_000, &cfg);
    t.on_report(D, &at_worker(0), 40_000, &cfg);
    t.on_report(D, &at_worker(0), 69_999, &cfg);
    assert_eq!(t.load(D).in_flight, 2);
    t.on_report(D, &at_worker(0), 70_000, &cfg);
    assert_eq!(t.load(D).in_flight, 0);
    // A request routed just before a report, or disaggregated and still prefilling elsewhere,
    // is not counted against it.
    t.on_route("new", bypass(100..104, 100), 100_000);
    t.on_route("handoff", disagg(200..204, 100), 60_000);
    t.on_report(D, &at_worker(0), 100_020, &cfg);
    t.on_report(D, &at_worker(0), 130_020, &cfg);
    assert_eq!(t.load(D).in_flight, 2);
}

#[test]
fn a_disaggregated_request_overdue_in_a_prefill_queue_is_no_surplus_on_its_decode_worker() {
    let cfg = LoadConfig {
        prefill_timeout_ms: 100,
        request_timeout_ms: 600_000,
        report_grace_ms: 50,
        stale_in_flight_ms: 30_000,
        ..TIMEOUTS
    };
    let mut t = tracker();
    t.on_route("queued", disagg(0..4, 9_000), 0);
    // Its first token is overdue: prefill tokens freed, but it may wait in the prefill
    // worker's queue for minutes, and the decode worker has not seen it.
    t.expire(1_000, &cfg);
    assert_eq!(t.load(P).prefill_tokens, 0);
    for at in [1_000, 20_000, 40_000, 60_000] {
        t.on_report(D, &report(0, 0, 4000), at, &cfg);
    }
    assert_eq!(t.load(D).in_flight, 1, "still coming");
    assert_eq!(t.load(D).active_blocks, 4);
    t.on_first_token("queued");
    t.on_report(D, &report(0, 4, 4000), 61_000, &cfg);
    assert_eq!(t.load(D).decoding, 1);
}

/// Lost lifecycle reports of a disaggregated request (a NATS outage, a gateway restart): past
/// the handoff timeout its decode leg is at its worker, so the worker's reports release it
/// like any other lost request, not only the ten-minute request timeout.
#[test]
fn a_disaggregated_request_whose_reports_were_lost_is_released_after_the_handoff_timeout() {
    let cfg = LoadConfig {
        prefill_timeout_ms: 60_000,
        request_timeout_ms: 600_000,
        stale_in_flight_ms: 30_000,
        handoff_timeout_ms: 150_000,
        ..TIMEOUTS
    };
    let mut t = tracker();
    t.on_route("lost", disagg(0..4, 9_000), 0);
    t.expire(60_000, &cfg);
    let mut at = 1_000;
    while at < 150_000 {
        t.on_report(D, &report(0, 0, 4000), at, &cfg);
        at += 10_000;
    }
    assert_eq!(t.load(D).in_flight, 1, "may still be in a prefill queue");
    while at <= 181_000 {
        t.on_report(D, &report(0, 0, 4000), at, &cfg);
        at += 10_000;
    }
    assert_eq!(
        t.load(D).in_flight,
        0,
        "released 30 s past the handoff timeout"
    );
    assert_eq!(t.load(D).active_blocks, 0);
    assert_eq!(t.stale_released(), 1);
}

#[test]
fn a_handed_over_request_the_report_shows_is_not_carried_on_top_of_it() {
    let mut t = tracker();
    t.on_route("turn-0", disagg(0..4, 256), 0);
    // The decode worker has it running before the gateway's first_token report comes.
    let running = LoadReport {
        running: 1,
        ..report(0, 4, 4000)
    };
    t.on_report(D, &running, 1_000, &TIMEOUTS);
    assert_eq!(t.load(D).active_blocks, 4, "the report's, not twice");
    // One still in a prefill queue, and the report shows nothing new: carried.
    t.on_route("turn-1", disagg(10..13, 256), 1_100);
    t.on_report(D, &running, 1_500, &TIMEOUTS);
    assert_eq!(t.load(D).active_blocks, 7);
}
