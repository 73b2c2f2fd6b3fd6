//! The JavaScript SDK's own unit tests (`sdk/js/test`) and the JavaScript
//! example's, run with node's test runner as an author runs them (`npm
//! test`): outside any component, requests going to the SDK's fake host.

use std::path::Path;
use std::process::Command;

use crate::support::{scripted_plugin, workspace};

/// Runs `node --test` on every `*.test.js` in `dir` from `cwd` and returns
/// its TAP report; fails when a test fails or none ran.
fn node_tests(cwd: &Path, dir: &str) -> String {
    let mut files: Vec<String> = std::fs::read_dir(cwd.join(dir))
        .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".test.js"))
        .map(|name| format!("{dir}/{name}"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.test.js in {dir}");
    let out = Command::new("node")
        .current_dir(cwd)
        .args(["--test", "--test-reporter=tap"])
        .args(&files)
        .env_remove("NODE_OPTIONS")
        .env_remove("NODE_PATH")
        .output()
        .unwrap_or_else(|e| panic!("running node (20 or newer is needed): {e}"));
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let count = |what: &str| -> usize {
        report
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# {what} "))?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `# {what} N` in\n{report}"))
    };
    assert!(
        out.status.success() && count("fail") == 0,
        "node --test {dir} failed ({}):\n{report}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(count("pass") > 0, "no tests ran in {dir}:\n{report}");
    report
}

#[test]
fn javascript_sdk_unit_tests_pass() {
    // The SDK has no dependencies: nothing to install first.
    node_tests(&workspace().join("sdk").join("js"), "test");
}

#[test]
fn javascript_example_unit_tests_pass() {
    // The example's build installs its node_modules, the SDK linked in.
    scripted_plugin("js-example");
    node_tests(&workspace().join("plugins").join("js-example"), "test");
}
