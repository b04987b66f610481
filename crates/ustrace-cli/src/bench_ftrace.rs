//! The function tracers' figures: `function_tracer_call` and `function_graph_call` (a call
//! of one traced C-ABI function, the tracer switched on through `current_tracer` with
//! `set_ftrace_filter` naming it, over the same call untraced), and
//! `function_graph_enable_all` (switching `function_graph` on for every function of this
//! process, the demo's and its libraries', in ns; `functions` says how many were patched).
//!
//! Each figure checks what it claims: every call left its records (entry, or entry and exit)
//! in the buffer, and the tracer missed none.

use std::hint::black_box;
use std::time::Instant;

use ustrace::FileSystem;

use crate::bench::ustrace_bench_target;
use crate::bench_measure::{infallible, time_per_op};

/// A figure: name, ns per op, baseline, extra column.
type Push<'a> = dyn FnMut(&'static str, f64, &'static str, Option<(&'static str, f64)>) + 'a;

/// The names this module reports.
pub const NAMES: [&str; 3] = [
    "function_tracer_call",
    "function_graph_call",
    "function_graph_enable_all",
];

const INSTANCE: &str = "bench_ftrace";

#[inline(never)]
fn traced_loop(n: u64) {
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(ustrace_bench_target(black_box(i), 7));
    }
    black_box(acc);
}

fn write(path: &str, text: &str) -> Result<(), String> {
    ustrace::tracefs()
        .write_file(path, text)
        .map_err(|e| format!("echo {text:?} > {path}: {e}"))
}

fn instance_of() -> Result<std::sync::Arc<ustrace::trace::Instance>, String> {
    ustrace::trace::tracing()
        .instance(INSTANCE)
        .ok_or_else(|| "bench instance vanished".to_string())
}

/// Times one traced-call figure; `per_call` records are expected per call.
fn time_tracer(tracer: &str, n: u64, reps: usize, per_call: u64) -> Result<f64, String> {
    let dir = format!("instances/{INSTANCE}");
    write(
        &format!("{dir}/set_ftrace_filter"),
        "ustrace_bench_target\n",
    )?;
    // The buffer overwrites (its pages are all touched by the warm-up, as in the other
    // figures); `entries-written` still counts every record, which the check below uses.
    write(&format!("{dir}/current_tracer"), tracer)?;
    let timing = time_per_op(n, reps, infallible(traced_loop));
    let inst = instance_of()?;
    let missed = ustrace::ftrace::tracer::missed(&inst);
    let written = inst.buffer().written();
    write(&format!("{dir}/current_tracer"), "nop")?;
    let timing = timing?;
    if missed != 0 {
        return Err(format!("{tracer}: {missed} traced calls missed"));
    }
    if written != timing.ops * per_call {
        return Err(format!(
            "{tracer}: {written} records for {} calls ({per_call} each)",
            timing.ops
        ));
    }
    Ok(timing.ns_per_op)
}

/// Runs the figures `wanted` selects.
pub(crate) fn figures(
    n: u64,
    reps: usize,
    wanted: &dyn Fn(&str) -> bool,
    push: &mut Push<'_>,
) -> Result<(), String> {
    if !NAMES.iter().any(|name| wanted(name)) {
        return Ok(());
    }
    let fs = ustrace::tracefs();
    let dir = format!("instances/{INSTANCE}");
    let _ = fs.rmdir(&dir);
    fs.mkdir(&dir).map_err(|e| format!("mkdir {dir}: {e}"))?;
    let result = (|| {
        if wanted("function_tracer_call") {
            let ns = time_tracer("function", n, reps, 1)?;
            push("function_tracer_call", ns, "call_loop", None);
        }
        if wanted("function_graph_call") {
            let ns = time_tracer("function_graph", n, reps, 2)?;
            push("function_graph_call", ns, "call_loop", None);
        }
        if wanted("function_graph_enable_all") {
            write(&format!("{dir}/set_ftrace_filter"), "")?;
            // The symbol inventory is built once per process; the switch is what is timed.
            fs.read_to_string("available_filter_functions")
                .map_err(|e| format!("available_filter_functions: {e}"))?;
            let start = Instant::now();
            write(&format!("{dir}/current_tracer"), "function_graph")?;
            let ns = start.elapsed().as_nanos() as f64;
            let patched = ustrace::ftrace::tracer::patched(&instance_of()?);
            let start = Instant::now();
            write(&format!("{dir}/current_tracer"), "nop")?;
            let off = start.elapsed().as_nanos() as f64;
            push(
                "function_graph_enable_all",
                ns,
                "nothing",
                Some(("functions", patched as f64)),
            );
            // Once more: the prologues are analysed and the stubs built by now, so this is
            // the patching alone.
            let start = Instant::now();
            write(&format!("{dir}/current_tracer"), "function_graph")?;
            let again = start.elapsed().as_nanos() as f64;
            write(&format!("{dir}/current_tracer"), "nop")?;
            outln!(
                "function_graph on {patched} functions: off {:.1} ms, on again (analysis done) {:.1} ms",
                off / 1e6,
                again / 1e6
            );
        }
        Ok(())
    })();
    let _ = write(&format!("{dir}/current_tracer"), "nop");
    let _ = fs.rmdir(&dir);
    result
}
