//! Any bytes written to any tracefs control file: an error or success, never a panic, a
//! hang or unbounded memory. The first byte picks the file, the second the open mode and
//! the shape of the value, so that the inputs of the hardening issue come up often: huge
//! numbers, writes of 4096 bytes and more, NULs inside the text, instance names around the
//! 255-byte limit, `:mod:` words and cpumask chunks. Setup-file lines (`USTRACE_SETUP`)
//! are parsed too.
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
    "tracing_cpumask",
    "trace_clock",
    "trace_options",
    "options/raw",
    "options/event-fork",
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

/// Files of the top instance only.
const TOP_ONLY: &[&str] = &["dynamic_events", "saved_cmdlines_size"];

/// `body` repeated (or cut) to `len` bytes; a run of `fill` when `body` is empty.
fn stretch(body: &[u8], len: usize, fill: u8) -> Vec<u8> {
    if body.is_empty() {
        return vec![fill; len];
    }
    body.iter().copied().cycle().take(len).collect()
}

/// The value to write, shaped by `shape` from the input's body.
fn value(shape: u8, body: &[u8]) -> Vec<u8> {
    let seed = body.first().copied().unwrap_or(0) as usize;
    match shape {
        // A number far past any limit: 11 to 40 digits, maybe with a newline.
        1 => {
            let digits: Vec<u8> = stretch(body, 11 + seed % 30, b'9')
                .into_iter()
                .map(|b| b'0' + b % 10)
                .collect();
            [digits, b"\n".to_vec()].concat()
        }
        // A write at and past the kernel's 4096-byte limits.
        2 => stretch(body, 4095 + seed % 4, b' '),
        3 => stretch(body, 4096 + seed * 32, b'a'),
        // NULs inside the text.
        4 => body
            .iter()
            .enumerate()
            .flat_map(|(i, &b)| if i % 3 == 1 { vec![0, b] } else { vec![b] })
            .collect(),
        // A `:mod:` word.
        5 => [b":mod:".as_ref(), body].concat(),
        // Cpumask-like chunks.
        6 => body
            .iter()
            .map(|&b| match b % 4 {
                0 => b',',
                1 => b'f',
                2 => b'0' + b % 10,
                _ => b' ',
            })
            .collect(),
        _ => body.to_vec(),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let fs = ustrace::tracefs();
    let body = &data[2..];
    let shape = (data[1] >> 2) & 7;

    // Setup-file lines: parsed only (running them would write anywhere).
    for line in String::from_utf8_lossy(body).lines() {
        let _ = ustrace::setup::parse_line(line);
    }

    // Instance names near NAME_MAX, and any bytes.
    if shape == 7 {
        let len = 250 + (data[0] as usize % 10);
        let name: String = String::from_utf8_lossy(&stretch(body, len, b'n'))
            .chars()
            .take(len)
            .collect();
        let path = format!("instances/{name}");
        if fs.mkdir(&path).is_ok() {
            let _ = fs.stat(&format!("{path}/tracing_cpumask"));
            fs.rmdir(&path)
                .expect("an instance just made can be removed");
        }
        return;
    }

    let file = FILES[data[0] as usize % FILES.len()];
    let path = if TOP_ONLY.contains(&file) {
        file.to_string()
    } else {
        format!("instances/fuzz/{file}")
    };
    let _ = fs.mkdir("instances/fuzz");
    let flags = if data[1] & 1 == 0 {
        OpenFlags::TRUNCATE
    } else {
        OpenFlags::APPEND
    };
    if let Ok(mut file) = fs.open(&path, flags) {
        let _ = file.write(&value(shape, body));
    }
    // Fire the event so filters, triggers and eprobes written above run on a record.
    ev::trace(data.len() as u64, "fuzz");
    let _ = fs.open(&path, OpenFlags::READ).map(|mut f| {
        let mut buf = [0u8; 4096];
        while matches!(f.read(&mut buf, Some(std::time::Duration::ZERO)), Ok(n) if n > 0) {}
    });
    // Keep state from growing across runs.
    if data[1] & 2 != 0 {
        let _ = fs
            .open("instances/fuzz/events/enable", OpenFlags::TRUNCATE)
            .map(|mut f| f.write(b"0"));
        let _ = fs.open("dynamic_events", OpenFlags::TRUNCATE);
        let _ = fs.open("instances/fuzz/trace", OpenFlags::TRUNCATE);
        let _ = fs
            .open("saved_cmdlines_size", OpenFlags::TRUNCATE)
            .map(|mut f| f.write(b"128"));
    }
});
