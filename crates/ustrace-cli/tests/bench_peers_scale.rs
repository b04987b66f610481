//! `ustrace bench --peers --json` and `--scale --json` are interfaces: every row and every
//! point of every curve is printed, measured (with finite figures) or skipped with a
//! reason. Tiny iteration counts: this checks the shape and the skips, never the speed.

use std::process::Command;

const PEERS: [&str; 18] = [
    "ustrace_fprobe_entry",
    "ustrace_fprobe_entry_exit",
    "ustrace_dynevent_entry",
    "ustrace_dynevent_entry_2args",
    "ustrace_dynevent_entry_exit",
    "ustrace_dynevent_entry_exit_args",
    "ustrace_event_3ints",
    "uftrace_pg_entry_exit",
    "uftrace_pg_entry_exit_args",
    "uftrace_fpe_entry_exit",
    "uftrace_fpe_entry_exit_args",
    "uprobe_entry",
    "uprobe_entry_return",
    "lttng_ust_3ints",
    "tracing_null_3ints",
    "tracing_fmt_sink_3ints",
    "c_call_loop",
    "rust_call_loop",
];

fn bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .args([
            "bench",
            "--json",
            "--iterations",
            "1000",
            "--repetitions",
            "1",
        ])
        .args(args)
        .output()
        .expect("run ustrace bench");
    assert!(
        out.status.success(),
        "ustrace bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The number after `"key": ` in a JSON line.
fn number(line: &str, key: &str) -> Option<f64> {
    let field = format!("\"{key}\": ");
    let at = line.find(&field)? + field.len();
    let text: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | 'e' | '+'))
        .collect();
    text.parse().ok()
}

/// The string after `"key": "` in a JSON line.
fn string<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let field = format!("\"{key}\": \"");
    let at = line.find(&field)? + field.len();
    Some(&line[at..at + line[at..].find('"')?])
}

#[test]
fn peers_json_has_every_row_measured_or_skipped() {
    let text = bench(&["--peers"]);
    let lines: Vec<&str> = text.lines().collect();
    let names: Vec<&str> = lines.iter().filter_map(|l| string(l, "name")).collect();
    assert_eq!(names, PEERS, "rows in:\n{text}");
    for line in &lines {
        assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
        let name = string(line, "name").unwrap();
        if let Some(why) = string(line, "skipped") {
            assert!(!why.is_empty(), "{name}: a skip without a reason: {line}");
            // ustrace itself needs nothing but a C compiler to build the workload.
            assert!(
                !name.starts_with("ustrace_") || why.contains("cc"),
                "{name} skipped: {why}"
            );
            println!("skipped: {name}: {why}");
            continue;
        }
        for key in [
            "ns_per_op",
            "baseline_ns_per_op",
            "overhead_ns",
            "iterations",
        ] {
            let v = number(line, key).unwrap_or_else(|| panic!("{name}: no {key} in {line}"));
            assert!(v.is_finite(), "{name}: {key} {v}");
        }
        assert!(number(line, "ns_per_op").unwrap() > 0.0, "{line}");
        assert!(string(line, "baseline").is_some(), "{line}");
        let peer = !name.starts_with("ustrace_") && !name.ends_with("_call_loop");
        if peer {
            let vs = string(line, "vs").unwrap_or_else(|| panic!("{name}: no vs in {line}"));
            assert!(vs.starts_with("ustrace_"), "{line}");
            // The row it is compared with is measured in the same run.
            let measured = lines
                .iter()
                .any(|l| string(l, "name") == Some(vs) && number(l, "ns_per_op").is_some());
            if measured {
                assert!(number(line, "ratio_to_ustrace").is_some(), "{line}");
            }
        }
    }
    // The `tracing` crate is a dependency: its rows are always measured.
    for name in ["tracing_null_3ints", "tracing_fmt_sink_3ints"] {
        let line = lines
            .iter()
            .find(|l| string(l, "name") == Some(name))
            .unwrap();
        assert!(number(line, "ns_per_op").is_some(), "{line}");
    }
}

#[test]
fn scale_json_has_every_point_of_every_curve() {
    let text = bench(&["--scale"]);
    let lines: Vec<&str> = text.lines().collect();
    let curves = [
        ("events_enabled", &[1, 100, 10_000][..], "ns_per_op"),
        ("fprobe_functions", &[1, 100, 1_000][..], "ns_per_op"),
        ("writers", &[1, 2, 4, 8][..], "events_per_s"),
        ("filter_predicates", &[1, 3, 10, 30][..], "ns_per_op"),
        (
            "attach_functions",
            &[10, 100, 1_000, 10_000][..],
            "attach_ms",
        ),
    ];
    for (curve, counts, key) in curves {
        let of_curve: Vec<&&str> = lines
            .iter()
            .filter(|l| string(l, "name") == Some(curve))
            .collect();
        if let [line] = of_curve[..] {
            if let Some(why) = string(line, "skipped") {
                println!("skipped: {curve}: {why}");
                continue;
            }
        }
        let got: Vec<f64> = of_curve
            .iter()
            .map(|l| number(l, "count").unwrap_or_else(|| panic!("no count in {l}")))
            .collect();
        let want: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        assert_eq!(got, want, "{curve} in:\n{text}");
        for line in of_curve {
            let v = number(line, key).unwrap_or_else(|| panic!("no {key} in {line}"));
            assert!(v.is_finite() && v > 0.0, "{line}");
        }
    }
    for line in lines
        .iter()
        .filter(|l| string(l, "name") == Some("writers"))
    {
        for key in [
            "events_per_s_per_thread",
            "lost",
            "overwritten",
            "buffer_size_kb",
        ] {
            assert!(number(line, key).is_some(), "no {key} in {line}");
        }
    }
}

/// `--peers` and `--scale` are whole runs of their own; `--filter` picks among the
/// figures of the plain bench only.
#[test]
fn peers_and_scale_refuse_a_filter() {
    for mode in ["--peers", "--scale"] {
        let out = Command::new(env!("CARGO_BIN_EXE_ustrace"))
            .args(["bench", mode, "--filter", "fprobe*"])
            .output()
            .expect("run ustrace bench");
        assert!(!out.status.success(), "{mode} --filter succeeded");
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot be used with"), "{mode}: {err}");
    }
}

/// A peer that is not installed is reported as skipped, with what to install, and the
/// others still run: here uftrace and the LTTng tools are hidden from PATH.
#[test]
fn a_missing_peer_is_skipped_with_the_reason() {
    let bin = std::env::temp_dir().join(format!("ustrace-peers-path-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).unwrap();
    let hidden = ["uftrace", "lttng", "lttng-sessiond"];
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if hidden.iter().any(|h| name == *h) || bin.join(&name).exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(entry.path(), bin.join(&name));
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .args([
            "bench",
            "--json",
            "--iterations",
            "1000",
            "--repetitions",
            "1",
            "--peers",
        ])
        .env("PATH", &bin)
        .output()
        .expect("run ustrace bench");
    let _ = std::fs::remove_dir_all(&bin);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |name: &str| {
        *text
            .lines()
            .collect::<Vec<_>>()
            .iter()
            .find(|l| string(l, "name") == Some(name))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    };
    for name in [
        "uftrace_pg_entry_exit",
        "uftrace_pg_entry_exit_args",
        "uftrace_fpe_entry_exit",
        "uftrace_fpe_entry_exit_args",
    ] {
        let why = string(line(name), "skipped").unwrap_or_else(|| panic!("{}", line(name)));
        assert!(why.contains("uftrace is not installed"), "{name}: {why}");
    }
    let lttng = line("lttng_ust_3ints");
    let why = string(lttng, "skipped").unwrap_or_else(|| panic!("{lttng}"));
    assert!(
        why.contains("not installed") || why.contains("cannot build"),
        "{why}"
    );
    assert!(number(line("tracing_null_3ints"), "ns_per_op").is_some());
}
