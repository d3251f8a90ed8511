//! The `switchyard-replay` binary: bad input exits with 64 and says what is wrong; a small
//! run prints the comparison and writes the report folder.

use std::path::PathBuf;
use std::process::{Command, Output};

fn replay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard-replay"))
        .args(args)
        .output()
        .expect("the replay binary runs")
}

#[test]
fn bad_input_exits_64_with_a_clear_message() {
    let cases: [(&[&str], &str); 19] = [
        // A bad ratio is named, with its flag and value.
        (
            &["--agentic", "--sweep", "--sweep-ratios", "2"],
            "--sweep-ratios: a ratio threshold must be in [0, 1], got 2",
        ),
        // The same point twice ran twice (the planner refused it already).
        (
            &["--agentic", "--sweep", "--sweep-thresholds", "0,0"],
            "ISL threshold 0 is given twice",
        ),
        // An --out that cannot be a folder is found before any run.
        (
            &["--agentic", "--out", "/dev/null/out"],
            "--out /dev/null/out",
        ),
        // A sweep's knobs without the sweep would be ignored: refused instead.
        (&["--agentic", "--sweep-thresholds", "100"], "--sweep"),
        // A negative value is taken as the flag's value and refused as out of range (clap
        // took `-0.2` for an unknown flag `-0`).
        (
            &["--agentic", "--prefill-ratio", "-0.2"],
            "--prefill-ratio must be strictly between 0 and 1, got -0.2",
        ),
        // Objectives are positive numbers, named as the flag they came from.
        (&["--agentic", "--slo-ttft-ms=-5"], "--slo-ttft-ms"),
        (&["--agentic", "--slo-itl-ms", "nan"], "--slo-itl-ms"),
        (
            &["--modes", "agg,fast"],
            "invalid value 'fast' for '--modes",
        ),
        (
            &["--trace", "/nonexistent/trace.jsonl"],
            "cannot read trace",
        ),
        (
            &[
                "--agentic",
                "--conditional-disagg-config",
                r#"{"eff_isl_ratio_threshold": 2}"#,
            ],
            "eff_isl_ratio_threshold",
        ),
        (
            &["--agentic", "--conditional-disagg-config", "{not json"],
            "is not JSON",
        ),
        (
            &["--agentic", "--workers", "2", "--prefill-workers", "2"],
            "prefill workers",
        ),
        (&["--no-such-flag"], "unexpected argument"),
        // Each simulated worker holds its KV block table: 100,000 of them ran out of memory.
        (&["--agentic", "--workers", "100000"], "not in 1..=512"),
        // A scale that stretches the run past what virtual time resolves: the run never
        // ended, printing nothing.
        (
            &["--agentic", "--arrival-scale", "1e30"],
            "--arrival-scale / --load-levels",
        ),
        (
            &["--agentic", "--load-levels", "1e-300"],
            "--arrival-scale / --load-levels",
        ),
        // A sweep runs conditional serving: refused up front on one worker (it ran agg
        // first, then failed, exit 1, leaving half a report).
        (
            &["--agentic", "--workers", "1", "--modes", "agg", "--sweep"],
            "--sweep runs conditional serving",
        ),
        // Each run's mode is its --modes entry: a config's serving_mode was dropped unseen.
        (
            &[
                "--agentic",
                "--modes",
                "agg",
                "--conditional-disagg-config",
                r#"{"serving_mode": "disagg"}"#,
            ],
            "leave serving_mode out",
        ),
        // Named as the flag, in the user's unit (it said "ms per prompt token ... -0.001").
        (
            &["--agentic", "--gateway-body-us-per-token=-1"],
            "--gateway-body-us-per-token",
        ),
    ];
    for (args, expected) in cases {
        let out = replay(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// A folder removed when the test ends, also on panic.
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn small_agentic_run_prints_the_table_and_writes_reports() {
    let dir = TempDir(std::env::temp_dir().join(format!("sy-replay-cli-{}", std::process::id())));
    let out = replay(&[
        "--agentic",
        "--sessions",
        "3",
        "--turns",
        "4",
        "--workers",
        "2",
        "--sweep",
        "--sweep-thresholds",
        "0,4096",
        "--out",
        dir.0.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for mode in ["| agg@x1 | agg |", "| disagg@x1 |", "| conditional@x1 |"] {
        assert!(stdout.contains(mode), "{stdout}");
    }
    assert!(stdout.contains("Threshold sweep"), "{stdout}");
    assert!(
        stdout.contains("at load 1× (the first of --load-levels); SLOs: TTFT ≤ –, ITL ≤ –."),
        "the sweep names its load and objectives: {stdout}"
    );
    assert!(
        stdout.contains("Recommended (measured)") && stdout.contains("% of the best sweep point"),
        "{stdout}"
    );
    let sweep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.0.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(sweep["points"].as_array().unwrap().len(), 2);
    assert!(sweep["recommendation"]["goodput_ratio"].as_f64().unwrap() > 0.98);
    for file in [
        "comparison.md",
        "comparison.json",
        "throughput_vs_interactivity.svg",
        "tuning.json",
        "sweep.json",
        "runs/conditional@x1/records.jsonl",
        "runs/conditional@x1/routes.jsonl",
        "runs/agg@x1/report.json",
    ] {
        assert!(dir.0.join(file).is_file(), "missing {file}");
    }
    let routes = std::fs::read_to_string(dir.0.join("runs/disagg@x1/routes.jsonl")).unwrap();
    assert!(routes.lines().count() > 3);
    assert!(routes.lines().all(|l| l.contains("\"mode\":\"disagg\"")));
}

fn plan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard-plan"))
        .args(args)
        .output()
        .expect("the plan binary runs")
}

const SESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/session_trace_small.jsonl"
);

#[test]
fn the_planner_refuses_bad_input_and_plans_a_session_trace() {
    let slo = ["--slo-ttft-ms", "2000", "--slo-itl-ms", "25"];
    let cases: [(Vec<&str>, &str); 8] = [
        (
            vec!["--slo-ttft-ms", "0", "--slo-itl-ms", "25", "--out", "x"],
            "--slo-ttft-ms must be a positive",
        ),
        (
            [
                &slo[..],
                &["--workers", "1", "--modes", "disagg", "--out", "x"],
            ]
            .concat(),
            "needs at least 2 workers",
        ),
        (
            [&slo[..], &["--sweep-ratios", "1.5", "--out", "x"]].concat(),
            "ratio threshold must be in [0, 1]",
        ),
        (
            [&slo[..], &["--max-minutes", "0", "--out", "x"]].concat(),
            "--max-minutes must be above 0",
        ),
        (
            [&slo[..], &["--max-minutes", "1e300", "--out", "x"]].concat(),
            "at most a year",
        ),
        (
            [&slo[..], &["--modes", "agg,agg", "--out", "x"]].concat(),
            "mode agg is given twice",
        ),
        // slo_cost is a conditional policy: without conditional it planned nothing, unsaid.
        (
            [&slo[..], &["--modes", "agg", "--slo-cost", "--out", "x"]].concat(),
            "--slo-cost plans conditional serving",
        ),
        // A level that stretches the run past what virtual time resolves: the plan never
        // ended.
        (
            [
                &slo[..],
                &["--agentic", "--load-levels", "1e-300", "--out", "x"],
            ]
            .concat(),
            "--arrival-scale / --load-levels",
        ),
    ];
    for (args, expected) in cases {
        let out = plan(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // A trace with no usable row is refused before the output folder is made.
    let empty = std::env::temp_dir().join(format!("sy-plan-empty-{}.jsonl", std::process::id()));
    std::fs::write(&empty, "\n").unwrap();
    let never = std::env::temp_dir().join(format!("sy-plan-never-{}", std::process::id()));
    let out = plan(
        &[
            &slo[..],
            &[
                "--trace",
                empty.to_str().unwrap(),
                "--out",
                never.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    std::fs::remove_file(&empty).unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !never.exists(),
        "no output folder for a plan that never ran"
    );
    let dir = TempDir(std::env::temp_dir().join(format!("sy-plan-cli-{}", std::process::id())));
    let args = [
        &slo[..],
        &[
            "--trace",
            SESSIONS,
            "--workers",
            "2",
            "--sweep-thresholds",
            "0,4096",
            "--jobs",
            "2",
            "--quiet",
            "--out",
            dir.0.to_str().unwrap(),
        ],
    ]
    .concat();
    let out = plan(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("sessions: 9 requests"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // agg + disagg 1:1 + conditional 1:1 at two thresholds.
    assert!(stdout.contains("4 points: 4 measured"), "{stdout}");
    assert!(stdout.contains("## Recommended"), "{stdout}");
    for file in ["plan.md", "plan.json", "frontier_throughput.svg"] {
        assert!(dir.0.join(file).is_file(), "missing {file}");
    }
}

/// A replay in which no request succeeded is a failed run: exit 1, the report written all the
/// same (as the load generator does); it exited 0 as if it had measured something.
#[test]
fn a_replay_where_nothing_succeeded_exits_1() {
    let dir = TempDir(std::env::temp_dir().join(format!("sy-replay-none-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let trace = dir.0.join("t.jsonl");
    // More output than the model's context holds: every request is refused (400), as the
    // real control plane refuses it.
    std::fs::write(
        &trace,
        r#"{"timestamp": 0, "input_length": 3, "output_length": 100000000, "hash_ids": [0]}"#,
    )
    .unwrap();
    let out = dir.0.join("out");
    let run = replay(&[
        "--trace",
        trace.to_str().unwrap(),
        "--modes",
        "agg",
        "--workers",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no request succeeded"), "{stderr}");
    assert!(
        out.join("comparison.md").is_file(),
        "the report is written all the same"
    );
}

/// A request no worker can serve (its output is larger than the model's context) fails at
/// every point: the plan says so (it read "0 failed",
/// and its ceiling counted the request), and a plan in which nothing succeeded exits 1 as the
/// replay does (it exited 0 advising looser objectives).
#[test]
fn a_plan_says_which_points_failed_requests_and_fails_when_none_succeeded() {
    let dir = TempDir(std::env::temp_dir().join(format!("sy-plan-failed-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let served = r#"{"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [0, 1]}"#;
    let too_large =
        r#"{"timestamp": 100, "input_length": 3, "output_length": 100000000, "hash_ids": [9]}"#;
    let slo = ["--slo-ttft-ms", "2000", "--slo-itl-ms", "25"];
    for (name, rows, code) in [
        ("mixed", format!("{served}\n{too_large}\n"), Some(0)),
        ("none", format!("{too_large}\n"), Some(1)),
    ] {
        let trace = dir.0.join(format!("{name}.jsonl"));
        std::fs::write(&trace, rows).unwrap();
        let out = dir.0.join(name);
        let args = [
            &slo[..],
            &[
                "--trace",
                trace.to_str().unwrap(),
                "--workers",
                "2",
                "--modes",
                "agg",
                "--jobs",
                "1",
                "--quiet",
                "--out",
                out.to_str().unwrap(),
            ],
        ]
        .concat();
        let run = plan(&args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
        );
        assert_eq!(run.status.code(), code, "{name}: {stderr}\n{stdout}");
        assert!(
            stdout.contains("**1 of 1 measured points failed requests** (up to 1 of"),
            "{name}: {stdout}"
        );
        if name == "none" {
            assert!(
                stdout.contains("No request succeeded at any point"),
                "{stdout}"
            );
            assert!(
                stderr.contains("no request succeeded at any point"),
                "{stderr}"
            );
        } else {
            assert!(stdout.contains("**agg"), "a recommendation: {stdout}");
        }
    }
}

/// A reader that stops early (`switchyard-replay ... | head -1`) is no failure: the report
/// folder is written before the table is printed, and the run exits 0 without a panic.
#[test]
fn a_reader_that_goes_away_is_not_a_panic() {
    let out = std::env::temp_dir().join(format!("replay-cli-pipe-{}", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-replay"))
        .args([
            "--agentic",
            "--sessions",
            "2",
            "--turns",
            "2",
            "--modes",
            "agg",
        ])
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the replay binary runs");
    // Close the read end before the table is printed.
    drop(child.stdout.take());
    let result = child.wait_with_output().expect("it finishes");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.join("comparison.md").is_file());
    let _ = std::fs::remove_dir_all(&out);
}

/// A reused `--out` holds only the latest run's files: a sweep's files and other modes' run
/// folders from an earlier run are removed, not left beside the new comparison.
#[test]
fn a_reused_out_folder_keeps_only_the_latest_runs_files() {
    let out = std::env::temp_dir().join(format!("replay-cli-reuse-{}", std::process::id()));
    let dir = out.to_str().unwrap();
    let small = [
        "--agentic",
        "--sessions",
        "2",
        "--turns",
        "2",
        "--workers",
        "2",
    ];
    let first = replay(&[&small[..], &["--sweep", "--out", dir]].concat());
    assert_eq!(
        first.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(out.join("sweep.md").is_file() && out.join("runs/disagg@x1").is_dir());
    let second = replay(&[&small[..], &["--modes", "agg", "--out", dir]].concat());
    assert_eq!(
        second.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let runs: Vec<String> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(runs, vec!["agg@x1".to_string()]);
    for stale in ["sweep.md", "sweep.json", "tuning.md", "tuning.json"] {
        assert!(!out.join(stale).exists(), "{stale} left from the first run");
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// An interrupted plan writes the points that ran and exits 130: before, Ctrl-C killed it
/// and every finished point was lost.
#[test]
fn an_interrupted_plan_writes_the_points_that_ran_and_exits_130() {
    let out = TempDir(std::env::temp_dir().join(format!("sy-plan-int-{}", std::process::id())));
    let dir = out.0.to_str().unwrap().to_string();
    // Many points on one thread: the interrupt comes long before the last would start.
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-plan"))
        .args([
            "--agentic",
            "--workers",
            "4",
            "--load-levels",
            "1,2,4",
            "--slo-cost",
            "--slo-ttft-ms",
            "2000",
            "--slo-itl-ms",
            "25",
            "--jobs",
            "1",
            "--quiet",
            "--out",
            &dir,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the plan binary runs");
    // Its banner comes once the signals are watched and the points start (a minute's work
    // on one thread: far from done when the interrupt comes).
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains(" points on 1 threads") {
        let mut line = String::new();
        let read = std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        assert!(read > 0, "the plan ended before its banner: {said}");
        said.push_str(&line);
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let mut status = None;
    for _ in 0..1200 {
        if let Some(exited) = child.try_wait().expect("wait for the plan") {
            status = Some(exited);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let Some(status) = status else {
        let _ = child.kill();
        panic!("the plan did not end within 60 s of Ctrl-C");
    };
    std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
    let stderr = said;
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("Ctrl-C: no further point starts"),
        "{stderr}"
    );
    assert!(stderr.contains("not run before the interrupt"), "{stderr}");
    let plan_md = std::fs::read_to_string(out.0.join("plan.md")).expect("plan.md written");
    assert!(plan_md.contains("not run"), "{plan_md}");
    assert!(out.0.join("plan.json").is_file());
}
