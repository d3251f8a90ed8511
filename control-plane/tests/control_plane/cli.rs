//! The binary's start-up refusals for the admin API's settings: each exits 64 (EX_USAGE)
//! with a message naming the setting, before binding or connecting anything.

use std::process::Command;

/// Runs the binary with `args` and `token` as `SWITCHYARD_ADMIN_TOKEN` (none if `None`);
/// returns its stderr after checking it exited 64.
fn refused(args: &[&str], token: Option<&str>) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_switchyard-control-plane"));
    command
        .args(args)
        .env_remove("SWITCHYARD_ADMIN_TOKEN")
        .env_remove("SWITCHYARD_ADMIN_TOKEN_FILE");
    if let Some(token) = token {
        command.env("SWITCHYARD_ADMIN_TOKEN", token);
    }
    let output = command.output().expect("the binary runs");
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_admin_settings_exit_64_naming_the_setting() {
    let same = refused(
        &[
            "--listen",
            "127.0.0.1:18090",
            "--admin-listen",
            "127.0.0.1:18090",
        ],
        Some("a-long-enough-admin-token"),
    );
    assert!(
        same.contains("--admin-listen must differ from --listen"),
        "{same}"
    );

    let short = refused(&[], Some("short"));
    assert!(short.contains("SWITCHYARD_ADMIN_TOKEN"), "{short}");
    assert!(short.contains("at least 16"), "{short}");

    let missing = refused(&["--admin-token-file", "/nonexistent/admin-token"], None);
    assert!(
        missing.contains("--admin-token-file /nonexistent/admin-token"),
        "{missing}"
    );
}

/// Runs the binary with `args` and `env`, an admin token and loopback listeners on free
/// ports; returns its exit code and stderr.
fn run_with(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let (listen, admin) = (
        format!("127.0.0.1:{}", crate::common::free_port()),
        format!("127.0.0.1:{}", crate::common::free_port()),
    );
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard-control-plane"))
        .args(["--listen", &listen, "--admin-listen", &admin])
        .args(args)
        .env("SWITCHYARD_ADMIN_TOKEN", "a-long-enough-admin-token")
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_pool_file_or_nats_url_that_cannot_be_used_exits_64_naming_it() {
    let (code, stderr) = run_with(&["--pool-file", "/nonexistent/pools.yaml"], &[]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("/nonexistent/pools.yaml"), "{stderr}");

    let (code, stderr) = run_with(
        &[
            "--nats-url",
            "nats://127.0.0.1:4222,nats://127.0.0.1:notaport",
        ],
        &[],
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("notaport"), "{stderr}");
}

#[test]
fn allow_unsigned_registrations_takes_the_usual_boolean_words_from_the_environment() {
    // A missing pool file stops the binary once its flags parsed: exit 64 naming the file,
    // not the variable.
    for word in ["1", "0", "true", "yes", "off"] {
        let (code, stderr) = run_with(
            &["--pool-file", "/nonexistent/pools.yaml"],
            &[("SWITCHYARD_ALLOW_UNSIGNED_REGISTRATIONS", word)],
        );
        assert_eq!(code, Some(64), "{word}: {stderr}");
        assert!(
            stderr.contains("/nonexistent/pools.yaml"),
            "{word}: {stderr}"
        );
    }
    let (code, stderr) = run_with(&[], &[("SWITCHYARD_ALLOW_UNSIGNED_REGISTRATIONS", "maybe")]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("allow-unsigned-registrations"), "{stderr}");
}

/// The Istio sample (`envoy/istio/control-plane.yaml`) is not applied to a mesh here, so its
/// container arguments are checked against the binary: every flag it passes exists and takes
/// the value given (clap stops at the first one it refuses, before reaching `--help`; files
/// are opened only later), and its readiness probe is `/readyz`, which waits for workers and
/// their caches (`/healthz` is 200 as soon as HTTP serves).
#[test]
fn the_istio_sample_passes_flags_the_binary_takes_and_probes_readiness() {
    let sample = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy/istio/control-plane.yaml"
    ))
    .expect("the Istio sample");
    let args: Vec<&str> = sample
        .lines()
        .filter_map(|line| {
            line.trim()
                .strip_prefix("- --")
                .map(|_| line.trim()[2..].trim())
        })
        .collect();
    assert!(
        args.contains(&"--registration-secret-file=/etc/switchyard/registration/secret"),
        "workers must be able to join: {args:?}"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_switchyard-control-plane"))
        .args(&args)
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        sample.contains("httpGet: { path: /readyz, port: 8080 }"),
        "the readiness probe must be /readyz"
    );
}

/// An operator following one request by its id finds it in the control plane's log at
/// `RUST_LOG=debug` (its route call, refused or decided, and its lifecycle reports), and
/// async-nats's line-a-second reconnect chatter stays out of it even at that level: the
/// control plane says the NATS state once itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_debug_the_log_names_each_request_id_and_not_every_nats_retry() {
    use std::time::Duration;
    let (listen, admin, nowhere) = (
        format!("127.0.0.1:{}", crate::common::free_port()),
        format!("127.0.0.1:{}", crate::common::free_port()),
        crate::common::free_port(),
    );
    let scratch = crate::common::TempDir::new("cp-debug-log").expect("scratch dir");
    let log = scratch.path().join("control-plane.log");
    let child = Command::new(env!("CARGO_BIN_EXE_switchyard-control-plane"))
        .args(["--listen", &listen, "--admin-listen", &admin])
        .args(["--nats-url", &format!("nats://127.0.0.1:{nowhere}")])
        .env("SWITCHYARD_ADMIN_TOKEN", "a-long-enough-admin-token")
        .env("RUST_LOG", "debug")
        .stdout(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("the binary runs");
    let mut child = KillOnDrop(child);
    let http = reqwest::Client::new();
    crate::common::eventually(Duration::from_secs(20), "the control plane serves", || {
        let url = format!("http://{listen}/healthz");
        let http = http.clone();
        async move { http.get(url).send().await.is_ok() }
    })
    .await;
    let refused = http
        .post(format!("http://{listen}/v1/route"))
        .header(switchyard_protocol::route::API_HEADER, "chat")
        .header(switchyard_protocol::route::REQUEST_ID_HEADER, "follow-me-1")
        .body(crate::common::chat("hello"))
        .send()
        .await
        .expect("route call");
    assert_eq!(refused.status(), 503, "no workers yet");
    let reported = http
        .post(format!("http://{listen}/v1/lifecycle"))
        .json(&serde_json::json!({"v": 1, "events": [
            {"event": "done", "request_id": "follow-me-2", "ok": false, "failed_open": true}
        ]}))
        .send()
        .await
        .expect("lifecycle call");
    assert!(reported.status().is_success());
    // Long enough for async-nats to retry the missing server a few times.
    tokio::time::sleep(Duration::from_secs(3)).await;
    child.stop();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for id in ["follow-me-1", "follow-me-2"] {
        assert!(text.contains(id), "{id} in the log:\n{text}");
    }
    let chatter = text.lines().filter(|l| l.contains("async_nats")).count();
    assert_eq!(chatter, 0, "async-nats lines in:\n{text}");
    assert!(
        !text.contains('\u{1b}'),
        "no colour codes in a file:\n{text}"
    );
}

/// A started binary, killed when the test ends, also by a failed assertion.
struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}
