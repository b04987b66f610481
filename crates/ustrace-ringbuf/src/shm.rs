//! Shared-memory files holding the buffers, and [`ShmReader`], the external
//! read-only reader.
//!
//! Every byte an event needs lives in files under `/dev/shm`, so another
//! process can map them read-only and drain the buffers without the
//! writer's help — also after the writer died (a flight recorder). The
//! layout is documented in `docs/ring-buffer-shm.md`; in short:
//!
//! ```text
//!  /dev/shm/ustrace-<name>-<pid>-<serial>            root file
//!     RootHeader: magic, nr_cpus, clock, overwrite, recording, writer pid,
//!                 futex word for waiters
//!     RootSlot[nr_cpus]: seqlock + names of the region files of that CPU
//!                        (oldest first, up to 4; the last one is written to)
//!  /dev/shm/ustrace-<name>-<pid>-<serial>-c<cpu>-r<n>  region file (one CPU ring)
//!     RegionHeader: reservation state, read position, counters
//!     page words[2 * nr_pages]: per page a local and a remote word of
//!                 lap | entries | committed bytes
//!     pages[nr_pages]: kernel-format pages (see `page`)
//! ```
//!
//! A CPU has more than one region only after a resize while data was
//! unread: the old region is drained before the new one.

use crate::clock::Clock;
use crate::page::PAGE_SIZE;
use crate::region::{Region, RegionCursor, Step};
use crate::Event;
use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

/// Magic of the root file ("USTRROOT").
pub const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"USTRROOT");
/// Magic of a region file ("USTRRING").
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"USTRRING");
/// Layout version of both files.
pub const LAYOUT_VERSION: u32 = 2;
/// Region names one root slot holds.
pub const SLOT_NAMES: usize = 4;
/// Bytes of one region name (NUL padded).
pub const NAME_LEN: usize = 56;
/// Offset of the first root slot.
pub const ROOT_SLOTS_OFFSET: usize = 128;

/// The root file header.
#[repr(C)]
pub struct RootHeader {
    /// [`ROOT_MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub version: u32,
    /// Number of per-CPU slots.
    pub nr_cpus: u32,
    /// Page size of every region (4096).
    pub page_size: u32,
    /// The trace clock (`Clock as u32`).
    pub clock: AtomicU32,
    /// 1 = overwrite mode, 0 = producer/consumer.
    pub overwrite: AtomicU32,
    /// 1 = recording (tracing_on).
    pub recording: AtomicU32,
    /// Pid of the writing process.
    pub writer_pid: u32,
    _pad0: [u32; 7],
    /// Set by a waiting reader; a writer that finds it set clears it and wakes.
    pub wake_armed: AtomicU32,
    /// Futex word readers sleep on; bumped before each wake.
    pub wake_seq: AtomicU32,
    _pad1: [u32; 14],
}

/// One CPU's entry in the root file.
#[repr(C)]
pub struct RootSlot {
    /// Seqlock: odd while the names are being rewritten.
    pub seq: AtomicU64,
    _pad: u64,
    /// Region file names (relative to the root's directory), oldest first, empty = unused.
    pub names: [[u8; NAME_LEN]; SLOT_NAMES],
}

/// Size of a root file for `nr_cpus`.
pub fn root_size(nr_cpus: usize) -> usize {
    round_up(
        ROOT_SLOTS_OFFSET + nr_cpus * std::mem::size_of::<RootSlot>(),
        4096,
    )
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

/// Keeps file-name characters to `[A-Za-z0-9_.]`, others become `_`.
pub(crate) fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .take(20)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "buf".into()
    } else {
        s
    }
}

/// The root mapping of a buffer, writer side.
pub(crate) struct Root {
    pub(crate) map: Mapping,
}

impl Root {
    pub(crate) fn create(
        path: &Path,
        nr_cpus: usize,
        clock: Clock,
        overwrite: bool,
    ) -> io::Result<Root> {
        let map = Mapping::create(path, root_size(nr_cpus))?;
        let root = Root { map };
        let h = root.header_mut_ptr();
        // SAFETY: the file is freshly created, zeroed and exclusively ours;
        // the header fits in the mapping (root_size >= 128).
        unsafe {
            (*h).version = LAYOUT_VERSION;
            (*h).nr_cpus = nr_cpus as u32;
            (*h).page_size = PAGE_SIZE as u32;
            (*h).writer_pid = std::process::id();
        }
        let hdr = root.header();
        hdr.clock.store(clock as u32, Ordering::Relaxed);
        hdr.overwrite.store(overwrite as u32, Ordering::Relaxed);
        hdr.recording.store(1, Ordering::Relaxed);
        // Magic last: a reader that sees it sees a complete header.
        // SAFETY: magic is a plain u64 inside the header, viewed as atomic to publish it.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*h).magic)) }
            .store(ROOT_MAGIC, Ordering::Release);
        Ok(root)
    }

    fn header_mut_ptr(&self) -> *mut RootHeader {
        self.map.ptr().cast()
    }

    pub(crate) fn header(&self) -> &RootHeader {
        // SAFETY: the mapping starts with a RootHeader and outlives `self`;
        // mutable fields are atomics.
        unsafe { &*self.map.ptr().cast::<RootHeader>() }
    }

    fn slot_ptr(&self, cpu: usize) -> *mut RootSlot {
        // SAFETY: root_size reserved nr_cpus slots after ROOT_SLOTS_OFFSET.
        unsafe {
            self.map
                .ptr()
                .add(ROOT_SLOTS_OFFSET)
                .cast::<RootSlot>()
                .add(cpu)
        }
    }

    /// Publishes the region names of `cpu` (oldest first) under the slot's seqlock.
    /// Callers serialise through the buffer's control lock.
    pub(crate) fn set_names(&self, cpu: usize, names: &[&str]) {
        let slot = self.slot_ptr(cpu);
        // SAFETY: slot points into our mapping; `seq` is only accessed atomically.
        let seq = unsafe { &(*slot).seq };
        let s = seq.load(Ordering::Relaxed);
        seq.store(s + 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let keep = names.len().saturating_sub(SLOT_NAMES);
        let mut buf = [[0u8; NAME_LEN]; SLOT_NAMES];
        for (dst, name) in buf.iter_mut().zip(&names[keep..]) {
            let b = name.as_bytes();
            let n = b.len().min(NAME_LEN - 1);
            dst[..n].copy_from_slice(&b[..n]);
        }
        // SAFETY: names is plain bytes inside our mapping; readers validate
        // what they copied with the seqlock, writers are serialised by the caller.
        unsafe { std::ptr::write_volatile(std::ptr::addr_of_mut!((*slot).names), buf) };
        seq.store(s + 2, Ordering::Release);
    }
}

/// Reads a root slot's names consistently (retrying while it is being rewritten).
fn read_names(base: *const u8, cpu: usize) -> Vec<String> {
    // SAFETY: the caller checked the mapping holds nr_cpus slots.
    let slot = unsafe { base.add(ROOT_SLOTS_OFFSET).cast::<RootSlot>().add(cpu) };
    loop {
        // SAFETY: slot is inside the mapping; seq is read atomically.
        let seq = unsafe { &(*slot).seq };
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        // SAFETY: a racy copy of plain bytes, validated by the seqlock below.
        let names = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*slot).names)) };
        std::sync::atomic::fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) != s1 {
            continue;
        }
        return names
            .iter()
            .map(|n| {
                let end = n.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
                String::from_utf8_lossy(&n[..end]).into_owned()
            })
            .filter(|s| !s.is_empty())
            .collect();
    }
}

/// Futex wait on a shared word (not private: readers may live in other processes).
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<std::time::Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: the futex word is a valid aligned u32 for the duration of the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            tsp,
            0usize,
            0u32,
        );
    }
}

/// Wakes every waiter on a shared futex word.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: the futex word is a valid aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

/// A read-only view of another process's (or our own) buffers, found
/// through the root file. It keeps its own read positions: it never changes
/// the writer's files, so it can drain them concurrently with the writer's
/// own consumers or after the writer died.
pub struct ShmReader {
    root: Mapping,
    dir: PathBuf,
    nr_cpus: usize,
    cpus: Vec<Vec<(Region, RegionCursor)>>,
}

impl ShmReader {
    /// Maps the root file at `path` and every region it names, read-only.
    pub fn open(path: impl AsRef<Path>) -> io::Result<ShmReader> {
        let path = path.as_ref();
        let root = Mapping::open_ro(path)?;
        if root.len() < ROOT_SLOTS_OFFSET {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "root file too small",
            ));
        }
        // SAFETY: the mapping is at least a RootHeader long (checked above).
        let hdr = unsafe { &*root.ptr().cast::<RootHeader>() };
        // SAFETY: magic is read atomically to pair with the writer's release store.
        let magic = unsafe { AtomicU64::from_ptr(std::ptr::addr_of!(hdr.magic) as *mut u64) }
            .load(Ordering::Acquire);
        if magic != ROOT_MAGIC || hdr.version != LAYOUT_VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "not a ustrace root file (magic {magic:#x}, version {})",
                    hdr.version
                ),
            ));
        }
        let nr_cpus = hdr.nr_cpus as usize;
        if root.len() < root_size(nr_cpus) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("root file too small for {nr_cpus} cpus"),
            ));
        }
        let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        let mut r = ShmReader {
            root,
            dir,
            nr_cpus,
            cpus: (0..nr_cpus).map(|_| Vec::new()).collect(),
        };
        r.refresh()?;
        Ok(r)
    }

    fn header(&self) -> &RootHeader {
        // SAFETY: checked in open.
        unsafe { &*self.root.ptr().cast::<RootHeader>() }
    }

    /// Number of per-CPU buffers.
    pub fn nr_cpus(&self) -> usize {
        self.nr_cpus
    }

    /// Pid of the process that created the buffers.
    pub fn writer_pid(&self) -> u32 {
        self.header().writer_pid
    }

    /// The trace clock the buffers were stamped with.
    pub fn clock(&self) -> Clock {
        Clock::from_u32(self.header().clock.load(Ordering::Relaxed))
    }

    /// Whether the buffers are in overwrite mode.
    pub fn overwrite(&self) -> bool {
        self.header().overwrite.load(Ordering::Relaxed) != 0
    }

    /// Re-reads which region files each CPU uses (after a resize or swap by
    /// the writer); positions in regions already known are kept.
    pub fn refresh(&mut self) -> io::Result<()> {
        for cpu in 0..self.nr_cpus {
            let names = read_names(self.root.ptr(), cpu);
            let mut next = Vec::new();
            for name in names {
                // Names are relative to the root's directory, or absolute /proc paths.
                let path = self.dir.join(&name);
                if let Some(i) = self.cpus[cpu].iter().position(|(r, _)| r.path() == path) {
                    next.push(self.cpus[cpu].remove(i));
                } else {
                    let region = Region::open_ro(&path)?;
                    let cursor = region.reader_start();
                    next.push((region, cursor));
                }
            }
            self.cpus[cpu] = next;
        }
        Ok(())
    }

    /// The next unread event of `cpu` in this reader's own order, if one is
    /// committed and readable now.
    pub fn next_event(&mut self, cpu: usize) -> Option<Event> {
        let list = self.cpus.get_mut(cpu)?;
        for (region, cursor) in list.iter_mut() {
            if region.generation() != cursor.generation {
                // The writer reset this buffer: start over from its new contents.
                *cursor = region.reader_start();
            }
            for _ in 0..64 {
                match region.step(cursor.pos, cursor.ts) {
                    Step::Event {
                        event,
                        next_pos,
                        next_ts,
                    } => {
                        cursor.pos = next_pos;
                        cursor.ts = next_ts;
                        let lost = std::mem::take(&mut cursor.lost);
                        return Some(Event {
                            cpu,
                            ts: event.0,
                            lost_before: lost,
                            data: event.1,
                        });
                    }
                    Step::Skip { next_pos, next_ts } => {
                        cursor.pos = next_pos;
                        cursor.ts = next_ts;
                    }
                    Step::Gone => {
                        // Overwritten before we got to it: jump to the oldest data left.
                        let fresh = region.reader_start();
                        let d = crate::page::DATA_SIZE as u64;
                        cursor.pos = if fresh.pos > cursor.pos {
                            fresh.pos
                        } else {
                            (cursor.pos / d + 1) * d
                        };
                        cursor.ts = 0;
                        let total = region.lost_total();
                        cursor.lost += total.saturating_sub(cursor.lost_seen);
                        cursor.lost_seen = total;
                    }
                    Step::Empty | Step::Busy => break,
                }
            }
        }
        None
    }

    /// Every event readable now, all CPUs merged by timestamp.
    pub fn read_all(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        for cpu in 0..self.nr_cpus {
            while let Some(e) = self.next_event(cpu) {
                out.push(e);
            }
        }
        out.sort_by_key(|e| (e.ts, e.cpu));
        out
    }

    /// Forgets this reader's positions: the next reads start again from the
    /// oldest data the writer has not consumed itself.
    pub fn rewind(&mut self) {
        for list in &mut self.cpus {
            for (region, cursor) in list.iter_mut() {
                *cursor = region.reader_start();
            }
        }
    }

    /// Removes the files of the buffers whose root is at `path` (cleanup
    /// after a writer died; a live writer removes its own files on drop).
    pub fn remove(path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let r = ShmReader::open(path)?;
        for list in &r.cpus {
            for (region, _) in list {
                let _ = std::fs::remove_file(region.path());
            }
        }
        std::fs::remove_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The offsets docs/ring-buffer-shm.md promises.
    #[test]
    fn root_layout_matches_the_document() {
        assert_eq!(offset_of!(RootHeader, magic), 0);
        assert_eq!(offset_of!(RootHeader, version), 8);
        assert_eq!(offset_of!(RootHeader, nr_cpus), 12);
        assert_eq!(offset_of!(RootHeader, page_size), 16);
        assert_eq!(offset_of!(RootHeader, clock), 20);
        assert_eq!(offset_of!(RootHeader, overwrite), 24);
        assert_eq!(offset_of!(RootHeader, recording), 28);
        assert_eq!(offset_of!(RootHeader, writer_pid), 32);
        assert_eq!(offset_of!(RootHeader, wake_armed), 64);
        assert_eq!(offset_of!(RootHeader, wake_seq), 68);
        assert_eq!(size_of::<RootHeader>(), ROOT_SLOTS_OFFSET);
        assert_eq!(offset_of!(RootSlot, names), 16);
        assert_eq!(size_of::<RootSlot>(), 240);
        assert_eq!(root_size(2), 4096);
    }

    #[test]
    fn names_are_sanitized() {
        assert_eq!(sanitize("my/buf name"), "my_buf_name");
        assert_eq!(sanitize(""), "buf");
        assert_eq!(sanitize("a-b"), "a_b");
    }
}
