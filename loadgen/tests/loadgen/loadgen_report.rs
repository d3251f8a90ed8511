//! Report math on small hand-computed record sets.

use switchyard_engine::SpeedUp;
use switchyard_loadgen::compare::plot::{
    interactivity_vs_throughput_svg, points_by_mode, ThroughputKind,
};
use switchyard_loadgen::compare::table::headline_table;
use switchyard_loadgen::markdown::run_markdown;
use switchyard_loadgen::record::RequestRecord;
use switchyard_loadgen::report::{build_report, parse_route, RunMeta, Slo};

/// A successful request sent at `sent` ms with the given TTFT, E2E and token counts.
fn ok(sent: f64, ttft: f64, e2e: f64, prompt: u32, out: u32, route: &str) -> RequestRecord {
    RequestRecord {
        sent_ms: sent,
        ttft_ms: Some(ttft),
        e2e_ms: Some(e2e),
        expected_prompt_tokens: u64::from(prompt),
        planned_osl: out,
        prompt_tokens: Some(prompt),
        completion_tokens: Some(out),
        cached_tokens: Some(prompt / 2),
        content_chunks: out,
        route: Some(route.into()),
        worker: Some("decode-0".into()),
        status: Some(200),
        ..RequestRecord::default()
    }
}

fn meta(gpus: u32, mode: &str) -> RunMeta {
    RunMeta {
        label: format!("{mode}-run"),
        mode: Some(mode.into()),
        gpus,
        ..RunMeta::default()
    }
}

fn records() -> Vec<RequestRecord> {
    vec![
        // ITL = (1100 - 100) / (11 - 1) = 100 ms
        ok(0.0, 100.0, 1100.0, 1000, 11, "bypass"),
        // ITL = (2200 - 200) / 40 = 50 ms
        ok(500.0, 200.0, 2200.0, 2000, 41, "disagg"),
        // ITL = (3500 - 500) / 100 = 30 ms; ends at 1000 + 3500 = 4500 ms
        ok(1000.0, 500.0, 3500.0, 3000, 101, "bypass"),
        // One output token: no ITL.
        ok(
            1500.0,
            300.0,
            300.0,
            500,
            1,
            "fail-open;reason=control_plane_down",
        ),
        RequestRecord {
            sent_ms: 2000.0,
            e2e_ms: Some(10.0),
            status: Some(503),
            error: Some("http 503: no workers".into()),
            expected_prompt_tokens: 700,
            ..RequestRecord::default()
        },
        RequestRecord {
            sent_ms: 2100.0,
            e2e_ms: Some(5.0),
            error: Some("connect: refused".into()),
            ..RequestRecord::default()
        },
    ]
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn percentiles_itl_interactivity_and_throughput_per_gpu() {
    let slo = Slo {
        ttft_ms: Some(250.0),
        itl_ms: Some(60.0),
    };
    let r = build_report(meta(8, "conditional"), &records(), 3, slo);
    assert_eq!(
        (
            r.requests.sent,
            r.requests.ok,
            r.requests.failed,
            r.requests.not_sent
        ),
        (6, 4, 2, 3)
    );
    // Window: first send 0 ms to last successful completion 4500 ms.
    assert!((r.window_s - 4.5).abs() < 1e-9);
    // TTFT of ok requests sorted: 100, 200, 300, 500. p50 = 250, p90 = 300 + 0.7·200 = 440.
    assert!(close(r.ttft_ms.p50, 250.0) && close(r.ttft_ms.p90, 440.0));
    assert!(close(r.ttft_ms.p99, 300.0 + 0.97 * 200.0));
    // ITLs 30, 50, 100 (the one-token request has none): p50 50, p90 = 50 + 0.8·50 = 90.
    assert_eq!(r.itl_ms.count, 3);
    assert!(close(r.itl_ms.p50, 50.0) && close(r.itl_ms.p90, 90.0));
    // Interactivity = 1000 / ITL at the percentile.
    assert!(close(r.interactivity.p50, 20.0) && close(r.interactivity.p90, 1000.0 / 90.0));
    // Tokens of ok requests: input 6500, output 154, over 4.5 s and 8 GPUs.
    assert!((r.throughput.input_tokens_per_s - 6500.0 / 4.5).abs() < 1e-9);
    assert!((r.throughput.output_tokens_per_s - 154.0 / 4.5).abs() < 1e-9);
    assert!((r.throughput.total_tokens_per_s_per_gpu - 6654.0 / 4.5 / 8.0).abs() < 1e-9);
    assert!((r.throughput.output_tokens_per_s_per_gpu - 154.0 / 4.5 / 8.0).abs() < 1e-9);
    assert!((r.throughput.requests_per_s - 4.0 / 4.5).abs() < 1e-9);
    // Goodput: TTFT ≤ 250 and ITL ≤ 60 → request 2 (200 ms, 50 ms) only; request 1 has
    // TTFT 100 but ITL 100; request 4 has TTFT 300; failures never count.
    assert_eq!(r.goodput.requests, 1);
    assert!((r.goodput.requests_per_s - 1.0 / 4.5).abs() < 1e-9);
    assert!((r.goodput.share - 1.0 / 6.0).abs() < 1e-9);
    // Routes: 2 bypass, 1 disagg, 1 fail-open, 2 without a header.
    assert_eq!(r.routes.modes.get("bypass"), Some(&2));
    assert_eq!(r.routes.modes.get("none"), Some(&2));
    assert_eq!(
        r.routes.reasons.get("fail-open:control_plane_down"),
        Some(&1)
    );
    assert!(close(r.routes.bypass_share, 0.5));
    assert_eq!(r.errors.get("http 503"), Some(&1));
    assert_eq!(r.errors.get("connect"), Some(&1));
    assert_eq!(r.workers.get("decode-0"), Some(&4));
    assert_eq!(r.tokens.reported_prompt, 6500);
    assert_eq!(r.tokens.reported_cached, 3250);
    assert_eq!(r.tokens.prompt_count_mismatches, 0);
}

#[test]
fn without_slos_goodput_is_the_success_rate_and_a_single_token_meets_itl() {
    let r = build_report(meta(4, "agg"), &records(), 0, Slo::default());
    assert_eq!(r.goodput.requests, 4);
    let only_itl = Slo {
        ttft_ms: None,
        itl_ms: Some(1.0),
    };
    let r = build_report(meta(4, "agg"), &records(), 0, only_itl);
    assert_eq!(
        r.goodput.requests, 1,
        "only the one-token request has no ITL to miss"
    );
}

#[test]
fn a_request_the_client_gave_up_on_late_does_not_stretch_the_window() {
    let mut with_timeout = records();
    // Sent at 3 s, cut by the client's timeout at 9 s: after the last success (4.5 s).
    with_timeout.push(RequestRecord {
        sent_ms: 3000.0,
        e2e_ms: Some(6000.0),
        error: Some("timeout: no answer within 6 s".into()),
        expected_prompt_tokens: 900,
        ..RequestRecord::default()
    });
    let r = build_report(meta(8, "conditional"), &with_timeout, 0, Slo::default());
    assert_eq!((r.requests.ok, r.requests.failed), (4, 3));
    assert!((r.window_s - 4.5).abs() < 1e-9, "{}", r.window_s);
    assert!((r.throughput.requests_per_s - 4.0 / 4.5).abs() < 1e-9);

    // A request sent after the last success and failed at once still counts in the window:
    // it was part of the offered load, which goodput must not exceed.
    with_timeout.push(RequestRecord {
        sent_ms: 6000.0,
        e2e_ms: Some(1.0),
        status: Some(503),
        error: Some("http 503: more KV than a worker holds".into()),
        ..RequestRecord::default()
    });
    let r = build_report(meta(8, "conditional"), &with_timeout, 0, Slo::default());
    assert!((r.window_s - 6.0).abs() < 1e-9, "{}", r.window_s);
}

#[test]
fn an_empty_run_reports_zeros_not_nans() {
    let r = build_report(meta(4, "agg"), &[], 5, Slo::default());
    assert_eq!(r.requests.not_sent, 5);
    assert_eq!(r.window_s, 0.0);
    assert_eq!(r.throughput.total_tokens_per_s_per_gpu, 0.0);
    assert!(r.ttft_ms.p50.is_none());
    let md = run_markdown(&r);
    assert!(
        !md.contains("NaN") && md.contains("| TTFT (ms) | – |"),
        "{md}"
    );
}

#[test]
fn sped_up_simulations_report_in_modelled_time() {
    let wall = build_report(meta(8, "agg"), &records(), 0, Slo::default());
    let mut m = meta(8, "agg");
    m.speed_up = SpeedUp::new(10.0).unwrap();
    let slo = Slo {
        ttft_ms: Some(2_500.0),
        itl_ms: None,
    };
    let model = build_report(m, &records(), 0, slo);
    assert!((model.window_s - 45.0).abs() < 1e-9);
    assert!(close(model.ttft_ms.p50, 2_500.0) && close(model.itl_ms.p50, 500.0));
    assert!(close(model.interactivity.p50, 2.0));
    let (w, m) = (wall.throughput, model.throughput);
    assert!((m.total_tokens_per_s_per_gpu * 10.0 - w.total_tokens_per_s_per_gpu).abs() < 1e-9);
    // TTFTs 1000, 2000, 3000, 5000 ms in model time: two meet 2.5 s.
    assert_eq!(model.goodput.requests, 2);
}

#[test]
fn route_headers_parse_mode_and_reason() {
    assert_eq!(parse_route("bypass"), ("bypass".into(), None));
    assert_eq!(
        parse_route("fail-open; reason=timeout"),
        ("fail-open".into(), Some("timeout".into()))
    );
}

#[test]
fn comparison_table_json_and_plot_cover_every_mode() {
    let mut runs = Vec::new();
    for (mode, scale) in [
        ("agg", 1.0),
        ("agg", 2.0),
        ("disagg", 1.0),
        ("conditional", 1.0),
    ] {
        let mut m = meta(8, mode);
        m.offered_rps = Some(scale);
        let recs: Vec<RequestRecord> = records()
            .into_iter()
            .map(|mut r| {
                r.e2e_ms = r.e2e_ms.map(|e| e * scale);
                r
            })
            .collect();
        runs.push(build_report(m, &recs, 0, Slo::default()));
    }
    let table = headline_table(&runs);
    assert_eq!(table.lines().count(), 2 + runs.len());
    for mode in ["agg", "disagg", "conditional"] {
        assert!(table.contains(&format!("| {mode} |")), "{table}");
    }
    let series = points_by_mode(&runs, ThroughputKind::Output);
    assert_eq!(series.len(), 3);
    assert_eq!(series["agg"].len(), 2, "one point per load level");
    assert!(
        series["agg"][0].0 <= series["agg"][1].0,
        "sorted by interactivity"
    );
    let svg = interactivity_vs_throughput_svg(&runs, ThroughputKind::Total).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("conditional") && svg.contains("</svg>"));
    // The legend has its own strip right of the plot: no point lies under it.
    let attr = |element: &str, name: &str| -> f64 {
        let at = element.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        element[at..at + element[at..].find('"').unwrap()]
            .parse()
            .unwrap()
    };
    let circles: Vec<&str> = svg.split("<circle").skip(1).collect();
    assert!(!circles.is_empty());
    let (points, legend_marks): (Vec<f64>, Vec<f64>) = circles
        .iter()
        .map(|c| attr(c, "cx"))
        .partition(|x| *x < 900.0);
    assert_eq!(points.len(), runs.len(), "a point per run, all on the plot");
    assert_eq!(
        legend_marks.len(),
        3,
        "a mark per mode, all in the legend's strip"
    );
    for mode in ["agg", "disagg", "conditional"] {
        let label = svg
            .split("<text")
            .find(|t| {
                let inner = t.split_once('>').map_or("", |(_, rest)| rest);
                inner.split("</text>").next().map(str::trim) == Some(mode)
            })
            .expect(mode);
        assert!(attr(label, "x") >= 900.0, "{mode}'s label on the plot");
    }
    // Reports round-trip through JSON (the compare subcommand reads them back).
    let json = serde_json::to_string(&runs).unwrap();
    let back: Vec<switchyard_loadgen::report::RunReport> = serde_json::from_str(&json).unwrap();
    // (serde_json's float parsing may differ in the last bit, so compare the exact fields.)
    assert_eq!(back.len(), runs.len());
    for (b, r) in back.iter().zip(&runs) {
        assert_eq!(
            (&b.meta, &b.requests, &b.routes, &b.errors),
            (&r.meta, &r.requests, &r.routes, &r.errors)
        );
        assert!(
            (b.throughput.total_tokens_per_s_per_gpu - r.throughput.total_tokens_per_s_per_gpu)
                .abs()
                < 1e-9
        );
    }
}

#[test]
fn reports_written_before_the_rename_still_load() {
    // A virtual run's meta as written before `time_scale` / `sim_speedup` were renamed: 0
    // meant "no speed-up".
    let old = r#"{"label": "agg@x0.5", "mode": "agg", "workload": "w", "endpoint": "e",
        "gpus": 8, "time_scale": 0.5, "seed": 0, "planned_requests": 3,
        "offered_rps": 1.5, "sim_speedup": 0.0}"#;
    let meta: RunMeta = serde_json::from_str(old).unwrap();
    assert_eq!(meta.arrival_scale.factor(), 0.5);
    assert_eq!(meta.speed_up, SpeedUp::REAL);
    assert_eq!(meta.load_level, None);
    let sped_up = old.replace("\"sim_speedup\": 0.0", "\"sim_speedup\": 4.0");
    let meta: RunMeta = serde_json::from_str(&sped_up).unwrap();
    assert_eq!(meta.speed_up.factor(), 4.0);
    let negative = old.replace("\"sim_speedup\": 0.0", "\"sim_speedup\": -1.0");
    assert!(serde_json::from_str::<RunMeta>(&negative).is_err());
}

#[test]
fn the_markdown_report_says_how_many_trace_lines_were_skipped() {
    let mut m = meta(4, "agg");
    let clean = run_markdown(&build_report(m.clone(), &records(), 0, Slo::default()));
    assert!(!clean.contains("skipped"), "{clean}");
    m.malformed_trace_lines = 3;
    let md = run_markdown(&build_report(m, &records(), 0, Slo::default()));
    assert!(md.contains("3 trace line(s) skipped as malformed"), "{md}");
}
