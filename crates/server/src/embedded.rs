//! The sim driver, carried inside the binary so that `berth serve` with no
//! config runs a working pool against the simulated cloud without a separate
//! driver build. `build.rs` builds it from `plugins/sim`; the service writes
//! it under its state directory with [`write_sim_driver`] and loads it like
//! any other driver, so nothing about loading or sandboxing is special to it.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The sim driver component (`plugins/sim` built for wasm32-wasip2 with the
/// `plugin` profile).
pub const SIM_DRIVER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sim.wasm"));

/// The file name [`write_sim_driver`] writes; a driver's name is its file
/// name without `.wasm`, so this one loads as `sim`.
pub const SIM_DRIVER_FILE: &str = "sim.wasm";

/// Hex sha256 of [`SIM_DRIVER`], the same digest a loaded driver reports.
pub fn sim_driver_sha256() -> String {
    hex::encode(Sha256::digest(SIM_DRIVER))
}

/// Writes [`SIM_DRIVER`] to `dir/sim.wasm`, creating `dir` if needed, and
/// returns that path.
///
/// A file that already holds the same bytes is left alone, so a restart
/// writes nothing. A missing or different one is written to a temporary file
/// and renamed into place, so another process loading it never sees half a
/// driver.
pub fn write_sim_driver(dir: &Path) -> io::Result<PathBuf> {
    let path = dir.join(SIM_DRIVER_FILE);
    if fs::read(&path).is_ok_and(|old| old == SIM_DRIVER) {
        return Ok(path);
    }
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{SIM_DRIVER_FILE}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(SIM_DRIVER)?;
        file.sync_all()?;
        fs::rename(&tmp, &path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map(|()| path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn sim_driver_is_a_component() {
        // `\0asm`, then the component-model version (0x0d) and layer (1).
        assert_eq!(
            &SIM_DRIVER[..8],
            b"\0asm\x0d\x00\x01\x00",
            "not a WebAssembly component"
        );
        assert_eq!(sim_driver_sha256().len(), 64);
    }

    #[test]
    fn write_sim_driver_writes_only_when_missing_or_different() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("drivers");

        // Missing: written, with the directory.
        let path = write_sim_driver(&dir).unwrap();
        assert_eq!(path, dir.join("sim.wasm"));
        assert_eq!(fs::read(&path).unwrap(), SIM_DRIVER);

        // Identical: left alone. The mtime is set far in the past first so
        // that a rewrite shows even on a file system with coarse timestamps.
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert_eq!(write_sim_driver(&dir).unwrap(), path);
        assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), old);

        // Different: replaced.
        fs::write(&path, b"\0asm not the sim driver").unwrap();
        assert_eq!(write_sim_driver(&dir).unwrap(), path);
        assert_eq!(fs::read(&path).unwrap(), SIM_DRIVER);

        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["sim.wasm"]);
    }
}
