//! The function profiler: its counts equal the calls made (C functions built here with cc
//! and Rust functions of this test), average and s² agree with the durations, the
//! `trace_stat/function<cpu>` files sum to the same, and counts stay exact with more threads
//! than CPUs.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ustrace::ftrace::profile::{self, Stat};

/// The profiler is one per process: tests of this binary take turns.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const C_SOURCE: &str = r#"
#include <time.h>
volatile unsigned long fp_sink;
__attribute__((noinline)) unsigned long fp_leaf(unsigned long x) {
    for (int i = 0; i < 50; i++) fp_sink += x + i;
    return fp_sink;
}
__attribute__((noinline)) unsigned long fp_mid(unsigned long x) {
    return fp_leaf(x) + fp_leaf(x + 1);
}
__attribute__((noinline)) unsigned long fp_heavy(unsigned long n) {
    /* A store first: a test-and-branch at the entry would leave no room for the patch. */
    fp_sink += n;
    for (unsigned long i = 0; i < n; i++) fp_sink += i;
    return fp_sink;
}
__attribute__((noinline)) unsigned long fp_outer(unsigned long n) {
    return fp_heavy(n) + fp_heavy(n);
}
__attribute__((noinline)) void fp_sleep_ms(long ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, 0);
}
"#;

/// Builds the C functions into a library and loads it, once per process; `None` (skipped)
/// without cc.
fn c_lib() -> Option<usize> {
    static LIB: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *LIB.get_or_init(build_c_lib)
}

fn build_c_lib() -> Option<usize> {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fnprof-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("fnprof.c");
    std::fs::write(&src, C_SOURCE).ok()?;
    let out = dir.join("libfnprof_test.so");
    match Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
    {
        Ok(s) if s.success() => {}
        other => {
            eprintln!("skipped: cc failed: {other:?}");
            return None;
        }
    }
    let path = std::ffi::CString::new(out.to_str()?).ok()?;
    // SAFETY: loading the library just built; it has no constructors.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!handle.is_null(), "dlopen failed");
    Some(handle as usize)
}

fn sym(handle: usize, name: &str) -> usize {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle as *mut libc::c_void, c.as_ptr()) };
    assert!(!p.is_null(), "{name} missing");
    p as usize
}

/// (address, name) of every function matching `glob`.
fn functions(glob: &str) -> Vec<(usize, String)> {
    ustrace_inspect::symbols::inventory()
        .glob(glob)
        .into_iter()
        .map(|s| (s.addr, s.name.clone()))
        .collect()
}

fn cpus() -> usize {
    ustrace_ringbuf::cpu::possible_cpus()
}

fn start(funcs: Vec<(usize, String)>) {
    assert!(!funcs.is_empty());
    profile::start(funcs, cpus(), Arc::new(|| true)).expect("profiler starts");
}

fn stat(name: &str) -> Option<Stat> {
    profile::current()?
        .stats(None)
        .into_iter()
        .find(|s| s.name == name)
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn fnprof_rust_work(x: u64) -> u64 {
    std::hint::black_box(x.wrapping_mul(31).rotate_left(7))
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn fnprof_rust_twice(x: u64) -> u64 {
    fnprof_rust_work(x) ^ fnprof_rust_work(x + 1)
}

#[test]
fn counts_equal_the_calls_made_in_c() {
    let _g = serial();
    let Some(lib) = c_lib() else { return };
    // SAFETY: signatures as in C_SOURCE.
    let mid: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(sym(lib, "fp_mid")) };
    // SAFETY: as above.
    let leaf: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(sym(lib, "fp_leaf")) };
    start(functions("fp_*"));
    for i in 0..1000 {
        mid(i);
    }
    for i in 0..234 {
        leaf(i);
    }
    profile::stop().unwrap();
    let m = stat("fp_mid").expect("fp_mid profiled");
    let l = stat("fp_leaf").expect("fp_leaf profiled");
    assert_eq!(m.hits, 1000);
    assert_eq!(l.hits, 2 * 1000 + 234);
    assert!(stat("fp_sleep_ms").is_none(), "never called, so not listed");
    // graph-time (the default): a caller's time holds its callees'.
    let leaf_in_mid = l.avg() * 2000;
    assert!(
        m.time * 10 >= leaf_in_mid * 9,
        "mid {} ns < its leaves {leaf_in_mid} ns",
        m.time
    );
    // Calls after stop are not counted; the numbers stay readable.
    mid(1);
    assert_eq!(stat("fp_mid").unwrap().hits, 1000);

    // graph-time off: a function's own time, its profiled callees' taken out. fp_outer does
    // nothing but call fp_heavy twice (each some 10^5 loop rounds), so its own time is a
    // small part of its total (what is left is the probe's own cost around the inner calls).
    // SAFETY: signature as in C_SOURCE.
    let outer: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(sym(lib, "fp_outer")) };
    assert_eq!(ustrace_fprobe::check_patchable(sym(lib, "fp_outer")), None);
    assert_eq!(ustrace_fprobe::check_patchable(sym(lib, "fp_heavy")), None);
    assert_eq!(functions("fp_outer").len(), 1);
    let own = |graph_time: bool| {
        profile::start(functions("fp_*"), cpus(), Arc::new(move || graph_time)).unwrap();
        for _ in 0..100 {
            outer(100_000);
        }
        profile::stop().unwrap();
        let o = stat("fp_outer").unwrap();
        let h = stat("fp_heavy").unwrap();
        assert_eq!((o.hits, h.hits), (100, 200));
        (o.time, h.time)
    };
    let (total, heavy_on) = own(true);
    let (self_time, heavy_off) = own(false);
    assert!(
        total >= heavy_on,
        "graph-time: {total} ns < callees {heavy_on} ns"
    );
    assert!(
        self_time * 4 < heavy_off,
        "own time of fp_outer {self_time} ns, its callees {heavy_off} ns"
    );
}

#[test]
fn counts_equal_the_calls_made_in_rust_and_per_cpu_files_sum_to_them() {
    let _g = serial();
    start(functions("fnprof_rust_*"));
    let mut acc = 0;
    for i in 0..5000u64 {
        acc ^= fnprof_rust_twice(i);
    }
    std::hint::black_box(acc);
    profile::stop().unwrap();
    assert_eq!(stat("fnprof_rust_twice").unwrap().hits, 5000);
    assert_eq!(stat("fnprof_rust_work").unwrap().hits, 10000);

    // The same through trace_stat: each CPU's file, summed.
    let mut total = std::collections::HashMap::<String, u64>::new();
    let names = ustrace::tracefs();
    use ustrace::FileSystem;
    let files = names.readdir("trace_stat").unwrap();
    assert!(!files.is_empty());
    for f in files {
        let text = common::read(&format!("trace_stat/{}", f.name)).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("  Function                               Hit    Time            Avg             s^2")
        );
        assert_eq!(
            lines.next(),
            Some("  --------                               ---    ----            ---             ---")
        );
        for line in lines {
            let mut words = line.split_whitespace();
            let name = words.next().unwrap().to_string();
            let hits: u64 = words.next().unwrap().parse().unwrap();
            *total.entry(name).or_default() += hits;
            assert!(line.trim_end().ends_with(" us"), "{line:?}");
        }
    }
    assert_eq!(total.get("fnprof_rust_twice"), Some(&5000));
    assert_eq!(total.get("fnprof_rust_work"), Some(&10000));

    // Starting again starts from zero.
    start(functions("fnprof_rust_*"));
    fnprof_rust_work(3);
    profile::stop().unwrap();
    assert_eq!(stat("fnprof_rust_work").unwrap().hits, 1);
    assert!(stat("fnprof_rust_twice").is_none());
}

#[test]
fn average_and_variance_follow_the_durations() {
    let _g = serial();
    let Some(lib) = c_lib() else { return };
    // SAFETY: signature as in C_SOURCE.
    let sleep_ms: extern "C" fn(i64) = unsafe { std::mem::transmute(sym(lib, "fp_sleep_ms")) };
    start(functions("fp_sleep_ms"));
    // 1 ms and 5 ms alternately: mean 3 ms, sample variance 10/9 * 4 ms².
    for i in 0..10 {
        sleep_ms(if i % 2 == 0 { 1 } else { 5 });
    }
    profile::stop().unwrap();
    let s = stat("fp_sleep_ms").unwrap();
    assert_eq!(s.hits, 10);
    assert_eq!(s.avg(), s.time / 10);
    // A loaded machine oversleeps, by about as much each time: the mean moves up, the
    // spread much less.
    let avg_ms = s.avg() as f64 / 1e6;
    assert!((3.0..15.0).contains(&avg_ms), "avg {avg_ms} ms");
    // s² as printed is in ns²/1000 (shown as µs² by the duration printer).
    let expected = 10.0 / 9.0 * 4.0 * 1e12 / 1000.0;
    let s2 = s.s2() as f64;
    assert!(
        s2 > expected * 0.3 && s2 < expected * 10.0,
        "s² {s2} vs {expected}"
    );
    // And the file prints the same numbers.
    let line = profile::format_stats(std::slice::from_ref(&s), 0);
    let line = line.lines().nth(2).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[0], "fp_sleep_ms");
    assert_eq!(fields[1], "10");
    assert_eq!(fields[2].parse::<f64>().unwrap() as u64, s.time / 1000);
    assert_eq!(fields[4].parse::<f64>().unwrap() as u64, s.avg() / 1000);
}

#[test]
fn counts_stay_exact_with_more_threads_than_cpus() {
    let _g = serial();
    let secs: f64 = std::env::var("USTRACE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) * 4;
    start(functions("fnprof_rust_*"));
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut calls = 0u64;
                while std::time::Instant::now() < deadline {
                    for i in 0..100 {
                        std::hint::black_box(fnprof_rust_twice(t as u64 + i));
                    }
                    calls += 100;
                }
                calls
            })
        })
        .collect();
    let made: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(profile::missed(), 0);
    profile::stop().unwrap();
    assert_eq!(stat("fnprof_rust_twice").unwrap().hits, made);
    assert_eq!(stat("fnprof_rust_work").unwrap().hits, 2 * made);
    eprintln!("{threads} threads, {made} calls");
}

#[test]
fn function_profile_enabled_follows_set_ftrace_filter() {
    let _g = serial();
    common::write("set_ftrace_filter", "fnprof_rust_*").unwrap();
    common::write("set_ftrace_notrace", "fnprof_rust_work").unwrap();
    assert_eq!(common::read("function_profile_enabled").unwrap(), "0\n");
    assert_eq!(
        common::write("function_profile_enabled", "x\n"),
        Err(ustrace::Errno::EINVAL)
    );
    common::write("function_profile_enabled", "1\n").unwrap();
    assert_eq!(common::read("function_profile_enabled").unwrap(), "1\n");
    // Writing 1 over 1 changes nothing (the counts go on).
    fnprof_rust_twice(1);
    common::write("function_profile_enabled", "1").unwrap();
    for i in 0..99 {
        fnprof_rust_twice(i);
    }
    common::write("function_profile_enabled", "0").unwrap();
    assert_eq!(common::read("function_profile_enabled").unwrap(), "0\n");
    assert_eq!(stat("fnprof_rust_twice").unwrap().hits, 100);
    assert!(stat("fnprof_rust_work").is_none(), "in set_ftrace_notrace");
    let listed: u64 = (0..profile::current().unwrap().cpus())
        .map(|cpu| common::read(&format!("trace_stat/function{cpu}")).unwrap())
        .flat_map(|t| {
            t.lines()
                .filter(|l| l.trim_start().starts_with("fnprof_rust_twice "))
                .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
                .collect::<Vec<_>>()
        })
        .sum();
    assert_eq!(listed, 100);
    assert!(common::read("trace_stat/function999").is_err());
    assert!(common::read("instances/x/function_profile_enabled").is_err());
    common::write("set_ftrace_filter", "").unwrap();
    common::write("set_ftrace_notrace", "").unwrap();
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn fnprof_bench_target(x: u64) -> u64 {
    std::hint::black_box(x ^ 0x5a)
}

/// The cost of a profiled call: `cargo test --release -p ustrace --test fnprof
/// profiled_call_cost -- --ignored --nocapture` prints ns per call without and with the
/// profiler (medians of 7 runs of 2M calls) and checks every call was counted.
#[test]
#[ignore]
fn profiled_call_cost() {
    let _g = serial();
    fn run(n: u64) -> f64 {
        let t = std::time::Instant::now();
        let mut acc = 0;
        for i in 0..n {
            acc ^= fnprof_bench_target(i);
        }
        std::hint::black_box(acc);
        t.elapsed().as_nanos() as f64 / n as f64
    }
    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
    let n = 2_000_000;
    let plain = median((0..7).map(|_| run(n)).collect());
    // The same fprobe with handlers that do nothing: what the patching itself costs.
    let target = functions("fnprof_bench_target")[0].0;
    let empty = ustrace_fprobe::Fprobe::builder()
        .entry_handler(|_, _, _, _, _| ustrace_fprobe::EntryAction::Continue)
        .exit_handler(|_, _, _, _, _| {})
        .entry_data_size(24)
        .register_ips(&[target])
        .unwrap();
    let probed = median((0..7).map(|_| run(n)).collect());
    empty.unregister().unwrap();
    start(functions("fnprof_bench_target"));
    let profiled = median((0..7).map(|_| run(n)).collect());
    profile::stop().unwrap();
    assert_eq!(stat("fnprof_bench_target").unwrap().hits, 7 * n);
    eprintln!(
        "plain call {plain:.1} ns, empty fprobe entry+exit {probed:.1} ns, profiled {profiled:.1} ns: \
         profiler +{:.1} ns per call, of which its handlers +{:.1} ns",
        profiled - plain,
        profiled - probed
    );
}

#[test]
fn graph_time_option_and_tracing_thresh_shape_the_stat_files() {
    let _g = serial();
    let Some(lib) = c_lib() else { return };
    // SAFETY: signature as in C_SOURCE.
    let outer: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(sym(lib, "fp_outer")) };
    common::write("set_ftrace_filter", "fp_outer fp_heavy\n").unwrap();
    assert_eq!(common::read("options/graph-time").unwrap(), "1\n");
    common::write("options/graph-time", "0").unwrap();
    common::write("function_profile_enabled", "1").unwrap();
    for _ in 0..50 {
        outer(100_000);
    }
    common::write("function_profile_enabled", "0").unwrap();
    common::write("options/graph-time", "1").unwrap();
    let (o, h) = (stat("fp_outer").unwrap(), stat("fp_heavy").unwrap());
    assert_eq!((o.hits, h.hits), (50, 100));
    assert!(
        o.time * 4 < h.time,
        "own {} ns, callees {} ns",
        o.time,
        h.time
    );

    // tracing_thresh (µs) leaves out the functions whose average is below it.
    let listed = |name: &str| {
        (0..profile::current().unwrap().cpus())
            .map(|cpu| common::read(&format!("trace_stat/function{cpu}")).unwrap())
            .any(|t| t.lines().any(|l| l.trim_start().starts_with(name)))
    };
    assert!(listed("fp_outer ") && listed("fp_heavy "));
    let thresh_us = h.avg() / 1000 + 1;
    common::write("tracing_thresh", &format!("{thresh_us}\n")).unwrap();
    let heavy_listed = listed("fp_heavy ");
    common::write("tracing_thresh", "0\n").unwrap();
    assert!(!heavy_listed, "fp_heavy's average is below the threshold");
    assert!(listed("fp_heavy "), "listed again without a threshold");
    common::write("set_ftrace_filter", "").unwrap();
}
