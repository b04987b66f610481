//! Shared by the tests that write probe definitions into the running
//! kernel: one at a time, so that each can tell which event its own write
//! created (test binaries may run in parallel under other runners).

use std::fs::File;
use std::os::fd::AsRawFd;

/// Holds an exclusive `flock` on a lock file until dropped (closing the
/// file releases it).
pub struct KernelLock {
    _file: File,
}

impl KernelLock {
    pub fn take() -> KernelLock {
        let f = File::create("/tmp/ustrace-probe-kernel-tests.lock").expect("create lock file");
        // SAFETY: flock on a descriptor we own; blocks until granted.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
        KernelLock { _file: f }
    }
}
