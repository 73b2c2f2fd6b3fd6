//! The Python SDK's own unit tests (`sdk/python/tests`), on the Python the
//! Python example's build sets up: once against the tests' stand-ins for
//! componentize-py's bindings, as an SDK author runs them, and once against
//! the stubs `componentize-py bindings` writes for the contract, which have
//! the real types.

use std::path::Path;
use std::process::Command;

use crate::support::{scripted_plugin, workspace};

/// Runs `python -m unittest discover -s sdk/python/tests` from the workspace
/// root, with `bindings` on the path if given, and returns unittest's report;
/// fails when a test fails or none ran.
fn sdk_unit_tests(python: &Path, bindings: Option<&Path>) -> String {
    let mut command = Command::new(python);
    command
        .current_dir(workspace())
        .args(["-m", "unittest", "discover", "-s", "sdk/python/tests"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME")
        .env_remove("VIRTUAL_ENV");
    if let Some(bindings) = bindings {
        command.env("PYTHONPATH", bindings);
    }
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    // unittest reports on stderr.
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the Python SDK's unit tests failed ({}, bindings {bindings:?}):\n{report}",
        out.status
    );
    let ran: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no `Ran N tests` in\n{report}"));
    assert!(ran > 0, "no tests found:\n{report}");
    report
}

#[test]
fn python_sdk_unit_tests_pass() {
    // The example's build makes the venv, with componentize-py in it.
    scripted_plugin("python-example");
    let root = workspace();
    let venv = root.join("target").join("python-venv").join("bin");
    let dir = tempfile::tempdir().unwrap();
    let bindings = dir.path().join("bindings");
    let out = Command::new(venv.join("componentize-py"))
        .current_dir(&root)
        .args([
            "--quiet",
            "-d",
            "wit/berth-driver@0.2.0",
            "-w",
            "berth:driver/driver-plugin",
            "bindings",
        ])
        .arg(&bindings)
        .env_remove("VIRTUAL_ENV")
        .output()
        .expect("running componentize-py");
    assert!(
        out.status.success(),
        "componentize-py bindings: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let python = venv.join("python");
    sdk_unit_tests(&python, None);
    sdk_unit_tests(&python, Some(&bindings));
}
