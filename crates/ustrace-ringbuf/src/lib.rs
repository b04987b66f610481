//! ustrace-ringbuf: the per-CPU, lock-free ring buffer every ustrace event
//! is recorded into — in the kernel's page format, in shared memory.
//!
//! ```text
//!   writer thread (any CPU, any number, nested in signal handlers)
//!        | reserve(len)   CPU from the rseq area -> CPU slot -> its region
//!        |                {pos, last_ts} updated by a restartable sequence:
//!        |                plain 16-byte store, no locked instruction (rseq.rs,
//!        |                region.rs); foreign writers fence and CAS instead
//!        | fill payload
//!        | commit()       add to the page's local commit word (rseq) or, if
//!        |                the thread moved, its remote word (lock xadd); a
//!        v                relaxed load of the waiter flag (a futex wake only if someone waits)
//!   /dev/shm/ustrace-<name>-<pid>-<n>-c<cpu>-r<k>: kernel-format pages (page.rs)
//!        ^
//!        | consume / consume_any   trace_pipe (consuming, per CPU or merged)
//!        | read_page               per_cpu/cpuN/trace_pipe_raw (swaps whole pages out)
//!        | iter / iter_cpu         trace (non-consuming, merged by time)
//!        | ShmReader               another process, read-only (shm.rs)
//! ```
//!
//! The write path takes no lock, allocates nothing and makes no system
//! call. Readers and control operations (resize, reset, swap) serialise on
//! a mutex among themselves, never with writers: a resize publishes a new
//! region and closes the old one, which writers notice and follow.
//!
//! Modules: [`clock`] (trace clocks), [`cpu`] (current CPU through rseq),
//! [`page`] (the page format, encoder and decoder), [`shm`] (files and the
//! external reader); `region` holds the lock-free ring protocol itself and
//! `rseq` the restartable sequences its owner writers run.

#![deny(missing_docs)]

pub mod clock;
pub mod cpu;
mod mapping;
pub mod page;
mod region;
mod rseq;
pub mod shm;

use clock::Clock;
use region::{RawReservation, Region, RegionCursor, RegionStats, ReserveError, Step, Writer};
use std::io;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use mapping::set_fd_floor;
pub use page::MAX_PAYLOAD;
pub use shm::ShmReader;

/// How to build a [`RingBuffer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Number of per-CPU buffers (normally [`cpu::possible_cpus`]).
    pub nr_cpus: usize,
    /// Bytes of event data per CPU, rounded up to whole pages of 4080 data bytes (at least 2 pages).
    pub size_per_cpu: usize,
    /// Overwrite the oldest events when full (else drop new ones).
    pub overwrite: bool,
    /// The trace clock.
    pub clock: Clock,
    /// Names the shared-memory files.
    pub name: String,
}

impl Default for Config {
    /// The kernel's defaults: 1408 KiB per possible CPU, overwrite, `local` clock.
    fn default() -> Self {
        Config {
            nr_cpus: cpu::possible_cpus(),
            size_per_cpu: 1408 * 1024,
            overwrite: true,
            clock: Clock::Local,
            name: "ustrace".into(),
        }
    }
}

/// Counters of one CPU buffer, as `per_cpu/cpuN/stats` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Events still in the buffer (committed, neither read nor overwritten).
    pub entries: u64,
    /// Events lost to overwriting.
    pub overrun: u64,
    /// Events dropped because the page to reuse still had a write in flight.
    pub commit_overrun: u64,
    /// Bytes of unread events (headers included).
    pub bytes: u64,
    /// Time of the oldest unread event (0 when empty).
    pub oldest_event_ts: u64,
    /// The buffer's clock now.
    pub now_ts: u64,
    /// Events dropped because the buffer was full in producer/consumer mode.
    pub dropped_events: u64,
    /// Events consumed by readers.
    pub read_events: u64,
    /// Events ever committed (= entries + overrun + read_events).
    pub written: u64,
}

/// Why [`RingBuffer::swap`] refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwapError {
    /// The buffers have different CPU counts.
    CpuCount {
        /// Ours.
        ours: usize,
        /// Theirs.
        theirs: usize,
    },
    /// A CPU buffer has a different size.
    Size {
        /// The CPU.
        cpu: usize,
        /// Our size in bytes.
        ours: usize,
        /// Theirs in bytes.
        theirs: usize,
    },
    /// Swapping a buffer with itself.
    SameBuffer,
}

impl std::fmt::Display for SwapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SwapError::CpuCount { ours, theirs } => {
                write!(f, "cannot swap buffers of {ours} and {theirs} cpus")
            }
            SwapError::Size { cpu, ours, theirs } => {
                write!(
                    f,
                    "cannot swap cpu {cpu} buffers of {ours} and {theirs} bytes"
                )
            }
            SwapError::SameBuffer => write!(f, "cannot swap a buffer with itself"),
        }
    }
}

impl std::error::Error for SwapError {}

/// An event read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The CPU buffer it was in.
    pub cpu: usize,
    /// Its timestamp in the buffer's clock.
    pub ts: u64,
    /// Events lost on this CPU just before it (`CPU:N [LOST M EVENTS]`).
    pub lost_before: u64,
    /// The payload, padded with zeros to a multiple of 4 bytes as the kernel stores it.
    pub data: Vec<u8>,
}

struct CpuSlot {
    /// The region writers reserve in; owned by `Control::keep`.
    current: AtomicPtr<Region>,
    /// Events refused because their region had just been closed (resize, reset, swap)
    /// and its successor was not published yet; reported as dropped.
    refused_closed: AtomicU64,
}

/// Reader-side view of one CPU: its regions, oldest first (the last is
/// the one writers use).
#[derive(Default)]
struct ReaderCpu {
    regions: Vec<(Arc<Region>, RegionCursor)>,
    /// Regions already drained and retired. Their counters are read live,
    /// not snapshotted at retirement: a writer that picked a region just
    /// before it was closed may still count a refusal on it afterwards, or
    /// finish moving a page slot on (which shifts its entries from the
    /// page words to the retired count). Their sum settles once such late
    /// writers are done.
    retired: Vec<Arc<Region>>,
    /// Counters of retired regions that were started over since (see
    /// `RingBuffer::new_region`), summed when they were.
    renewed: RegionStats,
}

struct Control {
    cpus: Vec<ReaderCpu>,
    /// Every region this buffer's writers may still touch; unmapped on drop
    /// (a writer may hold a region's pointer for as long as it is preempted,
    /// so only the mapping's header part outlives retirement: `Region::release`
    /// gives the pages back when a region is retired). Retired regions here
    /// are started over when a CPU needs a region of their size again
    /// (`RingBuffer::new_region`), so the list does not grow with resizes
    /// back and forth or with snapshots; `RingBuffer::limit_spares` says
    /// what the regions of ever new sizes keep.
    keep: Vec<Arc<Region>>,
    next_region: u64,
    buffer_percent: u32,
}

/// The per-CPU ring buffer. `Send + Sync`; writers never block.
pub struct RingBuffer {
    root: shm::Root,
    base: String,
    dir: PathBuf,
    nr_cpus: usize,
    slots: Box<[CpuSlot]>,
    clock: AtomicU32,
    /// While recording with the `local` clock on the TSC (the case
    /// `reserve_fast` handles), the TSC's scale to ns; 0 otherwise. One
    /// word, so that the fast path tests one value, not three, and has the
    /// scale from the cache line it reads anyway.
    fast_tsc_mult: AtomicU64,
    persistent: AtomicBool,
    control: Mutex<Control>,
    /// The process generation (see [`PROCESS_GENERATION`]) the buffer was made in.
    generation: u32,
    /// Unique in the process; names the buffer's files and marks the
    /// regions its readers own (`Region::owner`).
    serial: u64,
}

/// Bumped in the child of every `fork`. A buffer made in an earlier
/// generation was inherited: its mappings are shared with the parent, whose
/// owner writers' restartable sequences this process cannot fence (membarrier
/// reaches one process only), so a locked reservation from here could be
/// overwritten by a plain store from there. The child therefore writes
/// nothing into inherited buffers; each event it would have written counts
/// as dropped in the shared region header, where the parent's statistics
/// see it.
static PROCESS_GENERATION: AtomicU32 = AtomicU32::new(0);

extern "C" fn after_fork_in_child() {
    PROCESS_GENERATION.fetch_add(1, Ordering::Relaxed);
    // Sends every write of the child off the owner path, to where
    // `foreign_writer_here` finds the inherited buffers.
    rseq::disable_after_fork();
}

fn register_fork_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handler touches two atomics, which is async-signal-safe.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

/// Armed-flag values in the root header.
const WAKE_ON_COMMIT: u32 = 1;
const WAKE_ON_PAGE: u32 = 2;

static BUFFER_SERIAL: AtomicU64 = AtomicU64::new(0);

fn add_stats(t: &mut RegionStats, s: RegionStats) {
    t.committed += s.committed;
    t.overrun += s.overrun;
    t.dropped += s.dropped;
    t.commit_overrun += s.commit_overrun;
    t.read += s.read;
}

fn pages_for(size: usize) -> usize {
    size.div_ceil(page::DATA_SIZE).max(2)
}

/// Retired regions per CPU that keep their file, to be started over when
/// the CPU needs a region of their size again (see `RingBuffer::limit_spares`).
const SPARES_PER_CPU: usize = 4;

/// The most event data one CPU buffer may hold: 1 GiB (`buffer_size_kb`
/// 1048576). Larger sizes fail with `ENOMEM` before anything is made.
pub const MAX_SIZE_PER_CPU: usize = 1 << 30;

/// Memory for new regions of `nr_pages` pages each: the whole file, since
/// a buffer that goes round once has touched every page of it.
fn region_bytes(nr_pages: &[usize]) -> u64 {
    nr_pages
        .iter()
        .map(|&n| region::Region::file_size(n) as u64)
        .sum()
}

/// `MemAvailable` from /proc/meminfo, in bytes (`None` if unreadable).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// Free bytes of the file system the buffer files go to (tmpfs has its
/// own size limit, half of RAM by default for /dev/shm).
fn fs_available(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and a writable out-parameter.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    (st.f_bavail as u64).checked_mul(st.f_frsize as u64)
}

/// Whether new regions needing `need` bytes can be backed, given
/// `MemAvailable` and the shm file system's free space: at most half of
/// what is available either way. The kernel refuses a CPU buffer larger
/// than `MemAvailable` (`si_mem_available()`) and then may still fail to
/// allocate; half leaves the rest of the system room, and counts all CPUs
/// of the request together, since all of them will be touched.
fn backing_allows(need: u64, mem_available: Option<u64>, fs_available: Option<u64>) -> bool {
    [mem_available, fs_available]
        .into_iter()
        .flatten()
        .all(|avail| need <= avail / 2)
}

fn out_of_memory(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::OutOfMemory, what)
}

/// Refuses, before anything is mapped, sizes above [`MAX_SIZE_PER_CPU`]
/// and sets of new regions the system cannot back (see `backing_allows`).
fn check_backing(dir: &std::path::Path, size_per_cpu: &[usize]) -> io::Result<()> {
    if let Some(&big) = size_per_cpu.iter().find(|&&s| s > MAX_SIZE_PER_CPU) {
        return Err(out_of_memory(format!(
            "{big} bytes per cpu is more than the {MAX_SIZE_PER_CPU} a cpu buffer may hold"
        )));
    }
    let pages: Vec<usize> = size_per_cpu.iter().map(|&s| pages_for(s)).collect();
    let need = region_bytes(&pages);
    if !backing_allows(need, mem_available(), fs_available(dir)) {
        return Err(out_of_memory(format!(
            "{need} bytes of buffer is more than half of the memory available"
        )));
    }
    Ok(())
}

impl RingBuffer {
    /// Creates the shared-memory files and maps them. A size above
    /// [`MAX_SIZE_PER_CPU`], or more than the system can back (see
    /// [`RingBuffer::resize`]), fails with [`io::ErrorKind::OutOfMemory`]
    /// before any file is made.
    pub fn new(config: Config) -> io::Result<RingBuffer> {
        let sizes = vec![config.size_per_cpu; config.nr_cpus];
        Self::build(config, &sizes, |_, _| None)
    }

    /// `new` with each CPU's size, taking a CPU's first region from
    /// `reuse(cpu, nr_pages)` when it has one (already started over).
    fn build(
        config: Config,
        sizes: &[usize],
        mut reuse: impl FnMut(usize, usize) -> Option<Arc<Region>>,
    ) -> io::Result<RingBuffer> {
        if config.nr_cpus == 0 || config.nr_cpus > 4096 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad cpu count {}", config.nr_cpus),
            ));
        }
        if !region::has_cas128() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "cpu lacks a 16-byte compare-and-swap",
            ));
        }
        clock::init();
        cpu::init();
        rseq::init();
        register_fork_handler();
        let dir = shm::shm_dir();
        check_backing(&dir, sizes)?;
        let serial = BUFFER_SERIAL.fetch_add(1, Ordering::Relaxed) + 1;
        let base = format!(
            "ustrace-{}-{}-{}",
            shm::sanitize(&config.name),
            std::process::id(),
            serial
        );
        let root = shm::Root::create(
            &dir.join(&base),
            config.nr_cpus,
            config.clock,
            config.overwrite,
        )?;
        let mut control = Control {
            cpus: Vec::new(),
            keep: Vec::new(),
            next_region: 0,
            buffer_percent: 0,
        };
        let mut slots = Vec::new();
        let mut buf_regions = Vec::new();
        for (cpu, &size) in sizes.iter().enumerate() {
            let nr_pages = pages_for(size);
            let r = match reuse(cpu, nr_pages) {
                Some(r) => r,
                None => Arc::new(Region::create(
                    &dir.join(format!("{base}-c{cpu}-r0")),
                    cpu,
                    nr_pages,
                )?),
            };
            r.set_owner(serial);
            buf_regions.push(r);
        }
        control.next_region = 1;
        for r in buf_regions {
            slots.push(CpuSlot {
                current: AtomicPtr::new(Arc::as_ptr(&r) as *mut Region),
                refused_closed: AtomicU64::new(0),
            });
            let cursor = r.reader_start();
            control.keep.push(r.clone());
            control.cpus.push(ReaderCpu {
                regions: vec![(r, cursor)],
                retired: Vec::new(),
                renewed: RegionStats::default(),
            });
        }
        let rb = RingBuffer {
            root,
            base,
            dir,
            nr_cpus: config.nr_cpus,
            slots: slots.into_boxed_slice(),
            clock: AtomicU32::new(config.clock as u32),
            fast_tsc_mult: AtomicU64::new(0),
            persistent: AtomicBool::new(false),
            control: Mutex::new(control),
            generation: PROCESS_GENERATION.load(Ordering::Relaxed),
            serial,
        };
        {
            let ctl = rb.lock();
            for cpu in 0..rb.nr_cpus {
                rb.publish_names(&ctl, cpu);
            }
        }
        rb.update_fast_path();
        Ok(rb)
    }

    /// A buffer shaped like this one (CPU count and each CPU's size,
    /// overwrite mode, clock) to swap with it: the snapshot buffer. It
    /// starts over regions of this buffer that a dropped earlier snapshot
    /// left behind (see `take_retired`), so taking and freeing snapshots
    /// over and over keeps the number of regions bounded.
    pub fn new_like(&self, name: &str) -> io::Result<RingBuffer> {
        let sizes: Vec<usize> = (0..self.nr_cpus).map(|c| self.size_of_cpu(c)).collect();
        let config = Config {
            nr_cpus: self.nr_cpus,
            size_per_cpu: sizes[0],
            overwrite: self.overwrite(),
            clock: self.clock(),
            name: name.into(),
        };
        let mut ctl = self.lock();
        self.sweep(&mut ctl);
        let persistent = self.is_persistent();
        Self::build(config, &sizes, |cpu, nr_pages| {
            if persistent {
                return None;
            }
            // Only orphans: our own retired regions keep our counters.
            let r = ctl
                .keep
                .iter()
                .find(|r| {
                    r.cpu() == cpu
                        && r.nr_pages() == nr_pages
                        && r.is_released()
                        && r.mapping().has_fd()
                        && r.owner() != self.serial
                        && Arc::strong_count(r) == 1
                })?
                .clone();
            r.restart();
            Some(r)
        })
    }

    fn lock(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish_names(&self, ctl: &Control, cpu: usize) {
        let names: Vec<String> = ctl.cpus[cpu]
            .regions
            .iter()
            .map(|(r, _)| r.mapping().public_name())
            .collect();
        let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        self.root.set_names(cpu, &refs);
    }

    /// Reserves `len` payload bytes on the current CPU's buffer. `None` when
    /// recording is off, or the event was dropped (and counted as dropped):
    /// `len` exceeds [`MAX_PAYLOAD`], the buffer is full in producer/consumer
    /// mode, or the page to reuse is still being written.
    #[inline(always)]
    pub fn reserve(&self, len: usize) -> Option<Reservation<'_>> {
        // Both paths meet as plain values, not as a `Reservation` in memory,
        // so that the fast path's result stays in registers.
        let mult = self.fast_tsc_mult.load(Ordering::Relaxed);
        let fast = if mult != 0 && len <= MAX_PAYLOAD {
            self.reserve_fast(len, mult)
        } else {
            None
        };
        let (region, raw) = match fast {
            Some(r) => r,
            None => self.reserve_slow(len)?,
        };
        Some(Reservation {
            buf: self,
            region,
            raw,
            len,
        })
    }

    /// The owner's fast path: recording with the TSC clock (`mult` from
    /// `fast_tsc_mult`), a thread with restartable sequences, on a CPU that
    /// has a buffer, writing where the current page has room. Anything else
    /// is `None`, and `reserve_slow` sorts it out.
    #[inline(always)]
    fn reserve_fast(&self, len: usize, mult: u64) -> Option<(&Region, RawReservation)> {
        let (index, area, cpu) = self.owner_here()?;
        let slot = &self.slots[index];
        // The clock before the rest (only the slot's address is worked out
        // first, which measured about 1 ns faster than after). rdtsc is
        // microcoded and stalls the front end for as long as it runs (about
        // 8.6 ns here, with nothing else overlapping it), so what follows
        // should depend on it as late as possible.
        let now = clock::local_tsc(mult);
        // SAFETY: every pointer stored in a slot comes from an Arc kept in
        // `Control::keep` until the buffer is dropped, and `&self` outlives
        // the reservation.
        let region = unsafe { &*slot.current.load(Ordering::Acquire) };
        let raw = region.reserve_fast(len, now, area, cpu)?;
        Some((region, raw))
    }

    /// Every case the fast path leaves: recording off, other clocks,
    /// events too big, no rseq, page changes, retries, migrations, closed
    /// regions and refusals.
    #[cold]
    #[inline(never)]
    fn reserve_slow(&self, len: usize) -> Option<(&Region, RawReservation)> {
        let hdr = self.root.header();
        if hdr.recording.load(Ordering::Relaxed) == 0 || len > MAX_PAYLOAD {
            self.refuse_unrecorded();
            return None;
        }
        let clock = Clock::from_u32(self.clock.load(Ordering::Relaxed));
        let overwrite = hdr.overwrite.load(Ordering::Relaxed) != 0;
        loop {
            let Some((cpu, writer)) = self.writer_here() else {
                self.count_refused();
                return None;
            };
            let slot = &self.slots[cpu];
            let ptr = slot.current.load(Ordering::Acquire);
            // SAFETY: as in `reserve`.
            let region = unsafe { &*ptr };
            match region.reserve(len, clock, overwrite, writer) {
                Ok(raw) => {
                    if raw.entered_page() && hdr.wake_armed.load(Ordering::Relaxed) == WAKE_ON_PAGE
                    {
                        self.wake();
                    }
                    return Some((region, raw));
                }
                Err(ReserveError::Closed) => {
                    if slot.current.load(Ordering::Acquire) == ptr {
                        // Closed and not yet replaced (a reset or resize in progress): the
                        // event is lost, and counted, never silently.
                        slot.refused_closed.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
                Err(ReserveError::Migrated) => {}
                Err(ReserveError::Dropped | ReserveError::CommitOverrun) => return None,
            }
        }
    }

    /// The CPU buffer the calling thread writes to, and how: as the owner
    /// (restartable sequences, no locked instructions) when the thread has
    /// an rseq area and its CPU has a buffer of its own; as a foreign
    /// writer otherwise. `None` in a forked child for a buffer it inherited
    /// (see [`PROCESS_GENERATION`]): it must not write there.
    #[inline(always)]
    fn writer_here(&self) -> Option<(usize, Writer)> {
        if let Some((index, area, cpu)) = self.owner_here() {
            return Some((index, Writer::Owner { area, cpu }));
        }
        self.foreign_writer_here()
    }

    /// When the calling thread may write as its CPU buffer's owner:
    /// restartable sequences are on and the CPU has a buffer. Gives the
    /// slot index (checked against `slots`, so indexing needs no second
    /// check), the thread's rseq area and its CPU.
    #[inline(always)]
    fn owner_here(&self) -> Option<(usize, *mut u8, u32)> {
        let area = rseq::owner_area()?;
        // SAFETY: the area comes from `owner_area`.
        let cpu = unsafe { cpu::rseq_area_cpu(area) };
        ((cpu as usize) < self.slots.len()).then_some((cpu as usize, area, cpu))
    }

    /// A thread without an rseq area, on a CPU beyond the buffer's count,
    /// or in a forked child (which never writes as an owner).
    #[cold]
    #[inline(never)]
    fn foreign_writer_here(&self) -> Option<(usize, Writer)> {
        if PROCESS_GENERATION.load(Ordering::Relaxed) != self.generation {
            return None;
        }
        Some((cpu::current_cpu() % self.nr_cpus, Writer::Foreign))
    }

    /// Recording off is not a loss; an event too big for any page is one,
    /// and counts as dropped on the CPU that tried to write it.
    #[cold]
    #[inline(never)]
    fn refuse_unrecorded(&self) {
        if self.root.header().recording.load(Ordering::Relaxed) != 0 {
            self.count_refused();
        }
    }

    /// Counts an event that could not be written at all as dropped, in
    /// shared memory: one too big for a page, or one a forked child would
    /// have written into an inherited buffer (so the parent's stats show it).
    #[cold]
    #[inline(never)]
    fn count_refused(&self) {
        let cpu = cpu::current_cpu() % self.nr_cpus;
        // SAFETY: as in `reserve`: the region is kept until the buffer drops.
        let region = unsafe { &*self.slots[cpu].current.load(Ordering::Acquire) };
        region.count_dropped();
    }

    /// Records `data` as one event (reserve, copy, commit).
    #[inline]
    pub fn write(&self, data: &[u8]) -> bool {
        match self.reserve(data.len()) {
            Some(mut r) => {
                r.copy_from_slice(data);
                r.commit();
                true
            }
            None => false,
        }
    }

    #[inline]
    fn after_commit(&self) {
        if self.root.header().wake_armed.load(Ordering::SeqCst) == WAKE_ON_COMMIT {
            self.wake();
        }
    }

    #[cold]
    fn wake(&self) {
        let hdr = self.root.header();
        if hdr.wake_armed.swap(0, Ordering::SeqCst) != 0 {
            hdr.wake_seq.fetch_add(1, Ordering::SeqCst);
            shm::futex_wake(&hdr.wake_seq);
        }
    }

    /// Whether writers on a buffer's own CPU use restartable sequences
    /// (plain stores, no locked instructions) rather than the locked
    /// protocol: decided once per process, when the first buffer is made.
    pub fn uses_restartable_sequences() -> bool {
        rseq::enabled()
    }

    /// Turns recording on or off (`tracing_on`).
    pub fn set_recording(&self, on: bool) {
        self.root
            .header()
            .recording
            .store(on as u32, Ordering::SeqCst);
        self.update_fast_path();
    }

    /// Recomputes `fast_tsc_mult` after recording or the clock changed. Two
    /// changes racing (a `traceoff` trigger while `trace_clock` is written)
    /// could each store a value computed before the other's change; so each
    /// looks again after its store, and the last store is always checked
    /// against the inputs as they stand. Atomics only: triggers call it
    /// from the write path.
    fn update_fast_path(&self) {
        let wanted = || {
            let mult = clock::local_tsc_mult().unwrap_or(0);
            if self.is_recording() && self.clock() == Clock::Local {
                mult
            } else {
                0
            }
        };
        loop {
            let on = wanted();
            self.fast_tsc_mult.store(on, Ordering::SeqCst);
            if wanted() == on {
                return;
            }
        }
    }

    /// Whether events are recorded.
    pub fn is_recording(&self) -> bool {
        self.root.header().recording.load(Ordering::Relaxed) != 0
    }

    /// Number of CPU buffers.
    pub fn nr_cpus(&self) -> usize {
        self.nr_cpus
    }

    /// Empties every CPU buffer and zeroes its counters.
    pub fn reset(&self) {
        for cpu in 0..self.nr_cpus {
            self.reset_cpu(cpu);
        }
    }

    /// Empties one CPU buffer and zeroes its counters. Events being written
    /// concurrently are lost with the old contents.
    pub fn reset_cpu(&self, cpu: usize) {
        if cpu >= self.nr_cpus {
            return;
        }
        let mut ctl = self.lock();
        let current = ctl.cpus[cpu]
            .regions
            .last()
            .map(|(r, _)| r.clone())
            .expect("a cpu always has a region");
        current.close();
        let deadline = Instant::now() + Duration::from_millis(100);
        while !current.quiescent() && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let region = if current.quiescent() {
            current.reinit();
            current
        } else {
            // A writer is stuck mid-event: leave it the old region and start a new one.
            match self.new_region(&mut ctl, cpu, current.nr_pages()) {
                Ok(r) => r,
                Err(_) => {
                    current.reinit();
                    current
                }
            }
        };
        self.slots[cpu]
            .current
            .store(Arc::as_ptr(&region) as *mut Region, Ordering::Release);
        self.slots[cpu].refused_closed.store(0, Ordering::Relaxed);
        let cursor = region.reader_start();
        ctl.cpus[cpu] = ReaderCpu {
            regions: vec![(region, cursor)],
            retired: Vec::new(),
            renewed: RegionStats::default(),
        };
        self.publish_names(&ctl, cpu);
    }

    /// A fresh region for `cpu`: a retired one of the same size started
    /// over (see `take_retired`), or a new one.
    fn new_region(
        &self,
        ctl: &mut Control,
        cpu: usize,
        nr_pages: usize,
    ) -> io::Result<Arc<Region>> {
        self.sweep(ctl);
        if let Some(r) = self.take_retired(ctl, cpu, nr_pages) {
            r.set_owner(self.serial);
            if self.persistent.load(Ordering::Relaxed) {
                r.mapping().link()?;
            }
            return Ok(r);
        }
        let path = self
            .dir
            .join(format!("{}-c{cpu}-r{}", self.base, ctl.next_region));
        ctl.next_region += 1;
        let r = Arc::new(Region::create(&path, cpu, nr_pages)?);
        r.set_owner(self.serial);
        if self.persistent.load(Ordering::Relaxed) {
            r.mapping().link()?;
        }
        ctl.keep.push(r.clone());
        Ok(r)
    }

    /// A retired region of `cpu` with `nr_pages` pages that nothing but
    /// this buffer refers to: one of our own CPU's retired regions (its
    /// counters are added to the CPU's `renewed` sum, since starting it
    /// over zeroes them), or, when the buffer is not persistent, one a
    /// dropped partner left us (a snapshot buffer that held our regions,
    /// whose names are not ours). Writers of this buffer may still hold
    /// such a region, which is why it is in `keep` and why only this
    /// buffer's CPU `cpu` may get it back.
    fn take_retired(&self, ctl: &mut Control, cpu: usize, nr_pages: usize) -> Option<Arc<Region>> {
        let fits = |r: &Arc<Region>| {
            r.cpu() == cpu
                && r.nr_pages() == nr_pages
                && r.is_released()
                && r.mapping().has_fd()
                // No late writer still acting on what it held (see `Region::prepare_page`).
                && r.quiescent()
        };
        let rc = &mut ctl.cpus[cpu];
        // Held by `retired` and `keep` only: no iterator, no other buffer.
        if let Some(i) = rc
            .retired
            .iter()
            .position(|r| fits(r) && r.owner() == self.serial && Arc::strong_count(r) == 2)
        {
            let r = rc.retired.remove(i);
            add_stats(&mut rc.renewed, r.restart());
            return Some(r);
        }
        if self.persistent.load(Ordering::Relaxed) {
            return None;
        }
        let r = ctl
            .keep
            .iter()
            .find(|r| fits(r) && r.owner() != self.serial && Arc::strong_count(r) == 1)?
            .clone();
        // Counted by the buffer that was dropped, not by us.
        r.restart();
        Some(r)
    }

    /// Gives back the pages of regions only this buffer still refers to,
    /// for its writers' sake, because the buffer that owned them was
    /// dropped while one of them was still writing (see `Drop`).
    fn sweep(&self, ctl: &mut Control) {
        for r in &ctl.keep {
            if r.owner() != self.serial
                && Arc::strong_count(r) == 1
                && r.is_closed()
                && !r.is_released()
                && r.quiescent()
            {
                r.mapping().unlink();
                r.release();
            }
        }
        self.limit_spares(ctl);
    }

    /// Keeps at most [`SPARES_PER_CPU`] retired regions of each CPU with
    /// their file (the ones made last). A retired region keeps its file so
    /// that it can be started over (another process reaches a region by its
    /// file), but a buffer resized to ever new sizes must not hold a file
    /// per size. Past the limit a retired region loses its file, page words
    /// and slot map, and keeps only its mapping and first page (the header
    /// the write fast path reads, with the counters) until the buffer is
    /// dropped, for writers that may still hold it: a late writer only
    /// reads the rest on its way to the closed state, and reads zeros there
    /// now (`Region::forget_words`).
    fn limit_spares(&self, ctl: &mut Control) {
        for cpu in 0..self.nr_cpus {
            let spares: Vec<Arc<Region>> = ctl
                .keep
                .iter()
                .filter(|r| r.cpu() == cpu && r.is_released() && r.mapping().has_fd())
                .cloned()
                .collect();
            let extra = spares.len().saturating_sub(SPARES_PER_CPU);
            for r in &spares[..extra] {
                r.mapping().close_fd();
                r.forget_words();
            }
        }
    }

    /// Resizes every CPU buffer (bytes of data, rounded up to whole pages).
    /// Writers keep going. Events already recorded stay readable as far
    /// as they fit the new size; older ones are dropped and count as
    /// overrun, as the kernel's shrink drops its oldest pages. A size above
    /// [`MAX_SIZE_PER_CPU`], or new regions (all CPUs together) of more than
    /// half of `MemAvailable` or of the shm file system's free space, fails
    /// with [`io::ErrorKind::OutOfMemory`] and changes nothing.
    pub fn resize(&self, size_per_cpu: usize) -> io::Result<()> {
        let mut ctl = self.lock();
        let nr_pages = pages_for(size_per_cpu);
        let changing: Vec<usize> = (0..self.nr_cpus)
            .filter(|&cpu| Self::current_of(&ctl, cpu).nr_pages() != nr_pages)
            .collect();
        check_backing(&self.dir, &vec![size_per_cpu; changing.len()])?;
        for cpu in changing {
            self.resize_locked(&mut ctl, cpu, nr_pages)?;
        }
        Ok(())
    }

    /// Resizes one CPU buffer (`per_cpu/cpuN/buffer_size_kb`), as [`RingBuffer::resize`].
    pub fn resize_cpu(&self, cpu: usize, size: usize) -> io::Result<()> {
        if cpu >= self.nr_cpus {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no cpu {cpu}"),
            ));
        }
        let mut ctl = self.lock();
        let nr_pages = pages_for(size);
        if Self::current_of(&ctl, cpu).nr_pages() == nr_pages {
            return Ok(());
        }
        check_backing(&self.dir, &[size])?;
        self.resize_locked(&mut ctl, cpu, nr_pages)
    }

    fn current_of(ctl: &Control, cpu: usize) -> Arc<Region> {
        ctl.cpus[cpu]
            .regions
            .last()
            .map(|(r, _)| r.clone())
            .expect("a cpu always has a region")
    }

    fn resize_locked(&self, ctl: &mut Control, cpu: usize, nr_pages: usize) -> io::Result<()> {
        let old = Self::current_of(ctl, cpu);
        // Old contents the new size will not keep go first, so that a region
        // they leave empty can be the new one rather than a region more.
        Self::trim_closed(&mut ctl.cpus[cpu], nr_pages, true);
        Self::retire_drained(&mut ctl.cpus[cpu]);
        let new = self.new_region(ctl, cpu, nr_pages)?;
        // Publish first, then close: writers that see the closed old region
        // find the new one instead of failing.
        self.slots[cpu]
            .current
            .store(Arc::as_ptr(&new) as *mut Region, Ordering::Release);
        old.close();
        let cursor = new.reader_start();
        ctl.cpus[cpu].regions.push((new, cursor));
        Self::trim_closed(&mut ctl.cpus[cpu], nr_pages, false);
        Self::retire_drained(&mut ctl.cpus[cpu]);
        self.limit_spares(ctl);
        self.publish_names(ctl, cpu);
        Ok(())
    }

    /// Keeps at most `budget` pages of unread data in a CPU's closed
    /// regions, the newest, and in at most the newest `SLOT_NAMES - 1` of
    /// them (as many as the root file can name besides the current one):
    /// the rest is dropped (counted as overrun) and its memory given back,
    /// so that a shrink gives memory back and repeated resizes do not pile
    /// up old contents, or regions, nobody reads. A region with a write
    /// still in flight (after a short wait) is left whole. With
    /// `before_close`, the open region is about to be closed and replaced:
    /// it counts as the newest closed one, with what it holds now.
    fn trim_closed(rc: &mut ReaderCpu, budget: usize, before_close: bool) {
        let mut budget = budget;
        let open = rc.regions.len().saturating_sub(1);
        // The open region (current, or the one about to be) has a name.
        let mut named = 1;
        if before_close {
            budget = budget.saturating_sub(rc.regions[open].0.unread_pages());
            named += 1;
        }
        for (r, _) in rc.regions[..open].iter().rev() {
            if named >= shm::SLOT_NAMES {
                budget = 0;
            }
            named += 1;
            let deadline = Instant::now() + Duration::from_millis(10);
            while !r.quiescent() && Instant::now() < deadline {
                std::thread::yield_now();
            }
            let kept = if r.quiescent() {
                r.trim(budget)
            } else {
                r.nr_pages()
            };
            budget = budget.saturating_sub(kept);
        }
    }

    /// Moves closed regions that are fully read and have no write in flight
    /// off the readers' list (their counters still count, see `retired`).
    fn retire_drained(rc: &mut ReaderCpu) {
        while rc.regions.len() > 1 {
            let (r, _) = &rc.regions[0];
            if !(r.is_closed() && r.quiescent() && r.read_pos() >= r.pos()) {
                break;
            }
            r.mapping().unlink();
            let (r, _) = rc.regions.remove(0);
            // Nobody needs its events any more: give back its pages now
            // rather than when the buffer is dropped, so that resizing
            // does not grow the process by a buffer each time.
            r.release();
            rc.retired.push(r);
        }
    }

    /// Bytes of data per CPU buffer (of CPU 0; see [`RingBuffer::size_of_cpu`]).
    pub fn size_per_cpu(&self) -> usize {
        self.size_of_cpu(0)
    }

    /// Bytes of data of one CPU buffer (pages × 4080, as `buffer_size_kb` shows).
    pub fn size_of_cpu(&self, cpu: usize) -> usize {
        let ctl = self.lock();
        ctl.cpus
            .get(cpu)
            .and_then(|c| c.regions.last())
            .map_or(0, |(r, _)| r.nr_pages() * page::DATA_SIZE)
    }

    /// Overwrite mode on (oldest events overwritten) or off (new events dropped).
    pub fn set_overwrite(&self, on: bool) {
        self.root
            .header()
            .overwrite
            .store(on as u32, Ordering::SeqCst);
    }

    /// Whether overwrite mode is on.
    pub fn overwrite(&self) -> bool {
        self.root.header().overwrite.load(Ordering::Relaxed) != 0
    }

    /// Changes the trace clock. Like the kernel, this empties the buffers:
    /// timestamps of different clocks do not mix.
    pub fn set_clock(&self, clock: Clock) {
        if self.clock() == clock {
            return;
        }
        self.clock.store(clock as u32, Ordering::SeqCst);
        self.update_fast_path();
        self.root
            .header()
            .clock
            .store(clock as u32, Ordering::SeqCst);
        self.reset();
    }

    /// The trace clock.
    pub fn clock(&self) -> Clock {
        Clock::from_u32(self.clock.load(Ordering::Relaxed))
    }

    /// Wake readers only when a CPU buffer is this full (percent, 0 = on any
    /// event; the kernel's `buffer_percent`). With a non-zero value writers
    /// check for waiters only when they start a new page.
    pub fn set_buffer_percent(&self, percent: u32) {
        self.lock().buffer_percent = percent.min(100);
    }

    /// The `buffer_percent` watermark.
    pub fn buffer_percent(&self) -> u32 {
        self.lock().buffer_percent
    }

    /// The counters of one CPU buffer.
    pub fn stats(&self, cpu: usize) -> CpuStats {
        let ctl = self.lock();
        let Some(rc) = ctl.cpus.get(cpu) else {
            return CpuStats::default();
        };
        let mut t = rc.renewed;
        for r in &rc.retired {
            add_stats(&mut t, r.stats());
        }
        let mut bytes = 0;
        let mut oldest = None;
        for (r, _) in &rc.regions {
            add_stats(&mut t, r.stats());
            let (b, o) = r.unread_bytes_and_oldest();
            bytes += b;
            if oldest.is_none() {
                oldest = o;
            }
        }
        CpuStats {
            entries: t.committed.saturating_sub(t.read + t.overrun),
            overrun: t.overrun,
            commit_overrun: t.commit_overrun,
            bytes,
            oldest_event_ts: oldest.unwrap_or(0),
            now_ts: clock::now(self.clock()),
            dropped_events: t.dropped
                + self
                    .slots
                    .get(cpu)
                    .map_or(0, |s| s.refused_closed.load(Ordering::Relaxed)),
            read_events: t.read,
            written: t.committed,
        }
    }

    /// Events in all buffers (the N of `# entries-in-buffer/entries-written: N/M`).
    pub fn entries(&self) -> u64 {
        (0..self.nr_cpus).map(|c| self.stats(c).entries).sum()
    }

    /// The M of `# entries-in-buffer/entries-written: N/M`: as the kernel
    /// computes it, entries plus overrun (events consumed are not counted).
    pub fn written(&self) -> u64 {
        (0..self.nr_cpus)
            .map(|c| {
                let s = self.stats(c);
                s.entries + s.overrun
            })
            .sum()
    }

    /// Consumes the oldest event of one CPU buffer (`per_cpu/cpuN/trace_pipe`).
    pub fn consume(&self, cpu: usize) -> Option<Event> {
        let mut ctl = self.lock();
        Self::consume_locked(&mut ctl, cpu, false)
    }

    fn consume_locked(ctl: &mut Control, cpu: usize, peek: bool) -> Option<Event> {
        let rc = ctl.cpus.get_mut(cpu)?;
        loop {
            // Only the oldest region may be read: newer ones hold later events.
            let more = rc.regions.len() > 1;
            let (r, cursor) = &mut rc.regions[0];
            match r.consume(cursor, peek) {
                Ok((ts, data, lost)) => {
                    return Some(Event {
                        cpu,
                        ts,
                        lost_before: lost,
                        data,
                    });
                }
                Err(Step::Empty) if more && r.is_closed() => {}
                Err(_) => return None,
            }
            let before = rc.regions.len();
            Self::retire_drained(rc);
            if rc.regions.len() == before {
                return None;
            }
        }
    }

    /// Consumes the oldest event across all CPU buffers (`trace_pipe`).
    pub fn consume_any(&self) -> Option<Event> {
        let mut ctl = self.lock();
        let mut best: Option<(u64, usize)> = None;
        for cpu in 0..self.nr_cpus {
            if let Some(e) = Self::consume_locked(&mut ctl, cpu, true) {
                if best.is_none_or(|(ts, _)| e.ts < ts) {
                    best = Some((e.ts, cpu));
                }
            }
        }
        let (_, cpu) = best?;
        Self::consume_locked(&mut ctl, cpu, false)
    }

    /// Non-consuming iterator over every CPU buffer, merged by timestamp
    /// (the `trace` file). It sees the events present when it was created.
    pub fn iter(&self) -> Iter<'_> {
        self.make_iter(None)
    }

    /// Non-consuming iterator over one CPU buffer (`per_cpu/cpuN/trace`).
    pub fn iter_cpu(&self, cpu: usize) -> Iter<'_> {
        self.make_iter(Some(cpu))
    }

    fn make_iter(&self, only: Option<usize>) -> Iter<'_> {
        let ctl = self.lock();
        let mut cpus = Vec::new();
        for (cpu, rc) in ctl.cpus.iter().enumerate() {
            if only.is_some_and(|o| o != cpu) {
                continue;
            }
            let regions: Vec<(Arc<Region>, u64)> = rc
                .regions
                .iter()
                .map(|(r, _)| (r.clone(), r.pos()))
                .collect();
            let start = regions.first().map_or(0, |(r, _)| r.reader_start().pos);
            let lost_seen = regions.first().map_or(0, |(r, _)| r.lost_total());
            cpus.push(IterCpu {
                cpu,
                regions,
                ri: 0,
                pos: start,
                ts: 0,
                pending: Default::default(),
                done: false,
                lost_seen,
            });
        }
        Iter { _buf: self, cpus }
    }

    /// Consumes the rest of the oldest page of one CPU buffer and returns it
    /// as a kernel-format page (`per_cpu/cpuN/trace_pipe_raw`). Lost events
    /// are flagged in the page's commit field as the kernel does.
    pub fn read_page(&self, cpu: usize) -> Option<Vec<u8>> {
        let mut ctl = self.lock();
        let rc = ctl.cpus.get_mut(cpu)?;
        loop {
            let more = rc.regions.len() > 1;
            let (r, cursor) = &mut rc.regions[0];
            if let Some((page, _)) = r.read_page(cursor) {
                return Some(page);
            }
            if !(more && r.is_closed() && !r.has_data()) {
                return None;
            }
            let before = rc.regions.len();
            Self::retire_drained(rc);
            if rc.regions.len() == before {
                return None;
            }
        }
    }

    fn has_data(&self, ctl: &Control, cpu: Option<usize>) -> bool {
        let percent = ctl.buffer_percent as u64;
        ctl.cpus
            .iter()
            .enumerate()
            .filter(|(c, _)| cpu.is_none_or(|x| x == *c))
            .any(|(_, rc)| {
                rc.regions.iter().any(|(r, _)| {
                    if percent == 0 {
                        return r.has_data();
                    }
                    let cap = (r.nr_pages() * page::DATA_SIZE) as u64;
                    let used = r.pos().saturating_sub(r.read_pos());
                    used * 100 >= cap * percent && r.has_data()
                })
            })
    }

    /// Blocks until a CPU buffer (or any, for `None`) has an event to
    /// consume (`true`) or the timeout passes (`false`). Writers pay one
    /// relaxed load per event for this; the first commit after a reader
    /// started waiting makes one futex wake. Owner writers commit with a
    /// plain store and no fence before that load; the reader supplies the
    /// fence for them with one `membarrier` each time it goes to sleep
    /// (see `rseq::barrier_writers`), and re-checks every 100 ms anyway.
    pub fn wait(&self, cpu: Option<usize>, timeout: Option<Duration>) -> bool {
        let hdr = self.root.header();
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let seq = hdr.wake_seq.load(Ordering::SeqCst);
            let mode = if self.buffer_percent() == 0 {
                WAKE_ON_COMMIT
            } else {
                WAKE_ON_PAGE
            };
            hdr.wake_armed.swap(mode, Ordering::SeqCst);
            if rseq::enabled() {
                rseq::barrier_writers();
            }
            if self.has_data(&self.lock(), cpu) {
                return true;
            }
            let remaining = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    // Re-check now and then: with a watermark, wakes come only at page starts.
                    Some((d - now).min(Duration::from_millis(100)))
                }
                None => Some(Duration::from_millis(100)),
            };
            shm::futex_wait(&hdr.wake_seq, seq, remaining);
        }
    }

    /// Exchanges the contents of this buffer and `other` (the snapshot
    /// buffer), CPU by CPU, while writers keep writing. Both must have the
    /// same CPU count and per-CPU sizes. Counters move with the contents.
    pub fn swap(&self, other: &RingBuffer) -> Result<(), SwapError> {
        if std::ptr::eq(self, other) {
            return Err(SwapError::SameBuffer);
        }
        if self.nr_cpus != other.nr_cpus {
            return Err(SwapError::CpuCount {
                ours: self.nr_cpus,
                theirs: other.nr_cpus,
            });
        }
        let (mut a, mut b) = if (self as *const Self) < (other as *const Self) {
            let a = self.lock();
            (a, other.lock())
        } else {
            let b = other.lock();
            (self.lock(), b)
        };
        for cpu in 0..self.nr_cpus {
            let sa = a.cpus[cpu].regions.last().map_or(0, |(r, _)| r.nr_pages());
            let sb = b.cpus[cpu].regions.last().map_or(0, |(r, _)| r.nr_pages());
            if sa != sb {
                return Err(SwapError::Size {
                    cpu,
                    ours: sa * page::DATA_SIZE,
                    theirs: sb * page::DATA_SIZE,
                });
            }
        }
        for cpu in 0..self.nr_cpus {
            std::mem::swap(&mut a.cpus[cpu], &mut b.cpus[cpu]);
            for (rc, serial) in [(&a.cpus[cpu], self.serial), (&b.cpus[cpu], other.serial)] {
                for r in rc.regions.iter().map(|(r, _)| r).chain(&rc.retired) {
                    r.set_owner(serial);
                }
            }
            let pa = self.slots[cpu].current.load(Ordering::Acquire);
            let pb = other.slots[cpu].current.load(Ordering::Acquire);
            self.slots[cpu].current.store(pb, Ordering::Release);
            other.slots[cpu].current.store(pa, Ordering::Release);
        }
        // Writers that loaded the old pointers may still write into the
        // regions now owned by the other buffer: both keep both alive.
        let from_b: Vec<_> = b
            .keep
            .iter()
            .filter(|r| !a.keep.iter().any(|x| Arc::ptr_eq(x, r)))
            .cloned()
            .collect();
        let from_a: Vec<_> = a
            .keep
            .iter()
            .filter(|r| !b.keep.iter().any(|x| Arc::ptr_eq(x, r)))
            .cloned()
            .collect();
        a.keep.extend(from_b);
        b.keep.extend(from_a);
        for cpu in 0..self.nr_cpus {
            self.publish_names(&a, cpu);
            other.publish_names(&b, cpu);
        }
        Ok(())
    }

    /// The root file another process opens with [`ShmReader::open`]: its
    /// name in the shm directory when persistent, else `/proc/<pid>/fd/<fd>`.
    pub fn shm_path(&self) -> PathBuf {
        let name = self.root.map.public_name();
        self.dir.join(name)
    }

    /// Flight-recorder mode. Off (the default), the files are anonymous:
    /// other processes open them through `/proc/<pid>/fd/` while this
    /// process lives, and nothing is left behind when it exits, however it
    /// exits. On, every file gets a name in the shm directory and outlives
    /// the process if it dies (a crash, SIGKILL); dropping the buffer still
    /// removes them, and [`ShmReader::remove`] cleans up after a dead writer.
    pub fn set_persistent(&self, on: bool) -> io::Result<()> {
        let ctl = self.lock();
        self.persistent.store(on, Ordering::Relaxed);
        let maps = std::iter::once(&self.root.map).chain(
            ctl.cpus
                .iter()
                .flat_map(|c| c.regions.iter().map(|(r, _)| r.mapping())),
        );
        for m in maps {
            if on {
                m.link()?;
            } else {
                m.unlink();
            }
        }
        for cpu in 0..self.nr_cpus {
            self.publish_names(&ctl, cpu);
        }
        Ok(())
    }

    /// Whether the buffer is in flight-recorder mode.
    pub fn is_persistent(&self) -> bool {
        self.persistent.load(Ordering::Relaxed)
    }
}

impl Drop for RingBuffer {
    /// Unmaps the buffer's regions, except those another buffer still
    /// keeps for its own writers (regions that a swap moved between the
    /// two: a snapshot buffer holds the live buffer's former regions). No
    /// one reads those again, so they are closed here and their pages given
    /// back: what stays, until the other buffer starts them over (the next
    /// snapshot, `new_like`) or is dropped, is their file and their header,
    /// page words and slot map (and `limit_spares` bounds how many).
    fn drop(&mut self) {
        let ctl = self.control.get_mut().unwrap_or_else(|e| e.into_inner());
        ctl.cpus.clear();
        for r in ctl.keep.drain(..) {
            if r.owner() != self.serial || Arc::strong_count(&r) == 1 {
                continue;
            }
            r.close();
            let deadline = Instant::now() + Duration::from_millis(100);
            while !r.quiescent() && Instant::now() < deadline {
                std::thread::yield_now();
            }
            // Else the other buffer's `sweep` gives it back once the
            // write in flight is done.
            if r.quiescent() {
                r.mapping().unlink();
                r.release();
            }
        }
    }
}

/// A reserved event: write the payload through `DerefMut`, then
/// [`commit`](Reservation::commit) or [`discard`](Reservation::discard).
/// Dropping it discards.
pub struct Reservation<'a> {
    buf: &'a RingBuffer,
    region: &'a Region,
    raw: RawReservation,
    /// The payload length asked for, kept as the caller gave it, so that a
    /// constant length stays a constant once inlined and the caller's
    /// bounds checks on the payload fold away.
    len: usize,
}

// A reservation carries its thread's rseq area to its commit, so it must
// stay on that thread: this fails to compile if `Reservation` becomes
// `Send` (both impls would apply and the call would be ambiguous).
const _: fn() = || {
    trait AmbiguousIfSend<A> {
        fn check() {}
    }
    impl<T: ?Sized> AmbiguousIfSend<()> for T {}
    impl<T: ?Sized + Send> AmbiguousIfSend<u8> for T {}
    <Reservation<'static> as AmbiguousIfSend<_>>::check();
};

impl Reservation<'_> {
    /// Publishes the event.
    #[inline(always)]
    pub fn commit(self) {
        // Consumed without running Drop (which discards).
        let this = std::mem::ManuallyDrop::new(self);
        this.region.commit(&this.raw);
        this.buf.after_commit();
    }

    /// The event's time, as readers will see it (in the buffer clock's
    /// units): a writer that needs the time of the event it writes (the
    /// graph tracer's call and return times) takes it from here rather than
    /// reading the clock a second time.
    #[inline(always)]
    pub fn timestamp(&self) -> u64 {
        self.raw.ts
    }

    /// Withdraws the event: readers never see it and it counts as nothing.
    pub fn discard(self) {
        // Drop discards.
        drop(self);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.region.discard(&self.raw);
    }
}

impl Deref for Reservation<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: `payload..payload+len` is inside the slot this reservation
        // owns until commit/discard.
        unsafe { std::slice::from_raw_parts(self.raw.payload, self.len) }
    }
}

impl DerefMut for Reservation<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.raw.payload, self.len) }
    }
}

struct IterCpu {
    cpu: usize,
    /// Regions and the position each ended at when the iterator was made.
    regions: Vec<(Arc<Region>, u64)>,
    ri: usize,
    pos: u64,
    ts: u64,
    pending: std::collections::VecDeque<Event>,
    done: bool,
    lost_seen: u64,
}

impl IterCpu {
    fn refill(&mut self) {
        let mut lost = 0;
        while self.pending.is_empty() && !self.done {
            let Some((r, end)) = self.regions.get(self.ri) else {
                self.done = true;
                return;
            };
            let mut out = Vec::new();
            let res = if self.pos >= *end {
                Err(Step::Empty)
            } else {
                r.read_chunk(self.pos, self.ts, &mut out)
            };
            match res {
                Ok((pos, ts)) => {
                    for (ts, data) in out {
                        self.pending.push_back(Event {
                            cpu: self.cpu,
                            ts,
                            lost_before: std::mem::take(&mut lost),
                            data,
                        });
                    }
                    // Events past the iterator's end position are left for later readers.
                    self.pos = pos;
                    self.ts = ts;
                }
                Err(Step::Gone) => {
                    // Overwritten under us: jump to the oldest data still there.
                    let fresh = r.reader_start().pos;
                    let d = page::DATA_SIZE as u64;
                    let next = if fresh > self.pos {
                        fresh
                    } else {
                        (self.pos / d + 1) * d
                    };
                    let total = r.lost_total();
                    lost += total.saturating_sub(self.lost_seen).max(1);
                    self.lost_seen = total;
                    self.pos = next;
                    self.ts = 0;
                }
                Err(_) => {
                    self.ri += 1;
                    if let Some((r, _)) = self.regions.get(self.ri) {
                        self.pos = r.reader_start().pos;
                        self.ts = 0;
                        self.lost_seen = r.lost_total();
                    }
                }
            }
        }
    }
}

/// Non-consuming iterator over events (see [`RingBuffer::iter`]).
pub struct Iter<'a> {
    _buf: &'a RingBuffer,
    cpus: Vec<IterCpu>,
}

impl Iterator for Iter<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        let mut best: Option<(u64, usize)> = None;
        for (i, c) in self.cpus.iter_mut().enumerate() {
            c.refill();
            if let Some(e) = c.pending.front() {
                if best.is_none_or(|(ts, _)| e.ts < ts) {
                    best = Some((e.ts, i));
                }
            }
        }
        let (_, i) = best?;
        self.cpus[i].pending.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_takes_at_most_half_of_what_is_available() {
        const G: u64 = 1 << 30;
        // MemAvailable and the shm file system's free space both count.
        assert!(backing_allows(G, Some(2 * G), Some(2 * G)));
        assert!(!backing_allows(G + 1, Some(2 * G), Some(100 * G)));
        assert!(!backing_allows(G + 1, Some(100 * G), Some(2 * G)));
        // What cannot be read is not a limit (the kernel's own check and
        // allocation failures still are).
        assert!(backing_allows(G, None, None));
        assert!(!backing_allows(G, None, Some(G)));
    }

    #[test]
    fn the_ceiling_is_checked_before_any_arithmetic_on_the_size() {
        let dir = shm::shm_dir();
        for size in [MAX_SIZE_PER_CPU + 1, usize::MAX] {
            let e = check_backing(&dir, &[size]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        }
        check_backing(&dir, &[MAX_SIZE_PER_CPU / 1024]).unwrap();
    }
}
