//! Bounded readiness checks: poll until a check passes, a supervised process dies, or time is
//! up, whichever comes first.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::StackError;

/// Time between two checks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Polls `check` until it returns `Ok`, at most `timeout` long. Before each check `alive`
/// must pass (every supervised process still running), so a crash surfaces at once with its
/// log instead of as a timeout.
///
/// # Errors
/// [`StackError::Exited`] if a watched process exits, [`StackError::NotReady`] with the
/// last check's message on timeout.
pub async fn wait_until<F, Fut>(
    name: &str,
    timeout: Duration,
    alive: &mut dyn FnMut() -> Result<(), StackError>,
    run_dir: &Path,
    mut check: F,
) -> Result<(), StackError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    let deadline = started + timeout;
    // The deadline bounds the loop; the count is a second, independent bound.
    let max_polls = timeout.as_millis() / POLL_INTERVAL.as_millis() + 2;
    let mut last = String::from("not checked yet");
    for _ in 0..max_polls {
        alive()?;
        match tokio::time::timeout(POLL_INTERVAL * 10, check()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(detail)) => last = detail,
            Err(_) => last = "check timed out".to_string(),
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Err(StackError::NotReady {
        name: name.to_string(),
        waited_ms: started.elapsed().as_millis(),
        detail: last,
        run_dir: run_dir.to_path_buf(),
    })
}

/// Something must accept TCP connections on `addr`.
pub async fn tcp_open(addr: std::net::SocketAddr) -> Result<(), String> {
    tokio::net::TcpStream::connect(addr)
        .await
        .map(drop)
        .map_err(|e| format!("connect {addr}: {e}"))
}

/// `GET url` must answer 200.
pub async fn http_ok(client: &reqwest::Client, url: &str) -> Result<(), String> {
    match client.get(url).send().await {
        Ok(response) if response.status().is_success() => Ok(()),
        Ok(response) => Err(format!("GET {url}: {}", response.status())),
        Err(e) => Err(format!("GET {url}: {e}")),
    }
}
