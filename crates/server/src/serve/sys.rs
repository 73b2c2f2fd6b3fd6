//! The server's calls to the C library that no safe wrapper covers: the one
//! module of this crate allowed `unsafe` (the crate root denies it
//! elsewhere). The open-file limit goes through `rustix`, safely, in
//! `http.rs`.
//!
//! - `TCP_DEFER_ACCEPT`: neither `rustix` nor `socket2` has a setter for it.
//! - `FIONREAD` on a connection's raw fd: the accept loop keeps only the
//!   fd's number (the socket itself belongs to the connection's task), and
//!   a safe wrapper would need a borrowed fd, which a number cannot prove.

#![allow(unsafe_code)]

/// Sets `TCP_DEFER_ACCEPT` on `socket` to `seconds`.
#[cfg(target_os = "linux")]
pub(super) fn set_tcp_defer_accept(
    socket: &impl std::os::fd::AsFd,
    seconds: libc::c_int,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = socket.as_fd();
    // SAFETY: `fd` is borrowed from an open socket for the call, and
    // setsockopt reads one int from the pointer it is given, `seconds`,
    // which lives across the call.
    let set = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const seconds).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// How many bytes have arrived on the socket `fd` that no one has read
/// yet; `None` if the kernel does not say (a closed fd, or not a socket).
#[cfg(unix)]
pub(super) fn unread_bytes(fd: std::os::fd::RawFd) -> Option<u32> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int, into `n`, which lives across the
    // call; any fd number is safe to pass (one that is not open fails with
    // EBADF). The caller keeps `fd` open meanwhile (see `http::Conn::fd`),
    // so the count is the connection's.
    let ok = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } == 0;
    if ok { u32::try_from(n).ok() } else { None }
}
