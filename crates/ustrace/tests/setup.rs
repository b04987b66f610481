//! `USTRACE_EVENTS` and `USTRACE_SETUP`: tracing set up before `main`, checked in a child
//! process (`tests/bin/setup_check.rs`) that fires its events and prints what it sees.

use std::process::{Command, Output};

fn run_child(env: &[(&str, &str)], files: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ustrace-setup-check"));
    command
        .args(files)
        .env_remove("USTRACE_EVENTS")
        .env_remove("USTRACE_SETUP")
        .env_remove("USTRACE_SERVE");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("run the child");
    assert!(
        out.status.success(),
        "child failed: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The text the child printed for `path`.
fn section(stdout: &str, path: &str) -> String {
    let head = format!("== {path}\n");
    let start = stdout
        .find(&head)
        .map(|i| i + head.len())
        .unwrap_or_else(|| {
            panic!("no {path} in {stdout}");
        });
    let rest = &stdout[start..];
    rest[..rest.find("\n== ").map_or(rest.len(), |i| i + 1)].to_string()
}

fn trace_lines(stdout: &str, path: &str) -> Vec<String> {
    section(stdout, path)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(String::from)
        .collect()
}

#[test]
fn ustrace_events_enables_events_before_main() {
    let out = run_child(
        &[("USTRACE_EVENTS", "setupkv:get, setupnet:*,nosuch:thing")],
        &["set_event", "trace"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        section(&stdout, "set_event"),
        "setupkv:get\nsetupnet:respond\n"
    );
    let lines = trace_lines(&stdout, "trace");
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].contains("get: key=alpha"), "{lines:?}");
    assert!(lines[2].contains("respond: status=404"), "{lines:?}");
    assert_eq!(
        stderr,
        "ustrace: USTRACE_EVENTS: nosuch:thing: Invalid argument (no such event, system or module)\n"
    );
}

#[test]
fn ustrace_setup_writes_each_line_and_reports_bad_ones() {
    let dir = std::env::temp_dir().join(format!("ustrace-setup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("setup");
    std::fs::write(
        &file,
        "# an instance of its own, with a filter\n\
         mkdir instances/foo\n\
         instances/foo/events/setupkv/get/filter latency_ns > 1000\n\
         instances/foo/events/setupkv/get/enable 1\n\
         \n\
         /sys/kernel/tracing/instances/foo/set_event >> setupnet:respond\n\
         instances/foo/events/setupkv/put/filter no_such_field == 1\n\
         saved_cmdlines_size 0\n\
         no/such/file 1\n\
         instances/foo/trace_marker > hello from setup\n",
    )
    .unwrap();
    let out = run_child(
        &[("USTRACE_SETUP", file.to_str().unwrap())],
        &[
            "instances/foo/set_event",
            "instances/foo/events/setupkv/get/filter",
            "instances/foo/trace",
            "set_event",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let name = file.display();
    assert_eq!(
        section(&stdout, "instances/foo/set_event"),
        "setupkv:get\nsetupnet:respond\n"
    );
    assert_eq!(
        section(&stdout, "instances/foo/events/setupkv/get/filter"),
        "latency_ns > 1000\n"
    );
    assert_eq!(
        section(&stdout, "set_event"),
        "",
        "the top instance is untouched"
    );
    let lines = trace_lines(&stdout, "instances/foo/trace");
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].contains("tracing_mark_write: hello from setup"),
        "{lines:?}"
    );
    assert!(
        lines[1].contains("get: key=beta latency_ns=5000"),
        "{lines:?}"
    );
    assert!(lines[2].contains("respond: status=404"), "{lines:?}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ustrace:"))
        .collect();
    assert_eq!(
        errors,
        [
            format!("ustrace: {name}:7: instances/foo/events/setupkv/put/filter: Invalid argument"),
            format!("ustrace: {name}:8: saved_cmdlines_size: Invalid argument"),
            format!("ustrace: {name}:9: no/such/file: No such file or directory"),
        ],
        "{stderr}"
    );
    // The filter's error_log entry follows its line.
    assert!(stderr.contains("Field not found"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unreadable_setup_file_is_reported_and_the_program_runs() {
    let out = run_child(
        &[
            ("USTRACE_SETUP", "/nonexistent/ustrace-setup"),
            ("USTRACE_EVENTS", "setupnet:respond"),
        ],
        &["set_event"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("ustrace: USTRACE_SETUP: cannot read /nonexistent/ustrace-setup: "),
        "{stderr}"
    );
    assert_eq!(section(&stdout, "set_event"), "setupnet:respond\n");
}
