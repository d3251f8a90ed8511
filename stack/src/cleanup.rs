//! Stopping every stack process when the parent is interrupted.
//!
//! `Drop` covers normal exits and panics, but SIGINT/SIGTERM/SIGHUP/SIGQUIT end a process
//! without running destructors. [`stop_children_on_signal`] installs, once per process, a
//! watcher that stops every child any [`crate::Stack`] of this process still runs, then
//! exits. It runs on its own thread and runtime so it outlives whichever test or runtime
//! installed it (a watcher tied to a dropped runtime would leave the signal swallowed and
//! ignored).
//! Binaries with their own shutdown (like `switchyard-local`) leave it off and drop the
//! stack themselves.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use switchyard_support::process::process_state;

/// PIDs of every child a stack of this process has started and not yet stopped.
fn live() -> &'static Mutex<BTreeSet<u32>> {
    static LIVE: OnceLock<Mutex<BTreeSet<u32>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(BTreeSet::new()))
}

/// Records a started child.
pub(crate) fn register(pid: u32) {
    if let Ok(mut set) = live().lock() {
        set.insert(pid);
    }
}

/// Forgets a stopped child.
pub(crate) fn unregister(pid: u32) {
    if let Ok(mut set) = live().lock() {
        set.remove(&pid);
    }
}

/// What the watcher says on stderr before it exits (what the interrupted work left behind).
fn note() -> &'static Mutex<Option<String>> {
    static NOTE: OnceLock<Mutex<Option<String>>> = OnceLock::new();
    NOTE.get_or_init(|| Mutex::new(None))
}

/// Sets what the watcher says when a signal ends the process (e.g. which results are
/// incomplete).
pub fn say_on_signal(text: impl Into<String>) {
    if let Ok(mut note) = note().lock() {
        *note = Some(text.into());
    }
}

/// Installs the watcher (idempotent). On SIGINT, SIGTERM, SIGHUP (a closed terminal) or
/// SIGQUIT it sends SIGTERM to every live child, gives them up to two seconds, SIGKILLs the
/// rest, says what [`say_on_signal`] set and exits with 130, 143, 129 or 131. Children must
/// not outlive a closed terminal: nats-server takes SIGHUP for "reload" and would run on.
pub fn stop_children_on_signal() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("switchyard-stack-signals".into())
            .spawn(watch_signals);
        if let Err(e) = spawned {
            tracing::warn!("cannot start the signal watcher: {e}");
        }
    });
}

fn watch_signals() {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!("cannot build the signal watcher's runtime: {e}");
            return;
        }
    };
    let code = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term), Ok(mut hup), Ok(mut quit)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
            // Ctrl-\: the stack's processes are in groups of their own, so it reaches this
            // process alone; unhandled, it left them running.
            signal(SignalKind::quit()),
        ) else {
            tracing::warn!("cannot watch SIGINT/SIGTERM/SIGHUP/SIGQUIT");
            return None;
        };
        tokio::select! {
            _ = int.recv() => Some(130),
            _ = term.recv() => Some(143),
            _ = hup.recv() => Some(129),
            _ = quit.recv() => Some(131),
        }
    });
    if let Some(code) = code {
        stop_all_live();
        if let Some(text) = note().lock().ok().and_then(|n| n.clone()) {
            switchyard_support::errln!("{text}");
        }
        std::process::exit(code);
    }
}

fn stop_all_live() {
    let pids: Vec<u32> = live()
        .lock()
        .map(|set| set.iter().copied().collect())
        .unwrap_or_default();
    let send = |flag: &str, pid: u32| {
        let _ = Command::new("kill").args([flag, &pid.to_string()]).status();
    };
    for &pid in &pids {
        send("-CONT", pid);
        send("-TERM", pid);
    }
    // Children stay zombies (state Z) until reaped; exited counts as stopped.
    let running = |pid: u32| process_state(pid).is_some_and(|s| s != 'Z');
    for _ in 0..100 {
        if !pids.iter().any(|&pid| running(pid)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for &pid in pids.iter().filter(|&&pid| running(pid)) {
        send("-KILL", pid);
    }
}
