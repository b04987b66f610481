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
    /// `EPERM`: operation not permitted.
    pub const EPERM: Errno = Errno(libc::EPERM);
    /// `ENOENT`: no such file or directory.
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    /// `EIO`: input/output error.
    pub const EIO: Errno = Errno(libc::EIO);
    /// `EBADF`: bad file descriptor.
    pub const EBADF: Errno = Errno(libc::EBADF);
    /// `EAGAIN`: try again: a stream read found nothing before its timeout, or
    /// at once when opened non-blocking.
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    /// `ENOMEM`: cannot allocate memory.
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    /// `EACCES`: permission denied by the file's mode.
    pub const EACCES: Errno = Errno(libc::EACCES);
    /// `EBUSY`: device or resource busy: the object is in use.
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    /// `EEXIST`: file exists.
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    /// `ENOTDIR`: not a directory.
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    /// `EISDIR`: is a directory.
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    /// `EINVAL`: invalid argument: a write the file does not accept (`error_log`
    /// says why, where the kernel logs a reason).
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// `ENOSPC`: no space left on device.
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// `E2BIG`: argument list too long.
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    /// `ENODEV`: no such device.
    pub const ENODEV: Errno = Errno(libc::ENODEV);
    /// `EINTR`: interrupted; retry the call.
    pub const EINTR: Errno = Errno(libc::EINTR);
    /// `ENOTEMPTY`: directory not empty.
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    /// `ENOSYS`: function not implemented.
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
    /// A directory: list it with [`FileSystem::readdir`].
    Dir,
    /// A file: open it with [`FileSystem::open`].
    File,
}

/// What `stat` tells about a path. Tracefs files report size 0, as the kernel's do: their
/// content exists only when read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Directory or file.
    pub kind: FileKind,
    /// Permission bits only (e.g. `0o644`, `0o444`, `0o755`).
    pub mode: u32,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name within its directory (no `/`).
    pub name: String,
    /// Directory or file.
    pub kind: FileKind,
}

/// How a file is opened; the fields mirror `open(2)` flags.
///
/// Use the constants, which are what a shell does: [`READ`](Self::READ) is `cat FILE`
/// (`O_RDONLY`), [`TRUNCATE`](Self::TRUNCATE) is `echo … > FILE` (`O_WRONLY | O_TRUNC`) and
/// [`APPEND`](Self::APPEND) is `echo … >> FILE` (`O_WRONLY | O_APPEND`). Both writing
/// constants set [`write`](Self::write): `truncate` and `append` only say *how* a write open
/// treats what is there, as on the kernel, where `O_TRUNC` acts only on an open for writing
/// (it clears `trace`, `set_event`, `dynamic_events`, ... when the file is opened to write).
///
/// ```
/// use ustrace_ctl::vfs::OpenFlags;
/// assert!(OpenFlags::TRUNCATE.write && OpenFlags::TRUNCATE.truncate);
/// assert!(OpenFlags::APPEND.write && !OpenFlags::APPEND.truncate);
/// // A non-blocking reader of `trace_pipe`: an empty pipe gives EAGAIN at once.
/// let nonblocking = OpenFlags { nonblock: true, ..OpenFlags::READ };
/// assert!(nonblocking.read && !nonblocking.write);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFlags {
    /// Open for reading (`O_RDONLY`, or `O_RDWR` with `write`).
    pub read: bool,
    /// Open for writing (`O_WRONLY`, or `O_RDWR` with `read`).
    pub write: bool,
    /// `O_TRUNC`: with `write`, some files act on it at open (`trace` and `per_cpu/cpuN/trace`
    /// clear the buffer, `set_event` disables every event, `dynamic_events` removes every
    /// dynamic event, `error_log` clears the log).
    pub truncate: bool,
    /// `O_APPEND`: writes add to what is there instead of replacing it (`set_event`,
    /// `set_event_pid`, `dynamic_events` keep their content).
    pub append: bool,
    /// `O_NONBLOCK`: a stream read with nothing to give fails with `EAGAIN`.
    pub nonblock: bool,
}

impl OpenFlags {
    /// `O_RDONLY`: what `cat FILE` opens with.
    pub const READ: OpenFlags = OpenFlags {
        read: true,
        write: false,
        truncate: false,
        append: false,
        nonblock: false,
    };
    /// `O_WRONLY | O_TRUNC`: what `echo … > FILE` opens with. It opens for writing.
    pub const TRUNCATE: OpenFlags = OpenFlags {
        read: false,
        write: true,
        truncate: true,
        append: false,
        nonblock: false,
    };
    /// `O_WRONLY | O_APPEND`: what `echo … >> FILE` opens with. It opens for writing.
    pub const APPEND: OpenFlags = OpenFlags {
        read: false,
        write: true,
        truncate: false,
        append: true,
        nonblock: false,
    };
}

/// A tracefs: the whole tree one process serves.
///
/// Paths are relative to the root and `/`-separated; `""` and `"/"` name the root. Besides
/// the five operations every door (in-process, control socket, FUSE) calls, the trait has
/// helpers that do what a shell does in one line:
///
/// | shell | here |
/// | --- | --- |
/// | `cat FILE` | [`read_to_string`](Self::read_to_string) |
/// | `echo TEXT > FILE` | [`write_file`](Self::write_file) |
/// | `echo TEXT >> FILE` | [`append_file`](Self::append_file) |
/// | `cat trace_pipe` | [`read_lines`](Self::read_lines) |
///
/// [`open`](Self::open) gives the file itself, [`open_file`](Self::open_file) the same as a
/// [`std::io::Read`] and [`std::io::Write`].
pub trait FileSystem: Send + Sync {
    /// What `path` is and its mode.
    fn stat(&self, path: &str) -> Result<Stat, Errno>;
    /// The entries of the directory `path`, without `.` and `..`.
    fn readdir(&self, path: &str) -> Result<Vec<DirEntry>, Errno>;
    /// Opens the file `path`; some files act at open (see [`OpenFlags::truncate`]).
    fn open(&self, path: &str, flags: OpenFlags) -> Result<Box<dyn OpenFile>, Errno>;
    /// Makes a directory (an instance under `instances/`).
    fn mkdir(&self, path: &str) -> Result<(), Errno>;
    /// Removes a directory (an instance under `instances/`).
    fn rmdir(&self, path: &str) -> Result<(), Errno>;

    /// [`open`](Self::open), as a [`File`]: a [`std::io::Read`] and [`std::io::Write`].
    fn open_file(&self, path: &str, flags: OpenFlags) -> Result<File, Errno> {
        self.open(path, flags).map(File)
    }

    /// `cat FILE`: the file's whole content as text (invalid UTF-8 replaced).
    ///
    /// A stream file (`trace_pipe`) gives, and consumes, what it holds now without waiting
    /// for more; use [`read_lines`](Self::read_lines) to follow it.
    fn read_to_string(&self, path: &str) -> Result<String, Errno> {
        let flags = OpenFlags {
            nonblock: true,
            ..OpenFlags::READ
        };
        let mut file = self.open(path, flags)?;
        let mut bytes = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match file.read(&mut buf, None) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                // A stream with nothing more to give now: what was read is the answer.
                Err(Errno::EAGAIN) if file.is_stream() => break,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `echo TEXT > FILE`: opens with [`OpenFlags::TRUNCATE`] and writes `text` in one write,
    /// which the file parses as the kernel parses one write(2).
    fn write_file(&self, path: &str, text: &str) -> Result<(), Errno> {
        let mut file = self.open(path, OpenFlags::TRUNCATE)?;
        file.write(text.as_bytes()).map(|_| ())
    }

    /// `echo TEXT >> FILE`: as [`write_file`](Self::write_file) with [`OpenFlags::APPEND`],
    /// for files whose content a truncating open would clear (`set_event`, `dynamic_events`).
    fn append_file(&self, path: &str, text: &str) -> Result<(), Errno> {
        let mut file = self.open(path, OpenFlags::APPEND)?;
        file.write(text.as_bytes()).map(|_| ())
    }

    /// The lines of a file, without their `\n`, as an iterator.
    ///
    /// For a stream (`trace_pipe`, `per_cpu/cpuN/trace_pipe`) each line is consumed as it is
    /// read, and the iterator waits for the next one: it ends when `idle` passes with nothing
    /// new, or never with `None` (then it is `cat trace_pipe`). For other files it ends at
    /// the end of the content read at open.
    fn read_lines(&self, path: &str, idle: Option<Duration>) -> Result<Lines, Errno> {
        Ok(Lines::new(self.open(path, OpenFlags::READ)?, idle))
    }
}

/// An open tracefs file. Dropping it is `release`.
///
/// Reads of most files return a snapshot of the content taken at open; stream files
/// (`trace_pipe`, see [`is_stream`](Self::is_stream)) consume what they return and block
/// until data arrives. Each [`write`](Self::write) is parsed on its own, as a kernel
/// write(2) is, so send one command per call.
///
/// [`File`] wraps one as a [`std::io::Read`] and [`std::io::Write`].
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

/// An open file as [`std::io::Read`] and [`std::io::Write`], from [`FileSystem::open_file`]
/// or [`File::from`] a `Box<dyn OpenFile>`: for `read_to_string`, `BufReader`, `write!` and
/// `io::copy`. Reads block without a timeout, as `read(2)` does; errors become
/// [`std::io::Error`]s that carry the errno ([`std::io::Error::raw_os_error`]).
///
/// ```
/// use std::io::{Read, Write};
/// use ustrace_ctl::memfs::MemFs;
/// use ustrace_ctl::vfs::{FileSystem, OpenFlags};
///
/// let fs = MemFs::new();
/// fs.add_file("tracing_on", 0o644, b"1\n", None);
/// let mut file = fs.open_file("tracing_on", OpenFlags::TRUNCATE).unwrap();
/// write!(file, "0\n").unwrap();
/// drop(file);
/// let mut text = String::new();
/// fs.open_file("tracing_on", OpenFlags::READ).unwrap().read_to_string(&mut text).unwrap();
/// assert_eq!(text, "0\n");
/// ```
pub struct File(Box<dyn OpenFile>);

impl File {
    /// The [`OpenFile`] inside, for reads with a timeout.
    pub fn into_inner(self) -> Box<dyn OpenFile> {
        self.0
    }

    /// Whether reads consume and block ([`OpenFile::is_stream`]).
    pub fn is_stream(&self) -> bool {
        self.0.is_stream()
    }
}

impl From<Box<dyn OpenFile>> for File {
    fn from(file: Box<dyn OpenFile>) -> Self {
        File(file)
    }
}

impl std::io::Read for File {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf, None).map_err(Into::into)
    }
}

impl std::io::Write for File {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(Into::into)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Every write reaches the file at once; nothing is held back.
        Ok(())
    }
}

/// The lines of an open file, from [`FileSystem::read_lines`]: `Ok(line)` without its `\n`
/// (a last line without one is given too), `Err` when a read fails, then the end.
pub struct Lines {
    file: Box<dyn OpenFile>,
    idle: Option<Duration>,
    pending: Vec<u8>,
    done: bool,
}

impl Lines {
    /// Lines of `file`; a stream read waiting longer than `idle` ends the iteration.
    pub fn new(file: Box<dyn OpenFile>, idle: Option<Duration>) -> Self {
        Lines {
            file,
            idle,
            pending: Vec::new(),
            done: false,
        }
    }

    fn take_line(&mut self, end: usize) -> String {
        let line: Vec<u8> = self.pending.drain(..end).collect();
        if self.pending.first() == Some(&b'\n') {
            self.pending.remove(0);
        }
        String::from_utf8_lossy(&line).into_owned()
    }
}

impl Iterator for Lines {
    type Item = Result<String, Errno>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                return Some(Ok(self.take_line(end)));
            }
            if self.done {
                if self.pending.is_empty() {
                    return None;
                }
                let end = self.pending.len();
                return Some(Ok(self.take_line(end)));
            }
            let mut buf = [0u8; 4096];
            match self.file.read(&mut buf, self.idle) {
                Ok(0) => self.done = true,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(Errno::EAGAIN) if self.file.is_stream() => self.done = true,
                Err(Errno::EINTR) => {}
                Err(e) => {
                    self.done = true;
                    self.pending.clear();
                    return Some(Err(e));
                }
            }
        }
    }
}
