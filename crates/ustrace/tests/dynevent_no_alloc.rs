//! An fprobe event's hit allocates nothing: a counting global allocator watches calls of a
//! probed function whose event records through the register plan (arguments only in
//! registers), filtered and not, through the handler for whole words of a constant length,
//! and through the fetch program (a dereference and a string).

mod common;

use ustrace::FileSystem;

#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

#[inline(never)]
#[no_mangle]
pub extern "C" fn dynevent_noalloc_work(n: u64, word: &u32, name: *const u8) -> u64 {
    std::hint::black_box((word, name));
    n.wrapping_mul(3)
}

fn calls(n: u64) -> usize {
    let word = 0x5eed_u32;
    let name = c"noalloc".as_ptr().cast::<u8>();
    // The first call sets this thread up (shadow stack slot, rseq, thread id).
    dynevent_noalloc_work(0, &word, name);
    ustrace_testalloc::count_in_process(|| {
        for i in 0..n {
            dynevent_noalloc_work(i, &word, name);
        }
    })
}

#[test]
fn fprobe_event_hits_allocate_nothing() {
    ustrace::tracefs().mkdir("instances/dyn-noalloc").unwrap();
    let p = |f: &str| format!("instances/dyn-noalloc/events/dynalloc/{f}");
    common::append(
        "dynamic_events",
        "f:dynalloc/regs dynevent_noalloc_work n=$arg1:u64 w=$arg2:x32 k=\\3\n\
         f:dynalloc/words dynevent_noalloc_work n=$arg1:u64 w=$arg2\n\
         f:dynalloc/fetch dynevent_noalloc_work n=$arg1:u64 w=+0($arg2):u32 s=+0($arg3):string\n",
    )
    .unwrap();
    common::write(&p("regs/enable"), "1\n").unwrap();
    assert_eq!(calls(10_000), 0, "register plan");
    common::write(&p("regs/filter"), "n < 100\n").unwrap();
    assert_eq!(calls(10_000), 0, "register plan, filtered");
    common::write(&p("regs/enable"), "0\n").unwrap();
    common::write(&p("words/enable"), "1\n").unwrap();
    assert_eq!(calls(10_000), 0, "register words of a constant length");
    common::write(&p("words/enable"), "0\n").unwrap();
    common::write(&p("fetch/enable"), "1\n").unwrap();
    assert_eq!(calls(10_000), 0, "fetch program");
    common::write(&p("fetch/enable"), "0\n").unwrap();
    let trace = common::read("instances/dyn-noalloc/trace").unwrap();
    let regs = trace.matches(" regs: ").count();
    let fetch = trace.matches(" fetch: ").count();
    assert_eq!(
        trace.matches(" words: ").count(),
        10_001,
        "the calls were recorded"
    );
    // Every call of the first window, the 101 the filter kept of the second (its first call
    // included), and every call of the third.
    assert_eq!(
        (regs, fetch),
        (10_001 + 101, 10_001),
        "the calls were recorded"
    );
    assert!(
        trace.contains(" s=\"noalloc\""),
        "{}",
        &trace[..2000.min(trace.len())]
    );
}
