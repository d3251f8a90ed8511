//! `switchyard-local` as a person uses it: start it, read where to send requests, send one,
//! see a dead child named (and the rest kept running), stop it with SIGTERM, and find every
//! process it started gone.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use switchyard_e2e::{chat_body, client, post_observed, sse_data, BUILD_COMMAND};
use switchyard_protocol::route::ROUTE_HEADER;
use switchyard_stack::paths::target_dir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Stops the launcher if the test fails midway: SIGTERM twice (so it stops its own children,
/// which run in process groups of their own; the second ends a drain of streams in flight at
/// once), then SIGKILL after a bounded wait.
struct Launcher(Child);

impl Drop for Launcher {
    fn drop(&mut self) {
        let Some(pid) = self.0.id() else { return };
        for _ in 0..2 {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            std::thread::sleep(Duration::from_millis(100));
        }
        for _ in 0..250 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.start_kill();
    }
}

fn alive(pid: u32) -> bool {
    switchyard_stack::process::process_state(pid).is_some_and(|state| state != 'Z')
}

/// A started launcher: its stderr collected as it comes, and what its banner said.
struct Started {
    launcher: Launcher,
    /// Its stdout past the banner.
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    said: std::sync::Arc<std::sync::Mutex<String>>,
    collector: tokio::task::JoinHandle<()>,
    run_dir: PathBuf,
    gateway: String,
    /// The processes it lists in its `pids` file.
    listed: Vec<(u32, String)>,
}

/// Starts `switchyard-local --decode 1`, with the control plane's admin port and the worker's
/// port given, and reads its banner, within a bounded time.
async fn start_launcher() -> Started {
    let binary = target_dir(&|k| std::env::var(k).ok()).join("debug/switchyard-local");
    assert!(
        binary.exists(),
        "{} missing; run first:\n  {BUILD_COMMAND}",
        binary.display()
    );
    let ports = switchyard_support::free_listen_ports(2);
    let (admin_port, worker_port) = (ports[0], ports[1]);
    let child = Command::new(&binary)
        .args(["--decode", "1"])
        .args(["--control-plane-admin-port", &admin_port.to_string()])
        .args(["--worker-ports-from", &worker_port.to_string()])
        .env("RUST_LOG", "warn")
        // The workers at the modelled speed, whatever the environment asks: the drain test
        // needs a stream that is still running when the stop comes.
        .env_remove("SWITCHYARD_SPEED_UP")
        // A group of its own, as a shell gives a foreground job: the tests signal it as a
        // terminal does (Ctrl-C, hang-up: the whole group), not only its own PID.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start switchyard-local");
    let mut launcher = Launcher(child);
    let stdout = launcher.0.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    // What it says on stderr, collected as it comes (and echoed for the test's log).
    let stderr = launcher.0.stderr.take().expect("piped stderr");
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let collector = tokio::spawn({
        let said = said.clone();
        async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{line}");
                said.lock().unwrap().push_str(&(line + "\n"));
            }
        }
    });

    // Read the banner: the run directory and the gateway URL.
    let mut run_dir: Option<PathBuf> = None;
    let mut gateway: Option<String> = None;
    let mut banner_lines = String::new();
    let banner = async {
        while let Ok(Some(line)) = lines.next_line().await {
            banner_lines.push_str(&line);
            banner_lines.push('\n');
            if let Some(rest) = line.split("logs in ").nth(1) {
                run_dir = Some(PathBuf::from(rest.trim_end_matches(").")));
            }
            if let Some(rest) = line.strip_prefix("Send requests to ") {
                gateway = rest.split(',').next().map(str::to_string);
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(90), banner)
        .await
        .expect("banner within 90 s");
    let gateway = gateway.expect("the launcher printed where to send requests");
    let run_dir = run_dir.expect("the launcher printed its run directory");
    // The ports given are the ones used, and the banner says so.
    let worker_line = format!("decode   127.0.0.1:{worker_port}");
    let admin_line = format!("admin API      http://127.0.0.1:{admin_port} ");
    assert!(
        banner_lines.contains(&worker_line) && banner_lines.contains(&admin_line),
        "{banner_lines}"
    );
    for url in [
        format!("http://127.0.0.1:{admin_port}/healthz"),
        format!("http://127.0.0.1:{worker_port}/health"),
    ] {
        let status = client().get(&url).send().await.map(|r| r.status());
        assert!(
            status.as_ref().is_ok_and(|s| s.is_success()),
            "{url}: {status:?}"
        );
    }
    let listed: Vec<(u32, String)> = std::fs::read_to_string(run_dir.join("pids"))
        .expect("pids file")
        .lines()
        .filter_map(|line| {
            let (pid, name) = line.split_once(' ')?;
            Some((pid.parse().ok()?, name.to_string()))
        })
        .collect();
    assert_eq!(
        listed.len(),
        4,
        "nats, control plane, workers, envoy: {listed:?}"
    );
    assert!(listed.iter().all(|&(pid, _)| alive(pid)));
    Started {
        launcher,
        lines,
        said,
        collector,
        run_dir,
        gateway,
        listed,
    }
}

impl Started {
    /// Sends `signal` to the launcher alone (not its process group), and checks that it
    /// exits 0 within 20 s, saying `why`, with every process it started gone.
    async fn stop_with(self, signal: &str, why: &str) {
        let pid = self.launcher.0.id().expect("launcher pid");
        let _ = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status();
        self.stop_with_said(why, &format!("{why}: stopped everything"))
            .await;
    }

    /// Sends `signal` to the launcher's whole process group, as a terminal sends Ctrl-C,
    /// Ctrl-\ or its hang-up, and checks the stop as [`Started::stop_with`] does.
    async fn stop_as_terminal(self, signal: &str, why: &str) {
        let pid = self.launcher.0.id().expect("launcher pid");
        switchyard_e2e::signal_group(pid, signal);
        self.stop_with_said(why, &format!("{why}: stopped everything"))
            .await;
    }

    /// After a stop signal (`why`): checks that the launcher exits 0 within 20 s with every
    /// process it started gone, having said `said` and `{why}: stopped everything`.
    async fn stop_with_said(mut self, why: &str, said: &str) {
        let status = tokio::time::timeout(Duration::from_secs(20), self.launcher.0.wait())
            .await
            .expect("the launcher exits within 20 s of the signal")
            .expect("wait for the launcher");
        assert!(status.success(), "launcher exit status {status}");
        self.collector.abort();
        let left: Vec<&(u32, String)> = self.listed.iter().filter(|(pid, _)| alive(*pid)).collect();
        assert!(
            left.is_empty(),
            "processes left running after the launcher stopped: {left:?}"
        );
        let mut rest = Vec::new();
        let read = async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                rest.push(line);
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
        for line in [said.to_string(), format!("{why}: stopped everything")] {
            assert!(
                rest.iter().any(|l| l.contains(&line)),
                "{line:?} in {rest:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchyard_local_serves_and_stops_everything_on_sigterm() {
    let started = start_launcher().await;
    let response = post_observed(
        &client(),
        &format!("{}/v1/chat/completions", started.gateway),
        &chat_body("Hello!", 8, true),
        &[],
        Duration::from_secs(60),
    )
    .await
    .expect("request through the launched stack");
    assert_eq!(response.status, 200, "{}", response.body());
    assert!(
        !response.header(ROUTE_HEADER).is_empty(),
        "{:?}",
        response.headers
    );

    // The workers die: the launcher names them and why, and keeps the rest running.
    let (workers, _) = started
        .listed
        .iter()
        .find(|(_, name)| name == "sim-workers")
        .expect("the workers are listed");
    let workers = *workers;
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &workers.to_string()])
        .status();
    let said = started.said.clone();
    let named = async {
        loop {
            if said
                .lock()
                .unwrap()
                .contains("sim-workers exited (signal: 9")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), named)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the launcher did not name the dead child: {}",
                said.lock().unwrap()
            )
        });
    assert!(
        !said.lock().unwrap().contains("during start-up"),
        "{}",
        said.lock().unwrap()
    );
    assert!(
        started
            .listed
            .iter()
            .filter(|(pid, _)| *pid != workers)
            .all(|(pid, _)| alive(*pid)),
        "the rest keeps running"
    );
    let mut started = started;
    assert!(
        matches!(started.launcher.0.try_wait(), Ok(None)),
        "the launcher keeps running"
    );
    started.stop_with("-TERM", "SIGTERM").await;
}

/// A closed terminal stops everything too: SIGHUP reaches the launcher's whole process
/// group, as the terminal sends it. nats-server takes SIGHUP for "reload": before the
/// launcher watched it, nats-server outlived it, holding its port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchyard_local_stops_everything_when_its_terminal_closes() {
    start_launcher()
        .await
        .stop_as_terminal("-HUP", "SIGHUP")
        .await;
}

/// Ctrl-\ (SIGQUIT to the whole group) stops everything at once. The stack's processes are
/// in groups of their own, so it reaches the launcher alone: unhandled, it ended the
/// launcher and left nats-server, the control plane and the workers running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchyard_local_stops_everything_on_ctrl_backslash() {
    start_launcher()
        .await
        .stop_as_terminal("-QUIT", "SIGQUIT")
        .await;
}

/// A Ctrl-C typed in the terminal (SIGINT to the launcher's whole process group) lets the
/// stream in flight finish, and the gateway takes no new connection meanwhile. Before the
/// drain, Envoy was stopped first and cut every stream; and with the stack's processes in
/// the terminal's group, Envoy took the Ctrl-C itself and quit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ctrl_c_in_the_terminal_lets_the_streams_in_flight_finish() {
    const TOKENS: u32 = 300;
    let started = start_launcher().await;
    let url = format!("{}/v1/chat/completions", started.gateway);
    let models = format!("{}/v1/models", started.gateway);
    // A client with a pooled connection, as a load generator keeps one.
    let pooled = client();
    let first = pooled.get(&models).send().await.expect("models answered");
    assert_eq!(first.status(), 200);
    let _ = first.bytes().await;
    let mut stream = client()
        .post(&url)
        .json(&chat_body("Hello!", TOKENS, true))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("stream through the launched stack");
    assert_eq!(stream.status(), 200);
    let mut body = String::from_utf8_lossy(
        &stream
            .chunk()
            .await
            .expect("first chunk")
            .expect("the stream has a first chunk"),
    )
    .to_string();

    let pid = started.launcher.0.id().expect("launcher pid");
    switchyard_e2e::signal_group(pid, "-INT");
    // The stream runs on to its end: the workers finish it before anything stops.
    let rest = tokio::spawn(async move {
        while let Some(chunk) = stream.chunk().await.expect("the stream is not cut") {
            body.push_str(&String::from_utf8_lossy(&chunk));
        }
        body
    });
    // Meanwhile the gateway takes no new connection.
    let mut refused = None;
    for _ in 0..50 {
        // Refused, or reset if it raced the listener's close: either way not served.
        if let Err(e) = client().get(&models).send().await {
            refused = Some(e);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        refused.is_some(),
        "a new connection was still served 5 s after Ctrl-C"
    );
    // Nor does an open connection keep bringing requests: its next answer closes it (it
    // was served on for as long as the client kept sending).
    let mut closed = false;
    for _ in 0..50 {
        match pooled.get(&models).send().await {
            Err(_) => closed = true,
            Ok(answer) => {
                closed = answer
                    .headers()
                    .get("connection")
                    .is_some_and(|value| value == "close");
                let _ = answer.bytes().await;
            }
        }
        if closed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Closed while the stream still ran: by the drain, not by the stop after it.
    assert!(
        closed && !rest.is_finished(),
        "a pooled connection was kept open after Ctrl-C until the stream ended (or the \
         stream was too short: lengthen it)"
    );
    let body = tokio::time::timeout(Duration::from_secs(30), rest)
        .await
        .expect("the stream ends within 30 s")
        .expect("the stream's reader");
    let data = sse_data(&body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    // One content chunk per token, then a final chunk with the usage, then [DONE].
    let tokens = data.iter().filter(|d| d.contains("\"content\"")).count();
    assert!(
        tokens >= TOKENS as usize - 1,
        "{tokens} tokens of {TOKENS}: {body}"
    );
    started
        .stop_with_said("Ctrl-C", "every request in flight ended")
        .await;
}

/// Settings that cannot make a stack exit 64, as every Switchyard binary's bad flags do,
/// without a backtrace, and start nothing: an unknown flag, no worker that decodes, a route timeout or
/// another filter setting the filter refuses, a policy the control plane refuses.
#[test]
fn switchyard_local_refuses_unusable_settings_with_exit_64() {
    let binary = target_dir(&|k| std::env::var(k).ok()).join("debug/switchyard-local");
    assert!(
        binary.exists(),
        "{} missing; run first:\n  {BUILD_COMMAND}",
        binary.display()
    );
    for (args, said) in [
        (&["--bogus"][..], "--bogus"),
        (&["--decode", "0"], "decode or agg worker"),
        (&["--route-timeout-ms", "0"], "--route-timeout-ms"),
        (&["--control-planes", "9"], "--control-planes"),
        (
            &["--filter-setting", "route_timeout_ms=5"],
            "--route-timeout-ms",
        ),
        // The filter's own checks, before anything starts (Envoy refused these once NATS,
        // the control plane and the workers were up, and the launcher exited 1).
        (
            &["--filter-setting", "prefil_retries=2"],
            "unknown field `prefil_retries`",
        ),
        (
            &["--filter-setting", "prefill_retries=9"],
            "prefill_retries",
        ),
        (
            &["--conditional-disagg-config", r#"{"policy":"nope"}"#],
            "--conditional-disagg-config",
        ),
        // Workers' ports counted past the last port, or onto a port given to another part.
        (
            &["--decode", "2", "--worker-ports-from", "65535"],
            "2 workers from port 65535 run past port 65535",
        ),
        (
            &[
                "--port",
                "41999",
                "--worker-ports-from",
                "41998",
                "--decode",
                "2",
            ],
            "the listen and worker decode-1 ports are both 41999",
        ),
        (
            &[
                "--control-plane-admin-port",
                "41999",
                "--nats-port",
                "41999",
            ],
            "the control plane admin and nats ports are both 41999",
        ),
    ] {
        let started = tokio::time::Instant::now();
        let output = std::process::Command::new(&binary)
            .args(args)
            // A user's RUST_BACKTRACE=1 must not turn a usage error into a backtrace.
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("switchyard-local runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("backtrace") && !stderr.contains("Caused by"),
            "{args:?}: {stderr}"
        );
        // Nothing was started: starting NATS alone takes longer.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}
