//! `ustrace bench --json` is an interface: every name the issues define is
//! printed, one JSON object per line, with its figures (tiny iteration
//! counts here: this checks the shape, never the speed).

use std::process::Command;

const NAMES: [&str; 13] = [
    "tracepoint_off",
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
    "clock_local_read",
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
        assert!(line.ends_with('}'), "{line}");
    }
    let scaling = text
        .lines()
        .find(|l| l.contains("\"ring_buffer_write_32b_2threads\""))
        .unwrap();
    assert!(scaling.contains("\"scaling\": "), "{scaling}");
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
    let out = child.wait_with_output().expect("wait for ustrace bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "status {:?}, stderr: {stderr}",
        out.status
    );
}
