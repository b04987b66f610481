//! `ustrace bench`: what each hot path costs on this machine.
//!
//! Every figure is the median of several repetitions of a timed loop, reported as ns per
//! operation beside a baseline: the same loop with the operation taken out, timed in the same
//! run and named in the output (`"baseline"` in the JSON):
//! - `add_loop`: `acc = acc.wrapping_add(black_box(i))` per iteration. The tracepoint, event,
//!   filter, soft-disabled and eprobe loops are this loop plus one tracepoint call.
//! - `call_loop`: an unprobed call of the `#[inline(never)]` function the fprobe figures probe.
//!   `fprobe_trampoline_floor` is the same call of a function with the same body patched to
//!   enter the fprobe entry trampoline with an empty function for a dispatcher
//!   ([`ustrace_fprobe::bench`]): the floor of an entry probe with this register frame.
//!   `fprobe_trampoline_floor_exit` is the same with its return hooked as well, both
//!   trampolines' frames saved and restored, and only the return address kept aside and put
//!   back between them: the floor under `fprobe_entry_exit`.
//! - `index_loop`: `black_box(i)` per iteration. The ring-buffer loop is this loop plus one
//!   reserve/copy/commit, the clock loop this loop plus one clock read.
//! - `index_loop_2threads`: two threads running `index_loop`, started and joined as the two
//!   ring-buffer writers are, so thread start-up is in both.
//! - `tracing_no_subscriber`: `add_loop` plus a `tracing::info!` with three integer fields,
//!   timed before any `tracing` subscriber is installed. `tracing_event_off` is the same
//!   loop with the ustrace layer installed and the callsite's event off;
//!   `tracing_event_3fields` with it recording (baseline `add_loop`), and beside it, as
//!   `fmt_layer_ns`, the same event through `tracing-subscriber`'s fmt layer into a sink.
//!
//! Only completed operations count. After each loop the bench checks that every operation
//! did its work: the buffer recorded exactly one event per call where one is expected (none
//! where a filter or soft-disable should stop it) and lost none, every reservation was granted,
//! no fprobe call was missed, every writer thread finished, every probe came off. Otherwise the
//! bench fails with the reason instead of reporting a figure for work that did not happen.
//!
//! - `hist_update_1key`: `add_loop` plus one `ints3` event whose only consumer is a hist
//!   trigger `hist:keys=a:vals=b` (u64 key, hitcount and one sum): the record is built aside,
//!   the key hashed and found in a warm table (64 keys cycling, as a few hot keys are in
//!   most histograms, claimed in the warm-up), the sums added. `_2threads` is two such writers on disjoint keys, beside `index_loop_2threads`.
//!   Every update is checked against the histogram's `Hits`.
//!
//! JSON names are an interface: [`NAMES`]; `ring_buffer_write_32b_2threads` and
//! `hist_update_1key_2threads` add `scaling`, `tracing_event_3fields` adds `fmt_layer_ns`.
//! `--filter` takes one of them or a glob over them (`fprobe*`); a filter that matches no name
//! is an error. `clock_local_read` is the default trace clock alone (a TSC read scaled to ns):
//! every event write pays it, so it is the floor under `ring_buffer_write_32b`.
//!
//! `synth_onmatch_pair` is one request/response pair of events matched by a key through hist
//! variables, generating and recording one synthetic event ([`crate::bench_inter`]); its
//! baseline is `add_loop`.
//!
//! `--peers` (the other tracers on one C workload, [`crate::bench_peers`]) and `--scale` (cost
//! curves as the work grows, [`crate::bench_scale`]) are runs of their own with their own rows.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ustrace::trace::tracing;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

use crate::bench_measure::{
    append, infallible, median, set, tally, time_per_op, time_probed, time_recorded, Settings,
};

/// Every figure the bench reports, in the order it reports them.
pub const NAMES: [&str; 25] = [
    "tracepoint_off",
    "tracepoint_off_load",
    "tracepoint_noop_probe",
    "event_3ints",
    "filter_reject_3preds",
    "event_string16",
    "event_soft_disabled",
    "fprobe_entry",
    "fprobe_entry_exit",
    "fprobe_trampoline_floor",
    "fprobe_trampoline_floor_exit",
    "fprobe_event_2args",
    "function_tracer_call",
    "function_graph_call",
    "function_graph_enable_all",
    "eprobe_on_event",
    "hist_update_1key",
    "hist_update_1key_2threads",
    "ring_buffer_write_32b",
    "ring_buffer_write_32b_2threads",
    "clock_local_read",
    "tracing_event_off",
    "tracing_event_3fields",
    "synth_onmatch_pair",
    "record_drain_mb_s",
];

#[derive(clap::Args)]
pub struct BenchArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Operations per timed repetition (at least 1000).
    #[arg(long, default_value_t = 2_000_000)]
    pub iterations: u64,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub repetitions: usize,
    /// Run only the figure of this name, or those a glob matches (`fprobe*`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Compare with the tracers people would otherwise use (LTTng-UST, uftrace, the kernel's
    /// uprobes, the `tracing` crate) on the same C workload, in this run.
    #[arg(long, conflicts_with_all = ["filter", "scale"])]
    pub peers: bool,
    /// With `--peers`: the table as Markdown, with a sentence per row (as in the README).
    #[arg(long, requires = "peers", conflicts_with = "json")]
    pub markdown: bool,
    /// Print how the cost grows with the work: events enabled, functions probed, writer
    /// threads, filter predicates, functions attached.
    #[arg(long, conflicts_with = "filter")]
    pub scale: bool,
}

impl BenchArgs {
    fn settings(&self) -> Settings {
        Settings {
            json: self.json,
            markdown: self.markdown,
            iterations: self.iterations,
            repetitions: self.repetitions,
        }
    }
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
    baseline: &'static str,
    baseline_ns_per_op: f64,
    extra: Option<(&'static str, f64)>,
}

/// `*` any run of characters, `?` any one character, everything else itself.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (None, None) => true,
        (Some((b'*', rest)), _) => {
            glob(rest, name) || name.split_first().is_some_and(|(_, n)| glob(pattern, n))
        }
        (Some((p, rest)), Some((c, n))) if *p == b'?' || p == c => glob(rest, n),
        _ => false,
    }
}

/// The figures `--filter` asks for; all of them without one.
fn select(filter: Option<&str>) -> Result<Vec<&'static str>, String> {
    let Some(filter) = filter else {
        return Ok(NAMES.to_vec());
    };
    let picked: Vec<_> = NAMES
        .iter()
        .copied()
        .filter(|name| glob(filter.as_bytes(), name.as_bytes()))
        .collect();
    if picked.is_empty() {
        return Err(format!(
            "no benchmark is named {filter:?} (a name or a glob such as 'fprobe*'); the names are:\n  {}",
            NAMES.join("\n  ")
        ));
    }
    Ok(picked)
}

/// Defines the dynamic event `definition` (`f:GROUP/EVENT ...` or `e:GROUP/EVENT ...`),
/// enables it in `instance`, times `body` with [`time_recorded`] (one event per operation),
/// then disables and removes the event again, also when the timing failed.
fn time_dynamic_event(
    name: &str,
    instance: &str,
    definition: &str,
    (buffer, n, reps): (&RingBuffer, u64, usize),
    body: impl FnMut(u64) -> Result<(), String>,
) -> Result<f64, String> {
    let event = definition
        .split_whitespace()
        .next()
        .and_then(|head| head.split_once(':'))
        .map(|(_, event)| event)
        .ok_or_else(|| format!("{name}: no event name in {definition:?}"))?;
    let enable = format!("instances/{instance}/events/{event}/enable");
    append("dynamic_events", &format!("{definition}\n"))?;
    set(&enable, "1\n")?;
    let timed = time_recorded(name, buffer, 1, n, reps, body);
    set(&enable, "0\n")?;
    append("dynamic_events", &format!("-:{event}\n"))?;
    timed
}

/// The `add_loop` baseline.
#[inline(never)]
fn add_loop(n: u64) {
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

/// Keys one hist-figure writer cycles over.
const HIST_KEYS: u64 = 64;

/// `ints3` events whose key `a` cycles over [`HIST_KEYS`] values from `base` (the hist
/// figures).
#[inline(never)]
fn hist_loop(n: u64, base: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        ints3::trace(base + (i % HIST_KEYS), acc, 7);
    }
    black_box(acc);
}

/// The `Hits` total of a `hist` file's first section.
fn hist_hits(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Hits:"))
        .and_then(|v| v.trim().parse().ok())
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

/// The `tracing` event of the `tracing_*` figures: three integers.
#[inline(never)]
fn tracing3_loop(n: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        tracing::info!(name: "fields3", a = i, b = acc, c = 7u64);
    }
    black_box(acc);
}

/// The same event at a callsite of its own, for the fmt layer, so that its dispatcher does
/// not change the interest of the callsite ustrace is measured on.
#[inline(never)]
fn tracing3_fmt_loop(n: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(black_box(i));
        tracing::info!(name: "fields3", a = i, b = acc, c = 7u64);
    }
    black_box(acc);
}

/// The ustrace `tracing` figures. The layer becomes the process's global subscriber, so
/// they run after every other figure.
fn tracing_figures(
    n: u64,
    reps: usize,
    wanted: &dyn Fn(&str) -> bool,
    baselines: &mut Baselines,
    push: &mut dyn FnMut(&'static str, f64, &'static str, Option<(&'static str, f64)>),
) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    // Timed first: once a subscriber is installed, the callsite is never without one again.
    let none = time_per_op(n, reps, infallible(tracing3_loop))?.ns_per_op;
    baselines.timed.push(("tracing_no_subscriber", none));
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(ustrace_tracing::layer()),
    )
    .map_err(|e| format!("tracing: {e}"))?;
    if wanted("tracing_event_off") {
        let t = time_per_op(n, reps, infallible(tracing3_loop))?;
        push(
            "tracing_event_off",
            t.ns_per_op,
            "tracing_no_subscriber",
            None,
        );
    }
    if wanted("tracing_event_3fields") {
        let instance = "ustrace-bench-tracing";
        let _ = tracing().remove_instance(instance);
        tracing()
            .create_instance(instance)
            .map_err(|e| format!("mkdir instances/{instance}: {e}"))?;
        let inst = tracing()
            .instance(instance)
            .ok_or("bench instance vanished")?;
        let path = |p: &str| format!("instances/{instance}/{p}");
        set(&path("buffer_size_kb"), "4096\n")?;
        // Without a subscriber `tracing` skipped the callsite at its level check, so it may
        // not be registered yet: one pass registers it (and records nothing, it is off).
        tracing3_loop(1);
        // The system is the target, `ustrace::bench` here.
        let enable = path("events/ustrace_bench/fields3/enable");
        set(&enable, "1\n")?;
        let ns = time_recorded(
            "tracing_event_3fields",
            inst.buffer(),
            1,
            n,
            reps,
            infallible(tracing3_loop),
        );
        set(&enable, "0\n")?;
        drop(inst);
        tracing()
            .remove_instance(instance)
            .map_err(|e| format!("rmdir instances/{instance}: {e}"))?;
        let ns = ns?;
        let fmt = tracing_subscriber::fmt()
            .with_writer(std::io::sink)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let fmt_ns = tracing::subscriber::with_default(fmt, || {
            time_per_op(n / 10 + 1, reps, infallible(tracing3_fmt_loop))
        })?
        .ns_per_op;
        push(
            "tracing_event_3fields",
            ns,
            "add_loop",
            Some(("fmt_layer_ns", fmt_ns)),
        );
    }
    Ok(())
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

/// `call_loop` through the floor trampoline.
#[inline(never)]
fn floor_loop(n: u64) {
    sum_of_calls(n, |a, b| ustrace_fprobe::bench::trampoline_floor_call(a, b));
}

/// `call_loop` through the entry-and-return floor trampolines.
#[inline(never)]
fn floor_exit_loop(n: u64) {
    sum_of_calls(n, |a, b| {
        ustrace_fprobe::bench::trampoline_floor_exit_call(a, b)
    });
}

/// `call_loop`'s body for another function, called directly (inlined into each loop).
#[inline(always)]
fn sum_of_calls(n: u64, f: impl Fn(u64, u64) -> u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(f(black_box(i), 7));
    }
    black_box(acc);
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

/// The `index_loop` baseline.
#[inline(never)]
fn index_loop(n: u64) {
    for i in 0..n {
        black_box(i);
    }
}

#[inline(never)]
fn clock_loop(n: u64) {
    for _ in 0..n {
        black_box(ustrace_ringbuf::clock::now(Clock::Local));
    }
}

/// Writes `n` 32-byte events; returns how many reservations were refused.
#[inline(never)]
fn ring_loop(buffer: &RingBuffer, n: u64) -> u64 {
    let mut refused = 0;
    for i in 0..n {
        match buffer.reserve(32) {
            Some(mut slot) => {
                slot[..8].copy_from_slice(&i.to_ne_bytes());
                slot.commit();
            }
            None => refused += 1,
        }
    }
    refused
}

/// [`ring_loop`] for [`time_per_op`]: a refused reservation fails the figure.
fn ring_writes(buffer: &RingBuffer) -> impl FnMut(u64) -> Result<(), String> + '_ {
    move |n| match ring_loop(buffer, n) {
        0 => Ok(()),
        refused => Err(format!(
            "ring_buffer_write_32b: {refused} of {n} reservations refused"
        )),
    }
}

/// The first two CPUs this process may run on, if it may run on two.
fn two_allowed_cpus() -> Option<[usize; 2]> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, which sched_getaffinity fills.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size is that of the set we pass.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return None;
    }
    // SAFETY: CPU_ISSET reads the set we own, at indices below its capacity.
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some([cpus.next()?, cpus.next()?])
}

/// Keeps the calling thread on `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes one bit of it, and
    // sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Two threads each run `work(n)` (which returns its failed operations) from a common start;
/// returns ns per operation of the pair. A thread that panics or fails an operation fails
/// the measurement. Each thread is kept on a CPU of its own (when the process may use two):
/// the figure is two writers on two CPUs, each owning its CPU's buffer. Left to the
/// scheduler, both could share one CPU, and one preempted between reserve and commit while
/// the other laps that CPU's buffer would lose events to a commit overrun.
pub(crate) fn two_threads(
    work: impl Fn(u64) -> u64 + Clone + Send + 'static,
    n: u64,
) -> Result<f64, String> {
    let go = Arc::new(AtomicBool::new(false));
    let cpus = two_allowed_cpus();
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let (work, go) = (work.clone(), go.clone());
            std::thread::spawn(move || {
                if let Some(cpus) = cpus {
                    pin_to(cpus[i]);
                }
                while !go.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                work(n)
            })
        })
        .collect();
    let start = Instant::now();
    go.store(true, Ordering::Release);
    let mut failed = 0;
    let mut panicked = 0;
    for t in threads {
        match t.join() {
            Ok(f) => failed += f,
            Err(_) => panicked += 1,
        }
    }
    let elapsed = start.elapsed();
    if panicked != 0 {
        return Err(format!("{panicked} of 2 writer threads panicked"));
    }
    if failed != 0 {
        return Err(format!("{failed} of {} operations failed", 2 * n));
    }
    // Two threads did 2n operations in this time: ns per operation of the pair.
    Ok(elapsed.as_nanos() as f64 / (2 * n) as f64)
}

/// The figures of `ring_buffer_write_32b` (one writer) and `_2threads` (two), with every
/// event checked to be recorded.
fn ring_figures(buffer: &Arc<RingBuffer>, n: u64, reps: usize) -> Result<(f64, f64), String> {
    let one = time_recorded(
        "ring_buffer_write_32b",
        buffer,
        1,
        n,
        reps,
        ring_writes(buffer),
    )?;
    let before = tally(buffer);
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let b = buffer.clone();
        samples.push(
            two_threads(move |k| ring_loop(&b, k), n)
                .map_err(|e| format!("ring_buffer_write_32b_2threads: {e}"))?,
        );
    }
    let after = tally(buffer);
    let expected = 2 * n * reps as u64;
    if after.0 - before.0 != expected || after.1 != before.1 {
        return Err(format!(
            "ring_buffer_write_32b_2threads: {} events recorded and {} lost, expected {expected} and 0",
            after.0 - before.0,
            after.1 - before.1
        ));
    }
    Ok((one, median(samples)))
}

/// The figures of `hist_update_1key` (one writer) and `_2threads` (two, on disjoint keys):
/// the event is not enabled, so nothing is recorded and the hist trigger is the only work;
/// every update must show in the histogram's `Hits`.
fn hist_figures(
    path: &dyn Fn(&str) -> String,
    buffer: &RingBuffer,
    n: u64,
    reps: usize,
) -> Result<(f64, f64), String> {
    let trigger = path("events/ustrace_bench/ints3/trigger");
    let hist = path("events/ustrace_bench/ints3/hist");
    set(&trigger, "hist:keys=a:vals=b\n")?;
    let before = tally(buffer);
    let timed = (|| {
        let one = time_per_op(n, reps, infallible(|k| hist_loop(k, 0)))?;
        // The second thread's keys are claimed here, so both runs find a warm table.
        let warm = n / 10 + 1;
        hist_loop(warm, HIST_KEYS);
        let turn = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut samples = Vec::with_capacity(reps);
        for _ in 0..reps {
            let turn = turn.clone();
            let ns = two_threads(
                move |k| {
                    let base = (turn.fetch_add(1, Ordering::Relaxed) % 2) * HIST_KEYS;
                    hist_loop(k, base);
                    0
                },
                n,
            )
            .map_err(|e| format!("hist_update_1key_2threads: {e}"))?;
            samples.push(ns);
        }
        Ok::<_, String>((one, warm, samples))
    })();
    let text = read_all(&hist);
    set(&trigger, "!hist:keys=a:vals=b\n")?;
    let (one, warm, samples) = timed?;
    let expected = one.ops + warm + 2 * n * reps as u64;
    let hits = hist_hits(&text?).ok_or("hist_update_1key: no Hits in the hist file")?;
    if hits != expected {
        return Err(format!(
            "hist_update_1key: {hits} hist updates for {expected} events"
        ));
    }
    let after = tally(buffer);
    if after != before {
        return Err("hist_update_1key: the disabled event recorded events".into());
    }
    Ok((one.ns_per_op, median(samples)))
}

/// A whole tracefs file.
fn read_all(path: &str) -> Result<String, String> {
    use ustrace::{FileSystem, OpenFlags};
    let mut file = ustrace::tracefs()
        .open(path, OpenFlags::READ)
        .map_err(|e| format!("open {path}: {e}"))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file
            .read(&mut buf, None)
            .map_err(|e| format!("read {path}: {e}"))?;
        if n == 0 {
            return String::from_utf8(out).map_err(|e| format!("{path}: {e}"));
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Baselines, each timed once, the first time a figure needs it.
struct Baselines {
    n: u64,
    reps: usize,
    timed: Vec<(&'static str, f64)>,
}

impl Baselines {
    fn get(&mut self, name: &'static str) -> Result<f64, String> {
        if let Some(&(_, ns)) = self.timed.iter().find(|(b, _)| *b == name) {
            return Ok(ns);
        }
        let ns = match name {
            "add_loop" => time_per_op(self.n, self.reps, infallible(add_loop))?.ns_per_op,
            "call_loop" => time_per_op(self.n, self.reps, infallible(call_loop))?.ns_per_op,
            "index_loop" => time_per_op(self.n, self.reps, infallible(index_loop))?.ns_per_op,
            // A figure that is a whole duration, not a cost over some loop.
            "nothing" => 1.0,
            // Timed by `tracing_figures` itself, before it installs the layer.
            "tracing_no_subscriber" => return Err("tracing_no_subscriber was not timed".into()),
            "index_loop_2threads" => {
                let mut samples = Vec::with_capacity(self.reps);
                for _ in 0..self.reps {
                    samples.push(two_threads(
                        |k| {
                            index_loop(k);
                            0
                        },
                        self.n,
                    )?);
                }
                median(samples)
            }
            other => return Err(format!("no baseline named {other}")),
        };
        self.timed.push((name, ns));
        Ok(ns)
    }
}

/// Bytes of a ring-buffer page (`record_drain_mb_s` is timed per page).
const PAGE_SIZE_F: f64 = ustrace_ringbuf::page::PAGE_SIZE as f64;

pub fn run(args: BenchArgs) -> Result<(), String> {
    if args.peers {
        return crate::bench_peers::run(&args.settings());
    }
    if args.scale {
        return crate::bench_scale::run(&args.settings());
    }
    let n = args.iterations.max(1000);
    let reps = args.repetitions.max(1);
    let selected = select(args.filter.as_deref())?;
    let wanted = |name: &str| selected.contains(&name);
    let mut baselines = Baselines {
        n,
        reps,
        timed: Vec::new(),
    };
    let mut figures = Vec::new();
    let mut push = |name: &'static str, ns_per_op: f64, baseline: &'static str, extra| {
        figures.push((name, ns_per_op, baseline, extra));
    };

    if wanted("tracepoint_off") {
        let t = time_per_op(n, reps, infallible(tracepoint_loop))?;
        push("tracepoint_off", t.ns_per_op, "add_loop", None);
    }
    if wanted("tracepoint_off_load") {
        let t = time_per_op(n, reps, infallible(tracepoint_checked_loop))?;
        push("tracepoint_off_load", t.ns_per_op, "add_loop", None);
    }
    if wanted("tracepoint_noop_probe") {
        let id = bench_tp::register(0, |a, b, c| {
            black_box((a, b, c));
        });
        let t = time_per_op(n, reps, infallible(tracepoint_loop));
        bench_tp::TRACEPOINT
            .unregister(id)
            .map_err(|e| format!("tracepoint_noop_probe: unregister: {e:?}"))?;
        ustrace::tracepoint::synchronize_unregister();
        push("tracepoint_noop_probe", t?.ns_per_op, "add_loop", None);
    }

    let instance_figures = [
        "hist_update_1key",
        "hist_update_1key_2threads",
        "event_3ints",
        "filter_reject_3preds",
        "event_string16",
        "event_soft_disabled",
        "fprobe_event_2args",
        "eprobe_on_event",
    ];
    if instance_figures.iter().any(|f| wanted(f)) {
        // Events record into an instance of their own, so the bench leaves the top one alone.
        let instance = "ustrace-bench";
        let _ = tracing().remove_instance(instance);
        tracing()
            .create_instance(instance)
            .map_err(|e| format!("mkdir instances/{instance}: {e}"))?;
        let inst = tracing()
            .instance(instance)
            .ok_or("bench instance vanished")?;
        let buffer = inst.buffer();
        let path = |p: &str| format!("instances/{instance}/{p}");
        set(&path("buffer_size_kb"), "4096\n")?;
        if wanted("event_3ints") {
            set(&path("events/ustrace_bench/ints3/enable"), "1\n")?;
            let ns = time_recorded("event_3ints", buffer, 1, n, reps, infallible(ints3_loop))?;
            set(&path("events/ustrace_bench/ints3/enable"), "0\n")?;
            push("event_3ints", ns, "add_loop", None);
        }
        if wanted("filter_reject_3preds") {
            // Three predicates, all evaluated: the first two pass, the third rejects.
            set(
                &path("events/ustrace_bench/ints3/filter"),
                "a != 1 && b != 1 && c == 99\n",
            )?;
            set(&path("events/ustrace_bench/ints3/enable"), "1\n")?;
            let ns = time_recorded(
                "filter_reject_3preds",
                buffer,
                0,
                n,
                reps,
                infallible(ints3_loop),
            )?;
            set(&path("events/ustrace_bench/ints3/enable"), "0\n")?;
            set(&path("events/ustrace_bench/ints3/filter"), "0\n")?;
            push("filter_reject_3preds", ns, "add_loop", None);
        }
        if wanted("event_string16") {
            set(&path("events/ustrace_bench/string16/enable"), "1\n")?;
            let ns = time_recorded(
                "event_string16",
                buffer,
                1,
                n,
                reps,
                infallible(string16_loop),
            )?;
            set(&path("events/ustrace_bench/string16/enable"), "0\n")?;
            push("event_string16", ns, "add_loop", None);
        }
        if wanted("hist_update_1key") || wanted("hist_update_1key_2threads") {
            let (one, two) = hist_figures(&path, buffer, n, reps)?;
            if wanted("hist_update_1key") {
                push("hist_update_1key", one, "add_loop", None);
            }
            if wanted("hist_update_1key_2threads") {
                push(
                    "hist_update_1key_2threads",
                    two,
                    "index_loop_2threads",
                    Some(("scaling", one / two)),
                );
            }
        }
        if wanted("event_soft_disabled") {
            let id = ustrace::event::registry()
                .find("ustrace_bench", "ints3")
                .ok_or("bench event missing")?
                .id;
            let file = inst.file(id).ok_or("bench event file missing")?;
            file.soft_mode_get()
                .map_err(|e| format!("soft mode: {e}"))?;
            let ns = time_recorded(
                "event_soft_disabled",
                buffer,
                0,
                n,
                reps,
                infallible(ints3_loop),
            );
            file.soft_mode_put();
            push("event_soft_disabled", ns?, "add_loop", None);
        }
        if wanted("fprobe_event_2args") {
            let ns = time_dynamic_event(
                "fprobe_event_2args",
                instance,
                "f:ustrace_bench/fprobe2 ustrace_bench_target a=$arg1 b=$arg2",
                (buffer, n, reps),
                infallible(call_loop),
            )?;
            push("fprobe_event_2args", ns, "call_loop", None);
        }
        if wanted("eprobe_on_event") {
            let ns = time_dynamic_event(
                "eprobe_on_event",
                instance,
                "e:ustrace_bench/derived ustrace_bench.ints3 a=$a:u64 c=$c:u64",
                (buffer, n, reps),
                infallible(ints3_loop),
            )?;
            push("eprobe_on_event", ns, "add_loop", None);
        }
        drop(inst);
        tracing()
            .remove_instance(instance)
            .map_err(|e| format!("rmdir instances/{instance}: {e}"))?;
    }

    let target = ustrace_bench_target as extern "C" fn(u64, u64) -> u64 as usize;
    for (name, with_exit) in [("fprobe_entry", false), ("fprobe_entry_exit", true)] {
        if !wanted(name) {
            continue;
        }
        let mut builder = ustrace_fprobe::Fprobe::builder()
            .entry_handler(|_, _, _, _, _| ustrace_fprobe::EntryAction::Continue);
        if with_exit {
            builder = builder.exit_handler(|_, _, _, _, _| {});
        }
        let fp = builder
            .register_ips(&[target])
            .map_err(|e| format!("{name}: fprobe: {e}"))?;
        let t = time_probed(name, fp, n, reps, infallible(call_loop))?;
        push(name, t.ns_per_op, "call_loop", None);
    }

    if wanted("fprobe_trampoline_floor") {
        ustrace_fprobe::bench::prepare_trampoline_floor()
            .map_err(|e| format!("fprobe_trampoline_floor: {e}"))?;
        let t = time_per_op(n, reps, infallible(floor_loop))?;
        push("fprobe_trampoline_floor", t.ns_per_op, "call_loop", None);
    }
    if wanted("fprobe_trampoline_floor_exit") {
        ustrace_fprobe::bench::prepare_trampoline_floor_exit()
            .map_err(|e| format!("fprobe_trampoline_floor_exit: {e}"))?;
        let t = time_per_op(n, reps, infallible(floor_exit_loop))?;
        push(
            "fprobe_trampoline_floor_exit",
            t.ns_per_op,
            "call_loop",
            None,
        );
    }

    crate::bench_ftrace::figures(n, reps, &wanted, &mut push)?;

    if wanted("ring_buffer_write_32b") || wanted("ring_buffer_write_32b_2threads") {
        let buffer = Arc::new(ring_buffer("bench-ring")?);
        let (one, two) = ring_figures(&buffer, n, reps)?;
        if wanted("ring_buffer_write_32b") {
            push("ring_buffer_write_32b", one, "index_loop", None);
        }
        if wanted("ring_buffer_write_32b_2threads") {
            // Throughput of two threads over one thread's: (1/two) / (1/one).
            push(
                "ring_buffer_write_32b_2threads",
                two,
                "index_loop_2threads",
                Some(("scaling", one / two)),
            );
        }
    }

    if wanted("clock_local_read") {
        ustrace_ringbuf::clock::init();
        let t = time_per_op(n, reps, infallible(clock_loop))?;
        push("clock_local_read", t.ns_per_op, "index_loop", None);
    }

    if wanted("tracing_event_off") || wanted("tracing_event_3fields") {
        tracing_figures(n, reps, &wanted, &mut baselines, &mut push)?;
    }

    if wanted("synth_onmatch_pair") {
        let ns = crate::bench_inter::synth_onmatch_pair(n, reps)?;
        push("synth_onmatch_pair", ns, "add_loop", None);
    }

    if wanted("record_drain_mb_s") {
        // ns per 4 KiB page, against memcpy of the same pages; the extra is the rate.
        let (drain, copy, _) = crate::bench_record::record_drain(reps)?;
        baselines.timed.push(("memcpy_page", copy));
        push(
            "record_drain_mb_s",
            drain,
            "memcpy_page",
            Some(("mb_s", PAGE_SIZE_F * 1e3 / drain)),
        );
    }

    figures.sort_by_key(|f| NAMES.iter().position(|n| *n == f.0));
    let figures = figures
        .into_iter()
        .map(|(name, ns_per_op, baseline, extra)| {
            Ok(Figure {
                name,
                ns_per_op,
                baseline,
                baseline_ns_per_op: baselines.get(baseline)?,
                extra,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    print(&figures, args.json, reps, n);
    Ok(())
}

fn print(figures: &[Figure], json: bool, reps: usize, n: u64) {
    if json {
        for f in figures {
            let extra = f
                .extra
                .map(|(k, v)| format!(", \"{k}\": {v:.3}"))
                .unwrap_or_default();
            outln!(
                "{{\"name\": \"{}\", \"ns_per_op\": {:.3}, \"baseline\": \"{}\", \"baseline_ns_per_op\": {:.3}, \"ratio\": {:.3}{extra}}}",
                f.name,
                f.ns_per_op,
                f.baseline,
                f.baseline_ns_per_op,
                f.ns_per_op / f.baseline_ns_per_op
            );
        }
    } else {
        outln!(
            "{:<34} {:>10} {:>12} {:>8}  {:<20} (median of {reps} x {n} ops)",
            "benchmark",
            "ns/op",
            "baseline ns",
            "ratio",
            "baseline"
        );
        for f in figures {
            let extra = f
                .extra
                .map(|(k, v)| {
                    // A ratio reads as one; `*_ns` extras are times.
                    let unit = if k.ends_with("_ns") || k == "mb_s" {
                        ""
                    } else {
                        "x"
                    };
                    format!("  {k} {v:.2}{unit}")
                })
                .unwrap_or_default();
            outln!(
                "{:<34} {:>10.2} {:>12.2} {:>8.2}  {}{extra}",
                f.name,
                f.ns_per_op,
                f.baseline_ns_per_op,
                f.ns_per_op / f.baseline_ns_per_op,
                f.baseline
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_picks_names_exactly_or_by_glob() {
        assert_eq!(select(Some("tracepoint_off")).unwrap(), ["tracepoint_off"]);
        assert_eq!(
            select(Some("fprobe_entry_exit")).unwrap(),
            ["fprobe_entry_exit"]
        );
        assert_eq!(
            select(Some("fprobe*")).unwrap(),
            [
                "fprobe_entry",
                "fprobe_entry_exit",
                "fprobe_trampoline_floor",
                "fprobe_trampoline_floor_exit",
                "fprobe_event_2args"
            ]
        );
        assert_eq!(
            select(Some("ring_buffer_write_32b?2threads")).unwrap(),
            ["ring_buffer_write_32b_2threads"]
        );
        assert_eq!(select(Some("*")).unwrap(), NAMES);
        assert_eq!(select(None).unwrap(), NAMES);
        for name in NAMES {
            assert_eq!(select(Some(name)).unwrap(), [name]);
        }
        let err = select(Some("fprobe")).unwrap_err();
        assert!(err.contains("fprobe_entry_exit"), "{err}");
    }

    #[test]
    fn a_refused_reservation_fails_the_figure() {
        // Producer/consumer mode with nobody reading: the third page's worth of events is
        // refused.
        let buffer = Arc::new(
            RingBuffer::new(Config {
                nr_cpus: ustrace_ringbuf::cpu::possible_cpus(),
                size_per_cpu: 8192,
                overwrite: false,
                clock: Clock::Local,
                name: "bench-refusing".into(),
            })
            .unwrap(),
        );
        let err = ring_figures(&buffer, 100_000, 1).unwrap_err();
        assert!(err.contains("reservations refused"), "{err}");
    }

    #[test]
    fn a_panicking_writer_fails_the_measurement() {
        let err = two_threads(|_| panic!("writer failed"), 10).unwrap_err();
        assert!(err.contains("panicked"), "{err}");
        let err = two_threads(|n| n, 10).unwrap_err();
        assert!(err.contains("20 of 20 operations failed"), "{err}");
    }

    #[test]
    fn recorded_events_are_counted_against_operations() {
        let buffer = ring_buffer("bench-count").unwrap();
        // One event per operation where none is expected.
        let err = time_recorded("t", &buffer, 0, 1000, 1, ring_writes(&buffer)).unwrap_err();
        assert!(err.contains("events recorded for"), "{err}");
        // None where one is expected.
        let err = time_recorded("t", &buffer, 1, 1000, 1, infallible(index_loop)).unwrap_err();
        assert!(
            err.contains("0 events recorded for 1101 operations"),
            "{err}"
        );
        time_recorded("t", &buffer, 1, 1000, 1, ring_writes(&buffer)).unwrap();
    }
}
