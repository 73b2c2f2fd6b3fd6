//! The `berth serve` binary as a user runs it: a child process on
//! 127.0.0.1:0, its log in a file, and plain HTTP/1.1 to talk to it.
//!
//! A test that fails while a [`Berth`] is alive, or that finds an exit status
//! it did not expect, prints the child's exit status and the tail of its log,
//! so a red run says why without a re-run.
//!
//! Every child runs with the probes' loopback-only switch set
//! ([`LOOPBACK_ONLY_ENV`]): a readiness probe of an address off this host is
//! refused and logged instead of sent, and the test that started the child
//! fails when it ends (unless it said it expects one), so no test of the
//! suite sends a packet off the machine.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use berth::client::Client;
use berth::client::types::{NewRequest, Request};
use berth::runtime::probe::{LOOPBACK_ONLY_ENV, OFF_HOST_REFUSED};

use super::config::OPS;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// Lines of the child's log shown when a test fails.
const TAIL_LINES: usize = 60;

/// A running `berth serve`, killed if still running when dropped.
pub struct Berth {
    child: Child,
    /// `http://127.0.0.1:PORT` (`https://` with TLS).
    pub base: String,
    /// Where the child's stderr (its log) goes.
    pub log: PathBuf,
    /// Set once the test has looked at the exit status itself.
    reported: bool,
    /// Whether the test makes a probe off this host refused on purpose.
    off_host_expected: bool,
}

/// How to start a [`Berth`].
pub struct Launch<'a> {
    pub args: &'a [&'a str],
    /// The child's working directory; its log file goes here too.
    pub dir: &'a Path,
    /// `BERTH_LOG`.
    pub level: &'a str,
    pub json: bool,
    pub env: &'a [(&'a str, &'a str)],
    /// The child's open-file limit (soft and hard), if not inherited.
    pub nofile: Option<u64>,
}

impl<'a> Launch<'a> {
    pub fn new(args: &'a [&'a str], dir: &'a Path) -> Launch<'a> {
        Launch {
            args,
            dir,
            level: "berth=info",
            json: false,
            env: &[],
            nofile: None,
        }
    }
}

impl Berth {
    /// `berth serve ARGS` in `dir`, logging at info; waits until it listens.
    pub async fn start(args: &[&str], dir: &Path) -> Berth {
        Self::launch(Launch::new(args, dir)).await
    }

    /// Starts the child and returns before it listens: for tests of what
    /// happens while it starts. [`Berth::listening`] waits for the rest.
    pub fn spawn(launch: Launch<'_>) -> Starting {
        static N: AtomicU32 = AtomicU32::new(0);
        let log = launch.dir.join(format!(
            "berth-serve-{}.log",
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::File::create(&log).expect("create the log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.arg("serve");
        if launch.json {
            cmd.args(["--log-format", "json"]);
        }
        cmd.args(launch.args)
            .current_dir(launch.dir)
            .env("BERTH_LOG", launch.level)
            .env(LOOPBACK_ONLY_ENV, "1")
            .stdout(Stdio::piped())
            .stderr(file)
            .kill_on_drop(true);
        for (k, v) in launch.env {
            cmd.env(k, v);
        }
        if let Some(n) = launch.nofile {
            super::sys::limit_open_files(&mut cmd, n);
        }
        let child = cmd.spawn().expect("spawn berth serve");
        Starting {
            berth: Berth {
                child,
                base: String::new(),
                log,
                reported: false,
                off_host_expected: false,
            },
        }
    }

    pub async fn launch(launch: Launch<'_>) -> Berth {
        Self::spawn(launch).listening().await
    }

    /// Waits (at most `secs`) until `/readyz` answers 200: every provider
    /// has been listed.
    pub async fn until_ready(&self, secs: u64, what: &str) {
        until(secs, what, || async {
            (self.call("GET", "/readyz", None, None).await.0 == 200).then_some(())
        })
        .await
    }

    /// Waits (at most `secs`) until `label` has `n` ready nodes, as the
    /// admin token sees them (or anyone, on a berth without tokens).
    pub async fn until_label_ready(&self, secs: u64, label: &str, n: u64, what: &str) {
        until(secs, what, || async {
            let (_, all) = self.call("GET", "/v1/labels", Some(OPS), None).await;
            let l = all.as_array()?.iter().find(|l| l["name"] == label)?;
            (l["ready"].as_u64() == Some(n)).then_some(())
        })
        .await
    }

    /// A client of this berth's API, as `token`.
    pub fn client(&self, token: &str) -> Client {
        Client::new(&self.base, Some(token.to_owned())).expect("a client")
    }

    /// `POST /v1/requests` for `labels` as `token`: the new request.
    pub async fn request(&self, token: &str, labels: &[(&str, u32)]) -> Request {
        let new = NewRequest {
            labels: labels.iter().map(|(l, n)| ((*l).to_owned(), *n)).collect(),
            ..Default::default()
        };
        let created = self.client(token).create_request(&new).await;
        created.unwrap_or_else(|e| panic!("creating a request for {labels:?}: {e}"))
    }

    /// Long-polls request `id` as `token` (30 s at most): the request, which
    /// must be fulfilled by then.
    pub async fn fulfilled(&self, token: &str, id: &str) -> Request {
        let wait = Some(Duration::from_secs(30));
        let r = self.client(token).request(id, wait).await;
        let r = r.unwrap_or_else(|e| panic!("request {id}: {e}"));
        assert_eq!(r.state, "fulfilled", "{r:?}");
        r
    }

    /// The process id, for signals.
    pub fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: i32) {
        use rustix::process::{Pid, Signal, kill_process};
        let pid = Pid::from_raw(self.pid()).expect("a child's pid");
        let signal = Signal::from_named_raw(signal).expect("a named signal");
        let _ = kill_process(pid, signal);
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        match self.try_call(method, path, token, body).await {
            Ok(answer) => answer,
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    /// The `/metrics` text, asked for with `token`.
    pub async fn metrics(&self, token: Option<&str>) -> String {
        let (status, m) = self.call("GET", "/metrics", token, None).await;
        assert_eq!(status, 200, "{m}");
        m.as_str().unwrap_or_default().to_owned()
    }

    /// As [`Berth::call`], with a failure to connect or read as an error
    /// (for tests where berth may be going away).
    pub async fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> std::io::Result<(u16, Value)> {
        // Bounded, so that a berth that stopped answering fails the test
        // instead of hanging it (long-polls in tests wait at most 60 s).
        let answer = tokio::time::timeout(
            Duration::from_secs(90),
            http(&self.base, method, path, token, body),
        )
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 90 s"))?;
        let (status, text) = answer?;
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, v))
    }

    /// SIGTERM, then the exit (within 60 s).
    pub async fn terminate(self) -> Exited {
        self.signal(SIGTERM);
        self.exit_within(Duration::from_secs(60)).await
    }

    /// Waits for the child to exit by itself within `limit`.
    pub async fn exit_within(mut self, limit: Duration) -> Exited {
        let status = match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.expect("wait for berth serve"),
            Err(_) => {
                self.reported = true;
                panic!(
                    "berth serve did not exit within {limit:?}\n{}",
                    tail(&self.log)
                )
            }
        };
        self.reported = true;
        if let Some(line) = self.probed_off_host() {
            panic!("berth probed an address off this host:\n{line}");
        }
        Exited {
            status,
            log: std::mem::take(&mut self.log),
        }
    }

    /// Says that this test makes berth refuse a probe off this host on
    /// purpose (see the module's doc).
    pub fn expect_off_host_probes(&mut self) {
        self.off_host_expected = true;
    }

    /// The first log line saying a probe off this host was refused, unless
    /// the test expects one.
    fn probed_off_host(&self) -> Option<String> {
        if self.off_host_expected {
            return None;
        }
        self.log_text()
            .lines()
            .find(|l| l.contains(OFF_HOST_REFUSED))
            .map(str::to_owned)
    }

    /// The child's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit status and log tail, for a failure message.
    pub fn report(&mut self) -> String {
        let status = match self.child.try_wait() {
            Ok(Some(s)) => format!("exited: {}", describe(s)),
            Ok(None) => "still running".to_owned(),
            Err(e) => format!("status unknown: {e}"),
        };
        format!("berth serve {status}\n{}", tail(&self.log))
    }
}

impl Drop for Berth {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if !self.reported {
                eprintln!("---- {}", self.report());
            }
        } else if !self.reported
            && let Some(line) = self.probed_off_host()
        {
            panic!("berth probed an address off this host:\n{line}");
        }
    }
}

/// A `berth serve` that has been spawned and may not listen yet.
pub struct Starting {
    berth: Berth,
}

impl Starting {
    /// Waits (up to 120 s) for the "listening" line on stdout.
    pub async fn listening(mut self) -> Berth {
        let stdout = self.berth.child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(Duration::from_secs(120), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("berth listening on ") {
                    return Some(url.to_owned());
                }
            }
            None
        })
        .await;
        let url = match addr {
            Ok(Some(url)) => url,
            Ok(None) => {
                // Give the exit status a moment to be there.
                let _ = tokio::time::timeout(Duration::from_secs(5), self.berth.child.wait()).await;
                panic!(
                    "berth serve exited before listening\n{}",
                    self.berth.report()
                )
            }
            Err(_) => panic!(
                "berth serve did not listen within 120 s\n{}",
                self.berth.report()
            ),
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.berth.base = url;
        self.berth
    }

    /// Waits (up to `secs`) until the log holds `needle`.
    pub async fn log_says(&self, needle: &str, secs: u64) {
        let end = tokio::time::Instant::now() + Duration::from_secs(secs);
        while !std::fs::read_to_string(&self.berth.log)
            .unwrap_or_default()
            .contains(needle)
        {
            assert!(
                tokio::time::Instant::now() < end,
                "no `{needle}` in the log within {secs} s\n{}",
                tail(&self.berth.log)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn signal(&self, signal: i32) {
        self.berth.signal(signal)
    }

    pub async fn exit_within(self, limit: Duration) -> Exited {
        self.berth.exit_within(limit).await
    }
}

/// How a `berth serve` ended.
pub struct Exited {
    pub status: ExitStatus,
    pub log: PathBuf,
}

impl Exited {
    /// Asserts the exit code, printing the status and log tail if it is
    /// another (or a signal).
    pub fn assert_code(&self, code: i32) {
        assert_eq!(
            self.status.code(),
            Some(code),
            "berth serve {}, expected exit code {code}\n{}",
            describe(self.status),
            tail(&self.log)
        );
    }

    pub fn assert_success(&self) {
        self.assert_code(0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => format!("{status}"),
    }
}

/// The last lines of a log file, for a failure message.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    format!(
        "---- last {} of {} log lines ({}):\n{}",
        lines.len() - from,
        lines.len(),
        path.display(),
        lines[from..].join("\n")
    )
}

pub const SIGTERM: i32 = 15;

/// One HTTP/1.1 request with `Connection: close`; the status and body.
pub async fn http(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> std::io::Result<(u16, String)> {
    http_with(base, method, path, token, &[], body).await
}

/// As [`http`], with `headers` (name, value) added.
pub async fn http_with(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> std::io::Result<(u16, String)> {
    let addr = base.strip_prefix("http://").expect("http url");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    http_raw(base, req.as_bytes()).await
}

/// Sends `request` as it is (it should ask for `Connection: close`) and
/// reads the answer to its end: the status and body.
pub async fn http_raw(base: &str, request: &[u8]) -> std::io::Result<(u16, String)> {
    let addr = base.strip_prefix("http://").expect("http url");
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(request).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let bad = |what: &str| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{what}: {text:?}"))
    };
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no response head"))?;
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// Polls `check` every 50 ms until it gives `Some` (at most `secs`).
pub async fn until<T, F: std::future::Future<Output = Option<T>>>(
    secs: u64,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(t) = check().await {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A one-shot `berth` command (`config check`, `driver test`, a client
/// command) and how it ended. Its `Display` is the exit status, stdout and
/// the tail of stderr, for a failure message.
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lines: Vec<&str> = self.stderr.lines().collect();
        let from = lines.len().saturating_sub(TAIL_LINES);
        write!(
            f,
            "berth {}\n---- stdout:\n{}\n---- last {} of {} stderr lines:\n{}",
            describe(self.status),
            self.stdout,
            lines.len() - from,
            lines.len(),
            lines[from..].join("\n")
        )
    }
}

/// Runs `berth ARGS` with `env` to its end.
pub async fn run_berth<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
    env: &[(&str, &std::ffi::OsStr)],
) -> Ran {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("run berth");
    Ran {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
