//! A call traced by the `function` or `function_graph` tracer allocates nothing: a counting
//! global allocator watches calls of a traced function after the thread's first call, on
//! the handlers' straight line and on the paths a pid list, a graph set or `tracing_thresh`
//! send them to.

use ustrace::FileSystem;

#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

#[inline(never)]
#[no_mangle]
pub extern "C" fn ftrace_noalloc_work(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(0x9e37_79b9).rotate_left(11))
}

const CALLS: u64 = 10_000;

/// Allocations over `CALLS` traced calls (after one that sets the thread up), and how many
/// records they left.
fn traced_calls(dir: &str) -> (usize, u64) {
    let inst = ustrace::trace::tracing()
        .instance(dir.trim_start_matches("instances/"))
        .expect("instance");
    ftrace_noalloc_work(0);
    let before = inst.buffer().written();
    let allocations = ustrace_testalloc::count_in_process(|| {
        for i in 0..CALLS {
            ftrace_noalloc_work(i);
        }
    });
    (allocations, inst.buffer().written() - before)
}

#[test]
fn traced_calls_allocate_nothing() {
    let fs = ustrace::tracefs();
    let dir = "instances/ftrace_noalloc";
    fs.mkdir(dir).unwrap();
    let w = |path: &str, text: &str| fs.write_file(path, text).unwrap();
    w(&format!("{dir}/set_ftrace_filter"), "ftrace_noalloc_work\n");

    w(&format!("{dir}/current_tracer"), "function");
    assert_eq!(traced_calls(dir), (0, CALLS), "function");
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    w(&format!("{dir}/set_ftrace_pid"), &format!("{tid}\n"));
    assert_eq!(traced_calls(dir), (0, CALLS), "function, pid list");
    w(&format!("{dir}/set_ftrace_pid"), "");

    w(&format!("{dir}/current_tracer"), "function_graph");
    assert_eq!(traced_calls(dir), (0, 2 * CALLS), "function_graph");
    w(&format!("{dir}/set_ftrace_pid"), &format!("{tid}\n"));
    assert_eq!(
        traced_calls(dir),
        (0, 2 * CALLS),
        "function_graph, pid list"
    );
    w(&format!("{dir}/set_ftrace_pid"), "");
    w("set_graph_function", "ftrace_noalloc_work\n");
    assert_eq!(
        traced_calls(dir),
        (0, 2 * CALLS),
        "function_graph, graph set"
    );
    w("set_graph_function", "");
    // Calls far shorter than a second: each exit reads the clock and writes nothing.
    w("tracing_thresh", "1000000\n");
    assert_eq!(traced_calls(dir), (0, 0), "function_graph, tracing_thresh");
    w("tracing_thresh", "0\n");
    w(&format!("{dir}/current_tracer"), "nop");
    fs.rmdir(dir).unwrap();
}
