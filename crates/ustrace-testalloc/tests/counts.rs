//! The allocator counts what it should: allocations inside a window, of this thread or of
//! any thread, and nothing outside it.

#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

use std::hint::black_box;

#[test]
fn windows_count_allocations_and_nothing_else() {
    assert_eq!(ustrace_testalloc::count_on_this_thread(|| {}), 0);
    let n = ustrace_testalloc::count_on_this_thread(|| {
        drop(black_box(vec![1u8; 10]));
        let mut v = black_box(Vec::<u64>::with_capacity(1));
        v.extend(0..100); // grows: reallocations count too
        drop(black_box(v));
    });
    assert!(n >= 3, "{n} allocations counted, at least 3 made");
    // Another thread's allocations are not this thread's...
    let other = ustrace_testalloc::count_on_this_thread(|| {
        std::thread::scope(|s| {
            s.spawn(|| drop(black_box(Box::new(1u32))));
        });
    });
    // ...(spawning itself allocates on this thread, so compare with the process count).
    let all = ustrace_testalloc::count_in_process(|| {
        std::thread::scope(|s| {
            s.spawn(|| drop(black_box(Box::new(1u32))));
        });
    });
    assert!(all > other, "process {all}, this thread {other}");
    drop(black_box(Box::new(5u8))); // outside any window
    assert_eq!(ustrace_testalloc::count_in_process(|| {}), 0);
}
