//! Read-copy-update for the hot path: a reader pays one load and two stores to a word of its
//! own thread-local storage, and reads no shared word at all; writers wait.
//!
//! Everything a traced thread looks at while recording an event — the probe array of a
//! tracepoint, an event's filter program, its triggers — is published through a pointer and
//! read inside a *read-side section*. A writer that replaces such a pointer keeps the old
//! value alive until [`synchronize`] returns: by then no thread can still be inside a section
//! that began before the replacement, so the old value can be freed.
//!
//! This is user-space RCU in the "membarrier" flavour (the scheme of liburcu's `urcu-memb`),
//! with a per-thread word in place of a global grace-period number:
//!
//! ```text
//!  reader (thread T, its thread-local word w)    writer (cold path)
//!  ──────────────────────────────────────────    ──────────────────
//!  c = w   (IN clear: not in a section)          publish new pointer
//!  w = IN           ─┐                           membarrier()  ── every running thread
//!  compiler fence    │ section                                   executes a full fence
//!  p = load(pointer) │                           for each registered thread T:
//!  ... use *p ...    │                             s = T's w
//!  w = c + 4        ─┘ (release)                   if IN is set in s: w = s | MARK if
//!                                                    w is still s, then wait until w
//!                                                    is no longer s | MARK
//!                                                membarrier()
//! ```
//!
//! # Why a writer that returns has waited for every section that could see the old value
//!
//! *The word.* Bit 0 (`IN`) of a thread's word is set exactly while the thread is inside its
//! outermost section. Outside sections the word is a count of the sections the thread has
//! finished (plus the mode bit `SLOW`, bit 1, see below). Only the outermost section stores
//! into the word, twice: on entry the constant `IN` (not the count plus `IN`: a store whose
//! data waits for the load of the word the previous section's end has just stored cost about
//! 0.7 ns per event), on exit the next count, which the guard kept. A section that finds `IN`
//! set is nested and stores nothing. So while an outermost section S runs, nothing but a
//! writer changes the word.
//!
//! *Marks.* All sections of a fast thread store the same `IN`, so a writer could not tell the
//! section it found from the next one; it marks the one it found instead: if the word still
//! holds the value s it saw, it sets `MARK` (bit 63) with a compare-and-swap. The next store
//! the thread makes is S's end (an even count), or comes after S has ended; no later entry
//! stores `s | MARK`. So once the word has held `s | MARK`, *any other value means the marked
//! section has ended*; and if the compare-and-swap fails, the word changed since s, so S has
//! ended already. (If S ended and the next section began between the writer's read and its
//! swap, the writer marks and waits for that one: longer, never shorter.) A word that
//! already carries a mark (an earlier writer's) is waited on as it is. The writer waits for at most one section per thread, never for sections that
//! began after its scan: no reader loads a shared grace-period number, and a thread that
//! enters sections back to back cannot starve a writer.
//!
//! *Signal handlers.* A handler can run whole sections between an entry's load of the word
//! and its store; the interrupted entry then stores `IN` and later its stale count, which may
//! repeat a count the handler's sections stored. That is harmless: handlers nest last-in
//! first-out, so the stale store comes only after every section the handler began has ended;
//! it begins a new outermost section; and counts only ever tell a writer "not in a section".
//!
//! *The fence.* Readers issue no hardware fence; the writer's
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every CPU running a thread of this
//! process execute a full fence (a thread not running has passed through the scheduler, which
//! fences). Take a section S of thread T and the point F where that fence lands in T's
//! instruction stream. If S's entry store comes before F, it is visible to the writer's scan,
//! which runs after `membarrier` returns: the writer sees S's value with `IN` (or, if S has
//! ended, a later one) and waits until S ends. If S's entry store comes after F, so do S's
//! pointer loads (they follow the store in program order, and the compiler fence keeps the
//! compiler from hoisting them); the pointer was published before
//! `membarrier` was called, so they see the new value and S never sees the old one. Either
//! way nothing S can see is freed while S runs. The reader's exit store is a release store
//! and the writer's loads acquire, so S's uses of the old value happen before the writer
//! frees it; the trailing `membarrier` orders them once more for weaker hardware.
//!
//! *Fence mode.* Where membarrier is not available (old kernels, seccomp), each thread is
//! registered with `SLOW` set in its word: its sections take the out-of-line entry, which
//! stores the count with `IN`, follows the store with a real `SeqCst` fence, and the writer's
//! `membarrier` becomes a `SeqCst` fence too; the two fences order "store word, load pointer"
//! against "store pointer, load word" (either the reader sees the new pointer or the writer
//! sees the word).
//! Whether membarrier works is settled before any thread registers and never changes: its
//! registration is inherited by forked children and ends only with `exec`. So the hot path
//! tests one thread-local word for both "nested" and "must fence": `word & (IN | SLOW) == 0`.
//!
//! # Registration, and reading another thread's thread-local word soundly
//!
//! A thread registers on its first section: it claims a `Node` of the registry (a list of
//! nodes that are never freed, reused by later threads) and stores the address of its word
//! there. The writer reads a word only through its node, under a handshake with the owning
//! thread's exit: the writer sets the node's `scanning` flag, then loads the word's address
//! (both sequentially consistent); the exiting thread clears the address, then waits until
//! `scanning` is clear. Either the writer finds the address cleared, or the thread waits for
//! the writer's read to end. So no writer reads the thread-local storage of a thread that has
//! gone. A node claimed by a new thread (perhaps with a word at the same address) is at worst
//! waited for once more than needed: the writer's rule only ever errs towards waiting.
//!
//! A thread that registers while a writer scans is either seen by the scan (the registry is
//! read after `membarrier`, and nodes are only ever added) or registered after the fence
//! point, so that its sections see the new pointer.
//!
//! # Threads that exit
//!
//! A thread-local destructor unregisters the thread. Other destructors (of other thread-local
//! values, of pthread keys) may still trace afterwards, in a thread whose word nobody scans
//! any more: from then on its sections are *late*. A late section counts itself in a global
//! counter (an atomic read-modify-write, then a `SeqCst` fence) and uncounts on exit (a release
//! read-modify-write); the writer, after a `SeqCst` fence of its own, waits until the counter
//! reads 0. The two fences order the late reader's "count, load pointer" against the writer's
//! "publish, load counter". Late sections occur only while threads exit, so a writer waits
//! for them only then. A thread whose first section comes after its destructors have run (it
//! can no longer arm one) is late from the start.
//!
//! # Forked children
//!
//! In a child only the forking thread exists. A `pthread_atfork` handler frees every node
//! but the forking thread's own (which keeps its state: a child forked from inside a section
//! is still in it), sets the late counter to the forking thread's own late sections, and
//! releases the writers' lock, which a thread that does not exist in the child may have held.
//!
//! # Limits
//!
//! A thread's first section registers it: it may allocate a node and arms a thread-local
//! destructor (both allocate), so that one section is not async-signal-safe; a signal
//! handler that interrupts the registration itself takes a late section. A guard must be
//! dropped on the thread that took it (it is not `Send`); a guard that is leaked, or a thread
//! that exits inside a section (`exit` called from one), keeps every later [`synchronize`]
//! waiting: the section never ends, and the exiting thread leaves writers a word that says so.
//! A word's count wraps (after 2^62 sections); counts only say "not in a section", so that
//! is harmless.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::Once;

/// Bit of a thread's word: the thread is inside its outermost section.
const IN: u64 = 1;
/// Bit of a thread's word: its sections take the out-of-line entry (it must fence, or is not
/// registered). Never changed by a section's entry or exit.
const SLOW: u64 = 2;
/// What one outermost section adds to the word's count; keeps `IN` and `SLOW` clear.
const STEP: u64 = 4;
/// Set by a writer in the word of a section it waits for, so that the section's value differs
/// from the next section's (a fast thread's sections all store `IN`).
const MARK: u64 = 1 << 63;
/// A [`ReadGuard`]'s `restore` for a nested section: odd, so that its end stores nothing.
const NESTED: u64 = IN;
/// A [`ReadGuard`]'s `restore` for a late section (see the module doc): odd too. An outermost
/// section's is the next count, even.
const LATE: u64 = IN | SLOW;

/// How a thread's sections are entered; only the thread itself reads or writes it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Not registered yet; the word is `SLOW`.
    Unregistered,
    /// Registered, membarrier available: the inline entry.
    Fast,
    /// Registered, readers fence themselves; the word has `SLOW` set.
    Fenced,
    /// Unregistered at exit (or too late to register): every section is late.
    Late,
}

thread_local! {
    /// The thread's section word (see the module doc). No destructor, so every access is a
    /// plain thread-local load or store, also while the thread's destructors run.
    static WORD: AtomicU64 = const { AtomicU64::new(SLOW) };
    static MODE: Cell<Mode> = const { Cell::new(Mode::Unregistered) };
    /// The node the thread registered its word in.
    static NODE: Cell<Option<&'static Node>> = const { Cell::new(None) };
    /// How many late sections the thread is inside.
    static LATE_DEPTH: Cell<u64> = const { Cell::new(0) };
    /// Set while the thread registers: a signal handler's section then is late.
    static REGISTERING: Cell<bool> = const { Cell::new(false) };
    /// Its destructor unregisters the thread.
    static RELEASE: Release = const { Release };
}

/// One entry of the registry: the address of a registered thread's word.
struct Node {
    /// The owner's word; null while the node is free.
    word: AtomicPtr<AtomicU64>,
    /// Set by the writer while it reads through `word`; the owner waits for it before its
    /// thread-local storage can go away.
    scanning: AtomicBool,
    /// The next node; set before the node is published and never changed.
    next: *const Node,
}

// SAFETY: `next` is immutable after the node is published, and nodes are never freed.
unsafe impl Sync for Node {}

/// The registry: a list of nodes, pushed at the front, never shortened.
static NODES: AtomicPtr<Node> = AtomicPtr::new(std::ptr::null_mut());
/// Late sections in progress in all threads.
static LATE_READERS: AtomicU64 = AtomicU64::new(0);
/// Whether `membarrier(PRIVATE_EXPEDITED)` is registered; otherwise readers fence themselves.
static MEMBARRIER: AtomicBool = AtomicBool::new(false);
static INIT: Once = Once::new();
/// Serializes writers, so that grace periods do not interleave. A flag rather than a mutex,
/// so that a forked child can release it for a writer thread that did not follow it.
static WRITERS: AtomicBool = AtomicBool::new(false);

fn init() {
    INIT.call_once(|| {
        // SAFETY: membarrier takes plain integer arguments and touches no memory of ours.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
                0,
            )
        };
        MEMBARRIER.store(rc == 0, Ordering::SeqCst);
        // SAFETY: the handler is a plain function that only touches atomics and this
        // thread's thread-locals.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
        }
    });
}

/// In a child after fork only the forking thread exists (see the module doc).
extern "C" fn after_fork_in_child() {
    let me = NODE.with(Cell::get);
    let mut node = NODES.load(Ordering::Acquire) as *const Node;
    // SAFETY: nodes are never freed.
    while let Some(n) = unsafe { node.as_ref() } {
        if !me.is_some_and(|m| std::ptr::eq(m, n)) {
            n.word.store(std::ptr::null_mut(), Ordering::Relaxed);
        }
        n.scanning.store(false, Ordering::Relaxed);
        node = n.next;
    }
    LATE_READERS.store(LATE_DEPTH.with(Cell::get), Ordering::SeqCst);
    WRITERS.store(false, Ordering::SeqCst);
}

/// Registers the calling thread; afterwards its mode is no longer `Unregistered`.
#[cold]
#[inline(never)]
fn register_thread() {
    init();
    // Checked again: a signal handler may have registered the thread since the caller looked.
    if MODE.with(Cell::get) != Mode::Unregistered {
        return;
    }
    // Arm the destructor first: a thread that can no longer arm one (its destructors are
    // running or have run) must not leave its word in the registry.
    if RELEASE.try_with(|_| ()).is_err() {
        MODE.with(|m| m.set(Mode::Late));
        return;
    }
    let fenced = !MEMBARRIER.load(Ordering::SeqCst);
    let word = WORD.with(|w| {
        w.store(if fenced { SLOW } else { 0 }, Ordering::Release);
        w as *const AtomicU64 as *mut AtomicU64
    });
    NODE.with(|n| n.set(Some(claim_node(word))));
    MODE.with(|m| m.set(if fenced { Mode::Fenced } else { Mode::Fast }));
}

/// A free node of the registry, or a new one, now holding `word`.
fn claim_node(word: *mut AtomicU64) -> &'static Node {
    let mut node = NODES.load(Ordering::Acquire) as *const Node;
    // SAFETY: nodes are never freed.
    while let Some(n) = unsafe { node.as_ref() } {
        if n.word
            .compare_exchange(
                std::ptr::null_mut(),
                word,
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            return n;
        }
        node = n.next;
    }
    let fresh = Box::into_raw(Box::new(Node {
        word: AtomicPtr::new(word),
        scanning: AtomicBool::new(false),
        next: std::ptr::null(),
    }));
    let mut head = NODES.load(Ordering::Relaxed);
    loop {
        // SAFETY: `fresh` is ours alone until the exchange below publishes it.
        unsafe { (*fresh).next = head };
        match NODES.compare_exchange_weak(head, fresh, Ordering::SeqCst, Ordering::Relaxed) {
            // SAFETY: leaked on purpose: nodes are never freed.
            Ok(_) => return unsafe { &*fresh },
            Err(now) => head = now,
        }
    }
}

/// Unregisters the thread when it exits; later sections of the thread are late.
struct Release;

/// The word a thread that exits inside a section leaves to writers: in a section for good.
static STUCK: AtomicU64 = AtomicU64::new(IN);

impl Drop for Release {
    fn drop(&mut self) {
        let Some(node) = NODE.with(Cell::get) else {
            return;
        };
        if WORD.with(|w| w.load(Ordering::Relaxed)) & IN != 0 {
            // The thread exits inside a section (`exit` called in one, or a leaked guard): the
            // section never ends, and the thread's later sections nest in it. Writers keep
            // waiting for it, through a word that outlives the thread's storage.
            swap_word(node, &STUCK as *const AtomicU64 as *mut AtomicU64);
        } else {
            // Late first, then the word: a signal handler's section in between is either
            // still registered (fast word) or late, and writers honour both.
            MODE.with(|m| m.set(Mode::Late));
            WORD.with(|w| w.store(SLOW, Ordering::Release));
            swap_word(node, std::ptr::null_mut());
        }
        NODE.with(|n| n.set(None));
    }
}

/// Takes the thread's word out of `node` (see the module doc's handshake).
fn swap_word(node: &Node, word: *mut AtomicU64) {
    node.word.store(word, Ordering::SeqCst);
    let mut spins = 0;
    while node.scanning.load(Ordering::SeqCst) {
        back_off(&mut spins);
    }
}

/// A read-side section; the protected data may be used until it is dropped.
pub struct ReadGuard {
    /// What the section stores in the word when it ends: the next count (even) for an
    /// outermost section; [`NESTED`] or [`LATE`] (odd) for sections whose end stores nothing.
    restore: u64,
    // Not Send: the section belongs to the thread that entered it.
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Enters a read-side section. No lock, no allocation, no syscall (after a thread's first):
/// one thread-local load, a test and a thread-local store, and no shared word.
#[inline(always)]
pub fn read_lock() -> ReadGuard {
    let word = WORD.with(|w| w.load(Ordering::Relaxed));
    let restore = if word & (IN | SLOW) == 0 {
        // A constant, not `word + 1`: a store whose data waits for the load of a word the
        // previous section's end just stored costs about 0.7 ns more per event (measured).
        WORD.with(|w| w.store(IN, Ordering::Release));
        // Keeps the section's loads after the store; membarrier does the rest.
        compiler_fence(Ordering::SeqCst);
        word.wrapping_add(STEP)
    } else if word & IN != 0 {
        NESTED
    } else {
        enter_slow_keeping_registers(word)
    };
    ReadGuard {
        restore,
        _not_send: std::marker::PhantomData,
    }
}

/// The outermost entry of a fencing thread, an unregistered or an exiting one; returns the
/// guard's `restore`.
#[cold]
#[inline(never)]
fn enter_slow(word: u64) -> u64 {
    match MODE.with(Cell::get) {
        // (A fast thread's word never has `SLOW` set, so only a fencing thread gets here.)
        Mode::Fenced | Mode::Fast => {
            WORD.with(|w| w.store(word | IN, Ordering::Release));
            fence(Ordering::SeqCst);
            word.wrapping_add(STEP)
        }
        Mode::Late => enter_late(),
        Mode::Unregistered => {
            if REGISTERING.with(|r| r.replace(true)) {
                // A signal handler that interrupted the thread's registration.
                return enter_late();
            }
            register_thread();
            REGISTERING.with(|r| r.set(false));
            let guard = read_lock();
            let restore = guard.restore;
            std::mem::forget(guard);
            restore
        }
    }
}

/// Calls [`enter_slow`] so that the caller's general registers survive it: the call site
/// (inlined at every tracepoint) then keeps the tracepoint's arguments in the registers they
/// came in, where a plain call would make it save them in callee-saved registers, pushed and
/// popped on every event (the one-probe call could no longer pass them straight on).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn enter_slow_keeping_registers(word: u64) -> u64 {
    let restore: u64;
    macro_rules! call_thunk {
        ($($vector:tt)*) => {
            // SAFETY: the thunk below preserves every general register but `rdi` and `rax`
            // (and the flags, declared clobbered by default); vector and x87 registers, which
            // `enter_slow` may use, are declared clobbered. It is called with the stack
            // aligned as for any call (no `nostack`), and only reads `word`.
            unsafe {
                std::arch::asm!(
                    "call {thunk}",
                    thunk = sym __ustrace_rcu_enter_slow,
                    inout("rdi") word => _,
                    lateout("rax") restore,
                    $(out($vector) _,)*
                    out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
                    out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
                    out("mm0") _, out("mm1") _, out("mm2") _, out("mm3") _,
                    out("mm4") _, out("mm5") _, out("mm6") _, out("mm7") _,
                )
            }
        };
    }
    #[cfg(not(target_feature = "avx"))]
    call_thunk!(
        "xmm0" "xmm1" "xmm2" "xmm3" "xmm4" "xmm5" "xmm6" "xmm7"
        "xmm8" "xmm9" "xmm10" "xmm11" "xmm12" "xmm13" "xmm14" "xmm15"
    );
    #[cfg(all(target_feature = "avx", not(target_feature = "avx512f")))]
    call_thunk!(
        "ymm0" "ymm1" "ymm2" "ymm3" "ymm4" "ymm5" "ymm6" "ymm7"
        "ymm8" "ymm9" "ymm10" "ymm11" "ymm12" "ymm13" "ymm14" "ymm15"
    );
    #[cfg(target_feature = "avx512f")]
    call_thunk!(
        "zmm0" "zmm1" "zmm2" "zmm3" "zmm4" "zmm5" "zmm6" "zmm7"
        "zmm8" "zmm9" "zmm10" "zmm11" "zmm12" "zmm13" "zmm14" "zmm15"
        "zmm16" "zmm17" "zmm18" "zmm19" "zmm20" "zmm21" "zmm22" "zmm23"
        "zmm24" "zmm25" "zmm26" "zmm27" "zmm28" "zmm29" "zmm30" "zmm31"
        "k1" "k2" "k3" "k4" "k5" "k6" "k7"
    );
    restore
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn enter_slow_keeping_registers(word: u64) -> u64 {
    enter_slow(word)
}

/// [`enter_slow`] for the thunk, in the C calling convention.
#[cfg(target_arch = "x86_64")]
extern "C" fn enter_slow_for_thunk(word: u64) -> u64 {
    enter_slow(word)
}

#[cfg(target_arch = "x86_64")]
extern "C" {
    /// `word` in `rdi`, `restore` back in `rax`; every other general register preserved.
    fn __ustrace_rcu_enter_slow();
}

// Saves the caller-saved general registers other than rdi and rax around a C call of
// `enter_slow_for_thunk`. Entered with rsp = 8 (mod 16), as after any call; seven pushes
// leave it 16-byte aligned for the inner call.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.__ustrace_rcu_enter_slow,\"ax\",@progbits",
    ".balign 16",
    ".globl __ustrace_rcu_enter_slow",
    ".hidden __ustrace_rcu_enter_slow",
    ".type __ustrace_rcu_enter_slow,@function",
    "__ustrace_rcu_enter_slow:",
    ".cfi_startproc",
    "push rsi",
    ".cfi_adjust_cfa_offset 8",
    "push rdx",
    ".cfi_adjust_cfa_offset 8",
    "push rcx",
    ".cfi_adjust_cfa_offset 8",
    "push r8",
    ".cfi_adjust_cfa_offset 8",
    "push r9",
    ".cfi_adjust_cfa_offset 8",
    "push r10",
    ".cfi_adjust_cfa_offset 8",
    "push r11",
    ".cfi_adjust_cfa_offset 8",
    "call {slow}",
    "pop r11",
    ".cfi_adjust_cfa_offset -8",
    "pop r10",
    ".cfi_adjust_cfa_offset -8",
    "pop r9",
    ".cfi_adjust_cfa_offset -8",
    "pop r8",
    ".cfi_adjust_cfa_offset -8",
    "pop rcx",
    ".cfi_adjust_cfa_offset -8",
    "pop rdx",
    ".cfi_adjust_cfa_offset -8",
    "pop rsi",
    ".cfi_adjust_cfa_offset -8",
    "ret",
    ".cfi_endproc",
    ".size __ustrace_rcu_enter_slow, . - __ustrace_rcu_enter_slow",
    ".popsection",
    slow = sym enter_slow_for_thunk,
);

/// A late section: counted where every writer looks (see the module doc).
fn enter_late() -> u64 {
    LATE_DEPTH.with(|d| d.set(d.get() + 1));
    LATE_READERS.fetch_add(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    LATE
}

impl Drop for ReadGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if self.restore & IN == 0 {
            compiler_fence(Ordering::SeqCst);
            WORD.with(|w| w.store(self.restore, Ordering::Release));
        } else if self.restore == LATE {
            leave_late();
        }
    }
}

#[cold]
#[inline(never)]
fn leave_late() {
    LATE_READERS.fetch_sub(1, Ordering::Release);
    LATE_DEPTH.with(|d| d.set(d.get() - 1));
}

/// Whether the calling thread is inside a read-side section (then [`synchronize`] would wait
/// for itself).
pub fn in_read_section() -> bool {
    WORD.with(|w| w.load(Ordering::Relaxed) & IN != 0) || LATE_DEPTH.with(Cell::get) != 0
}

fn full_barrier_on_all_threads() {
    if MEMBARRIER.load(Ordering::SeqCst) {
        // SAFETY: membarrier takes plain integer arguments and touches no memory of ours.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED,
                0,
                0,
            )
        };
        // Registered membarrier cannot fail (the registration lasts until exec), and readers
        // that do not fence themselves are unprotected without it: no quiet fallback.
        assert_eq!(
            rc,
            0,
            "rcu: membarrier failed after registration: {}",
            std::io::Error::last_os_error()
        );
    }
    fence(Ordering::SeqCst);
}

fn back_off(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// A registered thread's word and its current value, read under the node's handshake with the
/// thread's exit; `None` when the node is free.
fn observe(node: &Node) -> Option<(*const AtomicU64, u64)> {
    node.scanning.store(true, Ordering::SeqCst);
    let word = node.word.load(Ordering::SeqCst);
    // SAFETY: a thread clears its node's address and then waits for `scanning` to clear
    // before its thread-local storage can go away; we set `scanning` before loading the
    // address (both sequentially consistent), so a non-null address is still live here.
    let seen = unsafe { word.as_ref() }.map(|w| (w as *const AtomicU64, w.load(Ordering::Acquire)));
    node.scanning.store(false, Ordering::Release);
    seen
}

/// Sets [`MARK`] in `word` (the word of `node`'s owner) if it still holds `seen`, under the
/// same handshake as [`observe`]; whether it did.
fn mark(node: &Node, word: *const AtomicU64, seen: u64) -> bool {
    node.scanning.store(true, Ordering::SeqCst);
    let now = node.word.load(Ordering::SeqCst);
    let marked = std::ptr::eq(now, word)
        // SAFETY: as in `observe`: the owner waits for `scanning` before its storage goes.
        && unsafe { &*now }
            .compare_exchange(seen, seen | MARK, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok();
    node.scanning.store(false, Ordering::Release);
    marked
}

/// Holds the writers' flag.
struct Writer;

impl Writer {
    fn lock() -> Writer {
        let mut spins = 0;
        while WRITERS
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            back_off(&mut spins);
        }
        Writer
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        WRITERS.store(false, Ordering::Release);
    }
}

/// Waits until every read-side section that began before this call has ended.
///
/// # Panics
/// If called from inside a read-side section of the same thread: it would wait forever.
pub fn synchronize() {
    assert!(
        !in_read_section(),
        "rcu::synchronize called inside a read-side section"
    );
    init();
    let _writer = Writer::lock();
    full_barrier_on_all_threads();
    let mut node = NODES.load(Ordering::Acquire) as *const Node;
    // SAFETY: nodes are never freed.
    while let Some(n) = unsafe { node.as_ref() } {
        if let Some((word, seen)) = observe(n) {
            // A section is running. Mark it, unless a writer before us did: from then on its
            // value is its own, and any other value means it has ended. If the word changed
            // before we could mark it, the section has ended already.
            if seen & IN != 0 && (seen & MARK != 0 || mark(n, word, seen)) {
                let mut spins = 0;
                while observe(n) == Some((word, seen | MARK)) {
                    back_off(&mut spins);
                }
            }
        }
        node = n.next;
    }
    // Orders the publication before the late counter's load (see the module doc).
    fence(Ordering::SeqCst);
    let mut spins = 0;
    while LATE_READERS.load(Ordering::Acquire) != 0 {
        back_off(&mut spins);
    }
    full_barrier_on_all_threads();
}

/// A value published for readers on the hot path and replaced by writers, RCU-style.
///
/// Readers borrow it inside a [`ReadGuard`]; [`RcuCell::replace`] publishes a new value and
/// frees the old one after a grace period, so it must not be called inside a read section.
pub struct RcuCell<T> {
    ptr: std::sync::atomic::AtomicPtr<T>,
    /// Owns a `T`: Send and Sync only as `T` is.
    _owns: std::marker::PhantomData<Box<T>>,
}

impl<T: Send + Sync> Default for RcuCell<T> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<T: Send + Sync> RcuCell<T> {
    /// A cell that holds nothing yet.
    pub const fn empty() -> Self {
        RcuCell {
            ptr: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            _owns: std::marker::PhantomData,
        }
    }

    /// The current value, valid while `guard` is held.
    #[inline(always)]
    pub fn get<'g>(&self, _guard: &'g ReadGuard) -> Option<&'g T> {
        let ptr = self.ptr.load(Ordering::Acquire);
        // SAFETY: a published value is freed only after a grace period, which cannot end
        // while `guard`'s section is open.
        unsafe { ptr.as_ref() }
    }

    /// The current value, for a caller that is inside a read-side section it holds no guard
    /// of (a tracepoint probe, which runs only inside the section of the tracepoint's call):
    /// what [`RcuCell::get`] gives, without entering a nested section.
    ///
    /// # Safety
    /// The calling thread must be inside a read-side section, and must not use the value
    /// after that section ends.
    #[inline(always)]
    pub unsafe fn get_in_section(&self) -> Option<&T> {
        debug_assert!(in_read_section());
        let ptr = self.ptr.load(Ordering::Acquire);
        // SAFETY: the caller's section keeps a published value from being freed.
        unsafe { ptr.as_ref() }
    }

    /// Publishes `value` (or nothing) and frees the previous value once no reader can see it.
    pub fn replace(&self, value: Option<T>) {
        let fresh = value.map_or(std::ptr::null_mut(), |v| Box::into_raw(Box::new(v)));
        let old = self.ptr.swap(fresh, Ordering::AcqRel);
        if !old.is_null() {
            synchronize();
            // SAFETY: unpublished before the grace period that just ended; nobody else frees it.
            drop(unsafe { Box::from_raw(old) });
        }
    }

    /// Whether a value is published.
    pub fn is_set(&self) -> bool {
        !self.ptr.load(Ordering::Acquire).is_null()
    }
}

impl<T> Drop for RcuCell<T> {
    fn drop(&mut self) {
        let ptr = *self.ptr.get_mut();
        if !ptr.is_null() {
            // SAFETY: `&mut self` means no reader holds the cell any more.
            drop(unsafe { Box::from_raw(ptr) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicPtr, AtomicUsize};
    use std::sync::Arc;

    #[test]
    fn sections_nest_and_unwind() {
        assert!(!in_read_section());
        let a = read_lock();
        let b = read_lock();
        assert!(in_read_section());
        drop(b);
        assert!(in_read_section());
        drop(a);
        assert!(!in_read_section());
        synchronize();
    }

    /// A nested section that ends leaves the outer one open: a grace period that starts
    /// after it still waits for the outer section to end.
    #[test]
    fn a_grace_period_waits_for_the_outer_section_after_a_nested_one_ends() {
        use std::sync::mpsc;
        let (entered, wait_entered) = mpsc::channel();
        let (release, wait_release) = mpsc::channel::<()>();
        let left = Arc::new(AtomicBool::new(false));
        let reader = {
            let left = left.clone();
            std::thread::spawn(move || {
                let outer = read_lock();
                drop(read_lock());
                assert!(in_read_section());
                entered.send(()).unwrap();
                wait_release.recv().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                left.store(true, Ordering::SeqCst);
                drop(outer);
            })
        };
        wait_entered.recv().unwrap();
        release.send(()).unwrap();
        synchronize();
        assert!(
            left.load(Ordering::SeqCst),
            "the grace period ended inside the section"
        );
        reader.join().unwrap();
    }

    /// A thread's first section registers it, in the mode membarrier allows: the inline
    /// entry (neither `IN` nor `SLOW` in its word outside sections) exactly when membarrier is
    /// registered. Its node holds the address of its word until it exits.
    #[test]
    fn a_thread_registers_on_its_first_section_in_the_mode_membarrier_allows() {
        std::thread::spawn(|| {
            assert_eq!(MODE.with(Cell::get), Mode::Unregistered);
            drop(read_lock());
            let fenced = !MEMBARRIER.load(Ordering::SeqCst);
            let mode = MODE.with(Cell::get);
            assert_eq!(mode, if fenced { Mode::Fenced } else { Mode::Fast });
            let word = WORD.with(|w| w.load(Ordering::SeqCst));
            assert_eq!(word & (IN | SLOW), if fenced { SLOW } else { 0 });
            let node = NODE.with(Cell::get).expect("registered");
            let mine = WORD.with(|w| w as *const AtomicU64 as *mut AtomicU64);
            assert_eq!(node.word.load(Ordering::SeqCst), mine);
            let g = read_lock();
            let inside = if fenced { word | IN } else { IN };
            assert_eq!(observe(node), Some((mine as *const AtomicU64, inside)));
            drop(g);
            assert_eq!(
                WORD.with(|w| w.load(Ordering::SeqCst)),
                word.wrapping_add(STEP)
            );
        })
        .join()
        .unwrap();
    }

    /// A word's count wraps, and the ends of sections still store it.
    #[test]
    fn counts_wrap() {
        std::thread::spawn(|| {
            drop(read_lock());
            MODE.with(|m| m.set(Mode::Fast));
            WORD.with(|w| w.store(0u64.wrapping_sub(STEP), Ordering::SeqCst));
            drop(read_lock());
            assert_eq!(WORD.with(|w| w.load(Ordering::SeqCst)), 0);
            MODE.with(|m| m.set(Mode::Fenced));
            WORD.with(|w| w.store(0u64.wrapping_sub(STEP) | SLOW, Ordering::SeqCst));
            let g = read_lock();
            assert!(in_read_section());
            drop(g);
            assert!(!in_read_section());
            assert_eq!(WORD.with(|w| w.load(Ordering::SeqCst)), SLOW);
        })
        .join()
        .unwrap();
    }

    /// The section a writer found is marked, so that the thread's next section, which stores
    /// the same value on entry, does not hold the writer up: here the reader leaves the
    /// marked section and parks in the next one, and the grace period ends meanwhile. (Other
    /// tests' writers may mark the parked section too, and they wait for it: the reader then
    /// leaves it and the round does not count.)
    #[test]
    fn a_writer_does_not_wait_for_the_section_after_the_one_it_found() {
        use std::time::{Duration, Instant};
        let marked = || WORD.with(|w| w.load(Ordering::SeqCst)) & MARK != 0;
        let mut conclusive = 0;
        for _ in 0..5 {
            let done = Arc::new(AtomicBool::new(false));
            let (entered, wait_entered) = std::sync::mpsc::channel();
            let reader = {
                let done = done.clone();
                std::thread::spawn(move || {
                    drop(read_lock());
                    let first = read_lock();
                    entered.send(()).unwrap();
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while !marked() {
                        assert!(Instant::now() < deadline, "no writer marked the section");
                        std::hint::spin_loop();
                    }
                    drop(first);
                    let second = read_lock();
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while !done.load(Ordering::SeqCst) {
                        if marked() {
                            return false;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "the writer waited for a section that began after its scan"
                        );
                        std::hint::spin_loop();
                    }
                    drop(second);
                    true
                })
            };
            wait_entered.recv().unwrap();
            let writer = {
                let done = done.clone();
                std::thread::spawn(move || {
                    synchronize();
                    done.store(true, Ordering::SeqCst);
                })
            };
            conclusive += usize::from(reader.join().unwrap());
            writer.join().unwrap();
        }
        assert!(conclusive > 0, "every round was disturbed by other writers");
    }

    /// A thread that enters sections back to back (every one stores the same value) does not
    /// keep a writer waiting: the writer marks the section it found, and the next one differs.
    #[test]
    fn back_to_back_sections_do_not_starve_a_writer() {
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sections = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let g = read_lock();
                    std::hint::black_box(&g);
                    drop(g);
                    sections += 1;
                }
                sections
            })
        };
        let done = Arc::new(AtomicUsize::new(0));
        let writer = {
            let done = done.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    synchronize();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while done.load(Ordering::SeqCst) < 200 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(
            done.load(Ordering::SeqCst),
            200,
            "a writer starved behind back-to-back sections"
        );
        writer.join().unwrap();
        assert!(reader.join().unwrap() > 0);
    }

    /// Parks the calling thread inside `section` until the test releases it, then leaves the
    /// section a little later, raising `left` just before.
    fn park(
        section: ReadGuard,
        entered: std::sync::mpsc::Sender<()>,
        release: std::sync::mpsc::Receiver<()>,
        left: &AtomicBool,
    ) {
        entered.send(()).unwrap();
        release.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        left.store(true, Ordering::SeqCst);
        drop(section);
    }

    /// Starts a grace period while the section of [`park`] is open; it must not end first.
    fn synchronize_waits_for(
        entered: std::sync::mpsc::Receiver<()>,
        release: std::sync::mpsc::Sender<()>,
        left: &AtomicBool,
    ) {
        entered.recv().unwrap();
        release.send(()).unwrap();
        synchronize();
        assert!(
            left.load(Ordering::SeqCst),
            "the grace period ended inside the section"
        );
    }

    /// A thread whose sections fence themselves (what happens without membarrier; forced here
    /// on a registered thread) is waited for too.
    #[test]
    fn a_grace_period_waits_for_a_fencing_threads_section() {
        use std::sync::mpsc;
        let (entered, wait_entered) = mpsc::channel();
        let (release, wait_release) = mpsc::channel();
        let left = Arc::new(AtomicBool::new(false));
        let reader = {
            let left = left.clone();
            std::thread::spawn(move || {
                drop(read_lock());
                MODE.with(|m| m.set(Mode::Fenced));
                WORD.with(|w| w.fetch_or(SLOW, Ordering::SeqCst));
                let g = read_lock();
                assert_eq!(
                    WORD.with(|w| w.load(Ordering::SeqCst)) & (IN | SLOW),
                    IN | SLOW
                );
                park(g, entered, wait_release, &left);
                assert_eq!(WORD.with(|w| w.load(Ordering::SeqCst)) & (IN | SLOW), SLOW);
            })
        };
        synchronize_waits_for(wait_entered, release, &left);
        reader.join().unwrap();
    }

    /// A thread-local destructor that runs after the thread has unregistered (other values'
    /// destructors do, in any order) still traces: its section is late, and a grace period
    /// waits for it.
    #[test]
    fn a_grace_period_waits_for_a_section_in_a_later_thread_local_destructor() {
        use std::cell::RefCell;
        use std::sync::mpsc;
        struct LateReader {
            mode: mpsc::Sender<Mode>,
            entered: mpsc::Sender<()>,
            release: mpsc::Receiver<()>,
            left: Arc<AtomicBool>,
        }
        impl Drop for LateReader {
            fn drop(&mut self) {
                let g = read_lock();
                assert!(in_read_section());
                self.mode.send(MODE.with(Cell::get)).unwrap();
                let (entered, _) = mpsc::channel();
                let entered = std::mem::replace(&mut self.entered, entered);
                let (_, release) = mpsc::channel();
                let release = std::mem::replace(&mut self.release, release);
                park(g, entered, release, &self.left);
                assert!(!in_read_section());
            }
        }
        thread_local! {
            static LATE_READER: RefCell<Option<LateReader>> = const { RefCell::new(None) };
        }
        let (mode, wait_mode) = mpsc::channel();
        let (entered, wait_entered) = mpsc::channel();
        let (release, wait_release) = mpsc::channel();
        let left = Arc::new(AtomicBool::new(false));
        let reader = {
            let left = left.clone();
            std::thread::spawn(move || {
                // Destructors run last-registered first: this value's was armed before the
                // thread's first section armed the one that unregisters it.
                LATE_READER.with(|r| {
                    *r.borrow_mut() = Some(LateReader {
                        mode,
                        entered,
                        release: wait_release,
                        left,
                    })
                });
                drop(read_lock());
            })
        };
        assert_eq!(wait_mode.recv().unwrap(), Mode::Late);
        synchronize_waits_for(wait_entered, release, &left);
        reader.join().unwrap();
    }

    /// A thread that exits inside a section never leaves it: writers keep waiting, through a
    /// word that outlives the thread's storage.
    #[test]
    fn a_thread_that_exits_inside_a_section_keeps_writers_waiting() {
        std::thread::spawn(|| std::mem::forget(read_lock()))
            .join()
            .unwrap();
        let stuck_word = &STUCK as *const AtomicU64 as *mut AtomicU64;
        let mut node = NODES.load(Ordering::Acquire) as *const Node;
        let mut stuck = None;
        // SAFETY: nodes are never freed.
        while let Some(n) = unsafe { node.as_ref() } {
            if n.word.load(Ordering::SeqCst) == stuck_word {
                stuck = Some(n);
            }
            node = n.next;
        }
        let stuck = stuck.expect("the exited thread's node holds the stuck word");
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let done = done.clone();
            std::thread::spawn(move || {
                synchronize();
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !done.load(Ordering::SeqCst),
            "a grace period ignored the section"
        );
        // The test's own cleanup: free the node, as if the section had ended.
        stuck.word.store(std::ptr::null_mut(), Ordering::SeqCst);
        writer.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    /// Readers on more threads than cores dereference a published value while a writer keeps
    /// replacing and freeing it; a freed value is poisoned first, so a reader that could still
    /// see it after `synchronize` would observe the poison.
    #[test]
    fn no_reader_sees_a_value_freed_after_synchronize() {
        const LIVE: usize = 0x5eed;
        const DEAD: usize = 0xdead;
        let ptr = Arc::new(AtomicPtr::new(Box::into_raw(Box::new(AtomicUsize::new(
            LIVE,
        )))));
        let stop = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(AtomicUsize::new(0));
        // Readers that have read once (and the spawner that has run one thread): the writer
        // starts only when all are running, or a fast writer could finish before any read.
        let ready = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..6)
            .map(|_| {
                let (ptr, stop, bad) = (ptr.clone(), stop.clone(), bad.clone());
                let ready = ready.clone();
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let _g = read_lock();
                        let p = ptr.load(Ordering::Acquire);
                        // SAFETY: p stays allocated until a grace period after it is replaced.
                        let v = unsafe { (*p).load(Ordering::Relaxed) };
                        if v != LIVE {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                        reads += 1;
                        if reads == 1 {
                            ready.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    reads
                })
            })
            .collect();
        // Threads that live for a few sections each, so that writers keep scanning the words
        // of threads that are exiting and nodes that are being reused.
        let short_lived = {
            let (ptr, stop, bad) = (ptr.clone(), stop.clone(), bad.clone());
            let ready = ready.clone();
            std::thread::spawn(move || {
                let mut threads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let (ptr, bad) = (ptr.clone(), bad.clone());
                    std::thread::spawn(move || {
                        for _ in 0..50 {
                            let _g = read_lock();
                            let p = ptr.load(Ordering::Acquire);
                            // SAFETY: as in the readers above.
                            if unsafe { (*p).load(Ordering::Relaxed) } != LIVE {
                                bad.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                    .join()
                    .unwrap();
                    threads += 1;
                    if threads == 1 {
                        ready.fetch_add(1, Ordering::SeqCst);
                    }
                }
                threads
            })
        };
        while ready.load(Ordering::SeqCst) < 7 {
            std::thread::yield_now();
        }
        for _ in 0..300 {
            let fresh = Box::into_raw(Box::new(AtomicUsize::new(LIVE)));
            let old = ptr.swap(fresh, Ordering::AcqRel);
            synchronize();
            // SAFETY: after synchronize no reader can hold `old`.
            unsafe {
                (*old).store(DEAD, Ordering::Relaxed);
                drop(Box::from_raw(old));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(reads > 0);
        assert!(short_lived.join().unwrap() > 0);
        assert_eq!(bad.load(Ordering::Relaxed), 0);
        // SAFETY: all readers have exited.
        unsafe { drop(Box::from_raw(ptr.load(Ordering::Acquire))) };
    }
}
