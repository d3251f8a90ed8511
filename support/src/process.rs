//! One child process: started with its output in a log file (or discarded), stopped by PID.
//!
//! Stopping sends SIGTERM (through the `kill` program: the workspace denies `unsafe`, so
//! there is no direct `kill(2)`), waits a bounded grace period, then SIGKILLs, and always
//! reaps the child. [`Drop`] stops the process, so a panicking test or a returning `main`
//! never leaves a child behind.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::Error;

/// How often a stop, a freeze or a readiness wait checks again.
const POLL: Duration = Duration::from_millis(20);
/// How much of a log an error quotes.
const LOG_TAIL_BYTES: u64 = 2_000;
/// The grace a dropped process gets between SIGTERM and SIGKILL.
pub const DROP_GRACE: Duration = Duration::from_secs(3);

/// A POSIX signal sent to a child.
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
    /// User signal 1: a simulated worker process drops its KV events for a while (a
    /// simulated fault, see `switchyard-sim-worker --help`).
    Usr1,
}

impl Signal {
    /// The `kill` flag for this signal.
    pub fn flag(self) -> &'static str {
        match self {
            Signal::Term => "-TERM",
            Signal::Kill => "-KILL",
            Signal::Stop => "-STOP",
            Signal::Cont => "-CONT",
            Signal::Usr1 => "-USR1",
        }
    }
}

/// A running child, stopped by PID when dropped.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Option<Child>,
    log: Option<PathBuf>,
}

impl Process {
    /// Starts `program args` with stdin closed and stdout and stderr written to `log` (created
    /// or truncated), or discarded when `log` is `None`.
    ///
    /// # Errors
    /// [`Error::Io`] if the log cannot be created, [`Error::Spawn`] if the program cannot be
    /// started.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: Option<&Path>,
    ) -> Result<Process, Error> {
        Process::start(name, program, args, log, false)
    }

    /// As [`Process::spawn`], in a process group of its own: a Ctrl-C typed in the terminal
    /// (SIGINT to the terminal's foreground group), or the terminal closing (SIGHUP), then
    /// reaches the parent alone, which stops the child in its own time and order. Only for a
    /// parent that does stop its children on those signals: the child no longer gets them.
    ///
    /// # Errors
    /// As [`Process::spawn`].
    pub fn spawn_in_own_group(
        name: &str,
        program: &Path,
        args: &[String],
        log: Option<&Path>,
    ) -> Result<Process, Error> {
        Process::start(name, program, args, log, true)
    }

    fn start(
        name: &str,
        program: &Path,
        args: &[String],
        log: Option<&Path>,
        own_group: bool,
    ) -> Result<Process, Error> {
        use std::os::unix::process::CommandExt as _;
        let (out, err) = match log {
            Some(path) => {
                let out = File::create(path)
                    .map_err(Error::io(format!("creating {}", path.display())))?;
                let err = out
                    .try_clone()
                    .map_err(Error::io("duplicating a log handle"))?;
                (Stdio::from(out), Stdio::from(err))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if own_group {
            command.process_group(0);
        }
        let child = command.spawn().map_err(|source| Error::Spawn {
            name: name.to_string(),
            program: program.to_path_buf(),
            source,
        })?;
        Ok(Process {
            name: name.to_string(),
            child: Some(child),
            log: log.map(Path::to_path_buf),
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// PID, until the process is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its log file, if its output is kept.
    pub fn log_path(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// Ok while the process runs.
    ///
    /// # Errors
    /// [`Error::Exited`] with the end of its log once it has exited or been stopped.
    pub fn check_running(&mut self) -> Result<(), Error> {
        let Some(child) = self.child.as_mut() else {
            return Err(self.exited("stopped".to_string()));
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.exited(status.to_string())),
            Err(e) => Err(self.exited(format!("cannot query: {e}"))),
        }
    }

    fn exited(&self, status: String) -> Error {
        Error::Exited {
            name: self.name.clone(),
            status,
            log: self.log.clone(),
            tail: self
                .log
                .as_deref()
                .map_or_else(|| "(output discarded)".to_string(), log_tail),
        }
    }

    /// Sends `signal` to the process (nothing once it is stopped).
    ///
    /// # Errors
    /// [`Error::Io`] if `kill` cannot run or reports failure.
    pub fn signal(&self, signal: Signal) -> Result<(), Error> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let status = Command::new("kill")
            .arg(signal.flag())
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(Error::io("running kill"))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::Io {
                context: format!("kill {} {pid} ({})", signal.flag(), self.name),
                source: std::io::Error::other(status.to_string()),
            })
        }
    }

    /// Freezes the process with SIGSTOP and waits (at most `timeout`) until the kernel reports
    /// it stopped, so a caller can rely on it answering nothing from now on.
    ///
    /// # Errors
    /// [`Error::Io`] if `kill` fails or the process is not seen stopped in time.
    pub fn freeze(&self, timeout: Duration) -> Result<(), Error> {
        self.signal(Signal::Stop)?;
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        for _ in 0..polls(timeout) {
            if process_state(pid) == Some('T') {
                return Ok(());
            }
            std::thread::sleep(POLL);
        }
        Err(Error::Io {
            context: format!("{} (pid {pid}) not stopped after SIGSTOP", self.name),
            source: std::io::Error::other(format!("state {:?}", process_state(pid))),
        })
    }

    /// Waits (at most `timeout`) until something accepts TCP connections on `addr`, checking
    /// before each attempt that this process still runs, so a crash surfaces at once with its
    /// log rather than as a timeout.
    ///
    /// # Errors
    /// [`Error::Exited`] if the process exits, [`Error::NotReady`] on timeout.
    pub fn wait_for_listener(&mut self, addr: SocketAddr, timeout: Duration) -> Result<(), Error> {
        let mut last = String::from("not tried");
        for _ in 0..polls(timeout) {
            self.check_running()?;
            // One poll interval per attempt (loopback answers in microseconds), so the
            // attempts fit the poll count and the wait stays within about twice `timeout`.
            match TcpStream::connect_timeout(&addr, POLL) {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(POLL);
        }
        Err(Error::NotReady {
            name: self.name.clone(),
            addr,
            waited_ms: timeout.as_millis(),
            detail: last,
        })
    }

    /// Stops the process: SIGCONT (a frozen process acts on nothing else), SIGTERM, up to
    /// `grace` to exit, then SIGKILL; always reaps it. Does nothing once stopped.
    pub fn stop(&mut self, grace: Duration) -> Stopped {
        let Some(mut child) = self.child.take() else {
            return Stopped::NotRunning;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return Stopped::NotRunning;
        }
        let pid = child.id().to_string();
        for flag in [Signal::Cont.flag(), Signal::Term.flag()] {
            let _ = Command::new("kill")
                .args([flag, &pid])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        for _ in 0..polls(grace) {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return Stopped::Terminated;
            }
            std::thread::sleep(POLL);
        }
        let _ = child.kill();
        let _ = child.wait();
        Stopped::Killed
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(DROP_GRACE);
    }
}

/// How [`Process::stop`] ended the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It had already exited, or was stopped before.
    NotRunning,
    /// It exited on SIGTERM within the grace period.
    Terminated,
    /// It ignored SIGTERM for the whole grace period and was SIGKILLed.
    Killed,
}

/// How many [`POLL`] intervals fit in `limit` (at least one): the count bounds every wait.
fn polls(limit: Duration) -> u128 {
    (limit.as_millis() / POLL.as_millis()).max(1)
}

/// A process's state letter from `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z`, ...).
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may contain spaces; the state follows the last ')'.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The last few lines of a log, for error messages: whole lines only (the last
/// [`LOG_TAIL_BYTES`] cut one in the middle), unless the log is one long line.
fn log_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::from("(no log)");
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(LOG_TAIL_BYTES);
    let _ = file.seek(SeekFrom::Start(start));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    match text.split_once('\n') {
        Some((_cut, whole)) if start > 0 && !whole.trim().is_empty() => whole.to_owned(),
        _ => text.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TempDir;

    #[test]
    fn an_exited_process_is_reported_with_its_log() {
        let dir = TempDir::new("process-test").expect("scratch dir");
        let log = dir.path().join("sh.log");
        let args = vec!["-c".to_string(), "echo boom-marker; exit 3".to_string()];
        let mut p =
            Process::spawn("shell", Path::new("/bin/sh"), &args, Some(&log)).expect("spawn");
        let addr: SocketAddr = ([127, 0, 0, 1], crate::free_port()).into();
        let message = p
            .wait_for_listener(addr, Duration::from_secs(5))
            .expect_err("the shell exits and never listens")
            .to_string();
        assert!(message.contains("boom-marker"), "{message}");
        assert!(message.contains('3'), "{message}");
    }

    #[test]
    fn a_long_logs_tail_starts_at_a_whole_line() {
        let dir = TempDir::new("process-tail").expect("scratch dir");
        let log = dir.path().join("long.log");
        let line = "x".repeat(100);
        let text: String = (0..100).map(|i| format!("{i:03} {line}\n")).collect();
        std::fs::write(&log, &text).unwrap();
        let tail = log_tail(&log);
        assert!(tail.ends_with(&format!("099 {line}\n")), "{tail}");
        assert!(
            tail.lines().all(|l| l.len() == 104),
            "a line cut in the middle: {tail}"
        );
    }

    #[test]
    fn a_listener_that_never_comes_is_a_bounded_timeout() {
        let args = vec!["5".to_string()];
        let mut p = Process::spawn("sleeper", Path::new("/bin/sleep"), &args, None).expect("spawn");
        let addr: SocketAddr = ([127, 0, 0, 1], crate::free_port()).into();
        let err = p
            .wait_for_listener(addr, Duration::from_millis(200))
            .expect_err("nothing listens");
        assert!(matches!(err, Error::NotReady { .. }), "{err}");
        assert!(
            p.check_running().is_ok(),
            "a timeout leaves the process running"
        );
    }

    #[test]
    fn drop_stops_a_frozen_process_by_pid() {
        let args = vec!["60".to_string()];
        let p = Process::spawn("sleeper", Path::new("/bin/sleep"), &args, None).expect("spawn");
        let pid = p.pid().expect("pid");
        p.freeze(Duration::from_secs(5)).expect("frozen");
        assert_eq!(process_state(pid), Some('T'));
        drop(p);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} still exists after drop"
        );
    }
}
