//! `berth driver new`: a new driver project in Rust, Python or JavaScript,
//! from the templates and SDKs this binary carries (`templates/`, `sdk/`,
//! indexed by `build.rs`), so that it builds against exactly the contract
//! and SDK of the berth that wrote it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::contract;

type Files = &'static [(&'static str, &'static str)];

const TEMPLATES: Files = include!(concat!(env!("OUT_DIR"), "/template_files.rs"));
const SDK_RUST: Files = include!(concat!(env!("OUT_DIR"), "/sdk_rust_files.rs"));
const SDK_PYTHON: Files = include!(concat!(env!("OUT_DIR"), "/sdk_python_files.rs"));
const SDK_JS: Files = include!(concat!(env!("OUT_DIR"), "/sdk_js_files.rs"));
/// The sim cloud's error responses, recorded (`plugins/sim/faults.json`):
/// every project's `faults.json`, for `berth driver test --faults`.
const SIM_FAULTS: Files = include!(concat!(env!("OUT_DIR"), "/sim_faults_files.rs"));

/// The language of a new driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::Display, strum::EnumString)]
#[strum(serialize_all = "lowercase")]
pub enum Lang {
    Rust,
    Python,
    Js,
}

impl Lang {
    /// The template's folder under `templates/`, the SDK, and where the
    /// SDK goes in the project.
    fn parts(self) -> (&'static str, Files, &'static str) {
        match self {
            Lang::Rust => ("rust", SDK_RUST, "berth-sdk/src"),
            Lang::Python => ("python", SDK_PYTHON, "berth_driver"),
            Lang::Js => ("js", SDK_JS, "berth-driver-sdk"),
        }
    }
}

/// What went wrong making a project.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error(
        "{0:?} is not a driver name: use 1 to 63 of a-z, 0-9 and `-`, starting with a letter and not ending with `-`"
    )]
    Name(String),
    #[error("{} exists and is not empty", .0.display())]
    Exists(PathBuf),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn valid_name(name: &str) -> bool {
    name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Writes a new driver project named `name` in `lang` into `dir` (made if
/// missing; refused if it holds anything): the template with its name
/// filled in, the SDK, and the contract in `wit/`. Returns how many files.
pub fn new_project(dir: &Path, name: &str, lang: Lang) -> Result<usize, ScaffoldError> {
    if !valid_name(name) {
        return Err(ScaffoldError::Name(name.to_owned()));
    }
    if fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(ScaffoldError::Exists(dir.to_path_buf()));
    }
    let write = |rel: &str, text: &str| -> Result<(), ScaffoldError> {
        let path = dir.join(rel);
        let failed = |source| ScaffoldError::Write {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(failed)?;
        }
        fs::write(&path, text).map_err(failed)?;
        if path.file_name().is_some_and(|n| n == "build") {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).map_err(failed)?;
        }
        Ok(())
    };
    let (folder, sdk, sdk_dir) = lang.parts();
    let crate_name = name.replace('-', "_");
    let mut n = 0;
    let prefix = format!("{folder}/");
    for (rel, text) in TEMPLATES {
        if let Some(rel) = rel.strip_prefix(&prefix) {
            let text = text
                .replace("{{name}}", name)
                .replace("{{crate}}", &crate_name);
            write(rel, &text)?;
            n += 1;
        }
    }
    // In this repository the Rust SDK reads the contract from its version's
    // folder; in a project, `wit/` holds that one version.
    let version = contract::newest();
    let in_repo = format!("\"../wit/berth-driver@{version}\"");
    for (rel, text) in sdk {
        write(
            &format!("{sdk_dir}/{rel}"),
            &text.replace(&in_repo, "\"../wit\""),
        )?;
        n += 1;
    }
    for (rel, text) in SIM_FAULTS {
        write(rel, text)?;
        n += 1;
    }
    let files = contract::files(version).unwrap_or_default();
    for (rel, text) in &files {
        write(&format!("wit/{rel}"), text)?;
    }
    n += files.len();
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["my-cloud", "a", "hetzner2"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "My", "-a", "a-", "a_b", "2a", &"a".repeat(64)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_project_carries_its_template_sdk_and_contract() {
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            let dir = tempfile::tempdir().unwrap();
            let project = dir.path().join("my-cloud");
            let n = new_project(&project, "my-cloud", lang).unwrap();
            let contract = contract::files(contract::newest()).unwrap();
            assert!(n > contract.len(), "{lang}: {n} files");
            assert!(project.join("wit/driver.wit").is_file(), "{lang}");
            assert!(project.join("build").is_file(), "{lang}");
            assert!(project.join("faults.json").is_file(), "{lang}");
            let (_, sdk, sdk_dir) = lang.parts();
            assert!(!sdk.is_empty(), "{lang}");
            assert!(project.join(sdk_dir).join(sdk[0].0).is_file(), "{lang}");
            if lang == Lang::Rust {
                let bindings = fs::read_to_string(project.join(sdk_dir).join("bindings.rs"));
                assert!(bindings.unwrap().contains("path: \"../wit\","), "{lang}");
            }
            // Nothing is left unfilled.
            for (rel, _) in TEMPLATES
                .iter()
                .filter(|(r, _)| r.starts_with(&format!("{}/", lang.parts().0)))
            {
                let rel = rel.split_once('/').unwrap().1;
                let text = fs::read_to_string(project.join(rel)).unwrap();
                assert!(!text.contains("{{"), "{lang}: {rel}");
            }
            // A second time into the same folder is refused.
            assert!(matches!(
                new_project(&project, "my-cloud", lang),
                Err(ScaffoldError::Exists(_))
            ));
        }
    }
}
