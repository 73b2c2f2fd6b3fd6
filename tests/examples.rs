//! The example configs of `config/` are what `berth config check` accepts,
//! each with its drivers built and its variables set, as a user who copies
//! one would run it.

use std::ffi::OsStr;

use crate::support::server::run_berth;
use crate::support::{plugin, workspace};

/// A value for variable `name`: long enough for an API token, and each
/// its own.
fn value_of(name: &str) -> std::ffi::OsString {
    format!("example-value-of-{name}").into()
}

#[tokio::test]
async fn every_example_config_passes_config_check() {
    let mut checked = Vec::new();
    let dir = workspace().join("config");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("config/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension() == Some(OsStr::new("toml")))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        // Its drivers, built, in a plugins directory of its own.
        let tmp = tempfile::tempdir().expect("tempdir");
        let plugins = tmp.path().join("plugins");
        std::fs::create_dir(&plugins).expect("mkdir");
        for line in text.lines() {
            let Some(name) = (line.trim().strip_prefix("driver = \""))
                .and_then(|rest| rest.strip_suffix(".wasm\""))
            else {
                continue;
            };
            std::fs::copy(plugin(name), plugins.join(format!("{name}.wasm"))).expect("copy");
        }
        let text = text
            .replace(
                "plugins-dir = \"../target/plugins/out\"",
                &format!("plugins-dir = {:?}", plugins.display().to_string()),
            )
            .replace(
                "state-dir = \"../berth-data\"",
                &format!(
                    "state-dir = {:?}",
                    tmp.path().join("state").display().to_string()
                ),
            );
        let copy = tmp.path().join("berth.toml");
        std::fs::write(&copy, text).expect("write");
        // Every `${NAME}` the example reads, set.
        let vars: Vec<String> = (text_vars(&std::fs::read_to_string(&copy).expect("read")))
            .into_iter()
            .collect();
        let values: Vec<std::ffi::OsString> = vars.iter().map(|v| value_of(v)).collect();
        let env: Vec<(&str, &OsStr)> = (vars.iter().zip(&values))
            .map(|(v, value)| (v.as_str(), value.as_os_str()))
            .collect();
        let ran = run_berth(["config", "check", &copy.display().to_string()], &env).await;
        assert!(
            ran.status.success(),
            "{}: {}{}",
            file.display(),
            ran.stdout,
            ran.stderr
        );
        checked.push(
            file.file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned(),
        );
    }
    assert!(checked.contains(&"example.toml".to_owned()), "{checked:?}");
    for cloud in ["hetzner.toml", "azure.toml", "openstack.toml", "gce.toml"] {
        assert!(checked.contains(&cloud.to_owned()), "{checked:?}");
    }
}

/// The names of `${NAME}` in `text`.
fn text_vars(text: &str) -> std::collections::BTreeSet<String> {
    text.split("${")
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.to_owned()))
        .collect()
}
