//! Stack variables (histogram.rst's `block_lat`, `st=common_stacktrace`): which synthetic
//! fields take one (the kernel's `check_synth_field`: a stack trace goes into an
//! `unsigned long[]` or `long[]` field, and nothing else does), the alias that passes one
//! on (`s=$st`), and the record path that saves and passes one allocating nothing.

mod common;

use ustrace::{Errno, FileSystem};

/// Counting is per thread: this binary's other test allocates meanwhile.
#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

#[path = "common/sched_switch.rs"]
mod sched_events;
use sched_events::sched_switch;

ustrace::trace_event! {
    pub fn svar::start(key: u64) {
        key: u64 = key,
    }
    print "key=%llu", key;
}

ustrace::trace_event! {
    pub fn svar::end(key: u64) {
        key: u64 = key,
    }
    print "key=%llu", key;
}

/// Synthetic events are global and the allocation count is process-wide: one test at a
/// time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn skip_without_hist() -> bool {
    if common::read("synthetic_events").is_err() {
        println!("skipped: no synthetic_events file");
        return true;
    }
    false
}

/// Where the tasks of the first test block: its stack must start here.
#[no_mangle]
#[inline(never)]
pub extern "C" fn stack_var_blocks(pid: i32) {
    sched_switch::trace("worker", 0, 120, 2, "task", std::hint::black_box(pid), 120);
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn stack_var_wakes(pid: i32) {
    sched_switch::trace("task", std::hint::black_box(pid), 120, 0, "worker", 0, 120);
}

#[test]
fn a_stack_fits_a_stack_field_and_nothing_else() {
    if skip_without_hist() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fs = ustrace::tracefs();
    let _ = fs.rmdir("instances/stackvar");
    fs.mkdir("instances/stackvar").unwrap();
    let path = |p: &str| format!("instances/stackvar/{p}");
    let trigger = path("events/sched/sched_switch/trigger");
    common::append(
        "synthetic_events",
        "stk_ulong u64 delta; unsigned long[] stack\n",
    )
    .unwrap();
    common::append("synthetic_events", "stk_long u64 delta; long[] stack\n").unwrap();
    common::append(
        &trigger,
        "hist:keys=next_pid:ts=common_timestamp.usecs,st=common_stacktrace if prev_state == 2\n",
    )
    .unwrap();
    // The kernel's `hist_field_print` shows a stack variable without a modifier.
    assert_eq!(
        common::read(&trigger).unwrap(),
        "hist:keys=next_pid:vals=hitcount:ts=common_timestamp.usecs,st=common_stacktrace:sort=hitcount:size=2048:clock=global if prev_state == 2 [active]\n"
    );
    let refused = |body: &str, at: &str| {
        assert_eq!(
            common::append(&trigger, &format!("{body}\n")),
            Err(Errno::EINVAL),
            "{body}"
        );
        let log = common::read(&path("error_log")).unwrap();
        let want = format!(
            "hist:sched:sched_switch: error: Param type doesn't match synthetic event field type\n  Command: {body}\n{}^\n",
            " ".repeat(body.find(at).expect("caret text") + "  Command: ".len())
        );
        assert!(log.contains(&want), "want:\n{want}\nin error_log:\n{log}");
        assert_eq!(
            common::read(&trigger).unwrap().matches("hist:").count(),
            1,
            "{body}"
        );
    };
    let head = "hist:keys=prev_pid:delta=common_timestamp.usecs-$ts,s=$st:onmax($delta)";
    // A stack into an integer field; an unsigned integer into a stack field (the kernel's
    // signedness check); a signed 8-byte field into a stack field, which the kernel would
    // take because its size and signedness match and then read as the frames' address.
    refused(&format!("{head}.trace(stk_ulong,$s,$delta)"), "$s");
    refused(&format!("{head}.trace(stk_ulong,$delta,$delta)"), "$delta");
    refused(
        &format!("{head}.trace(stk_ulong,$delta,prev_state)"),
        "prev_state",
    );
    // `long[]` is a stack field too (the kernel's `strstr(type, "long[")`), and the alias
    // passes on the frames saved where the task blocked.
    let kept = format!("{head}.trace(stk_long,$delta,$s)");
    common::append(&trigger, &format!("{kept}\n")).unwrap();
    common::write(&path("events/synthetic/stk_long/enable"), "1\n").unwrap();
    stack_var_blocks(77);
    stack_var_wakes(77);
    let trace = common::read(&path("trace")).unwrap();
    let record = trace
        .split_once("stk_long: ")
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("no stk_long record:\n{trace}"));
    assert!(record.starts_with("delta="), "{record}");
    let frames: Vec<&str> = record
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("=> "))
        .collect();
    assert!(
        frames
            .first()
            .is_some_and(|f| f.contains("stack_var_blocks")),
        "{record}"
    );
    assert!(!record.contains("stack_var_wakes"), "{record}");

    fs.rmdir("instances/stackvar").unwrap();
    common::append("synthetic_events", "!stk_long\n").unwrap();
    common::append("synthetic_events", "!stk_ulong\n").unwrap();
}

fn count(mut body: impl FnMut()) -> usize {
    body(); // first call per thread: thread id, name, RCU slot, the frames to skip
    ustrace_testalloc::count_on_this_thread(|| {
        for _ in 0..10_000 {
            body();
        }
    })
}

#[test]
fn saving_and_passing_a_stack_allocates_nothing() {
    if skip_without_hist() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fs = ustrace::tracefs();
    let _ = fs.rmdir("instances/stackvar_noalloc");
    fs.mkdir("instances/stackvar_noalloc").unwrap();
    let path = |p: &str| format!("instances/stackvar_noalloc/{p}");
    common::append(
        "synthetic_events",
        "stk_pass u64 key; unsigned long[] stack\n",
    )
    .unwrap();
    common::write(
        &path("events/svar/start/trigger"),
        "hist:keys=key:st=common_stacktrace\n",
    )
    .unwrap();
    common::write(
        &path("events/svar/end/trigger"),
        "hist:keys=key:s=$st:onmatch(svar.start).trace(stk_pass,key,$s)\n",
    )
    .unwrap();
    common::write(&path("events/synthetic/stk_pass/enable"), "1\n").unwrap();
    let mut key = 0u64;
    assert_eq!(
        count(|| {
            key = (key + 7) % 1000;
            start::trace(key);
            end::trace(key);
        }),
        0,
        "stack saved into the entry, passed on by an alias, recorded"
    );
    let hist = common::read(&path("events/svar/end/hist")).unwrap();
    assert!(hist.contains("    Hits: 10001\n"), "{hist}");
    let trace = common::read(&path("trace")).unwrap();
    assert!(trace.contains("stk_pass: key="), "{trace}");
    assert!(trace.contains(" stack=STACK:\n=> "), "{trace}");

    fs.rmdir("instances/stackvar_noalloc").unwrap();
    common::append("synthetic_events", "!stk_pass\n").unwrap();
}
