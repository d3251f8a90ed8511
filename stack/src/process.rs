//! One supervised child process: started with its output in a log file, stopped by PID.
//!
//! Stopping sends SIGTERM (through the `kill` program: this crate has no unsafe code and so
//! no direct `kill(2)`), waits a bounded grace period, then SIGKILLs. [`Drop`] stops the
//! process, so a panicking test or a returning `main` never leaves a child behind. A parent
//! killed with SIGKILL cannot clean up; its children are then orphans that the run directory's
//! `pids` file lists.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::error::StackError;

/// How often a stop checks whether the process has exited.
const STOP_POLL: Duration = Duration::from_millis(20);
/// How much of a log an early-exit error quotes.
const LOG_TAIL_BYTES: u64 = 2_000;

/// A POSIX signal the stack sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ask to exit.
    Term,
    /// Exit now.
    Kill,
    /// Freeze (the process keeps its sockets but answers nothing: a "slow" service).
    Stop,
    /// Thaw after [`Signal::Stop`].
    Cont,
}

impl Signal {
    fn flag(self) -> &'static str {
        match self {
            Signal::Term => "-TERM",
            Signal::Kill => "-KILL",
            Signal::Stop => "-STOP",
            Signal::Cont => "-CONT",
        }
    }
}

/// A running child with its log file.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Supervised {
    /// Starts `program args` with stdout and stderr appended to `log`, stdin closed.
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
        let out =
            File::create(&log).map_err(StackError::io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(StackError::io("duplicating a log handle"))?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| StackError::Spawn {
                name: name.to_string(),
                program: program.to_path_buf(),
                source,
            })?;
        tracing::debug!(name, pid = child.id(), log = %log.display(), "started");
        crate::cleanup::register(child.id());
        Ok(Supervised {
            name: name.to_string(),
            child: Some(child),
            log,
        })
    }

    /// Component name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// PID, while the process is supervised.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Ok while the process runs.
    ///
    /// # Errors
    /// [`StackError::ExitedEarly`] with the end of its log once it has exited.
    pub fn check_running(&mut self) -> Result<(), StackError> {
        let Some(child) = self.child.as_mut() else {
            return Err(self.exited("stopped by the stack".to_string()));
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.exited(status.to_string())),
            Err(e) => Err(self.exited(format!("cannot query: {e}"))),
        }
    }

    fn exited(&self, status: String) -> StackError {
        StackError::ExitedEarly {
            name: self.name.clone(),
            status,
            log: self.log.clone(),
            tail: log_tail(&self.log),
        }
    }

    /// Sends `signal` to the process.
    ///
    /// # Errors
    /// [`StackError::Io`] if `kill` cannot run or reports failure.
    pub fn signal(&self, signal: Signal) -> Result<(), StackError> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let status = Command::new("kill")
            .arg(signal.flag())
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(StackError::io("running kill"))?;
        if status.success() {
            Ok(())
        } else {
            Err(StackError::Io {
                context: format!("kill {} {pid} ({})", signal.flag(), self.name),
                source: std::io::Error::other(status.to_string()),
            })
        }
    }

    /// Freezes the process with SIGSTOP and waits (bounded) until the kernel reports it
    /// stopped, so a caller can rely on it answering nothing from now on.
    ///
    /// # Errors
    /// [`StackError::Io`] if `kill` fails or the process is not seen stopped within
    /// `timeout`.
    pub fn freeze(&self, timeout: Duration) -> Result<(), StackError> {
        self.signal(Signal::Stop)?;
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let polls = (timeout.as_millis() / STOP_POLL.as_millis()).max(1);
        for _ in 0..polls {
            if process_state(pid) == Some('T') {
                return Ok(());
            }
            std::thread::sleep(STOP_POLL);
        }
        Err(StackError::Io {
            context: format!("{} (pid {pid}) not stopped after SIGSTOP", self.name),
            source: std::io::Error::other(format!("state {:?}", process_state(pid))),
        })
    }

    /// Stops the process: SIGTERM, up to `grace` to exit, then SIGKILL; always reaps it.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        crate::cleanup::unregister(pid);
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        // A frozen (SIGSTOPped) process only acts on SIGTERM once continued.
        let _ = Command::new("kill")
            .args(["-CONT", &pid.to_string()])
            .status();
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let polls = (grace.as_millis() / STOP_POLL.as_millis()).max(1);
        for _ in 0..polls {
            if matches!(child.try_wait(), Ok(Some(_))) {
                tracing::debug!(name = %self.name, pid, "stopped");
                return;
            }
            std::thread::sleep(STOP_POLL);
        }
        tracing::warn!(name = %self.name, pid, "did not exit on SIGTERM; killing");
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// A process's state letter from `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z`, ...).
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may contain spaces; the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The last few lines of a log, for error messages.
pub fn log_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::from("(no log)");
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
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
}
