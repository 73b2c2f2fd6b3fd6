//! What is found in a config that has passed the check: what it allows
//! but should not ([`warnings`]), and the files it names that this machine
//! lacks ([`check_files`]).

use crate::inside::open_inside;
use crate::problem::Problem;
use crate::sandbox::AllowedHost;
use crate::settings::{Password, Settings};
use crate::walker::join;

/// What a checked config allows but should not have: allow-lists of two
/// providers that overlap (the same host and port, or a wildcard covering
/// the other's host). A driver that can reach another provider's cloud can
/// act on that provider's machines. Each is named at the later provider's
/// entry, with the earlier one's.
pub fn warnings(config: &Settings) -> Vec<Problem> {
    let providers: Vec<(&str, &[AllowedHost])> = (config.pool.providers.iter())
        .zip(&config.drivers)
        .map(|(p, d)| (p.name.as_str(), d.allowed_hosts.as_slice()))
        .collect();
    let mut out = Vec::new();
    for (i, (earlier, theirs)) in providers.iter().enumerate() {
        for (later, mine) in &providers[i + 1..] {
            for (m, host) in mine.iter().enumerate() {
                for (t, other) in theirs.iter().enumerate() {
                    if host.overlaps(other) {
                        out.push(Problem {
                            path: format!(
                                "{}[{m}]",
                                join(&join("providers", later), "allow-hosts")
                            ),
                            message: format!(
                                "`{host}` overlaps `{other}` of provider {earlier} \
                                 ({}[{t}]): the drivers of providers {earlier} and {later} \
                                 can both reach that host, so each could act on the other's \
                                 machines; providers' allow-lists must not overlap",
                                join(&join("providers", earlier), "allow-hosts")
                            ),
                            location: None,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The sha256 of the file at `path`, in lowercase hex, as `sha256sum`
/// prints it.
pub fn file_sha256(path: &std::path::Path) -> std::io::Result<String> {
    reader_sha256(std::fs::File::open(path)?)
}

/// The sha256 of what `reader` reads, streamed (a large file is not held
/// in memory).
fn reader_sha256(mut reader: impl std::io::Read) -> std::io::Result<String> {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut reader, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Problems a checked config has on this machine: driver files missing,
/// not regular files, outside the plugins directory (through a symlink) or
/// not the bytes `driver-sha256` pins, the store's password file or
/// credentials' files missing.
pub fn check_files(config: &Settings) -> Vec<Problem> {
    let mut problems = Vec::new();
    let store_files = config.store.postgres.iter().flat_map(|pg| {
        let password = match &pg.password {
            Some(Password::File(file)) => Some(("store.password-file", file)),
            _ => None,
        };
        password
            .into_iter()
            .chain(pg.ca_file.iter().map(|f| ("store.ca-file", f)))
    });
    let tls_files = config.api.tls.iter().flat_map(|t| {
        [("api.tls-cert", &t.cert), ("api.tls-key", &t.key)]
            .into_iter()
            .chain(t.peer_ca.iter().map(|f| ("api.tls-peer-ca", f)))
    });
    for (path, file) in store_files.chain(tls_files) {
        if let Err(e) = std::fs::File::open(file) {
            problems.push(Problem {
                path: path.into(),
                message: format!("cannot read {}: {e}", file.display()),
                location: None,
            });
        }
    }
    for (p, d) in config.pool.providers.iter().zip(&config.drivers) {
        for (i, c) in d.credentials.iter().enumerate() {
            for (key, file) in c.auth.files() {
                if let Err(e) = std::fs::File::open(file) {
                    problems.push(Problem {
                        path: join(
                            &format!("{}[{i}]", join(&join("providers", &p.name), "credentials")),
                            key,
                        ),
                        message: format!("cannot read {}: {e}", file.display()),
                        location: None,
                    });
                }
            }
        }
        // Opened as the runtime opens it: inside the plugins directory.
        let file = match open_inside(&d.plugins_dir, &d.driver_name) {
            Ok(file) => file,
            Err(e) => {
                problems.push(Problem {
                    path: join(&join("providers", &p.name), "driver"),
                    message: e.to_string(),
                    location: None,
                });
                continue;
            }
        };
        if let Some(pin) = &d.driver_sha256 {
            let shown = d.driver.display();
            let message = match reader_sha256(file) {
                Ok(got) if got == *pin => continue,
                Ok(got) => format!("{shown} has sha256 {got}, not the {pin} pinned here; refused"),
                Err(e) => format!("cannot read {shown} to check its sha256: {e}"),
            };
            problems.push(Problem {
                path: join(&join("providers", &p.name), "driver-sha256"),
                message,
                location: None,
            });
        }
    }
    problems
}
