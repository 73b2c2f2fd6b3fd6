//! Telling systemd how `berth serve` is doing (`Type=notify`, through
//! `sd-notify`): `READY=1` once the API listens, `STOPPING=1` when a stop
//! begins, and, with `WatchdogSec=`, `WATCHDOG=1` every half of it while
//! the pool's task takes commands (a task stuck on something that never
//! ends stops the pings, and systemd restarts berth). Nothing is sent
//! without `NOTIFY_SOCKET`.

use crate::runtime::Handle;

/// The API listens at `url`: berth is ready.
pub(super) fn ready(url: &str) {
    let status = format!("listening on {url}");
    send(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status),
    ]);
}

/// A stop has begun.
pub(super) fn stopping() {
    send(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping"),
    ]);
}

fn send(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(%error, "could not notify the service manager (NOTIFY_SOCKET)");
    }
}

/// With `WatchdogSec=` (`WATCHDOG_USEC` for this process): pings every
/// half of it, each once the pool's task has taken a command in that time.
pub(super) fn watchdog(handle: Handle) -> Option<tokio::task::JoinHandle<()>> {
    let every = sd_notify::watchdog_enabled()? / 2;
    tracing::info!(
        every_ms = every.as_millis() as u64,
        "pinging the service manager's watchdog"
    );
    Some(tokio::spawn(async move {
        loop {
            let started = tokio::time::Instant::now();
            // Answered or refused, the task took the command: it runs.
            if tokio::time::timeout(every, handle.inspect(|_| ()))
                .await
                .is_ok()
            {
                send(&[sd_notify::NotifyState::Watchdog]);
            }
            tokio::time::sleep_until(started + every).await;
        }
    }))
}
