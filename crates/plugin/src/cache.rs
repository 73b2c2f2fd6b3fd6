//! The on-disk cache of compiled driver components. An entry is keyed by the
//! sha256 of the `.wasm` and the engine's compatibility hash, so a changed
//! driver or a different wasmtime build or configuration never loads a stale
//! artifact. Only artifacts this host compiled itself are ever loaded.
//!
//! The one module of this crate allowed `unsafe` (the crate root denies it
//! elsewhere): loading a compiled artifact (`Component::deserialize`) is
//! unsafe in wasmtime itself, since its machine code is run as it is, and
//! the reasons it is sound here (where the file comes from, what its name
//! binds it to) are all in this module.

#![allow(unsafe_code)]

use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use cap_std::ambient_authority;
use cap_std::fs::Dir;

use wasmtime::Engine;
use wasmtime::component::Component;

/// Where a component came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadSource {
    /// Compiled from the `.wasm` now (and written to the cache if there is one).
    Compiled,
    /// Loaded from the cache.
    Cache,
}

#[derive(Clone)]
pub(crate) struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
}

impl ArtifactCache {
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        // `DefaultHasher::new()` uses fixed keys, so this is stable from one
        // run of the same build to the next; a different build that hashes
        // differently only costs a recompile.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        ArtifactCache {
            dir,
            engine_key: format!("{:016x}", h.finish()),
        }
    }

    fn name_for(&self, sha256: &str) -> String {
        format!("{sha256}-{}.cwasm", self.engine_key)
    }

    /// The cache directory, held open: its entries are opened relative to
    /// it (cap-std), so a symlink in it that leads elsewhere is never
    /// followed, and what is deserialized comes from inside it.
    fn open_dir(&self) -> std::io::Result<Dir> {
        Dir::open_ambient_dir(&self.dir, ambient_authority())
    }

    /// Loads the compiled form of `wasm` from the cache, or compiles it and
    /// stores the result. A corrupt or unreadable entry is replaced.
    pub fn load(
        &self,
        engine: &Engine,
        sha256: &str,
        wasm: &[u8],
    ) -> wasmtime::Result<(Component, LoadSource)> {
        let name = self.name_for(sha256);
        let path = self.dir.join(&name);
        if let Ok(bytes) = self.open_dir().and_then(|dir| dir.read(&name)) {
            // Read into memory rather than mapping the file: a cache file that
            // is truncated or rewritten while mapped (by another berth process,
            // or an operator) would otherwise crash this one with SIGBUS.
            //
            // SAFETY: the file is one this host wrote (below) into its own
            // cache directory (read from inside it: no symlink in it leads
            // out), under a name that binds it to the source's
            // sha256 and this engine's compatibility hash. Artifacts from
            // anywhere else are never deserialized; a damaged one fails the
            // header checks and is recompiled.
            match unsafe { Component::deserialize(engine, &bytes) } {
                Ok(c) => return Ok((c, LoadSource::Cache)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "discarding unusable cache entry")
                }
            }
        }
        let component = Component::new(engine, wasm)?;
        if let Err(e) = self.store(&name, &component) {
            tracing::warn!(path = %path.display(), error = %e, "could not write compiled driver to cache");
        }
        Ok((component, LoadSource::Compiled))
    }

    fn store(&self, name: &str, component: &Component) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let dir = self.open_dir()?;
        let bytes = component.serialize().map_err(anyhow::Error::from)?;
        let tmp = format!("{name}.tmp{}", std::process::id());
        dir.write(&tmp, bytes)?;
        dir.rename(&tmp, &dir, name)?;
        Ok(())
    }
}
