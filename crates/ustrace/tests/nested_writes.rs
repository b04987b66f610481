//! A probe on a function that the ring buffer's own writer calls — `clock_gettime`, which a
//! reservation calls for every clock but the TSC — records into the very buffer whose
//! reservation is under way. That nested record must not make the outer writer start over
//! forever: each attempt would call the clock again, meet the probe again, and lose its
//! place again (a livelock that hung any program with `trace_clock global` and a probe on
//! `clock_gettime`, and `ustrace demo` under `function_graph` of every function).

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::{append, body_lines, read, write};
use ustrace::FileSystem;

/// Runs `f` on a thread of its own; fails the test if it has not returned within a minute
/// (the thread is left behind: a livelock cannot be stopped from outside).
fn finishes(what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(60)).is_ok(),
        "{what} did not finish within 60 s: the writer keeps starting over"
    );
}

fn now() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
}

#[test]
fn an_event_on_the_clock_does_not_starve_the_writers_that_read_it() {
    ustrace::tracefs().mkdir("instances/nest").unwrap();
    write("instances/nest/trace_clock", "global\n").unwrap();
    append("dynamic_events", "f:nest/clock clock_gettime\n").unwrap();
    write("instances/nest/events/nest/clock/enable", "1\n").unwrap();
    now();
    finishes("a trace_marker write", || {
        for i in 0..100 {
            write("instances/nest/trace_marker", &format!("mark {i}\n")).unwrap();
        }
    });
    write("instances/nest/events/nest/clock/enable", "0\n").unwrap();
    let trace = read("instances/nest/trace").unwrap();
    let lines = body_lines(&trace);
    let marks = lines.iter().filter(|l| l.contains(": mark ")).count();
    assert_eq!(marks, 100, "{trace}");
    // Each marker write read the clock at least once, with the probe on it.
    let clocks = lines.iter().filter(|l| l.contains(" clock: (")).count();
    assert!(clocks >= 100, "{clocks} clock events: {trace}");
}

#[test]
fn the_function_tracer_on_the_clock_does_not_starve_the_writers_that_read_it() {
    ustrace::tracefs().mkdir("instances/nestfn").unwrap();
    write("instances/nestfn/trace_clock", "mono\n").unwrap();
    write("instances/nestfn/set_ftrace_filter", "clock_gettime*\n").unwrap();
    write("instances/nestfn/current_tracer", "function\n").unwrap();
    now();
    finishes("a trace_marker write", || {
        for i in 0..100 {
            write("instances/nestfn/trace_marker", &format!("mark {i}\n")).unwrap();
        }
    });
    write("instances/nestfn/current_tracer", "nop\n").unwrap();
    let trace = read("instances/nestfn/trace").unwrap();
    let lines = body_lines(&trace);
    let marks = lines.iter().filter(|l| l.contains(": mark ")).count();
    assert_eq!(marks, 100, "{trace}");
    let calls = lines.iter().filter(|l| l.contains("clock_gettime")).count();
    assert!(calls >= 100, "{calls} clock_gettime calls: {trace}");
}
