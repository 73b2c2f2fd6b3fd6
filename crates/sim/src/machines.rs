//! Instances that can be reached: with the `ssh_target` knob, each new
//! instance gets a port of its own on 127.0.0.1, which it reports as its
//! address and SSH port. Until the instance has booted and
//! `ssh_accept_delay_ms` more has passed, the port is bound but not
//! listening, so a connection is refused, as by a machine whose SSH server
//! has not started; from then on each connection is passed through to the
//! real server at `ssh_target`. Deleting the instance closes its port.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};
use tokio::task::AbortHandle;

use super::state::Endpoint;

/// The reachable instances, by instance number.
#[derive(Default)]
pub(crate) struct Machines {
    open: Mutex<HashMap<u64, AbortHandle>>,
}

/// A port taken for an instance about to be created.
pub(crate) struct Port {
    socket: TcpSocket,
    pub endpoint: Endpoint,
}

impl Port {
    /// A port of its own on 127.0.0.1, bound and not listening.
    pub(crate) fn take() -> std::io::Result<Port> {
        let socket = TcpSocket::new_v4()?;
        socket.bind("127.0.0.1:0".parse().expect("an address"))?;
        let port = socket.local_addr()?.port();
        Ok(Port {
            socket,
            endpoint: Endpoint {
                address: "127.0.0.1".into(),
                port,
            },
        })
    }
}

impl Machines {
    /// Instance `id`'s machine: `port` starts accepting after `after`, and
    /// passes every connection on to `target`.
    pub(crate) fn start(&self, id: u64, port: Port, after: Duration, target: String) {
        let task = tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let Ok(listener) = port.socket.listen(1024) else {
                return;
            };
            while let Ok((conn, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(mut upstream) = TcpStream::connect(&target).await {
                        let mut conn = conn;
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                    }
                });
            }
        });
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = open.insert(id, task.abort_handle()) {
            old.abort();
        }
    }

    /// Closes instance `id`'s port, if it has one.
    pub(crate) fn stop(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = open.remove(&id) {
            task.abort();
        }
    }

    /// Closes every port.
    pub(crate) fn stop_all(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for (_, task) in open.drain() {
            task.abort();
        }
    }
}

impl Drop for Machines {
    fn drop(&mut self) {
        self.stop_all();
    }
}
