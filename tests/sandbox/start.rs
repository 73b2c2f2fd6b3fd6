//! Providers start on their own: a driver that is slow to compile, or too
//! large to load, holds up and fails only its own provider.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Hostile, fulfilled, provider, start};
use crate::support::plugin;
use crate::support::server::until;

/// `n` as an unsigned LEB128, the WebAssembly binary format's integers.
fn leb(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// Appends a section with id `id` and `content` to `out`.
fn section(out: &mut Vec<u8>, id: u8, content: &[u8]) {
    out.push(id);
    out.extend(leb(content.len()));
    out.extend_from_slice(content);
}

/// `driver` (a component) with one more core module at its end, which
/// nothing instantiates but which is compiled with the rest: `functions`
/// functions, each `depth` blocks nested in one another. It stays a valid
/// driver; it only takes long, and much memory, to compile.
fn slow_to_compile(driver: &[u8], functions: usize, depth: usize) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    // One type, `[] -> []`.
    section(&mut module, 1, &[1, 0x60, 0, 0]);
    let mut funcs = leb(functions);
    funcs.resize(funcs.len() + functions, 0);
    section(&mut module, 3, &funcs);
    // No locals; `block` (of no type) `depth` times, then as many `end`s
    // and the function's own.
    let mut body = vec![0u8];
    for _ in 0..depth {
        body.extend([0x02, 0x40]);
    }
    body.resize(body.len() + depth + 1, 0x0b);
    let mut code = leb(functions);
    for _ in 0..functions {
        code.extend(leb(body.len()));
        code.extend_from_slice(&body);
    }
    section(&mut module, 10, &code);
    let mut out = driver.to_vec();
    // A component's section 1 is a core module.
    section(&mut out, 1, &module);
    out
}

/// Regression: every provider's driver was loaded under one lock, and
/// compiling had no budget: a valid component of 90 MB (functions of
/// millions of nested blocks) kept a good provider `starting` for the whole
/// run (its request pending, berth at 2.3 GiB), and a 524 MB file was read
/// whole into memory. Now each file loads on its own, a compile past the
/// provider's `compile-deadline` fails that provider only (and is tried
/// again, waiting for the same compile), and a file over `max-driver-size`
/// is refused before it is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_slow_to_compile_or_too_large_holds_up_only_its_own_provider() {
    let dir = tempfile::tempdir().unwrap();
    let sim_bytes = std::fs::read(plugin("sim")).unwrap();
    let slow = dir.path().join("slow.wasm");
    std::fs::write(&slow, slow_to_compile(&sim_bytes, 1, 500_000)).unwrap();
    // 1 GiB, and holes only: reading it would take a gigabyte of memory.
    let huge = dir.path().join("huge.wasm");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    // Both listed before the sim provider, which starts last.
    let started = Instant::now();
    let (_sim, _dir, server) = start(
        &[
            Hostile {
                file: Some(&slow),
                sandbox: "compile-deadline = \"2s\"",
                min_ready: 0,
                ..Hostile::new("slow", json!({}))
            },
            Hostile {
                file: Some(&huge),
                min_ready: 0,
                ..Hostile::new("huge", json!({}))
            },
        ],
        &[],
    )
    .await;

    // The good provider serves at once.
    fulfilled(&server, "small", 30).await;
    let took = started.elapsed();
    let slow_now = provider(&server, "slow").await;
    eprintln!("start: a request on sim fulfilled {took:?} after start; slow is {slow_now}");
    assert_ne!(slow_now["status"], "up", "{slow_now}");
    assert!(took < Duration::from_secs(20), "fulfilled after {took:?}");

    // The file over the limit is refused at once, by name and limit.
    let huge_now = until(10, "huge failed", || async {
        let p = provider(&server, "huge").await;
        (p["status"] == "failed").then_some(p)
    })
    .await;
    let error = huge_now["start_error"].as_str().unwrap_or_default();
    for part in [
        "huge.wasm",
        "1073741824 bytes",
        "67108864 bytes",
        "max-driver-size",
    ] {
        assert!(error.contains(part), "`{part}` not in {error}");
    }

    // The slow one fails at its compile deadline, and the others go on.
    let slow_failed = until(30, "slow failed at its compile deadline", || async {
        let p = provider(&server, "slow").await;
        let e = p["start_error"].as_str().unwrap_or_default().to_owned();
        e.contains("compile-deadline").then_some(e)
    })
    .await;
    assert!(slow_failed.contains("slow.wasm"), "{slow_failed}");
    fulfilled(&server, "small", 30).await;
    server.terminate().await.assert_success();
}
