//! `ustrace bench`: what each hot path costs on this machine.
//!
//! Every figure is the median of several repetitions of a timed loop, reported as ns per
//! operation and as a ratio to an uninstrumented loop measured in the same run. The loops
//! are written so the instrumented one differs from its baseline only by the operation.
//!
//! JSON names are an interface: `tracepoint_off`, `tracepoint_noop_probe`, `event_3ints`,
//! `event_string16`, `event_soft_disabled`, `filter_reject_3preds`, `ring_buffer_write_32b`,
//! `ring_buffer_write_32b_2threads` (which adds `scaling`), `fprobe_entry`,
//! `fprobe_entry_exit`, `fprobe_event_2args` and `eprobe_on_event`. The fprobe figures use
//! an uninstrumented call of the same `#[inline(never)]` function as their baseline.
//! `clock_local_read` is the default trace clock alone (a TSC read scaled to ns): every
//! event write pays it, so it is the floor under `ring_buffer_write_32b` on this machine.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ustrace::trace::tracing;
use ustrace::{FileSystem, OpenFlags};
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Operations per timed repetition.
    #[arg(long, default_value_t = 2_000_000)]
    pub iterations: u64,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub repetitions: usize,
    /// Run only the benchmarks whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
}

ustrace::declare_tracepoint! {
    /// The tracepoint the tracepoint figures call.
    fn bench_tp(a: u64, b: u64, c: u64);
}

ustrace::trace_event! {
    /// Three integers, the `event_3ints` figure.
    fn ustrace_bench::ints3(a: u64, b: u64, c: u64) {
        a: u64 = a,
        b: u64 = b,
        c: u64 = c,
    }
    print "a=%llu b=%llu c=%llu", a, b, c;
}

ustrace::trace_event! {
    /// A 16-byte string, the `event_string16` figure.
    fn ustrace_bench::string16(s: &str) {
        s: &str = s,
    }
    print "s=%s", s;
}

/// One reported figure.
struct Figure {
    name: &'static str,
    ns_per_op: f64,
    baseline_ns_per_op: f64,
    extra: Option<(&'static str, f64)>,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

/// Times `body(iterations)` `reps` times; returns the median ns per iteration.
fn time_per_op(iterations: u64, reps: usize, mut body: impl FnMut(u64)) -> f64 {
    body(iterations / 10 + 1); // warm caches, fault in buffer pages
    let samples = (0..reps)
        .map(|_| {
            let start = Instant::now();
            body(iterations);
            start.elapsed().as_nanos() as f64 / iterations as f64
        })
        .collect();
    median(samples)
}

#[inline(never)]
fn baseline_loop(n: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
    }
    black_box(acc);
}

#[inline(never)]
fn tracepoint_loop(n: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        bench_tp::trace(i, acc, 7);
    }
    black_box(acc);
}

#[inline(never)]
fn tracepoint_checked_loop(n: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        bench_tp::trace_checked(i, acc, 7);
    }
    black_box(acc);
}

#[inline(never)]
fn ints3_loop(n: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        ints3::trace(i, acc, 7);
    }
    black_box(acc);
}

#[inline(never)]
fn string16_loop(n: u64) {
    let mut acc = 0u64;
    let text = black_box("0123456789abcdef");
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        string16::trace(text);
    }
    black_box(acc);
}

/// The function the fprobe figures probe; its unprobed calls are their baseline.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ustrace_bench_target(a: u64, b: u64) -> u64 {
    black_box(a.wrapping_mul(31) ^ b)
}

#[inline(never)]
fn call_loop(n: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(ustrace_bench_target(black_box(i), 7));
    }
    black_box(acc);
}

fn append(path: &str, text: &str) -> Result<(), String> {
    let mut file = ustrace::tracefs()
        .open(path, OpenFlags::APPEND)
        .map_err(|e| format!("open {path}: {e}"))?;
    file.write(text.as_bytes())
        .map_err(|e| format!("write {path}: {e}"))?;
    Ok(())
}

fn set(path: &str, text: &str) -> Result<(), String> {
    let mut file = ustrace::tracefs()
        .open(path, OpenFlags::TRUNCATE)
        .map_err(|e| format!("open {path}: {e}"))?;
    file.write(text.as_bytes())
        .map_err(|e| format!("write {path}: {e}"))?;
    Ok(())
}

fn ring_buffer(name: &str) -> Result<RingBuffer, String> {
    RingBuffer::new(Config {
        nr_cpus: ustrace_ringbuf::cpu::possible_cpus(),
        size_per_cpu: 4 << 20,
        overwrite: true,
        clock: Clock::Local,
        name: name.into(),
    })
    .map_err(|e| format!("ring buffer: {e}"))
}

#[inline(never)]
fn clock_loop(n: u64) {
    for _ in 0..n {
        black_box(ustrace_ringbuf::clock::now(Clock::Local));
    }
}

#[inline(never)]
fn ring_loop(buffer: &RingBuffer, n: u64) {
    for i in 0..n {
        if let Some(mut slot) = buffer.reserve(32) {
            slot[..8].copy_from_slice(&i.to_ne_bytes());
            slot.commit();
        }
    }
}

/// Two writers, each pinned by the scheduler as it likes; returns ns per event per thread.
fn ring_two_threads(buffer: &Arc<RingBuffer>, n: u64) -> f64 {
    let go = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (buffer, go, done) = (buffer.clone(), go.clone(), done.clone());
            std::thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                ring_loop(&buffer, n);
                done.fetch_add(1, Ordering::Release);
            })
        })
        .collect();
    let start = Instant::now();
    go.store(true, Ordering::Release);
    for t in threads {
        let _ = t.join();
    }
    // Two threads did 2n events in this time: ns per event of the pair.
    start.elapsed().as_nanos() as f64 / (2 * n) as f64
}

pub fn run(args: BenchArgs) -> Result<(), String> {
    let n = args.iterations.max(1000);
    let reps = args.repetitions.max(1);
    let wanted = |name: &str| args.filter.as_deref().is_none_or(|f| name.contains(f));
    let mut figures = Vec::new();
    let baseline = time_per_op(n, reps, baseline_loop);

    if wanted("tracepoint_off") {
        figures.push(Figure {
            name: "tracepoint_off",
            ns_per_op: time_per_op(n, reps, tracepoint_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
        figures.push(Figure {
            name: "tracepoint_off_load",
            ns_per_op: time_per_op(n, reps, tracepoint_checked_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
    }
    if wanted("tracepoint_noop_probe") {
        let id = bench_tp::register(0, |a, b, c| {
            black_box((a, b, c));
        });
        figures.push(Figure {
            name: "tracepoint_noop_probe",
            ns_per_op: time_per_op(n, reps, tracepoint_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
        let _ = bench_tp::TRACEPOINT.unregister(id);
        ustrace::tracepoint::synchronize_unregister();
    }

    // Events record into an instance of their own, so the bench leaves the top one alone.
    let instance = "ustrace-bench";
    let _ = tracing().remove_instance(instance);
    tracing()
        .create_instance(instance)
        .map_err(|e| format!("mkdir instances/{instance}: {e}"))?;
    let path = |p: &str| format!("instances/{instance}/{p}");
    set(&path("buffer_size_kb"), "4096\n")?;
    if wanted("event_3ints") {
        set(&path("events/ustrace_bench/ints3/enable"), "1\n")?;
        figures.push(Figure {
            name: "event_3ints",
            ns_per_op: time_per_op(n, reps, ints3_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
        set(&path("events/ustrace_bench/ints3/enable"), "0\n")?;
    }
    if wanted("filter_reject_3preds") {
        // Three predicates, all evaluated: the first two pass, the third rejects.
        set(
            &path("events/ustrace_bench/ints3/filter"),
            "a != 1 && b != 1 && c == 99\n",
        )?;
        set(&path("events/ustrace_bench/ints3/enable"), "1\n")?;
        figures.push(Figure {
            name: "filter_reject_3preds",
            ns_per_op: time_per_op(n, reps, ints3_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
        set(&path("events/ustrace_bench/ints3/enable"), "0\n")?;
        set(&path("events/ustrace_bench/ints3/filter"), "0\n")?;
    }
    if wanted("event_string16") {
        set(&path("events/ustrace_bench/string16/enable"), "1\n")?;
        figures.push(Figure {
            name: "event_string16",
            ns_per_op: time_per_op(n, reps, string16_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
        set(&path("events/ustrace_bench/string16/enable"), "0\n")?;
    }
    if wanted("event_soft_disabled") {
        let inst = tracing()
            .instance(instance)
            .ok_or("bench instance vanished")?;
        let id = ustrace::event::registry()
            .find("ustrace_bench", "ints3")
            .ok_or("bench event missing")?
            .id;
        let file = inst.file(id).ok_or("bench event file missing")?;
        file.soft_mode_get()
            .map_err(|e| format!("soft mode: {e}"))?;
        figures.push(Figure {
            name: "event_soft_disabled",
            ns_per_op: time_per_op(n, reps, ints3_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
        file.soft_mode_put();
    }
    let any_fprobe = ["fprobe_entry", "fprobe_entry_exit", "fprobe_event_2args"]
        .iter()
        .any(|n| wanted(n));
    let call_baseline = if any_fprobe {
        time_per_op(n, reps, call_loop)
    } else {
        0.0
    };
    let target = ustrace_bench_target as extern "C" fn(u64, u64) -> u64 as usize;
    if wanted("fprobe_entry") {
        let fp = ustrace_fprobe::Fprobe::builder()
            .entry_handler(|_, _, _, _, _| ustrace_fprobe::EntryAction::Continue)
            .register_ips(&[target])
            .map_err(|e| format!("fprobe: {e}"))?;
        figures.push(Figure {
            name: "fprobe_entry",
            ns_per_op: time_per_op(n, reps, call_loop),
            baseline_ns_per_op: call_baseline,
            extra: None,
        });
        fp.unregister().map_err(|e| format!("fprobe: {e}"))?;
        let fp = ustrace_fprobe::Fprobe::builder()
            .entry_handler(|_, _, _, _, _| ustrace_fprobe::EntryAction::Continue)
            .exit_handler(|_, _, _, _, _| {})
            .register_ips(&[target])
            .map_err(|e| format!("fprobe: {e}"))?;
        figures.push(Figure {
            name: "fprobe_entry_exit",
            ns_per_op: time_per_op(n, reps, call_loop),
            baseline_ns_per_op: call_baseline,
            extra: None,
        });
        fp.unregister().map_err(|e| format!("fprobe: {e}"))?;
    }
    if wanted("fprobe_event_2args") {
        append(
            "dynamic_events",
            "f:ustrace_bench/fprobe2 ustrace_bench_target a=$arg1 b=$arg2\n",
        )?;
        set(&path("events/ustrace_bench/fprobe2/enable"), "1\n")?;
        figures.push(Figure {
            name: "fprobe_event_2args",
            ns_per_op: time_per_op(n, reps, call_loop),
            baseline_ns_per_op: call_baseline,
            extra: None,
        });
        set(&path("events/ustrace_bench/fprobe2/enable"), "0\n")?;
        append("dynamic_events", "-:ustrace_bench/fprobe2\n")?;
    }
    if wanted("eprobe_on_event") {
        append(
            "dynamic_events",
            "e:ustrace_bench/derived ustrace_bench.ints3 a=$a:u64 c=$c:u64\n",
        )?;
        set(&path("events/ustrace_bench/derived/enable"), "1\n")?;
        figures.push(Figure {
            name: "eprobe_on_event",
            ns_per_op: time_per_op(n, reps, ints3_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
        set(&path("events/ustrace_bench/derived/enable"), "0\n")?;
        append("dynamic_events", "-:ustrace_bench/derived\n")?;
    }
    let _ = tracing().remove_instance(instance);

    if wanted("ring_buffer_write_32b") {
        let buffer = Arc::new(ring_buffer("bench-ring")?);
        let one = time_per_op(n, reps, |k| ring_loop(&buffer, k));
        figures.push(Figure {
            name: "ring_buffer_write_32b",
            ns_per_op: one,
            baseline_ns_per_op: baseline,
            extra: None,
        });
        let two = median((0..reps).map(|_| ring_two_threads(&buffer, n)).collect());
        figures.push(Figure {
            name: "ring_buffer_write_32b_2threads",
            ns_per_op: two,
            baseline_ns_per_op: baseline,
            // Throughput of two threads over one thread's: (1/two) / (1/one).
            extra: Some(("scaling", one / two)),
        });
    }

    if wanted("clock_local_read") {
        ustrace_ringbuf::clock::init();
        figures.push(Figure {
            name: "clock_local_read",
            ns_per_op: time_per_op(n, reps, clock_loop),
            baseline_ns_per_op: baseline,
            extra: None,
        });
    }

    if args.json {
        for f in &figures {
            let extra = f
                .extra
                .map(|(k, v)| format!(", \"{k}\": {v:.3}"))
                .unwrap_or_default();
            outln!(
                "{{\"name\": \"{}\", \"ns_per_op\": {:.3}, \"baseline_ns_per_op\": {:.3}, \"ratio\": {:.3}{extra}}}",
                f.name,
                f.ns_per_op,
                f.baseline_ns_per_op,
                f.ns_per_op / f.baseline_ns_per_op
            );
        }
    } else {
        outln!(
            "{:<34} {:>10} {:>12} {:>8}   (median of {reps} x {n} ops)",
            "benchmark",
            "ns/op",
            "baseline ns",
            "ratio"
        );
        for f in &figures {
            let extra = f
                .extra
                .map(|(k, v)| format!("  {k} {v:.2}x"))
                .unwrap_or_default();
            outln!(
                "{:<34} {:>10.2} {:>12.2} {:>8.2}{extra}",
                f.name,
                f.ns_per_op,
                f.baseline_ns_per_op,
                f.ns_per_op / f.baseline_ns_per_op
            );
        }
    }
    Ok(())
}
