//! `ustrace bench --peers`: the same workload under the tracers people would otherwise use,
//! measured in one run beside ustrace.
//!
//! The workload is C (`c/peers_work.c`, built here at run time with the system `cc`): a
//! function `long work(long a, long b)` called in a loop, and the same loop with an event
//! of three integers. Function tracers probe `work`; event tracers record the event:
//! - ustrace, in this process: the workload built as a shared object and loaded, `work`
//!   probed by an fprobe through the Rust API and by `dynamic_events` (`f:` events recorded
//!   into an instance), the event a `trace_event!` beside the call in a Rust loop;
//! - uftrace: the workload built with `-pg` and with `-fpatchable-function-entry`, entry
//!   and exit recorded, without and with `-A`/`-R` arguments;
//! - the kernel's uprobes: `p:` and `r:` probes on `work` in the plain build, through
//!   `/sys/kernel/tracing/uprobe_events`, recorded into an instance of our own;
//! - LTTng-UST: a tracepoint of three integers, a snapshot session active;
//! - the `tracing` crate: the event with a subscriber that does nothing, and with the fmt
//!   layer writing to a sink.
//!
//! Every row has a baseline timed in the same run (the loop without the instrumentation),
//! its overhead over it, and its ratio to the ustrace row doing the same work. Peers that
//! cost microseconds (uprobes trap into the kernel) or write to disk (uftrace) run fewer
//! iterations; ns per operation is comparable all the same. A peer that cannot run here
//! says `skipped: <why>` and the others still run.

use std::ffi::CString;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench_measure::{
    append, infallible, json_escape, set, time_per_op, time_probed, time_recorded, Settings,
};
use ustrace::trace::tracing as ustrace_tracing;

/// Every row `--peers` reports, in order. Rows whose tracer is missing are printed as
/// skipped, never left out.
pub const NAMES: [&str; 18] = [
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
    // Rows kept last so that the table reads peer by peer above them.
    "c_call_loop",
    "rust_call_loop",
];

/// The ustrace row each peer is compared with: the one doing the same work.
fn compared_with(name: &str) -> Option<&'static str> {
    Some(match name {
        "uftrace_pg_entry_exit" | "uftrace_fpe_entry_exit" | "uprobe_entry_return" => {
            "ustrace_dynevent_entry_exit"
        }
        "uftrace_pg_entry_exit_args" | "uftrace_fpe_entry_exit_args" => {
            "ustrace_dynevent_entry_exit_args"
        }
        "uprobe_entry" => "ustrace_dynevent_entry",
        "lttng_ust_3ints" | "tracing_null_3ints" | "tracing_fmt_sink_3ints" => {
            "ustrace_event_3ints"
        }
        _ => return None,
    })
}

/// What a row measures, in a sentence (the `--markdown` table's second column).
fn what(name: &str) -> &'static str {
    match name {
        "ustrace_fprobe_entry" => {
            "ustrace: fprobe on `work` (Rust API), entry handler that does nothing"
        }
        "ustrace_fprobe_entry_exit" => "ustrace: fprobe, entry and exit handlers",
        "ustrace_dynevent_entry" => "ustrace: `f:` event on `work` via `dynamic_events`, recorded",
        "ustrace_dynevent_entry_2args" => "ustrace: `f:` event with `a=$arg1 b=$arg2`, recorded",
        "ustrace_dynevent_entry_exit" => "ustrace: `f:` entry + `%return` events, recorded",
        "ustrace_dynevent_entry_exit_args" => {
            "ustrace: the same with `a=$arg1 b=$arg2` and `ret=$retval`"
        }
        "ustrace_event_3ints" => {
            "ustrace: `trace_event!` of three integers beside the call, recorded"
        }
        "uftrace_pg_entry_exit" => "uftrace, `-pg` build, entry + exit",
        "uftrace_pg_entry_exit_args" => "uftrace, `-pg`, `-A work@arg1,arg2 -R work@retval`",
        "uftrace_fpe_entry_exit" => "uftrace, `-fpatchable-function-entry=5` build (`-P work`)",
        "uftrace_fpe_entry_exit_args" => "uftrace, patchable entry, with `-A`/`-R`",
        "uprobe_entry" => "kernel uprobe (`p:`) on `work`, recorded in a kernel instance",
        "uprobe_entry_return" => "kernel uprobe `p:` + uretprobe `r:`",
        "lttng_ust_3ints" => "LTTng-UST tracepoint of three integers, snapshot session active",
        "tracing_null_3ints" => "`tracing` crate event, subscriber that does nothing",
        "tracing_fmt_sink_3ints" => "`tracing` crate event, fmt layer writing to a sink",
        "c_call_loop" => "baseline: the C loop calling `work` (loaded shared object)",
        "rust_call_loop" => "baseline: the Rust loop calling `work`",
        _ => "",
    }
}

/// The `--markdown` table's header.
const MARKDOWN_HEADER: &str = "| row | what | ns/op | overhead ns | compared with | ratio |\n\
                               | --- | --- | ---: | ---: | --- | ---: |";

/// One row of the `--markdown` table: measured (with the row it is compared with and that
/// row's ns/op, when there is one), or skipped with the reason. A baseline row shows no
/// overhead: it is the loop the others are read against.
fn markdown_row(name: &str, outcome: Result<&Measured, &str>, vs: Option<(&str, f64)>) -> String {
    let m = match outcome {
        Ok(m) => m,
        Err(why) => return format!("| `{name}` | {} | skipped: {why} |  |  |  |", what(name)),
    };
    let overhead = if m.baseline == name {
        String::new()
    } else {
        format!("{:.1}", m.ns_per_op - m.baseline_ns_per_op)
    };
    let (vs, ratio) = vs
        .map(|(v, ns)| (format!("`{v}`"), format!("{:.2}", m.ns_per_op / ns)))
        .unwrap_or_default();
    format!(
        "| `{name}` | {} | {:.1} | {overhead} | {vs} | {ratio} |",
        what(name),
        m.ns_per_op
    )
}

ustrace::trace_event! {
    /// The event of the `--peers` event workload: three integers.
    fn ustrace_peers::ints3(a: u64, b: u64, c: u64) {
        a: u64 = a,
        b: u64 = b,
        c: u64 = c,
    }
    print "a=%llu b=%llu c=%llu", a, b, c;
}

const WORK_C: &str = include_str!("../c/peers_work.c");
const WORK_TP_H: &str = include_str!("../c/peers_tp.h");

/// A row as measured: its ns/op and the name of its baseline, or why it was skipped.
type Raw = (&'static str, Result<(f64, &'static str), String>);

/// One measured or skipped row.
pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) outcome: Result<Measured, String>,
}

pub(crate) struct Measured {
    pub(crate) ns_per_op: f64,
    pub(crate) baseline: &'static str,
    pub(crate) baseline_ns_per_op: f64,
    /// Operations per timed repetition (peers that trap or write to disk run fewer).
    pub(crate) iterations: u64,
}

/// The build directory; removed with everything in it when the bench ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn command_exists(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .any(|dir| std::fs::metadata(dir.join(name)).is_ok_and(|m| m.is_file() && m.len() > 0))
    })
}

/// Runs `cmd`; its output or why it failed.
fn run_cmd(cmd: &mut Command) -> Result<String, String> {
    let what = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.trim();
        let err = err.lines().last().unwrap_or("");
        return Err(format!("{what} failed ({}): {err}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The ns/op a workload program printed: its last line that is a number.
fn ns_printed(out: &str) -> Result<f64, String> {
    out.lines()
        .rev()
        .find_map(|l| l.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("the workload printed no figure: {out:?}"))
}

/// The builds of the workload; each is `Err(why)` when it could not be made.
struct Builds {
    plain: Result<PathBuf, String>,
    pg: Result<PathBuf, String>,
    fpe: Result<PathBuf, String>,
    lttng: Result<PathBuf, String>,
    shared: Result<PathBuf, String>,
}

fn build(dir: &Path) -> Builds {
    let cc = |out: &str, flags: &[&str], libs: &[&str]| -> Result<PathBuf, String> {
        if !command_exists("cc") {
            return Err("no C compiler (`cc`) on PATH".into());
        }
        let path = dir.join(out);
        run_cmd(
            Command::new("cc")
                .current_dir(dir)
                .args(["-O2", "-o"])
                .arg(&path)
                .args(flags)
                .arg("peers_work.c")
                .args(libs),
        )?;
        Ok(path)
    };
    let lttng = cc(
        "work-lttng",
        &["-DPEERS_LTTNG", "-I."],
        &["-llttng-ust", "-ldl"],
    )
    .map_err(|e| {
        format!("cannot build the LTTng-UST workload (Debian liblttng-ust-dev installed?): {e}")
    });
    Builds {
        plain: cc("work", &[], &[]),
        pg: cc("work-pg", &["-pg"], &[]),
        fpe: cc("work-fpe", &["-fpatchable-function-entry=5"], &[]),
        lttng,
        shared: cc(
            "libpeers_work.so",
            &["-shared", "-fPIC", "-DPEERS_NO_MAIN"],
            &[],
        ),
    }
}

/// The workload's `work` and `run_calls`, loaded into this process.
#[derive(Clone, Copy)]
struct Loaded {
    work: extern "C" fn(i64, i64) -> i64,
    run_calls: extern "C" fn(i64) -> i64,
}

fn load(path: &Path) -> Result<Loaded, String> {
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: the path is a NUL-terminated string; the library is ours and runs no
    // constructors beyond the C runtime's.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err(format!("dlopen {}: failed", path.display()));
    }
    let sym = |name: &str| -> Result<*mut libc::c_void, String> {
        let cname = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: `handle` is a live dlopen handle (never closed) and the name is
        // NUL-terminated.
        let p = unsafe { libc::dlsym(handle, cname.as_ptr()) };
        if p.is_null() {
            return Err(format!("{name} not found in {}", path.display()));
        }
        Ok(p)
    };
    let (work, run_calls) = (sym("work")?, sym("run_calls")?);
    // SAFETY: both symbols are the C functions of c/peers_work.c with exactly these
    // signatures (`long f(long, long)`, `long f(long)`), and the library stays loaded for
    // the rest of the process.
    unsafe {
        Ok(Loaded {
            work: std::mem::transmute::<*mut libc::c_void, extern "C" fn(i64, i64) -> i64>(work),
            run_calls: std::mem::transmute::<*mut libc::c_void, extern "C" fn(i64) -> i64>(
                run_calls,
            ),
        })
    }
}

#[inline(never)]
fn rust_call_loop(work: extern "C" fn(i64, i64) -> i64, n: u64) {
    let mut acc = 0i64;
    for i in 0..n as i64 {
        acc = acc.wrapping_add(work(black_box(i), 7));
    }
    black_box(acc);
}

#[inline(never)]
fn ustrace_event_loop(work: extern "C" fn(i64, i64) -> i64, n: u64) {
    let mut acc = 0i64;
    for i in 0..n as i64 {
        acc = acc.wrapping_add(work(black_box(i), 7));
        ints3::trace(i as u64, acc as u64, 7);
    }
    black_box(acc);
}

#[inline(never)]
fn tracing_event_loop(work: extern "C" fn(i64, i64) -> i64, n: u64) {
    let mut acc = 0i64;
    for i in 0..n as i64 {
        acc = acc.wrapping_add(work(black_box(i), 7));
        tracing::event!(tracing::Level::INFO, a = i, b = acc, c = 7i64);
    }
    black_box(acc);
}

/// A subscriber interested in everything that does nothing with it: what `tracing` costs
/// before any work of a subscriber's own.
struct Nothing;

impl tracing::Subscriber for Nothing {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        black_box(event);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The instance the ustrace rows record into (the top-level one is left alone).
const INSTANCE: &str = "ustrace-peers";

/// Times `run_calls` with the `f:` dynamic events `defs` enabled in [`INSTANCE`], checking
/// that each call recorded `defs.len()` events.
fn dynevent_row(
    name: &'static str,
    lib: Loaded,
    defs: &[(&str, &str)],
    n: u64,
    reps: usize,
) -> Result<f64, String> {
    let inst = ustrace_tracing()
        .instance(INSTANCE)
        .ok_or("bench instance vanished")?;
    let mut made = Vec::new();
    let result = (|| {
        for (event, def) in defs {
            append(
                "dynamic_events",
                &format!("f:ustrace_peers/{event} {def}\n"),
            )?;
            made.push(*event);
            set(
                &format!("instances/{INSTANCE}/events/ustrace_peers/{event}/enable"),
                "1\n",
            )?;
        }
        time_recorded(
            name,
            inst.buffer(),
            defs.len() as u64,
            n,
            reps,
            infallible(|k| {
                black_box((lib.run_calls)(k as i64));
            }),
        )
    })();
    for event in made {
        let _ = set(
            &format!("instances/{INSTANCE}/events/ustrace_peers/{event}/enable"),
            "0\n",
        );
        let _ = append("dynamic_events", &format!("-:ustrace_peers/{event}\n"));
    }
    result
}

fn fprobe_row(lib: Loaded, with_exit: bool, n: u64, reps: usize) -> Result<f64, String> {
    let mut builder = ustrace_fprobe::Fprobe::builder()
        .entry_handler(|_, _, _, _, _| ustrace_fprobe::EntryAction::Continue);
    if with_exit {
        builder = builder.exit_handler(|_, _, _, _, _| {});
    }
    let fp = builder
        .register_ips(&[lib.work as usize])
        .map_err(|e| format!("fprobe on work: {e}"))?;
    let t = time_probed(
        "fprobe on work",
        fp,
        n,
        reps,
        infallible(|k| {
            black_box((lib.run_calls)(k as i64));
        }),
    )?;
    Ok(t.ns_per_op)
}

/// The rows measured in this process.
fn in_process(
    shared: &Result<PathBuf, String>,
    n: u64,
    reps: usize,
    rows: &mut Vec<Raw>,
) -> Result<(), String> {
    let lib = match shared.as_ref().map_err(Clone::clone).and_then(|p| load(p)) {
        Ok(lib) => lib,
        Err(why) => {
            for name in NAMES.iter().filter(|n| n.starts_with("ustrace_")) {
                rows.push((name, Err(format!("cannot build the workload: {why}"))));
            }
            rows.push(("c_call_loop", Err(why.clone())));
            rows.push(("rust_call_loop", Err(why)));
            return Ok(());
        }
    };
    let calls = time_per_op(
        n,
        reps,
        infallible(|k| {
            black_box((lib.run_calls)(k as i64));
        }),
    )?;
    rows.push(("c_call_loop", Ok((calls.ns_per_op, "c_call_loop"))));
    let rust = time_per_op(n, reps, infallible(|k| rust_call_loop(lib.work, k)))?;
    rows.push(("rust_call_loop", Ok((rust.ns_per_op, "rust_call_loop"))));

    for (name, exit) in [
        ("ustrace_fprobe_entry", false),
        ("ustrace_fprobe_entry_exit", true),
    ] {
        rows.push((
            name,
            fprobe_row(lib, exit, n, reps).map(|ns| (ns, "c_call_loop")),
        ));
    }

    let _ = ustrace_tracing().remove_instance(INSTANCE);
    ustrace_tracing()
        .create_instance(INSTANCE)
        .map_err(|e| format!("mkdir instances/{INSTANCE}: {e}"))?;
    set(&format!("instances/{INSTANCE}/buffer_size_kb"), "4096\n")?;
    let dyn_rows: [(&'static str, &[(&str, &str)]); 4] = [
        ("ustrace_dynevent_entry", &[("work_entry", "work")]),
        (
            "ustrace_dynevent_entry_2args",
            &[("work_entry", "work a=$arg1 b=$arg2")],
        ),
        (
            "ustrace_dynevent_entry_exit",
            &[("work_entry", "work"), ("work_exit", "work%return")],
        ),
        (
            "ustrace_dynevent_entry_exit_args",
            &[
                ("work_entry", "work a=$arg1 b=$arg2"),
                ("work_exit", "work%return ret=$retval"),
            ],
        ),
    ];
    for (name, defs) in dyn_rows {
        rows.push((
            name,
            dynevent_row(name, lib, defs, n, reps).map(|ns| (ns, "c_call_loop")),
        ));
    }
    let event = (|| {
        let enable = format!("instances/{INSTANCE}/events/ustrace_peers/ints3/enable");
        set(&enable, "1\n")?;
        let inst = ustrace_tracing()
            .instance(INSTANCE)
            .ok_or("bench instance vanished")?;
        let r = time_recorded(
            "ustrace_event_3ints",
            inst.buffer(),
            1,
            n,
            reps,
            infallible(|k| ustrace_event_loop(lib.work, k)),
        );
        set(&enable, "0\n")?;
        r
    })();
    rows.push((
        "ustrace_event_3ints",
        event.map(|ns| (ns, "rust_call_loop")),
    ));
    ustrace_tracing()
        .remove_instance(INSTANCE)
        .map_err(|e| format!("rmdir instances/{INSTANCE}: {e}"))?;

    let null = tracing::subscriber::with_default(Nothing, || {
        time_per_op(n, reps, infallible(|k| tracing_event_loop(lib.work, k)))
    })?;
    rows.push(("tracing_null_3ints", Ok((null.ns_per_op, "rust_call_loop"))));
    let fmt = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .finish();
    let fmt = tracing::subscriber::with_default(fmt, || {
        time_per_op(n, reps, infallible(|k| tracing_event_loop(lib.work, k)))
    })?;
    rows.push((
        "tracing_fmt_sink_3ints",
        Ok((fmt.ns_per_op, "rust_call_loop")),
    ));
    Ok(())
}

/// The file offset of `work` in `exe`, as `uprobe_events` wants it.
fn work_offset(exe: &Path) -> Result<u64, String> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let data = std::fs::read(exe).map_err(|e| format!("{}: {e}", exe.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", exe.display()))?;
    let addr = file
        .symbols()
        .find(|s| s.name() == Ok("work"))
        .ok_or("no symbol `work` in the workload")?
        .address();
    file.segments()
        .find_map(|seg| {
            let (offset, size) = seg.file_range();
            (addr >= seg.address() && addr < seg.address() + size)
                .then(|| offset + (addr - seg.address()))
        })
        .ok_or_else(|| "`work` is in no loaded segment".into())
}

const KTRACE: &str = "/sys/kernel/tracing";

/// The probes and instance of [`uprobes`]; taken down even when a step fails.
struct KernelProbes {
    group: String,
    made: Vec<&'static str>,
    instance: Option<PathBuf>,
}

impl Drop for KernelProbes {
    fn drop(&mut self) {
        if let Some(inst) = &self.instance {
            for event in &self.made {
                let _ = std::fs::write(
                    inst.join(format!("events/{}/{event}/enable", self.group)),
                    "0",
                );
            }
        }
        for event in &self.made {
            let _ = kernel_append("uprobe_events", &format!("-:{}/{event}", self.group));
        }
        if let Some(inst) = &self.instance {
            let _ = std::fs::remove_dir(inst);
        }
    }
}

fn kernel_append(file: &str, text: &str) -> Result<(), String> {
    use std::io::Write;
    let path = format!("{KTRACE}/{file}");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("write {text:?} to {path}: {e}"))
}

/// Events the kernel instance's buffer saw (kept or overwritten).
fn kernel_events(inst: &Path) -> u64 {
    let Ok(cpus) = std::fs::read_dir(inst.join("per_cpu")) else {
        return 0;
    };
    cpus.flatten()
        .filter_map(|d| std::fs::read_to_string(d.path().join("stats")).ok())
        .flat_map(|s| {
            s.lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k == "entries" || k == "overrun")
                        .then(|| v.trim().parse::<u64>().ok())
                        .flatten()
                })
                .collect::<Vec<_>>()
        })
        .sum()
}

/// uprobe entry, and entry + return, on `work` of the plain build.
fn uprobes(plain: &Path, n: u64, reps: usize) -> [Result<f64, String>; 2] {
    let why = if !Path::new(KTRACE).join("uprobe_events").exists() {
        Some(format!(
            "no {KTRACE}/uprobe_events (tracefs not mounted, or a kernel without CONFIG_UPROBE_EVENTS)"
        ))
    } else if std::fs::OpenOptions::new()
        .append(true)
        .open(Path::new(KTRACE).join("uprobe_events"))
        .is_err()
    {
        Some(format!(
            "{KTRACE}/uprobe_events is not writable (needs root)"
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return [Err(why.clone()), Err(why)];
    }
    let pid = std::process::id();
    let mut probes = KernelProbes {
        group: format!("ustrace_peers_{pid}"),
        made: Vec::new(),
        instance: None,
    };
    let inst = PathBuf::from(format!("{KTRACE}/instances/ustrace-peers-{pid}"));
    let setup = (|| {
        let offset = work_offset(plain)?;
        std::fs::create_dir(&inst).map_err(|e| format!("mkdir {}: {e}", inst.display()))?;
        probes.instance = Some(inst.clone());
        for (event, kind) in [("work_entry", 'p'), ("work_exit", 'r')] {
            kernel_append(
                "uprobe_events",
                &format!(
                    "{kind}:{}/{event} {}:0x{offset:x}",
                    probes.group,
                    plain.display()
                ),
            )?;
            probes.made.push(event);
        }
        Ok::<_, String>(())
    })();
    if let Err(why) = setup {
        return [Err(why.clone()), Err(why)];
    }
    let enable = |event: &str| {
        std::fs::write(
            inst.join(format!("events/{}/{event}/enable", probes.group)),
            "1",
        )
        .map_err(|e| format!("enable {event}: {e}"))
    };
    let measure = |events: &[&str]| -> Result<f64, String> {
        for e in events {
            enable(e)?;
        }
        let before = kernel_events(&inst);
        let ns = ns_printed(&run_cmd(Command::new(plain).args([
            "calls",
            &n.to_string(),
            &reps.to_string(),
        ]))?)?;
        let hits = kernel_events(&inst) - before;
        let calls = (n / 10 + 1) + n * reps as u64;
        if hits < calls * events.len() as u64 {
            return Err(format!(
                "the kernel recorded {hits} uprobe events for {calls} calls"
            ));
        }
        Ok(ns)
    };
    let entry = measure(&["work_entry"]);
    let both = measure(&["work_entry", "work_exit"]);
    drop(probes);
    [entry, both]
}

/// uftrace on the `-pg` or `-fpatchable-function-entry` build, without and with arguments.
fn uftrace(
    exe: &Result<PathBuf, String>,
    patch: bool,
    dir: &Path,
    n: u64,
    reps: usize,
) -> [Result<f64, String>; 2] {
    let exe = match exe {
        Ok(exe) if command_exists("uftrace") => exe,
        Ok(_) => {
            let why = "uftrace is not installed (Debian uftrace)".to_string();
            return [Err(why.clone()), Err(why)];
        }
        Err(why) => return [Err(why.clone()), Err(why.clone())],
    };
    let one = |args: bool| -> Result<f64, String> {
        let data = dir.join("uftrace.data");
        let mut cmd = Command::new("uftrace");
        cmd.arg("record").arg("-d").arg(&data);
        if patch {
            // Functions built with patchable entries are patched only when asked for.
            cmd.args(["-P", "work"]);
        }
        if args {
            cmd.args(["-A", "work@arg1,arg2", "-R", "work@retval"]);
        }
        cmd.arg(exe)
            .args(["calls", &n.to_string(), &reps.to_string()]);
        let result = run_cmd(&mut cmd).and_then(|out| {
            let ns = ns_printed(&out)?;
            // A function uftrace failed to hook runs at full speed: check every call of
            // `work` is in the record before reporting a cost.
            let report = run_cmd(
                Command::new("uftrace")
                    .args(["report", "--no-pager", "-d"])
                    .arg(&data),
            )?;
            let calls = report
                .lines()
                .find_map(|l| {
                    let words: Vec<&str> = l.split_whitespace().collect();
                    match words[..] {
                        [.., calls, "work"] => calls.parse::<u64>().ok(),
                        _ => None,
                    }
                })
                .unwrap_or(0);
            let expected = n / 10 + 1 + n * reps as u64;
            if calls < expected {
                return Err(format!(
                    "uftrace recorded {calls} calls of work, expected {expected}"
                ));
            }
            Ok(ns)
        });
        let _ = std::fs::remove_dir_all(&data);
        result
    };
    [one(false), one(true)]
}

/// A session daemon this bench started; stopped when the bench ends.
struct Sessiond(Option<Child>);

impl Drop for Sessiond {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// LTTng-UST: the event workload with a snapshot session (in memory, overwrite mode, as
/// ustrace's buffers are) recording the tracepoint.
fn lttng(exe: &Result<PathBuf, String>, dir: &Path, n: u64, reps: usize) -> Result<f64, String> {
    let exe = exe.as_ref().map_err(Clone::clone)?;
    for tool in ["lttng", "lttng-sessiond"] {
        if !command_exists(tool) {
            return Err(format!("{tool} is not installed (Debian lttng-tools)"));
        }
    }
    let lttng = |args: &[&str]| run_cmd(Command::new("lttng").env("LTTNG_HOME", dir).args(args));
    let mut daemon = Sessiond(None);
    if lttng(&["list"]).is_err() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(
                "no LTTng session daemon runs and a root one cannot be started (not root)".into(),
            );
        }
        let child = Command::new("lttng-sessiond")
            .args(["--no-kernel"])
            .env("LTTNG_HOME", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start lttng-sessiond: {e}"))?;
        daemon.0 = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while lttng(&["list"]).is_err() {
            if let Some(Ok(Some(status))) = daemon.0.as_mut().map(|c| c.try_wait()) {
                daemon.0 = None;
                return Err(format!("lttng-sessiond exited at start ({status})"));
            }
            if Instant::now() > deadline {
                return Err("lttng-sessiond did not answer within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let session = format!("ustrace-peers-{}", std::process::id());
    lttng(&["create", &session, "--snapshot"])?;
    let result = (|| {
        lttng(&["enable-event", "-u", "-s", &session, "ustrace_peers:ints3"])?;
        lttng(&["start", &session])?;
        let ns = ns_printed(&run_cmd(Command::new(exe).env("LTTNG_HOME", dir).args([
            "events",
            &n.to_string(),
            &reps.to_string(),
        ]))?)?;
        lttng(&["stop", &session])?;
        // An application that did not register with the daemon in time traces nothing at
        // all: check that the event reached the buffers before reporting its cost.
        lttng(&["snapshot", "record", "-s", &session])?;
        let recorded = stream_bytes(&dir.join("lttng-traces"));
        let _ = std::fs::remove_dir_all(dir.join("lttng-traces"));
        if recorded == 0 {
            return Err(
                "LTTng recorded no event (the workload did not register with lttng-sessiond)"
                    .into(),
            );
        }
        Ok(ns)
    })();
    let _ = lttng(&["destroy", &session]);
    result
}

/// The size of a snapshot stream file holding no event (one empty packet), here.
const EMPTY_PACKET: u64 = 4096;

/// Bytes of trace data (not metadata or indexes) under an LTTng trace directory, beyond
/// the empty packet every stream starts with.
fn stream_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => {
                    if e.file_name() == "index" {
                        0
                    } else {
                        stream_bytes(&path)
                    }
                }
                // A stream that saw no event still holds one empty packet of a page.
                Ok(t) if t.is_file() && e.file_name() != "metadata" => e
                    .metadata()
                    .map_or(0, |m| m.len().saturating_sub(EMPTY_PACKET)),
                _ => 0,
            }
        })
        .sum()
}

/// Runs every peer; rows in [`NAMES`] order.
pub(crate) fn measure(args: &Settings) -> Result<Vec<Row>, String> {
    let n = args.iterations.max(1000);
    let reps = args.repetitions.max(1);
    // Peers that write every call to disk, or trap into the kernel, run fewer calls.
    let (n_uftrace, n_lttng, n_uprobe) =
        ((n / 10).max(1000), (n / 4).max(1000), (n / 200).max(100));
    let reps_ext = reps.min(5);

    let dir = std::env::temp_dir().join(format!("ustrace-peers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    let scratch = Scratch(dir);
    std::fs::write(scratch.0.join("peers_work.c"), WORK_C).map_err(|e| e.to_string())?;
    std::fs::write(scratch.0.join("peers_tp.h"), WORK_TP_H).map_err(|e| e.to_string())?;
    let builds = build(&scratch.0);

    let mut rows: Vec<Raw> = Vec::new();
    in_process(&builds.shared, n, reps, &mut rows)?;
    let mut iterations: Vec<(&'static str, u64)> = Vec::new();

    let exe_base = |n: u64| -> Result<f64, String> {
        let exe = builds.plain.as_ref().map_err(Clone::clone)?;
        ns_printed(&run_cmd(Command::new(exe).args([
            "calls",
            &n.to_string(),
            &reps_ext.to_string(),
        ]))?)
    };
    // Each external peer is read against the plain build's loop run with its own count.
    let mut external = |name: &'static str, r: Result<f64, String>, n: u64| {
        iterations.push((name, n));
        rows.push((name, r.map(|ns| (ns, "c_call_loop_exe"))));
    };
    let [pg, pg_args] = uftrace(&builds.pg, false, &scratch.0, n_uftrace, reps_ext);
    external("uftrace_pg_entry_exit", pg, n_uftrace);
    external("uftrace_pg_entry_exit_args", pg_args, n_uftrace);
    let [fpe, fpe_args] = uftrace(&builds.fpe, true, &scratch.0, n_uftrace, reps_ext);
    external("uftrace_fpe_entry_exit", fpe, n_uftrace);
    external("uftrace_fpe_entry_exit_args", fpe_args, n_uftrace);
    let [entry, both] = match &builds.plain {
        Ok(plain) => uprobes(plain, n_uprobe, reps_ext),
        Err(why) => [Err(why.clone()), Err(why.clone())],
    };
    external("uprobe_entry", entry, n_uprobe);
    external("uprobe_entry_return", both, n_uprobe);
    external(
        "lttng_ust_3ints",
        lttng(&builds.lttng, &scratch.0, n_lttng, reps_ext),
        n_lttng,
    );

    let mut base_exe: Vec<(u64, Result<f64, String>)> = Vec::new();
    let mut out = Vec::new();
    for name in NAMES {
        let (_, r) = rows
            .iter()
            .find(|(n2, _)| *n2 == name)
            .ok_or_else(|| format!("{name}: not measured"))?;
        let outcome = match r {
            Err(why) => Err(why.clone()),
            Ok((ns, baseline)) => {
                let iters = iterations
                    .iter()
                    .find(|(n2, _)| *n2 == name)
                    .map_or(n, |&(_, k)| k);
                let base = if *baseline == "c_call_loop_exe" {
                    if !base_exe.iter().any(|(k, _)| *k == iters) {
                        base_exe.push((iters, exe_base(iters)));
                    }
                    base_exe
                        .iter()
                        .find(|(k, _)| *k == iters)
                        .map(|(_, b)| b.clone())
                        .expect("just timed")?
                } else {
                    rows.iter()
                        .find(|(n2, _)| n2 == baseline)
                        .and_then(|(_, r)| r.as_ref().ok())
                        .map(|(b, _)| *b)
                        .ok_or_else(|| format!("{name}: baseline {baseline} missing"))?
                };
                Ok(Measured {
                    ns_per_op: *ns,
                    baseline,
                    baseline_ns_per_op: base,
                    iterations: iters,
                })
            }
        };
        out.push(Row { name, outcome });
    }
    Ok(out)
}

pub fn run(args: &Settings) -> Result<(), String> {
    let rows = measure(args)?;
    let find = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| r.outcome.as_ref().ok())
    };
    if args.markdown {
        outln!("{MARKDOWN_HEADER}");
        for row in &rows {
            let vs = compared_with(row.name).and_then(|v| find(v).map(|o| (v, o.ns_per_op)));
            outln!(
                "{}",
                markdown_row(row.name, row.outcome.as_ref().map_err(|e| e.as_str()), vs)
            );
        }
        return Ok(());
    }
    if !args.json {
        outln!(
            "{:<34} {:>10} {:>10} {:>10} {:>9}  {:<34} (ratio: ns/op over the compared row's; median of {} reps)",
            "peer",
            "ns/op",
            "overhead",
            "iters",
            "ratio",
            "compared with",
            args.repetitions.max(1),
        );
    }
    for row in &rows {
        let m = match &row.outcome {
            Err(why) => {
                if args.json {
                    outln!(
                        "{{\"name\": \"{}\", \"skipped\": \"{}\"}}",
                        row.name,
                        json_escape(why)
                    );
                } else {
                    outln!("{:<34} skipped: {why}", row.name);
                }
                continue;
            }
            Ok(m) => m,
        };
        let overhead = m.ns_per_op - m.baseline_ns_per_op;
        let vs = compared_with(row.name).and_then(|v| find(v).map(|o| (v, o)));
        if args.json {
            let vs_text = vs
                .map(|(v, o)| {
                    let vo = o.ns_per_op - o.baseline_ns_per_op;
                    format!(
                        ", \"vs\": \"{v}\", \"ratio_to_ustrace\": {:.3}, \"overhead_ratio_to_ustrace\": {:.3}",
                        m.ns_per_op / o.ns_per_op,
                        overhead / vo
                    )
                })
                .unwrap_or_default();
            outln!(
                "{{\"name\": \"{}\", \"ns_per_op\": {:.3}, \"baseline\": \"{}\", \"baseline_ns_per_op\": {:.3}, \"overhead_ns\": {:.3}, \"iterations\": {}{vs_text}}}",
                row.name,
                m.ns_per_op,
                m.baseline,
                m.baseline_ns_per_op,
                overhead,
                m.iterations
            );
        } else {
            let (ratio, v) = vs
                .map(|(v, o)| (format!("{:.2}x", m.ns_per_op / o.ns_per_op), v))
                .unwrap_or_default();
            outln!(
                "{:<34} {:>10.2} {:>+10.2} {:>10} {:>9}  {v}",
                row.name,
                m.ns_per_op,
                overhead,
                m.iterations,
                ratio
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_says_what_it_measures() {
        for name in NAMES {
            assert!(!what(name).is_empty(), "{name}");
        }
    }

    #[test]
    fn markdown_rows_carry_the_figures_the_ratio_and_the_reason_of_a_skip() {
        let m = Measured {
            ns_per_op: 95.04,
            baseline: "c_call_loop",
            baseline_ns_per_op: 1.44,
            iterations: 200_000,
        };
        assert_eq!(
            markdown_row(
                "uftrace_pg_entry_exit",
                Ok(&m),
                Some(("ustrace_dynevent_entry_exit", 61.7))
            ),
            "| `uftrace_pg_entry_exit` | uftrace, `-pg` build, entry + exit | 95.0 | 93.6 \
             | `ustrace_dynevent_entry_exit` | 1.54 |"
        );
        let base = Measured {
            ns_per_op: 1.9,
            baseline: "c_call_loop",
            baseline_ns_per_op: 1.9,
            iterations: 2_000_000,
        };
        assert_eq!(
            markdown_row("c_call_loop", Ok(&base), None),
            "| `c_call_loop` | baseline: the C loop calling `work` (loaded shared object) \
             | 1.9 |  |  |  |"
        );
        assert_eq!(
            markdown_row("lttng_ust_3ints", Err("lttng-tools is not installed"), None),
            "| `lttng_ust_3ints` | LTTng-UST tracepoint of three integers, snapshot session \
             active | skipped: lttng-tools is not installed |  |  |  |"
        );
        let columns = MARKDOWN_HEADER.lines().next().unwrap().matches('|').count();
        for line in MARKDOWN_HEADER.lines() {
            assert_eq!(line.matches('|').count(), columns, "{line}");
        }
        assert_eq!(
            markdown_row("uprobe_entry", Ok(&m), None)
                .matches('|')
                .count(),
            columns
        );
    }
}
