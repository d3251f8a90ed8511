//! `switchyard-compare`'s settings are checked before anything starts: bad ones exit with 64
//! and a message naming them, and a list flag given twice takes its last list (so
//! `scripts/demo.sh --load-levels 1` replaces the demo's levels instead of adding to them).

use std::process::Command;

fn compare(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard-compare"))
        .args(["--max-requests", "1", "--quiet"])
        .args(args)
        .output()
        .expect("run switchyard-compare");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn repeated_levels_are_refused_and_a_second_list_replaces_the_first() {
    let (code, err) = compare(&["--load-levels", "1,1"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("load level 1 given twice"), "{err}");

    // Appended, the levels would be 1,1,2 and refused as repeated; replaced, they are 2 and
    // the next check (no workers) is the one that fails.
    let (code, err) = compare(&[
        "--load-levels",
        "1,1",
        "--load-levels",
        "2",
        "--workers",
        "0",
    ]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--workers must be at least 1"), "{err}");

    let (code, err) = compare(&["--modes", "agg,agg", "--modes", "agg", "--workers", "0"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--workers must be at least 1"), "{err}");

    // 600 workers started a 600-engine stack on one machine.
    let (code, err) = compare(&["--workers", "600"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--workers must be at most 128"), "{err}");
    assert!(!err.contains("starting a stack"), "{err}");
}

/// A router config the control plane would refuse is refused before any stack starts (it
/// used to start one and fail with the reason only in the control plane's log, exit 1).
#[test]
fn a_router_config_the_control_plane_refuses_is_refused_before_anything_starts() {
    let dir = std::env::temp_dir().join(format!("compare-cli-config-{}", std::process::id()));
    let out = dir.to_str().unwrap();
    for (config, named) in [
        (r#"{"nonsense": 1}"#, "nonsense"),
        (
            r#"{"eff_isl_ratio_threshold": 2}"#,
            "eff_isl_ratio_threshold",
        ),
        ("{not json", "not JSON"),
        // The control plane lets it win over --serving-mode: every run would serve disagg.
        (r#"{"serving_mode": "disagg"}"#, "leave serving_mode out"),
    ] {
        let (code, err) = compare(&["--conditional-disagg-config", config, "--out", out]);
        assert_eq!(code, Some(64), "{config}: {err}");
        assert!(err.contains(named), "{config}: {err}");
        assert!(!err.contains("starting a stack"), "{config}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A route timeout the filter refuses is refused by the flag, before any stack starts (it used
/// to start one, and Envoy exited naming only its own failure).
#[test]
fn a_route_timeout_the_filter_refuses_is_refused_by_the_flag() {
    for value in ["0", "60001"] {
        let (code, err) = compare(&["--route-timeout-ms", value]);
        assert_eq!(code, Some(64), "{value}: {err}");
        assert!(err.contains("--route-timeout-ms"), "{value}: {err}");
        assert!(!err.contains("starting a stack"), "{value}: {err}");
    }
}

/// A stderr nobody reads (`2>&1 | head -2`, the reader gone) costs the messages, not the run:
/// `eprintln!` panicked there, the panic could not be printed either, and the process aborted
/// (a signal, no exit code) in the middle of a comparison.
#[test]
fn a_stderr_nobody_reads_is_no_abort() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let status = Command::new(env!("CARGO_BIN_EXE_switchyard-compare"))
        .args(["--max-requests", "1", "--quiet", "--workers", "0"])
        .stderr(writer)
        .status()
        .expect("run switchyard-compare");
    assert_eq!(status.code(), Some(64), "{status:?}");
}
