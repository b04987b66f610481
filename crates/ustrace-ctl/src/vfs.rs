//! The tracefs file-system interface.
//!
//! A tracefs is a tree of directories and small control files. Opening a file may itself act
//! (opening `trace` with `O_TRUNC` clears the buffer, as on the kernel), reads of most files
//! return a snapshot taken at open, and a few files are streams (`trace_pipe`) whose reads
//! block until data arrives. Errors are plain errno values, because that is what a shell user
//! sees and what every door must pass through unchanged.

use std::fmt;
use std::time::Duration;

/// An errno value, as a failed tracefs operation returns it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const ENODEV: Errno = Errno(libc::ENODEV);
    pub const EINTR: Errno = Errno(libc::EINTR);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);

    /// The C library's description of this errno ("Invalid argument").
    pub fn description(self) -> String {
        std::io::Error::from_raw_os_error(self.0).to_string()
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, self.description())
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // io::Error's text ends with " (os error N)"; keep only the words a shell would print.
        let text = self.description();
        let words = text.split(" (os error").next().unwrap_or(&text);
        f.write_str(words)
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
    }
}

/// What a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Dir,
    File,
}

/// What `stat` tells about a path. Tracefs files report size 0, as the kernel's do: their
/// content exists only when read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub kind: FileKind,
    /// Permission bits only (e.g. `0o644`, `0o444`, `0o755`).
    pub mode: u32,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub kind: FileKind,
}

/// How a file is opened; the fields mirror `open(2)` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    /// `O_TRUNC`: some files act on it at open (`trace`, `set_event`, `dynamic_events`).
    pub truncate: bool,
    /// `O_APPEND`: writes add to what is there instead of replacing it.
    pub append: bool,
    /// `O_NONBLOCK`: a stream read with nothing to give fails with `EAGAIN`.
    pub nonblock: bool,
}

impl OpenFlags {
    pub const READ: OpenFlags = OpenFlags {
        read: true,
        write: false,
        truncate: false,
        append: false,
        nonblock: false,
    };
    pub const TRUNCATE: OpenFlags = OpenFlags {
        read: false,
        write: true,
        truncate: true,
        append: false,
        nonblock: false,
    };
    pub const APPEND: OpenFlags = OpenFlags {
        read: false,
        write: true,
        truncate: false,
        append: true,
        nonblock: false,
    };
}

/// A tracefs: the whole tree one process serves.
pub trait FileSystem: Send + Sync {
    /// `path` is relative to the root, `/`-separated; `""` and `"/"` name the root.
    fn stat(&self, path: &str) -> Result<Stat, Errno>;
    fn readdir(&self, path: &str) -> Result<Vec<DirEntry>, Errno>;
    fn open(&self, path: &str, flags: OpenFlags) -> Result<Box<dyn OpenFile>, Errno>;
    fn mkdir(&self, path: &str) -> Result<(), Errno>;
    fn rmdir(&self, path: &str) -> Result<(), Errno>;
}

/// An open tracefs file. Dropping it is `release`.
pub trait OpenFile: Send {
    /// Reads the next bytes; `Ok(0)` is end of file. A stream file blocks until data arrives,
    /// at most `timeout` when one is given (then `Err(EAGAIN)`), so a server can notice that
    /// its client went away.
    fn read(&mut self, buf: &mut [u8], timeout: Option<Duration>) -> Result<usize, Errno>;
    /// Writes one chunk; each call is parsed on its own, as a kernel write(2) is.
    fn write(&mut self, data: &[u8]) -> Result<usize, Errno>;
    /// Whether reads consume and block (`trace_pipe`) rather than return a snapshot.
    fn is_stream(&self) -> bool;
}
