//! Any bytes written to any tracefs control file: an error or success, never a panic, a
//! hang or unbounded memory. The first byte picks the file, the second the open mode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace::{FileSystem, OpenFlags};

ustrace::trace_event! {
    pub fn fuzzsys::ev(a: u64, s: &str) {
        a: u64 = a,
        s: &str = s,
    }
    print "a=%llu s=%s", a, s;
}

const FILES: &[&str] = &[
    "set_event",
    "events/enable",
    "events/fuzzsys/enable",
    "events/fuzzsys/filter",
    "events/fuzzsys/ev/enable",
    "events/fuzzsys/ev/filter",
    "events/fuzzsys/ev/trigger",
    "events/ftrace/print/trigger",
    "set_event_pid",
    "set_event_notrace_pid",
    "tracing_on",
    "trace_clock",
    "trace_options",
    "options/raw",
    "trace_marker",
    "snapshot",
    "buffer_size_kb",
    "per_cpu/cpu0/buffer_size_kb",
    "free_buffer",
    "current_tracer",
    "saved_cmdlines_size",
    "error_log",
    "trace",
    "dynamic_events",
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let path = format!("instances/fuzz/{}", FILES[data[0] as usize % FILES.len()]);
    let path = if path.ends_with("dynamic_events") { "dynamic_events".to_string() } else { path };
    let fs = ustrace::tracefs();
    let _ = fs.mkdir("instances/fuzz");
    let flags = if data[1] & 1 == 0 { OpenFlags::TRUNCATE } else { OpenFlags::APPEND };
    if let Ok(mut file) = fs.open(&path, flags) {
        let _ = file.write(&data[2..]);
    }
    // Fire the event so filters, triggers and eprobes written above run on a record.
    ev::trace(data.len() as u64, "fuzz");
    let _ = fs.open(&path, OpenFlags::READ).map(|mut f| {
        let mut buf = [0u8; 4096];
        while matches!(f.read(&mut buf, Some(std::time::Duration::ZERO)), Ok(n) if n > 0) {}
    });
    // Keep state from growing across runs.
    if data[1] & 2 != 0 {
        let _ = fs.open("instances/fuzz/events/enable", OpenFlags::TRUNCATE).map(|mut f| f.write(b"0"));
        let _ = fs.open("dynamic_events", OpenFlags::TRUNCATE);
        let _ = fs.open("instances/fuzz/trace", OpenFlags::TRUNCATE);
    }
});
