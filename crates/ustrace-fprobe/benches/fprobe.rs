//! fprobe hit cost against the same uninstrumented function in the same run, and the cost of
//! registering one fprobe on 1,000 functions.
//!
//! `cargo bench -p ustrace-fprobe --bench fprobe`

use std::hint::black_box;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use ustrace_fprobe::{EntryAction, Fprobe};

#[no_mangle]
#[inline(never)]
pub extern "C" fn bench_target(x: u64) -> u64 {
    let v = black_box(x);
    v.wrapping_mul(0x9e37_79b9).rotate_left(13) ^ 1
}

/// Per-call cost as the minimum over batches: robust against the preemption a shared machine
/// adds to criterion's means.
fn min_ns_per_call() -> f64 {
    const CALLS: u64 = 20_000;
    let mut best = f64::MAX;
    for _ in 0..300 {
        let t = Instant::now();
        for i in 0..CALLS {
            black_box(bench_target(black_box(i)));
        }
        best = best.min(t.elapsed().as_nanos() as f64 / CALLS as f64);
    }
    best
}

fn print_min_of_batches() {
    let base = min_ns_per_call();
    let fp = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .register_syms(&["bench_target"])
        .expect("register entry");
    let entry = min_ns_per_call();
    fp.unregister().unwrap();
    let fp = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .exit_handler(|_, _, _, _, _| {})
        .register_syms(&["bench_target"])
        .expect("register entry+exit");
    let entry_exit = min_ns_per_call();
    fp.unregister().unwrap();
    eprintln!(
        "min-of-batches ns/call: uninstrumented {base:.2}, fprobe_entry {entry:.2} (+{:.2}), fprobe_entry_exit {entry_exit:.2} (+{:.2})",
        entry - base,
        entry_exit - base
    );
}

fn hit_cost(c: &mut Criterion) {
    if let Some(why) = ustrace_fprobe::check_patchable(bench_target as *const () as usize) {
        eprintln!("skipped: bench_target cannot be probed: {why}");
        return;
    }
    print_min_of_batches();
    let mut g = c.benchmark_group("fprobe");
    g.bench_function("uninstrumented", |b| b.iter(|| bench_target(black_box(7))));
    {
        let fp = Fprobe::builder()
            .entry_handler(|_, _, _, _, _| EntryAction::Continue)
            .register_syms(&["bench_target"])
            .expect("register entry");
        g.bench_function("fprobe_entry", |b| b.iter(|| bench_target(black_box(7))));
        fp.unregister().unwrap();
    }
    {
        let fp = Fprobe::builder()
            .entry_handler(|_, _, _, _, _| EntryAction::Continue)
            .exit_handler(|_, _, _, _, _| {})
            .register_syms(&["bench_target"])
            .expect("register entry+exit");
        g.bench_function("fprobe_entry_exit", |b| {
            b.iter(|| bench_target(black_box(7)))
        });
        fp.unregister().unwrap();
    }
    g.bench_function("uninstrumented_again", |b| {
        b.iter(|| bench_target(black_box(7)))
    });
    g.finish();
}

/// Builds a shared library with `n` patchable C functions and loads it.
fn thousand_functions(n: usize) -> Option<()> {
    // One fixed place under cargo's target tmp dir: each run rebuilds it rather than leaving
    // another copy behind.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fprobe-bench");
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("many.c");
    let mut code = String::from("#include <stdint.h>\nvolatile uint64_t sink;\n");
    for i in 0..n {
        code.push_str(&format!(
            "__attribute__((noinline)) uint64_t bench_many_{i}(uint64_t x) {{ sink = x; return x * {k} + sink; }}\n",
            k = i + 3
        ));
    }
    std::fs::write(&src, code).ok()?;
    let so = dir.join("libmany.so");
    let ok = Command::new("cc")
        .args(["-O1", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .ok()?
        .success();
    if !ok {
        return None;
    }
    let path = std::ffi::CString::new(so.to_str()?).ok()?;
    // SAFETY: loading a library we just built.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    (!h.is_null()).then_some(())
}

fn register_cost(c: &mut Criterion) {
    const N: usize = 1000;
    if thousand_functions(N).is_none() {
        eprintln!("skipped: cannot build the 1,000-function library (no cc?)");
        return;
    }
    // The first registration also analyses the 1,000 prologues and builds their stubs.
    let _ = ustrace_inspect::symbols::inventory();
    let t = Instant::now();
    let fp = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .register("bench_many_*", None)
        .expect("register 1000");
    eprintln!(
        "cold register of one fprobe on {} functions (analysis + stubs + patch): {:.2} ms",
        fp.functions().len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(fp);
    let mut g = c.benchmark_group("fprobe_register");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("register_1000_functions", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                let fp = Fprobe::builder()
                    .entry_handler(|_, _, _, _, _| EntryAction::Continue)
                    .register("bench_many_*", None)
                    .expect("register 1000");
                total += t.elapsed();
                assert_eq!(
                    fp.functions().len(),
                    N,
                    "refused: {:?}",
                    fp.refused().first()
                );
                drop(fp);
            }
            total
        })
    });
    g.bench_function("unregister_1000_functions", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let fp = Fprobe::builder()
                    .entry_handler(|_, _, _, _, _| EntryAction::Continue)
                    .register("bench_many_*", None)
                    .expect("register 1000");
                let t = Instant::now();
                fp.unregister().unwrap();
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, hit_cost, register_cost);
criterion_main!(benches);
