//! The contract versions this berth implements, carried inside the binary:
//! every file of `wit/` (one folder per version, `berth-driver@VERSION/`,
//! each with its WASI `deps/`), indexed by `build.rs`.

use std::fs;
use std::io;
use std::path::Path;

/// Every file of `wit/`, as path relative to it and text.
const FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/wit_files.rs"));

/// The folder of one contract version under `wit/`.
const FOLDER: &str = "berth-driver@";

/// The contract versions carried, oldest first.
pub fn versions() -> Vec<&'static str> {
    let mut all: Vec<&str> = FILES
        .iter()
        .filter_map(|(rel, _)| rel.split('/').next()?.strip_prefix(FOLDER))
        .collect();
    all.sort_by_key(|v| semver(v));
    all.dedup();
    all
}

/// The version a new driver is written against: the newest.
pub fn newest() -> &'static str {
    versions().pop().expect("the binary carries a contract")
}

/// `major.minor.patch` as numbers, for ordering; a part that is no number
/// sorts first.
fn semver(v: &str) -> [u64; 3] {
    let mut parts = v.split('.').map(|p| p.parse().unwrap_or(0));
    [(); 3].map(|()| parts.next().unwrap_or(0))
}

/// The files of contract `version` (`driver.wit` and `deps/…`), as path
/// relative to the version's folder and text; `None` for a version this
/// berth does not carry.
pub fn files(version: &str) -> Option<Vec<(&'static str, &'static str)>> {
    let prefix = format!("{FOLDER}{version}/");
    let found: Vec<_> = FILES
        .iter()
        .filter_map(|(rel, text)| Some((rel.strip_prefix(&prefix)?, *text)))
        .collect();
    (!found.is_empty()).then_some(found)
}

/// Why [`write_wit`] wrote nothing, or not all.
#[derive(Debug, thiserror::Error)]
pub enum WitError {
    #[error("this berth carries no contract version {asked}; it carries {}", versions().join(", "))]
    Unknown { asked: String },
    #[error(transparent)]
    Write(#[from] io::Error),
}

/// Writes contract `version` (the newest if `None`) into `dir`: its
/// `driver.wit` and `deps/`, the layout every WIT toolchain reads as one
/// package with its dependencies. Returns the version and how many files.
pub fn write_wit(dir: &Path, version: Option<&str>) -> Result<(&'static str, usize), WitError> {
    let version = match version {
        None => newest(),
        Some(v) => versions()
            .into_iter()
            .find(|known| *known == v)
            .ok_or_else(|| WitError::Unknown {
                asked: v.to_owned(),
            })?,
    };
    let files = files(version).expect("a version carried has files");
    for (rel, text) in &files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, text)?;
    }
    Ok((version, files.len()))
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    /// The WASI 0.2.12 packages in the `deps/` of every released version.
    const WASI_DEPS: &[(&str, &str)] = &[
        (
            "deps/cli/cli.wit",
            "fb6ac5d23fcaf3d231142a3c2f9bb1e9bc1fe5af6f1f329f6b1a5555ce0d3873",
        ),
        (
            "deps/clocks/clocks.wit",
            "6ed8aa65bb8cbe224a0b2cbac9fc1b3bd25bdb17eda5ae0d23c983ed31c447cc",
        ),
        (
            "deps/filesystem/filesystem.wit",
            "e675f261017bf9b4fa7df5b9701023fe0249ede71021ac1bf978748e62edcda8",
        ),
        (
            "deps/http/http.wit",
            "4bbd58f509700a6637385611f183c5bd5984d81feef85e29dfdc05ebd283045a",
        ),
        (
            "deps/io/io.wit",
            "96e206d00076fa0480df32c5bcf255a3fa4862805ac2f6b8537a781cce54f433",
        ),
        (
            "deps/random/random.wit",
            "48578c40213d5cab6650980905fa146a0be8c39c4433ee5e7e00637b87dbe08f",
        ),
        (
            "deps/sockets/sockets.wit",
            "ad38dbf3b0bbdf34c0f2b608edcbfee04d71b443a63faff1f5e0053c3f84b377",
        ),
    ];

    /// The sha256 of each released version's own `driver.wit`, which never
    /// changes, nor do its `deps/` ([`WASI_DEPS`]): a change to the contract
    /// is a new version in a new folder (docs/writing-a-driver.md, "Contract
    /// versions").
    const RELEASED: &[(&str, &str)] = &[
        (
            "0.1.0",
            "cc24504d4232bb3b1e6bce59cb57ed55423cc74d885722df66ea87242321c166",
        ),
        (
            "0.2.0",
            "9ec296b76f42e3b5f47c5584bdbe16ec45a81ea19059bab1a9c347923eac4370",
        ),
    ];

    #[test]
    fn the_contract_is_carried_and_written_out_per_version() {
        assert_eq!(versions(), ["0.1.0", "0.2.0"]);
        assert_eq!(newest(), "0.2.0");
        // What is carried is what is bound, and the other way round.
        let bound: Vec<&str> = crate::Contract::ALL.iter().map(|c| c.version()).collect();
        assert_eq!(versions(), bound);
        assert_eq!(newest(), crate::Contract::NEWEST.version());
        let names: Vec<&str> = files("0.2.0").unwrap().iter().map(|(n, _)| *n).collect();
        assert!(names.contains(&"driver.wit"), "{names:?}");
        assert!(
            names.iter().any(|n| n.starts_with("deps/http/")),
            "{names:?}"
        );
        for (asked, version) in [(None, "0.2.0"), (Some("0.1.0"), "0.1.0")] {
            let dir = tempfile::tempdir().unwrap();
            let (wrote, count) = write_wit(dir.path(), asked).unwrap();
            assert_eq!(wrote, version);
            assert_eq!(count, files(version).unwrap().len());
            let written = fs::read_to_string(dir.path().join("driver.wit")).unwrap();
            assert!(written.contains(&format!("package berth:driver@{version};")));
            let source = format!(
                "{}/../../wit/berth-driver@{version}/driver.wit",
                env!("CARGO_MANIFEST_DIR")
            );
            assert_eq!(written, fs::read_to_string(source).unwrap());
        }
        let dir = tempfile::tempdir().unwrap();
        let e = write_wit(dir.path(), Some("0.9.0"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no contract version 0.9.0; it carries 0.1.0, 0.2.0"),
            "{e}"
        );
    }

    #[test]
    fn a_released_version_is_byte_for_byte_what_was_released() {
        for (version, driver_wit) in RELEASED {
            let mut pinned = WASI_DEPS.to_vec();
            pinned.push(("driver.wit", driver_wit));
            let mut found: Vec<(&str, String)> = files(version)
                .unwrap_or_default()
                .into_iter()
                .map(|(rel, text)| (rel, hex::encode(Sha256::digest(text))))
                .collect();
            found.sort();
            let pinned: Vec<(&str, String)> = pinned
                .iter()
                .map(|(rel, sum)| (*rel, (*sum).to_owned()))
                .collect();
            assert_eq!(
                found, pinned,
                "contract {version} changed: a released version is frozen; \
                 make the change in a new version's folder"
            );
        }
    }
}
