//! One supervised child process of the stack: a [`switchyard_support::Process`] (output in a
//! log file in the run directory, stopped by PID on drop) that is also listed for the
//! interrupt handler ([`crate::cleanup`]) while it runs, with errors as [`StackError`]s.
//!
//! A parent killed with SIGKILL cannot clean up; its children are then orphans that the run
//! directory's `pids` file lists.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use switchyard_support::nats::NatsConfig;
use switchyard_support::process::{Process, Stopped, DROP_GRACE};

use crate::error::StackError;

pub use switchyard_support::process::process_state;
pub use switchyard_support::Signal;

/// A running child with its log file.
#[derive(Debug)]
pub struct Supervised {
    process: Process,
    log: PathBuf,
}

impl Supervised {
    /// Starts `program args` with stdout and stderr written to `log`, stdin closed.
    ///
    /// # Errors
    /// [`StackError::Io`] if the log cannot be created, [`StackError::Spawn`] if the program
    /// cannot be started.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Supervised, StackError> {
        // In a process group of its own: a Ctrl-C typed in the terminal reaches the parent
        // alone, which stops the stack in order (switchyard-local lets the requests in flight
        // finish first; Envoy, sharing the terminal's group, quit at once on its own SIGINT).
        // Every parent of a stack stops its children on those signals: the launcher itself,
        // the rest through [`crate::cleanup::stop_children_on_signal`].
        let process = Process::spawn_in_own_group(name, program, args, Some(&log))
            .map_err(|e| stack_error(e, &log))?;
        Ok(Supervised::adopt(process, log))
    }

    /// Starts nats-server with JetStream on 127.0.0.1:`port` only (the support crate's
    /// command line, shared with the tests' fixture), its store and its log (`<name>.log`) in
    /// `run_dir`. Returns it and the address to wait for: the caller lists it for cleanup
    /// first, then waits (`crate::readiness`), so an interrupt while it starts stops it too.
    ///
    /// # Errors
    /// As [`Supervised::spawn`].
    pub fn spawn_nats(
        name: &str,
        program: &Path,
        port: u16,
        run_dir: &Path,
        token: &str,
    ) -> Result<(Supervised, SocketAddr), StackError> {
        let config = NatsConfig {
            program: program.to_path_buf(),
            port,
            store_dir: run_dir.join(crate::running::NATS_STORE_DIR),
            log: None,
            token: Some(token.to_string()),
        };
        config
            .write_auth_file()
            .map_err(|e| stack_error(e, &run_dir.join(format!("{name}.log"))))?;
        let log = run_dir.join(format!("{name}.log"));
        let nats = Supervised::spawn(name, program, &config.args(), log)?;
        Ok((nats, config.addr()))
    }

    fn adopt(process: Process, log: PathBuf) -> Supervised {
        if let Some(pid) = process.pid() {
            tracing::debug!(name = process.name(), pid, log = %log.display(), "supervised");
            crate::cleanup::register(pid);
        }
        Supervised { process, log }
    }

    /// Component name.
    pub fn name(&self) -> &str {
        self.process.name()
    }

    /// PID, while the process is supervised.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Ok while the process runs.
    ///
    /// # Errors
    /// [`StackError::Exited`] with the end of its log once it has exited.
    pub fn check_running(&mut self) -> Result<(), StackError> {
        self.process
            .check_running()
            .map_err(|e| stack_error(e, &self.log))
    }

    /// Sends `signal` to the process.
    ///
    /// # Errors
    /// [`StackError::Io`] if `kill` cannot run or reports failure.
    pub fn signal(&self, signal: Signal) -> Result<(), StackError> {
        self.process
            .signal(signal)
            .map_err(|e| stack_error(e, &self.log))
    }

    /// Freezes the process with SIGSTOP and waits (bounded) until the kernel reports it
    /// stopped, so a caller can rely on it answering nothing from now on.
    ///
    /// # Errors
    /// [`StackError::Io`] if `kill` fails or the process is not seen stopped within
    /// `timeout`.
    pub fn freeze(&self, timeout: Duration) -> Result<(), StackError> {
        self.process
            .freeze(timeout)
            .map_err(|e| stack_error(e, &self.log))
    }

    /// Stops the process: SIGTERM, up to `grace` to exit, then SIGKILL; always reaps it.
    pub fn stop(&mut self, grace: Duration) {
        let Some(pid) = self.process.pid() else {
            return;
        };
        crate::cleanup::unregister(pid);
        let name = self.process.name().to_string();
        match self.process.stop(grace) {
            Stopped::NotRunning => {}
            Stopped::Terminated => tracing::debug!(name, pid, "stopped"),
            Stopped::Killed => tracing::warn!(name, pid, "did not exit on SIGTERM; killed"),
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop(DROP_GRACE);
    }
}

/// The stack's error for a process error; `log` is the process's log, in the run directory.
fn stack_error(e: switchyard_support::Error, log: &Path) -> StackError {
    use switchyard_support::Error;
    match e {
        Error::Spawn {
            name,
            program,
            source,
        } => StackError::Spawn {
            name,
            program,
            source,
        },
        Error::Exited {
            name, status, tail, ..
        } => StackError::Exited {
            name,
            status,
            log: log.to_path_buf(),
            tail,
        },
        Error::NotReady {
            name,
            waited_ms,
            detail,
            addr,
        } => StackError::NotReady {
            name,
            waited_ms,
            detail: format!("connect {addr}: {detail}"),
            run_dir: log.parent().unwrap_or(log).to_path_buf(),
        },
        Error::Io { context, source } => StackError::Io { context, source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_in_temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "switchyard-stack-test-{}-{name}.log",
            std::process::id()
        ))
    }

    #[test]
    fn a_process_that_exits_is_reported_with_its_log() {
        let log = log_in_temp("exits");
        let args = vec!["-c".to_string(), "echo boom-marker; exit 3".to_string()];
        let mut p =
            Supervised::spawn("shell", Path::new("/bin/sh"), &args, log.clone()).expect("spawn");
        let mut result = Ok(());
        for _ in 0..250 {
            result = p.check_running();
            if result.is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let message = result.expect_err("the shell exits").to_string();
        assert!(message.contains("boom-marker"), "{message}");
        assert!(message.contains('3'), "{message}");
        let _ = std::fs::remove_file(log);
    }

    #[test]
    fn drop_stops_a_running_process_even_when_frozen() {
        let log = log_in_temp("drop");
        let args = vec!["60".to_string()];
        let p = Supervised::spawn("sleeper", Path::new("/bin/sleep"), &args, log.clone())
            .expect("spawn");
        let pid = p.pid().expect("pid");
        p.freeze(Duration::from_secs(5)).expect("frozen");
        assert_eq!(process_state(pid), Some('T'));
        drop(p);
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        assert!(!alive, "process {pid} still exists after drop");
        let _ = std::fs::remove_file(log);
    }

    /// Waits for a spawned nats-server as the stack does.
    async fn wait_for(
        nats: &mut Supervised,
        addr: SocketAddr,
        run_dir: &Path,
    ) -> Result<(), StackError> {
        crate::readiness::wait_until(
            "nats-server",
            Duration::from_secs(10),
            &mut || nats.check_running(),
            run_dir,
            || crate::readiness::tcp_open(addr),
        )
        .await
    }

    #[tokio::test]
    async fn nats_starts_in_the_run_directory_and_stops_on_drop() {
        let run_dir = switchyard_support::TempDir::new("stack-nats-test").expect("run dir");
        let port = switchyard_support::free_port();
        let program = switchyard_support::nats::default_program();
        let (mut nats, addr) =
            Supervised::spawn_nats("nats-server", &program, port, run_dir.path(), "tok3n")
                .expect("spawn");
        wait_for(&mut nats, addr, run_dir.path())
            .await
            .expect("nats-server starts");
        let pid = nats.pid().expect("running");
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("accepts connections");
        assert_eq!(nats.log_path(), run_dir.path().join("nats-server.log"));
        assert!(
            run_dir.path().join("nats-store").is_dir() || {
                std::thread::sleep(std::time::Duration::from_millis(500));
                run_dir.path().join("nats-store").is_dir()
            }
        );
        let auth =
            std::fs::read_to_string(run_dir.path().join("nats-auth.conf")).expect("auth config");
        assert!(auth.contains("tok3n"), "{auth}");
        drop(nats);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} still runs"
        );
    }

    #[tokio::test]
    async fn a_server_that_exits_while_starting_is_an_early_exit_with_its_log() {
        let run_dir = switchyard_support::TempDir::new("stack-nats-test").expect("run dir");
        // `sh` cannot run nats-server's command line and exits at once, saying so in its log.
        let (mut nats, addr) = Supervised::spawn_nats(
            "nats-server",
            Path::new("/bin/sh"),
            switchyard_support::free_port(),
            run_dir.path(),
            "tok3n",
        )
        .expect("spawn");
        let err = wait_for(&mut nats, addr, run_dir.path())
            .await
            .expect_err("sh is no nats-server");
        assert!(matches!(err, StackError::Exited { .. }), "{err}");
        let StackError::Exited { tail, .. } = &err else {
            unreachable!()
        };
        assert!(!tail.trim().is_empty(), "the log's end is quoted: {err}");
    }
}
