//! A fault-injecting proxy between a driver and the sim cloud, on
//! 127.0.0.1:0: it relays every request as it came, except the lists
//! (`GET /v1/instances`), which it answers wrongly while a fault is armed.
//! One request per connection (the host's HTTP client opens one for each).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a list gets while a fault is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListFault {
    /// One `200` with no instances, then relayed again.
    EmptyOnce,
    /// `200` with no instances.
    Empty,
    /// The first page only: relayed, its `next_page_token` dropped.
    Truncated,
    /// `500` with an error body.
    Status500,
    /// `200` with a body that is not JSON.
    Malformed,
    /// No answer at all; the connection stays open until the caller gives up.
    Hang,
    /// The connection is reset before any answer.
    Reset,
    /// Every page after the first (asked with a `page_token`) answers `500`;
    /// first pages are relayed.
    LaterPages500,
    /// `200` with no instances and a page token after it, a new one each
    /// time: a list that never ends.
    EndlessPages,
    /// `200` with no instances and a page token of 5,000 bytes.
    HugeCursor,
}

pub struct FaultProxy {
    addr: SocketAddr,
    /// Plain mutex: held to read or swap the fault, never across an await.
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct State {
    fault: Option<ListFault>,
    lists: u64,
    faulted: u64,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, upstream, shared.clone()));
            }
        });
        FaultProxy { addr, state, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Lists get `fault` from now on (or relayed, with `None`).
    pub fn arm(&self, fault: Option<ListFault>) {
        self.state.lock().expect("proxy").fault = fault;
    }

    /// Lists seen so far, and how many of them were answered wrongly.
    pub fn lists(&self) -> (u64, u64) {
        let s = self.state.lock().expect("proxy");
        (s.lists, s.faulted)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut client: TcpStream, upstream: SocketAddr, state: Arc<Mutex<State>>) {
    let Some((head, body)) = read_request(&mut client).await else {
        return;
    };
    let is_list = head.starts_with("GET /v1/instances");
    let first_line = head.lines().next().unwrap_or_default();
    let later_page = first_line.contains("page_token=");
    let fault = if is_list {
        let mut s = state.lock().expect("proxy");
        s.lists += 1;
        let fault = (s.fault).filter(|f| *f != ListFault::LaterPages500 || later_page);
        if fault.is_some() {
            s.faulted += 1;
        }
        if fault == Some(ListFault::EmptyOnce) {
            s.fault = None;
        }
        fault
    } else {
        None
    };
    let empty = r#"{"instances":[],"next_page_token":null}"#;
    match fault {
        None => {
            if let Some(answer) = relay(upstream, &head, &body).await {
                let _ = client.write_all(&answer).await;
            }
        }
        Some(ListFault::EmptyOnce | ListFault::Empty) => {
            let _ = client.write_all(&response(200, empty)).await;
        }
        Some(ListFault::Truncated) => {
            let Some(answer) = relay(upstream, &head, &body).await else {
                return;
            };
            let _ = client.write_all(&first_page_only(&answer)).await;
        }
        Some(ListFault::Status500 | ListFault::LaterPages500) => {
            let body = r#"{"error":{"code":"internal","message":"injected by the proxy"}}"#;
            let _ = client.write_all(&response(500, body)).await;
        }
        Some(ListFault::EndlessPages) => {
            let n = state.lock().expect("proxy").faulted;
            let page = format!(r#"{{"instances":[],"next_page_token":"endless-{n}"}}"#);
            let _ = client.write_all(&response(200, &page)).await;
        }
        Some(ListFault::HugeCursor) => {
            let cursor = "c".repeat(5_000);
            let page = format!(r#"{{"instances":[],"next_page_token":"{cursor}"}}"#);
            let _ = client.write_all(&response(200, &page)).await;
        }
        Some(ListFault::Malformed) => {
            let _ = client
                .write_all(&response(200, r#"{"instances": [{"id""#))
                .await;
        }
        Some(ListFault::Hang) => {
            // Until the caller hangs up.
            let mut buf = [0u8; 256];
            while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {}
        }
        Some(ListFault::Reset) => {
            let _ = client.set_zero_linger();
            drop(client);
        }
    }
}

/// One request: its head (with `Connection: close` put in) and body.
async fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let head: String = head
        .trim_end()
        .lines()
        .filter(|l| {
            !l.split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"))
        })
        .map(|l| format!("{l}\r\n"))
        .collect::<String>()
        + "Connection: close\r\n\r\n";
    Some((head, body))
}

/// Sends the request upstream; the whole answer, as bytes.
async fn relay(upstream: SocketAddr, head: &str, body: &[u8]) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(upstream).await.ok()?;
    s.write_all(head.as_bytes()).await.ok()?;
    s.write_all(body).await.ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.ok()?;
    Some(answer)
}

fn response(status: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The same answer, as if there were no page after it.
fn first_page_only(answer: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return answer.to_vec();
    };
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(502);
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(mut page) => {
            page["next_page_token"] = serde_json::Value::Null;
            response(status, &page.to_string())
        }
        Err(_) => answer.to_vec(),
    }
}
