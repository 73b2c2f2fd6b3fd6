//! The optional state file: instances and the id counter as JSON, replaced
//! atomically (temporary file, then rename) so a crash never leaves half a file.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;

use super::state::{Saved, State};

/// State to write, tagged with the generation it was taken at.
pub(super) struct Snapshot {
    generation: u64,
    saved: Saved,
}

impl Snapshot {
    pub(super) fn of(state: &State) -> Self {
        Snapshot {
            generation: state.generation(),
            saved: state.saved(),
        }
    }
}

pub(super) struct StateFile {
    path: PathBuf,
    // Generation last written. Held for the whole write so writers take turns,
    // and lets a snapshot that lost the race to a newer one be dropped instead
    // of overwriting it. Only ever locked on a blocking thread, never across
    // an `.await`.
    written: Mutex<Option<u64>>,
}

impl StateFile {
    pub(super) fn new(path: PathBuf) -> Self {
        StateFile {
            path,
            written: Mutex::new(None),
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state, or an empty one if the file does not exist yet.
    pub(super) fn load(&self) -> anyhow::Result<Saved> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Saved::default()),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading sim state {}", self.path.display()));
            }
        };
        serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing sim state {}", self.path.display()))
    }

    /// Writes the snapshot unless a newer one is already on disk. Blocks.
    pub(super) fn write(&self, snapshot: Snapshot) -> io::Result<()> {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        if written.is_some_and(|w| w > snapshot.generation) {
            return Ok(());
        }
        let bytes = serde_json::to_vec_pretty(&snapshot.saved).map_err(io::Error::other)?;
        let mut tmp_name = self.path.file_name().unwrap_or_default().to_owned();
        tmp_name.push(".tmp");
        let tmp = self.path.with_file_name(tmp_name);
        {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&bytes)?;
            // Flushed to disk before the rename, or a crash could leave the
            // new name pointing at an empty file.
            file.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        *written = Some(snapshot.generation);
        Ok(())
    }
}
