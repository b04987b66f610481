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
//! The reservation state is 16 bytes — `{pos, last_ts}` — updated with one
//! double-width compare-and-swap. Taking the timestamp inside the CAS loop
//! and storing it with the position is what makes the kernel's delta
//! encoding work with concurrent writers: whoever wins the CAS knows exactly
//! which event precedes it and its time, and `ts = max(clock, last_ts)`
//! keeps time monotonic within the ring.
//!
//! ```text
//!  reserve(len):  load {pos,last}; ts = max(now,last)
//!                 fits in page?      -> new pos = pos + size (+8 for a time extend)
//!                 else               -> pad the page end, event at next page start
//!                 entering page seq e >= nr_pages (reusing slot of seq v = e - nr_pages):
//!                    v not fully committed              -> drop (commit overrun)
//!                    producer/consumer and v unread     -> drop (dropped)
//!                    overwrite: push the read position past v (overrun += unread)
//!                 CAS {pos,last} -> {new pos, ts}; on failure retry with what we saw
//!  fill payload
//!  commit:        CAS the slot's page word += (1 entry, size bytes)
//! ```
//!
//! A page word packs `lap+1 : 40 | entries : 12 | committed bytes : 12`.
//! A page is complete when its word says "this lap, 4080 bytes": every byte
//! reserved in it — events, time extends, discards and end padding — has
//! been committed. Commits may finish in any order; nobody waits for anybody.
//!
//! # Readers
//!
//! The consuming reader keeps `read = pos << 12 | events read in that page`
//! in the region header and advances it with CAS. An overwriting writer
//! moves it forward *before* it claims the page, so a consumer that copied
//! an event and then fails its CAS knows the copy may be torn and retries.
//! Readers that do not consume (the `trace` iterator, `ShmReader`) copy a
//! page and then check the reservation position has not entered the
//! page's next lap (a seqlock on `pos`). A partially filled tail page is
//! readable when it is quiescent: `pos` unchanged around reading its page
//! word and the word's byte count equals `pos`'s offset.

use crate::clock::{self, Clock};
use crate::page::{
    self, event_size, payload_offset, write_data_header, write_end_padding, write_time_extend,
    PageDecoder, RecordKind, DATA_SIZE, PAGE_HEADER_SIZE, PAGE_SIZE, TIME_EXTEND_SIZE, TS_MASK,
};
use crate::shm::{Mapping, LAYOUT_VERSION, REGION_MAGIC};
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
pub(crate) const OFF_STATE: usize = 64;
pub(crate) const OFF_READ: usize = 128;
pub(crate) const OFF_LOST_REPORTED: usize = 136;
pub(crate) const OFF_OVERRUN: usize = 192;
pub(crate) const OFF_DROPPED: usize = 200;
pub(crate) const OFF_COMMIT_OVERRUN: usize = 208;
pub(crate) const OFF_RETIRED: usize = 216;
pub(crate) const OFF_READ_EVENTS: usize = 224;
pub(crate) const WORDS_START: usize = 256;

const WORD_BYTES_BITS: u32 = 12;
const WORD_ENTRIES_BITS: u32 = 12;
const WORD_TAG_SHIFT: u32 = WORD_BYTES_BITS + WORD_ENTRIES_BITS;
const READ_NREAD_BITS: u32 = 12;

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
}

/// A reserved slot, between `reserve` and `commit`/`discard`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawReservation {
    seq: u64,
    data_off: usize,
    total: usize,
    delta: u64,
    pub(crate) payload: *mut u8,
    pub(crate) len: usize,
    cap: usize,
    entered: bool,
    extend: bool,
}

impl RawReservation {
    /// Whether this reservation started a new page.
    #[inline]
    pub(crate) fn entered_page(&self) -> bool {
        self.entered
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
    pages_off: usize,
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
    /// Size of a region file with `nr_pages` pages.
    pub(crate) fn file_size(nr_pages: usize) -> usize {
        Self::pages_offset(nr_pages) + nr_pages * PAGE_SIZE
    }

    fn pages_offset(nr_pages: usize) -> usize {
        crate::shm::round_up(WORDS_START + nr_pages * 8, PAGE_SIZE)
    }

    /// Creates a zeroed region file for `cpu` with `nr_pages` pages.
    pub(crate) fn create(path: &Path, cpu: usize, nr_pages: usize) -> io::Result<Region> {
        let map = Mapping::create(path, Self::file_size(nr_pages))?;
        let pages_off = Self::pages_offset(nr_pages);
        let r = Region {
            map,
            nr_pages,
            words_off: WORDS_START,
            pages_off,
        };
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
            pages_off: 0,
        };
        let magic = r.atomic(OFF_MAGIC).load(Ordering::Acquire);
        // SAFETY: header fields are inside the first 256 bytes (checked above);
        // they are written once before the magic is published.
        let (version, nr_pages, page_size, words, pages) = unsafe {
            let b = r.map.ptr();
            (
                b.add(OFF_VERSION).cast::<u32>().read(),
                b.add(OFF_NR_PAGES).cast::<u32>().read() as usize,
                b.add(OFF_PAGE_SIZE).cast::<u32>().read() as usize,
                b.add(OFF_WORDS).cast::<u64>().read() as usize,
                b.add(OFF_PAGES).cast::<u64>().read() as usize,
            )
        };
        if magic != REGION_MAGIC || version != LAYOUT_VERSION || page_size != PAGE_SIZE {
            return Err(bad(format!(
                "bad header (magic {magic:#x}, version {version}, page size {page_size})"
            )));
        }
        if nr_pages < 2
            || words + nr_pages * 8 > pages
            || pages + nr_pages * PAGE_SIZE > r.map.len()
        {
            return Err(bad(format!("{nr_pages} pages do not fit the file")));
        }
        let Region { map, .. } = r;
        Ok(Region {
            map,
            nr_pages,
            words_off: words,
            pages_off: pages,
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

    #[inline]
    fn atomic(&self, off: usize) -> &AtomicU64 {
        // SAFETY: every offset used is an 8-aligned u64 inside the mapping,
        // which lives as long as `self`; shared fields are only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.map.ptr().add(off).cast()) }
    }

    #[inline]
    fn word(&self, seq: u64) -> &AtomicU64 {
        self.atomic(self.words_off + (seq % self.nr_pages as u64) as usize * 8)
    }

    #[inline]
    fn page_ptr(&self, seq: u64) -> *mut u8 {
        // SAFETY: slot index < nr_pages, so the page lies inside the mapping.
        unsafe {
            self.map
                .ptr()
                .add(self.pages_off + (seq % self.nr_pages as u64) as usize * PAGE_SIZE)
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
    /// `page::MAX_PAYLOAD`). Lock-free: a failed CAS means another writer
    /// made progress.
    #[inline]
    pub(crate) fn reserve(
        &self,
        len: usize,
        clock: Clock,
        overwrite: bool,
    ) -> Result<RawReservation, ReserveError> {
        let size = event_size(len) as u64;
        let n = self.nr_pages as u64;
        let state = self.map.ptr().wrapping_add(OFF_STATE).cast::<u64>();
        let mut cur = self.load_state();
        loop {
            if cur[0] & CLOSED != 0 {
                return Err(ReserveError::Closed);
            }
            let ts = clock::now(clock).max(cur[1]);
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
            let mut victim_entries = None;
            if let Some(e) = enter.filter(|&e| e >= n) {
                let v = e - n;
                let w = self.word(v).load(Ordering::SeqCst);
                if word_tag(w) != v / n + 1 || word_bytes(w) != D {
                    self.atomic(OFF_COMMIT_OVERRUN)
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(ReserveError::CommitOverrun);
                }
                if overwrite {
                    self.push_reader(v, word_entries(w));
                } else if read_unpack(self.atomic(OFF_READ).load(Ordering::SeqCst)).0 < (v + 1) * D
                {
                    self.atomic(OFF_DROPPED).fetch_add(1, Ordering::Relaxed);
                    return Err(ReserveError::Dropped);
                }
                victim_entries = Some(word_entries(w));
            }
            // SAFETY: `state` is the 16-aligned reservation state inside our
            // writable mapping (regions opened read-only never reserve).
            match unsafe { cas128(state, cur, [start + total, ts]) } {
                Ok(()) => {
                    if let Some(ve) = victim_entries {
                        self.atomic(OFF_RETIRED).fetch_add(ve, Ordering::Relaxed);
                    }
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
                        self.commit_bytes(ps, (DATA_SIZE - po) as u64, 0);
                    }
                    let es = start / D;
                    let page = self.page_ptr(es);
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
                    let cap = size as usize - payload_offset(size as usize);
                    return Ok(RawReservation {
                        seq: es,
                        data_off,
                        total: total as usize,
                        delta,
                        // SAFETY: inside the reserved slot.
                        payload: unsafe { slot.as_mut_ptr().add(at + p) },
                        len,
                        cap,
                        entered: enter.is_some(),
                        extend,
                    });
                }
                Err(actual) => cur = actual,
            }
        }
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

    #[inline]
    fn commit_bytes(&self, seq: u64, bytes: u64, entries: u64) {
        let tag = seq / self.nr_pages as u64 + 1;
        let w = self.word(seq);
        let add = (entries << WORD_BYTES_BITS) | bytes;
        let mut cur = w.load(Ordering::Relaxed);
        loop {
            let new = if word_tag(cur) == tag {
                cur + add
            } else {
                (tag << WORD_TAG_SHIFT) | add
            };
            match w.compare_exchange_weak(cur, new, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => return,
                Err(a) => cur = a,
            }
        }
    }

    /// Publishes a filled reservation.
    #[inline]
    pub(crate) fn commit(&self, r: &RawReservation) {
        if r.cap > r.len {
            // SAFETY: [len, cap) is the alignment tail of our own payload slot.
            unsafe { std::ptr::write_bytes(r.payload.add(r.len), 0, r.cap - r.len) };
        }
        self.commit_bytes(r.seq, r.total as u64, 1);
    }

    /// Withdraws a reservation: the bytes become a time extend (so later
    /// deltas stay right) plus padding, and count as no event.
    pub(crate) fn discard(&self, r: &RawReservation) {
        // SAFETY: the reserved slot [data_off, data_off+total) is still ours.
        let slot = unsafe {
            std::slice::from_raw_parts_mut(
                self.page_ptr(r.seq).add(PAGE_HEADER_SIZE + r.data_off),
                r.total,
            )
        };
        page::write_discarded(slot, r.total, r.delta, r.extend);
        self.commit_bytes(r.seq, r.total as u64, 0);
    }

    /// Stops new reservations (writers get `Closed`).
    pub(crate) fn close(&self) {
        let state = self.map.ptr().wrapping_add(OFF_STATE).cast::<u64>();
        let mut cur = self.load_state();
        while cur[0] & CLOSED == 0 {
            // SAFETY: writable region, aligned state (see reserve).
            match unsafe { cas128(state, cur, [cur[0] | CLOSED, cur[1]]) } {
                Ok(()) => return,
                Err(a) => cur = a,
            }
        }
    }

    /// Whether every reserved byte is committed (no writer in flight).
    pub(crate) fn quiescent(&self) -> bool {
        let p = self.pos();
        if p == 0 {
            return true;
        }
        let n = self.nr_pages as u64;
        let last = (p - 1) / D;
        let first = (last + 1).saturating_sub(n);
        (first..=last).all(|seq| {
            let w = self.word(seq).load(Ordering::SeqCst);
            let expect = (p - seq * D).min(D);
            word_tag(w) == seq / n + 1 && word_bytes(w) == expect
        })
    }

    /// Empties a closed, quiescent region and reopens it.
    pub(crate) fn reinit(&self) {
        for i in 0..self.nr_pages as u64 {
            self.word(i).store(0, Ordering::Relaxed);
        }
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
        self.atomic(OFF_GENERATION).fetch_add(1, Ordering::SeqCst);
        let state = self.map.ptr().wrapping_add(OFF_STATE).cast::<u64>();
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
            let w = self.word(s).load(Ordering::SeqCst);
            if p1 >= (s + 1) * D {
                return if word_tag(w) == tag && word_bytes(w) == D {
                    PageState::Ready(DATA_SIZE)
                } else if word_tag(w) > tag {
                    PageState::Gone
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

    /// Copies page `s` into `buf` and checks no writer started reusing it meanwhile.
    fn copy_page(&self, s: u64, buf: &mut [u8; PAGE_SIZE]) -> bool {
        // SAFETY: the page lies inside the mapping. Writers may be storing
        // into it if it is being overwritten; the position check below
        // detects that and the copy is thrown away (seqlock read).
        unsafe { std::ptr::copy_nonoverlapping(self.page_ptr(s), buf.as_mut_ptr(), PAGE_SIZE) };
        fence(Ordering::Acquire);
        self.pos() <= (s + self.nr_pages as u64) * D
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
            return Step::Gone;
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
    /// kernel-format page. Returns `(page, events)`.
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
            if !self.copy_page(s, &mut buf) {
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
        let mut current = 0;
        if p > 0 {
            let last = (p - 1) / D;
            for idx in 0..n {
                if last < idx {
                    continue;
                }
                let seq = last - ((last - idx) % n);
                let w = self.word(seq).load(Ordering::SeqCst);
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
