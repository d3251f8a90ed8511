//! Real vLLM engines (the CPU build and the tiny local model `scripts/setup-vllm.sh`
//! installs) for the end-to-end tests, each in its own process group on 127.0.0.1.
//!
//! vLLM forks an engine-core and a worker process; stopping only the API server's PID could
//! leave them behind holding a core, so each engine is started as a process-group leader and
//! the whole group is signalled (`kill -- -PGID`), SIGTERM first, SIGKILL after a grace.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// How long an engine may take to answer `/health` (about 90 s alone on 2 cores; more while
/// a second one starts).
pub const START_TIMEOUT: Duration = Duration::from_secs(300);
/// KV block size: the CPU attention backend takes multiples of 32 only.
pub const BLOCK_SIZE: u32 = 32;
/// The context length served (the tiny model's own is larger; this keeps the cache small).
pub const MAX_MODEL_LEN: u32 = 4096;
/// The model name the engines serve under.
pub const MODEL_NAME: &str = "tiny-qwen3";

/// Where vLLM and the tiny model are, from `.cache/vllm-env.sh` (or its defaults).
#[derive(Debug, Clone)]
pub struct VllmInstall {
    /// The virtualenv's Python.
    pub python: PathBuf,
    /// The tiny model's directory.
    pub model_dir: PathBuf,
}

impl VllmInstall {
    /// Finds the install; panics with the command that makes it when it is missing.
    pub fn locate() -> VllmInstall {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let python = std::env::var_os("SWITCHYARD_VLLM_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".venv-vllm/bin/python"));
        let model_dir = std::env::var_os("SWITCHYARD_VLLM_MODEL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".cache/models/tiny-qwen3"));
        for (what, path) in [("vLLM's Python", &python), ("the tiny model", &model_dir)] {
            assert!(
                path.exists(),
                "{what} is not at {}: run ./scripts/setup-vllm.sh first",
                path.display()
            );
        }
        VllmInstall { python, model_dir }
    }
}

/// How one engine is started.
#[derive(Debug, Clone)]
pub struct EngineSpec {
    /// A name for logs (`prefill`, `decode`).
    pub name: String,
    /// HTTP port of its OpenAI API.
    pub port: u16,
    /// The port its KV-event publisher connects to (the control plane binds it).
    pub kv_events_port: u16,
    /// The port its replay socket binds.
    pub kv_replay_port: u16,
    /// NixlConnector role (`kv_producer`, `kv_consumer`), or `None` for no connector.
    pub kv_role: Option<&'static str>,
    /// NIXL side-channel port.
    pub nixl_port: u16,
    /// The CPU core its threads are pinned to.
    pub core: u32,
    /// KV cache size in blocks.
    pub num_blocks: u32,
}

/// A running engine; dropping it stops its process group.
#[derive(Debug)]
pub struct VllmEngine {
    spec: EngineSpec,
    child: Option<Child>,
    log: PathBuf,
}

impl VllmEngine {
    /// Starts `spec` with its scratch files and log under `dir`.
    ///
    /// # Panics
    /// If the process cannot be started.
    pub fn start(install: &VllmInstall, spec: EngineSpec, dir: &Path) -> VllmEngine {
        let scratch = dir.join(&spec.name);
        std::fs::create_dir_all(&scratch).expect("scratch dir");
        let log = dir.join(format!("vllm-{}.log", spec.name));
        let out = File::create(&log).expect("vLLM log");
        let err = out.try_clone().expect("vLLM log handle");
        let kv_events = serde_json::json!({
            "enable_kv_cache_events": true,
            "publisher": "zmq",
            "endpoint": format!("tcp://127.0.0.1:{}", spec.kv_events_port),
            "replay_endpoint": format!("tcp://127.0.0.1:{}", spec.kv_replay_port),
            "topic": "kv-events",
        });
        let mut args: Vec<String> = [
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            &install.model_dir.to_string_lossy(),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            &spec.port.to_string(),
            "--max-model-len",
            &MAX_MODEL_LEN.to_string(),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--block-size",
            &BLOCK_SIZE.to_string(),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--seed",
            "0",
            "--num-gpu-blocks-override",
            &spec.num_blocks.to_string(),
            "--kv-events-config",
            &kv_events.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(role) = spec.kv_role {
            let transfer = serde_json::json!({
                "kv_connector": "NixlConnector",
                "kv_role": role,
                "kv_buffer_device": "cpu",
                "kv_connector_extra_config": {"kv_lease_duration": 120},
            });
            args.extend(["--kv-transfer-config".into(), transfer.to_string()]);
        }
        let child = Command::new(&install.python)
            .args(&args)
            .env("TMPDIR", &scratch)
            .env("VLLM_RPC_BASE_PATH", &scratch)
            .env("VLLM_CACHE_ROOT", scratch.join("cache"))
            .env("HF_HOME", scratch.join("hf"))
            .env("HF_HUB_OFFLINE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            // vLLM ranks logprobs with a torch.compile'd function; on CPU the first request
            // asking for them builds it with g++ inside the engine step (about a minute, in
            // every fresh TMPDIR, past the client's timeout on a loaded machine): docs/vllm.md.
            .env("TORCH_COMPILE_DISABLE", "1")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_CPU_OMP_THREADS_BIND", spec.core.to_string())
            .env("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
            .env("VLLM_NIXL_SIDE_CHANNEL_PORT", spec.nixl_port.to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .expect("vLLM starts");
        VllmEngine {
            spec,
            child: Some(child),
            log,
        }
    }

    /// `127.0.0.1:PORT` of its OpenAI API.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.spec.port)
    }

    /// How it was started.
    pub fn spec(&self) -> &EngineSpec {
        &self.spec
    }

    /// The end of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(3_000);
        text.get(start..).unwrap_or_default().to_string()
    }

    /// Waits until `/health` answers 200.
    ///
    /// # Panics
    /// If the engine exits or [`START_TIMEOUT`] passes first, with its log's end.
    pub async fn wait_healthy(&mut self, http: &reqwest::Client) {
        let url = format!("http://{}/health", self.address());
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "vLLM {} did not become healthy ({exited:?}); log:\n{}",
                self.spec.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Stops the whole process group: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let leader = child.id();
        crate::signal_group(leader, "-TERM");
        // Polled in steps rather than timed: a bounded number of checks covers the grace.
        let step = Duration::from_millis(100);
        for _ in 0..(grace.as_millis() / step.as_millis()).max(1) {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(step);
        }
        // The group's other members (engine core, workers) may outlive the leader.
        crate::signal_group(leader, "-KILL");
        let _ = child.wait();
    }
}

impl Drop for VllmEngine {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}
