//! The config a running `berth serve` would read again, compared with the
//! one it runs: `berth config check FILE --against URL`, through the binary.

use crate::support::config::{CI, OPS, serve_config_on};
use crate::support::server::{Berth, run_berth};
use crate::support::{SimServer, plugin};

#[tokio::test]
async fn config_check_against_a_running_berth_names_what_a_reload_would_change() {
    let sim = SimServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = serve_config_on(&sim, dir.path(), &plugin("sim"));
    let args = ["--config", &config.display().to_string()];
    let server = Berth::start(&args, dir.path()).await;
    let running = std::fs::read_to_string(&config).expect("the config");
    let check = |text: String, token: &'static str| {
        let file = dir.path().join("next.toml");
        std::fs::write(&file, text).expect("write");
        let base = server.base.clone();
        async move {
            let file = file.display().to_string();
            let args = [
                "config",
                "check",
                &file,
                "--against",
                &base,
                "--token",
                token,
            ];
            run_berth(args, &[]).await
        }
    };

    let ran = check(running.clone(), OPS).await;
    assert!(
        ran.success() && ran.stdout.contains("a reload would change nothing"),
        "{ran}"
    );

    // A label added and min-ready raised: both live.
    let more = running.replace("min-ready = 2", "min-ready = 3")
        + "\n[labels.big]\n[labels.big.providers.sim]\ninstance-type = \"big\"\nimage = \"img\"\nvcpus = 4\nram = \"8GiB\"\n";
    let ran = check(more, OPS).await;
    assert!(ran.success(), "{ran}");
    for line in [
        "labels.small.min-ready: 2 → 3",
        "labels.big: added",
        "a reload would make 2 changes",
    ] {
        assert!(ran.stdout.contains(line), "{line}: {ran}");
    }

    // The pool's id cannot change live: refused whole, with the reason.
    let renamed = running.replace("pool-id = \"serve-test\"", "pool-id = \"other\"");
    let ran = check(renamed, OPS).await;
    assert!(!ran.success(), "{ran}");
    assert!(
        ran.stdout
            .contains("pool-id: serve-test → other (cannot change while berth runs")
            && ran.stdout.contains("a reload would be refused"),
        "{ran}"
    );

    // An invalid file: its problem, by key.
    let invalid = running.replace("min-ready = 2", "min-ready = 2\nmin-redy = 3");
    let ran = check(invalid, OPS).await;
    assert!(!ran.success(), "{ran}");
    assert!(ran.stdout.contains("labels.small.min-redy"), "{ran}");

    // An admin's only.
    let ran = check(running, CI).await;
    assert!(!ran.success() && ran.stderr.contains("admin"), "{ran}");
    server.terminate().await.assert_success();
}
