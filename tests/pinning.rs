//! A provider's driver pinned by the sha256 of its file (`driver-sha256`),
//! through the `berth` binary: other bytes are refused by `berth config
//! check` and by `berth serve`, which runs nothing of them, and the pinned
//! bytes run.

use std::path::Path;

use crate::support::config::{OPS, edit_config, serve_config_on};
use crate::support::server::{Berth, Launch, run_berth};
use crate::support::{SimServer, live, plugin, put, with_custom_section};

async fn config_check(config: &Path) -> (bool, String) {
    let ran = run_berth(["config", "check", &config.display().to_string()], &[]).await;
    (
        ran.status.success(),
        format!("{}{}", ran.stdout, ran.stderr),
    )
}

#[tokio::test]
async fn a_pinned_driver_runs_only_with_the_pinned_bytes() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).expect("mkdir");
    let driver = plugins.join("sim.wasm");
    let right = std::fs::read(plugin("sim")).expect("the sim driver");
    let wrong = with_custom_section(&right, 0);
    let pin = berth::config::file_sha256(&plugin("sim")).expect("digest");
    put(&driver, &wrong);
    let wrong_sha = berth::config::file_sha256(&driver).expect("digest");
    assert_ne!(pin, wrong_sha);

    let config = serve_config_on(&sim, dir.path(), &driver);
    // Given in capitals, as some tools print it: the same digest.
    edit_config(
        &config,
        "[providers.sim]\n",
        &format!(
            "[providers.sim]\ndriver-sha256 = \"{}\"\n",
            pin.to_uppercase()
        ),
    );

    // `config check` refuses the file, naming the key and both digests.
    let (ok, said) = config_check(&config).await;
    assert!(!ok, "{said}");
    assert!(
        said.contains("providers.sim.driver-sha256")
            && said.contains(&pin)
            && said.contains(&wrong_sha),
        "{said}"
    );

    // `serve` refuses to start, in the same words, and runs nothing of the
    // file: the sim cloud is asked nothing.
    let args = ["--config", &config.display().to_string()];
    let refused = Berth::spawn(Launch::new(&args, dir.path()))
        .exit_within(std::time::Duration::from_secs(30))
        .await;
    refused.assert_code(2);
    let log = refused.log_text();
    assert!(
        log.contains("providers.sim.driver-sha256") && log.contains(&wrong_sha),
        "{log}"
    );
    assert!(sim.cloud.calls().is_empty(), "{:?}", sim.cloud.calls());
    assert!(live(&sim.cloud).is_empty());

    // The pinned bytes pass and run.
    put(&driver, &right);
    let (ok, said) = config_check(&config).await;
    assert!(ok, "{said}");
    let server = Berth::start(&args, dir.path()).await;
    server
        .until_label_ready(60, "small", 2, "the pinned driver's nodes")
        .await;
    let (_, drivers) = server.call("GET", "/v1/drivers", Some(OPS), None).await;
    let shown: Vec<&str> = (drivers.as_array().into_iter().flatten())
        .filter_map(|d| d["sha256"].as_str())
        .collect();
    assert_eq!(shown, [pin.as_str()], "{drivers}");
    server.terminate().await.assert_success();

    // A pin that is not a digest is refused, naming the key.
    edit_config(
        &config,
        &format!("driver-sha256 = \"{}\"", pin.to_uppercase()),
        "driver-sha256 = \"sha256:abc\"",
    );
    let (ok, said) = config_check(&config).await;
    assert!(
        !ok && said.contains("providers.sim.driver-sha256") && said.contains("64 hex digits"),
        "{said}"
    );
}

/// The loader itself compares the pin with the bytes it read, before it
/// compiles them: what `berth serve` relies on when a provider starts after
/// the file changed under it.
#[tokio::test]
async fn the_loader_refuses_other_bytes_before_compiling_them() {
    use berth::plugin::{Engine, EngineConfig, LoadErrorKind, LoadLimits};
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("sim.wasm");
    let right = std::fs::read(plugin("sim")).expect("the sim driver");
    let pin = berth::config::file_sha256(&plugin("sim")).expect("digest");
    put(&file, &with_custom_section(&right, 0));
    let engine = Engine::new(EngineConfig::default()).expect("engine");
    let refused = engine
        .load_file_pinned(&file, LoadLimits::default(), Some(&pin))
        .await
        .expect_err("refused");
    assert!(
        matches!(&refused.kind, LoadErrorKind::NotPinned { pinned, .. } if *pinned == pin),
        "{refused}"
    );
    assert!(refused.to_string().contains("driver-sha256"), "{refused}");
    put(&file, &right);
    let loaded = engine
        .load_file_pinned(&file, LoadLimits::default(), Some(&pin))
        .await
        .expect("the pinned bytes load");
    assert_eq!(loaded.sha256(), pin);
}
