//! One CPU's ring of pages and the lock-free protocol writers and readers
//! follow on it. A "region" is one shared-memory file; `RingBuffer` keeps
//! one per CPU (more only transiently, after a resize).
//!
//! # Positions
//!
//! Writers and readers talk in *positions*: a byte counter over an endless
//! sequence of page data areas (4080 bytes each). Position `p` is byte
//! `p % 4080` of page sequence number `s = p / 4080`, which lives in page
//! slot `s % nr_pages` during lap `s / nr_pages`.
//!
//! ```text
//!  seq:   0      1      2      3      4      5   ...   (nr_pages = 3)
//!  slot: [0]    [1]    [2]    [0]    [1]    [2]
//!        |--lap 0-----------|--lap 1-----------|
//! ```
//!
//! # Writers (any number, any thread, at once, also nested in signal handlers)
//!
//! The reservation state is 16 bytes — `{pos, last_ts}`. Taking the
//! timestamp before the update and storing it with the position is what
//! makes the kernel's delta encoding work with several writers: whoever
//! moves the state knows exactly which event precedes it and its time, and
//! `ts = max(clock, last_ts)` keeps time monotonic within the ring. A
//! thread on the region's own CPU moves it inside a restartable sequence
//! (compare, then one plain 16-byte store; see `rseq.rs`); anybody else
//! fences those sequences out and uses a double-width CAS.
//!
//! ```text
//!  reserve(len):  load {pos,last}; ts = max(now,last)
//!                 fits in page?      -> new pos = pos + size (+8 for a time extend)
//!                 else               -> pad the page end, event at next page start
//!                 entering page seq e (reusing slot of seq v = e - nr_pages if e >= nr_pages):
//!                    v not fully committed              -> drop (commit overrun)
//!                    producer/consumer and v unread     -> drop (dropped)
//!                    overwrite: push the read position past v (overrun += unread)
//!                    move the slot's commit words and map entry to e's lap
//!                 store {pos,last} -> {new pos, ts} if unchanged; else retry
//!  fill payload
//!  commit:        on the region's CPU: local word += (1 entry, size) (rseq)
//!                 elsewhere:           remote word += (1 entry, size) (lock xadd)
//! ```
//!
//! A page word packs `lap+1 : 40 | entries : 12 | committed bytes : 12`;
//! a slot's state is its two words added. A page is complete when that
//! says "this lap, 4080 bytes": every byte reserved in it — events, time
//! extends, discards and end padding — has been committed. Commits may
//! finish in any order; nobody waits for anybody.
//!
//! # Readers
//!
//! Slots are mapped to physical pages through a slot map, with one
//! physical page more than slots: the consuming page reader's spare. The
//! page reader (`trace_pipe_raw`) swaps a complete page out of the ring
//! for its spare, as in ring-buffer-design.rst, and reads it undisturbed.
//!
//! The consuming reader keeps `read = pos << 12 | events read in that page`
//! in the region header and advances it with CAS. An overwriting writer
//! moves it forward *before* it claims the page, so a consumer that copied
//! an event and then fails its CAS knows the copy may be torn and retries.
//! Readers that do not consume (the `trace` iterator, `ShmReader`) copy a
//! page and then check the reservation position has not entered the
//! page's next lap and the slot map entry is unchanged (a seqlock). A
//! partially filled tail page is readable when it is quiescent: `pos`
//! unchanged around reading its page word and the word's byte count equals
//! `pos`'s offset.
//!
//! # Retirement
//!
//! A resize closes a region (no reservation succeeds after that) and
//! starts a new one; `trim` drops the closed region's oldest unread pages
//! that the new size has no room for. Once the closed region is quiescent
//! and read to its end it is retired: `release` punches out its pages and
//! sets `released` in the header, and a reader still holding it then sees
//! it as empty. The header, page words and slot map stay, for the counters
//! and for writers that still hold the region's pointer; `restart` later
//! makes it an empty, open region of its CPU again, in place.

use crate::clock::{self, Clock};
use crate::mapping::{Mapping, LAYOUT_VERSION, REGION_MAGIC};
use crate::page::{
    self, event_size, payload_offset, write_data_header, write_end_padding, write_time_extend,
    PageDecoder, RecordKind, DATA_SIZE, PAGE_HEADER_SIZE, PAGE_SIZE, TIME_EXTEND_SIZE, TS_MASK,
    TS_SHIFT,
};
use crate::rseq;
use std::io;
use std::path::Path;
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Data bytes per page, as a position unit.
pub(crate) const D: u64 = DATA_SIZE as u64;
/// Bit of `pos` that closes the region to new reservations.
pub(crate) const CLOSED: u64 = 1 << 63;

// Region header offsets (documented in docs/ring-buffer-shm.md).
pub(crate) const OFF_MAGIC: usize = 0;
pub(crate) const OFF_VERSION: usize = 8;
pub(crate) const OFF_CPU: usize = 12;
pub(crate) const OFF_NR_PAGES: usize = 16;
pub(crate) const OFF_PAGE_SIZE: usize = 20;
pub(crate) const OFF_WORDS: usize = 24;
pub(crate) const OFF_PAGES: usize = 32;
pub(crate) const OFF_GENERATION: usize = 40;
pub(crate) const OFF_MAP: usize = 48;
pub(crate) const OFF_STATE: usize = 64;
pub(crate) const OFF_FOREIGN: usize = 80;
// `rseq::store_state_if` finds the foreign word 16 bytes past the state.
const _: () = assert!(OFF_FOREIGN == OFF_STATE + 16);
pub(crate) const OFF_RELEASED: usize = 88;
pub(crate) const OFF_READ: usize = 128;
pub(crate) const OFF_LOST_REPORTED: usize = 136;
pub(crate) const OFF_SPARE: usize = 144;
pub(crate) const OFF_OVERRUN: usize = 192;
pub(crate) const OFF_DROPPED: usize = 200;
pub(crate) const OFF_COMMIT_OVERRUN: usize = 208;
pub(crate) const OFF_RETIRED: usize = 216;
pub(crate) const OFF_READ_EVENTS: usize = 224;
pub(crate) const WORDS_START: usize = 256;

/// Bytes per page slot in the word array: a `local` and a `remote` word.
const WORD_STRIDE: usize = 16;
/// A slot map entry: `tag:31 | swapped:1 | phys:32` — which physical page
/// holds the slot, for which lap (`(lap + 1) mod 2^31`, 0 = never used),
/// and whether the consuming reader swapped the page out (then the slot's
/// physical page holds nothing of that lap).
const MAP_SWAPPED: u64 = 1 << 32;
const MAP_TAG_SHIFT: u32 = 33;
const MAP_TAG_MASK: u64 = (1 << 31) - 1;

#[inline(always)]
fn map_phys(m: u64) -> usize {
    m as u32 as usize
}
#[inline(always)]
fn map_tag(m: u64) -> u64 {
    m >> MAP_TAG_SHIFT
}
#[inline(always)]
fn map_entry(phys: usize, tag: u64) -> u64 {
    phys as u64 | (tag & MAP_TAG_MASK) << MAP_TAG_SHIFT
}

/// Where writers are: the page they write in, so that the owner's fast
/// path finds its offset and its page with neither a division (by the data
/// size, or by `nr_pages`) nor a look at the slot map.
///
/// `start` is the position of the page's first data byte (`seq * D`), or
/// [`NO_PAGE`]; `place` is `word << 32 | index`: the byte offset in the
/// mapping of the slot's local commit word, and the page's place among
/// the mapping's pages (header pages first). The pair only
/// changes as a whole (a double-width CAS) and only forwards: a hint is
/// replaced only by one for a later page. So a writer that reads `start`
/// (acquire) and then `place` sees either one hint, or a `place` newer than
/// its `start`. A newer place means some writer has entered a later page,
/// which moved the reservation state on before the hint was made: the fast
/// path, which only trusts the hint when the position it read is inside
/// `start`'s page, then fails its sequence's compare of that position.
#[repr(C, align(16))]
struct PageHint {
    start: AtomicU64,
    place: AtomicU64,
}

/// `PageHint::start` before any page is hinted: no position (they stay far
/// below 2^62) is within a page of it, whether closed or not, so the fast
/// path's one offset check fails on it.
const NO_PAGE: u64 = 3 << 62;

impl PageHint {
    const fn new() -> Self {
        PageHint {
            start: AtomicU64::new(NO_PAGE),
            place: AtomicU64::new(0),
        }
    }
}

const WORD_BYTES_BITS: u32 = 12;
const WORD_ENTRIES_BITS: u32 = 12;
const WORD_TAG_SHIFT: u32 = WORD_BYTES_BITS + WORD_ENTRIES_BITS;
const READ_NREAD_BITS: u32 = 12;

#[inline]
fn combine_words(local: u64, remote: u64) -> u64 {
    let (lt, rt) = (word_tag(local), word_tag(remote));
    if lt == rt {
        local + (remote & ((1 << WORD_TAG_SHIFT) - 1))
    } else {
        lt.max(rt) << WORD_TAG_SHIFT
    }
}

#[inline]
fn word_tag(w: u64) -> u64 {
    w >> WORD_TAG_SHIFT
}
#[inline]
fn word_entries(w: u64) -> u64 {
    (w >> WORD_BYTES_BITS) & ((1 << WORD_ENTRIES_BITS) - 1)
}
#[inline]
fn word_bytes(w: u64) -> u64 {
    w & ((1 << WORD_BYTES_BITS) - 1)
}
#[inline]
fn read_pack(pos: u64, nread: u64) -> u64 {
    (pos << READ_NREAD_BITS) | nread.min((1 << READ_NREAD_BITS) - 1)
}
#[inline]
fn read_unpack(r: u64) -> (u64, u64) {
    (r >> READ_NREAD_BITS, r & ((1 << READ_NREAD_BITS) - 1))
}

/// Why a reservation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReserveError {
    /// The region was closed (resize, reset, swap); look up the current one.
    Closed,
    /// Producer/consumer mode and the buffer is full (counted as dropped).
    Dropped,
    /// The page to reuse still has writes in flight (counted as commit overrun).
    CommitOverrun,
    /// The thread is no longer on the CPU it named; pick the buffer again.
    Migrated,
}

/// Who is writing, which decides the instructions the protocol may use.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Writer {
    /// A thread on the region's own CPU, with its rseq area: plain stores
    /// inside restartable sequences (see `rseq.rs`).
    Owner {
        /// The thread's registered rseq area.
        area: *mut u8,
        /// The region's CPU, which the sequences check the thread is on.
        cpu: u32,
    },
    /// Anybody else: locked instructions, fenced from owners when they use
    /// restartable sequences.
    Foreign,
}

/// What became of one attempt to store a new reservation state.
enum StateStore {
    Done,
    Retry,
    Migrated,
}

/// A reserved slot, between `reserve` and `commit`/`discard`.
///
/// Four words, which travel in registers through the inlined write path,
/// so that a commit looks nothing up: the payload pointer, the page
/// slot's local commit word (its remote word follows it), the reserving
/// thread's rseq area (null when owners do not use restartable sequences;
/// a reservation is not `Send`, so the committing thread is that one), and
/// `total:12 | 1 | extend:1 | entered:1`. The low 13 bits of that are, as
/// they stand, what a commit adds to the commit word (`total` bytes, one
/// entry; see `WORD_BYTES_BITS`). Everything else a discard needs is in
/// the slot itself. A fifth word, the event's time, is only kept by the
/// writers that ask for it (`Reservation::timestamp`); elsewhere it folds
/// away.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawReservation {
    pub(crate) payload: *mut u8,
    word: *mut u64,
    area: *mut u8,
    meta: u32,
    /// The region's CPU, which a commit checks the thread is on: carried here so that
    /// committing needs no load from the region (nor the region in a register meanwhile).
    cpu: u32,
    /// The event's absolute time, as readers will see it.
    pub(crate) ts: u64,
}

const META_EXTEND: u32 = 1 << (WORD_BYTES_BITS + 1);
const META_ENTERED: u32 = META_EXTEND << 1;
const META_COMMIT_MASK: u32 = META_EXTEND - 1;

impl RawReservation {
    /// `word`: the local commit word of the page's slot; `area`: the
    /// thread's rseq area from `rseq::owner_area`, or null; `cpu`: the
    /// region's CPU.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn new(
        payload: *mut u8,
        word: *mut u64,
        area: *mut u8,
        cpu: u32,
        total: usize,
        extend: bool,
        entered: bool,
        ts: u64,
    ) -> Self {
        debug_assert!(total < 1 << WORD_BYTES_BITS);
        RawReservation {
            payload,
            word,
            area,
            cpu,
            meta: total as u32
                | 1 << WORD_BYTES_BITS
                | if extend { META_EXTEND } else { 0 }
                | if entered { META_ENTERED } else { 0 },
            ts,
        }
    }

    /// Bytes reserved: event, plus its time extend if it has one.
    #[inline(always)]
    fn total(&self) -> usize {
        self.meta as usize & ((1 << WORD_BYTES_BITS) - 1)
    }
    /// What committing adds to the page's commit word: `total` bytes and
    /// one entry.
    #[inline(always)]
    fn commit_add(&self) -> u64 {
        u64::from(self.meta & META_COMMIT_MASK)
    }
    #[inline(always)]
    fn extend(&self) -> bool {
        self.meta & META_EXTEND != 0
    }
    /// Whether this reservation started a new page.
    #[inline(always)]
    pub(crate) fn entered_page(&self) -> bool {
        self.meta & META_ENTERED != 0
    }
}

/// A reader's private position in a region (`ShmReader`, or the consuming
/// reader's cache of the timestamp at its position).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RegionCursor {
    pub(crate) pos: u64,
    /// Absolute time at `pos` (time of the record before it); 0 = unknown.
    pub(crate) ts: u64,
    pub(crate) lost: u64,
    pub(crate) lost_seen: u64,
    pub(crate) generation: u64,
    /// Events in the pages this reader copied since `lost_seen` was taken (page reads):
    /// the writer counts them as overrun once it reuses their pages, though they were
    /// not lost to this reader.
    pub(crate) copied: u64,
}

/// One step of a reader at a position.
pub(crate) enum Step {
    /// A data event `(ts, payload)`; the reader moves to `next_pos`.
    Event {
        event: (u64, Vec<u8>),
        next_pos: u64,
        next_ts: u64,
    },
    /// No event, but the reader moves over padding/time records.
    Skip { next_pos: u64, next_ts: u64 },
    /// Nothing committed after the position yet.
    Empty,
    /// Data is reserved but still being written.
    Busy,
    /// The page at the position was overwritten.
    Gone,
}

enum PageState {
    Empty,
    Busy,
    Gone,
    Ready(usize),
}

/// What [`Region::copy_page_at`] found.
pub(crate) enum PageCopy {
    /// A page was copied: `len` bytes of data, `lost` events missed before it.
    Page { len: usize, lost: u64 },
    /// Nothing committed after the position yet.
    Empty,
    /// The next page is still being written.
    Busy,
}

/// Counters of one region.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RegionStats {
    pub(crate) committed: u64,
    pub(crate) overrun: u64,
    pub(crate) dropped: u64,
    pub(crate) commit_overrun: u64,
    pub(crate) read: u64,
}

/// One CPU ring in one shared-memory file.
pub(crate) struct Region {
    map: Mapping,
    nr_pages: usize,
    words_off: usize,
    map_off: usize,
    pages_off: usize,
    /// The CPU whose restartable sequences own the local commit words.
    cpu: u32,
    /// The page writers are in (see [`PageHint`]).
    page_hint: PageHint,
    /// Serial of the buffer whose readers own the region (`RingBuffer`
    /// bookkeeping: a swap moves regions between buffers, and the one that
    /// owns a region is the one that closes it when it is dropped).
    owner: AtomicU64,
    /// `WORDS_KEPT`, or the events the page words held when they were
    /// given back (`forget_words`), which `stats` counts instead.
    forgotten: AtomicU64,
    /// Writers of this process inside `prepare_page`: they act on a view
    /// of the region (the page to reuse is complete, with these entries)
    /// that a reset or a restart in place would make stale, so the region
    /// is not quiescent while there are any (see `prepare_page`). Only
    /// writers of this process touch a region's state (a forked child
    /// writes nothing into inherited buffers), so it need not be shared.
    entering: AtomicU64,
}

const WORDS_KEPT: u64 = u64::MAX;

/// Holds a region's `entering` count up while a writer prepares a page.
struct EnteringGuard<'a>(&'a AtomicU64);

impl<'a> EnteringGuard<'a> {
    fn new(count: &'a AtomicU64) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        EnteringGuard(count)
    }
}

impl Drop for EnteringGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Holds a region's `foreign` count up while a non-owner touches its state.
struct ForeignGuard<'a>(Option<&'a AtomicU64>);

impl Drop for ForeignGuard<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.0 {
            f.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cold]
fn warn_unfenced() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        eprintln!(
            "ustrace-ringbuf: membarrier(PRIVATE_EXPEDITED_RSEQ) failed; \
             a foreign write may race an owner's sequence already in flight"
        )
    });
}

/// Double-width CAS on `[pos, last_ts]`. Returns the value found on failure.
///
/// # Safety
/// `ptr` must be 16-byte aligned, writable and valid for 16 bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn cas128(ptr: *mut u64, old: [u64; 2], new: [u64; 2]) -> Result<(), [u64; 2]> {
    let (mut lo, mut hi) = (old[0], old[1]);
    let ok: u64;
    // SAFETY: the caller guarantees ptr; cmpxchg16b presence is checked when a
    // buffer is created. cmpxchg16b takes the new low word in rbx, which LLVM
    // may be using, so it is swapped in through rdi and restored after. Every
    // operand is pinned to a named register: a compiler-chosen one could be
    // rbx itself (seen in release builds: the address, or `bl` for the flag).
    unsafe {
        core::arch::asm!(
            "xchg rdi, rbx",
            "lock cmpxchg16b xmmword ptr [rsi]",
            "sete cl",
            "mov rbx, rdi",
            in("rsi") ptr,
            inout("rdi") new[0] => _,
            inout("rcx") new[1] => ok,
            inout("rax") lo,
            inout("rdx") hi,
            options(nostack),
        );
    }
    if ok & 0xff != 0 {
        Ok(())
    } else {
        Err([lo, hi])
    }
}

/// Double-width CAS on `[pos, last_ts]` (aarch64: exclusive pair).
///
/// # Safety
/// `ptr` must be 16-byte aligned, writable and valid for 16 bytes.
#[cfg(target_arch = "aarch64")]
#[inline]
unsafe fn cas128(ptr: *mut u64, old: [u64; 2], new: [u64; 2]) -> Result<(), [u64; 2]> {
    let (mut lo, mut hi): (u64, u64);
    let fail: u64;
    // SAFETY: the caller guarantees ptr. Load-acquire/store-release exclusive
    // pair; on mismatch the loaded value is stored back to clear the monitor
    // with a write that does not change memory.
    unsafe {
        core::arch::asm!(
            "2:",
            "ldaxp {lo}, {hi}, [{p}]",
            "cmp {lo}, {olo}",
            "ccmp {hi}, {ohi}, #0, eq",
            "b.ne 3f",
            "stlxp {st:w}, {nlo}, {nhi}, [{p}]",
            "cbnz {st:w}, 2b",
            "mov {fail}, #0",
            "b 4f",
            "3:",
            "stlxp {st:w}, {lo}, {hi}, [{p}]",
            "cbnz {st:w}, 2b",
            "mov {fail}, #1",
            "4:",
            p = in(reg) ptr,
            olo = in(reg) old[0],
            ohi = in(reg) old[1],
            nlo = in(reg) new[0],
            nhi = in(reg) new[1],
            lo = out(reg) lo,
            hi = out(reg) hi,
            st = out(reg) _,
            fail = out(reg) fail,
            options(nostack),
        );
    }
    if fail == 0 {
        Ok(())
    } else {
        Err([lo, hi])
    }
}

/// Whether this CPU has the double-width CAS the writer needs.
pub(crate) fn has_cas128() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("cmpxchg16b")
    }
    #[cfg(target_arch = "aarch64")]
    {
        true
    }
}

impl Region {
    /// Size of a region file with `nr_pages` pages (plus the reader's spare).
    pub(crate) fn file_size(nr_pages: usize) -> usize {
        Self::pages_offset(nr_pages) + (nr_pages + 1) * PAGE_SIZE
    }

    fn map_offset(nr_pages: usize) -> usize {
        WORDS_START + nr_pages * WORD_STRIDE
    }

    fn pages_offset(nr_pages: usize) -> usize {
        crate::mapping::round_up(Self::map_offset(nr_pages) + nr_pages * 8, PAGE_SIZE)
    }

    /// Creates a zeroed region file for `cpu` with `nr_pages` pages.
    pub(crate) fn create(path: &Path, cpu: usize, nr_pages: usize) -> io::Result<Region> {
        let map = Mapping::create(path, Self::file_size(nr_pages))?;
        let pages_off = Self::pages_offset(nr_pages);
        let r = Region {
            map,
            nr_pages,
            words_off: WORDS_START,
            map_off: Self::map_offset(nr_pages),
            pages_off,
            cpu: cpu as u32,
            page_hint: PageHint::new(),
            owner: AtomicU64::new(0),
            forgotten: AtomicU64::new(WORDS_KEPT),
            entering: AtomicU64::new(0),
        };
        for slot in 0..nr_pages {
            r.map_word(slot)
                .store(map_entry(slot, 0), Ordering::Relaxed);
        }
        r.atomic(OFF_SPARE)
            .store(nr_pages as u64, Ordering::Relaxed);
        // SAFETY: fresh, zeroed file of file_size bytes, exclusively ours; the
        // header fields are inside its first 256 bytes.
        unsafe {
            let b = r.map.ptr();
            b.add(OFF_VERSION).cast::<u32>().write(LAYOUT_VERSION);
            b.add(OFF_CPU).cast::<u32>().write(cpu as u32);
            b.add(OFF_NR_PAGES).cast::<u32>().write(nr_pages as u32);
            b.add(OFF_PAGE_SIZE).cast::<u32>().write(PAGE_SIZE as u32);
            b.add(OFF_WORDS).cast::<u64>().write(WORDS_START as u64);
            b.add(OFF_PAGES).cast::<u64>().write(pages_off as u64);
            b.add(OFF_MAP)
                .cast::<u64>()
                .write(Self::map_offset(nr_pages) as u64);
        }
        r.atomic(OFF_MAGIC).store(REGION_MAGIC, Ordering::Release);
        Ok(r)
    }

    /// Maps an existing region file read-only and checks its header.
    pub(crate) fn open_ro(path: &Path) -> io::Result<Region> {
        let map = Mapping::open_ro(path)?;
        let bad = |what: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {what}", path.display()),
            )
        };
        if map.len() < WORDS_START {
            return Err(bad(format!("region file is {} bytes", map.len())));
        }
        let r = Region {
            map,
            nr_pages: 0,
            words_off: 0,
            map_off: 0,
            pages_off: 0,
            cpu: 0,
            page_hint: PageHint::new(),
            owner: AtomicU64::new(0),
            forgotten: AtomicU64::new(WORDS_KEPT),
            entering: AtomicU64::new(0),
        };
        let magic = r.atomic(OFF_MAGIC).load(Ordering::Acquire);
        // SAFETY: header fields are inside the first 256 bytes (checked above);
        // they are written once before the magic is published.
        let (version, cpu, nr_pages, page_size, words, pages, slot_map) = unsafe {
            let b = r.map.ptr();
            (
                b.add(OFF_VERSION).cast::<u32>().read(),
                b.add(OFF_CPU).cast::<u32>().read(),
                b.add(OFF_NR_PAGES).cast::<u32>().read() as usize,
                b.add(OFF_PAGE_SIZE).cast::<u32>().read() as usize,
                b.add(OFF_WORDS).cast::<u64>().read() as usize,
                b.add(OFF_PAGES).cast::<u64>().read() as usize,
                b.add(OFF_MAP).cast::<u64>().read() as usize,
            )
        };
        if magic != REGION_MAGIC || version != LAYOUT_VERSION || page_size != PAGE_SIZE {
            return Err(bad(format!(
                "bad header (magic {magic:#x}, version {version}, page size {page_size})"
            )));
        }
        if nr_pages < 2
            || words + nr_pages * WORD_STRIDE > slot_map
            || slot_map + nr_pages * 8 > pages
            || pages + (nr_pages + 1) * PAGE_SIZE > r.map.len()
        {
            return Err(bad(format!("{nr_pages} pages do not fit the file")));
        }
        let Region { map, .. } = r;
        Ok(Region {
            map,
            nr_pages,
            words_off: words,
            map_off: slot_map,
            pages_off: pages,
            cpu,
            page_hint: PageHint::new(),
            owner: AtomicU64::new(0),
            forgotten: AtomicU64::new(WORDS_KEPT),
            entering: AtomicU64::new(0),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        self.map.path()
    }

    pub(crate) fn mapping(&self) -> &Mapping {
        &self.map
    }

    pub(crate) fn nr_pages(&self) -> usize {
        self.nr_pages
    }

    /// The CPU whose buffer this region is.
    pub(crate) fn cpu(&self) -> usize {
        self.cpu as usize
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner.load(Ordering::Relaxed)
    }

    pub(crate) fn set_owner(&self, serial: u64) {
        self.owner.store(serial, Ordering::Relaxed);
    }

    #[inline]
    fn atomic(&self, off: usize) -> &AtomicU64 {
        // SAFETY: every offset used is an 8-aligned u64 inside the mapping,
        // which lives as long as `self`; shared fields are only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.map.ptr().add(off).cast()) }
    }

    #[inline(always)]
    fn slot_of(&self, seq: u64) -> usize {
        (seq % self.nr_pages as u64) as usize
    }

    /// Remembers that page `seq` is in `slot`, physical page `phys`, unless
    /// a later page is already hinted. Called by writers holding a
    /// reservation in that page, so its slot's mapping cannot change
    /// meanwhile. The index is clamped as `phys_ptr` clamps, so the fast
    /// path needs no clamp of its own.
    fn set_page_hint(&self, seq: u64, slot: usize, phys: usize) {
        let index = (self.pages_off / PAGE_SIZE + phys.min(self.nr_pages)) as u64;
        let word = (self.words_off + slot * WORD_STRIDE) as u64;
        let new = [seq * D, word << 32 | index];
        let ptr = self.page_hint.start.as_ptr();
        let mut old = [
            self.page_hint.start.load(Ordering::Relaxed),
            self.page_hint.place.load(Ordering::Relaxed),
        ];
        while old[0] == NO_PAGE || old[0] < new[0] {
            // SAFETY: `PageHint` is two u64s, 16-aligned, in `self`; every
            // change to it goes through this CAS (or `reinit`, which has no
            // writer to race).
            match unsafe { cas128(ptr, old, new) } {
                Ok(()) => return,
                Err(found) => old = found,
            }
        }
    }

    /// The slot map entry of `slot`.
    #[inline(always)]
    fn map_word(&self, slot: usize) -> &AtomicU64 {
        self.atomic(self.map_off + slot * 8)
    }

    /// Page `seq`'s lap as the slot map records it.
    fn map_lap(&self, seq: u64) -> u64 {
        (seq / self.nr_pages as u64 + 1) & MAP_TAG_MASK
    }

    /// Page `s`'s slot map word, the entry it holds now, and whether that
    /// entry still maps page `s` (its lap, not swapped out by the reader).
    fn map_of(&self, s: u64) -> (&AtomicU64, u64, bool) {
        let mw = self.map_word(self.slot_of(s));
        let m = mw.load(Ordering::SeqCst);
        (mw, m, map_tag(m) == self.map_lap(s) && m & MAP_SWAPPED == 0)
    }

    /// The word only owner sequences add to (plain stores, see `rseq.rs`).
    #[inline(always)]
    fn local_word_at(&self, slot: usize) -> &AtomicU64 {
        self.atomic(self.words_off + slot * WORD_STRIDE)
    }

    /// The word everybody else adds to (locked).
    #[inline(always)]
    fn remote_word_at(&self, slot: usize) -> &AtomicU64 {
        self.atomic(self.words_off + slot * WORD_STRIDE + 8)
    }

    /// The page's commit state: both words summed when they are of one lap;
    /// while a writer is moving the slot to a new lap (one word moved, the
    /// other not yet), the newer lap with nothing committed.
    #[inline]
    fn load_word(&self, seq: u64) -> u64 {
        let slot = self.slot_of(seq);
        let l = self.local_word_at(slot).load(Ordering::SeqCst);
        let r = self.remote_word_at(slot).load(Ordering::SeqCst);
        combine_words(l, r)
    }

    /// The page a writer of page `seq` writes to (the slot's mapping is
    /// stable while the page has writers).
    #[inline]
    fn page_ptr(&self, seq: u64) -> *mut u8 {
        self.page_ptr_at(self.slot_of(seq))
    }

    #[inline]
    fn page_ptr_at(&self, slot: usize) -> *mut u8 {
        self.phys_ptr(map_phys(self.map_word(slot).load(Ordering::Acquire)))
    }

    #[inline(always)]
    fn phys_ptr(&self, phys: usize) -> *mut u8 {
        debug_assert!(phys <= self.nr_pages);
        // SAFETY: the index is clamped to nr_pages, and the file holds
        // nr_pages + 1 pages.
        unsafe {
            self.map
                .ptr()
                .add(self.pages_off + phys.min(self.nr_pages) * PAGE_SIZE)
        }
    }

    #[inline]
    fn load_state(&self) -> [u64; 2] {
        // Two separate loads may tear; the CAS that follows validates them.
        [
            self.atomic(OFF_STATE).load(Ordering::Acquire),
            self.atomic(OFF_STATE + 8).load(Ordering::Acquire),
        ]
    }

    /// The reservation position (without the closed bit).
    #[inline]
    pub(crate) fn pos(&self) -> u64 {
        self.atomic(OFF_STATE).load(Ordering::SeqCst) & !CLOSED
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.atomic(OFF_STATE).load(Ordering::SeqCst) & CLOSED != 0
    }

    pub(crate) fn generation(&self) -> u64 {
        self.atomic(OFF_GENERATION).load(Ordering::Acquire)
    }

    /// Reserves room for an event of `len` payload bytes (at most
    /// `page::MAX_PAYLOAD`) as the owner: the calling thread's rseq `area`
    /// says it runs on `cpu`, this region's CPU, and `now` is the clock,
    /// read by the caller before anything else.
    ///
    /// This is the common case — the event fits in the current page with a
    /// delta that fits its header — inline, one attempt, no locked
    /// instruction; `None` sends the writer to `reserve` for everything
    /// else: page ends, time extends, foreign writers, migrations, retries.
    /// The state loads are relaxed: the sequence's compare is what
    /// validates them, and nothing else is read on their strength.
    #[inline(always)]
    pub(crate) fn reserve_fast(
        &self,
        len: usize,
        now: u64,
        area: *mut u8,
        cpu: u32,
    ) -> Option<RawReservation> {
        debug_assert_eq!(cpu, self.cpu);
        let size = event_size(len) as u64;
        let state = self.atomic(OFF_STATE);
        let pos = state.load(Ordering::Relaxed);
        let last = self.atomic(OFF_STATE + 8).load(Ordering::Relaxed);
        // The place is read after the start (see `PageHint`).
        let start = self.page_hint.start.load(Ordering::Acquire);
        let place = self.page_hint.place.load(Ordering::Relaxed);
        let off = pos.wrapping_sub(start);
        // One unsigned compare: `pos` is in the hinted page, not at its
        // start (a page to enter) and not so far on that the event does not
        // fit. A closed `pos`, or no hint, fails it too.
        if off.wrapping_sub(1) >= D - size {
            return None;
        }
        let ts = now.max(last);
        let delta = ts - last;
        if delta > TS_MASK {
            return None;
        }
        // Where the event goes, worked out before the sequence: two
        // pointers live across it rather than the region, the hint and the
        // offset, which left too few registers for the caller's values.
        let map = self.map.ptr();
        // SAFETY: the hint's offsets are inside the mapping: the word's is
        // a slot's, and the page index was clamped when the hint was made
        // (`set_page_hint`); `off + size` is within the page's data (checked
        // above).
        let (word, at) = unsafe {
            (
                map.add((place >> 32) as usize).cast::<u64>(),
                map.add(place as u32 as usize * PAGE_SIZE + PAGE_HEADER_SIZE + off as usize),
            )
        };
        // SAFETY: `area` is the calling thread's rseq area (the caller read
        // `cpu` from it); the state is the 16-aligned state of our writable
        // mapping, with the foreign word after it.
        match unsafe {
            rseq::store_state_if(area, cpu, state.as_ptr(), [pos, last], [pos + size, ts])
        } {
            rseq::Outcome::Done => {}
            _ => return None,
        }
        // SAFETY: [off, off + size) of the page's data is ours by the state
        // store.
        let bytes = unsafe { std::slice::from_raw_parts_mut(at, size as usize) };
        let p = write_data_header(bytes, size as usize, delta as u32);
        if p + len < bytes.len() {
            bytes[p + len..].fill(0);
        }
        Some(RawReservation::new(
            // SAFETY: inside the reserved slot.
            unsafe { bytes.as_mut_ptr().add(p) },
            word,
            area,
            cpu,
            size as usize,
            false,
            false,
            ts,
        ))
    }

    /// Reserves room for an event of `len` payload bytes, in any case.
    pub(crate) fn reserve(
        &self,
        len: usize,
        clock: Clock,
        overwrite: bool,
        writer: Writer,
    ) -> Result<RawReservation, ReserveError> {
        let size = event_size(len) as u64;
        // The clock once, before the first look at the state, never again in the loop: the
        // clock may be a library call (`clock_gettime`) with a probe on it, and the probe's
        // record, nested in this writer, moves the state on. Read inside the loop, every
        // attempt would meet the probe again and start over for good. A retry keeps this
        // reading, raised to the newest event's time, so time never runs backwards.
        let now = clock::now(clock);
        let mut cur = self.load_state();
        loop {
            if cur[0] & CLOSED != 0 {
                return Err(ReserveError::Closed);
            }
            let ts = now.max(cur[1]);
            let pos = cur[0];
            let (s, off) = (pos / D, pos % D);
            let mut delta = ts - cur[1];
            let mut extend = false;
            let mut pad_from = None;
            let (start, enter) = if off == 0 {
                delta = 0;
                (pos, Some(s))
            } else {
                extend = delta > TS_MASK;
                let need = size + if extend { TIME_EXTEND_SIZE as u64 } else { 0 };
                if off + need <= D {
                    (pos, None)
                } else {
                    pad_from = Some(pos);
                    extend = false;
                    delta = 0;
                    ((s + 1) * D, Some(s + 1))
                }
            };
            let total = size + if extend { TIME_EXTEND_SIZE as u64 } else { 0 };
            if let Some(e) = enter {
                if !self.prepare_page(e, overwrite)? {
                    cur = self.load_state();
                    continue;
                }
            }
            match self.store_state(writer, cur, [start + total, ts]) {
                StateStore::Retry => {
                    cur = self.load_state();
                    continue;
                }
                StateStore::Migrated => return Err(ReserveError::Migrated),
                StateStore::Done => {
                    let owner_area = rseq::owner_area().unwrap_or(std::ptr::null_mut());
                    if let Some(p) = pad_from {
                        let (ps, po) = ((p / D), (p % D) as usize);
                        // SAFETY: bytes [po, 4080) of page ps's data were reserved by
                        // this CAS (the event did not fit there).
                        let tail = unsafe {
                            std::slice::from_raw_parts_mut(
                                self.page_ptr(ps).add(PAGE_HEADER_SIZE + po),
                                DATA_SIZE - po,
                            )
                        };
                        write_end_padding(tail);
                        self.commit_bytes(
                            self.local_word_at(self.slot_of(ps)).as_ptr(),
                            (DATA_SIZE - po) as u64,
                            owner_area,
                        );
                    }
                    let es = start / D;
                    let page_slot = self.slot_of(es);
                    let phys = map_phys(self.map_word(page_slot).load(Ordering::Acquire));
                    let page = self.phys_ptr(phys);
                    // The fast path finds the page from here on: a writer
                    // entering it hints it, and any later one catches up a
                    // hint its entering writer has not made yet (a no-op
                    // when the hint is current).
                    self.set_page_hint(es, page_slot, phys);
                    if enter.is_some() {
                        // SAFETY: the first reservation of a page owns its header
                        // until it commits; nobody reads the page before that.
                        unsafe { page.cast::<u64>().write(ts) };
                    }
                    let data_off = (start % D) as usize;
                    // SAFETY: [data_off, data_off + total) of page es is ours by the CAS.
                    let slot = unsafe {
                        std::slice::from_raw_parts_mut(
                            page.add(PAGE_HEADER_SIZE + data_off),
                            total as usize,
                        )
                    };
                    let mut at = 0;
                    let mut hdr_delta = delta;
                    if extend {
                        write_time_extend(slot, delta);
                        at = TIME_EXTEND_SIZE;
                        hdr_delta = 0;
                    }
                    let p = write_data_header(&mut slot[at..], size as usize, hdr_delta as u32);
                    slot[at + p + len..].fill(0);
                    return Ok(RawReservation::new(
                        // SAFETY: inside the reserved slot.
                        unsafe { slot.as_mut_ptr().add(at + p) },
                        self.local_word_at(page_slot).as_ptr(),
                        owner_area,
                        self.cpu,
                        total as usize,
                        extend,
                        enter.is_some(),
                        ts,
                    ));
                }
            }
        }
    }

    /// Makes page sequence `e`'s slot ready for its lap before a writer
    /// enters it: the page it last held (`e - nr_pages`) must be complete
    /// (else commit overrun), read in producer/consumer mode (else dropped),
    /// and in overwrite mode the consuming reader is moved past it. Then
    /// both commit words are moved to `e`'s lap with nothing committed, so
    /// that commits are plain additions. Every writer about to enter `e`
    /// runs this; the word moves are compare-and-swaps from the old lap's
    /// exact value, so only the first one takes effect and the entries it
    /// retires are counted once. No commit can race with a move: the old
    /// lap is complete, and the new lap's first reservation comes after.
    ///
    /// `Ok(false)`: the slot is already past `e`'s lap, so the writer's view
    /// of the state is stale; it should look again.
    ///
    /// The region may not be emptied (reset, or started over in place)
    /// between the checks below and the moves that act on them: a writer
    /// preempted there would push the new contents' reader past a page of
    /// the old ones and count that page's events, already read or counted,
    /// as overrun once more. So the writer shows itself in `entering`
    /// first, and the region is not quiescent until it leaves; one that
    /// arrives after a reset or restart saw `entering` at 0 finds the
    /// region closed, or open with the new contents, since it reads the
    /// state before the words.
    fn prepare_page(&self, e: u64, overwrite: bool) -> Result<bool, ReserveError> {
        let _entering = EnteringGuard::new(&self.entering);
        let n = self.nr_pages as u64;
        let tag = e / n + 1;
        let fresh = tag << WORD_TAG_SHIFT;
        let slot = self.slot_of(e);
        let (lw, rw) = (self.local_word_at(slot), self.remote_word_at(slot));
        // A writer entering page `e` read a position in page `e - 1` or
        // at its end, and positions only grow, unless the region was
        // emptied since (a reset, or a retired region started over) while
        // this writer was preempted: its view is stale, and the page
        // before `e` is not incomplete, just not there any more.
        if self.is_closed() || self.pos() + D < e * D {
            return Ok(false);
        }
        let l = lw.load(Ordering::SeqCst);
        let r = rw.load(Ordering::SeqCst);
        if word_tag(l) > tag {
            return Ok(false);
        }
        #[cfg(test)]
        if let Some(f) = tests::AFTER_CHECK.with(|h| h.take()) {
            f();
        }
        if word_tag(l) == tag {
            // Another writer moved the local word; finish its move if needed.
            if word_tag(r) < tag {
                let _ = rw.compare_exchange(r, fresh, Ordering::SeqCst, Ordering::SeqCst);
            }
            return Ok(self.move_map(slot, e));
        }
        let w = combine_words(l, r);
        if e >= n {
            let v = e - n;
            if word_tag(w) != v / n + 1 || word_bytes(w) != D {
                self.atomic(OFF_COMMIT_OVERRUN)
                    .fetch_add(1, Ordering::Relaxed);
                return Err(ReserveError::CommitOverrun);
            }
            if overwrite {
                self.push_reader(v, word_entries(w));
            } else if read_unpack(self.atomic(OFF_READ).load(Ordering::SeqCst)).0 < (v + 1) * D {
                self.atomic(OFF_DROPPED).fetch_add(1, Ordering::Relaxed);
                return Err(ReserveError::Dropped);
            }
        }
        if lw
            .compare_exchange(l, fresh, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
            && e >= n
        {
            self.atomic(OFF_RETIRED)
                .fetch_add(word_entries(w), Ordering::Relaxed);
        }
        let _ = rw.compare_exchange(r, fresh, Ordering::SeqCst, Ordering::SeqCst);
        Ok(self.move_map(slot, e))
    }

    /// Moves page `e`'s slot map entry to `e`'s lap, keeping its physical
    /// page — which is the consuming reader's former spare if it swapped
    /// the previous lap's page out first; after this, it cannot. `false`:
    /// the entry is neither of the previous lap nor of `e`'s (stale view).
    fn move_map(&self, slot: usize, e: u64) -> bool {
        let n = self.nr_pages as u64;
        let tag = self.map_lap(e);
        let prev = if e >= n { self.map_lap(e - n) } else { 0 };
        let mw = self.map_word(slot);
        let mut m = mw.load(Ordering::SeqCst);
        loop {
            if map_tag(m) == tag {
                return true;
            }
            if map_tag(m) != prev {
                return false;
            }
            match mw.compare_exchange(
                m,
                map_entry(map_phys(m), tag),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(a) => m = a,
            }
        }
    }

    /// Moves the consuming reader past page `s`, swapped out but not
    /// decodable — only a writer killed or corrupting memory mid-page could
    /// cause that; without this the reader would stop at it for good.
    #[cold]
    fn skip_unreadable(&self, rw: u64, s: u64) {
        let _ = self.atomic(OFF_READ).compare_exchange(
            rw,
            read_pack((s + 1) * D, 0),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// Takes page `s` (complete, at the consuming reader's position) out of
    /// the ring, as ring-buffer-design.rst's reader page swap: the slot
    /// gets the reader's spare page (marked swapped: nothing of this lap is
    /// in it), and the old page becomes the reader's, stable for as long
    /// as it likes, since no writer can reach it any more. Fails (`None`)
    /// when a writer already moved the slot on to its next lap.
    fn swap_out(&self, s: u64) -> Option<usize> {
        let (mw, m, mapped) = self.map_of(s);
        if !mapped {
            return None;
        }
        let spare = self.atomic(OFF_SPARE).load(Ordering::Relaxed) as usize;
        mw.compare_exchange(
            m,
            map_entry(spare, map_tag(m)) | MAP_SWAPPED,
            Ordering::SeqCst,
            Ordering::SeqCst,
        )
        .ok()?;
        let taken = map_phys(m);
        self.atomic(OFF_SPARE)
            .store(taken as u64, Ordering::Relaxed);
        Some(taken)
    }

    /// One attempt to move the reservation state from `cur` to `new`.
    #[inline(always)]
    fn store_state(&self, writer: Writer, cur: [u64; 2], new: [u64; 2]) -> StateStore {
        let state = self.map.ptr().wrapping_add(OFF_STATE).cast::<u64>();
        match writer {
            Writer::Owner { area, cpu } => {
                // SAFETY: `area` is the calling thread's rseq area (Writer::Owner
                // is only built from `cpu::rseq_here`); `state` is the 16-aligned
                // state of our writable mapping, with the foreign word after it.
                match unsafe { rseq::store_state_if(area, cpu, state, cur, new) } {
                    rseq::Outcome::Done => StateStore::Done,
                    rseq::Outcome::Changed | rseq::Outcome::Aborted => StateStore::Retry,
                    rseq::Outcome::WrongCpu => StateStore::Migrated,
                    rseq::Outcome::Foreign => self.store_state_locked(cur, new),
                }
            }
            Writer::Foreign => self.store_state_locked(cur, new),
        }
    }

    /// The locked state update, fenced from owner sequences when they exist.
    #[cold]
    #[inline(never)]
    fn store_state_locked(&self, cur: [u64; 2], new: [u64; 2]) -> StateStore {
        let state = self.map.ptr().wrapping_add(OFF_STATE).cast::<u64>();
        let _fence = self.fence_owners();
        // SAFETY: `state` is the 16-aligned reservation state inside our
        // writable mapping (regions opened read-only never reserve).
        match unsafe { cas128(state, cur, new) } {
            Ok(()) => StateStore::Done,
            Err(_) => StateStore::Retry,
        }
    }

    /// Keeps owner sequences off the reservation state until the guard drops
    /// (nothing to do when owners use locked instructions too).
    fn fence_owners(&self) -> ForeignGuard<'_> {
        if !rseq::enabled() {
            return ForeignGuard(None);
        }
        let foreign = self.atomic(OFF_FOREIGN);
        foreign.fetch_add(1, Ordering::SeqCst);
        if !rseq::fence_owners() {
            // Only after fork, in a child whose registration could not be
            // renewed: owners in this process are fenced by `foreign` alone
            // for sequences that start from now on; report it loudly once.
            warn_unfenced();
        }
        ForeignGuard(Some(foreign))
    }

    /// Moves the consuming reader past page `v` (about to be overwritten),
    /// counting its unread events as overrun.
    fn push_reader(&self, v: u64, entries: u64) {
        let read = self.atomic(OFF_READ);
        let mut cur = read.load(Ordering::SeqCst);
        loop {
            let (rpos, nread) = read_unpack(cur);
            if rpos >= (v + 1) * D {
                return;
            }
            let already = if rpos >= v * D { nread } else { 0 };
            match read.compare_exchange(
                cur,
                read_pack((v + 1) * D, 0),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    self.atomic(OFF_OVERRUN)
                        .fetch_add(entries.saturating_sub(already), Ordering::Relaxed);
                    return;
                }
                Err(a) => cur = a,
            }
        }
    }

    /// [`commit_bytes_on`] this region's CPU.
    #[inline(always)]
    fn commit_bytes(&self, local: *mut u64, add: u64, area: *mut u8) {
        commit_bytes_on(self.cpu, local, add, area)
    }

    /// Publishes a filled reservation (its alignment tail was zeroed when
    /// it was made). Needs nothing of the region but what the reservation
    /// carries.
    #[inline(always)]
    pub(crate) fn commit(&self, r: &RawReservation) {
        debug_assert_eq!(r.cpu, self.cpu);
        commit_bytes_on(r.cpu, r.word, r.commit_add(), r.area);
    }

    /// Withdraws a reservation: the bytes become a time extend (so later
    /// deltas stay right) plus padding, and count as no event. The event's
    /// time delta is read back from its header (or its time extend).
    pub(crate) fn discard(&self, r: &RawReservation) {
        let total = r.total();
        let size = total - if r.extend() { TIME_EXTEND_SIZE } else { 0 };
        // SAFETY: the word is a slot's local word, inside the mapping.
        let word_at = unsafe { r.word.cast::<u8>().offset_from(self.map.ptr()) } as usize;
        let page = self.page_ptr_at((word_at - self.words_off) / WORD_STRIDE);
        // SAFETY: the payload lies inside its page's data area.
        let payload_at = unsafe { r.payload.offset_from(page) } as usize;
        let data_off = payload_at - PAGE_HEADER_SIZE - payload_offset(size) - (total - size);
        // SAFETY: the reserved slot [data_off, data_off + total) is still ours.
        let slot =
            unsafe { std::slice::from_raw_parts_mut(page.add(PAGE_HEADER_SIZE + data_off), total) };
        let low = u64::from(page::read_u32(slot, 0) >> 5);
        let delta = if r.extend() {
            low | u64::from(page::read_u32(slot, 4)) << TS_SHIFT
        } else {
            low
        };
        page::write_discarded(slot, total, delta, r.extend());
        self.commit_bytes(r.word, total as u64, r.area);
    }

    /// Counts one event refused without trying to reserve (a forked child
    /// writing to a buffer it inherited).
    pub(crate) fn count_dropped(&self) {
        self.atomic(OFF_DROPPED).fetch_add(1, Ordering::Relaxed);
    }

    /// Stops new reservations (writers get `Closed`).
    pub(crate) fn close(&self) {
        let state = self.map.ptr().wrapping_add(OFF_STATE).cast::<u64>();
        let _fence = self.fence_owners();
        let mut cur = self.load_state();
        while cur[0] & CLOSED == 0 {
            // SAFETY: writable region, aligned state (see reserve).
            match unsafe { cas128(state, cur, [cur[0] | CLOSED, cur[1]]) } {
                Ok(()) => return,
                Err(a) => cur = a,
            }
        }
    }

    /// Whether every reserved byte is committed and no writer of this
    /// process is preparing a page (no writer in flight).
    pub(crate) fn quiescent(&self) -> bool {
        if self.entering.load(Ordering::SeqCst) != 0 {
            return false;
        }
        let p = self.pos();
        if p == 0 {
            return true;
        }
        let n = self.nr_pages as u64;
        let last = (p - 1) / D;
        let first = (last + 1).saturating_sub(n);
        (first..=last).all(|seq| {
            let w = self.load_word(seq);
            let expect = (p - seq * D).min(D);
            // A full page whose slot a writer already moved to the next lap
            // (it was complete, or it could not have been moved) is done too.
            (word_tag(w) == seq / n + 1 && word_bytes(w) == expect)
                || (expect == D && word_tag(w) == seq / n + 2 && word_bytes(w) == 0)
        })
    }

    /// Empties a closed, quiescent region and reopens it.
    pub(crate) fn reinit(&self) {
        self.reinit_pages();
        for off in [
            OFF_READ,
            OFF_LOST_REPORTED,
            OFF_OVERRUN,
            OFF_DROPPED,
            OFF_COMMIT_OVERRUN,
            OFF_RETIRED,
            OFF_READ_EVENTS,
        ] {
            self.atomic(off).store(0, Ordering::Relaxed);
        }
        self.reopen();
    }

    /// Empties the page words, slot map and page hint (of a closed,
    /// quiescent region).
    fn reinit_pages(&self) {
        for slot in 0..self.nr_pages {
            self.local_word_at(slot).store(0, Ordering::Relaxed);
            self.remote_word_at(slot).store(0, Ordering::Relaxed);
            let m = self.map_word(slot).load(Ordering::Relaxed);
            self.map_word(slot)
                .store(map_entry(map_phys(m), 0), Ordering::Relaxed);
        }
        self.page_hint.start.store(NO_PAGE, Ordering::Relaxed);
        self.page_hint.place.store(0, Ordering::Relaxed);
    }

    /// Opens an emptied region at position 0, as a new generation.
    fn reopen(&self) {
        self.atomic(OFF_GENERATION).fetch_add(1, Ordering::SeqCst);
        let state = self.map.ptr().wrapping_add(OFF_STATE).cast::<u64>();
        let _fence = self.fence_owners();
        let mut cur = self.load_state();
        loop {
            // SAFETY: writable region, aligned state (see reserve).
            match unsafe { cas128(state, cur, [0, 0]) } {
                Ok(()) => return,
                Err(a) => cur = a,
            }
        }
    }

    /// Events lost so far (overrun + dropped + commit overrun).
    pub(crate) fn lost_total(&self) -> u64 {
        self.atomic(OFF_OVERRUN).load(Ordering::Relaxed)
            + self.atomic(OFF_DROPPED).load(Ordering::Relaxed)
            + self.atomic(OFF_COMMIT_OVERRUN).load(Ordering::Relaxed)
    }

    /// Lost events not yet reported to the consuming reader; marks them reported.
    pub(crate) fn take_lost(&self) -> u64 {
        let total = self.lost_total();
        let seen = self
            .atomic(OFF_LOST_REPORTED)
            .swap(total, Ordering::Relaxed);
        total.saturating_sub(seen)
    }

    /// Where a fresh private reader starts: the consuming reader's position.
    pub(crate) fn reader_start(&self) -> RegionCursor {
        let (rpos, _) = read_unpack(self.atomic(OFF_READ).load(Ordering::SeqCst));
        let p = self.pos();
        let n = self.nr_pages as u64;
        let oldest = (p.div_ceil(D)).saturating_sub(n) * D;
        RegionCursor {
            pos: rpos.max(oldest),
            ts: 0,
            lost: 0,
            lost_seen: self.lost_total(),
            generation: self.generation(),
            copied: 0,
        }
    }

    /// The consuming reader's position.
    pub(crate) fn read_pos(&self) -> u64 {
        read_unpack(self.atomic(OFF_READ).load(Ordering::SeqCst)).0
    }

    fn page_state(&self, s: u64) -> PageState {
        let n = self.nr_pages as u64;
        let tag = s / n + 1;
        for _ in 0..16 {
            let p1 = self.pos();
            if p1 <= s * D {
                return PageState::Empty;
            }
            if p1 > (s + n) * D {
                return PageState::Gone;
            }
            let w = self.load_word(s);
            if p1 >= (s + 1) * D {
                let (_, _, mapped) = self.map_of(s);
                return if word_tag(w) > tag || !mapped {
                    // Reused, or swapped out by the consuming page reader.
                    PageState::Gone
                } else if word_tag(w) == tag && word_bytes(w) == D {
                    PageState::Ready(DATA_SIZE)
                } else {
                    PageState::Busy
                };
            }
            if self.pos() != p1 {
                continue;
            }
            let off = p1 - s * D;
            return if word_tag(w) == tag && word_bytes(w) == off {
                PageState::Ready(off as usize)
            } else {
                PageState::Busy
            };
        }
        PageState::Busy
    }

    /// Copies page `s` into `buf` and checks no writer started reusing it,
    /// and the consuming reader did not swap it out, meanwhile.
    fn copy_page(&self, s: u64, buf: &mut [u8; PAGE_SIZE]) -> bool {
        let (mw, m, mapped) = self.map_of(s);
        if !mapped {
            return false;
        }
        // SAFETY: the page lies inside the mapping. Writers may be storing
        // into it if it is being overwritten, or it may become the reader's
        // and later a spare; the checks below detect both and the copy is
        // thrown away (seqlock read).
        unsafe {
            std::ptr::copy_nonoverlapping(self.phys_ptr(map_phys(m)), buf.as_mut_ptr(), PAGE_SIZE)
        };
        fence(Ordering::Acquire);
        self.pos() <= (s + self.nr_pages as u64) * D
            && mw.load(Ordering::SeqCst) == m
            && !self.is_released()
    }

    /// Whether the region was retired and its pages given back (see
    /// [`Region::release`]): its events are gone, as consumed ones are.
    pub(crate) fn is_released(&self) -> bool {
        self.atomic(OFF_RELEASED).load(Ordering::SeqCst) != 0
    }

    /// Gives back the memory of a retired region's pages, keeping the
    /// header, counters, words and slot map that statistics and late
    /// writers still read, and the file (closed later, if ever, by
    /// `RingBuffer::limit_spares`). Only for a region that is closed, has
    /// no write in flight and was read to its end: a writer can then only
    /// find it closed, and readers that still hold it see `released` and
    /// treat it as empty (a page copied after the release fails the check
    /// in `copy_page`).
    pub(crate) fn release(&self) {
        debug_assert!(self.is_closed());
        if self.atomic(OFF_RELEASED).swap(1, Ordering::SeqCst) != 0 {
            return;
        }
        self.map
            .punch(self.pages_off, self.map.len() - self.pages_off);
    }

    /// Drops the oldest unread pages of a closed region with no write in
    /// flight until at most `keep` pages of unread data are left, counting
    /// their events as overrun (the kernel's shrink loses its oldest pages
    /// the same way), and gives their memory back. Returns how many pages
    /// of unread data are left.
    pub(crate) fn trim(&self, keep: usize) -> usize {
        debug_assert!(self.is_closed());
        let n = self.nr_pages as u64;
        let (first, end) = self.unread_range();
        let unread = end.saturating_sub(first);
        if unread <= keep as u64 {
            return unread as usize;
        }
        let cut = end - keep as u64;
        let mut physical = Vec::new();
        for s in first..cut {
            let w = self.load_word(s);
            let entries = if word_tag(w) == s / n + 1 {
                word_entries(w)
            } else {
                0
            };
            self.push_reader(s, entries);
            let (_, m, mapped) = self.map_of(s);
            if mapped {
                physical.push(map_phys(m).min(self.nr_pages));
            }
        }
        // Pages swapped out to the page reader are its own; the rest go
        // back, in runs of neighbouring pages.
        physical.sort_unstable();
        let mut i = 0;
        while i < physical.len() {
            let mut j = i + 1;
            while j < physical.len() && physical[j] == physical[j - 1] + 1 {
                j += 1;
            }
            self.map.punch(
                self.pages_off + physical[i] * PAGE_SIZE,
                (j - i) * PAGE_SIZE,
            );
            i = j;
        }
        keep
    }

    /// Gives back the page words and slot map of a released region that
    /// will not be started over (its file is closed), past the first page:
    /// that one holds the header, which the write fast path reads without
    /// looking at anything else. A late writer that gets further reads
    /// zeros there, and cannot get past the closed state.
    ///
    /// The header's counters stay live (a forked child still counts its
    /// refused writes there); the events the words held are kept aside.
    pub(crate) fn forget_words(&self) {
        debug_assert!(self.is_released() && !self.map.has_fd());
        let in_words = self.stats().committed - self.atomic(OFF_RETIRED).load(Ordering::SeqCst);
        if self.forgotten.swap(in_words, Ordering::SeqCst) != WORDS_KEPT {
            return;
        }
        if self.pages_off > PAGE_SIZE {
            self.map.punch(PAGE_SIZE, self.pages_off - PAGE_SIZE);
        }
    }

    /// The pages holding unread data: sequence numbers `first..end`.
    fn unread_range(&self) -> (u64, u64) {
        let end = self.pos().div_ceil(D);
        let first = (self.read_pos() / D).max(end.saturating_sub(self.nr_pages as u64));
        (first, end)
    }

    /// How many pages hold unread data (the page being written counts).
    pub(crate) fn unread_pages(&self) -> usize {
        let (first, end) = self.unread_range();
        end.saturating_sub(first) as usize
    }

    /// Starts a retired region (closed, quiescent, released, its file
    /// still open) over as an empty region of the same CPU and size, in
    /// place: [`Region::reinit`], and its pages come back as they are
    /// written. Writers that still hold this region from before it was
    /// retired find an open, empty region of their own CPU (as after a
    /// reset), and a forked child that inherited it still counts its
    /// refused writes where the parent sees them: the file is the same.
    ///
    /// Returns the counters it had, for the buffer's statistics: they are
    /// taken out with swaps, so a count a late writer (or a forked child)
    /// adds meanwhile lands either in them or in the fresh region's.
    pub(crate) fn restart(&self) -> RegionStats {
        debug_assert!(self.is_released() && self.map.has_fd() && self.quiescent());
        // Closed and quiescent: the words and slot map change no more (a
        // late writer's moves are compare-and-swaps from values of a lap
        // that is over, as in `reinit`).
        let in_words = self.stats().committed - self.atomic(OFF_RETIRED).load(Ordering::SeqCst);
        let take = |off| self.atomic(off).swap(0, Ordering::SeqCst);
        let had = RegionStats {
            committed: take(OFF_RETIRED) + in_words,
            overrun: take(OFF_OVERRUN),
            dropped: take(OFF_DROPPED),
            commit_overrun: take(OFF_COMMIT_OVERRUN),
            read: take(OFF_READ_EVENTS),
        };
        self.reinit_pages();
        self.atomic(OFF_READ).store(0, Ordering::SeqCst);
        self.atomic(OFF_LOST_REPORTED).store(0, Ordering::SeqCst);
        self.atomic(OFF_RELEASED).store(0, Ordering::SeqCst);
        self.reopen();
        had
    }

    /// Reads one step at position `pos`, `ts_hint` being the time at `pos`
    /// if known (0 = decode from the page start).
    pub(crate) fn step(&self, pos: u64, ts_hint: u64) -> Step {
        let (s, off) = (pos / D, (pos % D) as usize);
        let limit = match self.page_state(s) {
            PageState::Ready(l) => l,
            PageState::Empty => return Step::Empty,
            PageState::Busy => return Step::Busy,
            PageState::Gone => return Step::Gone,
        };
        if off >= limit {
            return if limit == DATA_SIZE {
                Step::Skip {
                    next_pos: (s + 1) * D,
                    next_ts: 0,
                }
            } else {
                Step::Empty
            };
        }
        let mut buf = [0u8; PAGE_SIZE];
        if !self.copy_page(s, &mut buf) {
            return if self.is_released() {
                Step::Empty
            } else {
                Step::Gone
            };
        }
        let base = page::read_u64(&buf, 0);
        let mut dec = if off > 0 && ts_hint != 0 {
            PageDecoder::resume(&buf, limit, off, ts_hint)
        } else {
            let mut d = PageDecoder::with_limit(&buf, limit, base);
            while d.offset() < off {
                if d.next_record().is_none() {
                    return Step::Gone;
                }
            }
            if d.offset() != off {
                return Step::Gone;
            }
            d
        };
        loop {
            let Some(rec) = dec.next_record() else {
                if dec.failed() {
                    return Step::Gone;
                }
                let next = if limit == DATA_SIZE {
                    (s + 1) * D
                } else {
                    s * D + dec.offset() as u64
                };
                let next_ts = if limit == DATA_SIZE { 0 } else { dec.ts() };
                return Step::Skip {
                    next_pos: next,
                    next_ts,
                };
            };
            match rec.kind {
                RecordKind::Time | RecordKind::Discarded => continue,
                RecordKind::EndPadding => {
                    return Step::Skip {
                        next_pos: (s + 1) * D,
                        next_ts: 0,
                    }
                }
                RecordKind::Data {
                    payload_offset,
                    payload_len,
                } => {
                    let p = PAGE_HEADER_SIZE + rec.offset + payload_offset;
                    let data = buf[p..p + payload_len].to_vec();
                    let next_off = rec.offset + rec.size;
                    let mut page_done = next_off >= DATA_SIZE;
                    if !page_done && next_off < limit {
                        let mut peek = dec.clone();
                        page_done = matches!(peek.next_record(), Some(r) if r.kind == RecordKind::EndPadding);
                    }
                    let (next_pos, next_ts) = if page_done {
                        ((s + 1) * D, 0)
                    } else {
                        (s * D + next_off as u64, rec.ts)
                    };
                    return Step::Event {
                        event: (rec.ts, data),
                        next_pos,
                        next_ts,
                    };
                }
            }
        }
    }

    /// Non-consuming copy of the page at a private reader's position, whole (from the
    /// page start), as a kernel-format page whose `commit` says how much is valid and
    /// carries the missed-events flags. `partial`: also hand out the page writers are
    /// still filling, up to what is committed (the writer is gone, or the recording
    /// ends). The cursor then moves past what was handed out.
    pub(crate) fn copy_page_at(
        &self,
        cursor: &mut RegionCursor,
        buf: &mut [u8; PAGE_SIZE],
        partial: bool,
    ) -> PageCopy {
        for _ in 0..1024 {
            if self.generation() != cursor.generation {
                *cursor = self.reader_start();
            }
            let (s, off) = (cursor.pos / D, (cursor.pos % D) as usize);
            let limit = match self.page_state(s) {
                PageState::Ready(l) => l,
                PageState::Empty => return PageCopy::Empty,
                PageState::Busy => return PageCopy::Busy,
                PageState::Gone => {
                    self.skip_gone(cursor, s);
                    continue;
                }
            };
            if limit < DATA_SIZE && !partial {
                return PageCopy::Busy;
            }
            if off >= limit {
                if limit == DATA_SIZE {
                    cursor.pos = (s + 1) * D;
                    continue;
                }
                return PageCopy::Empty;
            }
            let w = self.load_word(s);
            if !self.copy_page(s, buf) {
                if self.is_released() {
                    return PageCopy::Empty;
                }
                self.skip_gone(cursor, s);
                continue;
            }
            if word_tag(w) == s / self.nr_pages as u64 + 1 {
                cursor.copied += word_entries(w);
            }
            let lost = std::mem::take(&mut cursor.lost);
            let mut commit = limit as u64;
            if lost > 0 {
                commit |= page::MISSED_EVENTS;
                if limit + 8 <= DATA_SIZE {
                    let at = PAGE_HEADER_SIZE + limit;
                    buf[at..at + 8].copy_from_slice(&lost.to_ne_bytes());
                    commit |= page::MISSED_STORED;
                }
            }
            buf[8..16].copy_from_slice(&commit.to_ne_bytes());
            cursor.pos = if limit == DATA_SIZE {
                (s + 1) * D
            } else {
                s * D + limit as u64
            };
            cursor.ts = 0;
            return PageCopy::Page { len: limit, lost };
        }
        PageCopy::Busy
    }

    /// For a reader of a writer that is gone (its process died): the page at the
    /// cursor that never became complete because the writer stopped inside an event,
    /// cut to the events its committed byte count covers. A single writer commits in
    /// reservation order, so those are the bytes before the event it was writing;
    /// writers that interleaved on this CPU could leave a later event committed and an
    /// earlier one not, and that page is then cut at the last whole record of the count.
    /// The cursor moves past the page. `None` when there is no such page.
    pub(crate) fn salvage_page_at(
        &self,
        cursor: &mut RegionCursor,
        buf: &mut [u8; PAGE_SIZE],
    ) -> Option<PageCopy> {
        let (s, off) = (cursor.pos / D, (cursor.pos % D) as usize);
        if !matches!(self.page_state(s), PageState::Busy) || off != 0 {
            return None;
        }
        let w = self.load_word(s);
        if word_tag(w) != s / self.nr_pages as u64 + 1 || !self.copy_page(s, buf) {
            return None;
        }
        let committed = (word_bytes(w) as usize).min(DATA_SIZE);
        let mut dec = PageDecoder::with_limit(&buf[..], committed, page::read_u64(&buf[..], 0));
        let mut limit = 0;
        let mut entries = 0;
        while let Some(rec) = dec.next_record() {
            if rec.offset + rec.size > committed {
                break;
            }
            limit = rec.offset + rec.size;
            if matches!(rec.kind, RecordKind::Data { .. }) {
                entries += 1;
            }
        }
        let lost = std::mem::take(&mut cursor.lost);
        let mut commit = limit as u64;
        if lost > 0 {
            commit |= page::MISSED_EVENTS;
        }
        buf[8..16].copy_from_slice(&commit.to_ne_bytes());
        cursor.copied += entries;
        cursor.pos = (s + 1) * D;
        cursor.ts = 0;
        Some(PageCopy::Page { len: limit, lost })
    }

    /// Moves a private reader past page `s`, which writers reused before it was read,
    /// to the oldest data left, counting what was lost on the way: the writer's lost
    /// count moved on by the events of every reused page, those this reader copied
    /// before (all older than `s`, so all reused by now) included, which were not lost.
    fn skip_gone(&self, cursor: &mut RegionCursor, s: u64) {
        let fresh = self.reader_start();
        cursor.pos = fresh.pos.max((s + 1) * D);
        cursor.ts = 0;
        let total = self.lost_total();
        let moved = total.saturating_sub(cursor.lost_seen);
        cursor.lost += moved.saturating_sub(std::mem::take(&mut cursor.copied));
        cursor.lost_seen = total;
    }

    /// Counters, for a reader in another process.
    pub(crate) fn counters(&self) -> RegionStats {
        self.stats()
    }

    /// Consuming read of one event; `cache` keeps the time at the read position.
    /// Returns `(ts, payload, lost_before)`.
    pub(crate) fn consume(
        &self,
        cache: &mut RegionCursor,
        peek: bool,
    ) -> Result<(u64, Vec<u8>, u64), Step> {
        let read = self.atomic(OFF_READ);
        for _ in 0..10_000 {
            let rw = read.load(Ordering::SeqCst);
            let (rpos, nread) = read_unpack(rw);
            let hint = if cache.pos == rpos { cache.ts } else { 0 };
            match self.step(rpos, hint) {
                Step::Event {
                    event,
                    next_pos,
                    next_ts,
                } => {
                    if peek {
                        return Ok((event.0, event.1, 0));
                    }
                    let new = if next_pos / D != rpos / D {
                        read_pack(next_pos, 0)
                    } else {
                        read_pack(next_pos, nread + 1)
                    };
                    if read
                        .compare_exchange(rw, new, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        self.atomic(OFF_READ_EVENTS).fetch_add(1, Ordering::Relaxed);
                        *cache = RegionCursor {
                            pos: next_pos,
                            ts: next_ts,
                            ..*cache
                        };
                        return Ok((event.0, event.1, self.take_lost()));
                    }
                }
                Step::Skip { next_pos, next_ts } => {
                    let new = if next_pos / D != rpos / D {
                        read_pack(next_pos, 0)
                    } else {
                        read_pack(next_pos, nread)
                    };
                    if read
                        .compare_exchange(rw, new, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        *cache = RegionCursor {
                            pos: next_pos,
                            ts: next_ts,
                            ..*cache
                        };
                    }
                }
                Step::Gone => std::hint::spin_loop(),
                other => return Err(other),
            }
        }
        Err(Step::Busy)
    }

    /// Consuming read of the rest of the page at the read position, as a
    /// kernel-format page. Returns `(page, events)`. A complete page is
    /// swapped out of the ring first (`swap_out`); the partly written tail
    /// page is copied and checked, as the kernel copies it too.
    pub(crate) fn read_page(&self, cache: &mut RegionCursor) -> Option<(Vec<u8>, u64)> {
        let read = self.atomic(OFF_READ);
        for _ in 0..10_000 {
            let rw = read.load(Ordering::SeqCst);
            let (rpos, nread) = read_unpack(rw);
            let (s, off) = (rpos / D, (rpos % D) as usize);
            let limit = match self.page_state(s) {
                PageState::Ready(l) => l,
                PageState::Gone => continue,
                PageState::Empty | PageState::Busy => return None,
            };
            if off >= limit && limit < DATA_SIZE {
                return None;
            }
            let mut buf = [0u8; PAGE_SIZE];
            let swapped = limit == DATA_SIZE;
            if swapped {
                // A complete page: take it out of the ring (no writer can
                // touch it afterwards), then read it at leisure.
                let Some(phys) = self.swap_out(s) else {
                    continue; // a writer moved on into the slot: overwritten
                };
                // SAFETY: the page is the reader's alone now (see swap_out).
                unsafe {
                    std::ptr::copy_nonoverlapping(self.phys_ptr(phys), buf.as_mut_ptr(), PAGE_SIZE)
                };
            } else if !self.copy_page(s, &mut buf) {
                continue;
            }
            let base = page::read_u64(&buf, 0);
            let mut dec = PageDecoder::with_limit(&buf, limit, base);
            let hint = if cache.pos == rpos && off > 0 {
                cache.ts
            } else {
                0
            };
            if hint != 0 {
                dec = PageDecoder::resume(&buf, limit, off, hint);
            } else {
                while dec.offset() < off {
                    if dec.next_record().is_none() {
                        break;
                    }
                }
                if dec.offset() != off {
                    if swapped {
                        self.skip_unreadable(rw, s);
                    }
                    continue;
                }
            }
            let ts_start = dec.ts();
            let mut entries = 0;
            let mut end = off;
            while let Some(rec) = dec.next_record() {
                if rec.kind == RecordKind::EndPadding {
                    break;
                }
                if matches!(rec.kind, RecordKind::Data { .. }) {
                    entries += 1;
                }
                end = rec.offset + rec.size;
            }
            if dec.failed() {
                if swapped {
                    self.skip_unreadable(rw, s);
                }
                continue;
            }
            let ts_end = dec.ts();
            let (next_pos, next_nread) = if limit == DATA_SIZE {
                ((s + 1) * D, 0)
            } else {
                (s * D + limit as u64, nread + entries)
            };
            if read
                .compare_exchange(
                    rw,
                    read_pack(next_pos, next_nread),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_err()
            {
                continue;
            }
            *cache = RegionCursor {
                pos: next_pos,
                ts: if limit == DATA_SIZE { 0 } else { ts_end },
                ..*cache
            };
            if end == off {
                // Only padding was left on this page; try the next one.
                continue;
            }
            self.atomic(OFF_READ_EVENTS)
                .fetch_add(entries, Ordering::Relaxed);
            let lost = self.take_lost();
            let mut w = page::PageWriter::new(ts_start);
            w.push_raw(
                &buf[PAGE_HEADER_SIZE + off..PAGE_HEADER_SIZE + end],
                entries as usize,
                ts_end,
            );
            return Some((w.finish((lost > 0).then_some(lost)), entries));
        }
        None
    }

    /// Whether a consuming read would find an event (or padding to skip) now.
    pub(crate) fn has_data(&self) -> bool {
        let rpos = self.read_pos();
        if rpos >= self.pos() {
            return false;
        }
        matches!(self.page_state(rpos / D), PageState::Ready(l) if (rpos % D) < l as u64)
    }

    /// The events readable from `pos` on page by page (non-consuming): the
    /// events of the page at `pos`, and the position after them.
    pub(crate) fn read_chunk(
        &self,
        pos: u64,
        ts_hint: u64,
        out: &mut Vec<(u64, Vec<u8>)>,
    ) -> Result<(u64, u64), Step> {
        let mut pos = pos;
        let mut ts = ts_hint;
        let start_page = pos / D;
        loop {
            match self.step(pos, ts) {
                Step::Event {
                    event,
                    next_pos,
                    next_ts,
                } => {
                    out.push(event);
                    pos = next_pos;
                    ts = next_ts;
                }
                Step::Skip { next_pos, next_ts } => {
                    pos = next_pos;
                    ts = next_ts;
                }
                other => {
                    return if out.is_empty() {
                        Err(other)
                    } else {
                        Ok((pos, ts))
                    };
                }
            }
            if pos / D != start_page {
                return Ok((pos, ts));
            }
        }
    }

    /// Counters; `committed` counts the events of pages not yet reused from the page words.
    pub(crate) fn stats(&self) -> RegionStats {
        let n = self.nr_pages as u64;
        let p = self.pos();
        let forgotten = self.forgotten.load(Ordering::SeqCst);
        let mut current = 0;
        if forgotten != WORDS_KEPT {
            // The words are gone (they read as zeros).
            current = forgotten;
        } else if p > 0 {
            let last = (p - 1) / D;
            for idx in 0..n {
                if last < idx {
                    continue;
                }
                let seq = last - ((last - idx) % n);
                let w = self.load_word(seq);
                if word_tag(w) == seq / n + 1 {
                    current += word_entries(w);
                }
            }
        }
        RegionStats {
            committed: self.atomic(OFF_RETIRED).load(Ordering::SeqCst) + current,
            overrun: self.atomic(OFF_OVERRUN).load(Ordering::SeqCst),
            dropped: self.atomic(OFF_DROPPED).load(Ordering::SeqCst),
            commit_overrun: self.atomic(OFF_COMMIT_OVERRUN).load(Ordering::SeqCst),
            read: self.atomic(OFF_READ_EVENTS).load(Ordering::SeqCst),
        }
    }

    /// Bytes of unread event records (headers included) and the oldest unread time.
    pub(crate) fn unread_bytes_and_oldest(&self) -> (u64, Option<u64>) {
        let mut pos = self.read_pos();
        let end = self.pos();
        let mut bytes = 0u64;
        let mut oldest = None;
        let mut buf = [0u8; PAGE_SIZE];
        while pos < end {
            let s = pos / D;
            let off = (pos % D) as usize;
            let PageState::Ready(limit) = self.page_state(s) else {
                // In flight: count what is reserved.
                bytes += end - pos;
                break;
            };
            if !self.copy_page(s, &mut buf) {
                pos = self.read_pos().max(pos);
                continue;
            }
            let mut dec = PageDecoder::with_limit(&buf, limit, page::read_u64(&buf, 0));
            while let Some(rec) = dec.next_record() {
                if rec.offset >= off {
                    if let RecordKind::Data { .. } = rec.kind {
                        bytes += rec.size as u64;
                        oldest.get_or_insert(rec.ts);
                    }
                }
            }
            if limit < DATA_SIZE {
                break;
            }
            pos = (s + 1) * D;
        }
        (bytes, oldest)
    }
}

/// Adds committed bytes and entries to a page slot's commit words (which
/// `prepare_page` already moved to the page's lap), given the slot's
/// `local` word: a plain addition to it when the committing thread is on
/// `cpu`, the region's CPU (whichever CPU it reserved on), else a locked
/// one to the remote word after it. `add` is `entries << WORD_BYTES_BITS |
/// bytes`; `area` is the calling thread's rseq area from
/// `rseq::owner_area`, or null.
#[inline(always)]
fn commit_bytes_on(cpu: u32, local: *mut u64, add: u64, area: *mut u8) {
    if !area.is_null() {
        // The sequence itself checks that the thread is on `cpu` (an
        // unregistered thread's area names no CPU, so it fails too).
        loop {
            // SAFETY: `area` is this thread's rseq area (rseq is enabled);
            // the local word is written only by sequences on `cpu` and by
            // `prepare_page`, which cannot overlap a commit (see there).
            match unsafe { rseq::add_on_cpu(area, cpu, local, add) } {
                rseq::Outcome::Done => return,
                rseq::Outcome::Aborted => continue,
                _ => break,
            }
        }
    }
    // SAFETY: `local` is a slot's local word; the remote word is the next
    // u64 of the same slot's pair.
    unsafe { AtomicU64::from_ptr(local.add(1)) }.fetch_add(add, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn region(name: &str, pages: usize) -> Region {
        let path = crate::mapping::shm_dir()
            .join(format!("ustrace-region-test-{name}-{}", std::process::id()));
        Region::create(&path, 0, pages).expect("region")
    }

    /// Writes event `i` (a 60-byte payload starting with `i`).
    fn write(r: &Region, i: u32) {
        let raw = r
            .reserve(60, Clock::Counter, true, Writer::Foreign)
            .expect("overwrite mode always has room");
        // SAFETY: the reservation's payload is 60 writable bytes.
        let p = unsafe { std::slice::from_raw_parts_mut(raw.payload, 60) };
        p[..4].copy_from_slice(&i.to_le_bytes());
        r.commit(&raw);
    }

    #[test]
    fn a_writer_preempted_across_a_restart_looks_again_instead_of_failing() {
        let r = region("restart", 3);
        let mut next = 0;
        // Into the second lap: entering page 4 checks that page 1 is complete.
        write_until_page(&r, &mut next, 4);
        let stale = 4;
        // Retired and started over while that writer was preempted, with
        // its view of page 4 to enter.
        r.close();
        assert!(r.quiescent());
        let _ = r.consume(&mut r.reader_start(), false);
        r.atomic(OFF_READ)
            .store(read_pack(r.pos().div_ceil(D) * D, 0), Ordering::SeqCst);
        r.release();
        r.restart();
        write(&r, next);
        assert!(matches!(r.prepare_page(stale, true), Ok(false)));
        assert!(matches!(r.prepare_page(stale, false), Ok(false)));
        let st = r.stats();
        assert_eq!((st.commit_overrun, st.dropped), (0, 0), "{st:?}");
        assert_eq!(st.committed, 1);
    }

    thread_local! {
        /// Run by `prepare_page` once the writer's view passed its checks,
        /// before it acts on it: a preemption there, made deterministic.
        pub(super) static AFTER_CHECK: std::cell::Cell<Option<Box<dyn FnOnce()>>> =
            const { std::cell::Cell::new(None) };
    }

    fn sum(a: RegionStats, b: RegionStats) -> RegionStats {
        RegionStats {
            committed: a.committed + b.committed,
            overrun: a.overrun + b.overrun,
            dropped: a.dropped + b.dropped,
            commit_overrun: a.commit_overrun + b.commit_overrun,
            read: a.read + b.read,
        }
    }

    /// A writer entering a page is preempted after it checked its view and
    /// before it acts on it, while its region is closed, read to its end,
    /// retired and (if it may be) started over in place, as a resize and a
    /// resize back do. Its view of the page it would overwrite belongs to
    /// the old contents, whose events were all read: it must neither count
    /// them as overrun again nor move the new contents' reader.
    #[test]
    fn a_writer_preempted_inside_prepare_page_counts_no_event_twice() {
        let r = Arc::new(region("restart-mid", 3));
        let mut next = 0;
        write_until_page(&r, &mut next, 4);
        // The next write enters page 5, reusing page 2's slot.
        while r.pos() % D + 64 <= D {
            write(&r, next);
            next += 1;
        }
        let mut c = r.reader_start();
        while r.consume(&mut c, false).is_ok() {}
        assert_eq!(r.read_pos(), r.pos());
        let before = r.stats();
        assert_eq!(before.committed, before.read + before.overrun, "{before:?}");

        let had = Arc::new(std::sync::Mutex::new(RegionStats::default()));
        let (r2, had2) = (r.clone(), had.clone());
        AFTER_CHECK.with(|h| {
            h.set(Some(Box::new(move || {
                r2.close();
                // What `retire_drained` and `take_retired` require.
                if r2.quiescent() && r2.read_pos() >= r2.pos() {
                    r2.release();
                    *had2.lock().unwrap() = r2.restart();
                }
            })))
        });
        let raw = match r.reserve(60, Clock::Counter, true, Writer::Foreign) {
            Ok(raw) => raw,
            Err(ReserveError::Closed) => {
                // Started over only once the writer left.
                assert!(r.quiescent() && r.read_pos() >= r.pos());
                r.release();
                *had.lock().unwrap() = r.restart();
                r.reserve(60, Clock::Counter, true, Writer::Foreign)
                    .expect("an open region")
            }
            Err(e) => panic!("{e:?}"),
        };
        r.commit(&raw);

        let mut c = r.reader_start();
        let mut read_now = 0;
        while r.consume(&mut c, false).is_ok() {
            read_now += 1;
        }
        let had = *had.lock().unwrap();
        let total = sum(had, r.stats());
        assert_eq!(total.overrun, before.overrun, "{had:?} {total:?}");
        assert_eq!(total.committed, before.committed + 1, "{had:?} {total:?}");
        assert_eq!(
            total.committed,
            total.read + total.overrun,
            "{had:?} {total:?}"
        );
        assert_eq!(read_now, 1, "the new event is readable");
    }

    #[test]
    fn page_hint_only_moves_forward_and_follows_writers() {
        let r = region("hint", 4);
        let hint = |r: &Region| {
            (
                r.page_hint.start.load(Ordering::Relaxed),
                r.page_hint.place.load(Ordering::Relaxed),
            )
        };
        assert_eq!(hint(&r).0, NO_PAGE);
        let mut next = 0;
        write(&r, next);
        next += 1;
        assert_eq!(hint(&r).0, 0, "entering page 0 hints it");
        write_until_page(&r, &mut next, 2);
        let at_two = hint(&r);
        assert_eq!(at_two.0, 2 * D);
        // A writer that hinted late, for a page already left, changes nothing.
        r.set_page_hint(1, 1, 1);
        assert_eq!(hint(&r), at_two);
        // One that lost its hint is caught up with by the next slow write.
        r.page_hint.start.store(NO_PAGE, Ordering::Relaxed);
        write(&r, next);
        assert_eq!(hint(&r), at_two);
        r.close();
        assert!(r.quiescent());
        r.reinit();
        assert_eq!(hint(&r).0, NO_PAGE);
    }

    fn write_until_page(r: &Region, next: &mut u32, page: u64) {
        while r.pos() < page * D + 100 {
            write(r, *next);
            *next += 1;
        }
    }

    /// Every event a non-consuming reader sees, from the reader's start.
    fn visible(r: &Region) -> Vec<u32> {
        let mut c = r.reader_start();
        let mut out = Vec::new();
        for _ in 0..100_000 {
            match r.step(c.pos, c.ts) {
                Step::Event {
                    event,
                    next_pos,
                    next_ts,
                } => {
                    out.push(u32::from_le_bytes(event.1[..4].try_into().unwrap()));
                    (c.pos, c.ts) = (next_pos, next_ts);
                }
                Step::Skip { next_pos, next_ts } => (c.pos, c.ts) = (next_pos, next_ts),
                Step::Gone => (c.pos, c.ts) = ((c.pos / D + 1) * D, 0),
                Step::Empty | Step::Busy => break,
            }
        }
        out
    }

    #[test]
    fn read_page_swaps_out_a_complete_page_and_writers_go_around_it() {
        let r = region("swap", 3);
        let mut next = 0;
        write_until_page(&r, &mut next, 1);
        let slot0 = r.map_word(0).load(Ordering::SeqCst);
        assert_eq!((map_phys(slot0), slot0 & MAP_SWAPPED), (0, 0));

        let mut cur = r.reader_start();
        let (page, entries) = r.read_page(&mut cur).expect("page 0 is complete");
        let got: Vec<u32> = PageDecoder::new(&page)
            .expect("a kernel page")
            .map(|e| u32::from_le_bytes(e.data[..4].try_into().unwrap()))
            .collect();
        assert_eq!(got.len() as u64, entries);
        assert_eq!(got, (0..entries as u32).collect::<Vec<_>>());

        // The slot now holds the former spare (page 3), marked swapped; the
        // reader owns page 0.
        let slot0 = r.map_word(0).load(Ordering::SeqCst);
        assert_eq!(map_phys(slot0), 3);
        assert_ne!(slot0 & MAP_SWAPPED, 0);
        assert_eq!(r.atomic(OFF_SPARE).load(Ordering::SeqCst), 0);
        assert!(matches!(r.page_state(0), PageState::Gone));

        // Non-consuming readers see only what is left, never the spare's
        // stale bytes.
        let rest = visible(&r);
        assert_eq!(rest.first(), Some(&(entries as u32)));
        assert!(rest.windows(2).all(|w| w[1] == w[0] + 1));

        // Writers wrap around three more laps: they fill the spare, never
        // the reader's page.
        // SAFETY: page 0 lies in the mapping; nobody writes it now.
        let before = unsafe { std::slice::from_raw_parts(r.phys_ptr(0), PAGE_SIZE) }.to_vec();
        write_until_page(&r, &mut next, 12);
        // SAFETY: as above.
        let after = unsafe { std::slice::from_raw_parts(r.phys_ptr(0), PAGE_SIZE) };
        assert_eq!(before, after, "a writer touched the swapped-out page");
        let seen = visible(&r);
        assert!(!seen.is_empty());
        assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "{seen:?}");
        assert_eq!(*seen.last().unwrap(), next - 1);
    }

    #[test]
    fn swap_fails_once_a_writer_moved_the_slot_on() {
        let r = region("swap-late", 2);
        let mut next = 0;
        // Into page 2: slot 0 now holds lap 1.
        write_until_page(&r, &mut next, 2);
        assert_eq!(r.swap_out(0), None);
        assert!(
            r.swap_out(1).is_some(),
            "page 1 is complete and in its slot"
        );
        assert_eq!(r.swap_out(1), None, "already swapped");
    }
}
