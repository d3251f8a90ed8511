//! Launching the stack's processes in order, and controlling them once running.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use switchyard_protocol::worker::WorkerRole;

use crate::envoy::{self, EnvoySettings, DECODE_CLUSTER, PREFILL_CLUSTER};
use crate::error::StackError;
use crate::paths::Artifacts;
use crate::process::{process_state, Signal, Supervised};
use crate::readiness::{http_ok, tcp_open, wait_until, POLL_INTERVAL};
use crate::stack::{http_client, Component, StackBuilder, WorkerSpec, MAX_CONTROL_PLANES};

/// Largest body Envoy buffers per connection: long agentic prompts run to megabytes of JSON.
pub const BUFFER_LIMIT_BYTES: u64 = 16 << 20;

/// The largest request body the gateway takes: a `max_body_bytes` filter setting if given
/// (Envoy's buffers and the control plane's route-body limit follow it), else
/// [`BUFFER_LIMIT_BYTES`].
fn body_limit_bytes(filter_overrides: &serde_json::Map<String, serde_json::Value>) -> u64 {
    filter_overrides
        .get("max_body_bytes")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(BUFFER_LIMIT_BYTES)
}

/// How often Envoy polls EDS in a local stack: fast, so new workers are usable at once.
pub const EDS_REFRESH: Duration = Duration::from_millis(500);
/// How long a stop waits for one answer of Envoy's admin interface (on loopback it answers
/// in milliseconds; one that does not is hung or gone).
pub const ENVOY_ADMIN_TIMEOUT: Duration = Duration::from_secs(1);
/// Grace each process gets on SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// How long the simulated workers drain their streams when the stack stops them: inside
/// [`STOP_GRACE`] (and `DROP_GRACE`, the same).
const WORKER_DRAIN: Duration = Duration::from_secs(2);

/// The running stack. Dropping it stops every process (Envoy first, nats-server last).
#[derive(Debug)]
pub struct Stack {
    pub(crate) processes: Vec<(Component, Supervised)>,
    pub(crate) run_dir: PathBuf,
    pub(crate) workers: Vec<WorkerSpec>,
    pub(crate) nats_port: u16,
    pub(crate) control_plane_port: u16,
    /// The control plane's admin API (`--admin-listen`).
    pub(crate) control_plane_admin_port: u16,
    pub(crate) listen_port: u16,
    pub(crate) admin_port: u16,
    /// The filter-less baseline listener, if asked for.
    pub(crate) plain_listen_port: Option<u16>,
    pub(crate) client: reqwest::Client,
    /// Remove `run_dir` on a drop that is not part of a panic.
    pub(crate) remove_run_dir: bool,
    /// The nats-server binary (for [`Stack::restart_nats`]).
    pub(crate) nats_program: PathBuf,
    /// This run's NATS token and registration secret (see [`Stack::launch`]).
    pub(crate) nats_token: String,
    /// This run's admin token for the control plane's admin API.
    pub(crate) control_plane_admin_token: String,
    /// Workers of the pool file: not started by the stack, but waited for in EDS.
    pub(crate) declared: Vec<WorkerSpec>,
    /// Further control-plane replicas' route and admin ports.
    pub(crate) replica_ports: Vec<(u16, u16)>,
    /// How each control-plane replica was started (for [`Stack::restart_control_plane`]);
    /// the first is [`Component::ControlPlane`].
    pub(crate) control_plane_commands: Vec<(PathBuf, Vec<String>)>,
    /// Held while the stack lives: a second stack in the same run directory would overwrite
    /// this one's secrets, `pids` file and logs, and remove its NATS state.
    pub(crate) _run_dir_lock: std::fs::File,
}

/// File in the run directory holding this run's NATS token.
pub const NATS_TOKEN_FILE: &str = "nats-token";
/// File in the run directory holding this run's registration secret.
pub const REGISTRATION_SECRET_FILE: &str = "registration-secret";
/// Folder of the run directory where nats-server keeps its JetStream state.
pub(crate) const NATS_STORE_DIR: &str = "nats-store";

/// File in the run directory holding this run's admin token for the control plane.
pub const ADMIN_TOKEN_FILE: &str = "control-plane-admin-token";

impl StackBuilder {
    /// Starts every process and waits until requests through Envoy can reach every worker.
    ///
    /// # Errors
    /// A [`StackError`] naming the process or artifact at fault; everything already started
    /// is stopped before this returns.
    pub async fn start(self) -> Result<Stack, StackError> {
        self.check_settings()?;
        let worker_count = self.decode + self.prefill + self.agg;
        let declared = self
            .pool_file
            .as_ref()
            .map(|(_, workers)| workers.clone())
            .unwrap_or_default();
        if self.decode + self.agg == 0 && !declared.iter().any(|w| w.role.serves_decode()) {
            return Err(StackError::InvalidSetting(
                "need at least one decode or agg worker".into(),
            ));
        }
        if !(1..=MAX_CONTROL_PLANES).contains(&self.control_planes) {
            return Err(StackError::InvalidSetting(format!(
                "control planes: {} (1 to {MAX_CONTROL_PLANES})",
                self.control_planes
            )));
        }
        let artifacts = match self.artifacts.clone() {
            Some(a) => a,
            None => Artifacts::locate(self.profile)?,
        };
        let run_dir = match self.run_dir.clone() {
            Some(dir) => dir,
            None => new_run_dir()?,
        };
        std::fs::create_dir_all(&run_dir)
            .map_err(StackError::io(format!("creating {}", run_dir.display())))?;
        let run_dir_lock = lock_run_dir(&run_dir)?;
        refuse_leftovers(&run_dir)?;
        // A reused run directory must not carry the last run's JetStream state: the
        // replicas' shared config kept there would win over this run's settings.
        let _ = std::fs::remove_dir_all(run_dir.join(NATS_STORE_DIR));

        let extra_replicas = self.control_planes - 1;
        // Below the kernel's ephemeral range: Envoy binds its listener seconds after the pick
        // (it compiles the filter first), and a port in that range could meanwhile become the
        // source port of an outgoing connection ("Address already in use").
        let needed = 6 + worker_count + 2 * extra_replicas;
        // A free pick never lands on a port given explicitly (those are free until bound).
        let given: Vec<u16> = self.given_ports()?.iter().map(|(_, port)| *port).collect();
        let ports: Vec<u16> = switchyard_support::free_listen_ports(needed + given.len())
            .into_iter()
            .filter(|port| !given.contains(port))
            .take(needed)
            .collect();
        let nats_port = self.nats_port.unwrap_or(ports[0]);
        let cp_port = self.control_plane_port.unwrap_or(ports[1]);
        let listen_port = self.listen_port.unwrap_or(ports[2]);
        let admin_port = self.admin_port.unwrap_or(ports[3]);
        let plain_listen_port = self
            .plain_listen_port
            .map(|p| if p == 0 { ports[4] } else { p });
        let cp_admin_port = self.control_plane_admin_port.unwrap_or(ports[5]);
        let workers = match self.first_worker_port {
            Some(first) => self.workers(&self.given_worker_ports(first)?),
            None => self.workers(&ports[6..6 + worker_count]),
        };
        let replica_ports = ports[6 + worker_count..]
            .chunks(2)
            .map(|pair| (pair[0], pair[1]))
            .collect();
        let mut stack = Stack {
            processes: Vec::new(),
            run_dir,
            workers,
            nats_port,
            control_plane_port: cp_port,
            control_plane_admin_port: cp_admin_port,
            listen_port,
            admin_port,
            plain_listen_port,
            client: http_client(),
            remove_run_dir: !self.keep_logs,
            nats_program: artifacts.nats_server.clone(),
            nats_token: switchyard_support::random_token(),
            control_plane_admin_token: switchyard_support::random_token(),
            declared,
            replica_ports,
            control_plane_commands: Vec::new(),
            _run_dir_lock: run_dir_lock,
        };
        stack.launch(&self, &artifacts).await?;
        Ok(stack)
    }

    /// Settings a component would refuse, refused before anything starts: Envoy refuses a
    /// filter configuration the filter refuses and the control plane a policy it cannot use,
    /// but only once the stack is half up, with the reason in their logs.
    fn check_settings(&self) -> Result<(), StackError> {
        if let Some(text) = &self.conditional_disagg_config {
            check_conditional_disagg_config(text).map_err(StackError::InvalidSetting)?;
        }
        crate::envoy::check_filter_config(
            self.route_timeout_ms,
            body_limit_bytes(&self.filter_overrides),
            &self.filter_overrides,
        )?;
        self.check_given_ports()
    }

    /// The ports given explicitly are distinct and free now: Envoy binds its own only after
    /// NATS, the control plane and the workers are up, and failed then with the reason deep
    /// in its log.
    fn check_given_ports(&self) -> Result<(), StackError> {
        let given = self.given_ports()?;
        for (i, (name, port)) in given.iter().enumerate() {
            if let Some((other, _)) = given[..i].iter().find(|(_, p)| p == port) {
                return Err(StackError::InvalidSetting(format!(
                    "the {other} and {name} ports are both {port}"
                )));
            }
        }
        for (name, port) in &given {
            if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", *port)) {
                // The commonest holder is an earlier stack: one whose launcher was killed
                // with SIGKILL leaves its processes running.
                let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                    " (in use: by another stack? a stack whose launcher was killed with SIGKILL \
                     leaves its processes running; its run directory's `pids` file lists them)"
                } else {
                    ""
                };
                return Err(StackError::InvalidSetting(format!(
                    "the {name} port {port} cannot be bound on 127.0.0.1: {e}{hint}"
                )));
            }
        }
        Ok(())
    }

    /// Every port given explicitly, named as the errors name it.
    fn given_ports(&self) -> Result<Vec<(String, u16)>, StackError> {
        let fixed = [
            ("listen", self.listen_port),
            ("admin", self.admin_port),
            ("control plane", self.control_plane_port),
            ("control plane admin", self.control_plane_admin_port),
            ("nats", self.nats_port),
            ("plain listen", self.plain_listen_port.filter(|&p| p != 0)),
        ];
        let mut given: Vec<(String, u16)> = fixed
            .into_iter()
            .filter_map(|(name, port)| Some((name.to_string(), port?)))
            .collect();
        if let Some(first) = self.first_worker_port {
            let ports = self.given_worker_ports(first)?;
            for (worker, port) in self.workers(&ports).into_iter().zip(ports) {
                given.push((format!("worker {}", worker.id.0), port));
            }
        }
        Ok(given)
    }

    /// The simulated workers' ports counted up from `first`.
    fn given_worker_ports(&self, first: u16) -> Result<Vec<u16>, StackError> {
        let count = self.decode + self.prefill + self.agg;
        if first == 0 {
            return Err(StackError::InvalidSetting(
                "the first worker port is 0: give a port to count up from".into(),
            ));
        }
        (0..count)
            .map(|i| {
                u16::try_from(i)
                    .ok()
                    .and_then(|i| first.checked_add(i))
                    .ok_or_else(|| {
                        StackError::InvalidSetting(format!(
                            "{count} workers from port {first} run past port 65535"
                        ))
                    })
            })
            .collect()
    }
}

/// Checks a `--conditional-disagg-config` as the control plane checks it: JSON, and every
/// field known and in range.
///
/// # Errors
/// What is wrong, naming the flag and the field.
pub fn check_conditional_disagg_config(text: &str) -> Result<(), String> {
    let json = serde_json::from_str::<serde_json::Value>(text)
        .map_err(|e| format!("--conditional-disagg-config is not JSON: {e}"))?;
    switchyard_router::config::RouterConfig::from_json(&json)
        .map(drop)
        .map_err(|e| format!("--conditional-disagg-config: {e}"))
}

/// The component of control-plane replica `replica`.
fn replica_component(replica: usize) -> Component {
    match replica {
        0 => Component::ControlPlane,
        n => Component::ControlPlaneReplica(u8::try_from(n).unwrap_or(u8::MAX)),
    }
}

fn new_run_dir() -> Result<PathBuf, StackError> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("switchyard-run-{}-{n}", std::process::id()));
        if !dir.exists() {
            return Ok(dir);
        }
    }
    Err(StackError::InvalidSetting(format!(
        "no free run directory name under {}",
        base.display()
    )))
}

/// File in the run directory a running stack holds locked.
const RUN_DIR_LOCK_FILE: &str = "lock";

/// Locks `run_dir` for one stack; the lock goes with the returned file (and with the
/// process, however it ends).
fn lock_run_dir(run_dir: &Path) -> Result<std::fs::File, StackError> {
    let path = run_dir.join(RUN_DIR_LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(StackError::io(format!("opening {}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StackError::InvalidSetting(format!(
            "run directory {} is in use by another running stack: give another --run-dir",
            run_dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(StackError::io(format!("locking {}", path.display()))(e))
        }
    }
}

/// The processes an earlier stack in `run_dir` left running (its parent killed with
/// SIGKILL, which cannot stop them): PIDs its `pids` file lists that still run with the run
/// directory on their command line (so a PID reused since by an unrelated process is not
/// taken for one).
fn leftovers(run_dir: &Path) -> Vec<(u32, String)> {
    let Ok(listed) = std::fs::read_to_string(run_dir.join("pids")) else {
        return Vec::new();
    };
    // With the separator: another run directory whose name starts with this one's is not it.
    let needle = run_dir.join("").display().to_string();
    listed
        .lines()
        .filter_map(|line| {
            let (pid, name) = line.split_once(' ')?;
            let pid: u32 = pid.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let running = process_state(pid).is_some_and(|state| state != 'Z');
            (running && cmdline.contains(&needle)).then(|| (pid, name.to_string()))
        })
        .collect()
}

/// Refuses a run directory an earlier stack's processes still use: a new stack would
/// overwrite the `pids` file that lists them and remove their NATS store from under them,
/// and they would run on, listed nowhere.
fn refuse_leftovers(run_dir: &Path) -> Result<(), StackError> {
    let left = leftovers(run_dir);
    if left.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = left
        .iter()
        .map(|(pid, name)| format!("{pid} ({name})"))
        .collect();
    let pids: Vec<String> = left.iter().map(|(pid, _)| pid.to_string()).collect();
    Err(StackError::InvalidSetting(format!(
        "run directory {} is still used by processes of an earlier stack whose launcher was \
         killed: {}; stop them (`kill {}`) or give another --run-dir",
        run_dir.display(),
        named.join(", "),
        pids.join(" ")
    )))
}

/// Writes a secret readable by this user only.
fn write_secret(path: &Path, secret: &str) -> Result<(), StackError> {
    let io = || StackError::io(format!("writing {}", path.display()));
    std::fs::write(path, format!("{secret}\n")).map_err(io())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io())?;
    }
    Ok(())
}

/// Every supervised process must still run.
fn all_running(processes: &mut [(Component, Supervised)]) -> Result<(), StackError> {
    processes
        .iter_mut()
        .try_for_each(|(_, p)| p.check_running())
}

impl Stack {
    fn spawn(
        &mut self,
        component: Component,
        program: &Path,
        args: Vec<String>,
    ) -> Result<(), StackError> {
        let log = self.run_dir.join(format!("{}.log", component.name()));
        tracing::info!(component = component.name(), log = %log.display(), "starting");
        let process = Supervised::spawn(component.name(), program, &args, log)?;
        self.processes.push((component, process));
        self.write_pids();
        Ok(())
    }

    /// Lists the children's PIDs in the run directory, for cleanup after a SIGKILLed parent.
    fn write_pids(&self) {
        let lines: String = self
            .processes
            .iter()
            .filter_map(|(c, p)| p.pid().map(|pid| format!("{pid} {}\n", c.name())))
            .collect();
        let _ = std::fs::write(self.run_dir.join("pids"), lines);
    }

    /// Starts nats-server with this run's token and waits (bounded) until it listens.
    async fn start_nats(&mut self, timeout: Duration) -> Result<(), StackError> {
        let (nats, nats_addr) = Supervised::spawn_nats(
            Component::Nats.name(),
            &self.nats_program,
            self.nats_port,
            &self.run_dir,
            &self.nats_token,
        )?;
        self.processes.insert(0, (Component::Nats, nats));
        self.write_pids();
        let run_dir = self.run_dir.clone();
        wait_until(
            Component::Nats.name(),
            timeout,
            &mut || all_running(&mut self.processes),
            &run_dir,
            || tcp_open(nats_addr),
        )
        .await
    }

    /// The credentials every component gets: NATS's token and the registration secret, as
    /// files in the run directory (never on a command line).
    fn credential_args(&self) -> Vec<String> {
        vec![
            "--nats-url".into(),
            self.nats_url(),
            "--nats-token-file".into(),
            self.run_dir
                .join(NATS_TOKEN_FILE)
                .to_string_lossy()
                .into_owned(),
            "--registration-secret-file".into(),
            self.run_dir
                .join(REGISTRATION_SECRET_FILE)
                .to_string_lossy()
                .into_owned(),
        ]
    }

    /// Starts the processes in dependency order, waiting for each to be ready. NATS runs
    /// with a fresh token, and workers sign their registrations with a fresh secret, so
    /// nothing outside the stack can read the bus or join a pool.
    pub(crate) async fn launch(
        &mut self,
        b: &StackBuilder,
        artifacts: &Artifacts,
    ) -> Result<(), StackError> {
        let timeout = b.ready_timeout;
        write_secret(&self.run_dir.join(NATS_TOKEN_FILE), &self.nats_token)?;
        write_secret(
            &self.run_dir.join(REGISTRATION_SECRET_FILE),
            &switchyard_support::random_token(),
        )?;
        self.start_nats(timeout).await?;
        let run_dir = self.run_dir.clone();

        let model_dir = artifacts.model_dir.to_string_lossy().into_owned();
        write_secret(
            &self.run_dir.join(ADMIN_TOKEN_FILE),
            &self.control_plane_admin_token,
        )?;
        let mut cp_args = vec![
            "--admin-token-file".into(),
            self.run_dir
                .join(ADMIN_TOKEN_FILE)
                .to_string_lossy()
                .into_owned(),
            "--model-dir".into(),
            model_dir.clone(),
            "--max-model-len".into(),
            b.max_model_len.to_string(),
            "--serving-mode".into(),
            b.serving_mode.as_str().into(),
        ];
        cp_args.extend(self.credential_args());
        // A body the filter takes must fit the control plane's route call too: above its
        // default, it answered 413 and the filter failed those requests open.
        let body_limit = body_limit_bytes(&b.filter_overrides);
        if body_limit > BUFFER_LIMIT_BYTES {
            cp_args.extend(["--max-route-body-bytes".into(), body_limit.to_string()]);
        }
        if let Some(config) = b.conditional_disagg_config.as_deref() {
            cp_args.extend([
                "--conditional-disagg-config".to_string(),
                config.to_string(),
            ]);
        }
        if let Some((file, _)) = &b.pool_file {
            cp_args.extend(["--pool-file".into(), file.to_string_lossy().into_owned()]);
        }
        if let Some(dir) = &artifacts.whatif_dir {
            cp_args.extend(["--whatif-dir".into(), dir.to_string_lossy().into_owned()]);
        }
        let listens = std::iter::once((self.control_plane_port, self.control_plane_admin_port))
            .chain(self.replica_ports.iter().copied());
        self.control_plane_commands = listens
            .enumerate()
            .map(|(i, (route, admin))| {
                let mut args = vec![
                    "--listen".to_string(),
                    format!("127.0.0.1:{route}"),
                    "--admin-listen".into(),
                    format!("127.0.0.1:{admin}"),
                ];
                if b.control_planes > 1 {
                    args.extend(["--replica-id".into(), format!("cp-{i}")]);
                }
                args.extend(cp_args.iter().cloned());
                (artifacts.control_plane.clone(), args)
            })
            .collect();
        for replica in 0..b.control_planes {
            self.start_control_plane(replica, timeout).await?;
        }
        let client = self.client.clone();

        // Prefill workers run in their own process, so the prefill pool can be killed alone.
        let (prefill, mut serving): (Vec<WorkerSpec>, Vec<WorkerSpec>) = self
            .workers
            .iter()
            .cloned()
            .partition(|w| w.role == WorkerRole::Prefill);
        let isolated = match serving.iter().rposition(|w| w.role == WorkerRole::Decode) {
            Some(last) if b.isolate_decode => vec![serving.remove(last)],
            _ => Vec::new(),
        };
        for (component, workers) in [
            (Component::Workers, serving),
            (Component::PrefillWorkers, prefill),
            (Component::IsolatedDecodeWorker, isolated),
        ] {
            if workers.is_empty() {
                continue;
            }
            let mut worker_args = vec![
                "--model-dir".into(),
                model_dir.clone(),
                "--max-model-len".into(),
                b.max_model_len.to_string(),
                // Drained within the stack's own stop grace, so they exit on SIGTERM rather
                // than being killed after it.
                "--drain-timeout-ms".into(),
                WORKER_DRAIN.as_millis().to_string(),
            ];
            worker_args.extend(self.credential_args());
            for worker in &workers {
                worker_args.extend(["--worker".to_string(), worker.flag()]);
            }
            if let Some(speed_up) = b.speed_up {
                worker_args.extend(["--speed-up".to_string(), speed_up.to_string()]);
            }
            worker_args.extend(["--engine".to_string(), b.engine.to_string()]);
            worker_args.extend(b.worker_args.iter().cloned());
            self.spawn(component, &artifacts.sim_worker, worker_args)?;
        }
        let health: Vec<String> = self
            .workers
            .iter()
            .map(|w| format!("http://{}/health", w.address))
            .collect();
        wait_until(
            "simulated workers",
            timeout,
            &mut || all_running(&mut self.processes),
            &run_dir,
            || {
                let (client, health) = (client.clone(), health.clone());
                async move {
                    for url in &health {
                        http_ok(&client, url).await?;
                    }
                    Ok(())
                }
            },
        )
        .await?;

        let settings = EnvoySettings {
            listen_port: self.listen_port,
            admin_port: self.admin_port,
            control_plane_port: self.control_plane_port,
            control_plane_replica_ports: self
                .replica_ports
                .iter()
                .map(|(route, _)| *route)
                .collect(),
            wasm_path: artifacts.filter_wasm.clone(),
            route_timeout_ms: b.route_timeout_ms,
            buffer_limit_bytes: body_limit,
            eds_refresh: EDS_REFRESH,
            filter_overrides: b.filter_overrides.clone(),
            plain_listen_port: self.plain_listen_port,
        };
        // The pool file's models each get a route and a decode cluster (a request failed open
        // stays on its model's workers); read as the control plane reads it.
        let models = match &b.pool_file {
            Some((file, _)) => {
                switchyard_control_plane::pools::file::Pools::load(file)
                    .map_err(|e| StackError::InvalidSetting(e.to_string()))?
                    .models
            }
            None => Vec::new(),
        };
        let yaml_path = self.run_dir.join("envoy.yaml");
        std::fs::write(
            &yaml_path,
            envoy::render_bootstrap_for_models(&settings, &models)?,
        )
        .map_err(StackError::io(format!("writing {}", yaml_path.display())))?;
        let envoy_args = vec![
            "-c".into(),
            yaml_path.to_string_lossy().into_owned(),
            // A unique base id per Envoy, so parallel stacks' shared memory never collides.
            "--use-dynamic-base-id".into(),
            "--concurrency".into(),
            b.envoy_concurrency.to_string(),
            "--log-level".into(),
            "info".into(),
        ];
        self.spawn(Component::Envoy, &artifacts.envoy, envoy_args)?;
        let ready = format!("{}/ready", self.admin_url());
        wait_until(
            "envoy",
            timeout,
            &mut || all_running(&mut self.processes),
            &run_dir,
            || http_ok(&client, &ready),
        )
        .await?;
        self.wait_for_eds(timeout).await?;
        for replica in 0..b.control_planes {
            self.wait_ready(replica, timeout).await?;
        }
        Ok(())
    }

    /// Waits until control-plane replica `replica` says ready (`/readyz`): it has heard the
    /// workers and their KV dumps, and Envoy's health check will send it route calls.
    ///
    /// # Errors
    /// [`StackError::NotReady`] with what it still waits for.
    pub async fn wait_ready(
        &mut self,
        replica: usize,
        timeout: Duration,
    ) -> Result<(), StackError> {
        let readyz = format!("{}/readyz", self.control_plane_replica_url(replica));
        let client = self.client.clone();
        let run_dir = self.run_dir.clone();
        wait_until(
            replica_component(replica).name(),
            timeout,
            &mut || all_running(&mut self.processes),
            &run_dir,
            || http_ok(&client, &readyz),
        )
        .await
    }

    /// Waits until Envoy's clusters list every worker as healthy (the control plane learned
    /// them over NATS and served them over EDS).
    ///
    /// # Errors
    /// [`StackError::NotReady`] naming what is still missing.
    pub async fn wait_for_eds(&mut self, timeout: Duration) -> Result<(), StackError> {
        let wanted = |pred: fn(WorkerRole) -> bool| -> Vec<String> {
            let mut v: Vec<String> = self
                .workers
                .iter()
                .chain(&self.declared)
                .filter(|w| pred(w.role))
                .map(|w| w.address.clone())
                .collect();
            v.sort();
            v
        };
        let decode = wanted(WorkerRole::serves_decode);
        let prefill = wanted(|r| r == WorkerRole::Prefill);
        let url = format!("{}/clusters", self.admin_url());
        let client = self.client.clone();
        let run_dir = self.run_dir.clone();
        wait_until(
            "envoy EDS",
            timeout,
            &mut || all_running(&mut self.processes),
            &run_dir,
            || {
                let (client, url, decode, prefill) =
                    (client.clone(), url.clone(), decode.clone(), prefill.clone());
                async move {
                    let page = client.get(&url).send().await.map_err(|e| e.to_string())?;
                    let page = page.text().await.map_err(|e| e.to_string())?;
                    for (cluster, want) in [(DECODE_CLUSTER, decode), (PREFILL_CLUSTER, prefill)] {
                        let have = envoy::healthy_hosts(&page, cluster);
                        let missing: Vec<&String> =
                            want.iter().filter(|a| !have.contains(a)).collect();
                        if !missing.is_empty() {
                            return Err(format!("{cluster} lacks {missing:?} (has {have:?})"));
                        }
                    }
                    Ok(())
                }
            },
        )
        .await
    }

    /// `http://127.0.0.1:PORT` of Envoy's listener: where clients send requests.
    pub fn gateway_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.listen_port)
    }

    /// `http://127.0.0.1:PORT` of the filter-less baseline listener, if the stack has one
    /// ([`StackBuilder::plain_listener`]).
    pub fn plain_gateway_url(&self) -> Option<String> {
        self.plain_listen_port
            .map(|port| format!("http://127.0.0.1:{port}"))
    }

    /// `http://127.0.0.1:PORT` of Envoy's admin interface.
    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin_port)
    }

    /// `http://127.0.0.1:PORT` of the control plane's route API (what Envoy calls).
    pub fn control_plane_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.control_plane_port)
    }

    /// How many control-plane replicas the stack runs.
    pub fn control_planes(&self) -> usize {
        1 + self.replica_ports.len()
    }

    /// `http://127.0.0.1:PORT` of replica `replica`'s route API (0: [`Stack::control_plane_url`]).
    pub fn control_plane_replica_url(&self, replica: usize) -> String {
        match replica.checked_sub(1) {
            None => self.control_plane_url(),
            Some(i) => format!("http://127.0.0.1:{}", self.replica_ports[i].0),
        }
    }

    /// `http://127.0.0.1:PORT` of replica `replica`'s admin API (0:
    /// [`Stack::control_plane_admin_url`]).
    pub fn control_plane_replica_admin_url(&self, replica: usize) -> String {
        match replica.checked_sub(1) {
            None => self.control_plane_admin_url(),
            Some(i) => format!("http://127.0.0.1:{}", self.replica_ports[i].1),
        }
    }

    /// `http://127.0.0.1:PORT` of the control plane's admin API (config, workers).
    pub fn control_plane_admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.control_plane_admin_port)
    }

    /// This run's bearer token for the control plane's admin API (also in the run
    /// directory's [`ADMIN_TOKEN_FILE`]).
    pub fn control_plane_admin_token(&self) -> &str {
        &self.control_plane_admin_token
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn nats_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.nats_port)
    }

    /// The simulated workers.
    pub fn workers(&self) -> &[WorkerSpec] {
        &self.workers
    }

    /// Where the logs and generated configs are.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    fn process(&self, component: Component) -> Option<&Supervised> {
        self.processes
            .iter()
            .find(|(c, _)| *c == component)
            .map(|(_, p)| p)
    }

    /// PID of a component while it runs under the stack.
    pub fn pid(&self, component: Component) -> Option<u32> {
        self.process(component).and_then(Supervised::pid)
    }

    /// Log file of a component.
    pub fn log_path(&self, component: Component) -> Option<&Path> {
        self.process(component).map(Supervised::log_path)
    }

    /// Sends a signal to a component (e.g. [`Signal::Stop`] to freeze the control plane).
    ///
    /// # Errors
    /// [`StackError::Io`] if `kill` fails.
    pub fn signal(&self, component: Component, signal: Signal) -> Result<(), StackError> {
        match self.process(component) {
            Some(p) => p.signal(signal),
            None => Ok(()),
        }
    }

    /// Freezes a component (SIGSTOP) and waits until it is stopped: its sockets stay open but
    /// nothing answers, like a hung service. [`Signal::Cont`] thaws it.
    ///
    /// # Errors
    /// [`StackError::Io`] if it cannot be frozen.
    pub fn freeze(&self, component: Component) -> Result<(), StackError> {
        match self.process(component) {
            Some(p) => p.freeze(Duration::from_secs(5)),
            None => Ok(()),
        }
    }

    /// Stops one component (SIGTERM, then SIGKILL after a grace period) and forgets it.
    pub fn stop_component(&mut self, component: Component) {
        if let Some(index) = self.processes.iter().position(|(c, _)| *c == component) {
            let (_, mut process) = self.processes.remove(index);
            process.stop(STOP_GRACE);
            self.write_pids();
        }
    }

    /// Starts nats-server again on the same port with the same token, after
    /// [`Stack::stop_component`] stopped it (an outage); waits until it listens.
    ///
    /// # Errors
    /// As starting the stack's NATS.
    pub async fn restart_nats(&mut self) -> Result<(), StackError> {
        self.stop_component(Component::Nats);
        self.start_nats(Duration::from_secs(30)).await
    }

    /// Stops the control plane and starts it again with the same flags (its state is lost:
    /// what it knows afterwards comes from the workers again); waits until it answers.
    ///
    /// # Errors
    /// As starting the stack's control plane.
    pub async fn restart_control_plane(&mut self) -> Result<(), StackError> {
        self.restart_control_plane_replica(0).await
    }

    /// Stops control-plane replica `replica` (if it still runs) and starts it again with the
    /// same flags; waits until it answers (not until it is ready: see [`Stack::wait_ready`]).
    ///
    /// # Errors
    /// As starting the stack's control plane.
    pub async fn restart_control_plane_replica(
        &mut self,
        replica: usize,
    ) -> Result<(), StackError> {
        self.stop_component(replica_component(replica));
        self.start_control_plane(replica, Duration::from_secs(30))
            .await
    }

    async fn start_control_plane(
        &mut self,
        replica: usize,
        timeout: Duration,
    ) -> Result<(), StackError> {
        let (program, args) = self.control_plane_commands[replica].clone();
        self.spawn(replica_component(replica), &program, args)?;
        let healthz = format!("{}/healthz", self.control_plane_replica_url(replica));
        let client = self.client.clone();
        let run_dir = self.run_dir.clone();
        wait_until(
            "control plane",
            timeout,
            &mut || all_running(&mut self.processes),
            &run_dir,
            || http_ok(&client, &healthz),
        )
        .await
    }

    /// The file holding this run's NATS token (for clients of the stack's NATS).
    pub fn nats_token_file(&self) -> PathBuf {
        self.run_dir.join(NATS_TOKEN_FILE)
    }

    /// The file holding this run's registration secret.
    pub fn registration_secret_file(&self) -> PathBuf {
        self.run_dir.join(REGISTRATION_SECRET_FILE)
    }

    /// Takes every process that has exited out of the stack's care and says, for each, what
    /// it was and why it ended, with its log's end. The rest keep running.
    pub fn reap_exited(&mut self) -> Vec<StackError> {
        let mut exited = Vec::new();
        self.processes.retain_mut(|(_, p)| match p.check_running() {
            Ok(()) => true,
            Err(e) => {
                exited.push(e);
                false
            }
        });
        if !exited.is_empty() {
            self.write_pids();
        }
        exited
    }

    /// Ok while every process of the stack runs.
    ///
    /// # Errors
    /// [`StackError::Exited`] for the first that has exited, with its log's end.
    pub fn check_running(&mut self) -> Result<(), StackError> {
        all_running(&mut self.processes)
    }

    /// Closes the gateway to new work and says how many requests are in flight through it:
    /// Envoy's listeners stop taking connections (`POST /drain_listeners`; a new connection
    /// is refused, an open one still served) and its health is set failing (`POST
    /// /healthcheck/fail`), which makes every connection close after its current response
    /// (`Connection: close`, HTTP/2 GOAWAY), so a client's pooled connection cannot keep
    /// bringing new requests. The first step of a stop that lets the workers finish the
    /// streams they serve ([`Stack::wait_gateway_idle`] is the second, [`Stack::shutdown`]
    /// the last).
    ///
    /// # Errors
    /// [`StackError::EnvoyAdmin`] if Envoy's admin interface does not answer within
    /// [`ENVOY_ADMIN_TIMEOUT`] (Envoy died, say): there is nothing to drain through it then.
    pub async fn close_gateway(&self) -> Result<u64, StackError> {
        for call in ["drain_listeners", "healthcheck/fail"] {
            let url = format!("{}/{call}", self.admin_url());
            let answer = self.envoy_admin(call, self.client.post(&url)).await?;
            if !answer.status().is_success() {
                return Err(StackError::EnvoyAdmin {
                    call: call.to_string(),
                    detail: format!("answered {}", answer.status()),
                });
            }
        }
        self.gateway_requests_in_flight().await
    }

    /// Requests in flight through Envoy's listeners now.
    ///
    /// # Errors
    /// [`StackError::EnvoyAdmin`] if Envoy's admin interface does not answer within
    /// [`ENVOY_ADMIN_TIMEOUT`].
    pub async fn gateway_requests_in_flight(&self) -> Result<u64, StackError> {
        let url = format!("{}/stats?filter=downstream_rq_active", self.admin_url());
        let page = self.envoy_admin("stats", self.client.get(&url)).await?;
        let page = page.text().await.map_err(|e| StackError::EnvoyAdmin {
            call: "stats".to_string(),
            detail: e.to_string(),
        })?;
        Ok(envoy::requests_in_flight(&page))
    }

    /// Sends one call to Envoy's admin interface, bounded by [`ENVOY_ADMIN_TIMEOUT`].
    async fn envoy_admin(
        &self,
        call: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, StackError> {
        request
            .timeout(ENVOY_ADMIN_TIMEOUT)
            .send()
            .await
            .map_err(|e| StackError::EnvoyAdmin {
                call: call.to_string(),
                detail: e.to_string(),
            })
    }

    /// Waits up to `within` until no request is in flight through Envoy's listeners, and
    /// says how many still are then (0: all ended).
    ///
    /// # Errors
    /// [`StackError::EnvoyAdmin`] if Envoy's admin interface stops answering.
    pub async fn wait_gateway_idle(&self, within: Duration) -> Result<u64, StackError> {
        let deadline = tokio::time::Instant::now() + within;
        // The deadline bounds the wait; the count is a second, independent bound.
        let max_polls = within.as_millis() / POLL_INTERVAL.as_millis() + 1;
        let mut in_flight = self.gateway_requests_in_flight().await?;
        for _ in 0..max_polls {
            if in_flight == 0 || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
            in_flight = self.gateway_requests_in_flight().await?;
        }
        Ok(in_flight)
    }

    /// Stops everything, Envoy first (no new requests), nats-server last.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        while let Some((_, mut process)) = self.processes.pop() {
            process.stop(STOP_GRACE);
        }
        self.write_pids();
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop_all();
        if self.remove_run_dir && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.run_dir);
        } else {
            switchyard_support::errln!(
                "switchyard stack stopped; logs kept in {}",
                self.run_dir.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_max_body_bytes_setting_sets_the_gateways_body_limit() {
        let mut overrides = serde_json::Map::new();
        assert_eq!(body_limit_bytes(&overrides), BUFFER_LIMIT_BYTES);
        overrides.insert("max_body_bytes".into(), (32u64 << 20).into());
        assert_eq!(body_limit_bytes(&overrides), 32 << 20);
    }

    #[tokio::test]
    async fn a_stack_without_decode_capacity_is_refused_before_starting_anything() {
        let err = StackBuilder::new()
            .decode_workers(0)
            .prefill_workers(1)
            .start()
            .await
            .unwrap_err();
        assert!(matches!(err, StackError::InvalidSetting(_)), "{err}");
    }

    /// A stack whose launcher was SIGKILLed leaves its processes running, listed in the run
    /// directory's `pids`; a new stack there is refused while they run (it overwrote the
    /// list and removed their NATS store, and they ran on, listed nowhere). A listed PID
    /// that now belongs to an unrelated process (no run directory on its command line) is
    /// not taken for one.
    #[test]
    fn a_run_directory_with_an_earlier_stacks_processes_is_refused() {
        let dir = std::env::temp_dir().join(format!("switchyard-run-left-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A shell waiting on `read` (a builtin: no child process to leave behind) with a
        // path on its command line; its stdin is held open until it is killed.
        let waiting_with = |path: &str| {
            std::process::Command::new("/bin/sh")
                .args(["-c", "read line", "sh", path])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut leftover = waiting_with(dir.join("marker").to_str().unwrap());
        let unrelated = std::process::Command::new("/bin/sleep")
            .arg("30")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Another run directory whose name starts with this one's.
        let next_door = waiting_with(&format!("{}-2/marker", dir.display()));
        std::fs::write(
            dir.join("pids"),
            format!(
                "{} envoy\n{} nats-server\n{} control-plane\n",
                leftover.id(),
                unrelated.id(),
                next_door.id()
            ),
        )
        .unwrap();
        let refused = refuse_leftovers(&dir).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("{} (envoy)", leftover.id())) && refused.contains("kill"),
            "{refused}"
        );
        assert!(!refused.contains("nats-server"), "{refused}");
        assert!(!refused.contains("control-plane"), "{refused}");
        let _ = leftover.kill();
        let _ = leftover.wait();
        assert!(refuse_leftovers(&dir).is_ok(), "none left once it is gone");
        for mut other in [unrelated, next_door] {
            let _ = other.kill();
            let _ = other.wait();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_run_directory_serves_one_stack_at_a_time() {
        let dir = std::env::temp_dir().join(format!("switchyard-run-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let held = lock_run_dir(&dir).unwrap();
        let second = lock_run_dir(&dir).unwrap_err().to_string();
        assert!(
            second.contains("in use by another running stack"),
            "{second}"
        );
        drop(held);
        lock_run_dir(&dir).expect("free again once the first stack is gone");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn settings_the_filter_or_the_control_plane_would_refuse_are_refused_first() {
        let run_dir = std::env::temp_dir().join(format!(
            "switchyard-refused-settings-{}",
            std::process::id()
        ));
        let refused = |builder: StackBuilder| async {
            builder
                .run_dir(run_dir.clone())
                .start()
                .await
                .map(drop)
                .unwrap_err()
                .to_string()
        };
        let typo = refused(StackBuilder::new().filter_setting("prefil_retries", 2)).await;
        assert!(typo.contains("unknown field `prefil_retries`"), "{typo}");
        let range = refused(StackBuilder::new().filter_setting("prefill_retries", 9)).await;
        assert!(range.contains("prefill_retries"), "{range}");
        let policy = refused(
            StackBuilder::new().conditional_disagg_config(r#"{"policy":"nope"}"#.to_string()),
        )
        .await;
        assert!(policy.contains("--conditional-disagg-config"), "{policy}");
        // Ports given twice, or taken.
        let twice = refused(
            StackBuilder::new()
                .listen_port(41_999)
                .control_plane_port(41_999),
        )
        .await;
        assert!(twice.contains("ports are both 41999"), "{twice}");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let busy = refused(StackBuilder::new().admin_port(port)).await;
        assert!(
            busy.contains(&format!("admin port {port} cannot be bound")),
            "{busy}"
        );
        assert!(busy.contains("`pids` file"), "{busy}");
        assert!(!run_dir.exists(), "a run directory was made");
        // The stack's own filter settings pass.
        crate::envoy::check_filter_config(200, BUFFER_LIMIT_BYTES, &serde_json::Map::new())
            .unwrap();
    }
}
