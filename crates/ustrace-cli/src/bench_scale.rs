//! `ustrace bench --scale`: how the cost of the hot paths grows as the work grows.
//!
//! Each curve keeps the operation and changes one quantity:
//! - `events_enabled`: one event written per operation, cycling over 1, 100 or 10,000
//!   distinct events, all enabled in one instance. The events are created at run time (as
//!   dynamic events are: registry, then every instance) and their probe records the way a
//!   dynamic event's does (`wants_record`, then `record`), so the curve shows what many
//!   event files, ids and their cache lines cost on the write path;
//! - `fprobe_functions`: calls spread over 1, 100 or 1,000 generated C functions, all
//!   probed by one fprobe whose handler does nothing;
//! - `writers`: 1, 2, 4 and 8 threads writing a three-integer event into one instance with
//!   the default buffer size, nobody reading: events/s in all and per thread, events lost
//!   (dropped, or overrun while committing) and events overwritten by newer ones;
//! - `filter_predicates`: a filter of 1, 3, 10 or 30 predicates that rejects every event
//!   at its last predicate (all of them evaluated);
//! - `attach_functions`: the time to attach one fprobe to 10, 100, 1,000 and 10,000
//!   generated functions, and to take it off.
//!
//! The generated functions (`f0` ... `f9999`) are assembly, built at run time with the
//! system `cc` into a shared object this process loads: assembling 10,000 functions takes
//! well under a second where compiling them as C takes about ten. Every count the issue
//! names exists there, so no curve is capped; without `cc` the curves that need them say
//! `skipped: <why>`.
//!
//! Every figure is checked as `bench`'s are: each event recorded (none where a filter
//! rejects), no fprobe call missed.

use std::ffi::CString;
use std::hint::black_box;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ustrace::event::{registry, EventClass, FieldDesc, Layout};
use ustrace::trace::{tracing, EventFile};
use ustrace::{Errno, FileSystem};

use crate::bench_measure::{
    infallible, json_escape, median, set, tally, time_per_op, time_probed, time_recorded, Settings,
};

/// The curves `--scale` reports, in order.
pub const NAMES: [&str; 5] = [
    "events_enabled",
    "fprobe_functions",
    "writers",
    "filter_predicates",
    "attach_functions",
];

const EVENT_COUNTS: [usize; 3] = [1, 100, 10_000];
const PROBED_COUNTS: [usize; 3] = [1, 100, 1_000];
const WRITERS: [usize; 4] = [1, 2, 4, 8];
const PREDICATES: [usize; 4] = [1, 3, 10, 30];
const ATTACH_COUNTS: [usize; 4] = [10, 100, 1_000, 10_000];
/// Generated functions: the largest count any curve needs.
const FUNCTIONS: usize = 10_000;

const INSTANCE: &str = "ustrace-scale";
const SYSTEM: &str = "ustrace_scale";
/// Common header and three u64 fields.
const RECORD_LEN: usize = 32;

ustrace::trace_event! {
    /// The event the `writers` and `filter_predicates` curves write.
    fn ustrace_scale::ints3(a: u64, b: u64, c: u64) {
        a: u64 = a,
        b: u64 = b,
        c: u64 = c,
    }
    print "a=%llu b=%llu c=%llu", a, b, c;
}

/// The event file each runtime event writes to while it is enabled: its probe. Loaded once
/// per write; published and taken away under RCU, as tracepoint probes are.
fn slots() -> &'static [AtomicPtr<EventFile>] {
    static SLOTS: OnceLock<Box<[AtomicPtr<EventFile>]>> = OnceLock::new();
    SLOTS.get_or_init(|| {
        (0..EVENT_COUNTS[EVENT_COUNTS.len() - 1])
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect()
    })
}

/// A runtime-created event of three integers, `ustrace_scale:eK`.
struct ScaleEvent {
    name: String,
    slot: usize,
}

/// Keeps the event file alive while the slot points at it.
struct SlotAttachment {
    slot: usize,
    file: Arc<EventFile>,
}

impl ustrace::event::Attachment for SlotAttachment {
    fn detach(self: Box<Self>) {
        slots()[self.slot].store(std::ptr::null_mut(), Ordering::Release);
        // Writers that loaded the pointer are inside a read section; after this none is.
        ustrace::rcu::synchronize();
        drop(self.file);
    }
}

impl EventClass for ScaleEvent {
    fn system(&self) -> &str {
        SYSTEM
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn fields(&self) -> Vec<FieldDesc> {
        let mut layout = Layout::new();
        layout.push::<u64>("a").push::<u64>("b").push::<u64>("c");
        layout.finish()
    }
    fn print_fmt(&self, _: &[FieldDesc]) -> String {
        "\"a=%llu b=%llu c=%llu\", REC->a, REC->b, REC->c".into()
    }
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn ustrace::event::Attachment>, Errno> {
        let slot = &slots()[self.slot];
        let ptr = Arc::as_ptr(&file).cast_mut();
        // One probe per slot: the bench enables each event in one instance only.
        slot.compare_exchange(
            std::ptr::null_mut(),
            ptr,
            Ordering::Release,
            Ordering::Relaxed,
        )
        .map_err(|_| Errno::EBUSY)?;
        Ok(Box::new(SlotAttachment {
            slot: self.slot,
            file,
        }))
    }
}

/// Writes one event per iteration, cycling over the first `m` slots.
#[inline(never)]
fn slot_loop(slots: &[AtomicPtr<EventFile>], m: usize, n: u64) {
    let mut k = 0;
    for i in 0..n {
        let guard = ustrace::rcu::read_lock();
        let p = slots[k].load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: a non-null slot points at the event file its attachment holds, which
            // is dropped only after the slot is cleared and a grace period has passed; we
            // are inside a read section.
            let file = unsafe { &*p };
            if file.wants_record() {
                file.record(RECORD_LEN, |r| {
                    r[8..16].copy_from_slice(&i.to_ne_bytes());
                    r[16..24].copy_from_slice(&(k as u64).to_ne_bytes());
                    r[24..32].copy_from_slice(&7u64.to_ne_bytes());
                });
            }
        }
        drop(guard);
        k += 1;
        if k == m {
            k = 0;
        }
    }
}

/// One point of a curve.
struct Point {
    curve: &'static str,
    count: usize,
    /// `(key, value)` pairs, printed in order.
    values: Vec<(&'static str, f64)>,
}

/// The runtime events of `events_enabled`, removed from every instance and the registry
/// when dropped.
struct RuntimeEvents(Vec<ustrace::event::EventId>);

impl Drop for RuntimeEvents {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            tracing().remove_event(id);
            registry().remove(id);
        }
    }
}

fn events_enabled(n: u64, reps: usize, out: &mut Vec<Point>) -> Result<(), String> {
    let inst = tracing()
        .instance(INSTANCE)
        .ok_or("scale instance vanished")?;
    let mut events = RuntimeEvents(Vec::new());
    let max = EVENT_COUNTS[EVENT_COUNTS.len() - 1];
    for slot in 0..max {
        let event = registry()
            .add(Arc::new(ScaleEvent {
                name: format!("e{slot}"),
                slot,
            }))
            .map_err(|e| format!("create {SYSTEM}:e{slot}: {e}"))?;
        tracing().add_event(event.clone());
        events.0.push(event.id);
    }
    // The baseline: the same loop over slots with nothing enabled.
    let base = time_per_op(n, reps, infallible(|k| slot_loop(slots(), max, k)))?.ns_per_op;
    let files: Vec<_> = events
        .0
        .iter()
        .map(|id| inst.file(*id).ok_or("event file missing"))
        .collect::<Result<_, _>>()?;
    let mut enabled = 0;
    let mut result = Ok(());
    for m in EVENT_COUNTS {
        for file in &files[enabled..m] {
            if let Err(e) = file.set_enabled(true) {
                result = Err(format!("enable {SYSTEM}:{}: {e}", file.event.name()));
                break;
            }
            enabled += 1;
        }
        if result.is_err() {
            break;
        }
        match time_recorded(
            "events_enabled",
            inst.buffer(),
            1,
            n,
            reps,
            infallible(|k| slot_loop(slots(), m, k)),
        ) {
            Ok(ns) => out.push(Point {
                curve: "events_enabled",
                count: m,
                values: vec![("ns_per_op", ns), ("baseline_ns_per_op", base)],
            }),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    for file in &files[..enabled] {
        let _ = file.set_enabled(false);
    }
    result
}

/// The generated functions, loaded into this process.
struct Generated {
    funcs: &'static [extern "C" fn(i64, i64) -> i64],
    calls: extern "C" fn(i64, i64) -> i64,
}

fn generated_source() -> String {
    let mut s = String::with_capacity(FUNCTIONS * 160);
    s.push_str("\t.text\n");
    for k in 0..FUNCTIONS {
        // Each is `long fK(long a, long b) { return (a * 31) ^ b + K; }`: distinct code,
        // with whole instructions in the first five bytes as compiled C has.
        s.push_str(&format!(
            "\t.globl f{k}\n\t.type f{k}, @function\n\t.p2align 4\nf{k}:\n\
             \timulq $31, %rdi, %rax\n\txorq %rsi, %rax\n\taddq ${k}, %rax\n\tret\n\
             \t.size f{k}, .-f{k}\n"
        ));
    }
    s.push_str(
        "\t.section .data.rel.ro,\"aw\"\n\t.globl scale_funcs\n\t.p2align 3\nscale_funcs:\n",
    );
    for k in 0..FUNCTIONS {
        s.push_str(&format!("\t.quad f{k}\n"));
    }
    s.push_str("\t.section .note.GNU-stack,\"\",@progbits\n");
    s
}

const CALLS_C: &str = "\
typedef long (*fn_t)(long, long);
extern const fn_t scale_funcs[];
/* n calls spread over the first m generated functions, in turn. */
__attribute__((noinline)) long scale_calls(long n, long m)
{
    long acc = 0, k = 0;
    for (long i = 0; i < n; i++) {
        acc += scale_funcs[k](i, 7);
        if (++k == m)
            k = 0;
    }
    return acc;
}
";

fn generate(dir: &Path) -> Result<Generated, String> {
    std::fs::write(dir.join("funcs.s"), generated_source()).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("calls.c"), CALLS_C).map_err(|e| e.to_string())?;
    let lib = dir.join("libustrace_scale.so");
    let out = Command::new("cc")
        .current_dir(dir)
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .args(["calls.c", "funcs.s"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("no C compiler (`cc`): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let cpath = CString::new(lib.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path of a library we just built; it has no constructors.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("dlopen {}: failed", lib.display()));
    }
    let sym = |name: &std::ffi::CStr| {
        // SAFETY: a live handle (never closed) and a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        (!p.is_null())
            .then_some(p)
            .ok_or_else(|| format!("{name:?} not found in the generated library"))
    };
    let table = sym(c"scale_funcs")?;
    let calls = sym(c"scale_calls")?;
    // SAFETY: `scale_funcs` is an array of FUNCTIONS pointers to functions of this
    // signature, and `scale_calls` is `long (long, long)`; the library stays loaded for
    // the rest of the process, so the slice is 'static.
    unsafe {
        Ok(Generated {
            funcs: std::slice::from_raw_parts(table.cast(), FUNCTIONS),
            calls: std::mem::transmute::<*mut libc::c_void, extern "C" fn(i64, i64) -> i64>(calls),
        })
    }
}

fn fprobe_functions(
    gen: &Generated,
    n: u64,
    reps: usize,
    out: &mut Vec<Point>,
) -> Result<(), String> {
    for m in PROBED_COUNTS {
        let body = |k: u64| {
            black_box((gen.calls)(k as i64, m as i64));
        };
        let base = time_per_op(n, reps, infallible(body))?.ns_per_op;
        let ips: Vec<usize> = gen.funcs[..m].iter().map(|f| *f as usize).collect();
        let fp = ustrace_fprobe::Fprobe::builder()
            .entry_handler(|_, _, _, _, _| ustrace_fprobe::EntryAction::Continue)
            .register_ips(&ips)
            .map_err(|e| format!("fprobe_functions: fprobe on {m} functions: {e}"))?;
        let t = time_probed("fprobe_functions", fp, n, reps, infallible(body))?;
        out.push(Point {
            curve: "fprobe_functions",
            count: m,
            values: vec![("ns_per_op", t.ns_per_op), ("baseline_ns_per_op", base)],
        });
    }
    Ok(())
}

fn attach_functions(gen: &Generated, reps: usize, out: &mut Vec<Point>) -> Result<(), String> {
    for m in ATTACH_COUNTS {
        let ips: Vec<usize> = gen.funcs[..m].iter().map(|f| *f as usize).collect();
        let (mut on, mut off) = (Vec::new(), Vec::new());
        // Attaching thousands of functions is slow enough to time with few repetitions.
        for _ in 0..reps.min(3) {
            let start = Instant::now();
            let fp = ustrace_fprobe::Fprobe::builder()
                .entry_handler(|_, _, _, _, _| ustrace_fprobe::EntryAction::Continue)
                .register_ips(&ips)
                .map_err(|e| format!("attach_functions: fprobe on {m} functions: {e}"))?;
            on.push(start.elapsed().as_secs_f64() * 1e3);
            let start = Instant::now();
            fp.unregister()
                .map_err(|e| format!("attach_functions: unregister: {e}"))?;
            off.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let (on, off) = (median(on), median(off));
        out.push(Point {
            curve: "attach_functions",
            count: m,
            values: vec![
                ("attach_ms", on),
                ("detach_ms", off),
                ("attach_us_per_function", on * 1e3 / m as f64),
            ],
        });
    }
    Ok(())
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

/// `count` predicates joined by `&&`: all but the last pass every event of
/// [`ints3_loop`] (`c` is always 7), the last rejects it.
fn rejecting_filter(count: usize) -> String {
    let mut preds: Vec<String> = (0..count - 1)
        .map(|k| format!("c != {}", 100 + k))
        .collect();
    preds.push("c == 99".into());
    preds.join(" && ")
}

fn filter_predicates(n: u64, reps: usize, out: &mut Vec<Point>) -> Result<(), String> {
    let inst = tracing()
        .instance(INSTANCE)
        .ok_or("scale instance vanished")?;
    let event = format!("instances/{INSTANCE}/events/{SYSTEM}/ints3");
    let base = time_per_op(
        n,
        reps,
        infallible(|k| {
            let mut acc = 0u64;
            for i in 0..k {
                acc = acc.wrapping_add(black_box(i));
            }
            black_box(acc);
        }),
    )?
    .ns_per_op;
    set(&format!("{event}/enable"), "1\n")?;
    let mut result = Ok(());
    for count in PREDICATES {
        let r = set(
            &format!("{event}/filter"),
            &format!("{}\n", rejecting_filter(count)),
        )
        .and_then(|()| {
            time_recorded(
                "filter_predicates",
                inst.buffer(),
                0,
                n,
                reps,
                infallible(ints3_loop),
            )
        });
        match r {
            Ok(ns) => out.push(Point {
                curve: "filter_predicates",
                count,
                values: vec![("ns_per_op", ns), ("baseline_ns_per_op", base)],
            }),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let _ = set(&format!("{event}/enable"), "0\n");
    let _ = set(&format!("{event}/filter"), "0\n");
    result
}

fn writers(n: u64, reps: usize, out: &mut Vec<Point>) -> Result<(), String> {
    // An instance of its own so the buffer is the default size whatever the others did.
    let name = "ustrace-scale-writers";
    let _ = tracing().remove_instance(name);
    let inst = tracing()
        .create_instance(name)
        .map_err(|e| format!("mkdir instances/{name}: {e}"))?;
    let kb: f64 = ustrace::tracefs()
        .read_to_string(&format!("instances/{name}/buffer_size_kb"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN);
    let enable = format!("instances/{name}/events/{SYSTEM}/ints3/enable");
    let result = set(&enable, "1\n").and_then(|()| {
        for threads in WRITERS {
            let mut rates = Vec::with_capacity(reps);
            let before = stats(inst.buffer());
            for _ in 0..reps {
                let go = Arc::new(AtomicBool::new(false));
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let go = go.clone();
                        std::thread::spawn(move || {
                            while !go.load(Ordering::Acquire) {
                                std::hint::spin_loop();
                            }
                            ints3_loop(n);
                        })
                    })
                    .collect();
                let start = Instant::now();
                go.store(true, Ordering::Release);
                let panicked = handles.into_iter().filter_map(|h| h.join().err()).count();
                let secs = start.elapsed().as_secs_f64();
                if panicked != 0 {
                    return Err(format!("writers: {panicked} of {threads} threads panicked"));
                }
                rates.push((threads as u64 * n) as f64 / secs);
            }
            let after = stats(inst.buffer());
            let expected = threads as u64 * n * reps as u64;
            let (written, lost, overwritten) = (
                after.0 - before.0,
                after.1 - before.1,
                after.2 - before.2,
            );
            if written + lost != expected {
                return Err(format!(
                    "writers: {written} events written and {lost} lost by {threads} threads, expected {expected} in all"
                ));
            }
            let rate = median(rates);
            out.push(Point {
                curve: "writers",
                count: threads,
                values: vec![
                    ("events_per_s", rate),
                    ("events_per_s_per_thread", rate / threads as f64),
                    ("lost", lost as f64),
                    ("overwritten", overwritten as f64),
                    ("events", expected as f64),
                    ("buffer_size_kb", kb),
                ],
            });
        }
        Ok(())
    });
    let _ = set(&enable, "0\n");
    drop(inst);
    let _ = tracing().remove_instance(name);
    result
}

/// Written, lost (dropped or overrun while committing) and overwritten events, all CPUs.
fn stats(buffer: &ustrace_ringbuf::RingBuffer) -> (u64, u64, u64) {
    let (written, lost) = tally(buffer);
    let overwritten = (0..buffer.nr_cpus())
        .map(|cpu| buffer.stats(cpu).overrun)
        .sum();
    (written, lost, overwritten)
}

/// The scratch directory of the generated library; removed when the bench ends (the
/// loaded library stays mapped).
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(args: &Settings) -> Result<(), String> {
    let n = args.iterations.max(1000);
    let reps = args.repetitions.max(1);
    let mut points = Vec::new();
    let mut skipped: Vec<(&'static str, String)> = Vec::new();

    let _ = tracing().remove_instance(INSTANCE);
    tracing()
        .create_instance(INSTANCE)
        .map_err(|e| format!("mkdir instances/{INSTANCE}: {e}"))?;
    set(&format!("instances/{INSTANCE}/buffer_size_kb"), "4096\n")?;
    let measured = events_enabled(n, reps, &mut points).and_then(|()| {
        let dir = std::env::temp_dir().join(format!("ustrace-scale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let scratch = Scratch(dir);
        match generate(&scratch.0) {
            Ok(gen) => {
                fprobe_functions(&gen, n, reps, &mut points)?;
                writers(n, reps, &mut points)?;
                filter_predicates(n, reps, &mut points)?;
                attach_functions(&gen, reps, &mut points)?;
            }
            Err(why) => {
                skipped.push(("fprobe_functions", why.clone()));
                writers(n, reps, &mut points)?;
                filter_predicates(n, reps, &mut points)?;
                skipped.push(("attach_functions", why));
            }
        }
        Ok(())
    });
    let removed = tracing()
        .remove_instance(INSTANCE)
        .map_err(|e| format!("rmdir instances/{INSTANCE}: {e}"));
    measured?;
    removed?;
    print(&points, &skipped, args.json, n, reps);
    Ok(())
}

fn print(points: &[Point], skipped: &[(&str, String)], json: bool, n: u64, reps: usize) {
    if !json {
        outln!("ustrace bench --scale (median of {reps} x {n} operations per point)");
    }
    for curve in NAMES {
        if let Some((_, why)) = skipped.iter().find(|(c, _)| *c == curve) {
            if json {
                outln!(
                    "{{\"name\": \"{curve}\", \"skipped\": \"{}\"}}",
                    json_escape(why)
                );
            } else {
                outln!("{curve:<20} skipped: {why}");
            }
            continue;
        }
        for p in points.iter().filter(|p| p.curve == curve) {
            if json {
                let values: String = p
                    .values
                    .iter()
                    .map(|(k, v)| format!(", \"{k}\": {v:.3}"))
                    .collect();
                outln!(
                    "{{\"name\": \"{}\", \"count\": {}{values}}}",
                    p.curve,
                    p.count
                );
            } else {
                let values: Vec<String> = p
                    .values
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.2}"))
                    .collect();
                outln!("{:<20} {:>6}  {}", p.curve, p.count, values.join("  "));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejecting_filter_has_the_predicates_asked_for() {
        for count in PREDICATES {
            let f = rejecting_filter(count);
            assert_eq!(f.matches("c ").count(), count, "{f}");
            assert!(f.ends_with("c == 99"), "{f}");
        }
    }

    #[test]
    fn the_generated_functions_are_all_there() {
        let s = generated_source();
        assert_eq!(s.matches("\tret\n").count(), FUNCTIONS);
        assert_eq!(s.matches("\t.quad f").count(), FUNCTIONS);
        assert!(FUNCTIONS >= *ATTACH_COUNTS.iter().max().unwrap());
        assert!(FUNCTIONS >= *PROBED_COUNTS.iter().max().unwrap());
    }
}
