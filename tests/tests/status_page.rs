//! The control plane's status page in a real browser (headless Chromium): after a cold
//! prompt (disaggregated) and its repeat (bypassed) through Envoy, the page lists the live workers and the recent verdicts with
//! their reasons, and its bypass share is the one the control plane's own `/v1/status`
//! gives; without the token it shows the refusal and the token form instead.
//!
//! The what-if: with the sliders where the config in force has them, the page's module (the
//! policy's code built for the browser) gives every recorded verdict again; with a threshold
//! moved (through the URL fragment, which the page applies as slider input), the bypass share,
//! the changed verdicts, the reasons and each verdict's new reason on the page are the ones
//! the router's own `decide` gives here, natively, for the records of `/v1/status`. A
//! screenshot of the moved what-if is saved into the test's output directory.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use switchyard_e2e::browser::Chromium;
use switchyard_e2e::probe::{known_workers, long_prompt};
use switchyard_e2e::{admin_get_json, chat_body, client, get_text, post_observed, start_stack};
use switchyard_protocol::route::{RouteMode, ROUTE_HEADER};
use switchyard_router::config::{ConditionalDisaggConfig, RouterConfig};
use switchyard_router::policy::{decide, PolicyCall};
use switchyard_stack::StackBuilder;
use switchyard_support::TempDir;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Virtual time the page's scripts get: a few one-second refreshes.
const SCRIPT_BUDGET: Duration = Duration::from_secs(3);

/// The bypass share of the last minute as the page prints it, from `/v1/status`.
fn share_text(status: &Value) -> String {
    let last_minute = &status["decisions"]["last_minute"];
    let bypass = last_minute["bypass"].as_u64().unwrap();
    let total = last_minute["total"].as_u64().unwrap();
    assert!(total > 0, "verdicts in the last minute: {status}");
    format!("{} %", (100.0 * bypass as f64 / total as f64).round())
}

/// The percentage as the page prints it.
fn percent(part: u64, total: u64) -> String {
    format!("{} %", (100.0 * part as f64 / total as f64).round())
}

/// The text of the element with `id` in `dom` (a leaf element's content).
fn text_of(dom: &str, id: &str) -> String {
    leaf_after(dom, &format!("id=\"{id}\""))
}

/// The content of the first leaf element whose opening tag holds `marker`.
fn leaf_after(dom: &str, marker: &str) -> String {
    let start = dom
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker} in the page"));
    let open = start + dom[start..].find('>').unwrap() + 1;
    let close = open + dom[open..].find('<').unwrap();
    dom[open..close].to_string()
}

/// The what-if column of the recent-verdicts row of `request_id`.
fn whatif_cell(dom: &str, request_id: &str) -> String {
    let row = dom
        .find(&format!("data-request=\"{request_id}\""))
        .unwrap_or_else(|| panic!("no row for {request_id}"));
    leaf_after(&dom[row..], "class=\"whatif")
}

/// One verdict of `/v1/status`, as the test re-decides it.
struct Record {
    request_id: String,
    mode: String,
    reason: String,
    policy: Option<PolicyCall>,
}

fn records(status: &Value) -> Vec<Record> {
    status["decisions"]["recent"]
        .as_array()
        .expect("recent verdicts")
        .iter()
        .map(|d| Record {
            request_id: d["request_id"].as_str().unwrap().to_string(),
            mode: d["mode"].as_str().unwrap().to_string(),
            reason: d["reason"].as_str().unwrap().to_string(),
            policy: serde_json::from_value(d["policy"].clone()).expect("a policy call or null"),
        })
        .collect()
}

/// What the what-if must show for `records` under `config`, computed here with the router's
/// `decide`: each verdict's (mode, reason), in order.
fn expected(records: &[Record], config: &ConditionalDisaggConfig) -> Vec<(String, String)> {
    records
        .iter()
        .map(|r| match &r.policy {
            Some(call) => {
                let d = decide(&call.input, config);
                let mode = if d.is_bypass() {
                    RouteMode::Bypass
                } else {
                    RouteMode::Disagg
                };
                (mode.as_str().to_string(), d.reason().as_str().to_string())
            }
            None => (r.mode.clone(), r.reason.clone()),
        })
        .collect()
}

/// Checks the page's what-if in `dom` against `want` (from [`expected`]).
fn check_whatif(dom: &str, records: &[Record], want: &[(String, String)]) {
    let total = records.len() as u64;
    let bypass = want.iter().filter(|(m, _)| m == "bypass").count() as u64;
    let recorded_bypass = records.iter().filter(|r| r.mode == "bypass").count() as u64;
    let changed = records
        .iter()
        .zip(want)
        .filter(|(r, (m, reason))| &r.mode != m || &r.reason != reason)
        .count();
    assert_eq!(text_of(dom, "whatif-share"), percent(bypass, total));
    assert_eq!(
        text_of(dom, "whatif-bypass"),
        format!("{bypass} of {total}")
    );
    assert_eq!(
        text_of(dom, "whatif-recorded-share"),
        percent(recorded_bypass, total)
    );
    assert_eq!(text_of(dom, "whatif-changed"), changed.to_string());
    for (r, (_, reason)) in records.iter().zip(want) {
        assert_eq!(whatif_cell(dom, &r.request_id), *reason, "{}", r.request_id);
    }
    // The reasons table: every reason, as recorded and what-if, and no other row.
    let mut counts: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for r in records {
        counts.entry(&r.reason).or_default().0 += 1;
    }
    for (_, reason) in want {
        counts.entry(reason).or_default().1 += 1;
    }
    assert_eq!(
        dom.matches("data-reason=\"").count(),
        counts.len(),
        "{counts:?}"
    );
    for (reason, (recorded, whatif)) in counts {
        let row = dom.find(&format!("data-reason=\"{reason}\"")).unwrap();
        let row = &dom[row..dom[row..].find("</tr>").unwrap() + row];
        let cells: Vec<String> = row
            .split("<td class=\"num\">")
            .skip(1)
            .map(|c| c[..c.find('<').unwrap()].to_string())
            .collect();
        assert_eq!(
            cells,
            [recorded.to_string(), whatif.to_string()],
            "{reason}"
        );
    }
    assert!(
        !dom.contains("class=\"warn\""),
        "a warning on the page:\n{dom}"
    );
}

/// The page's DOM after its scripts ran, with the what-if loaded.
fn whatif_dom(chromium: &Chromium, page: &str, scratch: &std::path::Path) -> String {
    let dom = chromium.dump_dom(page, SCRIPT_BUDGET, scratch);
    assert!(
        dom.contains("data-whatif=\"ready\"") && dom.contains("data-whatif-rendered=\""),
        "the what-if did not load (build it with scripts/build-whatif.sh): {}",
        text_of(&dom, "whatif-unavailable")
    );
    dom
}

/// Sends one chat request through the gateway and returns its `x-switchyard-route` mode, a
/// moment later (the workers' KV events need that long to reach the index).
async fn send(http: &reqwest::Client, url: &str, prompt: &str) -> String {
    let response = post_observed(http, url, &chat_body(prompt, 4, true), &[], REQUEST_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.status, 200, "{}", response.body());
    tokio::time::sleep(Duration::from_millis(300)).await;
    response.header(ROUTE_HEADER).to_string()
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
        modes.insert(send(&http, &url, &long).await);
        sent += 1;
    }
    assert!(
        modes.contains("bypass") && modes.contains("disagg"),
        "{modes:?}"
    );
    // More verdicts for the what-if to move: another long prompt and its repeat, and short
    // prompts (cold ones disaggregated for their ratio, not their length).
    let other = long_prompt("what-ifs");
    for prompt in [
        other.as_str(),
        other.as_str(),
        "Name three colours of a status light.",
        "Name three colours of a status light.",
        "Why would a request not be bypassed?",
    ] {
        send(&http, &url, prompt).await;
        sent += 1;
    }
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
    let dom = whatif_dom(&chromium, &page, scratch.path());
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
        // The model beside the request (empty without declared models), then the mode.
        let (id, model, mode) = (
            decision["request_id"].as_str().unwrap(),
            decision["model"].as_str().unwrap_or(""),
            decision["mode"].as_str().unwrap(),
        );
        let cells = format!("<td>{id}</td><td>{model}</td><td class=\"{mode}\">{mode}</td>");
        assert!(dom.contains(&cells), "no {cells} in\n{dom}");
    }
    assert_eq!(text_of(&dom, "share"), share_text(&status));
    assert_eq!(text_of(&dom, "verdicts"), sent.to_string());
    assert_eq!(text_of(&dom, "error"), "");
    // One control plane: no replica to name.
    assert!(
        dom.contains("<div id=\"replica\" class=\"muted\" hidden=\"\"></div>"),
        "{dom}"
    );

    // Without the token: the refusal, the form, and no data; asked once, not every second
    // (each refusal is counted, and a tab left open read as someone guessing).
    let missing = "switchyard_admin_refusals_total{reason=\"missing_token\"}";
    let metrics_url = format!("{}/metrics", stack.control_plane_url());
    let refusals = || async {
        let text = get_text(&http, &metrics_url).await.unwrap_or_default();
        switchyard_e2e::prom_sum(&text, missing)
    };
    let refusals_before = refusals().await;
    let refused = chromium.dump_dom(
        &stack.control_plane_admin_url(),
        SCRIPT_BUDGET,
        scratch.path(),
    );
    assert_eq!(
        refusals().await - refusals_before,
        1.0,
        "asked again and again"
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

    // The what-if with the sliders at the config in force: the recorded verdicts again.
    let records = records(&status);
    let in_force = RouterConfig::from_json(&status["config"])
        .expect("the config /v1/status shows")
        .conditional;
    let again = expected(&records, &in_force);
    for (r, (mode, reason)) in records.iter().zip(&again) {
        assert_eq!((&r.mode, &r.reason), (mode, reason), "{}", r.request_id);
    }
    check_whatif(&dom, &records, &again);

    // A threshold moved down to the largest uncached remainder that was bypassed: that
    // verdict would have been disaggregated, bypasses with less to prefill would not.
    let bypassed_eff_isl = records
        .iter()
        .filter(|r| r.mode == "bypass")
        .filter_map(|r| r.policy.map(|call| call.input.eff_isl))
        .max()
        .expect("a bypass the policy decided");
    let lower = ConditionalDisaggConfig {
        eff_isl_threshold: bypassed_eff_isl,
        ..in_force
    };
    let want = expected(&records, &lower);
    assert!(
        want.iter().filter(|(m, _)| m == "bypass").count()
            < records.iter().filter(|r| r.mode == "bypass").count(),
        "the move must change the share, or the test shows nothing"
    );
    let moved = format!("{page}&eff_isl_threshold={bypassed_eff_isl}");
    check_whatif(
        &whatif_dom(&chromium, &moved, scratch.path()),
        &records,
        &want,
    );

    // And up, with the ratio at 1: the prompts with any reuse bypass, the cold one is
    // disaggregated for its ratio instead of its length.
    let longest = records
        .iter()
        .filter_map(|r| r.policy.map(|call| call.input.eff_isl))
        .max()
        .unwrap();
    let higher = ConditionalDisaggConfig {
        eff_isl_threshold: longest + 1,
        eff_isl_ratio_threshold: 1.0,
        ..in_force
    };
    let want = expected(&records, &higher);
    assert_ne!(want, again, "the move must change a verdict");
    let moved = format!(
        "{page}&eff_isl_threshold={}&eff_isl_ratio_threshold=1",
        longest + 1
    );
    check_whatif(
        &whatif_dom(&chromium, &moved, scratch.path()),
        &records,
        &want,
    );

    // A knob the policy refuses, after one it takes: the note says why, and the reasons
    // table of the knob before is not left beside it.
    let refused = format!("{page}&eff_isl_threshold={bypassed_eff_isl}&eff_isl_ratio_threshold=2");
    let dom = whatif_dom(&chromium, &refused, scratch.path());
    let note = text_of(&dom, "whatif-note");
    assert!(note.contains("[0, 1]"), "{note}");
    assert_eq!(text_of(&dom, "whatif-share"), "–");
    assert_eq!(
        dom.matches("data-reason=\"").count(),
        0,
        "stale reasons:\n{dom}"
    );

    // The screenshot, for people (docs/control-plane.md shows one): the lowered threshold.
    let moved = format!("{page}&eff_isl_threshold={bypassed_eff_isl}");
    let png = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    chromium.screenshot(&moved, SCRIPT_BUDGET, (1400, 1150), &png, scratch.path());
    eprintln!("status page screenshot: {}", png.display());
}
