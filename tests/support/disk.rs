//! Small file systems for disk-fault tests: a tmpfs of a given size,
//! mounted for the test and unmounted after it. Mounting needs root (and a
//! kernel that lets this process mount); elsewhere [`Tmpfs::mount`] says why
//! it cannot and the test skips itself.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs, unmounted when dropped.
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `"8m"`) at `path` (created if
    /// missing); `Err` says why it cannot be done here.
    pub fn mount(path: &Path, size: &str) -> Result<Tmpfs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { geteuid() } != 0 {
            return Err("not root, so no tmpfs can be mounted".into());
        }
        std::fs::create_dir_all(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(path)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            path: path.to_path_buf(),
        })
    }

    /// Makes the file system read-only (a remount), as a kernel does after
    /// an I/O error.
    pub fn read_only(&self) {
        let out = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.path)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "remounting {} read-only: {}",
            self.path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes a file until the file system is full; returns its size.
    pub fn fill(&self) -> u64 {
        let mut f = std::fs::File::create(self.path.join("filler")).expect("create the filler");
        let chunk = vec![0x5a_u8; 64 << 10];
        let mut written = 0;
        while f.write_all(&chunk).is_ok() {
            written += chunk.len() as u64;
        }
        // What a last partial write left may still fit byte by byte.
        while f.write_all(&[0x5a]).is_ok() {
            written += 1;
        }
        let _ = f.sync_all();
        written
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process of the test may still hold files open.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

unsafe extern "C" {
    fn geteuid() -> u32;
}

/// Prints why a test skips itself; the test then returns.
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}
