//! The record paths of a filtered event, end to end: the filter-only path (record built on
//! the stack, filter run inline) and the general one it hands larger records to, with a
//! signal handler that traces while a record is being built, a filter on `common_pid`, and
//! records too large for the stack buffer.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use ustrace::event::{FieldKind, FieldValue};
use ustrace::FileSystem;

/// A `u64` field whose write raises `SIGUSR1` once armed, so the handler traces while the
/// record holding it is half built.
#[derive(Clone, Copy)]
struct Reenter(u64);

static ARMED: AtomicBool = AtomicBool::new(false);

impl FieldValue for Reenter {
    const C_TYPE: &'static str = "u64";
    const SIZE: usize = 8;
    const ALIGN: usize = 8;
    const SIGNED: bool = false;
    const KIND: FieldKind = FieldKind::Int;
    fn write(&self, fixed: &mut [u8], _dynamic: &mut [u8], _dyn_offset: usize) {
        fixed.copy_from_slice(&self.0.to_ne_bytes());
        if ARMED.swap(false, Ordering::SeqCst) {
            // SAFETY: raising a signal of our own; its handler is installed by the test.
            unsafe { libc::raise(libc::SIGUSR1) };
        }
    }
}

ustrace::trace_event! {
    pub fn trecpath::outer(v: u64, w: u64) {
        v: Reenter = Reenter(v),
        w: u64 = w,
    }
    print "v=%llu w=%llu", v, w;
}

ustrace::trace_event! {
    pub fn trecpath::inner(x: u64) {
        x: u64 = x,
    }
    print "x=%llu", x;
}

ustrace::trace_event! {
    pub fn trecpath::wide(v: u64, name: &str) {
        v: u64 = v,
        name: &str = name,
    }
    print "v=%llu name=%s", v, name;
}

extern "C" fn trace_from_handler(_sig: i32) {
    inner::trace(7);
    inner::trace(1);
    // The same event as the interrupted record, through the same event file.
    outer::trace(6, 60);
    outer::trace(1, 60);
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Instance(
    String,
    #[allow(dead_code)] std::sync::MutexGuard<'static, ()>,
);

impl Instance {
    fn new(name: &str) -> Instance {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let _ = ustrace::tracefs().rmdir(&format!("instances/{name}"));
        ustrace::tracefs()
            .mkdir(&format!("instances/{name}"))
            .unwrap();
        Instance(name.to_string(), guard)
    }
    fn write(&self, p: &str, text: &str) {
        common::write(&format!("instances/{}/{p}", self.0), text).unwrap();
    }
    /// The trace lines, each cut to the event's name and fields.
    fn events(&self) -> Vec<String> {
        let trace = common::read(&format!("instances/{}/trace", self.0)).unwrap();
        common::body_lines(&trace)
            .iter()
            .map(|l| {
                l.split_once(": ")
                    .map_or(l.as_str(), |(_, e)| e)
                    .to_string()
            })
            .collect()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = ustrace::tracefs().rmdir(&format!("instances/{}", self.0));
    }
}

/// A handler that traces while this thread is building a filtered record gets records of
/// its own, filtered as usual, and the interrupted record comes out whole.
#[test]
fn a_signal_handler_tracing_mid_record_leaves_both_records_whole() {
    let t = Instance::new("recpath-signal");
    t.write("events/trecpath/outer/filter", "v != 1 && w != 0\n");
    t.write("events/trecpath/inner/filter", "x != 1\n");
    t.write("events/trecpath/outer/enable", "1\n");
    t.write("events/trecpath/inner/enable", "1\n");
    // SAFETY: installs a plain function as the handler; it only traces, which takes no lock.
    let old = unsafe {
        libc::signal(
            libc::SIGUSR1,
            trace_from_handler as extern "C" fn(i32) as libc::sighandler_t,
        )
    };
    ARMED.store(true, Ordering::SeqCst);
    outer::trace(5, 50);
    ARMED.store(true, Ordering::SeqCst);
    outer::trace(1, 10);
    // SAFETY: puts back the handler that was there before.
    unsafe { libc::signal(libc::SIGUSR1, old) };
    assert!(!ARMED.load(Ordering::SeqCst), "the handler did not run");
    assert_eq!(
        t.events(),
        [
            "inner: x=7",
            "outer: v=6 w=60",
            "outer: v=5 w=50",
            "inner: x=7",
            "outer: v=6 w=60",
        ]
    );
}

/// The filter-only path fills in the thread id before the filter runs.
#[test]
fn a_filter_on_common_pid_sees_the_recording_thread() {
    let t = Instance::new("recpath-pid");
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    t.write("events/trecpath/inner/enable", "1\n");
    t.write(
        "events/trecpath/inner/filter",
        &format!("common_pid == {tid} && x > 2\n"),
    );
    inner::trace(3);
    inner::trace(2);
    t.write(
        "events/trecpath/inner/filter",
        &format!("common_pid != {tid}\n"),
    );
    inner::trace(4);
    assert_eq!(t.events(), ["inner: x=3"]);
}

/// Records larger than the stack buffer take the general path and are filtered the same.
#[test]
fn records_larger_than_the_stack_buffer_are_filtered_too() {
    let t = Instance::new("recpath-wide");
    let long = "k".repeat(200);
    t.write("events/trecpath/wide/enable", "1\n");
    t.write("events/trecpath/wide/filter", "v > 1\n");
    wide::trace(1, &long);
    wide::trace(2, &long);
    wide::trace(3, "short");
    wide::trace(0, "short");
    t.write("events/trecpath/wide/filter", "name ~ \"k*\"\n");
    wide::trace(4, &long);
    wide::trace(5, "short");
    let events = t.events();
    assert_eq!(
        events,
        [
            format!("wide: v=2 name={long}"),
            "wide: v=3 name=short".to_string(),
            format!("wide: v=4 name={long}"),
        ]
    );
}
