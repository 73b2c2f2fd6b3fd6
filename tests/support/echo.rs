//! Two small HTTP servers on 127.0.0.1:0 for the credential tests: one
//! that echoes each request it gets back to its sender, as debugging
//! endpoints and some error pages do, and one that records every request
//! sent to it. Each serves until dropped.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Echoes every request: its `authorization` header in a response header,
/// and the whole request head in the body as it came, in base64 (standard
/// and URL-safe), percent-encoded, and as a JSON string. The body is sent in
/// two writes a moment apart, split inside the first `authorization`
/// value, so that it reaches the reader in two pieces. Two paths answer
/// otherwise: `/unauthorized` echoes with status `401`, and
/// `/redirect/HOST:PORT/PATH` answers `302` to `http://HOST:PORT/PATH`.
pub struct Echo {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Echo {
    pub async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(echo(s));
            }
        });
        Echo { addr, task }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo(mut s: TcpStream) {
    let Some((head, _)) = read_request(&mut s).await else {
        return;
    };
    let auth = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("authorization")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    let percent: String = head
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let body = format!(
        "{head}\n{}\n{}\n{percent}\n{}\n",
        STANDARD.encode(&head),
        URL_SAFE_NO_PAD.encode(&head),
        serde_json::json!({ "authorization": auth })
            .to_string()
            .replace('/', "\\/"),
    );
    let path = head.split(' ').nth(1).unwrap_or("/");
    let (status, location) = match path.strip_prefix("/redirect/") {
        Some(to) => ("302 Found", format!("location: http://{to}\r\n")),
        None if path == "/unauthorized" => ("401 Unauthorized", String::new()),
        None => ("200 OK", String::new()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nx-echo-authorization: {auth}\r\n\
         {location}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let split = response
        .rfind("\r\n\r\n")
        .and_then(|end| {
            response[end..]
                .find(&auth[auth.len() / 2..])
                .map(|at| end + at)
        })
        .unwrap_or(response.len());
    let _ = s.set_nodelay(true);
    if s.write_all(&response.as_bytes()[..split]).await.is_err() {
        return;
    }
    // The reader has the first piece before the second is sent.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = s.write_all(&response.as_bytes()[split..]).await;
    let _ = s.shutdown().await;
}

/// Records every request sent to it (head and body, as text) and answers
/// `200`.
pub struct Recorder {
    pub addr: SocketAddr,
    seen: Arc<Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(String::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    if let Some((head, body)) = read_request(&mut s).await {
                        let mut seen = record.lock().unwrap();
                        seen.push_str(&head);
                        seen.push_str(&String::from_utf8_lossy(&body));
                        seen.push('\n');
                    }
                    let answer =
                        "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                    let _ = s.write_all(answer.as_bytes()).await;
                });
            }
        });
        Recorder { addr, seen, task }
    }

    /// Everything received so far.
    pub fn received(&self) -> String {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request's head (up to its blank line) and its body, as long as its
/// `content-length` says.
async fn read_request(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = s.read(&mut buf).await.ok().filter(|n| *n > 0)?;
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = raw[end..].to_vec();
    while body.len() < length {
        let n = s.read(&mut buf).await.ok().filter(|n| *n > 0)?;
        body.extend_from_slice(&buf[..n]);
    }
    Some((head, body))
}
