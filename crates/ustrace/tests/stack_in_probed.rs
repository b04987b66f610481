//! A stack recorded inside a function whose return is probed: the `stacktrace` trigger walks
//! through the hooked return slot, shows the real callers, and the function's `%return` event
//! still fires (the stack walk used to forget the hooked frames of its thread).

mod common;

use common::{append, body_lines, read, write};

ustrace::trace_event! {
    /// Fired inside the probed function, with a `stacktrace` trigger on it.
    pub fn stackprobe::inside(n: u64) {
        n: u64 = n,
    }
    print "n=%llu", n;
}

/// The probed function: its body fires `inside`, whose trigger records a stack.
#[no_mangle]
#[inline(never)]
pub extern "C" fn stack_probed_work(n: u64) -> u64 {
    inside::trace(std::hint::black_box(n));
    n * 3
}

/// Its caller, so the stack has a known frame above the probed one.
#[no_mangle]
#[inline(never)]
pub extern "C" fn stack_probed_caller(n: u64) -> u64 {
    std::hint::black_box(stack_probed_work(std::hint::black_box(n))) + 1
}

#[test]
fn a_stack_recorded_in_a_probed_function_keeps_its_return_event() {
    append(
        "dynamic_events",
        "f:sp/work stack_probed_work n=$arg1\nf:sp/work_ret stack_probed_work%return ret=$retval\n",
    )
    .unwrap();
    write("events/stackprobe/inside/trigger", "stacktrace\n").unwrap();
    write("events/stackprobe/inside/enable", "1\n").unwrap();
    write("events/sp/enable", "1\n").unwrap();
    write("trace", "").unwrap();
    for n in 1..=3 {
        assert_eq!(stack_probed_caller(n), n * 3 + 1);
    }
    write("events/sp/enable", "0\n").unwrap();
    write("events/stackprobe/inside/enable", "0\n").unwrap();
    let lines = body_lines(&read("trace").unwrap());
    write("events/stackprobe/inside/trigger", "!stacktrace\n").unwrap();
    write("dynamic_events", "").unwrap();

    let count = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(count(" work: "), 3, "{lines:#?}");
    assert_eq!(count(" inside: "), 3, "{lines:#?}");
    assert_eq!(count(" work_ret: "), 3, "{lines:#?}");
    assert_eq!(count("<stack trace>"), 3, "{lines:#?}");
    // Each stack names the probed function and, through its hooked return, its caller.
    let frames: Vec<&String> = lines.iter().filter(|l| l.contains("=> ")).collect();
    let work = frames
        .iter()
        .filter(|l| l.contains("stack_probed_work"))
        .count();
    let caller = frames
        .iter()
        .filter(|l| l.contains("stack_probed_caller"))
        .count();
    assert_eq!((work, caller), (3, 3), "{lines:#?}");
    for n in 1..=3 {
        let ret = format!("ret={}", n * 3);
        assert!(
            lines
                .iter()
                .any(|l| l.contains(" work_ret: ") && l.contains(&ret)),
            "{ret}: {lines:#?}"
        );
    }
}
