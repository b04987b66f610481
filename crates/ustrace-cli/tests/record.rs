//! `ustrace record` on C programs that never heard of ustrace (built here with `cc`):
//! the agent preloaded, fprobes set up before `main`, the buffers drained from outside,
//! and a trace.dat the real trace-cmd reads as our reader does.

mod record_common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use record_common::*;
use ustrace_tracedat::{Reader, Value};

/// Calls `one(i)` and `two(i)` in a loop, counting in a shared file (which outlives a
/// SIGKILL) how many calls of `one` started and returned, and its own pid.
const COUNTER: &str = r#"
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct counts { volatile int64_t pid, started, done; };

__attribute__((noinline)) int one(int i) { return i * 3 + 1; }
__attribute__((noinline)) int two(int i) { return i ^ 0x55; }

int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) return 2;
    struct counts *c = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (c == MAP_FAILED) return 3;
    c->pid = getpid();
    long limit = argc > 2 ? atol(argv[2]) : -1;
    volatile int sink = 0;
    for (int i = 0; limit < 0 || i < limit; i++) {
        c->started = i + 1;
        __sync_synchronize();
        sink += one(i);
        __sync_synchronize();
        c->done = i + 1;
        sink += two(i);
        if (i % 64 == 63) usleep(500);
    }
    return 0;
}
"#;

fn counts(path: &Path) -> (i64, i64, i64) {
    let b = std::fs::read(path).unwrap();
    let at = |i: usize| i64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    (at(0), at(1), at(2))
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::UInt(u) => *u as i64,
        other => panic!("not a number: {other:?}"),
    }
}

#[test]
fn sigkill_mid_run_leaves_every_event_in_the_file() {
    let Some(env) = Env::new("kill") else { return };
    let prog = env.cc("counter", COUNTER);
    let shared = env.dir.join("counts");
    std::fs::write(&shared, vec![0u8; 4096]).unwrap();
    let out = env.dir.join("trace.dat");
    let rec = env
        .record()
        .args(["-q", "--probe", "f:t/one_in one i=$arg1:s32"])
        .args(["--probe", "f:t/one_out one%return r=$retval:s32"])
        .args(["-F", "tw?", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&prog)
        .arg(&shared)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let pid = loop {
        let (pid, _, done) = counts(&shared);
        if pid > 0 && done >= 5000 {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the program did not get going: {:?}",
            counts(&shared)
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    // SAFETY: kill(2) on the pid the program wrote itself.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let output = rec.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The trace is saved, and record ends as its command did: killed by signal 9.
    assert_eq!(output.status.code(), Some(128 + 9), "record: {stderr}");
    let (_, started, done) = counts(&shared);

    let reader = Reader::open(&out).unwrap();
    let (mut ins, mut outs, mut two_in, mut two_out) = (Vec::new(), Vec::new(), 0i64, 0i64);
    for ev in reader.events() {
        let ev = ev.unwrap();
        assert_eq!(ev.pid as i64, pid, "{ev:?}");
        match (ev.system.as_str(), ev.name.as_str()) {
            ("t", "one_in") => ins.push(int(&ev.fields.iter().find(|f| f.0 == "i").unwrap().1)),
            ("t", "one_out") => outs.push(int(&ev.fields.iter().find(|f| f.0 == "r").unwrap().1)),
            ("funcs", "two__entry") => two_in += 1,
            ("funcs", "two__exit") => two_out += 1,
            other => panic!("unexpected event {other:?}"),
        }
    }
    // Every call that started before the kill is there, in order, once.
    let n = ins.len() as i64;
    assert!(
        (done..=started).contains(&n),
        "{n} entries of one(), {done} calls returned and {started} started before the kill"
    );
    assert_eq!(
        ins,
        (0..n).collect::<Vec<_>>(),
        "entries of one() in order, no gap"
    );
    assert!((done..=n).contains(&(outs.len() as i64)));
    for (i, r) in outs.iter().enumerate() {
        assert_eq!(*r, i as i64 * 3 + 1, "one({i}) returned");
    }
    assert!(
        (done - 1..=n).contains(&two_in),
        "{two_in} entries of two()"
    );
    assert!(two_out <= two_in && two_out >= two_in - 1);

    // `ustrace report` prints what the real trace-cmd prints, line for line.
    let ours = ustrace_report(&out);
    assert_eq!(
        ours.len() as i64,
        1 + ins.len() as i64 + outs.len() as i64 + two_in + two_out
    );
    match trace_cmd_report(&out) {
        None => println!("skipped the trace-cmd comparison: no /usr/bin/trace-cmd"),
        Some(theirs) => {
            assert_eq!(theirs.len(), ours.len(), "line counts differ");
            for (i, (a, b)) in theirs.iter().zip(&ours).enumerate() {
                assert_eq!(a, b, "line {i} differs");
            }
        }
    }
}

fn ustrace_report(file: &Path) -> Vec<String> {
    let out = Command::new(ustrace())
        .arg("report")
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ustrace report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end().to_string())
        .collect()
}

fn trace_cmd_report(file: &Path) -> Option<Vec<String>> {
    if !Path::new("/usr/bin/trace-cmd").exists() {
        return None;
    }
    let out = Command::new("/usr/bin/trace-cmd")
        .arg("report")
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "trace-cmd report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim_end().to_string())
            .collect(),
    )
}

/// `ustrace record -F one -o OUT -- PROG ARGS...`: its output and its stderr as text.
fn record_calls_of_one(
    env: &Env,
    out: &Path,
    prog: &Path,
    args: &[&std::ffi::OsStr],
) -> (std::process::Output, String) {
    let output = env
        .record()
        .args(["-F", "one", "-o"])
        .arg(out)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stderr)
}

#[test]
fn a_program_that_exits_at_once_leaves_its_events_and_its_status() {
    let Some(env) = Env::new("short") else { return };
    let prog = env.cc("counter", COUNTER);
    let shared = env.dir.join("counts");
    std::fs::write(&shared, vec![0u8; 4096]).unwrap();
    let out = env.dir.join("short.dat");
    let (output, stderr) =
        record_calls_of_one(&env, &out, &prog, &[shared.as_os_str(), "3".as_ref()]);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("6 events")
            && stderr.contains("0 lost")
            && stderr.contains("exited with status 0"),
        "summary: {stderr}"
    );
    let reader = Reader::open(&out).unwrap();
    let names: Vec<String> = reader.events().map(|e| e.unwrap().name).collect();
    assert_eq!(names, ["one__entry", "one__exit"].repeat(3));
}

/// Calls `one` twice, then exits with the status its argument names, or dies of SIGTERM.
const ENDS_AS_TOLD: &str = r#"
#include <signal.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) int one(int i) { return i * 3 + 1; }

int main(int argc, char **argv) {
    volatile int sink = one(1) + one(2);
    (void)sink;
    if (argc > 1 && strcmp(argv[1], "term") == 0) raise(SIGTERM);
    return argc > 1 ? atoi(argv[1]) : 0;
}
"#;

/// As `perf record` and a shell do, `record` ends with its command's status (128 + the
/// signal when one killed it), after the trace is saved: a script that records a failing
/// command still sees it fail.
#[test]
fn record_ends_with_the_status_of_its_command() {
    let Some(env) = Env::new("status") else {
        return;
    };
    let prog = env.cc("ends", ENDS_AS_TOLD);
    for (arg, code, says) in [
        ("0", 0, "exited with status 0"),
        ("3", 3, "exited with status 3"),
        ("term", 128 + 15, "killed by signal 15"),
    ] {
        let out = env.dir.join(format!("status-{arg}.dat"));
        let (output, stderr) = record_calls_of_one(&env, &out, &prog, &[arg.as_ref()]);
        assert_eq!(output.status.code(), Some(code), "{arg}: {stderr}");
        assert!(stderr.contains(says), "{arg}: {stderr}");
        let reader = Reader::open(&out).unwrap();
        let names: Vec<String> = reader.events().map(|e| e.unwrap().name).collect();
        assert_eq!(names, ["one__entry", "one__exit"].repeat(2), "{arg}");
    }
}

#[test]
fn bad_setup_is_refused_with_the_kernels_errno() {
    let Some(env) = Env::new("bad") else { return };
    let prog = env.cc("counter", COUNTER);
    let output = env
        .record()
        .args(["--probe", "f:t/x no_such_function_here", "-o"])
        .arg(env.dir.join("x.dat"))
        .arg("--")
        .arg(&prog)
        .arg("/nonexistent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("dynamic_events") && stderr.contains("no_such_function_here"),
        "{stderr}"
    );
}

// Issue 20 item 5: `record -p function_graph -F GLOB` records the function graph tracer
// of a program that never heard of ustrace, and the file names the functions (the
// tracefs's `available_filter_functions_addrs` becomes the file's kallsyms), so the real
// trace-cmd draws the calls with their durations.
#[test]
fn the_function_graph_of_a_program_is_recorded() {
    let Some(env) = Env::new("graph") else { return };
    let prog = env.cc("counter", COUNTER);
    let shared = env.dir.join("counts");
    std::fs::write(&shared, vec![0u8; 4096]).unwrap();
    let out = env.dir.join("graph.dat");
    let output = env
        .record()
        .args(["-p", "function_graph", "-F", "one", "-F", "two", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&prog)
        .arg(&shared)
        .arg("4")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let reader = Reader::open(&out).unwrap();
    let names: Vec<String> = reader.events().map(|e| e.unwrap().name).collect();
    assert_eq!(
        names,
        ["funcgraph_entry", "funcgraph_exit"].repeat(8),
        "{stderr}"
    );
    let ours = ustrace_report(&out);
    let entries: Vec<&String> = ours
        .iter()
        .filter(|l| l.contains("funcgraph_entry"))
        .collect();
    assert_eq!(entries.len(), 8, "{ours:?}");
    assert!(
        entries[0].contains("--> one ") && entries[1].contains("--> two "),
        "{ours:?}"
    );
    let Some(theirs) = trace_cmd_report(&out) else {
        eprintln!("skipped: trace-cmd is not installed");
        return;
    };
    let calls: Vec<&String> = theirs
        .iter()
        .filter(|l| l.contains("funcgraph_entry"))
        .collect();
    assert_eq!(calls.len(), 8, "{theirs:?}");
    for (i, line) in calls.iter().enumerate() {
        let name = if i % 2 == 0 { "one();" } else { "two();" };
        assert!(line.contains(" us ") && line.ends_with(name), "{theirs:?}");
    }
}

// Issue 20 items 1 and 4: with no filter the tracers patch every function of the program
// and its libraries, and the program runs as it does untraced. Every dynamically linked
// program runs ld.so's `dfs_traversal` at exit, whose caller (built with GCC's `-fipa-ra`)
// keeps a pointer in r11 across the call: a tracer that changed any register there, or
// one that could not take its own SIGTRAP on the agent's thread, crashed the program.
#[test]
fn every_function_of_a_program_is_traced_and_it_runs_as_before() {
    let Some(env) = Env::new("every") else { return };
    let prog = env.cc("every", EVERY);
    let plain = Command::new(&prog).output().unwrap();
    assert!(plain.status.success());
    for tracer in ["function", "function_graph"] {
        let out = env.dir.join(format!("{tracer}.dat"));
        let output = env
            .record()
            .args(["-p", tracer, "-o"])
            .arg(&out)
            .arg("--")
            .arg(&prog)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{tracer}: {stderr}");
        assert!(
            stderr.contains("the target exited with status 0"),
            "{tracer}: {stderr}"
        );
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&plain.stdout),
            "{tracer}: {stderr}"
        );
        let lines = ustrace_report(&out);
        for name in ["mix", "main"] {
            assert!(
                lines.iter().any(|l| l.contains(&format!(" {name} "))
                    || l.contains(&format!(" {name} <-"))
                    || l.ends_with(&format!(" {name}"))),
                "{tracer}: no call of {name} in {} lines: {:?}",
                lines.len(),
                &lines[..lines.len().min(40)]
            );
        }
    }
}

// A selected function that cannot be patched records nothing: record says so, with the
// reason, instead of leaving an empty trace to puzzle over.
#[test]
fn record_names_the_selected_functions_it_cannot_patch() {
    let Some(env) = Env::new("tiny") else { return };
    let prog = env.cc("tiny", TINY);
    let out = env.dir.join("tiny.dat");
    let output = env
        .record()
        .args(["-p", "function", "-F", "tiny", "-F", "roomy", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("1 selected function(s) cannot be patched")
            && stderr.contains("  tiny: ")
            && stderr.contains("too short"),
        "{stderr}"
    );
    assert!(!stderr.contains("  roomy"), "{stderr}");
}

const TINY: &str = r#"
#include <stdio.h>
/* Four bytes: shorter than the five a patch needs. */
__attribute__((naked, noinline)) long tiny(long x) { __asm__("mov %rdi, %rax\n\tret"); }
__attribute__((noinline)) long roomy(long x) { return x * 3 + 1; }
int main(void) { printf("%ld\n", tiny(2) + roomy(3)); return 0; }
"#;

const EVERY: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long mix(long a, long b) { return (a * 31) ^ (b + 7); }

int main(void) {
    long acc = 0;
    char buf[64];
    for (int i = 0; i < 200; i++) {
        acc = mix(acc, i);
        snprintf(buf, sizeof buf, "%ld", acc);
        acc += (long)strlen(buf);
    }
    char *p = malloc(100);
    memset(p, 1, 100);
    acc += p[50];
    free(p);
    printf("%ld\n", acc);
    return 0;
}
"#;

// Issue 16 item 7: the demo tells the story in three commands — record a C program that
// never heard of ustrace with fprobes on two functions, report it, export it.
#[test]
fn the_demo_records_a_c_program_in_three_commands() {
    let Some(_env) = Env::new("demo") else { return };
    let out = Command::new(ustrace())
        .args(["demo", "--any-program"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "$ ustrace record -F parse -F checksum -- ./prog",
        "$ ustrace report trace.dat",
        "$ ustrace export --chrome out.json trace.dat",
        "12 events in ",
        "parse__entry:",
        "checksum__exit:",
        "out.json: 12 events",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    assert!(
        !text.contains("skipped:") && !text.contains("failed:"),
        "{text}"
    );
}
