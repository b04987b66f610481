//! Evaluation differential against the live kernel: the same filter is set in
//! two private tracefs instances — a baseline that keeps every `sys_enter` of a
//! worker thread, and one that also applies the expression under test — while
//! the worker issues harmless syscalls with chosen arguments. Every baseline
//! event is rebuilt as a record and run through our compiled filter; the
//! events we keep must be exactly the events the kernel kept.
//!
//! Needs root and tracefs (else prints `skipped: <why>`). The worker is pinned
//! to CPU 0 and named, so `CPU` and `comm` predicates are tested as well.
//! `USTRACE_DIFF_CASES=N` sets the number of generated expressions (default 150).

mod common;

use common::SYS_ENTER;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use ustrace_filter::{compile, CompileEnv, Context};

const TRACEFS: &str = "/sys/kernel/tracing";
const WORKER_NAME: &str = "ustr-semworker";
/// getpid, sched_yield, getuid, getgid, geteuid, getegid, getppid, getpgrp, gettid:
/// they ignore their arguments, so any values can be passed and traced.
const SYSCALLS: [i64; 9] = [39, 24, 102, 104, 107, 108, 110, 111, 186];

struct Instance {
    dir: PathBuf,
}

impl Instance {
    fn create(name: &str) -> Instance {
        let dir = Path::new(TRACEFS).join("instances").join(name);
        fs::create_dir(&dir).expect("creating a tracefs instance");
        Instance { dir }
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = write(&self.path("tracing_on"), "0");
        let _ = write(&self.path("events/raw_syscalls/sys_enter/enable"), "0");
        let _ = write(&self.path("events/raw_syscalls/sys_enter/filter"), "0");
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!("could not remove {}: {e}", self.dir.display());
        }
    }
}

fn write(path: &Path, text: &str) -> i32 {
    let mut f = match OpenOptions::new().write(true).truncate(true).open(path) {
        Ok(f) => f,
        Err(e) => return e.raw_os_error().unwrap_or(-1),
    };
    match f.write(text.as_bytes()) {
        Ok(n) if n == text.len() => 0,
        Ok(_) => -1,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn read(path: &Path) -> String {
    let mut s = String::new();
    fs::File::open(path)
        .and_then(|mut f| f.read_to_string(&mut s))
        .expect("reading trace");
    s
}

/// (id, args) of every sys_enter line of the trace.
fn events(trace: &str) -> Vec<(i64, [u64; 6])> {
    trace
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = &l[l.find("sys_enter: NR ")? + 14..];
            let (id, rest) = rest.split_once(" (")?;
            let mut args = [0u64; 6];
            for (slot, a) in args.iter_mut().zip(rest.trim_end_matches(')').split(", ")) {
                *slot = u64::from_str_radix(a, 16).ok()?;
            }
            Some((id.parse().ok()?, args))
        })
        .collect()
}

fn record(pid: i32, id: i64, args: &[u64; 6]) -> Vec<u8> {
    let mut r = vec![0u8; 64];
    r[4..8].copy_from_slice(&pid.to_ne_bytes());
    r[8..16].copy_from_slice(&id.to_ne_bytes());
    for (i, a) in args.iter().enumerate() {
        r[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
    }
    r
}

fn leaf() -> impl Strategy<Value = String> {
    let num_op = prop::sample::select(vec!["==", "!=", "<", "<=", ">", ">=", "&"]);
    let ids = prop_oneof![prop::sample::select(SYSCALLS.to_vec()), -2i64..300];
    prop_oneof![
        4 => (num_op.clone(), ids).prop_map(|(op, v)| format!("id {op} {v}")),
        1 => (num_op, -1i32..3).prop_map(|(op, v)| format!("CPU {op} {v}")),
        1 => prop::sample::select(vec!["CPU & CPUS{0}", "CPU == CPUS{0-1}", "CPU != CPUS{1}", "id & CPUS{0-1}", "id == CPUS{0}"]).prop_map(String::from),
        2 => (prop::sample::select(vec!["==", "!=", "~"]), prop::sample::select(vec![
            "ustr-semworker", "ustr*", "*worker", "*ork*", "ustr-sem?orker", "u[a-z]tr*", "!ustr*", "x*", "*", "", "ustr-semworker*", "*r",
        ])).prop_map(|(op, p)| format!("comm {op} \"{p}\"")),
        1 => Just("args == 0".to_string()),
        // The STACKTRACE pseudo field: every predicate on it is the kernel's no-op.
        1 => (prop::sample::select(vec!["==", "!=", "<", ">=", "&"]), prop::sample::select(vec!["stacktrace", "STACKTRACE"]), 0u8..3)
            .prop_map(|(op, f, v)| format!("{f} {op} {v}")),
    ]
}

fn expression() -> impl Strategy<Value = String> {
    leaf().prop_recursive(3, 8, 2, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec![" && ", " || "]),
                inner.clone()
            )
                .prop_map(|(a, o, b)| format!("{a}{o}{b}")),
            inner.clone().prop_map(|a| format!("({a})")),
            inner.prop_map(|a| format!("!{a}")),
        ]
    })
}

#[test]
fn evaluation_agrees_with_the_kernel() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root");
        return;
    }
    if !Path::new(TRACEFS).join("instances").is_dir() {
        eprintln!("skipped: tracefs not mounted at {TRACEFS}");
        return;
    }
    let n: usize = std::env::var("USTRACE_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut texts: Vec<String> = [
        "comm ~ \"*worker\"",
        "comm ~ \"*r\"",
        "comm ~ \"ustr*\"",
        "comm ~ \"*sem*\"",
        "comm == \"ustr-semworker\"",
        "id == 39 || id == 110",
        "id > 100 && id < 110",
        "!(id == 186)",
        "id & 1",
        "CPU == 0",
        "CPU & CPUS{0}",
        "args != 0",
        "stacktrace == 0",
        "stacktrace != 0",
        "!(stacktrace == 1)",
        "STACKTRACE & 1 || id == 39",
        "stacktrace < 1 || !(stacktrace >= 0 && id == 24)",
        "stacktrace.ustring != 5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut runner = TestRunner::deterministic();
    let strategy = expression();
    texts.extend((0..n).map(|_| strategy.new_tree(&mut runner).unwrap().current()));

    let pid = std::process::id();
    let base = Instance::create(&format!("ustrace-semtest-base-{pid}"));
    let test = Instance::create(&format!("ustrace-semtest-expr-{pid}"));
    let (go_tx, go_rx) = mpsc::channel::<Option<Vec<[u64; 6]>>>();
    let (done_tx, done_rx) = mpsc::channel::<i32>();
    let worker = std::thread::Builder::new()
        .name(WORKER_NAME.into())
        .spawn(move || {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
            // sched_setaffinity only touch the set we own.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
            done_tx.send(tid).unwrap();
            while let Ok(Some(arg_sets)) = go_rx.recv() {
                for (nr, args) in SYSCALLS.iter().zip(arg_sets.iter().cycle()) {
                    // SAFETY: these syscalls ignore their arguments and touch no memory.
                    unsafe {
                        libc::syscall(*nr, args[0], args[1], args[2], args[3], args[4], args[5])
                    };
                }
                done_tx.send(0).unwrap();
            }
        })
        .unwrap();
    let tid = done_rx.recv().unwrap();
    let env = CompileEnv::default();
    let ctx = Context {
        cpu: 0,
        comm: WORKER_NAME.as_bytes(),
        read_str: None,
    };
    let base_filter = format!("common_pid == {tid}");
    assert_eq!(
        write(
            &base.path("events/raw_syscalls/sys_enter/filter"),
            &base_filter
        ),
        0
    );
    let mut checked = 0usize;
    let mut failures = Vec::new();
    let mut arg_runner = TestRunner::deterministic();
    for text in &texts {
        let full = format!("{base_filter} && ({text})");
        let Ok(prog) = compile(&full, &SYS_ENTER, &env) else {
            continue;
        };
        let errno = write(&test.path("events/raw_syscalls/sys_enter/filter"), &full);
        assert_eq!(errno, 0, "kernel refused {full:?}");
        for inst in [&base, &test] {
            assert_eq!(write(&inst.path("trace"), ""), 0);
            assert_eq!(
                write(&inst.path("events/raw_syscalls/sys_enter/enable"), "1"),
                0
            );
            assert_eq!(write(&inst.path("tracing_on"), "1"), 0);
        }
        let args: Vec<[u64; 6]> = (0..3)
            .map(|_| {
                prop::array::uniform6(prop_oneof![any::<u64>(), 0u64..4])
                    .new_tree(&mut arg_runner)
                    .unwrap()
                    .current()
            })
            .collect();
        go_tx.send(Some(args)).unwrap();
        done_rx.recv().unwrap();
        for inst in [&base, &test] {
            assert_eq!(write(&inst.path("tracing_on"), "0"), 0);
            assert_eq!(
                write(&inst.path("events/raw_syscalls/sys_enter/enable"), "0"),
                0
            );
        }
        // Only the chosen syscalls happen strictly between "go" and "done";
        // the channel's own futex calls may fall outside one of the windows.
        let chosen = |(id, _): &(i64, [u64; 6])| SYSCALLS.contains(id);
        let all: Vec<_> = events(&read(&base.path("trace")))
            .into_iter()
            .filter(chosen)
            .collect();
        let kept_by_kernel: Vec<_> = events(&read(&test.path("trace")))
            .into_iter()
            .filter(chosen)
            .collect();
        let kept_by_us: Vec<_> = all
            .iter()
            .copied()
            .filter(|(id, args)| prog.matches(&record(tid, *id, args), &ctx))
            .collect();
        assert!(all.len() >= SYSCALLS.len(), "baseline lost events: {all:?}");
        if kept_by_us == kept_by_kernel {
            checked += 1;
        } else {
            failures.push(format!(
                "{full:?}\n  kernel kept {kept_by_kernel:?}\n  we kept     {kept_by_us:?}"
            ));
        }
    }
    go_tx.send(None).unwrap();
    worker.join().unwrap();
    eprintln!(
        "evaluation agreement: {checked}/{} expressions",
        checked + failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
