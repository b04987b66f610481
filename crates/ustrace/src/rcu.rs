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
//! with a per-thread section count in place of a global grace-period number:
//!
//! ```text
//!  reader (thread T, its thread-local word w)    writer (cold path)
//!  ──────────────────────────────────────────    ──────────────────
//!  c = w          (even: not in a section)       publish new pointer
//!  w = c + 1      ─┐                             membarrier()  ── every running thread
//!  compiler fence  │ section                                     executes a full fence
//!  p = load(pointer)                             for each registered thread T:
//!  ... use *p ...  │                               s = T's w
//!  w = c + 4      ─┘ (release)                     if s is odd: wait until T's w != s
//!                                                membarrier()
//! ```
//!
//! # Why a writer that returns has waited for every section that could see the old value
//!
//! *The word.* Bit 0 (`IN`) of a thread's word is set exactly while the thread is inside its
//! outermost section; the rest counts the sections it has finished (bit 1, `SLOW`, is a mode
//! bit, see below). Only the outermost section changes the word, twice: on entry (the count
//! with `IN`) and on exit (the next count, without it). A section that finds `IN` already set
//! is nested, and on exit stores back the value it found (a store is cheaper than a test for
//! "was I nested"), which is the outermost section's: so while an outermost section S runs,
//! the word holds S's entry value.
//!
//! *Signal handlers.* A handler can run a whole section between the entry's load and its store
//! of the word; the interrupted entry then stores its stale `c + 1`, which the handler's own
//! first section may have used too. That is harmless: the stale store happens only after every
//! section the handler began has ended (handlers nest last-in first-out), it begins a new
//! outermost section S whose value the word keeps until S ends, and a writer that sees the
//! same odd value again just waits longer. So the rule below holds: *once the word shows an
//! odd value s, any later value other than s means the section that stored s has ended.*
//!
//! *The fence.* Readers issue no hardware fence; the writer's
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` makes every CPU running a thread of this
//! process execute a full fence (a thread not running has passed through the scheduler, which
//! fences). Take a section S of thread T and the point F where that fence lands in T's
//! instruction stream. If S's entry store comes before F, it is visible to the writer's scan,
//! which runs after `membarrier` returns: the writer sees S's odd value (or, if S has ended,
//! a later one) and waits until the word changes, i.e. until S ends. If S's entry store comes
//! after F, so do S's pointer loads (they follow the store in program order, and the compiler
//! fence keeps the compiler from hoisting them); the pointer was published before
//! `membarrier` was called, so they see the new value and S never sees the old one. Either
//! way nothing S can see is freed while S runs. The reader's exit store is a release store
//! and the writer's loads acquire, so S's uses of the old value happen before the writer
//! frees it; the trailing `membarrier` orders them once more for weaker hardware.
//!
//! *No global counter.* The writer compares each thread's word with the value it saw first,
//! so it waits for at most one section per thread and never for sections that began after
//! its scan: no reader has to load a shared grace-period number, and a thread that enters
//! sections back to back cannot starve a writer.
//!
//! *Fence mode.* Where membarrier is not available (old kernels, seccomp), each thread is
//! registered with `SLOW` set in its word: its sections take the out-of-line entry, which
//! follows the entry store with a real `SeqCst` fence, and the writer's `membarrier` becomes
//! a `SeqCst` fence too; the two fences order "store word, load pointer" against "store
//! pointer, load word" (either the reader sees the new pointer or the writer sees the word).
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
//! A word's count wraps after 2^62 sections, which keeps the rule above sound: values repeat
//! only in the direction of waiting longer, never of missing a section.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::Once;

/// Bit of a thread's word: the thread is inside its outermost section.
const IN: u64 = 1;
/// Bit of a thread's word: its sections take the out-of-line entry (it must fence, or is not
/// registered). Never changed by a section's entry or exit.
const SLOW: u64 = 2;
/// What one outermost section adds to the word; keeps `IN` and `SLOW` clear.
const STEP: u64 = 4;
/// A [`ReadGuard`]'s `restore` for a late section (see the module doc). No other guard has
/// it: an outermost section's is even and, unless it is a fencing thread's, a multiple of
/// `STEP` (a fencing thread's count skips it); a nested section's is odd.
const LATE: u64 = SLOW;

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
    /// What the section stores in the word when it ends: the next count for an outermost
    /// section, the word as it found it for a nested one (the outermost section's value,
    /// which nothing changes while it runs), or [`LATE`] for a late section, which stores
    /// nothing.
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
        WORD.with(|w| w.store(word + IN, Ordering::Release));
        // Keeps the section's loads after the store; membarrier does the rest.
        compiler_fence(Ordering::SeqCst);
        word.wrapping_add(STEP)
    } else if word & IN != 0 {
        // Nested: the outermost section's value stays.
        word
    } else {
        enter_slow(word)
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
            match word.wrapping_add(STEP) {
                LATE => LATE.wrapping_add(STEP),
                next => next,
            }
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
        if self.restore != LATE {
            compiler_fence(Ordering::SeqCst);
            WORD.with(|w| w.store(self.restore, Ordering::Release));
        } else {
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
            if seen & IN != 0 {
                let mut spins = 0;
                // Same owner, same value: the section that stored it may still be running.
                while observe(n) == Some((word, seen)) {
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
            assert_eq!(observe(node), Some((mine as *const AtomicU64, word | IN)));
            drop(g);
            assert_eq!(
                WORD.with(|w| w.load(Ordering::SeqCst)),
                word.wrapping_add(STEP)
            );
        })
        .join()
        .unwrap();
    }

    /// A word's count wraps; a fencing thread's skips the late guard's value on the way, so
    /// that its section's end still stores the word.
    #[test]
    fn counts_wrap_without_meeting_the_late_guards_value() {
        std::thread::spawn(|| {
            drop(read_lock());
            MODE.with(|m| m.set(Mode::Fast));
            WORD.with(|w| w.store(0u64.wrapping_sub(STEP), Ordering::SeqCst));
            drop(read_lock());
            assert_eq!(WORD.with(|w| w.load(Ordering::SeqCst)), 0);
            MODE.with(|m| m.set(Mode::Fenced));
            WORD.with(|w| w.store(LATE.wrapping_sub(STEP), Ordering::SeqCst));
            let g = read_lock();
            assert!(in_read_section());
            drop(g);
            assert!(!in_read_section());
            assert_eq!(
                WORD.with(|w| w.load(Ordering::SeqCst)),
                LATE.wrapping_add(STEP)
            );
        })
        .join()
        .unwrap();
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
        let readers: Vec<_> = (0..6)
            .map(|_| {
                let (ptr, stop, bad) = (ptr.clone(), stop.clone(), bad.clone());
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
                    }
                    reads
                })
            })
            .collect();
        // Threads that live for a few sections each, so that writers keep scanning the words
        // of threads that are exiting and nodes that are being reused.
        let short_lived = {
            let (ptr, stop, bad) = (ptr.clone(), stop.clone(), bad.clone());
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
                }
                threads
            })
        };
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
