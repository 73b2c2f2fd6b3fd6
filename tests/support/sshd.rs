//! A real OpenSSH server for readiness tests: Debian's `sshd`
//! (`scripts/setup tests` installs it), run unprivileged on 127.0.0.1 at a
//! free port, with host keys of its own (ed25519, ECDSA and RSA) in a
//! temporary directory. As root it runs as `nobody`. It is killed when the
//! [`Sshd`] is dropped, and when the thread that started it ends.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian installs the server.
pub const SSHD: &str = "/usr/sbin/sshd";

/// A running `sshd`.
pub struct Sshd {
    child: std::process::Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// `(uid, gid)` to run the server as: `nobody` when this process is root.
fn unprivileged() -> Option<(u32, u32)> {
    if !rustix::process::getuid().is_root() {
        return None;
    }
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("reading the user database")
        .expect("no user `nobody` to run sshd as");
    Some((nobody.uid.as_raw(), nobody.gid.as_raw()))
}

impl Sshd {
    /// Starts a server and waits until it sends its banner.
    pub fn start() -> Sshd {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: run `scripts/setup tests` (it installs Debian's openssh-server)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let user = unprivileged();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut keys = Vec::new();
        for (kind, bits) in [
            ("ed25519", None),
            ("ecdsa", Some("256")),
            ("rsa", Some("2048")),
        ] {
            let key = dir.path().join(format!("ssh_host_{kind}_key"));
            let mut cmd = Command::new("ssh-keygen");
            cmd.args(["-q", "-N", "", "-C", "", "-t", kind, "-f"])
                .arg(&key);
            if let Some(b) = bits {
                cmd.args(["-b", b]);
            }
            let out = cmd.output().expect("ssh-keygen runs");
            assert!(out.status.success(), "ssh-keygen: {out:?}");
            if let Some((uid, gid)) = user {
                std::os::unix::fs::chown(&key, Some(uid), Some(gid)).unwrap();
            }
            keys.push(key);
        }
        for _ in 0..10 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let config = dir.path().join("sshd_config");
            let host_keys: String = keys
                .iter()
                .map(|k| format!("HostKey {}\n", k.display()))
                .collect();
            std::fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\n{host_keys}PidFile {pid}\n\
                     UsePAM no\nStrictModes no\nMaxStartups 1000\nLogLevel ERROR\n\
                     PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                     AuthorizedKeysFile none\n",
                    pid = dir.path().join("sshd.pid").display()
                ),
            )
            .unwrap();
            let mut cmd = Command::new(SSHD);
            cmd.args(["-D", "-e", "-f"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = user {
                // As root, std also drops the supplementary groups.
                use std::os::unix::process::CommandExt;
                cmd.uid(uid).gid(gid);
            }
            super::sys::kill_with_parent(&mut cmd);
            let mut child = cmd.spawn().expect("sshd starts");
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if banner(addr).is_some() {
                    return Sshd {
                        child,
                        addr,
                        _dir: dir,
                    };
                }
                if child.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: another one
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("sshd did not start on 127.0.0.1 (run it by hand with -d to see why)");
    }

    /// What `ssh-keyscan` prints of this server's host keys, as
    /// `TYPE BASE64` lines, sorted.
    pub fn keyscan(&self) -> Vec<String> {
        let out = Command::new("ssh-keyscan")
            .args(["-T", "5", "-p", &self.addr.port().to_string(), "127.0.0.1"])
            .output()
            .expect("ssh-keyscan runs");
        let mut keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3).then(|| format!("{} {}", f[1], f[2]))
            })
            .collect();
        keys.sort();
        keys
    }
}

/// The server's first line, if it sends one within a second.
pub fn banner(addr: SocketAddr) -> Option<String> {
    use std::io::BufRead;
    let conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut line = String::new();
    std::io::BufReader::new(conn).read_line(&mut line).ok()?;
    line.starts_with("SSH-").then_some(line)
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
