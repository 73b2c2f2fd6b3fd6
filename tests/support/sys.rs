//! What the tests and benchmarks need of the system that no safe wrapper
//! covers: the one module of their binaries allowed `unsafe` (each root
//! denies it elsewhere). Signals and user ids go through `rustix` and
//! `nix`, safely; what is left here is code a child runs between fork and
//! exec (`pre_exec`, which the compiler cannot check), a variable set in
//! this process's own environment, and the allocator's trim.

#![allow(unsafe_code)]

use rustix::process::{Resource, Rlimit, Signal};

/// Starts the process of `cmd` with `n` as its open-file limit, soft and
/// hard.
pub fn limit_open_files(cmd: &mut tokio::process::Command, n: u64) {
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls may be made: it makes one system call,
    // setrlimit, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let lim = Rlimit {
                current: Some(n),
                maximum: Some(n),
            };
            rustix::process::setrlimit(Resource::Nofile, lim)?;
            Ok(())
        });
    }
}

/// Has the process of `cmd` killed when the thread that starts it ends
/// (Linux's parent-death signal, set after any change of user, which
/// would clear it).
pub fn kill_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls may be made: it makes one system call,
    // prctl, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let _ = rustix::process::set_parent_process_death_signal(Some(Signal::KILL));
            Ok(())
        });
    }
}

/// Sets the variable `name` of this process's environment to `value`, for
/// code under test that reads it from there (the conformance kit reads a
/// credential's `${NAME}` so, and has no other way in). `name` must be the
/// calling test's own: no other test sets or reads it.
pub fn set_own_env_var(name: &str, value: &str) {
    // SAFETY: std's environment functions hold a lock against each other,
    // so no Rust code reading the environment races this write. Code in C
    // that reads it on another thread (getenv) could; the one caller sets
    // its variables first thing, and the suite accepts that for the only
    // test of how the kit reads a secret.
    unsafe { std::env::set_var(name, value) };
}

/// Hands the allocator's free memory back to the OS (glibc only), so that
/// the resident size that follows is what is live.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and may be called at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
