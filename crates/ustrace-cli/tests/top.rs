//! `ustrace top`: the real binary against this test process, which serves its tracefs and
//! keeps calling a function; the table names the function with its calls, and the process
//! is left as it was found (profiler off, filter empty), also after Ctrl-C.

mod common;

use common::DefaultSignals;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ustrace::FileSystem;

#[inline(never)]
#[no_mangle]
pub extern "C" fn fntop_work(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(2_654_435_761).rotate_left(13))
}

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls `fntop_work` on a thread until dropped.
struct Worker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn start() -> Worker {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for i in 0..1000 {
                    fntop_work(i);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Worker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read(path: &str) -> String {
    ustrace::tracefs().read_to_string(path).unwrap()
}

fn top() -> Command {
    ustrace::serve().expect("serving the tracefs");
    let mut c = Command::new(env!("CARGO_BIN_EXE_ustrace"));
    c.args(["top", "-p", &std::process::id().to_string()]);
    c.default_signals();
    c
}

#[test]
fn once_prints_the_profile_and_leaves_the_process_as_found() {
    let _g = serial();
    let worker = Worker::start();
    let out = top()
        .args(["--once", "-d", "0.5", "-F", "fntop_*"])
        .output()
        .unwrap();
    drop(worker);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    eprintln!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with(&format!("ustrace top: pid {}", std::process::id())));
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["HITS", "HITS/s", "TIME", "AVG", "STDDEV", "FUNCTION"]
    );
    let row = lines
        .iter()
        .find(|l| l.ends_with("  fntop_work"))
        .unwrap_or_else(|| panic!("no fntop_work row:\n{text}"));
    let hits: u64 = row.split_whitespace().next().unwrap().parse().unwrap();
    assert!(hits >= 1000, "{text}");
    assert_eq!(lines.len(), 3, "only the filtered function: {text}");
    assert_eq!(read("function_profile_enabled"), "0\n");
    assert_eq!(
        read("set_ftrace_filter"),
        "#### all functions enabled ####\n"
    );
}

#[test]
fn ctrl_c_turns_the_profiler_off_again() {
    let _g = serial();
    let worker = Worker::start();
    let mut child = top()
        .args(["-d", "0.2", "-F", "fntop_*"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for two refreshes, the second showing more calls than the first.
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut line = String::new();
    while seen.len() < 2 && Instant::now() < deadline {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if line.trim_end().ends_with("  fntop_work") {
            seen.push(
                line.split_whitespace()
                    .next()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap(),
            );
        }
    }
    assert_eq!(seen.len(), 2, "two refreshes");
    assert!(seen[1] > seen[0], "{seen:?}");
    assert_eq!(read("function_profile_enabled"), "1\n");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    drop(worker);
    assert!(status.success(), "{status:?}");
    assert_eq!(read("function_profile_enabled"), "0\n");
    assert_eq!(
        read("set_ftrace_filter"),
        "#### all functions enabled ####\n"
    );
}

#[test]
fn an_empty_filter_needs_all() {
    let _g = serial();
    let out = top().args(["--once"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-F GLOB, or pass --all"));
    assert_eq!(read("function_profile_enabled"), "0\n");
    // A filter set beforehand is used as it is, and kept.
    ustrace::tracefs()
        .write_file("set_ftrace_filter", "fntop_work\n")
        .unwrap();
    let worker = Worker::start();
    let out = top().args(["--once", "-d", "0.3"]).output().unwrap();
    drop(worker);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("  fntop_work"));
    assert_eq!(read("set_ftrace_filter"), "fntop_work\n");
    assert_eq!(read("function_profile_enabled"), "0\n");
    ustrace::tracefs()
        .write_file("set_ftrace_filter", "")
        .unwrap();
}

#[test]
fn a_filter_already_set_is_not_overwritten() {
    let _g = serial();
    ustrace::tracefs()
        .write_file("set_ftrace_filter", "fntop_work\n")
        .unwrap();
    let out = top().args(["--once", "-F", "fntop_*"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("set_ftrace_filter already names"));
    assert_eq!(read("set_ftrace_filter"), "fntop_work\n");
    assert_eq!(read("function_profile_enabled"), "0\n");
    ustrace::tracefs()
        .write_file("set_ftrace_filter", "")
        .unwrap();
}
