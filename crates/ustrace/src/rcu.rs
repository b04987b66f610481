//! Read-copy-update for the hot path: readers pay two stores to a thread-local slot, writers wait.
//!
//! Everything a traced thread looks at while recording an event — the probe array of a
//! tracepoint, an event's filter program, its triggers — is published through a pointer and
//! read inside a *read-side section*. A writer that replaces such a pointer keeps the old
//! value alive until [`synchronize`] returns: by then no thread can still be inside a section
//! that began before the replacement, so the old value can be freed.
//!
//! This is user-space RCU in the "membarrier" flavour (the scheme of liburcu's `urcu-memb`):
//!
//! ```text
//!  reader (any thread)                         writer (cold path)
//!  ───────────────────                         ──────────────────
//!  slot.ctr = GP          ─┐                   publish new pointer
//!  compiler fence          │ section           GP += 2                    (new = GP)
//!  p = load(pointer)       │                   membarrier()  ── every running thread
//!  ... use *p ...          │                                   executes a full fence
//!  slot.ctr = 0           ─┘                   for each slot: wait until ctr == 0
//!                                                                    or ctr >= new
//! ```
//!
//! The reader needs no atomic read-modify-write and no hardware fence: the writer's
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` forces a full fence on every CPU running a
//! thread of this process. Wherever that fence lands in a reader's instruction stream, either
//! the reader's `ctr` store is already visible to the writer's scan (and the writer waits for
//! it), or the reader's later pointer load comes after the fence and sees the new pointer.
//! A reader whose `ctr` holds the new grace-period number started after the bump and so can
//! only see the new pointer. Sections nest (a signal handler that traces while its thread was
//! tracing), and only the outermost one touches `ctr`: a section that finds `ctr` set is nested.
//!
//! Where membarrier is not available, readers fall back to a real `SeqCst` fence. Which of
//! the two they need is bit 0 of `GP` itself (the counter steps by 2), so entering a section
//! reads one shared word.
//!
//! Each thread owns one cache-line-sized `Slot`, registered on its first section and
//! returned to a free list when the thread exits, so threads never share a line on the hot
//! path and the registry's lock is taken once per thread, never per event.

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

/// The grace-period counter, never 0 (which means "not in a section"). It steps by 2; its
/// bit 0 is [`GP_FENCE`].
static GP: AtomicU64 = AtomicU64::new(2 | GP_FENCE);
/// Set in `GP` while readers must fence themselves: until `init` has registered
/// membarrier, and for good where it cannot.
const GP_FENCE: u64 = 1;
/// Whether `membarrier(PRIVATE_EXPEDITED)` is registered; otherwise readers fence themselves.
static MEMBARRIER: AtomicBool = AtomicBool::new(false);
static INIT: Once = Once::new();
/// Serializes writers, so that grace periods do not interleave.
static WRITERS: Mutex<()> = Mutex::new(());
/// Every slot ever handed out; slots of exited threads are reused.
static REGISTRY: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

/// A thread's read-side state, alone on its cache line.
#[repr(align(64))]
struct Slot {
    /// 0 outside a section; otherwise the grace period the outermost section began in.
    /// Written only by the thread that owns the slot (and reset when it leaves).
    ctr: AtomicU64,
    /// Whether a live thread owns this slot.
    owned: AtomicBool,
}

thread_local! {
    static SLOT: Cell<Option<&'static Slot>> = const { Cell::new(None) };
    static RELEASE: SlotRelease = const { SlotRelease };
}

/// Gives the thread's slot back when the thread exits.
struct SlotRelease;

impl Drop for SlotRelease {
    fn drop(&mut self) {
        if let Ok(Some(slot)) = SLOT.try_with(|s| s.take()) {
            slot.ctr.store(0, Ordering::Release);
            slot.owned.store(false, Ordering::Release);
        }
    }
}

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
        if rc == 0 {
            // Readers enter sections only after `init`, so none has used the fenced value.
            GP.fetch_and(!GP_FENCE, Ordering::SeqCst);
        }
        // SAFETY: the handler is a plain function that only touches atomics and the registry.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
        }
    });
}

/// In a child after fork only the forking thread exists; the others' slots must not hold up
/// grace periods forever.
extern "C" fn after_fork_in_child() {
    let me = SLOT.try_with(|s| s.get()).ok().flatten();
    // The forking thread held no registry lock (fork is not called from inside one), but
    // another thread might have: a poisoned or held lock is skipped rather than waited on.
    if let Ok(slots) = REGISTRY.try_lock() {
        for slot in slots.iter() {
            if me.is_some_and(|m| std::ptr::eq(m, *slot)) {
                continue;
            }
            slot.ctr.store(0, Ordering::Relaxed);
            slot.owned.store(false, Ordering::Relaxed);
        }
    }
}

#[cold]
#[inline(never)]
fn register_thread() -> &'static Slot {
    init();
    let slot = {
        let mut slots = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        match slots.iter().find(|s| {
            s.owned
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        }) {
            Some(free) => *free,
            None => {
                let slot: &'static Slot = Box::leak(Box::new(Slot {
                    ctr: AtomicU64::new(0),
                    owned: AtomicBool::new(true),
                }));
                slots.push(slot);
                slot
            }
        }
    };
    SLOT.with(|s| s.set(Some(slot)));
    // Touch the releaser so that its destructor runs at thread exit.
    RELEASE.with(|_| {});
    slot
}

#[inline(always)]
fn slot() -> &'static Slot {
    match SLOT.try_with(|s| s.get()) {
        Ok(Some(slot)) => slot,
        // During thread-local destruction there is no slot any more; such a late reader gets
        // a fresh one (the registry reuses free slots) rather than going unprotected.
        _ => register_thread(),
    }
}

/// A read-side section; the protected data may be used until it is dropped.
pub struct ReadGuard {
    /// The thread's slot when this guard opened the outermost section (and closes it);
    /// `None` for a nested one.
    outer: Option<&'static Slot>,
    // Not Send: the section belongs to the thread that entered it.
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Enters a read-side section. No lock, no allocation, no syscall (after a thread's first).
#[inline(always)]
pub fn read_lock() -> ReadGuard {
    enter(slot())
}

#[inline(always)]
fn enter(slot: &'static Slot) -> ReadGuard {
    // Only this thread writes its `ctr`. A signal handler that enters a section between the
    // load and the store leaves `ctr` at 0 again before this code resumes.
    let outer = slot.ctr.load(Ordering::Relaxed) == 0;
    if outer {
        let gp = GP.load(Ordering::Acquire);
        slot.ctr.store(gp, Ordering::Relaxed);
        if gp & GP_FENCE == 0 {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }
    ReadGuard {
        outer: outer.then_some(slot),
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for ReadGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(slot) = self.outer {
            compiler_fence(Ordering::SeqCst);
            slot.ctr.store(0, Ordering::Release);
        }
    }
}

/// Whether the calling thread is inside a read-side section (then [`synchronize`] would wait
/// for itself).
pub fn in_read_section() -> bool {
    SLOT.try_with(|s| {
        s.get()
            .is_some_and(|slot| slot.ctr.load(Ordering::Relaxed) != 0)
    })
    .unwrap_or(false)
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
        if rc == 0 {
            return;
        }
    }
    fence(Ordering::SeqCst);
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
    let _writer = WRITERS.lock().unwrap_or_else(|e| e.into_inner());
    let new_gp = GP.fetch_add(2, Ordering::SeqCst) + 2;
    full_barrier_on_all_threads();
    let slots: Vec<&'static Slot> = REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for slot in slots {
        let mut spins = 0u32;
        loop {
            let ctr = slot.ctr.load(Ordering::Acquire);
            if ctr == 0 || ctr >= new_gp {
                break;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
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

    /// The fence bit of the grace-period counter says what readers need: clear exactly when
    /// membarrier is registered, and kept by every grace period.
    #[test]
    fn the_counter_says_whether_readers_fence() {
        synchronize();
        let fenced = GP.load(Ordering::SeqCst) & GP_FENCE != 0;
        assert_eq!(fenced, !MEMBARRIER.load(Ordering::SeqCst));
        synchronize();
        assert_eq!(GP.load(Ordering::SeqCst) & GP_FENCE != 0, fenced);
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
        assert_eq!(bad.load(Ordering::Relaxed), 0);
        // SAFETY: all readers have exited.
        unsafe { drop(Box::from_raw(ptr.load(Ordering::Acquire))) };
    }
}
