//! berth's Debian package (`scripts/package`, cargo-deb), built from the
//! binary these tests run: what it holds, its unit as systemd reads it,
//! and, where the tests run as root, installed with dpkg and purged again.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `scripts/package` of the dev build these tests run: the package's path.
fn package() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (ok, out, err) = run(Command::new(root.join("scripts/package"))
        .arg("--built")
        .env("BERTH_PACKAGE_PROFILE", "dev"));
    assert!(ok, "scripts/package failed:\n{out}\n{err}");
    PathBuf::from(out.lines().last().expect("the package's path").trim())
}

/// Whether `tool --version` runs here.
fn present(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn installed(name: &str) -> bool {
    run(Command::new("dpkg-query").args(["-W", "-f", "${Status}", name]))
        .1
        .contains("install ok installed")
}

#[test]
fn the_debian_package_holds_berth_its_drivers_unit_config_and_manual_and_installs() {
    if !present("dpkg-deb") {
        eprintln!("skipped: dpkg-deb is not installed here");
        return;
    }
    let deb = package();
    let (_, fields, _) = run(Command::new("dpkg-deb").args(["-f"]).arg(&deb));
    for field in [
        "Package: berth",
        "Section: admin",
        "Depends: adduser, libc6",
    ] {
        assert!(fields.contains(field), "{field}: {fields}");
    }
    let (_, list, _) = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let entry = |path: &str| -> Option<String> {
        list.lines()
            .find(|l| l.ends_with(&format!(" .{path}")))
            .map(|l| l.split_whitespace().next().unwrap_or("").to_owned())
    };
    for (path, mode) in [
        ("/usr/bin/berth", "-rwxr-xr-x"),
        ("/usr/lib/systemd/system/berth.service", "-rw-r--r--"),
        ("/etc/berth/berth.toml", "-rw-r-----"),
        ("/usr/lib/berth/drivers/aws-ec2.wasm", "-rw-r--r--"),
        ("/usr/lib/berth/drivers/gce.wasm", "-rw-r--r--"),
        ("/usr/lib/berth/drivers/openstack.wasm", "-rw-r--r--"),
        ("/usr/lib/berth/drivers/hetzner.wasm", "-rw-r--r--"),
        ("/usr/lib/berth/drivers/azure.wasm", "-rw-r--r--"),
        ("/usr/lib/berth/drivers/static.wasm", "-rw-r--r--"),
        ("/usr/share/bash-completion/completions/berth", "-rw-r--r--"),
        ("/usr/share/zsh/vendor-completions/_berth", "-rw-r--r--"),
        (
            "/usr/share/fish/vendor_completions.d/berth.fish",
            "-rw-r--r--",
        ),
        ("/usr/share/man/man1/berth.1.gz", "-rw-r--r--"),
        ("/usr/share/man/man1/berth-serve.1.gz", "-rw-r--r--"),
        ("/usr/share/doc/berth/operations.md", "-rw-r--r--"),
        ("/usr/share/doc/berth/examples/gce.toml", "-rw-r--r--"),
    ] {
        assert_eq!(entry(path).as_deref(), Some(mode), "{path} in:\n{list}");
    }
    // The unit and the binary as the package has them, as systemd reads
    // them.
    let root = tempfile::tempdir().unwrap();
    assert!(
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(root.path()))
        .0
    );
    let berth = root.path().join("usr/bin/berth");
    let (ok, version, _) = run(Command::new(&berth).arg("--version"));
    assert!(ok && version.starts_with("berth "), "{version}");
    let config = root.path().join("etc/berth/berth.toml");
    let (ok, said, _) = run(Command::new(&berth).args(["config", "check"]).arg(&config));
    assert!(ok, "the packaged config: {said}");
    if present("systemd-analyze") {
        let unit = root.path().join("usr/lib/systemd/system/berth.service");
        let text = std::fs::read_to_string(&unit).unwrap();
        let here = root.path().join("berth.service");
        std::fs::write(
            &here,
            text.replace("/usr/bin/berth", &berth.display().to_string()),
        )
        .unwrap();
        let (ok, out, err) = run(Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&here));
        assert!(ok && (out.clone() + &err).trim().is_empty(), "{out}{err}");
    } else {
        eprintln!("systemd-analyze is not installed here: the packaged unit is not verified");
    }

    install_and_purge(&deb);
}

/// `dpkg -i`, then `dpkg --purge`: the user, the config's owner and modes,
/// the binary and drivers in place, and what a purge keeps. Only as root,
/// and never over a berth package this machine already has.
fn install_and_purge(deb: &Path) {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: installing the package needs root");
        return;
    }
    if installed("berth") {
        eprintln!("skipped: a berth package is installed here already, and is left alone");
        return;
    }
    let user_before = run(Command::new("getent").args(["passwd", "berth"])).0;
    let (ok, out, err) = run(Command::new("dpkg").arg("-i").arg(deb));
    // Purged whatever the checks below find.
    struct Purge(bool);
    impl Drop for Purge {
        fn drop(&mut self) {
            let _ = Command::new("dpkg").args(["--purge", "berth"]).output();
            if !self.0 {
                let _ = Command::new("deluser").args(["--system", "berth"]).output();
            }
        }
    }
    let _purge = Purge(user_before);
    assert!(ok, "dpkg -i:\n{out}\n{err}");
    assert!(installed("berth"));
    let (ok, passwd, _) = run(Command::new("getent").args(["passwd", "berth"]));
    assert!(ok, "no berth user");
    assert!(
        passwd
            .trim_end()
            .ends_with(":/var/lib/berth:/usr/sbin/nologin"),
        "{passwd}"
    );
    let (_, owner, _) = run(Command::new("stat")
        .args(["-c", "%U:%G %a"])
        .args(["/etc/berth", "/etc/berth/berth.toml"]));
    assert_eq!(owner, "root:berth 750\nroot:berth 640\n");
    let (ok, said, _) =
        run(Command::new("/usr/bin/berth").args(["config", "check", "/etc/berth/berth.toml"]));
    assert!(ok, "{said}");
    let (ok, said, err) = run(Command::new("/usr/bin/berth").args([
        "driver",
        "check",
        "/usr/lib/berth/drivers/static.wasm",
    ]));
    assert!(ok, "the packaged static driver: {said}{err}");
    let (ok, out, err) = run(Command::new("dpkg").args(["--purge", "berth"]));
    assert!(ok, "dpkg --purge:\n{out}\n{err}");
    assert!(!installed("berth"));
    for gone in [
        "/usr/bin/berth",
        "/etc/berth/berth.toml",
        "/usr/lib/berth/drivers",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} after the purge");
    }
    // The user stays (a berth installed again finds its store's owner).
    assert!(run(Command::new("getent").args(["passwd", "berth"])).0);
}
