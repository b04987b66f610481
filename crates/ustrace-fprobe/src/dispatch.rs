//! The probe-hit path: per-site probe lists, the per-thread shadow stack, and the quiescence
//! scheme that lets `unregister` wait for handlers without readers taking any lock.
//!
//! # Per-site lists (RCU-like)
//!
//! Every patched function has one immortal [`Site`]; its `probes` pointer names an immutable
//! [`ProbeList`]. Registration builds a new list and swaps the pointer; the old list is freed
//! only after [`synchronize`] proved that no thread can still be reading it.
//!
//! # Quiescence (what "after unregister returns, no handler runs" rests on)
//!
//! Each thread owns one slot of `QSLOTS` (claimed on its first probe hit, released by a TLS
//! destructor) holding a counter that is odd while the thread is inside the dispatcher:
//!
//! ```text
//!   reader (probe hit)                        writer (register/unregister)
//!   counter += 1 (odd)    plain store         publish new list / bump probe generation
//!   compiler fence                            membarrier(PRIVATE_EXPEDITED): every running
//!   load site list, run handlers                thread executes a full fence, so each reader
//!   compiler fence                              either already shows odd, or will load the
//!   counter += 1 (even)   release store         new state
//!                                             for every slot that was odd: wait until it
//!                                               changes; then free old lists / probes
//! ```
//!
//! The reader side costs two plain stores, and the counter's parity doubles as the thread's
//! "inside the dispatcher" flag (recursion below). Threads beyond `QSLOTS` (or running TLS
//! destructors) fall back to one shared atomic in-flight counter and a flag of their own.
//!
//! # Shadow stack (return hooking)
//!
//! ```text
//!   thread stack                         shadow stack (TLS)          entry-data arena (TLS)
//!   |  caller frame      |               frames[0] {ret, sp=S0}  --> [slot,gen|len|data..]
//!   |  ret = tramp  <- S0|               frames[1] {ret, sp=S1}  --> [slot,gen|len|data..]
//!   |  probed fn frame   |
//!   |  ret = tramp  <- S1|   (S1 < S0: stacks grow down)
//! ```
//!
//! Each hooked call records the real return address and the address `sp` of the slot it
//! overwrote. Frames whose `sp` lies below the current stack pointer belong to calls that were
//! left without returning (longjmp, unwinding, a thread-switching trick): they are discarded
//! lazily at the next event, which keeps the stack consistent without hooking `longjmp`.
//! The stack holds [`MAX_FRAMES`] frames and [`ARENA_WORDS`] words of entry data per thread,
//! allocated with the thread's static TLS (no allocation on the hot path); a call that finds it
//! full runs its entry handlers but not its exit handlers and counts a miss (`nmissed`).
//!
//! Recursion: while a thread runs a handler, probe hits on that thread (a handler calling a
//! probed function, a signal handler doing so) run no handler and count a miss on every fprobe
//! of that site.

use std::cell::UnsafeCell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{
    compiler_fence, AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

use crate::arch::{self, PtRegs};

/// What an entry handler asks for the exit of this call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryAction {
    /// Run this fprobe's exit handler when the call returns.
    Continue,
    /// Do not run this fprobe's exit handler for this call (the kernel's non-zero return).
    SkipExit,
}

/// Entry handler: `(fprobe, entry_ip, ret_ip, regs, entry_data) -> action`.
pub type EntryHandler =
    dyn Fn(&Probe, usize, usize, &PtRegs, &mut [u8]) -> EntryAction + Send + Sync;
/// Exit handler: `(fprobe, entry_ip, ret_ip, regs, entry_data)`.
pub type ExitHandler = dyn Fn(&Probe, usize, usize, &PtRegs, &mut [u8]) + Send + Sync;

/// The part of an fprobe the handlers see (and [`crate::Fprobe`] derefs to).
pub struct Probe {
    pub(crate) entry: Option<Box<EntryHandler>>,
    pub(crate) exit: Option<Box<ExitHandler>>,
    pub(crate) entry_data_size: usize,
    pub(crate) nr_maxactive: u32,
    pub(crate) active: AtomicU32,
    pub(crate) nmissed: AtomicU64,
    pub(crate) disabled: AtomicBool,
    pub(crate) slot: AtomicU32,
    pub(crate) id: u64,
    /// `slot | gen << 32`, the header of this fprobe's shadow-stack records (both halves
    /// are fixed at registration; the hit path stores it without recomputing it).
    pub(crate) record_hdr: u64,
    /// `entry_data_size` in words, as the arena reserves it.
    pub(crate) entry_words: usize,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("id", &self.id)
            .field("nmissed", &self.nmissed())
            .field("disabled", &self.is_disabled())
            .finish()
    }
}

impl Probe {
    /// Calls whose handlers were skipped (recursion) or whose exit could not be hooked
    /// (shadow stack full, `nr_maxactive` reached, frame abandoned by an unwind).
    pub fn nmissed(&self) -> u64 {
        self.nmissed.load(Ordering::Relaxed)
    }

    /// Whether [`crate::Fprobe::disable`] is in effect.
    pub fn is_disabled(&self) -> bool {
        self.disabled.load(Ordering::Relaxed)
    }

    /// Process-unique id of this fprobe.
    pub fn id(&self) -> u64 {
        self.id
    }

    fn miss(&self) {
        self.nmissed.fetch_add(1, Ordering::Relaxed);
    }
}

/// The immutable list of probes attached to one site.
pub(crate) struct ProbeList {
    /// The list's only fprobe when there is one, it has an entry handler and no exit handler
    /// (else null): the hit path's common case is one load and one test away.
    pub only_entry: *const Probe,
    /// The list's only fprobe when there is one, it has an exit handler and no
    /// `nr_maxactive` (else null).
    pub only_exit: *const Probe,
    pub has_exit: bool,
    pub probes: Box<[*const Probe]>,
}

impl ProbeList {
    /// The list of `probes`, with its shortcuts worked out.
    pub(crate) fn new(probes: Box<[*const Probe]>) -> ProbeList {
        // SAFETY: the caller's probes are alive (they are published from live `Arc`s).
        let refs: Vec<&Probe> = probes.iter().map(|&p| unsafe { &*p }).collect();
        let has_exit = refs.iter().any(|p| p.exit.is_some());
        let (mut only_entry, mut only_exit) = (std::ptr::null(), std::ptr::null());
        if let [p] = &*refs {
            if p.exit.is_some() {
                if p.nr_maxactive == 0 {
                    only_exit = *p as *const Probe;
                }
            } else if p.entry.is_some() {
                only_entry = *p as *const Probe;
            }
        }
        ProbeList {
            only_entry,
            only_exit,
            has_exit,
            probes,
        }
    }
}

/// One patched function. `#[repr(C)]` with `orig_stub` first: the entry trampoline jumps
/// through `[r11]`.
#[repr(C)]
pub(crate) struct Site {
    pub orig_stub: AtomicUsize,
    /// Symbol address, reported as `entry_ip`.
    pub func: usize,
    pub probes: AtomicPtr<ProbeList>,
    /// Set on the unwinder's own functions: their returns must stay visible to it.
    pub no_return_hook: AtomicBool,
}

// ---------------------------------------------------------------------------------------------
// Probe slots: immortal (generation, pointer) pairs that shadow frames refer to.

pub(crate) const PROBE_SLOTS: usize = 4096;

pub(crate) struct ProbeSlot {
    pub gen: AtomicU32,
    pub probe: AtomicPtr<Probe>,
}

pub(crate) static PSLOTS: [ProbeSlot; PROBE_SLOTS] = [const {
    ProbeSlot {
        gen: AtomicU32::new(0),
        probe: AtomicPtr::new(std::ptr::null_mut()),
    }
}; PROBE_SLOTS];

// ---------------------------------------------------------------------------------------------
// Quiescence slots.

const QSLOT_COUNT: usize = 1024;
const QSLOT_NONE: u32 = u32::MAX;
const QSLOT_OVERFLOW: u32 = u32::MAX - 1;

#[repr(align(64))]
struct QSlot {
    owner: AtomicI32,
    counter: AtomicU64,
}

static QSLOTS: [QSlot; QSLOT_COUNT] = [const {
    QSlot {
        owner: AtomicI32::new(0),
        counter: AtomicU64::new(0),
    }
}; QSLOT_COUNT];
static OVERFLOW_INFLIGHT: AtomicU64 = AtomicU64::new(0);

// ---------------------------------------------------------------------------------------------
// Per-thread state.

/// Hooked calls one thread can have outstanding.
pub const MAX_FRAMES: usize = 256;
/// Words (8 bytes) of entry data plus 2 header words per (call, fprobe) one thread can hold.
pub const ARENA_WORDS: usize = 4096;

#[derive(Clone, Copy)]
struct Frame {
    ret: usize,
    sp: usize,
    entry_ip: usize,
    // All fields word-sized and read one by one: a whole-struct copy right after the entry
    // wrote them field by field would stall on store forwarding.
    arena_start: usize,
    arena_end: usize,
}

struct ThreadState {
    /// Inside the dispatcher, for a thread without a quiescence slot (one with a slot is
    /// inside while its counter is odd; see `enter`).
    busy: bool,
    /// Set by the dlopen hook's exit handler; acted on once the dispatcher is left.
    rescan_pending: bool,
    qslot: u32,
    /// The counter of `qslot` while this thread owns one, else null (no slot claimed yet, or
    /// the shared overflow counter): the hit path's one load to find its counter.
    qcounter: *const AtomicU64,
    depth: usize,
    arena_top: usize,
    frames: [Frame; MAX_FRAMES],
    arena: [u64; ARENA_WORDS],
}

const EMPTY_FRAME: Frame = Frame {
    ret: 0,
    sp: 0,
    entry_ip: 0,
    arena_start: 0,
    arena_end: 0,
};

thread_local! {
    static TS: UnsafeCell<ThreadState> = const {
        UnsafeCell::new(ThreadState {
            busy: false,
            rescan_pending: false,
            qslot: QSLOT_NONE,
            qcounter: std::ptr::null(),
            depth: 0,
            arena_top: 0,
            frames: [EMPTY_FRAME; MAX_FRAMES],
            arena: [0; ARENA_WORDS],
        })
    };
}

/// The pthread key whose destructor gives a thread's quiescence slot back when it exits
/// (`u32::MAX` until [`prepare_slot_release`] made it). A Rust thread-local with `Drop` would
/// register its destructor on first use with `__cxa_thread_atexit_impl`, which allocates: a
/// first hit inside the allocator (an arena lock held) then deadlocked on that same lock.
/// `pthread_setspecific` on one of the first 32 keys stores in the thread descriptor itself.
static SLOT_KEY: AtomicU32 = AtomicU32::new(u32::MAX);

/// Keys below this index live inside glibc's thread descriptor (no allocation to set).
const INLINE_KEYS: u32 = 32;

unsafe extern "C" fn release_slot_at_exit(value: *mut libc::c_void) {
    let i = (value as usize).wrapping_sub(1);
    if i < QSLOT_COUNT {
        let ts = ts();
        // SAFETY: this thread's own state; TLS of the thread is still valid while pthread
        // key destructors run.
        unsafe {
            (*ts).qslot = QSLOT_OVERFLOW;
            (*ts).qcounter = std::ptr::null();
        }
        QSLOTS[i].owner.store(0, Ordering::Release);
    }
}

/// Creates the slot-release key once; called by registration, never on the hit path.
pub(crate) fn prepare_slot_release() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: valid out pointer and a destructor with the C signature.
        if unsafe { libc::pthread_key_create(&mut key, Some(release_slot_at_exit)) } == 0 {
            SLOT_KEY.store(key, Ordering::Release);
        }
    });
}

#[inline(always)]
fn ts() -> *mut ThreadState {
    TS.with(|t| t.get())
}

#[cold]
#[inline(never)]
fn claim_slot(ts: *mut ThreadState) {
    // By the syscall instruction: libc's syscall() may be probed, and this is a first hit.
    let tid = arch::gettid();
    for (i, s) in QSLOTS.iter().enumerate() {
        if s.owner
            .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            // Only a key stored inside the thread descriptor is set here: anything that could
            // allocate might be running inside the allocator's lock already.
            let key = SLOT_KEY.load(Ordering::Acquire);
            let stored = key < INLINE_KEYS && {
                // SAFETY: a key made by pthread_key_create; the value is a plain integer.
                unsafe { libc::pthread_setspecific(key, (i + 1) as *const libc::c_void) == 0 }
            };
            if stored {
                // SAFETY: own thread state.
                unsafe {
                    (*ts).qslot = i as u32;
                    (*ts).qcounter = &s.counter;
                }
                return;
            }
            s.owner.store(0, Ordering::Release);
            break;
        }
    }
    // SAFETY: own thread state.
    unsafe { (*ts).qslot = QSLOT_OVERFLOW };
}

/// Enters the dispatcher: false (and nothing changes) when this thread is inside it already.
///
/// A thread with a quiescence slot is inside exactly while its counter is odd, so the counter
/// is also the recursion flag: entering is one load, one test and one plain store. Threads
/// without a slot use `busy` and the shared overflow counter.
#[inline(always)]
unsafe fn enter(ts: *mut ThreadState) -> bool {
    // SAFETY: caller passes this thread's state.
    let c = unsafe { (*ts).qcounter };
    if c.is_null() {
        // SAFETY: as above.
        return unsafe { enter_slow(ts) };
    }
    // SAFETY: a counter of QSLOTS (static), owned by this thread: only it writes it.
    let c = unsafe { &*c };
    let v = c.load(Ordering::Relaxed);
    if v & 1 != 0 {
        return false;
    }
    c.store(v + 1, Ordering::Relaxed);
    compiler_fence(Ordering::SeqCst);
    true
}

/// First hit of a thread (claims a slot), or a thread without one (overflow counter).
#[cold]
#[inline(never)]
unsafe fn enter_slow(ts: *mut ThreadState) -> bool {
    // SAFETY: caller passes this thread's state.
    unsafe {
        if (*ts).busy {
            return false;
        }
        if (*ts).qslot == QSLOT_NONE {
            // Claiming calls into libc (pthread_setspecific), which may be probed: a hit
            // in there finds the thread busy and counts as missed instead of recursing.
            (*ts).busy = true;
            claim_slot(ts);
            (*ts).busy = false;
            if !(*ts).qcounter.is_null() {
                return enter(ts);
            }
        }
        (*ts).busy = true;
    }
    OVERFLOW_INFLIGHT.fetch_add(1, Ordering::SeqCst);
    true
}

/// Leaves the dispatcher after an [`enter`] that returned true.
#[inline(always)]
unsafe fn leave(ts: *mut ThreadState) {
    // SAFETY: caller passes this thread's state; `qcounter` only changes in `enter` (or in
    // the thread's exit, never inside the dispatcher), so this is the counter enter used.
    match unsafe { (*ts).qcounter.as_ref() } {
        Some(c) => {
            compiler_fence(Ordering::SeqCst);
            c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
        }
        None => {
            OVERFLOW_INFLIGHT.fetch_sub(1, Ordering::Release);
            // SAFETY: as above.
            unsafe { (*ts).busy = false };
        }
    }
}

/// True while the calling thread is inside the dispatcher (runs a handler).
fn is_busy(ts: *mut ThreadState) -> bool {
    // SAFETY: this thread's own state and slot counter.
    unsafe {
        match (*ts).qcounter.as_ref() {
            Some(c) => c.load(Ordering::Relaxed) & 1 != 0,
            None => (*ts).busy,
        }
    }
}

/// True while the calling thread runs a handler.
pub(crate) fn in_handler() -> bool {
    is_busy(ts())
}

/// Waits until every thread that might have observed state published before this call has
/// left the dispatcher. See the module doc.
pub(crate) fn synchronize() {
    arch::membarrier_all();
    // SAFETY: own thread state.
    let mine = unsafe { (*ts()).qslot } as usize;
    let mut waits = Vec::new();
    for (i, s) in QSLOTS.iter().enumerate() {
        if i == mine {
            continue;
        }
        let owner = s.owner.load(Ordering::Acquire);
        if owner != 0 {
            let c = s.counter.load(Ordering::Acquire);
            if c & 1 == 1 {
                waits.push((i, owner, c));
            }
        }
    }
    for (i, owner, c) in waits {
        let s = &QSLOTS[i];
        let mut spins = 0u32;
        while s.counter.load(Ordering::Acquire) == c && s.owner.load(Ordering::Acquire) == owner {
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
    while OVERFLOW_INFLIGHT.load(Ordering::Acquire) != 0 {
        std::thread::yield_now();
    }
}

/// After fork: the child has one thread; forget the parent's other threads' slots.
pub(crate) fn after_fork_in_child() {
    let ts = ts();
    // SAFETY: own thread state; the child is single-threaded here.
    let mine = unsafe { (*ts).qslot } as usize;
    let tid = arch::gettid();
    for (i, s) in QSLOTS.iter().enumerate() {
        if i == mine {
            s.owner.store(tid, Ordering::Release);
        } else {
            s.owner.store(0, Ordering::Release);
            s.counter.store(0, Ordering::Release);
        }
    }
    // SAFETY: as above.
    let inflight = unsafe { (*ts).busy && (*ts).qcounter.is_null() };
    OVERFLOW_INFLIGHT.store(inflight as u64, Ordering::Release);
}

// ---------------------------------------------------------------------------------------------
// Hit path.

#[inline(always)]
unsafe fn probe_of_record(hdr: u64) -> Option<&'static Probe> {
    // SAFETY: record headers are only ever a registered fprobe's `record_hdr`, whose low
    // half is a slot index below PROBE_SLOTS.
    let slot = unsafe { PSLOTS.get_unchecked((hdr as u32) as usize) };
    if slot.gen.load(Ordering::Acquire) != (hdr >> 32) as u32 {
        return None;
    }
    let p = slot.probe.load(Ordering::Acquire);
    // SAFETY: a probe stays allocated until `synchronize` saw this thread leave the dispatcher,
    // and callers are inside it.
    unsafe { p.as_ref() }
}

/// Drops the records of an abandoned frame: no exit handler, a miss for each live fprobe.
unsafe fn discard_frame(ts: *mut ThreadState, f: &Frame) {
    let mut w = f.arena_start;
    while w < f.arena_end {
        // SAFETY: records between arena_start and arena_end were written by on_entry.
        let (hdr, words) = unsafe { ((*ts).arena[w], (*ts).arena[w + 1] as usize) };
        // SAFETY: inside the dispatcher.
        if let Some(p) = unsafe { probe_of_record(hdr) } {
            p.miss();
            if p.nr_maxactive > 0 {
                p.active.fetch_sub(1, Ordering::Relaxed);
            }
        }
        w += 2 + words;
    }
}

/// Pops frames left behind by calls that never returned normally.
#[inline(always)]
unsafe fn pop_stale(ts: *mut ThreadState, sp: usize, inclusive: bool) {
    // SAFETY: own thread state; depth <= MAX_FRAMES.
    unsafe {
        while (*ts).depth > 0 {
            let f = &(*ts).frames[(*ts).depth - 1];
            if f.sp < sp || (inclusive && f.sp == sp) {
                discard_frame(ts, f);
                (*ts).depth -= 1;
                (*ts).arena_top = f.arena_start;
            } else {
                break;
            }
        }
    }
}

/// The real return address behind a return slot at `sp` that holds the trampoline: that of
/// the outermost of the frames below `depth` hooked at `sp` (a chain of tail calls shares
/// one slot).
///
/// # Safety
/// Own thread state; `depth` at most its depth.
unsafe fn real_return_of(ts: *mut ThreadState, sp: usize, depth: usize) -> usize {
    let tramp = arch::return_trampoline();
    // SAFETY: own thread state; depth <= MAX_FRAMES.
    unsafe {
        let mut ret = tramp;
        for f in (&(*ts).frames)[..depth].iter().rev() {
            if f.sp != sp || ret != tramp {
                break;
            }
            ret = f.ret;
        }
        ret
    }
}

/// Called by the entry trampoline with the site pointer and the saved registers; true when
/// it hooked the return. Defined here rather than beside the trampoline so that the whole hit
/// path and the thread-local it reads are in one codegen unit: split, the thread-local's
/// accessor was left as an out-of-line call on every hit.
pub(crate) extern "C" fn entry_shim(site: *const Site, regs: *mut PtRegs) -> bool {
    // SAFETY: the trampoline passes the live Site of the stub it came from (sites are never
    // freed) and a PtRegs frame on its own stack, exclusively ours for this call.
    unsafe { on_entry(&*site, &mut *regs) }
}

/// Called by the return trampoline; rewrites the return slot and `regs.ip` to the real caller.
pub(crate) extern "C" fn exit_shim(regs: *mut PtRegs) {
    // SAFETY: PtRegs frame on the trampoline's stack.
    unsafe { on_exit(&mut *regs) }
}

/// Entry of a probed function. Called by the arch entry trampoline. True when this call's
/// return was hooked (its slot now holds the return trampoline).
///
/// The common case — a thread with a quiescence slot, not inside a handler, one fprobe with
/// only an entry handler, no shadow frame to look at — is spelled out here with nothing but
/// the counter kept across the handler call; everything else goes on in [`entry_listed`].
///
/// # Safety
/// `regs` is the trampoline's frame: `regs.sp` points at the caller's return address.
#[inline(always)]
pub(crate) unsafe fn on_entry(site: &Site, regs: &mut PtRegs) -> bool {
    let ts = ts();
    // SAFETY: own thread state, accessed through a raw pointer because handlers (the unwinder
    // hooks) may modify it while this function runs. The counter is one of QSLOTS (static)
    // and owned by this thread: only it writes it.
    unsafe {
        let c = (*ts).qcounter;
        if c.is_null() {
            return entry_unslotted(ts, site, regs);
        }
        // `enter` for a thread with a slot: the counter is odd while it is inside.
        let c = &*c;
        let v = c.load(Ordering::Relaxed);
        if v & 1 != 0 {
            entry_recursed(site);
            return false;
        }
        c.store(v + 1, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        let Some(list) = site.probes.load(Ordering::Acquire).as_ref() else {
            leave(ts);
            return false;
        };
        let sp = regs.sp as usize;
        let ret_ip = *(sp as *const usize);
        let d = (*ts).depth;
        // No shadow frame is stale (none lies at or below this return slot, which is what
        // `pop_stale` would look for) or shares the slot (a tail call from a hooked function
        // finds the trampoline in it).
        let plain = ret_ip != arch::return_trampoline()
            && (d == 0 || (*ts).frames.get_unchecked(d - 1).sp > sp);
        if plain {
            let p = list.only_entry;
            if !p.is_null() {
                regs.ip = site.func as u64;
                let p = &*p;
                if !p.disabled.load(Ordering::Relaxed) {
                    // `only_entry` is set only for an fprobe with an entry handler.
                    let h = p.entry.as_deref().unwrap_unchecked();
                    guarded(
                        || h(p, site.func, ret_ip, regs, &mut []),
                        EntryAction::Continue,
                    );
                }
                // `leave`. No handler changes this thread's counter (every probe hit inside
                // one finds it odd and leaves it alone), so it still holds `v + 1`.
                compiler_fence(Ordering::SeqCst);
                c.store(v + 2, Ordering::Release);
                return false;
            }
            let p = list.only_exit;
            if !p.is_null() {
                regs.ip = site.func as u64;
                let hooked = entry_one_with_exit(ts, site, list, regs, sp, ret_ip);
                leave(ts);
                return hooked;
            }
        }
        entry_listed(ts, site, list, regs, plain)
    }
}

/// [`on_entry`] for a thread without a quiescence slot (its first hit, or no slot left).
///
/// # Safety
/// As `on_entry`.
#[cold]
#[inline(never)]
unsafe fn entry_unslotted(ts: *mut ThreadState, site: &Site, regs: &mut PtRegs) -> bool {
    // SAFETY: own thread state; see on_entry.
    unsafe {
        if !enter(ts) {
            entry_recursed(site);
            return false;
        }
        let Some(list) = site.probes.load(Ordering::Acquire).as_ref() else {
            leave(ts);
            return false;
        };
        let sp = regs.sp as usize;
        let ret_ip = *(sp as *const usize);
        let d = (*ts).depth;
        let plain = ret_ip != arch::return_trampoline()
            && (d == 0 || (*ts).frames.get_unchecked(d - 1).sp > sp);
        entry_listed(ts, site, list, regs, plain)
    }
}

/// The rest of [`on_entry`], inside the dispatcher: every list but one lone entry-only
/// fprobe, or a shadow stack that needs a look (`plain` false). Leaves the dispatcher.
///
/// # Safety
/// Called by `on_entry` only, inside the dispatcher (busy, counter odd), with the site's
/// current list.
#[inline(never)]
unsafe fn entry_listed(
    ts: *mut ThreadState,
    site: &Site,
    list: &ProbeList,
    regs: &mut PtRegs,
    plain: bool,
) -> bool {
    // SAFETY: own thread state (see on_entry); probes of a published list stay allocated.
    unsafe {
        regs.ip = site.func as u64;
        let sp = regs.sp as usize;
        let ret_ip = *(sp as *const usize);
        let hooked = if plain && !list.has_exit {
            if let [p] = &*list.probes {
                call_entry_only(&**p, site.func, ret_ip, regs);
            } else {
                entry_only_many(list, site.func, ret_ip, regs);
            }
            false
        } else if plain && !list.only_exit.is_null() {
            entry_one_with_exit(ts, site, list, regs, sp, ret_ip)
        } else {
            entry_general(ts, site, list, regs, sp, ret_ip)
        };
        leave(ts);
        hooked
    }
}

/// Runs a handler; a panic in it stops there (it must not unwind into the trampoline), and
/// the call counts as having returned `default`.
#[inline(always)]
fn guarded<R>(handler: impl FnOnce() -> R, default: R) -> R {
    match std::panic::catch_unwind(AssertUnwindSafe(handler)) {
        Ok(r) => r,
        Err(payload) => {
            drop_panic(payload);
            default
        }
    }
}

/// Frees a handler's panic payload out of line: dropped inline, the payload's two words
/// took two callee-saved registers, saved and restored on every hit.
#[cold]
#[inline(never)]
fn drop_panic(payload: Box<dyn std::any::Any + Send>) {
    drop(payload);
}

/// Runs the entry handler of an fprobe without exit handler (its action has nothing to skip).
#[inline(always)]
fn call_entry_only(p: &Probe, entry_ip: usize, ret_ip: usize, regs: &PtRegs) {
    if !p.disabled.load(Ordering::Relaxed) {
        if let Some(h) = &p.entry {
            guarded(
                || h(p, entry_ip, ret_ip, regs, &mut []),
                EntryAction::Continue,
            );
        }
    }
}

/// [`on_entry`] for a site with one fprobe (`list.only_exit`: with an exit handler and no
/// `nr_maxactive`), and a shadow stack with nothing stale: what `entry_general` does for that case, with the frame written before the
/// entry handler runs (so that only the thread state and the depth live across the call) and
/// published after it.
///
/// # Safety
/// As `entry_general`; `depth` frames are all above `sp`, and the slot at `sp` holds `ret_ip`,
/// a real return address.
#[inline(never)]
unsafe fn entry_one_with_exit(
    ts: *mut ThreadState,
    site: &Site,
    list: &ProbeList,
    regs: &mut PtRegs,
    sp: usize,
    ret_ip: usize,
) -> bool {
    // SAFETY: own thread state (see on_entry); `only_exit` is set (the callers checked),
    // and probes of a published list stay allocated.
    unsafe {
        let p = &*list.only_exit;
        if p.disabled.load(Ordering::Relaxed) {
            return false;
        }
        let words = p.entry_words;
        let top = (*ts).arena_top;
        let d = (*ts).depth;
        if site.no_return_hook.load(Ordering::Relaxed)
            || d >= MAX_FRAMES
            || top + 2 + words > ARENA_WORDS
        {
            return entry_general(ts, site, list, regs, sp, ret_ip);
        }
        let end = top + 2 + words;
        // (Unchecked: `d` and `end` were just bounded.)
        *(*ts).arena.get_unchecked_mut(top) = p.record_hdr;
        *(*ts).arena.get_unchecked_mut(top + 1) = words as u64;
        (*ts).arena_top = end;
        // Not yet published: `depth` still excludes it and the slot keeps the real address,
        // so a stack walk the handler starts sees the true stack.
        *(*ts).frames.get_unchecked_mut(d) = Frame {
            ret: ret_ip,
            sp,
            entry_ip: site.func,
            arena_start: top,
            arena_end: end,
        };
        let action = match &p.entry {
            Some(h) => {
                let data = std::slice::from_raw_parts_mut(
                    (*ts).arena.as_mut_ptr().add(top + 2).cast::<u8>(),
                    p.entry_data_size,
                );
                guarded(
                    || h(p, site.func, ret_ip, regs, data),
                    EntryAction::Continue,
                )
            }
            None => EntryAction::Continue,
        };
        let f = (*ts).frames.get_unchecked(d);
        if action == EntryAction::SkipExit {
            (*ts).arena_top = f.arena_start;
            return false;
        }
        // A handler that detached this thread's frames (the unwinder hooks) emptied the
        // arena: then there is nothing left to hook, as in `entry_general`.
        if (*ts).arena_top != f.arena_end || (*ts).depth != d {
            return false;
        }
        (*ts).depth = d + 1;
        *(f.sp as *mut usize) = arch::return_trampoline();
        true
    }
}

/// The entry handlers of a list of several fprobes none of which has an exit handler.
#[inline(never)]
fn entry_only_many(list: &ProbeList, entry_ip: usize, ret_ip: usize, regs: &PtRegs) {
    for &p in list.probes.iter() {
        // SAFETY: probes of a published list stay allocated while we are inside.
        call_entry_only(unsafe { &*p }, entry_ip, ret_ip, regs);
    }
}

/// A probe hit while this thread already runs a handler: no handler runs, every fprobe of the
/// site counts a miss. The list is protected by the odd counter of the outer hit.
#[cold]
#[inline(never)]
fn entry_recursed(site: &Site) {
    // SAFETY: inside the dispatcher (busy), so the list outlives this call.
    if let Some(list) = unsafe { site.probes.load(Ordering::Acquire).as_ref() } {
        for &p in list.probes.iter() {
            // SAFETY: probes of a published list stay allocated while we are inside.
            unsafe { (*p).miss() };
        }
    }
}

/// [`on_entry`] for a site whose fprobes hook the return, or whose shadow stack needs
/// attention; `regs.ip` is set, `ret_ip` is the value in the return slot at `sp`.
///
/// # Safety
/// Called by `on_entry` only, inside the dispatcher (busy, counter odd).
#[inline(never)]
unsafe fn entry_general(
    ts: *mut ThreadState,
    site: &Site,
    list: &ProbeList,
    regs: &mut PtRegs,
    sp: usize,
    ret_ip: usize,
) -> bool {
    // SAFETY: own thread state (see on_entry); probes of a published list stay allocated.
    unsafe {
        let mut hooked = false;
        let tramp = arch::return_trampoline();
        // A frame at this very slot was left for good (longjmp) when a new call wrote a
        // real return address over its hook. If the slot still holds the trampoline, we
        // were tail-called by the function hooked there: its frame is live and returns
        // through ours.
        pop_stale(ts, sp, ret_ip != tramp);
        let caller_ip = if ret_ip == tramp {
            real_return_of(ts, sp, (*ts).depth)
        } else {
            ret_ip
        };
        let hook = list.has_exit && !site.no_return_hook.load(Ordering::Relaxed);
        let mut first_rec: Option<usize> = None;
        for &p in list.probes.iter() {
            let p = &*p;
            if p.disabled.load(Ordering::Relaxed) {
                continue;
            }
            let mut rec = None;
            if p.exit.is_some() {
                let words = p.entry_words;
                let top = (*ts).arena_top;
                let over_max = p.nr_maxactive > 0
                    && p.active.fetch_add(1, Ordering::Relaxed) >= p.nr_maxactive;
                if over_max {
                    p.active.fetch_sub(1, Ordering::Relaxed);
                }
                if hook && !over_max && (*ts).depth < MAX_FRAMES && top + 2 + words <= ARENA_WORDS {
                    (*ts).arena[top] = p.record_hdr;
                    (*ts).arena[top + 1] = words as u64;
                    (*ts).arena_top = top + 2 + words;
                    first_rec.get_or_insert(top);
                    rec = Some(top);
                } else {
                    if p.nr_maxactive > 0 && !over_max {
                        p.active.fetch_sub(1, Ordering::Relaxed);
                    }
                    p.miss();
                }
            }
            let data: &mut [u8] = match rec {
                Some(top) => std::slice::from_raw_parts_mut(
                    (*ts).arena.as_mut_ptr().add(top + 2).cast::<u8>(),
                    p.entry_data_size,
                ),
                None => &mut [],
            };
            let action = match &p.entry {
                Some(h) => guarded(
                    || h(p, site.func, caller_ip, regs, data),
                    EntryAction::Continue,
                ),
                None => EntryAction::Continue,
            };
            if action == EntryAction::SkipExit {
                if let Some(top) = rec {
                    (*ts).arena_top = top;
                    if first_rec == Some(top) {
                        first_rec = None;
                    }
                    if p.nr_maxactive > 0 {
                        p.active.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if let Some(start) = first_rec {
            if (*ts).arena_top > start {
                let d = (*ts).depth;
                (*ts).frames[d] = Frame {
                    ret: ret_ip,
                    sp,
                    entry_ip: site.func,
                    arena_start: start,
                    arena_end: (*ts).arena_top,
                };
                (*ts).depth = d + 1;
                *(sp as *mut usize) = tramp;
                hooked = true;
            }
        }
        hooked
    }
}

#[cold]
fn fatal(msg: &str) -> ! {
    // SAFETY: write(2) on stderr with a valid buffer.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::abort()
    }
}

/// Return of a hooked call. Called by the arch return trampoline; `regs.sp` is the slot that
/// held the hooked return address.
///
/// # Safety
/// Only the return trampoline calls this.
#[inline(always)]
pub(crate) unsafe fn on_exit(regs: &mut PtRegs) {
    let ts = ts();
    let slot = regs.sp as usize;
    // SAFETY: own thread state; see on_entry. Records lie inside the arena, frames below
    // `depth` inside `frames`.
    unsafe {
        let c = (*ts).qcounter;
        if c.is_null() {
            // No quiescence slot (yet): everything in general, nothing to keep the fast
            // path's registers for.
            let entered = enter(ts);
            return exit_general(ts, regs, entered);
        }
        // `enter` for a thread with a slot: the counter is odd while it is inside.
        let c = &*c;
        let v = c.load(Ordering::Relaxed);
        if v & 1 != 0 {
            return exit_general(ts, regs, false);
        }
        c.store(v + 1, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        let d = (*ts).depth;
        // The common case: the top frame is this slot's (nothing stale to pop), it returns to
        // a real caller (not into an outer hook, as a tail call does) and holds one record.
        if d > 0 {
            let f = (*ts).frames.get_unchecked(d - 1);
            let (f_ret, f_start) = (f.ret, f.arena_start);
            if f.sp == slot
                && f_ret != arch::return_trampoline()
                && f_start + 2 + *(*ts).arena.get_unchecked(f_start + 1) as usize == f.arena_end
            {
                *(slot as *mut usize) = f_ret;
                regs.ip = f_ret as u64;
                exit_one(ts, f_start, f.entry_ip, f_ret, regs);
                // Read again rather than kept across the call: no handler can change the
                // shadow stack (every probe hit inside one finds the thread busy), and so
                // only the thread state has to survive the call.
                let d = (*ts).depth;
                (*ts).arena_top = (*ts).frames.get_unchecked(d - 1).arena_start;
                (*ts).depth = d - 1;
                leave(ts);
                if (*ts).rescan_pending {
                    rescan_now(ts);
                }
                return;
            }
        }
        exit_general(ts, regs, true);
    }
}

/// Runs the exit handler of the record at `w` (if its fprobe is still there and enabled).
///
/// # Safety
/// Inside the dispatcher, not busy before it; `w` indexes a record written by `on_entry`.
#[inline(always)]
unsafe fn exit_one(
    ts: *mut ThreadState,
    w: usize,
    entry_ip: usize,
    caller_ip: usize,
    regs: &PtRegs,
) {
    // SAFETY: as the function's contract says.
    unsafe {
        if let Some(p) = probe_of_record(*(*ts).arena.get_unchecked(w)) {
            if !p.disabled.load(Ordering::Relaxed) {
                if let Some(h) = &p.exit {
                    let data = std::slice::from_raw_parts_mut(
                        (*ts).arena.as_mut_ptr().add(w + 2).cast::<u8>(),
                        p.entry_data_size,
                    );
                    guarded(|| h(p, entry_ip, caller_ip, regs, data), ());
                }
            }
            if p.nr_maxactive > 0 {
                p.active.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// Rescans the filters a dlopen asked for, once the dispatcher is left.
#[cold]
#[inline(never)]
fn rescan_now(ts: *mut ThreadState) {
    // SAFETY: own thread state.
    unsafe { (*ts).rescan_pending = false };
    // Outside the dispatcher: an ordinary call made on the way back to the caller.
    crate::fprobe::rescan_filters();
}

/// [`on_exit`] in general: stale frames, tail calls, several records, or a return while a
/// handler runs (whose exit handlers are skipped and count misses).
///
/// # Safety
/// As `on_exit`, which has called `enter` already (`entered` is what it returned).
#[inline(never)]
unsafe fn exit_general(ts: *mut ThreadState, regs: &mut PtRegs, entered: bool) {
    let slot = regs.sp as usize;
    // SAFETY: own thread state; see on_entry.
    unsafe {
        let was_busy = !entered;
        pop_stale(ts, slot, false);
        let d = (*ts).depth;
        if d == 0 || (*ts).frames[d - 1].sp != slot {
            fatal(
                "ustrace-fprobe: a hooked return has no shadow frame (stack switched?); aborting\n",
            );
        }
        let f = &(*ts).frames[d - 1];
        let (f_ret, f_entry_ip, f_start, f_end) = (f.ret, f.entry_ip, f.arena_start, f.arena_end);
        // A tail-called function's frame returns into its caller's hook (f_ret is the
        // trampoline again); handlers are told where the call chain really returns to.
        let caller_ip = if f_ret == arch::return_trampoline() {
            real_return_of(ts, slot, d - 1)
        } else {
            f_ret
        };
        *(slot as *mut usize) = f_ret;
        regs.ip = caller_ip as u64;
        let mut w = f_start;
        while w < f_end {
            let (hdr, words) = ((*ts).arena[w], (*ts).arena[w + 1] as usize);
            if let Some(p) = probe_of_record(hdr) {
                if was_busy {
                    p.miss();
                } else if !p.disabled.load(Ordering::Relaxed) {
                    if let Some(h) = &p.exit {
                        let data = std::slice::from_raw_parts_mut(
                            (*ts).arena.as_mut_ptr().add(w + 2).cast::<u8>(),
                            p.entry_data_size,
                        );
                        guarded(|| h(p, f_entry_ip, caller_ip, regs, data), ());
                    }
                }
                if p.nr_maxactive > 0 {
                    p.active.fetch_sub(1, Ordering::Relaxed);
                }
            }
            w += 2 + words;
        }
        (*ts).depth = d - 1;
        (*ts).arena_top = f_start;
        if !was_busy {
            leave(ts);
            if (*ts).rescan_pending {
                rescan_now(ts);
            }
        }
    }
}

/// Asks for [`crate::rescan_filters`] when the current exit dispatch is done.
pub(crate) fn request_rescan() {
    // SAFETY: own thread state.
    unsafe { (*ts()).rescan_pending = true };
}

/// Puts the real return address back into every hooked frame of the calling thread and forgets
/// those frames (their exit handlers will not run; each counts a miss). Called from inside the
/// dispatcher by the unwinder hooks, so the unwinder sees the true stack.
pub(crate) fn detach_thread_frames() -> usize {
    let ts = ts();
    let tramp = arch::return_trampoline();
    // SAFETY: own thread state; we are inside the dispatcher (busy), frames are consistent.
    unsafe {
        let n = (*ts).depth;
        for i in (0..n).rev() {
            let f = &(*ts).frames[i];
            let slot = f.sp as *mut usize;
            if *slot == tramp {
                *slot = f.ret;
            }
            discard_frame(ts, f);
        }
        (*ts).depth = 0;
        (*ts).arena_top = 0;
        n
    }
}

/// Number of hooked calls outstanding on the calling thread.
pub fn outstanding_frames() -> usize {
    // SAFETY: reading a field of this thread's own state.
    unsafe { (*ts()).depth }
}

/// Puts the real return address back into every live hooked frame of the calling thread for
/// the length of a stack walk, keeping the frames: their exits still run once
/// [`hide_real_returns`] has hooked them again. `token` records which slots changed
/// (bits 0..MAX_FRAMES), the depth, and whether this call entered the dispatcher — while the
/// thread is inside it, probes hit by the walk itself count as missed (the unwinder hook that
/// would detach every frame among them).
///
/// Frames below the walker's stack pointer are stale (left by `longjmp`) and not touched; a
/// slot is rewritten only while it holds the trampoline, as `detach_thread_frames` does.
pub(crate) fn show_real_returns(token: &mut [u64; 6]) {
    const _: () = assert!(MAX_FRAMES <= 4 * 64);
    let ts = ts();
    let tramp = arch::return_trampoline();
    let here = token.as_ptr() as usize;
    // SAFETY: own thread state. Live frames' slots are return slots of frames above the
    // walker's, which cannot return before the walk does.
    unsafe {
        if enter(ts) {
            token[5] = 1;
        }
        let depth = (*ts).depth;
        token[4] = depth as u64;
        for i in (0..depth).rev() {
            let f = &(*ts).frames[i];
            if f.sp <= here {
                continue;
            }
            let slot = f.sp as *mut usize;
            if *slot == tramp {
                *slot = f.ret;
                token[i / 64] |= 1 << (i % 64);
            }
        }
    }
}

/// Hooks again the slots [`show_real_returns`] gave back, outermost first so that a chain of
/// tail calls sharing one slot ends with the trampoline in it.
pub(crate) fn hide_real_returns(token: &[u64; 6]) {
    let ts = ts();
    let tramp = arch::return_trampoline();
    // SAFETY: own thread state; the frames recorded in the token are still live (the walk
    // returned to a frame below all of them).
    unsafe {
        let depth = (token[4] as usize).min((*ts).depth);
        for i in 0..depth {
            if token[i / 64] & (1 << (i % 64)) != 0 {
                *((*ts).frames[i].sp as *mut usize) = tramp;
            }
        }
        if token[5] == 1 {
            leave(ts);
        }
    }
}
