//! The control plane's status page in a real browser (headless Chromium): after a cold
//! prompt (disaggregated) and its repeat (bypassed) through Envoy, the page lists the live workers and the recent verdicts with
//! their reasons, and its bypass share is the one the control plane's own `/v1/status`
//! gives; without the token it shows the refusal and the token form instead. A screenshot
//! is saved into the test's output directory.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use switchyard_e2e::browser::Chromium;
use switchyard_e2e::probe::{known_workers, long_prompt};
use switchyard_e2e::{admin_get_json, chat_body, client, post_observed, start_stack};
use switchyard_protocol::route::ROUTE_HEADER;
use switchyard_stack::StackBuilder;
use switchyard_support::TempDir;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Virtual time the page's scripts get: a few one-second refreshes.
const SCRIPT_BUDGET: Duration = Duration::from_secs(3);

/// The bypass share of the last minute as the page prints it, from `/v1/status`.
fn share_text(status: &Value) -> String {
    let now = status["now_ms"].as_u64().unwrap();
    let (mut bypass, mut total) = (0, 0);
    for bucket in status["decisions"]["bypass_share"].as_array().unwrap() {
        if bucket["start_ms"].as_u64().unwrap() + 60_000 > now {
            bypass += bucket["bypass"].as_u64().unwrap();
            total += bucket["total"].as_u64().unwrap();
        }
    }
    assert!(total > 0, "verdicts in the last minute: {status}");
    format!("{} %", (100.0 * bypass as f64 / total as f64).round())
}

/// The text of the element with `id` in `dom` (a leaf element's content).
fn text_of(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page"));
    let open = start + dom[start..].find('>').unwrap() + 1;
    let close = open + dom[open..].find('<').unwrap();
    dom[open..close].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_workers_and_verdicts_in_chromium() {
    let chromium = Chromium::locate();
    let stack = start_stack(
        StackBuilder::new()
            .decode_workers(2)
            .prefill_workers(1)
            // Tokenizing a cold 4k-token prompt in a debug build takes tens of milliseconds.
            .route_timeout_ms(3_000),
    )
    .await;
    let http = client();
    known_workers(&stack, &http)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{}/v1/chat/completions", stack.gateway_url());
    // A long cold prompt (disaggregated), then the same prompt again until it is bypassed
    // (its KV is on the decode worker once the worker's KV events are indexed; bounded).
    let long = long_prompt("status pages");
    let mut sent = 0;
    let mut modes = BTreeSet::new();
    while sent < 8 && !(modes.contains("bypass") && modes.contains("disagg")) {
        let response = post_observed(
            &http,
            &url,
            &chat_body(&long, 4, true),
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(response.status, 200, "{}", response.body());
        modes.insert(response.header(ROUTE_HEADER).to_string());
        sent += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        modes.contains("bypass") && modes.contains("disagg"),
        "{modes:?}"
    );
    let status = admin_get_json(&http, &stack, "/v1/status")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let decisions = status["decisions"]["recent"]
        .as_array()
        .expect("recent verdicts");
    assert_eq!(decisions.len(), sent, "{status}");

    let scratch = TempDir::new("status-page").expect("scratch");
    let page = format!(
        "{}/#token={}",
        stack.control_plane_admin_url(),
        stack.control_plane_admin_token()
    );
    let dom = chromium.dump_dom(&page, SCRIPT_BUDGET, scratch.path());
    assert!(
        dom.contains("data-rendered=\""),
        "the page never rendered:\n{dom}"
    );
    for worker in stack.workers() {
        assert!(
            dom.contains(&format!("<td>{}</td>", worker.id.0)),
            "{} missing",
            worker.id.0
        );
    }
    for decision in decisions {
        for field in ["request_id", "reason"] {
            let value = decision[field].as_str().unwrap();
            assert!(
                dom.contains(&format!("<td>{value}</td>")),
                "{field} {value} missing"
            );
        }
    }
    assert_eq!(text_of(&dom, "share"), share_text(&status));
    assert_eq!(text_of(&dom, "verdicts"), sent.to_string());
    assert_eq!(text_of(&dom, "error"), "");

    // Without the token: the refusal, the form, and no data.
    let refused = chromium.dump_dom(
        &stack.control_plane_admin_url(),
        SCRIPT_BUDGET,
        scratch.path(),
    );
    assert!(
        text_of(&refused, "error").starts_with("401 missing_token"),
        "{refused}"
    );
    assert!(
        !refused.contains("data-rendered"),
        "rendered without a token"
    );
    assert!(
        !refused.contains("<form id=\"token-form\" hidden"),
        "the token form shows"
    );

    // The screenshot, for people (docs/control-plane.md shows one).
    let png = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    chromium.screenshot(&page, SCRIPT_BUDGET, (1280, 900), &png, scratch.path());
    eprintln!("status page screenshot: {}", png.display());
}
