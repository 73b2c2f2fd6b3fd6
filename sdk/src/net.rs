//! Network checks besides HTTP.

use crate::bindings::berth::driver::net as wit;

/// Opens a TCP connection to `host`:`port` and closes it, waiting at most
/// `timeout_ms` (capped by the host at 30 s). The host must be in the
/// provider's allowed hosts, as for HTTP. `Ok` means the port accepted;
/// the error says why not (refused, timed out, not allowed).
pub fn tcp_probe(host: &str, port: u16, timeout_ms: u32) -> Result<(), String> {
    wit::tcp_probe(host, port, timeout_ms)
}
