//! One shared-memory file mapped into this process: the floor both the root file
//! ([`crate::shm`]) and the per-CPU region files ([`crate::region`]) stand on.
//!
//! It knows how to create an anonymous file in the shm directory (or a memfd), link it
//! under a name for a persistent buffer, open another process's file read-only, and unmap
//! and unlink on drop; it knows nothing of what the bytes mean beyond the two words every
//! file of a buffer starts with.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// Magic of a region file ("USTRRING").
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"USTRRING");
/// Layout version of both files.
pub const LAYOUT_VERSION: u32 = 2;

/// The lowest fd number the buffers' files get (0: wherever the kernel puts them).
static FD_FLOOR: AtomicI32 = AtomicI32::new(0);

/// Makes the files of buffers created from now on take fd numbers at or above `floor`
/// (where the limit on open files allows), so a program that does not know it is traced
/// (the preload agent's targets) never meets them among the low numbers it uses itself.
pub fn set_fd_floor(floor: i32) {
    FD_FLOOR.store(floor, Ordering::Relaxed);
}

/// `fd` moved to the fd floor, if one is set and there is room above it.
fn above_floor(fd: libc::c_int) -> libc::c_int {
    let floor = FD_FLOOR.load(Ordering::Relaxed);
    if floor <= 0 || fd >= floor {
        return fd;
    }
    // SAFETY: duplicating our own open fd; the copy is close-on-exec like the original.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) };
    if high < 0 {
        return fd;
    }
    // SAFETY: our fd, replaced by `high`.
    unsafe { libc::close(fd) };
    high
}

pub(crate) fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

/// A mapped shared-memory file.
///
/// Writer-side files are created anonymous (`O_TMPFILE` in the shm
/// directory, or a memfd) so that a process that exits without dropping its
/// buffers — a `static` one, or a crash — leaves nothing behind. Other
/// processes reach them through `/proc/<pid>/fd/<fd>` while the writer
/// lives. A *persistent* buffer (flight recorder) links its files under
/// their names in the shm directory, where they outlive the writer.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// The open file of a writer-side mapping (-1 for read-only ones, and
    /// once [`Mapping::release`] closed it).
    fd: AtomicI32,
    /// Read-only: the path opened. Writer: where the file is linked when persistent.
    path: PathBuf,
    /// 1 while the file is linked at `path` by us (unlinked on drop).
    linked: AtomicU32,
}

// SAFETY: the mapping is plain shared memory; all concurrent access to it
// goes through atomics or the ring's reservation protocol.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates an anonymous zeroed read-write file of `len` bytes that can
    /// later be linked at `path` (see [`Mapping::link`]).
    pub(crate) fn create(path: &Path, len: usize) -> io::Result<Mapping> {
        let dir = path.parent().unwrap_or(Path::new("/dev/shm"));
        let cdir = cpath(dir)?;
        // SAFETY: valid NUL-terminated directory path; O_TMPFILE creates an unnamed file in it.
        let mut fd = unsafe {
            libc::open(
                cdir.as_ptr(),
                libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            // SAFETY: a static NUL-terminated name.
            fd = unsafe { libc::memfd_create(c"ustrace-ring".as_ptr(), libc::MFD_CLOEXEC) };
        }
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = above_floor(fd);
        // SAFETY: fd is a file we just created.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Self::map_fd(fd, len, libc::PROT_READ | libc::PROT_WRITE, path, true)
    }

    /// Maps an existing file read-only, whole.
    pub(crate) fn open_ro(path: &Path) -> io::Result<Mapping> {
        let c = cpath(path)?;
        // SAFETY: valid NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: an all-zero stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open, st is writable.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Self::map_fd(fd, st.st_size as usize, libc::PROT_READ, path, false)
    }

    fn map_fd(
        fd: libc::c_int,
        len: usize,
        prot: libc::c_int,
        path: &Path,
        keep_fd: bool,
    ) -> io::Result<Mapping> {
        let fail = |e: io::Error| {
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
            Err(e)
        };
        if len == 0 {
            return fail(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is empty", path.display()),
            ));
        }
        // SAFETY: mapping `len` bytes of an open file, shared; checked for MAP_FAILED.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return fail(io::Error::last_os_error());
        }
        let fd = if keep_fd {
            fd
        } else {
            // SAFETY: the mapping keeps its own reference to the file.
            unsafe { libc::close(fd) };
            -1
        };
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            fd: AtomicI32::new(fd),
            path: path.to_path_buf(),
            linked: AtomicU32::new(0),
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The path a read-only mapping was opened at, or where a writer's file is linked when persistent.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// How another process opens this file now: its name in the shm
    /// directory when linked, else `/proc/<pid>/fd/<fd>`.
    pub(crate) fn public_name(&self) -> String {
        let fd = self.fd.load(Ordering::Relaxed);
        if self.linked.load(Ordering::Relaxed) != 0 || fd < 0 {
            self.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            format!("/proc/{}/fd/{fd}", std::process::id())
        }
    }

    /// Whether the file is still open (another process can reach it).
    pub(crate) fn has_fd(&self) -> bool {
        self.fd.load(Ordering::Relaxed) >= 0
    }

    /// Closes the file; the mapping stays, valid for whoever still holds it.
    pub(crate) fn close_fd(&self) {
        let fd = self.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: our fd, taken out of the mapping so nothing uses it again.
            unsafe { libc::close(fd) };
        }
    }

    /// Gives back the memory of `[offset, offset + len)` (page aligned):
    /// reads of the range see zeros from then on, and writes allocate
    /// afresh. Best effort: a file system that cannot punch holes keeps the
    /// memory.
    pub(crate) fn punch(&self, offset: usize, len: usize) {
        debug_assert!(offset.is_multiple_of(4096) && offset + len <= self.len);
        if len > 0 {
            // SAFETY: the range lies inside our shared mapping; MADV_REMOVE
            // frees its backing store and later accesses fault in zero pages,
            // so no reader of the mapping can fault on it.
            unsafe { libc::madvise(self.ptr.add(offset).cast(), len, libc::MADV_REMOVE) };
        }
    }

    /// Gives the (anonymous) file its name, so it outlives the process.
    pub(crate) fn link(&self) -> io::Result<()> {
        let fd = self.fd.load(Ordering::Relaxed);
        if fd < 0 || self.linked.load(Ordering::Relaxed) != 0 {
            return Ok(());
        }
        let from = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
        let to = cpath(&self.path)?;
        // SAFETY: valid NUL-terminated paths; linking an O_TMPFILE file by its
        // /proc/self/fd link is how such a file gets a name without privileges.
        let r = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot name {}: {e}", self.path.display()),
            ));
        }
        self.linked.store(1, Ordering::Relaxed);
        Ok(())
    }

    /// Removes the file's name (the mapping stays).
    pub(crate) fn unlink(&self) {
        if self.linked.swap(0, Ordering::Relaxed) != 0 {
            if let Ok(c) = cpath(&self.path) {
                // SAFETY: valid path of a name this process created.
                unsafe { libc::unlink(c.as_ptr()) };
            }
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing references
        // the mapping once its owner is dropped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        let fd = *self.fd.get_mut();
        if fd >= 0 {
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
        }
        self.unlink();
    }
}

fn cpath(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {} contains NUL", path.display()),
        )
    })
}

/// The directory shared-memory files go to: `/dev/shm` when it is a
/// writable directory, else the temporary directory.
pub fn shm_dir() -> PathBuf {
    let dev_shm = Path::new("/dev/shm");
    if let Ok(c) = cpath(dev_shm) {
        // SAFETY: valid path; access only checks permissions.
        if dev_shm.is_dir() && unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0 {
            return dev_shm.to_path_buf();
        }
    }
    std::env::temp_dir()
}
