//! The contract this berth implements, carried inside the binary: every file
//! of `wit/` (with its WASI `deps/`), indexed by `build.rs`.

use std::fs;
use std::io;
use std::path::Path;

/// The contract: every file of `wit/` (with `deps/`), as relative path and
/// text. `berth driver wit DIR` writes them out, so an author in any
/// language builds against exactly what this berth implements.
pub const WIT: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/wit_files.rs"));

/// Writes [`WIT`] under `dir`; returns how many files.
pub fn write_wit(dir: &Path) -> io::Result<usize> {
    for (rel, text) in WIT {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, text)?;
    }
    Ok(WIT.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_contract_is_carried_and_written_out() {
        let names: Vec<&str> = WIT.iter().map(|(n, _)| *n).collect();
        assert!(names.contains(&"driver.wit"), "{names:?}");
        assert!(
            names.iter().any(|n| n.starts_with("deps/http/")),
            "{names:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(write_wit(dir.path()).unwrap(), WIT.len());
        let written = fs::read_to_string(dir.path().join("driver.wit")).unwrap();
        assert!(written.contains("package berth:driver@0.1.0;"));
        assert_eq!(
            written,
            fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../wit/driver.wit"))
                .unwrap()
        );
    }
}
