//! A profiled call allocates nothing: a counting global allocator watches calls of a
//! profiled function (entry and exit handlers both run) after the thread's first call.

use std::sync::Arc;

use ustrace::ftrace::profile;

#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

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
    let allocations = ustrace_testalloc::count_in_process(|| {
        for i in 0..10_000 {
            fnprof_noalloc_work(i);
        }
    });
    profile::stop().unwrap();
    let hits: u64 = profile::current().unwrap().stats(None)[0].hits;
    assert_eq!(hits, 10_001, "the calls were profiled");
    assert_eq!(allocations, 0, "allocations on the hit path");
}
