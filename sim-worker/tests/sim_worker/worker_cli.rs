//! The `switchyard-sim-worker` binary: flag errors exit 64, and a worker started while NATS is
//! down serves HTTP at once and joins NATS when the server comes up, and SIGTERM drains.

use crate::worker_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use futures::StreamExt;
use switchyard_protocol::subjects;
use switchyard_protocol::worker::{Engine, WorkerHeartbeat, WorkerRole};
use worker_support::{free_port, NatsServer};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard-sim-worker");

fn exit_code(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("SWITCHYARD_NATS_URL")
        .output()
        .expect("binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_exit_64_with_a_clear_message() {
    let cases: [(&[&str], &str); 16] = [
        (&[], "--worker"),
        (
            &["--worker", "agg:w@127.0.0.1:0", "--kv-link-efficiency", "5"],
            "at most 1",
        ),
        (&["--worker", "agg:w@localhost:1"], "IP address"),
        (
            &[
                "--worker",
                "agg:w@127.0.0.1:0",
                "--nats-url",
                "nats://127.0.0.1:4222,nats://127.0.0.1:notaport",
            ],
            "notaport",
        ),
        (
            &[
                "--worker",
                "agg:w@127.0.0.1:0",
                "--registration-secret-file",
                "/nonexistent/secret",
            ],
            "/nonexistent/secret",
        ),
        (&["--worker", "agg-0@127.0.0.1:1"], "ROLE:ID@HOST:PORT"),
        (&["--worker", "boss:w@127.0.0.1:1"], "unknown worker role"),
        (&["--worker", "agg:a.b@127.0.0.1:1"], "NATS"),
        (&["--worker", "agg:w@127.0.0.1:x"], "port"),
        (
            &["--worker", "agg:w@127.0.0.1:0", "--speed-up", "0"],
            "speed-up",
        ),
        // Positive but no usable wait: the engine task used to panic at the first request.
        (
            &["--worker", "agg:w@127.0.0.1:0", "--speed-up", "1e-300"],
            "speed-up",
        ),
        (
            &["--worker", "agg:w@127.0.0.1:0", "--kv-setup-ms=-1"],
            "setup_ms",
        ),
        (
            &[
                "--worker",
                "agg:w@127.0.0.1:0",
                "--worker",
                "decode:w@127.0.0.1:0",
            ],
            "twice",
        ),
        (
            &["--worker", "agg:w@127.0.0.1:0", "--engine", "tensorrt"],
            "expected vllm, trtllm or sglang",
        ),
        (
            &[
                "--worker",
                "agg:w@127.0.0.1:0",
                "--worker",
                "decode:v@127.0.0.1:0",
                "--worker",
                "prefill:p@127.0.0.1:0",
                "--engine",
                "trtllm,sglang",
            ],
            "one per --worker (3 workers, 2 engines)",
        ),
        (
            &[
                "--worker",
                "agg:w@127.0.0.1:0",
                "--engine",
                "sglang",
                "--wire",
                "vllm",
                "--kv-events-endpoint",
                "tcp://127.0.0.1:0",
            ],
            "--wire switchyard",
        ),
    ];
    for (args, needle) in cases {
        let (code, stderr) = exit_code(args);
        assert_eq!(code, 64, "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr}"
        );
    }
    let (code, stderr) = exit_code(&["--worker", "agg:w@127.0.0.1:0", "--perf-preset", "tpu"]);
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("gb200-fp8-tep4"), "{stderr}");
    let (code, _) = exit_code(&["--help"]);
    assert_eq!(code, 0);
}

/// The worker process, killed by PID on drop.
struct WorkerProcess(Child);

impl WorkerProcess {
    /// Starts the binary with `args`, its output discarded.
    fn spawn(args: &[&str]) -> WorkerProcess {
        let child = Command::new(BIN)
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("binary starts");
        WorkerProcess(child)
    }

    /// Sends it SIGTERM (by PID).
    fn terminate(&self) {
        let pid = self.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
    }

    /// Starts the binary with `args`; its log lines (stdout) arrive on the receiver.
    fn spawn_logged(args: &[&str]) -> (WorkerProcess, mpsc::Receiver<String>) {
        let mut child = Command::new(BIN)
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("SWITCHYARD_NATS_URL")
            .env_remove("SWITCHYARD_REGISTRATION_SECRET_FILE")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("binary starts");
        let stdout = child.stdout.take().unwrap();
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        (WorkerProcess(child), lines)
    }
}

/// Whether a line containing `want` arrives within 10 s.
fn logs(lines: &mpsc::Receiver<String>, want: &str) -> bool {
    (0..200).any(|_| {
        lines
            .recv_timeout(Duration::from_millis(50))
            .is_ok_and(|l| l.contains(want))
    })
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_worker_registers_at_start_not_one_interval_later() {
    let server = NatsServer::start_on(free_port());
    let observer = async_nats::connect(&server.url).await.unwrap();
    let mut heartbeats = observer.subscribe(subjects::HEARTBEAT_ALL).await.unwrap();
    observer.flush().await.unwrap();
    let http_port = free_port();
    let started = tokio::time::Instant::now();
    let _guard = WorkerProcess::spawn(&[
        "--nats-url",
        &server.url,
        "--worker",
        &format!("decode:early-0@127.0.0.1:{http_port}"),
        "--heartbeat-interval-ms",
        "10000",
    ]);
    let msg = tokio::time::timeout(Duration::from_secs(15), heartbeats.next())
        .await
        .expect("a heartbeat")
        .unwrap();
    let hb: WorkerHeartbeat = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(hb.worker.worker_id.0, "early-0");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the first heartbeat came {:?} after start, with a 10 s interval",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_worker_started_before_nats_serves_http_and_joins_nats_later() {
    let nats_port = free_port();
    let http_port = free_port();
    let prefill_port = free_port();
    let (mut guard, lines) = WorkerProcess::spawn_logged(&[
        "--nats-url",
        &format!("nats://127.0.0.1:{nats_port}"),
        "--worker",
        &format!("agg:cli-0@127.0.0.1:{http_port}"),
        // A second worker, speaking SGLang's handoff (one --engine per --worker).
        "--worker",
        &format!("prefill:cli-p@127.0.0.1:{prefill_port}"),
        "--engine",
        "vllm,sglang",
        "--heartbeat-interval-ms",
        "100",
        "--speed-up",
        "10",
    ]);
    let want = format!("worker cli-0 (agg) listening on 127.0.0.1:{http_port}");
    let logged = logs(&lines, &want);
    assert!(logged, "no {want:?} log line");

    // HTTP works with NATS down.
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("http://127.0.0.1:{http_port}/v1/completions"))
        .json(&serde_json::json!({"prompt": "hello", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-switchyard-worker"], "cli-0");

    // NATS comes up: the worker's heartbeats arrive.
    let server = NatsServer::start_on(nats_port);
    let observer = async_nats::connect(&server.url).await.unwrap();
    let mut heartbeats = observer.subscribe(subjects::HEARTBEAT_ALL).await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(15), heartbeats.next())
        .await
        .expect("a heartbeat after NATS came up")
        .unwrap();
    let mut seen = std::collections::BTreeMap::new();
    let mut msg = Some(msg);
    while seen.len() < 2 {
        let next = match msg.take() {
            Some(m) => m,
            None => tokio::time::timeout(Duration::from_secs(15), heartbeats.next())
                .await
                .expect("both workers' heartbeats")
                .unwrap(),
        };
        let hb: WorkerHeartbeat = serde_json::from_slice(&next.payload).unwrap();
        seen.insert(hb.worker.worker_id.0.clone(), hb.worker);
    }
    let agg = &seen["cli-0"];
    assert_eq!(agg.role, WorkerRole::Agg);
    assert_eq!(agg.address, format!("127.0.0.1:{http_port}"));
    assert_eq!(agg.model, "Qwen/Qwen3-235B-A22B");
    assert_eq!((agg.engine, agg.bootstrap_port), (Engine::Vllm, None));
    // A simulated SGLang prefill worker serves its bootstrap rooms on its HTTP port.
    let prefill = &seen["cli-p"];
    assert_eq!(
        (prefill.engine, prefill.bootstrap_port),
        (Engine::Sglang, Some(prefill_port))
    );

    // SIGTERM (sent to its PID) stops it cleanly.
    guard.terminate();
    let mut status = None;
    for _ in 0..100 {
        if let Some(s) = guard.0.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        status.expect("exited within 5 s of SIGTERM").code(),
        Some(0)
    );
}

/// A worker that a control plane or NATS would refuse says so itself, once: a worker whose
/// heartbeats go nowhere otherwise looks alive (it serves HTTP). The worker starts before
/// its NATS server, as the docs allow: the refusal is said even after the outage was.
#[test]
fn a_worker_says_when_nats_refuses_it_and_when_its_heartbeats_are_unsigned() {
    let nats_port = free_port();
    let (_guard, lines) = WorkerProcess::spawn_logged(&[
        "--nats-url",
        &format!("nats://127.0.0.1:{nats_port}"),
        "--worker",
        &format!("decode:refused-0@127.0.0.1:{}", free_port()),
    ]);
    let mut seen = Vec::new();
    // NATS unreachable first (said once), then up and refusing the worker's credentials.
    for _ in 0..300 {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(50)) {
            let unreachable = line.contains("NATS unreachable");
            seen.push(line);
            if unreachable {
                break;
            }
        }
    }
    assert!(
        seen.iter().any(|l| l.contains("NATS unreachable")),
        "{seen:#?}"
    );
    let _server = NatsServer::start_on_with_token(nats_port, "a-token-of-sixteen-chars");
    let told = |seen: &[String], want: &str| seen.iter().any(|l| l.contains(want));
    // At most 15 s.
    for _ in 0..300 {
        if told(&seen, "--nats-token-file") && told(&seen, "heartbeats are unsigned") {
            break;
        }
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(50)) {
            seen.push(line);
        }
    }
    assert!(
        told(&seen, "NATS refused this client's credentials") && told(&seen, "--nats-token-file"),
        "no hint about NATS credentials in: {seen:#?}"
    );
    assert!(
        told(&seen, "--registration-secret-file"),
        "no warning about unsigned heartbeats in: {seen:#?}"
    );
    // Said once per outage, not at every retry (about one a second).
    std::thread::sleep(Duration::from_millis(2500));
    seen.extend(lines.try_iter());
    let hints = seen
        .iter()
        .filter(|l| l.contains("refused this client"))
        .count();
    assert_eq!(hints, 1, "{seen:#?}");
}

#[test]
fn vllm_wire_flags_are_checked() {
    let w = ["--worker", "agg:w@127.0.0.1:0"];
    let cases: [(&[&str], &str); 5] = [
        (&["--wire", "vllm"], "one --kv-events-endpoint per --worker"),
        (
            &["--kv-events-endpoint", "tcp://127.0.0.1:0"],
            "need --wire vllm",
        ),
        (
            &["--wire", "vllm", "--kv-events-endpoint", "ipc:///tmp/kv"],
            "tcp://HOST:PORT",
        ),
        (
            &[
                "--wire",
                "vllm",
                "--kv-events-endpoint",
                "tcp://127.0.0.1:0",
                "--kv-replay-endpoint",
                "tcp://127.0.0.1:0,tcp://127.0.0.1:0",
            ],
            "none or one per --worker",
        ),
        (&["--wire", "zmq"], "switchyard"),
    ];
    for (extra, needle) in cases {
        let args: Vec<&str> = w.iter().chain(extra).copied().collect();
        let (code, stderr) = exit_code(&args);
        assert_eq!(code, 64, "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in {stderr}"
        );
    }
}

#[tokio::test]
async fn a_vllm_wire_worker_logs_its_bound_zmq_endpoints_and_serves() {
    let http_port = free_port();
    let (_guard, lines) = WorkerProcess::spawn_logged(&[
        "--wire",
        "vllm",
        "--worker",
        &format!("agg:cli-vllm@127.0.0.1:{http_port}"),
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
        "--kv-replay-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let want = "worker cli-vllm publishes vLLM KV events on tcp://127.0.0.1:";
    let line = (0..200)
        .find_map(|_| {
            lines
                .recv_timeout(Duration::from_millis(50))
                .ok()
                .filter(|l| l.contains(want))
        })
        .unwrap_or_else(|| panic!("no {want:?} log line"));
    // Both sockets got real ports (not the 0 asked for).
    assert!(
        !line.contains(":0, replay") && !line.trim_end().ends_with(":0"),
        "{line}"
    );
    assert!(line.contains("replay on tcp://127.0.0.1:"), "{line}");
    let health = reqwest::get(format!("http://127.0.0.1:{http_port}/health"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn sigterm_drains_the_streams_in_flight_and_takes_nothing_new() {
    let server = NatsServer::start_on(free_port());
    let observer = async_nats::connect(&server.url).await.unwrap();
    let mut heartbeats = observer.subscribe(subjects::HEARTBEAT_ALL).await.unwrap();
    observer.flush().await.unwrap();
    let http_port = free_port();
    let mut guard = WorkerProcess::spawn(&[
        "--nats-url",
        &server.url,
        "--worker",
        &format!("agg:drain-0@127.0.0.1:{http_port}"),
        "--heartbeat-interval-ms",
        "100",
    ]);
    tokio::time::timeout(Duration::from_secs(15), heartbeats.next())
        .await
        .expect("registered");
    // A stream of 120 tokens: about 2 s of simulated decode.
    let url = format!("http://127.0.0.1:{http_port}/v1/completions");
    let response = reqwest::Client::new()
        .post(&url)
        .json(&serde_json::json!({"prompt": "drain me", "max_tokens": 120, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));

    guard.terminate();
    // New connections are refused at once, and heartbeats stop.
    let mut refused = false;
    for _ in 0..40 {
        if std::net::TcpStream::connect(("127.0.0.1", http_port)).is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(refused, "still accepting connections 1 s after SIGTERM");
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(50), heartbeats.next()).await
    {
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(500), heartbeats.next())
            .await
            .is_err(),
        "heartbeats go on while draining"
    );
    // The stream in flight runs to its end.
    let mut body = first.to_vec();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("the stream goes on")
    {
        body.extend_from_slice(&chunk.expect("no cut"));
    }
    let text = String::from_utf8(body).unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let tokens = text
        .lines()
        .filter(|l| l.starts_with("data: {") && l.contains("\"text\""))
        .count();
    assert!(tokens >= 120, "{tokens} token chunks");
    let mut status = None;
    for _ in 0..100 {
        if let Some(s) = guard.0.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status.expect("exited once drained").code(), Some(0));
}

/// A stream the drain limit cuts ends in a cut connection, not a clean end of body: a client
/// must not take a truncated answer for a whole one (OpenAI clients do not require
/// `[DONE]`). Before, the body ended cleanly after the last token sent.
#[tokio::test]
async fn a_stream_cut_at_the_drain_limit_reads_as_cut() {
    let http_port = free_port();
    let guard = WorkerProcess::spawn(&[
        "--no-nats",
        "--worker",
        &format!("agg:cut-0@127.0.0.1:{http_port}"),
        "--drain-timeout-ms",
        "300",
    ]);
    let url = format!("http://127.0.0.1:{http_port}/v1/completions");
    let client = reqwest::Client::new();
    let mut response = None;
    for _ in 0..200 {
        let sent = client
            .post(&url)
            .json(&serde_json::json!({"prompt": "cut me", "max_tokens": 2000, "stream": true}))
            .send()
            .await;
        if let Ok(r) = sent {
            response = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let response = response.expect("the worker answers within 10 s");
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    guard.terminate();
    // 2,000 tokens take far longer than the 300 ms limit.
    let mut body = first.to_vec();
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("the stream ends within 20 s")
        {
            Some(Ok(chunk)) => body.extend_from_slice(&chunk),
            Some(Err(e)) => break Err(e),
            None => break Ok(()),
        }
    };
    let text = String::from_utf8_lossy(&body);
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(ended.is_err(), "the cut stream ended like a whole one");
}

/// The per-worker NATS permissions docs/control-plane.md gives ("Securing NATS"), on a real
/// nats-server: the worker registers, reports its load and answers a resync under them, and
/// its credentials cannot write the shared router config or another worker's KV events.
#[tokio::test]
async fn the_documented_nats_permissions_let_a_worker_work_and_nothing_more() {
    use switchyard_protocol::kv::{KvEventBatch, ResyncRequest};
    use switchyard_protocol::worker::WorkerId;

    let doc = include_str!("../../../docs/control-plane.md");
    let block = doc
        .split("```text\n")
        .find(|b| b.starts_with("authorization {"))
        .and_then(|b| b.split("```").next())
        .expect("the permissions block in docs/control-plane.md");
    let dir = switchyard_support::TempDir::new("nats-permissions").unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        block
            .replace("CONTROL-PLANE-PASSWORD", "control-plane-pass")
            .replace("DECODE-0-PASSWORD", "decode-0-pass"),
    )
    .unwrap();
    let password_file = dir.path().join("decode-0.password");
    std::fs::write(&password_file, "decode-0-pass").unwrap();
    let port = free_port();
    let args: Vec<String> = [
        "-c",
        conf.to_str().unwrap(),
        "-js",
        "-a",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-sd",
        dir.path().join("js").to_str().unwrap(),
    ]
    .map(String::from)
    .into();
    let mut server = switchyard_support::Process::spawn(
        "nats-server",
        &switchyard_support::nats::default_program(),
        &args,
        Some(&dir.path().join("nats.log")),
    )
    .unwrap();
    server
        .wait_for_listener(([127, 0, 0, 1], port).into(), Duration::from_secs(10))
        .unwrap();
    let url = format!("nats://127.0.0.1:{port}");
    let control_plane = async_nats::ConnectOptions::with_user_and_password(
        "switchyard-control-plane".into(),
        "control-plane-pass".into(),
    )
    .connect(&url)
    .await
    .unwrap();
    let mut heartbeats = control_plane
        .subscribe(subjects::HEARTBEAT_ALL)
        .await
        .unwrap();
    let mut loads = control_plane.subscribe(subjects::LOAD_ALL).await.unwrap();
    let mut shared_loads = control_plane.subscribe(subjects::LOAD).await.unwrap();
    let mut kv_events = control_plane
        .subscribe(subjects::KV_EVENTS_ALL)
        .await
        .unwrap();
    let mut config = control_plane
        .subscribe("$KV.switchyard_config.>")
        .await
        .unwrap();
    control_plane.flush().await.unwrap();

    let http_port = free_port();
    let _worker = WorkerProcess::spawn(&[
        "--nats-url",
        &url,
        "--nats-user",
        "decode-0",
        "--nats-password-file",
        password_file.to_str().unwrap(),
        "--worker",
        &format!("decode:decode-0@127.0.0.1:{http_port}"),
        "--heartbeat-interval-ms",
        "100",
        "--load-interval-ms",
        "100",
    ]);
    let within = |s| Duration::from_secs(s);
    let hb = tokio::time::timeout(within(15), heartbeats.next())
        .await
        .expect("the worker registers under its permissions")
        .unwrap();
    let hb: WorkerHeartbeat = serde_json::from_slice(&hb.payload).unwrap();
    assert_eq!(hb.worker.worker_id.0, "decode-0");
    tokio::time::timeout(within(5), loads.next())
        .await
        .expect("its load reports arrive");
    // It hears its resync request and answers with its KV dump.
    let resync = ResyncRequest {
        v: 1,
        worker_id: WorkerId("decode-0".into()),
        reason: "permissions test".into(),
    };
    let subject = subjects::kv_resync(&resync.worker_id);
    let mut dump = None;
    for _ in 0..20 {
        control_plane
            .publish(subject.clone(), serde_json::to_vec(&resync).unwrap().into())
            .await
            .unwrap();
        if let Ok(Some(msg)) =
            tokio::time::timeout(Duration::from_millis(250), kv_events.next()).await
        {
            dump = Some(msg);
            break;
        }
    }
    let dump: KvEventBatch = serde_json::from_slice(&dump.expect("a KV dump").payload).unwrap();
    assert!(dump.resync, "{dump:?}");

    // Its credentials publish on its own subjects only.
    let as_worker = async_nats::ConnectOptions::with_user_and_password(
        "decode-0".into(),
        "decode-0-pass".into(),
    )
    .connect(&url)
    .await
    .unwrap();
    let forged = br#"{"serving_mode":"disagg","eff_isl_threshold":1}"#.to_vec();
    as_worker
        .publish("$KV.switchyard_config.router", forged.into())
        .await
        .unwrap();
    for other in [
        "switchyard.kv.events.decode-1",
        "switchyard.workers.load.decode-1",
        subjects::LOAD,
    ] {
        as_worker
            .publish(other, b"{}".to_vec().into())
            .await
            .unwrap();
    }
    as_worker.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), config.next())
            .await
            .is_err(),
        "a worker's credentials wrote the shared config"
    );
    // Read what arrives for half a second (its own load reports go on every 100 ms).
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Some(msg)) = tokio::time::timeout_at(until, kv_events.next()).await {
        assert_eq!(
            msg.subject.as_str(),
            "switchyard.kv.events.decode-0",
            "another worker's events forged"
        );
    }
    while let Ok(Some(msg)) = tokio::time::timeout_at(until, loads.next()).await {
        assert_eq!(
            msg.subject.as_str(),
            "switchyard.workers.load.decode-0",
            "another worker's load forged"
        );
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(100), shared_loads.next())
            .await
            .is_err(),
        "a load report on the shared subject, which speaks for any worker"
    );
    server.stop(Duration::from_secs(2));
}
