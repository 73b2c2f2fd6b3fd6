//! What caps one driver instance as it runs: the limiter of its linear
//! memory and tables, and the errors that mark a trap as over the memory
//! cap or past the call's deadline.

/// Returned by the memory limiter; identifies an out-of-memory trap.
#[derive(Debug, thiserror::Error)]
#[error("driver exceeded its memory cap of {cap} bytes (asked for {asked})")]
pub(crate) struct MemoryCapExceeded {
    pub cap: u64,
    pub asked: u64,
}

/// Returned by the epoch callback; identifies a deadline trap.
#[derive(Debug, thiserror::Error)]
#[error("driver call ran past its deadline")]
pub(crate) struct DeadlineExceeded;

/// Caps linear memory and table growth of one driver instance.
pub(crate) struct Limiter {
    memory_bytes: u64,
}

impl Limiter {
    /// Memory of at most `memory_bytes`.
    pub(crate) fn new(memory_bytes: u64) -> Self {
        Limiter { memory_bytes }
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.memory_bytes {
            return Err(wasmtime::Error::new(MemoryCapExceeded {
                cap: self.memory_bytes,
                asked: desired as u64,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a million is far beyond any real
        // driver and keeps a hostile one from growing host memory through them.
        Ok(desired <= 1_000_000)
    }
}
