//! Indexes files of the workspace that the binary carries: the contract's
//! WIT files (`wit/`, for `berth driver wit`), and the project templates and
//! SDKs `berth driver new` writes (`templates/`, `sdk/`). Each index is
//! OUT_DIR/NAME.rs: `&[(relative path, include_str!(absolute path))]`.

#![forbid(unsafe_code)]

use std::env;
use std::path::{Path, PathBuf};

/// Which files under an index's root it carries (by path relative to it).
type Keep = dyn Fn(&Path) -> bool;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // This crate is crates/plugin in the workspace.
    let root = Path::new(&env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("workspace")
        .to_path_buf();
    let wit = |p: &Path| p.extension().is_some_and(|e| e == "wit");
    let any = |_: &Path| true;
    let rust = |p: &Path| p.extension().is_some_and(|e| e == "rs");
    // The JavaScript SDK without its tests.
    let js = |p: &Path| !p.components().any(|c| c.as_os_str() == "test");
    let python = |p: &Path| {
        p.extension().is_some_and(|e| e == "py") || p.file_name().is_some_and(|n| n == "py.typed")
    };
    let faults = |p: &Path| p == Path::new("faults.json");
    let indexes: [(&str, PathBuf, &Keep); 6] = [
        (
            "sim_faults_files",
            root.join("plugins").join("sim"),
            &faults,
        ),
        ("wit_files", root.join("wit"), &wit),
        ("template_files", root.join("templates"), &any),
        ("sdk_rust_files", root.join("sdk").join("src"), &rust),
        (
            "sdk_python_files",
            root.join("sdk").join("python").join("berth_driver"),
            &python,
        ),
        ("sdk_js_files", root.join("sdk").join("js"), &js),
    ];
    for (name, dir, keep) in indexes {
        if let Err(e) = index(name, &dir, keep) {
            println!("cargo::error=indexing {}: {e}", dir.display());
        }
    }
}

/// Writes OUT_DIR/`name`.rs: every file under `root` that `keep` keeps (its
/// path relative to `root`), skipping `node_modules` and caches.
fn index(name: &str, root: &Path, keep: &Keep) -> std::io::Result<()> {
    println!("cargo::rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let skipped = path
                .file_name()
                .is_some_and(|n| n == "node_modules" || n == "__pycache__");
            if skipped {
                continue;
            }
            if path.is_dir() {
                println!("cargo::rerun-if-changed={}", path.display());
                dirs.push(path);
            } else if keep(path.strip_prefix(root).expect("under root")) {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut out = String::from("&[\n");
    for f in &files {
        let rel = f.strip_prefix(root).expect("under root");
        out.push_str(&format!(
            "    ({:?}, include_str!({:?})),\n",
            rel.to_string_lossy(),
            f.to_string_lossy()
        ));
    }
    out.push_str("]\n");
    let dest = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join(format!("{name}.rs"));
    std::fs::write(dest, out)
}
