//! The function commands of `set_ftrace_filter` (ftrace.rst, "Filter commands"): each one's
//! effect when its function runs (with no function tracer set), its listing, its removal
//! with `!`, and the kernel's errors.

mod common;

use std::sync::{Mutex, MutexGuard};

use ustrace::Errno;

ustrace::trace_event! {
    pub fn fcsys::fcev(v: u64) {
        v: u64 = v,
    }
    print "v=%llu", v;
}

/// Commands act on shared state (tracing_on of the top instance): one test at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

macro_rules! probe_fn {
    ($($name:ident),*) => {$(
        #[inline(never)]
        #[no_mangle]
        pub extern "C" fn $name(x: u64) -> u64 {
            std::hint::black_box(x.wrapping_add(1))
        }
    )*};
}
probe_fn!(fc_off, fc_on, fc_snap, fc_stack, fc_en, fc_dis, fc_inst, fc_other);

#[inline(never)]
#[no_mangle]
pub extern "C" fn fc_stack_caller(x: u64) -> u64 {
    std::hint::black_box(fc_stack(x)) + 1
}

fn filter_lines(prefix: &str) -> Vec<String> {
    common::read(&format!("{prefix}set_ftrace_filter"))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("fc_"))
        .map(String::from)
        .collect()
}

/// `echo WORDS > FILE`: with the newline that ends the last word, so its error is the
/// write's (a word still open at close is applied there, where errors are lost, as on the
/// kernel).
fn echo(file: &str, words: &str) -> Result<(), Errno> {
    common::write(file, &format!("{words}\n"))
}

/// `echo WORDS >> FILE`.
fn echo_append(file: &str, words: &str) -> Result<(), Errno> {
    common::append(file, &format!("{words}\n"))
}

fn tracing_on() -> bool {
    common::read("tracing_on").unwrap() == "1\n"
}

#[test]
fn traceoff_unlimited_turns_tracing_off_until_removed() {
    let _g = serial();
    common::write("tracing_on", "1").unwrap();
    echo("set_ftrace_filter", "fc_off:traceoff").unwrap();
    assert_eq!(filter_lines(""), ["fc_off:traceoff:unlimited"]);
    // The function set itself is untouched.
    assert!(common::read("set_ftrace_filter")
        .unwrap()
        .starts_with("#### all functions enabled ####\n"));
    assert!(tracing_on());
    fc_off(1);
    assert!(!tracing_on());
    common::write("tracing_on", "1").unwrap();
    fc_off(2);
    assert!(!tracing_on(), "unlimited: every hit");
    // A truncating open of set_ftrace_filter keeps the commands, as the kernel's probes.
    echo("set_ftrace_filter", "").unwrap();
    assert_eq!(filter_lines(""), ["fc_off:traceoff:unlimited"]);
    // `!` with a count names the counted kind, which is not there.
    assert_eq!(
        echo("set_ftrace_filter", "!fc_off:traceoff:0"),
        Err(Errno::EINVAL)
    );
    echo("set_ftrace_filter", "!fc_off:traceoff").unwrap();
    assert!(filter_lines("").is_empty());
    common::write("tracing_on", "1").unwrap();
    fc_off(3);
    assert!(tracing_on(), "removed");
}

#[test]
fn traceon_count_is_spent_only_when_it_changes_the_state() {
    let _g = serial();
    echo("set_ftrace_filter", "fc_on:traceon:2").unwrap();
    assert_eq!(filter_lines(""), ["fc_on:traceon:count=2"]);
    common::write("tracing_on", "0").unwrap();
    fc_on(1);
    assert!(tracing_on());
    assert_eq!(filter_lines(""), ["fc_on:traceon:count=1"]);
    fc_on(2);
    assert_eq!(filter_lines(""), ["fc_on:traceon:count=1"], "already on");
    common::write("tracing_on", "0").unwrap();
    fc_on(3);
    assert!(tracing_on());
    assert_eq!(filter_lines(""), ["fc_on:traceon:count=0"]);
    common::write("tracing_on", "0").unwrap();
    fc_on(4);
    assert!(!tracing_on(), "count spent");
    // Appending the same command again adds nothing: the kernel's EINVAL.
    assert_eq!(
        echo_append("set_ftrace_filter", "fc_on:traceon:5"),
        Err(Errno::EINVAL)
    );
    echo("set_ftrace_filter", "!fc_on:traceon:0").unwrap();
    assert!(filter_lines("").is_empty());
    common::write("tracing_on", "1").unwrap();
}

#[test]
fn snapshot_once_copies_the_buffer() {
    let _g = serial();
    let t = "instances/fc-snap/";
    let fs = ustrace::tracefs();
    use ustrace::FileSystem;
    let _ = fs.rmdir("instances/fc-snap");
    fs.mkdir("instances/fc-snap").unwrap();
    echo(&format!("{t}set_ftrace_filter"), "fc_snap:snapshot:1").unwrap();
    assert_eq!(filter_lines(t), ["fc_snap:snapshot:count=1"]);
    common::write(&format!("{t}trace_marker"), "before the snapshot").unwrap();
    fc_snap(1);
    assert_eq!(filter_lines(t), ["fc_snap:snapshot:count=0"]);
    let snap = common::read(&format!("{t}snapshot")).unwrap();
    assert!(snap.contains("before the snapshot"), "{snap}");
    common::write(&format!("{t}trace_marker"), "after the snapshot").unwrap();
    fc_snap(2);
    let snap = common::read(&format!("{t}snapshot")).unwrap();
    assert!(!snap.contains("after the snapshot"), "count spent: {snap}");
    // The top instance has no such command.
    assert!(filter_lines("").is_empty());
    echo(&format!("{t}set_ftrace_filter"), "!fc_snap:snapshot:0").unwrap();
    assert!(filter_lines(t).is_empty());
    fs.rmdir("instances/fc-snap").unwrap();
}

#[test]
fn stacktrace_records_the_function_and_its_callers() {
    let _g = serial();
    let fs = ustrace::tracefs();
    use ustrace::FileSystem;
    let t = "instances/fc-stack/";
    let _ = fs.rmdir("instances/fc-stack");
    fs.mkdir("instances/fc-stack").unwrap();
    echo(&format!("{t}set_ftrace_filter"), "fc_stack:stacktrace").unwrap();
    assert_eq!(filter_lines(t), ["fc_stack:stacktrace:unlimited"]);
    fc_stack_caller(1);
    let trace = common::read(&format!("{t}trace")).unwrap();
    let lines = common::body_lines(&trace);
    assert!(lines[0].ends_with(": <stack trace>"), "{trace}");
    assert_eq!(lines[1], " => fc_stack", "{trace}");
    assert!(lines[2].starts_with(" => fc_stack_caller"), "{trace}");
    // Not while tracing is off.
    common::write(&format!("{t}tracing_on"), "0").unwrap();
    common::write(&format!("{t}trace"), "").unwrap();
    fc_stack_caller(2);
    common::write(&format!("{t}tracing_on"), "1").unwrap();
    assert!(common::body_lines(&common::read(&format!("{t}trace")).unwrap()).is_empty());
    echo(&format!("{t}set_ftrace_filter"), "!fc_stack:stacktrace").unwrap();
    fc_stack_caller(3);
    assert!(common::body_lines(&common::read(&format!("{t}trace")).unwrap()).is_empty());
    fs.rmdir("instances/fc-stack").unwrap();
}

#[test]
fn enable_and_disable_event_switch_the_event_in_soft_mode() {
    let _g = serial();
    let fs = ustrace::tracefs();
    use ustrace::FileSystem;
    let t = "instances/fc-ev/";
    let _ = fs.rmdir("instances/fc-ev");
    fs.mkdir("instances/fc-ev").unwrap();
    let filter = format!("{t}set_ftrace_filter");
    let enable = format!("{t}events/fcsys/fcev/enable");
    echo(&filter, "fc_en:enable_event:fcsys:fcev:1").unwrap();
    echo_append(&filter, "fc_dis:disable_event:fcsys:fcev").unwrap();
    // Newest first, as the kernel lists its probes.
    assert_eq!(
        filter_lines(t),
        [
            "fc_dis:disable_event:fcsys:fcev:unlimited",
            "fc_en:enable_event:fcsys:fcev:count=1"
        ]
    );
    assert_eq!(common::read(&enable).unwrap(), "0*\n");
    fcev::trace(1);
    fc_en(0);
    fcev::trace(2);
    fc_dis(0);
    fcev::trace(3);
    fc_en(0);
    fcev::trace(4);
    let body = common::body_lines(&common::read(&format!("{t}trace")).unwrap());
    let seen: Vec<&str> = body
        .iter()
        .filter_map(|l| l.rsplit("fcev: ").next())
        .collect();
    assert_eq!(seen, ["v=2"], "count 1: enabled once");
    assert_eq!(
        filter_lines(t),
        [
            "fc_dis:disable_event:fcsys:fcev:unlimited",
            "fc_en:enable_event:fcsys:fcev:count=0"
        ]
    );
    // The kernel allows one event command of a kind per function, whatever the event.
    assert_eq!(
        echo_append(&filter, "fc_en:enable_event:fcsys:fcev:3"),
        Err(Errno::EINVAL)
    );
    echo_append(&filter, "!fc_en:enable_event:fcsys:fcev:0").unwrap();
    echo_append(&filter, "!fc_dis:disable_event:fcsys:fcev").unwrap();
    assert!(filter_lines(t).is_empty());
    assert_eq!(common::read(&enable).unwrap(), "0\n", "soft mode released");
    fs.rmdir("instances/fc-ev").unwrap();
}

#[test]
fn bad_commands_fail_like_the_kernel() {
    let _g = serial();
    let bad = [
        ("set_ftrace_filter", "fc_other:nosuchcmd"),
        ("set_ftrace_filter", "fc_no_such_function_*:traceon"),
        ("set_ftrace_filter", "fc_other:traceon:abc"),
        ("set_ftrace_filter", "fc_other:enable_event"),
        ("set_ftrace_filter", "fc_other:enable_event:fcsys"),
        ("set_ftrace_filter", "fc_other:enable_event:fcsys:nosuch"),
        ("set_ftrace_filter", "fc_other:enable_event:fcsys:fcev:"),
        ("set_ftrace_filter", "!fc_other:traceoff"),
        ("set_ftrace_notrace", "fc_other:traceoff"),
    ];
    for (file, word) in bad {
        assert_eq!(
            echo_append(file, word),
            Err(Errno::EINVAL),
            "{file}: {word}"
        );
    }
    assert!(filter_lines("").is_empty());
    // `func:traceon:` (an empty count) is taken, with the kernel's count of -1: it never fires.
    common::write("tracing_on", "0").unwrap();
    echo_append("set_ftrace_filter", "fc_other:traceon:").unwrap();
    assert_eq!(filter_lines(""), ["fc_other:traceon:count=-1"]);
    fc_other(1);
    assert!(!tracing_on());
    echo_append("set_ftrace_filter", "!fc_other:traceon:").unwrap();
    common::write("tracing_on", "1").unwrap();
}

#[test]
fn a_glob_puts_one_command_on_each_function_and_removal_takes_a_glob() {
    let _g = serial();
    let fs = ustrace::tracefs();
    use ustrace::FileSystem;
    let t = "instances/fc-glob/";
    let _ = fs.rmdir("instances/fc-glob");
    fs.mkdir("instances/fc-glob").unwrap();
    let filter = format!("{t}set_ftrace_filter");
    echo(&filter, "fc_in*:traceoff fc_ot*:traceoff").unwrap();
    let mut lines = filter_lines(t);
    lines.sort();
    assert_eq!(
        lines,
        ["fc_inst:traceoff:unlimited", "fc_other:traceoff:unlimited"]
    );
    fc_inst(1);
    assert_eq!(common::read(&format!("{t}tracing_on")).unwrap(), "0\n");
    assert!(tracing_on(), "another instance's command");
    echo_append(&filter, "!fc_i*:traceoff").unwrap();
    assert_eq!(filter_lines(t), ["fc_other:traceoff:unlimited"]);
    echo_append(&filter, "!*:traceoff").unwrap();
    assert!(filter_lines(t).is_empty());
    fs.rmdir("instances/fc-glob").unwrap();
}
