//! Indexes the contract's WIT files (`wit/`) into OUT_DIR/wit_files.rs, for
//! `src/contract.rs` to carry inside the binary (`berth driver wit`).

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if let Err(e) = index_wit() {
        println!("cargo::error=indexing the contract's WIT files: {e}");
    }
}

/// Writes OUT_DIR/wit_files.rs: every file under `wit/` as
/// `(relative path, include_str!(absolute path))`, for `berth driver wit`.
fn index_wit() -> std::io::Result<()> {
    // This crate is crates/plugin in the workspace.
    let root = Path::new(&env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("workspace")
        .join("wit");
    println!("cargo::rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                println!("cargo::rerun-if-changed={}", path.display());
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "wit") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut out = String::from("&[\n");
    for f in &files {
        let rel = f.strip_prefix(&root).expect("under wit/");
        out.push_str(&format!(
            "    ({:?}, include_str!({:?})),\n",
            rel.to_string_lossy(),
            f.to_string_lossy()
        ));
    }
    out.push_str("]\n");
    let dest = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("wit_files.rs");
    std::fs::write(dest, out)
}
