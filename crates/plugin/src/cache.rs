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

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty component, compiled by `engine`, as the cache writes it.
    fn artifact(engine: &Engine, wat: &str) -> Vec<u8> {
        let component =
            Component::new(engine, wat::parse_str(wat).expect("wat")).expect("compiles");
        component.serialize().expect("serializes")
    }

    /// An entry's name in the cache directory that is a symlink to an
    /// artifact outside it is not followed: the source is compiled anew,
    /// and the entry is replaced by a file of the cache's own.
    #[test]
    fn an_entry_linked_out_of_the_cache_directory_is_not_loaded() {
        let engine = Engine::default();
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("cache");
        std::fs::create_dir(&dir).expect("mkdir");
        let cache = ArtifactCache::new(dir.clone(), &engine);
        let wasm = wat::parse_str("(component)").expect("wat");
        let sha = "0".repeat(64);

        // A valid artifact of this engine, outside the cache directory,
        // linked in under the entry's name (absolute and relative).
        let outside = root.path().join("elsewhere.cwasm");
        std::fs::write(&outside, artifact(&engine, "(component (core module))")).expect("write");
        let entry = dir.join(cache.name_for(&sha));
        for target in [outside.clone(), PathBuf::from("../elsewhere.cwasm")] {
            std::os::unix::fs::symlink(&target, &entry).expect("symlink");
            let (_, source) = cache.load(&engine, &sha, &wasm).expect("loads");
            assert_eq!(source, LoadSource::Compiled, "{}", target.display());
            let meta = std::fs::symlink_metadata(&entry).expect("entry");
            assert!(
                meta.is_file(),
                "the link was replaced by the cache's own file"
            );
            std::fs::remove_file(&entry).expect("unlink");
        }

        // Its own entry is loaded from the cache.
        cache.load(&engine, &sha, &wasm).expect("compiles");
        let (_, source) = cache.load(&engine, &sha, &wasm).expect("loads");
        assert_eq!(source, LoadSource::Cache);
    }
}
