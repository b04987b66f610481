//! The function tracers on the demo workload, driven from outside as a user would: `ustrace
//! write` to `set_ftrace_filter` and `current_tracer` of a running `ustrace demo --serve`,
//! then `ustrace cat trace`. The demo's GET path is `Store::get`, which calls
//! `demo_shard_lookup` once: every graph drawn must be that tree, and a `set_ftrace_pid`
//! naming no demo thread must keep every function record out.

mod common;

use common::DefaultSignals;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ustrace");

struct Demo {
    child: Child,
    pid: String,
    sock: PathBuf,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.sock);
    }
}

fn start() -> Demo {
    let sock = std::env::temp_dir().join(format!("ustrace-fngraph-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&sock);
    std::fs::create_dir_all(&sock).unwrap();
    let mut child = Command::new(BIN)
        .args(["demo", "--serve", "--workers", "1", "--rate", "400"])
        .env("USTRACE_SOCKET_DIR", &sock)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .default_signals()
        .spawn()
        .unwrap();
    let socket = sock.join(format!("{}.sock", child.id()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            let err = common::stderr_text(&mut child);
            panic!("demo exited {st} before serving: {err}");
        }
        assert!(Instant::now() < deadline, "the demo never served");
        std::thread::sleep(Duration::from_millis(20));
    }
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut { stderr }, &mut std::io::sink());
    });
    let pid = child.id().to_string();
    Demo { child, pid, sock }
}

fn cli(demo: &Demo, args: &[&str]) -> Output {
    Command::new(BIN)
        .env("USTRACE_SOCKET_DIR", &demo.sock)
        .args(args)
        .output()
        .unwrap()
}

fn write(demo: &Demo, file: &str, text: &str) {
    let out = cli(demo, &["write", "-p", &demo.pid, file, text]);
    assert!(
        out.status.success(),
        "write {file} {text}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn cat(demo: &Demo, file: &str) -> String {
    let out = cli(demo, &["cat", "-p", &demo.pid, file]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_demos_get_path_draws_its_known_tree() {
    let demo = start();
    write(&demo, "set_ftrace_filter", "*Store*get* demo_shard_lookup");
    let selected = cat(&demo, "set_ftrace_filter");
    if !selected
        .lines()
        .any(|l| l.contains("Store") && l.contains("get"))
    {
        println!("skipped: Store::get is inlined in this build ({selected:?})");
        return;
    }
    write(&demo, "current_tracer", "function_graph");
    std::thread::sleep(Duration::from_millis(500));
    write(&demo, "tracing_on", "0");
    let trace = cat(&demo, "trace");
    write(&demo, "current_tracer", "nop");
    let body: Vec<&str> = trace
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('|'))
        .collect();
    // The demo's own events are enabled: they print as `/* ... */` comments between.
    let shape: Vec<String> = body
        .iter()
        .map(|l| l.split_once('|').unwrap().1[2..].to_string())
        .filter(|l| !l.trim_start().starts_with("/*"))
        .collect();
    let depth_of = |l: &str| l.len() - l.trim_start().len();
    let mut gets = 0;
    for (i, l) in shape.iter().enumerate() {
        if !l.ends_with("Store::get() {") {
            continue;
        }
        let depth = depth_of(l);
        // Its subtree: the lines up to its own `}` (one worker: no other thread's GET
        // interleaves on the CPU).
        let Some(end) = shape[i + 1..]
            .iter()
            .position(|n| depth_of(n) == depth && n.trim() == "}")
        else {
            continue; // cut off at the end of the trace
        };
        let inner: Vec<&str> = shape[i + 1..i + 1 + end]
            .iter()
            .map(|n| n.as_str())
            .filter(|n| !n.contains("{{closure}}"))
            .collect();
        let lookup = [format!("{}demo_shard_lookup();", " ".repeat(depth + 2))];
        let lookup_open = [
            format!("{}demo_shard_lookup() {{", " ".repeat(depth + 2)),
            format!("{}}}", " ".repeat(depth + 2)),
        ];
        assert!(
            inner == lookup.iter().map(String::as_str).collect::<Vec<_>>()
                || inner == lookup_open.iter().map(String::as_str).collect::<Vec<_>>(),
            "GET at line {i}: {inner:?}\n{trace}"
        );
        gets += 1;
    }
    assert!(gets > 0, "{trace}");
    // A pid filter naming no demo thread keeps every function record out.
    write(&demo, "trace", "");
    write(&demo, "set_ftrace_pid", "1");
    write(&demo, "tracing_on", "1");
    write(&demo, "current_tracer", "function");
    std::thread::sleep(Duration::from_millis(300));
    let trace = cat(&demo, "trace");
    write(&demo, "current_tracer", "nop");
    // The demo's events still record (set_ftrace_pid is the function tracers'); no
    // function line does.
    assert!(trace.contains("request: op="), "{trace}");
    assert!(!trace.contains("demo_shard_lookup <-"), "{trace}");
    // With the pid filter gone, function lines come.
    write(&demo, "set_ftrace_pid", "");
    write(&demo, "trace", "");
    write(&demo, "current_tracer", "function");
    std::thread::sleep(Duration::from_millis(300));
    let trace = cat(&demo, "trace");
    write(&demo, "current_tracer", "nop");
    assert!(trace.contains("demo_shard_lookup <-"), "{trace}");
}

/// The whole demo with `function_graph` on every function of the process from its start
/// (`USTRACE_SETUP`): the workload, its trace_marker writes and the trace's own reading all
/// run traced, and it still serves its requests and ends. It used to spin for ever in its
/// first marker write (the writer's clock call met the tracer, which recorded into the same
/// buffer and sent the writer round again).
#[test]
fn the_whole_demo_runs_under_function_graph_of_every_function() {
    let dir = std::env::temp_dir().join(format!("ustrace-fngraph-all-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let setup = dir.join("setup");
    std::fs::write(&setup, "current_tracer function_graph\n").unwrap();
    let mut child = Command::new(BIN)
        .args(["demo", "--seconds", "1", "--workers", "2"])
        .env("USTRACE_SETUP", &setup)
        .env("USTRACE_SOCKET_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .default_signals()
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    // Patching every function of a debug build takes most of this.
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
            panic!("the demo under function_graph did not end within 240 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = reader.join().unwrap();
    let err = common::stderr_text(&mut child);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "demo: {status}\n{err}");
    let last = out.lines().last().unwrap_or_default();
    let served: u64 = last
        .strip_prefix("# ")
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary line: {last}"));
    assert!(served > 0 && last.contains("requests served"), "{last}");
}
