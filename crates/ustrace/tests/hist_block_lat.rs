//! histogram.rst's `block_lat` example, end to end: a synthetic event with an
//! `unsigned long[] stack` field fed from `common_stacktrace` saved at one event and passed
//! on by `onmax().trace()` at a later one, printed as `stack=STACK:` with its frames, and then
//! used as a histogram key with the `.stacktrace` modifier (`stack.stacktrace`).

mod common;

#[path = "common/sched_switch.rs"]
mod sched_events;
use sched_events::sched_switch;

/// Where a task "blocks": the switch away from it (next_pid is the task, in the document's
/// first trigger) is recorded here, so the saved stack starts in this function.
#[no_mangle]
#[inline(never)]
pub extern "C" fn block_lat_blocks(pid: i32) {
    sched_switch::trace("worker", 0, 120, 2, "task", std::hint::black_box(pid), 120);
}

/// The switch back: `prev_pid` is the task, and its latency is computed here.
#[no_mangle]
#[inline(never)]
pub extern "C" fn block_lat_wakes(pid: i32) {
    sched_switch::trace("task", std::hint::black_box(pid), 120, 0, "worker", 0, 120);
}

#[test]
fn a_saved_stack_reaches_the_synthetic_event_and_keys_its_histogram() {
    if common::read("synthetic_events").is_err() {
        println!("skipped: no synthetic_events file");
        return;
    }
    let write = |p: &str, t: &str| common::write(p, t).unwrap_or_else(|e| panic!("{p}: {e}"));
    let append = |p: &str, t: &str| common::append(p, t).unwrap_or_else(|e| panic!("{p}: {e}"));
    write(
        "dynamic_events",
        "s:block_lat pid_t pid; u64 delta; unsigned long[] stack;\n",
    );
    append(
        "events/sched/sched_switch/trigger",
        "hist:keys=next_pid:ts=common_timestamp.usecs,st=common_stacktrace  if prev_state == 2\n",
    );
    append(
        "events/sched/sched_switch/trigger",
        "hist:keys=prev_pid:delta=common_timestamp.usecs-$ts,s=$st:onmax($delta).trace(block_lat,prev_pid,$delta,$s)\n",
    );
    write(
        "events/synthetic/block_lat/trigger",
        "hist:keys=delta.buckets=100,stack.stacktrace:sort=delta\n",
    );
    write("events/synthetic/block_lat/enable", "1\n");
    write("trace", "");
    // Each latency longer than the last, so onmax() traces every one.
    for (i, pid) in [4101, 4102, 4103].into_iter().enumerate() {
        block_lat_blocks(pid);
        std::thread::sleep(std::time::Duration::from_millis(1 + 2 * i as u64));
        block_lat_wakes(pid);
    }
    let trace = common::read("trace").unwrap();
    let hist = common::read("events/synthetic/block_lat/hist").unwrap();
    write("events/synthetic/block_lat/enable", "0\n");
    write(
        "events/synthetic/block_lat/trigger",
        "!hist:keys=delta.buckets=100,stack.stacktrace:sort=delta\n",
    );
    write(
        "events/sched/sched_switch/trigger",
        "!hist:keys=prev_pid:delta=common_timestamp.usecs-$ts,s=$st:onmax($delta).trace(block_lat,prev_pid,$delta,$s)\n",
    );
    write(
        "events/sched/sched_switch/trigger",
        "!hist:keys=next_pid:ts=common_timestamp.usecs,st=common_stacktrace if prev_state == 2\n",
    );
    write("dynamic_events", "");

    // The trace: one block_lat per task, its saved stack printed under it, starting where
    // the task blocked (not where it woke). The kernel's `print_synth_event` prints each
    // frame as `=> %pS` at the start of the line (histogram.rst's example, indented by two
    // like all its shell output, shows `  => __schedule+0x448/0x7b0`); the leading blank of
    // ` => ` is the `kernel_stack` entries' format, not this one.
    let records: Vec<&str> = trace.split("block_lat: ").skip(1).collect();
    assert_eq!(records.len(), 3, "{trace}");
    for (rec, pid) in records.iter().zip([4101, 4102, 4103]) {
        let head = rec.lines().next().unwrap();
        assert!(
            head.starts_with(&format!("pid={pid} delta=")) && head.ends_with(" stack=STACK:"),
            "{head}"
        );
        let frames: Vec<&str> = rec
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("=> "))
            .collect();
        assert!(
            frames.iter().any(|f| f.contains("block_lat_blocks")),
            "{rec}"
        );
        assert!(
            !frames.iter().any(|f| f.contains("block_lat_wakes")),
            "{rec}"
        );
    }

    // The histogram: the document's trigger info, and keys whose second part is the stack,
    // its first frame on the key line and the rest indented below.
    assert!(
        hist.contains(
            "# trigger info: hist:keys=delta.buckets=100,stack.stacktrace:vals=hitcount:sort=delta.buckets=100:size=2048 [active]\n"
        ),
        "{hist}"
    );
    let entries: Vec<&str> = hist.split("{ delta: ~ ").skip(1).collect();
    assert_eq!(entries.len(), 3, "{hist}");
    for entry in entries {
        let (range, rest) = entry.split_once(", stack.stacktrace ").expect("stack key");
        let (lo, hi) = range.split_once('-').expect("bucket range");
        let (lo, hi): (u64, u64) = (lo.parse().unwrap(), hi.parse().unwrap());
        assert!(lo % 100 == 0 && hi == lo + 99, "{range}");
        let (stack, count) = rest.split_once("} hitcount:").expect("entry end");
        assert_eq!(count.split_whitespace().next(), Some("1"), "{entry}");
        assert!(stack.contains("block_lat_blocks"), "{entry}");
        assert!(
            stack.lines().skip(1).all(|l| l.starts_with("         ")),
            "{entry}"
        );
    }
    assert!(hist.contains("Hits: 3\n"), "{hist}");
}
