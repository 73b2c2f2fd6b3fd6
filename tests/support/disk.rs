//! Small file systems for disk-fault tests: a tmpfs of a given size, and an
//! ext4 file system on a loop device whose backing image can be copied as a
//! power loss would leave it, each mounted for the test and unmounted after
//! it. Mounting needs root (and a kernel that lets this process mount);
//! elsewhere [`Tmpfs::mount`] and [`LoopFs::create`] say why it cannot be
//! done and the test skips itself.

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
        root("no tmpfs can be mounted")?;
        let options = format!("size={size},mode=0755");
        mount(path, &["-t", "tmpfs", "-o", &options, "tmpfs"])?;
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

/// An ext4 file system in an image file, mounted through a loop device;
/// unmounted when dropped.
///
/// What a process has written but not synced is in the page cache of the
/// file system on top, not yet in the image; what it has synced went
/// through the loop device into the image. So a copy of the image taken at
/// any moment ([`LoopFs::power_cut`]) holds what the disk would hold after a
/// power loss at that moment.
pub struct LoopFs {
    image: PathBuf,
    path: PathBuf,
}

impl LoopFs {
    /// Makes an ext4 image of `mib` MiB at `image` and mounts it at `path`.
    pub fn create(image: &Path, path: &Path, mib: u64) -> Result<LoopFs, String> {
        root("no loop device can be mounted")?;
        let f = std::fs::File::create(image).map_err(|e| format!("creating the image: {e}"))?;
        f.set_len(mib << 20)
            .map_err(|e| format!("sizing the image: {e}"))?;
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image))?;
        Self::mount(image, path)
    }

    /// Mounts an existing image (a copy made by [`LoopFs::power_cut`]): the
    /// kernel replays its journal as after a crash.
    pub fn mount(image: &Path, path: &Path) -> Result<LoopFs, String> {
        let image_arg = image.to_string_lossy();
        mount(path, &["-t", "ext4", "-o", "loop", &image_arg])?;
        Ok(LoopFs {
            image: image.to_path_buf(),
            path: path.to_path_buf(),
        })
    }

    /// Copies the image as it is on the "disk" now, to `to`.
    pub fn power_cut(&self, to: &Path) {
        run(Command::new("cp")
            .arg("--sparse=always")
            .arg(&self.image)
            .arg(to))
        .unwrap_or_else(|e| panic!("copying {}: {e}", self.image.display()));
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if Command::new("umount")
            .arg(&self.path)
            .status()
            .map_or(true, |s| !s.success())
        {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

/// Runs a command to its end; `Err` says how it failed.
/// Refuses unless this process is root: `why` says what cannot be done.
fn root(why: &str) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err(format!("not root, so {why}"));
    }
    Ok(())
}

/// `mount ARGS PATH`, creating `path` first.
fn mount(path: &Path, args: &[&str]) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    run(Command::new("mount").args(args).arg(path))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .output()
        .map_err(|e| format!("running {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Prints why a test skips itself; the test then returns.
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}
