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
use crate::mapping::{round_up, Mapping};
use crate::page::PAGE_SIZE;
use crate::region::{PageCopy, Region, RegionCursor, Step};
use crate::Event;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Magic of the root file ("USTRROOT").
pub const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"USTRROOT");
pub use crate::mapping::{shm_dir, LAYOUT_VERSION, REGION_MAGIC};
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

    /// The next whole page of `cpu` this reader has not handed out, copied into `buf`
    /// in the kernel's `trace_pipe_raw` form (`commit` = valid bytes, with the
    /// missed-events flags and count when events were lost before it). Returns the
    /// page's data length and the events lost before it, or `None` when no complete
    /// page is ready. `partial`: also take the page writers are filling, up to what is
    /// committed — for the last read, once the writer is gone or recording stops. This
    /// is the recorder's drain: a page copy, no decoding.
    pub fn read_page(
        &mut self,
        cpu: usize,
        buf: &mut [u8; PAGE_SIZE],
        partial: bool,
    ) -> Option<(usize, u64)> {
        let writer_gone = partial && !self.writer_alive();
        let list = self.cpus.get_mut(cpu)?;
        for (region, cursor) in list.iter_mut() {
            match region.copy_page_at(cursor, buf, partial) {
                PageCopy::Page { len, lost } => return Some((len, lost)),
                PageCopy::Empty => continue,
                // An older region's page in flight holds the newer ones back (order).
                PageCopy::Busy if !partial => return None,
                PageCopy::Busy => {}
            }
            // The last read: a page left incomplete by a writer that stopped inside an
            // event (killed) gives up what it committed.
            if writer_gone {
                if let Some(PageCopy::Page { len, lost }) = region.salvage_page_at(cursor, buf) {
                    return Some((len, lost));
                }
            }
            return None;
        }
        None
    }

    /// Whether the process that writes the buffers still exists (a zombie counts as
    /// gone: it writes no more).
    pub fn writer_alive(&self) -> bool {
        let pid = self.writer_pid();
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
            Err(_) => false,
        }
    }

    /// Counters of `cpu`, summed over its regions: (entries committed, overrun, commit
    /// overrun, dropped, events read by the writer's own consuming readers).
    pub fn cpu_counters(&self, cpu: usize) -> (u64, u64, u64, u64, u64) {
        let mut sum = (0, 0, 0, 0, 0);
        for (region, _) in self.cpus.get(cpu).map(Vec::as_slice).unwrap_or(&[]) {
            let c = region.counters();
            sum.0 += c.committed;
            sum.1 += c.overrun;
            sum.2 += c.commit_overrun;
            sum.3 += c.dropped;
            sum.4 += c.read;
        }
        sum
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
