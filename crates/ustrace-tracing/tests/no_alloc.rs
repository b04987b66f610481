//! A `tracing` event recorded into ustrace allocates nothing after a thread's first: not for
//! integers, not for `&str` or `Debug` values (formatted straight into the record), not with
//! a filter; span enter/exit neither.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use ustrace::{FileSystem, OpenFlags};

#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

fn set(path: &str, text: &str) {
    let mut f = ustrace::tracefs().open(path, OpenFlags::TRUNCATE).unwrap();
    f.write(text.as_bytes()).unwrap();
}

fn count(mut body: impl FnMut()) -> usize {
    body(); // first call per thread: thread id, name, RCU slot
    ustrace_testalloc::count_in_process(|| {
        for _ in 0..10_000 {
            body();
        }
    })
}

fn event(i: u64) {
    tracing::info!(name: "ev", a = i, b = -3i64, ok = true, who = "alpha", v = ?(1, 2), "n {i}");
}

fn work() -> tracing::Span {
    tracing::info_span!("work", job = 3u64)
}

/// The newest line of the instance's trace.
fn last_line() -> String {
    let mut f = ustrace::tracefs()
        .open("instances/noalloc/trace", OpenFlags::READ)
        .unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf, None).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    text.lines().last().unwrap_or_default().to_string()
}

#[test]
fn recording_tracing_events_does_not_allocate() {
    tracing_subscriber::registry()
        .with(ustrace_tracing::layer())
        .init();
    event(0);
    let fs = ustrace::tracefs();
    fs.mkdir("instances/noalloc").unwrap();
    set("instances/noalloc/buffer_size_kb", "64");
    set("instances/noalloc/events/no_alloc/ev/enable", "1");
    assert_eq!(count(|| event(7)), 0, "plain");
    let line = last_line();
    assert!(
        line.ends_with("ev: INFO n 7 a=7 b=-3 ok=1 who=alpha v=(1, 2)"),
        "{line}"
    );
    set(
        "instances/noalloc/events/no_alloc/ev/filter",
        "a == 7 && who_str == \"alpha\"",
    );
    assert_eq!(count(|| event(7)), 0, "filtered");
    drop(work()); // registers the callsite
    set("instances/noalloc/events/no_alloc/work_enter/enable", "1");
    set("instances/noalloc/events/no_alloc/work_exit/enable", "1");
    let span = work();
    assert_eq!(count(|| drop(span.enter())), 0, "span enter/exit");
    let trace = last_line();
    assert!(trace.contains("work_exit: INFO span_id="), "{trace}");
    set("instances/noalloc/events/enable", "0");
    fs.rmdir("instances/noalloc").unwrap();
}
