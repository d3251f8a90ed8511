//! The `switchyard-loadgen` binary end to end: clear errors for bad input, a run against a
//! real SSE server writing records and reports, and `compare`.

use crate::loadgen_support;

use std::path::{Path, PathBuf};
use std::process::Output;

use loadgen_support::start_server;
use switchyard_loadgen::report::RunReport;

const BIN: &str = env!("CARGO_BIN_EXE_switchyard-loadgen");

/// A scratch folder removed when the test ends, also on panic.
struct Scratch(PathBuf);
impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("loadgen-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn loadgen(args: &[&str]) -> Output {
    let run = tokio::process::Command::new(BIN)
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .expect("loadgen finishes")
        .expect("loadgen starts")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const ROWS: &str = r#"{"timestamp": 0, "input_length": 700, "output_length": 4, "hash_ids": [0, 1]}
{"timestamp": 10, "input_length": 900, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 20, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]}
"#;

#[tokio::test]
async fn malformed_and_missing_traces_fail_clearly() {
    let dir = Scratch::new("bad");
    let trace = dir.file("t.jsonl", &format!("{ROWS}{{\"timestamp\": 1}}\n"));
    let trace = trace.to_str().unwrap();

    let plan = loadgen(&["plan", "--trace", trace]).await;
    assert!(plan.status.success(), "{}", text(&plan.stderr));
    let stderr = text(&plan.stderr);
    assert!(
        stderr.contains("t.jsonl:4: missing field `input_length`"),
        "{stderr}"
    );
    assert!(stderr.contains("1 malformed line(s) skipped"), "{stderr}");
    assert!(
        text(&plan.stdout).contains("3 requests"),
        "{}",
        text(&plan.stdout)
    );

    // A session whose next turn waits 31 years (a delay in the wrong unit): said before
    // anything waits, as replay and the planner say it.
    let decades = dir.file(
        "decades.jsonl",
        concat!(
            r#"{"session_id": "a", "timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [0]}"#,
            "\n",
            r#"{"session_id": "a", "delay": 1000000000000, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}"#,
            "\n"
        ),
    );
    let span = loadgen(&["plan", "--trace", decades.to_str().unwrap()]).await;
    assert!(span.status.success(), "{}", text(&span.stderr));
    assert!(
        text(&span.stderr).contains("planned arrivals span 11574.1 days"),
        "{}",
        text(&span.stderr)
    );

    let strict = loadgen(&["plan", "--trace", trace, "--strict"]).await;
    assert!(!strict.status.success());
    assert!(text(&strict.stderr).contains("--strict"));

    let missing = loadgen(&["plan", "--trace", "/nonexistent/trace.jsonl"]).await;
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("cannot read trace /nonexistent/trace.jsonl"));

    let no_gpus = loadgen(&[
        "--endpoint",
        "http://127.0.0.1:9",
        "--trace",
        trace,
        "--out",
        "x",
    ])
    .await;
    assert!(!no_gpus.status.success());
    assert!(
        text(&no_gpus.stderr).contains("--gpus"),
        "{}",
        text(&no_gpus.stderr)
    );
}

#[tokio::test]
async fn an_agentic_workload_written_as_a_session_trace_plans_the_same() {
    let dir = Scratch::new("write-trace");
    let file = dir.0.join("agentic.jsonl");
    let file = file.to_str().unwrap();
    let agentic = [
        "--agentic",
        "--sessions",
        "3",
        "--turns",
        "5",
        "--seed",
        "4",
    ];
    let mut args = vec!["plan"];
    args.extend(agentic);
    args.extend(["--block-tokens", "64", "--write-trace", file]);
    let written = loadgen(&args).await;
    assert!(written.status.success(), "{}", text(&written.stderr));
    // A generated workload read no trace: nothing is said of trace lines.
    assert!(
        !text(&written.stdout).contains("malformed"),
        "{}",
        text(&written.stdout)
    );
    assert!(
        text(&written.stderr).contains("session-trace rows to"),
        "{}",
        text(&written.stderr)
    );
    let read = loadgen(&[
        "plan",
        "--trace",
        file,
        "--block-tokens",
        "64",
        "--seed",
        "4",
    ])
    .await;
    assert!(read.status.success(), "{}", text(&read.stderr));
    // Same requests, sessions, arrival span, lengths; only the name and reuse may differ.
    let shape = |out: &Output| {
        text(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("ISL") || l.starts_with("OSL") || l.starts_with("workload"))
            .map(|l| l.split_once(": ").map_or(l, |(_, rest)| rest).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&written), shape(&read));
    assert!(text(&read.stdout).contains("0 malformed"));

    let bad = dir.file(
        "bad.jsonl",
        "{\"session_id\": 1, \"timestamp\": 0, \"input_length\": 9, \"output_length\": 4, \"hash_ids\": [0]}\n\
         {\"session_id\": 1, \"input_length\": 9, \"output_length\": 4, \"hash_ids\": [0]}\n",
    );
    let bad = bad.to_str().unwrap();
    let plan = loadgen(&["plan", "--trace", bad]).await;
    assert!(plan.status.success(), "{}", text(&plan.stderr));
    let stderr = text(&plan.stderr);
    assert!(stderr.contains("bad.jsonl:2: a later turn"), "{stderr}");
    assert!(
        stderr.contains("1 malformed line(s) skipped (sessions trace)"),
        "{stderr}"
    );
    let strict = loadgen(&["plan", "--trace", bad, "--strict"]).await;
    assert!(!strict.status.success());
}

fn report(dir: &Path) -> RunReport {
    let json = std::fs::read_to_string(dir.join("report.json")).expect("report.json");
    serde_json::from_str(&json).expect("a run report")
}

#[tokio::test]
async fn a_run_writes_records_and_reports_and_compare_plots_them() {
    let (addr, _) = start_server().await;
    let dir = Scratch::new("run");
    let trace = dir.file("t.jsonl", ROWS);
    let endpoint = format!("http://{addr}");
    for (mode, out) in [("agg", "agg"), ("conditional", "cond")] {
        let out = dir.0.join(out);
        let run = loadgen(&[
            "--endpoint",
            &endpoint,
            "--trace",
            trace.to_str().unwrap(),
            "--api",
            "completions",
            "--arrival-scale",
            "0.5",
            "--workers",
            "2",
            "--mode",
            mode,
            "--slo-ttft-ms",
            "5000",
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ])
        .await;
        assert!(run.status.success(), "{}", text(&run.stderr));
        assert!(text(&run.stdout).contains("| TTFT (ms) |"));
        let r = report(&out);
        assert_eq!((r.requests.sent, r.requests.ok), (3, 3));
        assert_eq!(r.meta.gpus, 8, "2 workers x 4 GPUs");
        assert_eq!(r.meta.mode.as_deref(), Some(mode));
        // The test server counts prompt words; completions prompts are exactly input_length.
        assert_eq!(r.tokens.reported_prompt, 700 + 900 + 1100);
        assert_eq!(r.tokens.prompt_count_mismatches, 0);
        assert_eq!(r.routes.bypass_share, Some(1.0));
        let records = std::fs::read_to_string(out.join("records.jsonl")).unwrap();
        assert_eq!(records.lines().count(), 3);
        assert!(std::fs::read_to_string(out.join("report.md"))
            .unwrap()
            .contains("bypass"));
    }
    let cmp = dir.0.join("cmp");
    let compare = loadgen(&[
        "compare",
        "--out",
        cmp.to_str().unwrap(),
        dir.0.join("agg").to_str().unwrap(),
        dir.0.join("cond").to_str().unwrap(),
    ])
    .await;
    assert!(compare.status.success(), "{}", text(&compare.stderr));
    let table = std::fs::read_to_string(cmp.join("comparison.md")).unwrap();
    assert!(
        table.contains("| agg |") && table.contains("| conditional |"),
        "{table}"
    );
    let svg = std::fs::read_to_string(cmp.join("throughput_vs_interactivity.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("conditional"));

    // Two runs sharing a label (here the same default one) are told apart by their folders.
    let again = dir.0.join("agg-again");
    std::fs::create_dir_all(&again).unwrap();
    std::fs::copy(dir.0.join("agg/report.json"), again.join("report.json")).unwrap();
    let compare = loadgen(&[
        "compare",
        "--out",
        cmp.to_str().unwrap(),
        dir.0.join("agg").to_str().unwrap(),
        again.to_str().unwrap(),
    ])
    .await;
    assert!(compare.status.success(), "{}", text(&compare.stderr));
    let table = std::fs::read_to_string(cmp.join("comparison.md")).unwrap();
    assert!(
        table.contains("/agg)") && table.contains("/agg-again)"),
        "{table}"
    );
    // A folder without a report is the user's mistake: exit 64, naming it.
    let missing = dir.0.join("never-ran");
    let compare = loadgen(&[
        "compare",
        "--out",
        cmp.to_str().unwrap(),
        missing.to_str().unwrap(),
    ])
    .await;
    assert_eq!(compare.status.code(), Some(64), "{}", text(&compare.stderr));
    assert!(
        text(&compare.stderr).contains("never-ran"),
        "{}",
        text(&compare.stderr)
    );
}

/// A run in which no request succeeded exits 1 and says so, and still writes its report (a
/// script that compares runs must not take it for a result).
#[tokio::test]
async fn a_run_where_every_request_fails_exits_1_with_its_report_written() {
    // A port that was just free: connecting to it is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = Scratch::new("all-failed");
    let trace = dir.file("t.jsonl", ROWS);
    let out = dir.0.join("out");
    let run = loadgen(&[
        "--endpoint",
        &format!("http://127.0.0.1:{port}"),
        "--trace",
        trace.to_str().unwrap(),
        "--api",
        "completions",
        "--workers",
        "1",
        "--request-timeout-s",
        "5",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ])
    .await;
    let stderr = text(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no request succeeded (3 sent"), "{stderr}");
    assert!(stderr.contains("3 connect"), "{stderr}");
    let r = report(&out);
    assert_eq!(
        (r.requests.sent, r.requests.ok, r.requests.failed),
        (3, 0, 3)
    );
}

/// Numbers no run can use are refused with the flag named and exit 64, before anything is
/// sent; none of them panics (an infinite or huge number of seconds is no `Duration`).
#[tokio::test]
async fn unusable_numbers_exit_64_naming_the_flag() {
    let dir = Scratch::new("numbers");
    let trace = dir.file("t.jsonl", ROWS);
    let out = dir.0.join("out");
    let (trace, out) = (trace.to_str().unwrap(), out.to_str().unwrap());
    let base = [
        "--endpoint",
        "http://127.0.0.1:1",
        "--trace",
        trace,
        "--out",
        out,
    ];
    for (flag, value) in [
        ("--drain-s", "inf"),
        ("--drain-s", "-1"),
        ("--request-timeout-s", "0"),
        ("--max-duration-s", "1e300"),
        ("--max-requests", "0"),
        ("--max-concurrency", "0"),
        ("--slo-ttft-ms", "nan"),
        ("--slo-itl-ms", "-5"),
    ] {
        let given = format!("{flag}={value}");
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--workers", "1", given.as_str()])
            .collect();
        let output = loadgen(&args).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{flag} {value}: {stderr}");
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }
    // The GPU count and the workload's own knobs, which clap cannot check alone.
    for (extra, named) in [
        (&["--workers", "2000000000"][..], "too large"),
        (&["--gpus", "0"][..], "--gpus"),
        (&["--workers", "0"][..], "--workers"),
        (
            &["--workers", "1", "--gpus-per-worker", "0"][..],
            "--gpus-per-worker",
        ),
        (
            &["--workers", "1", "--block-tokens", "0"][..],
            "--block-tokens",
        ),
        (&[][..], "--gpus N or --workers N"),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let output = loadgen(&args).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{extra:?}: {stderr}");
        assert!(stderr.contains(named), "{extra:?}: {stderr}");
    }
    for (extra, named) in [
        (
            &["--agentic", "--session-rate", "0"][..],
            "session_rate_per_s",
        ),
        (&["--agentic", "--sessions", "0"][..], "sessions"),
        (&[][..], "--trace PATH or --agentic"),
    ] {
        let args: Vec<&str> = ["plan"].into_iter().chain(extra.iter().copied()).collect();
        let output = loadgen(&args).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "plan {extra:?}: {stderr}");
        assert!(stderr.contains(named), "plan {extra:?}: {stderr}");
    }
}

/// What a run cannot use is bad input, exit 64 before anything is sent, with the problem
/// named: an endpoint that is not `http://`, an `--out` that cannot be created, an unusable
/// trace (missing, or no usable row, or a malformed line under `--strict`), and
/// `--write-trace` of an open-loop trace. A trace's line that is not UTF-8 costs that line only.
#[tokio::test]
async fn unusable_inputs_exit_64_before_anything_is_sent() {
    let dir = Scratch::new("inputs");
    let trace = dir.file("t.jsonl", ROWS);
    let blocked = dir.file("file-not-dir", "x");
    let empty = dir.file("empty.jsonl", "\n\n");
    let mut bytes = ROWS.as_bytes().to_vec();
    bytes.extend(b"\n{\"timestamp\": \xff}\n");
    let utf8 = dir.0.join("utf8.jsonl");
    std::fs::write(&utf8, &bytes).unwrap();
    let out = dir.0.join("out");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let run = |endpoint: &str, trace: &str, out: &str| {
        vec![
            "--endpoint".to_string(),
            endpoint.into(),
            "--trace".into(),
            trace.into(),
            "--out".into(),
            out.into(),
            "--workers".into(),
            "1".into(),
        ]
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            run("127.0.0.1:10000", &path(&trace), &path(&out)),
            "did you mean http://127.0.0.1:10000?",
        ),
        (
            run("https://127.0.0.1:1", &path(&trace), &path(&out)),
            "TLS is not built in",
        ),
        (
            run(
                "http://127.0.0.1:1",
                &path(&trace),
                &path(&blocked.join("out")),
            ),
            "cannot create --out",
        ),
        (
            run(
                "http://127.0.0.1:1",
                &path(&dir.0.join("missing.jsonl")),
                &path(&out),
            ),
            "missing.jsonl",
        ),
        (
            run("http://127.0.0.1:1", &path(&empty), &path(&out)),
            "no usable rows",
        ),
        (
            [
                run("http://127.0.0.1:1", &path(&utf8), &path(&out)),
                vec!["--strict".into()],
            ]
            .concat(),
            "--strict",
        ),
        (
            vec![
                "plan".into(),
                "--trace".into(),
                path(&trace),
                "--write-trace".into(),
                path(&dir.0.join("new/w.jsonl")),
            ],
            "open-loop",
        ),
    ];
    for (args, named) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = loadgen(&args).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    assert!(!out.exists(), "nothing was run");
    // Without --strict the line that is not UTF-8 is reported by number and the rest planned.
    let output = loadgen(&["plan", "--trace", &path(&utf8)]).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let bad_line = ROWS.split('\n').count() + 1;
    assert!(
        stderr.contains(&format!("utf8.jsonl:{bad_line}: not valid UTF-8")),
        "{stderr}"
    );
    // A session trace is written into a folder that did not exist yet.
    let sessions = dir.0.join("new/sessions.jsonl");
    let output = loadgen(&[
        "plan",
        "--agentic",
        "--sessions",
        "1",
        "--write-trace",
        &path(&sessions),
    ])
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(sessions.exists());
}

/// Ctrl-C stops a run but keeps what it measured: the requests in flight are cut, nothing more
/// is sent, the report of those that finished is written and says so, and the exit status is
/// 130. (It used to die at once with an empty `--out`, or beside an earlier run's report.)
#[tokio::test]
async fn an_interrupted_run_writes_the_report_of_what_finished_and_exits_130() {
    let (addr, state) = start_server().await;
    let dir = Scratch::new("interrupted");
    // One short request, two long streams (2,000 tokens at 15 ms) a second later, when the
    // short one has long finished, and one a minute later.
    let trace = dir.file(
        "t.jsonl",
        r#"{"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [0]}
{"timestamp": 1000, "input_length": 100, "output_length": 2000, "hash_ids": [1]}
{"timestamp": 1000, "input_length": 100, "output_length": 2000, "hash_ids": [2]}
{"timestamp": 60000, "input_length": 100, "output_length": 1, "hash_ids": [3]}
"#,
    );
    let out = dir.0.join("out");
    let endpoint = format!("http://{addr}");
    let mut child = tokio::process::Command::new(BIN)
        .args(["--endpoint", &endpoint, "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(&out)
        .args(["--workers", "1", "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("loadgen starts");
    // Until both long streams are open.
    let opened = async {
        use std::sync::atomic::Ordering::SeqCst;
        while state.in_flight.load(SeqCst) != 2 {
            assert!(child.try_wait().unwrap().is_none(), "loadgen exited early");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), opened)
        .await
        .expect("two streams in flight");
    let pid = child.id().expect("running").to_string();
    let interrupted = tokio::time::Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let output = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        child.wait_with_output().await
    })
    .await
    .expect("loadgen stops")
    .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        interrupted.elapsed() < std::time::Duration::from_secs(10),
        "the streams ran on"
    );
    assert!(stderr.contains("s of real time ("), "{stderr}");
    let report: RunReport =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let stop = report.meta.interrupted.expect("marked interrupted");
    assert_eq!(stop.cut, 2, "{report:?}");
    assert_eq!(
        (
            report.requests.sent,
            report.requests.ok,
            report.requests.not_sent
        ),
        (1, 1, 1),
        "{:?}",
        report.requests
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("s of real time** ("), "{md}");
    let records = std::fs::read_to_string(out.join("records.jsonl")).unwrap();
    assert_eq!(records.lines().count(), 1, "{records}");
}
