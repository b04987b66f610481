//! Recording a synthetic event allocates nothing, off or on (filtered, triggered), from
//! the one-call API and the piecewise one: a counting global allocator watches
//! `Synthetic::trace` after the first call of the thread.

use ustrace::synth::{self, SynthValue};
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

#[test]
fn synthetic_events_record_without_allocating() {
    let fs = ustrace::tracefs();
    fs.mkdir("instances/synth_noalloc").unwrap();
    let event = synth::create(
        "noalloc_lat",
        &[
            ("u64", "lat"),
            ("char[16]", "comm"),
            ("char[]", "op"),
            ("unsigned long[]", "stack"),
        ],
    )
    .unwrap();
    let stack = [0x1000u64, 0x2000, 0];
    let values = |lat: u64| {
        [
            SynthValue::U64(lat),
            "worker".into(),
            "get".into(),
            SynthValue::Stack(&stack),
        ]
    };
    let dir = "instances/synth_noalloc/events/synthetic/noalloc_lat";
    assert_eq!(count(|| event.trace(&values(1)).unwrap()), 0, "off");
    set(&format!("{dir}/enable"), "1\n");
    assert_eq!(count(|| event.trace(&values(2)).unwrap()), 0, "recorded");
    set(&format!("{dir}/filter"), "lat > 5 && op == \"get\"\n");
    assert_eq!(
        count(|| event.trace(&values(3)).unwrap()),
        0,
        "filter rejects"
    );
    assert_eq!(
        count(|| event.trace(&values(9)).unwrap()),
        0,
        "filter keeps"
    );
    set(&format!("{dir}/trigger"), "traceon if lat > 100\n");
    assert_eq!(count(|| event.trace(&values(9)).unwrap()), 0, "triggered");
    assert_eq!(
        count(|| {
            let mut t = event.trace_start();
            t.add_next_val(9u64).unwrap();
            t.add_next_val("w").unwrap();
            t.add_next_val("get").unwrap();
            t.end().unwrap();
        }),
        0,
        "piecewise"
    );
    set(&format!("{dir}/trigger"), "!traceon\n");
    set(&format!("{dir}/enable"), "0\n");
    fs.rmdir("instances/synth_noalloc").unwrap();
    synth::delete("noalloc_lat").unwrap();
}
