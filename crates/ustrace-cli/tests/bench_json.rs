//! `ustrace bench --json` is an interface: every name the issues define is
//! printed, one JSON object per line, with its figures and the name of its
//! baseline loop; `--filter` picks figures by exact name or glob and refuses a
//! filter that names nothing (tiny iteration counts here: this checks the
//! shape and the selection, never the speed).

use std::process::Command;

const NAMES: [&str; 19] = [
    "tracepoint_off",
    "tracepoint_off_load",
    "tracepoint_noop_probe",
    "event_3ints",
    "event_string16",
    "event_soft_disabled",
    "filter_reject_3preds",
    "ring_buffer_write_32b",
    "ring_buffer_write_32b_2threads",
    "fprobe_entry",
    "fprobe_entry_exit",
    "fprobe_event_2args",
    "eprobe_on_event",
    "hist_update_1key",
    "hist_update_1key_2threads",
    "clock_local_read",
    "tracing_event_off",
    "tracing_event_3fields",
    "synth_onmatch_pair",
];

#[test]
fn bench_json_prints_every_named_figure() {
    let out = Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .args([
            "bench",
            "--json",
            "--iterations",
            "2000",
            "--repetitions",
            "1",
        ])
        .output()
        .expect("run ustrace bench");
    assert!(
        out.status.success(),
        "ustrace bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    for name in NAMES {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{{\"name\": \"{name}\",")))
            .unwrap_or_else(|| panic!("no line for {name} in:\n{text}"));
        for field in ["\"ns_per_op\": ", "\"baseline_ns_per_op\": ", "\"ratio\": "] {
            let at = line
                .find(field)
                .unwrap_or_else(|| panic!("{name}: no {field} in {line}"));
            let value: String = line[at + field.len()..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let v: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {field} is not a number in {line}"));
            assert!(v.is_finite() && v >= 0.0, "{name}: {field}{v}");
        }
        let baseline = baseline_of(line);
        assert!(
            [
                "add_loop",
                "call_loop",
                "index_loop",
                "index_loop_2threads",
                "tracing_no_subscriber"
            ]
            .contains(&baseline),
            "{name}: baseline {baseline:?} in {line}"
        );
        assert!(line.ends_with('}'), "{line}");
    }
    let scaling = text
        .lines()
        .find(|l| l.contains("\"ring_buffer_write_32b_2threads\""))
        .unwrap();
    assert!(scaling.contains("\"scaling\": "), "{scaling}");
    let beside = text
        .lines()
        .find(|l| l.contains("\"tracing_event_3fields\""))
        .unwrap();
    assert!(beside.contains("\"fmt_layer_ns\": "), "{beside}");
}

/// The `"baseline": "..."` of one JSON line.
fn baseline_of(line: &str) -> &str {
    let field = "\"baseline\": \"";
    let at = line
        .find(field)
        .unwrap_or_else(|| panic!("no {field} in {line}"))
        + field.len();
    &line[at..at + line[at..].find('"').unwrap()]
}

fn bench_json(filter: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .args([
            "bench",
            "--json",
            "--iterations",
            "1000",
            "--repetitions",
            "1",
            "--filter",
            filter,
        ])
        .output()
        .expect("run ustrace bench")
}

fn names_printed(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let rest = l
                .strip_prefix("{\"name\": \"")
                .unwrap_or_else(|| panic!("not a figure: {l}"));
            rest[..rest.find('"').unwrap()].to_string()
        })
        .collect()
}

/// Each name, given to `--filter`, prints that figure and no other.
#[test]
fn filter_by_each_name_prints_exactly_that_figure() {
    for name in NAMES {
        let out = bench_json(name);
        assert!(
            out.status.success(),
            "--filter {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(names_printed(&out), [name], "--filter {name}");
    }
    let out = bench_json("fprobe*");
    assert!(out.status.success());
    assert_eq!(
        names_printed(&out),
        [
            "fprobe_entry",
            "fprobe_entry_exit",
            "fprobe_trampoline_floor",
            "fprobe_trampoline_floor_exit",
            "fprobe_event_2args"
        ]
    );
}

/// A filter that matches nothing is a mistake to report, not an empty success.
#[test]
fn filter_matching_nothing_fails_and_lists_the_names() {
    for filter in ["fprobe", "nosuch", "tracepoint_off_"] {
        let out = bench_json(filter);
        assert!(!out.status.success(), "--filter {filter} succeeded");
        assert!(out.stdout.is_empty(), "--filter {filter} printed figures");
        let err = String::from_utf8_lossy(&out.stderr);
        for name in NAMES {
            assert!(
                err.contains(name),
                "--filter {filter}: {name} not listed in {err}"
            );
        }
    }
}

/// `ustrace bench | head -1` style use: the reader goes away before the
/// output is written, and the process ends quietly and successfully.
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .args([
            "bench",
            "--filter",
            "clock_local_read",
            "--iterations",
            "1000",
            "--repetitions",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ustrace bench");
    drop(child.stdout.take());
    // Bounded: a bench that ignored the closed pipe must fail the test, not hang the suite.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().expect("wait for ustrace bench").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ustrace bench did not exit within 120 s after its stdout was closed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("wait for ustrace bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "status {:?}, stderr: {stderr}",
        out.status
    );
}
