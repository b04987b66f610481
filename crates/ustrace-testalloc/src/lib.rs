//! A counting global allocator for the no-allocation tests of every ustrace crate.
//!
//! The hot paths (a tracepoint call, an event write, a filter, an fprobe hit, a hist update)
//! promise no allocation. Each crate proves it with a test binary that installs
//! [`CountingAllocator`] as its global allocator and runs the path inside a counting window:
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;
//!
//! fn hot_path() -> u64 {
//!     std::hint::black_box(40) + 2
//! }
//! let allocations = ustrace_testalloc::count_on_this_thread(|| {
//!     hot_path();
//! });
//! assert_eq!(allocations, 0);
//! ```
//!
//! Every window first checks that the allocator really is installed (an allocation of its
//! own must be counted), so a test binary that forgot the `#[global_allocator]` line fails
//! instead of passing with a count that can never be anything but zero.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Forwards every call to [`System`] and counts allocations (including `realloc` and
/// `alloc_zeroed`) made inside an open window.
pub struct CountingAllocator;

static PROCESS_WINDOW: AtomicBool = AtomicBool::new(false);
static PROCESS_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Process-wide windows do not overlap: two tests of one binary that ran them at once would
/// count each other's allocations.
static PROCESS_WINDOWS: Mutex<()> = Mutex::new(());

thread_local! {
    // `const`-initialised cells without destructors: touching them never allocates.
    static THREAD_WINDOW: Cell<bool> = const { Cell::new(false) };
    static THREAD_COUNT: Cell<usize> = const { Cell::new(0) };
}

#[inline]
fn note_allocation() {
    if PROCESS_WINDOW.load(Ordering::Relaxed) {
        PROCESS_COUNT.fetch_add(1, Ordering::Relaxed);
    }
    // `try_with`: the allocator also runs while this thread's locals are being torn down.
    let _ = THREAD_WINDOW.try_with(|open| {
        if open.get() {
            let _ = THREAD_COUNT.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the contract; the
// counting beside it touches only atomics and allocation-free thread-locals.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on as is.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

const NOT_INSTALLED: &str = "ustrace_testalloc::CountingAllocator is not this binary's \
     #[global_allocator]: the count would always be zero";

/// Allocations made by any thread of the process while `body` runs.
///
/// For hot paths that run on threads the test starts; other tests of the same binary that
/// run meanwhile are counted too, so such binaries keep to one test or serialise them.
pub fn count_in_process(body: impl FnOnce()) -> usize {
    let _window = PROCESS_WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    PROCESS_COUNT.store(0, Ordering::SeqCst);
    PROCESS_WINDOW.store(true, Ordering::SeqCst);
    drop(std::hint::black_box(Box::new(0u64)));
    let probe = PROCESS_COUNT.swap(0, Ordering::SeqCst);
    if probe == 0 {
        PROCESS_WINDOW.store(false, Ordering::SeqCst);
        panic!("{NOT_INSTALLED}");
    }
    body();
    PROCESS_WINDOW.store(false, Ordering::SeqCst);
    PROCESS_COUNT.load(Ordering::SeqCst)
}

/// Allocations made by the calling thread while `body` runs (the harness's and the
/// program's other threads are not counted).
pub fn count_on_this_thread(body: impl FnOnce()) -> usize {
    THREAD_COUNT.with(|n| n.set(0));
    THREAD_WINDOW.with(|open| open.set(true));
    drop(std::hint::black_box(Box::new(0u64)));
    let probe = THREAD_COUNT.with(|n| n.replace(0));
    if probe == 0 {
        THREAD_WINDOW.with(|open| open.set(false));
        panic!("{NOT_INSTALLED}");
    }
    body();
    THREAD_WINDOW.with(|open| open.set(false));
    THREAD_COUNT.with(Cell::get)
}
