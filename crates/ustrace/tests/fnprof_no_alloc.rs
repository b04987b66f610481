//! A profiled call allocates nothing: a counting global allocator watches calls of a
//! profiled function (entry and exit handlers both run) after the thread's first call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ustrace::ftrace::profile;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[inline(never)]
#[no_mangle]
pub extern "C" fn fnprof_noalloc_work(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(0x9e37_79b9).rotate_left(11))
}

#[test]
fn a_profiled_call_allocates_nothing() {
    let funcs: Vec<(usize, String)> = ustrace_inspect::symbols::inventory()
        .glob("fnprof_noalloc_work")
        .into_iter()
        .map(|s| (s.addr, s.name.clone()))
        .collect();
    assert_eq!(funcs.len(), 1);
    profile::start(
        funcs,
        ustrace_ringbuf::cpu::possible_cpus(),
        Arc::new(|| false),
    )
    .expect("profiler starts");
    // The first call sets this thread up (shadow stack slot, rseq).
    fnprof_noalloc_work(0);
    COUNTING.store(true, Ordering::SeqCst);
    for i in 0..10_000 {
        fnprof_noalloc_work(i);
    }
    COUNTING.store(false, Ordering::SeqCst);
    profile::stop().unwrap();
    let hits: u64 = profile::current().unwrap().stats(None)[0].hits;
    assert_eq!(hits, 10_001, "the calls were profiled");
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst),
        0,
        "allocations on the hit path"
    );
}
