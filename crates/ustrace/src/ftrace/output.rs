//! How the function tracers' records read: `function` lines (`func <-parent`) inside the
//! usual trace layout, and the `function_graph` call graph, which replaces that layout
//! (`CPU) DURATION | nesting`), as the kernel's `trace_functions_graph.c` prints it.
//!
//! The graph printer walks the buffer as the kernel's iterator does: entries of all CPUs in
//! time order, and for an entry it peeks at the next record of the same CPU: when that is the
//! return of the same call, both print as one leaf line (`func();`) with its duration.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;

use ustrace_inspect::symbols::{Inventory, SymFlags};
use ustrace_ringbuf::Event as RawEvent;

use super::events::{FUNCTION_ID, GRAPH_ENTRY_ID, GRAPH_EXIT_ID};
use crate::trace::Instance;

fn u64_at(record: &[u8], at: usize) -> u64 {
    record
        .get(at..at + 8)
        .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
}

fn u32_at(record: &[u8], at: usize) -> u32 {
    record
        .get(at..at + 4)
        .map_or(0, |b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
}

fn id_of(record: &[u8]) -> u16 {
    record
        .get(0..2)
        .map_or(0, |b| u16::from_ne_bytes([b[0], b[1]]))
}

fn pid_of(record: &[u8]) -> i32 {
    record
        .get(4..8)
        .map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
}

/// The name of the tracer `instance` runs, for the `# tracer:` header line.
pub fn tracer_name(instance: &Instance) -> &'static str {
    match find_arc(instance) {
        Some(arc) => super::tracer::current(&arc).name(),
        None => "nop",
    }
}

/// The `Arc` of an instance known by reference (the printers get `&Instance`).
pub(crate) fn find_arc(instance: &Instance) -> Option<Arc<Instance>> {
    let tracing = crate::trace::existing_tracing()?;
    if std::ptr::eq(Arc::as_ptr(tracing.top()), instance) {
        return Some(tracing.top().clone());
    }
    tracing.instance(&instance.name)
}

/// Writes a `function` record's text (after the context columns) as the kernel's
/// `print_fn_trace`: the function, and with `print-parent` ` <-` and its caller, each as
/// `sym-offset`/`sym-addr` say. False for any other record.
pub fn render_function(instance: &Instance, record: &[u8], out: &mut String) -> bool {
    if id_of(record) != FUNCTION_ID.0 {
        return false;
    }
    let inv = ustrace_inspect::symbols::inventory();
    let flags = SymFlags {
        offset: instance.options.get("sym-offset"),
        addr: instance.options.get("sym-addr"),
    };
    inv.write_ip_sym(out, u64_at(record, 8) as usize, flags);
    let parent = u64_at(record, 16) as usize;
    if instance.options.get("print-parent") && parent != 0 {
        out.push_str(" <-");
        inv.write_ip_sym(out, parent, flags);
    }
    out.push('\n');
    true
}

/// The graph printer's columns, from the `funcgraph-*` options.
struct Flags {
    cpu: bool,
    overhead: bool,
    proc_: bool,
    duration: bool,
    abstime: bool,
    tail: bool,
    overrun: bool,
    context: bool,
}

impl Flags {
    fn of(instance: &Instance) -> Flags {
        let o = &instance.options;
        Flags {
            cpu: o.get("funcgraph-cpu"),
            overhead: o.get("funcgraph-overhead"),
            proc_: o.get("funcgraph-proc"),
            duration: o.get("funcgraph-duration"),
            abstime: o.get("funcgraph-abstime"),
            tail: o.get("funcgraph-tail"),
            overrun: o.get("funcgraph-overrun"),
            context: o.get("context-info"),
        }
    }
}

/// The graph header: the two column lines after `# tracer: function_graph` and `#`.
pub fn graph_header(instance: &Instance) -> String {
    let f = Flags::of(instance);
    let mut out = String::new();
    if !f.context {
        return out;
    }
    out.push('#');
    if f.abstime {
        out.push_str("     TIME       ");
    }
    if f.cpu {
        out.push_str(" CPU");
    }
    if f.proc_ {
        out.push_str("  TASK/PID       ");
    }
    if f.duration {
        out.push_str("  DURATION   ");
    }
    out.push_str("               FUNCTION CALLS\n#");
    if f.abstime {
        out.push_str("      |         ");
    }
    if f.cpu {
        out.push_str(" |  ");
    }
    if f.proc_ {
        out.push_str("   |    |        ");
    }
    if f.duration {
        out.push_str("   |   |      ");
    }
    out.push_str("               |   |   |   |\n");
    out
}

/// The kernel's duration marks: the first threshold a duration exceeds.
fn mark(duration: u64) -> char {
    const MARKS: [(u64, char); 6] = [
        (1_000_000_000, '$'),
        (100_000_000, '@'),
        (10_000_000, '*'),
        (1_000_000, '#'),
        (100_000, '!'),
        (10_000, '+'),
    ];
    MARKS
        .iter()
        .find(|(v, _)| duration > *v)
        .map_or(' ', |(_, c)| *c)
}

/// `trace_print_graph_duration`: microseconds with at most 7 digits in all, then ` us ` and
/// padding to the column's width.
fn write_duration(duration: u64, out: &mut String) {
    let usecs = (duration / 1000).to_string();
    let nsecs = duration % 1000;
    let mut len = usecs.len();
    out.push_str(&usecs);
    if len < 7 {
        let digits = format!("{nsecs:03}");
        let keep = (7 - len).min(4).min(digits.len());
        out.push('.');
        out.push_str(&digits[..keep]);
        len += keep + 1;
    }
    out.push_str(" us ");
    for _ in len..8 {
        out.push(' ');
    }
}

enum Fill {
    Full,
    Time(u64),
}

fn print_duration(f: &Flags, what: Fill, out: &mut String) {
    if !f.duration || !f.context {
        return;
    }
    match what {
        Fill::Full => out.push_str("              |  "),
        Fill::Time(d) => {
            if f.overhead {
                out.push(mark(d));
                out.push(' ');
            } else {
                out.push_str("  ");
            }
            write_duration(d, out);
            out.push_str("|  ");
        }
    }
}

/// The printer's memory of one CPU: the last thread seen there, its depth, and which
/// function each open depth entered (for `}` lines that need the name).
#[derive(Default)]
pub(crate) struct CpuState {
    last_pid: Option<i32>,
    depth: u32,
    enter: Vec<usize>,
}

/// `comm-pid` centred in 14 columns, the comm cut to 7 characters, as `print_graph_proc`.
fn write_proc(pid: i32, out: &mut String) {
    let comm = if pid == 0 {
        "<idle>".to_string()
    } else {
        crate::thread::comm_of(pid).unwrap_or_else(|| "<...>".to_string())
    };
    let comm: String = comm.chars().take(7).collect();
    let pid_s = pid.to_string();
    let len = comm.chars().count() + pid_s.len() + 1;
    let spaces = 14usize.saturating_sub(len);
    for _ in 0..spaces / 2 {
        out.push(' ');
    }
    let _ = write!(out, "{comm}-{pid_s}");
    for _ in 0..spaces - spaces / 2 {
        out.push(' ');
    }
}

struct Printer<'a> {
    instance: &'a Instance,
    inv: Arc<Inventory>,
    flags: Flags,
    cpus: Vec<CpuState>,
    cpu_width: usize,
}

impl Printer<'_> {
    fn write_cpu(&self, cpu: usize, out: &mut String) {
        let _ = write!(out, " {cpu:>w$}) ", w = self.cpu_width);
    }

    fn sym(&self, addr: usize, out: &mut String) {
        self.inv.write_sym(out, addr, false);
    }

    /// The context-switch banner when another thread appears on a CPU, then the columns
    /// before the duration.
    fn prologue(&mut self, event: &RawEvent, out: &mut String) {
        let cpu = event.cpu;
        let pid = pid_of(&event.data);
        let last = self.cpus[cpu].last_pid.replace(pid);
        if let Some(prev) = last.filter(|&p| p != pid) {
            out.push_str(" ------------------------------------------\n");
            self.write_cpu(cpu, out);
            write_proc(prev, out);
            out.push_str(" => ");
            write_proc(pid, out);
            out.push_str("\n ------------------------------------------\n\n");
        }
        if !self.flags.context {
            return;
        }
        if self.flags.abstime {
            let _ = write!(
                out,
                "{:5}.{:06} |  ",
                event.ts / 1_000_000_000,
                event.ts % 1_000_000_000 / 1000
            );
        }
        if self.flags.cpu {
            self.write_cpu(cpu, out);
        }
        if self.flags.proc_ {
            write_proc(pid, out);
            out.push_str(" | ");
        }
    }

    fn indent(depth: u32, out: &mut String) {
        for _ in 0..depth * 2 {
            out.push(' ');
        }
    }

    fn entry(&mut self, event: &RawEvent, leaf: Option<&RawEvent>, out: &mut String) {
        let record = &event.data;
        let func = u64_at(record, 8) as usize;
        let depth = u32_at(record, 16);
        self.prologue(event, out);
        let cpu = event.cpu;
        match leaf {
            Some(ret) => {
                let duration = u64_at(&ret.data, 32).wrapping_sub(u64_at(&ret.data, 24));
                self.cpus[cpu].depth = depth.saturating_sub(1);
                if let Some(slot) = self.cpus[cpu].enter.get_mut(depth as usize) {
                    *slot = 0;
                }
                print_duration(&self.flags, Fill::Time(duration), out);
                Self::indent(depth, out);
                self.sym(func, out);
                out.push_str("();\n");
            }
            None => {
                self.cpus[cpu].depth = depth;
                let enter = &mut self.cpus[cpu].enter;
                if enter.len() <= depth as usize {
                    enter.resize(depth as usize + 1, 0);
                }
                enter[depth as usize] = func;
                print_duration(&self.flags, Fill::Full, out);
                Self::indent(depth, out);
                self.sym(func, out);
                out.push_str("() {\n");
            }
        }
    }

    fn exit(&mut self, event: &RawEvent, out: &mut String) {
        let record = &event.data;
        let func = u64_at(record, 8) as usize;
        let depth = u32_at(record, 16);
        let duration = u64_at(record, 32).wrapping_sub(u64_at(record, 24));
        let cpu = event.cpu;
        self.cpus[cpu].depth = depth.saturating_sub(1);
        let matched = match self.cpus[cpu].enter.get_mut(depth as usize) {
            Some(slot) => {
                let opened_here = *slot == func;
                *slot = 0;
                opened_here
            }
            None => false,
        };
        self.prologue(event, out);
        print_duration(&self.flags, Fill::Time(duration), out);
        Self::indent(depth, out);
        if matched && !self.flags.tail {
            out.push_str("}\n");
        } else {
            out.push_str("} /* ");
            self.sym(func, out);
            out.push_str(" */\n");
        }
        if self.flags.overrun {
            let _ = writeln!(out, " (Overruns: {})", u32_at(record, 20));
        }
    }

    /// Any other record: its text as a comment at the CPU's current depth.
    fn comment(&mut self, event: &RawEvent, out: &mut String) {
        let cpu = event.cpu;
        let depth = self.cpus[cpu].depth;
        self.prologue(event, out);
        print_duration(&self.flags, Fill::Full, out);
        if depth > 0 {
            for _ in 0..(depth + 1) * 2 {
                out.push(' ');
            }
        }
        out.push_str("/* ");
        out.push_str(&event_text(self.instance, event));
        while out.ends_with('\n') {
            out.pop();
        }
        out.push_str(" */\n");
    }

    fn lost(&self, event: &RawEvent, out: &mut String) {
        if event.lost_before > 0 {
            let _ = writeln!(out, "CPU:{} [LOST {} EVENTS]", event.cpu, event.lost_before);
        }
    }
}

/// The text an ordinary trace line shows after its context columns.
fn event_text(instance: &Instance, event: &RawEvent) -> String {
    let record = &event.data;
    if id_of(record) == crate::event::id::MARKER_ID.0 {
        // The message only, as the kernel's graph comments print a marker.
        let text = record.get(16..).unwrap_or_default();
        let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
        return String::from_utf8_lossy(&text[..end]).into_owned();
    }
    let quiet = RawEvent {
        cpu: event.cpu,
        ts: event.ts,
        lost_before: 0,
        data: event.data.clone(),
    };
    let mut line = Vec::new();
    // The ordinary printer, not the graph one that called us.
    IN_COMMENT.with(|c| c.set(true));
    crate::output::format_event(instance, &quiet, &mut line);
    IN_COMMENT.with(|c| c.set(false));
    let line = String::from_utf8_lossy(&line).into_owned();
    if !instance.options.get("context-info") {
        return line;
    }
    // The context ends with the timestamp's `: `.
    match line.find("]") {
        Some(at) => match line[at..].find(": ") {
            Some(colon) => line[at + colon + 2..].to_string(),
            None => line,
        },
        None => line,
    }
}

thread_local! {
    /// Set while a graph comment renders its record with the ordinary printer.
    static IN_COMMENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn new_printer(instance: &Instance, nr_cpus: usize) -> Printer<'_> {
    Printer {
        instance,
        inv: ustrace_inspect::symbols::inventory(),
        flags: Flags::of(instance),
        cpus: (0..nr_cpus).map(|_| CpuState::default()).collect(),
        cpu_width: nr_cpus.saturating_sub(1).to_string().len(),
    }
}

/// The `trace` file of an instance running `function_graph` (one CPU's with `cpu`): the
/// header, then the call graph.
pub fn format_graph_trace(
    instance: &Instance,
    buffer: &ustrace_ringbuf::RingBuffer,
    cpu: Option<usize>,
) -> Vec<u8> {
    let mut out = format!("# tracer: function_graph\n#\n{}", graph_header(instance));
    let nr = buffer.nr_cpus();
    let mut queues: Vec<VecDeque<RawEvent>> = (0..nr)
        .map(|c| {
            if cpu.is_some_and(|want| want != c) {
                VecDeque::new()
            } else {
                buffer.iter_cpu(c).collect()
            }
        })
        .collect();
    let mut p = new_printer(instance, nr);
    while let Some(c) = (0..nr)
        .filter(|&c| !queues[c].is_empty())
        .min_by_key(|&c| queues[c][0].ts)
    {
        let event = queues[c].pop_front().expect("not empty");
        p.lost(&event, &mut out);
        render_graph(&mut p, &event, &mut queues[c], &mut out);
    }
    out.into_bytes()
}

fn render_graph(
    p: &mut Printer<'_>,
    event: &RawEvent,
    next_on_cpu: &mut VecDeque<RawEvent>,
    out: &mut String,
) {
    let record = &event.data;
    match id_of(record) {
        id if id == GRAPH_ENTRY_ID.0 => {
            let is_leaf = next_on_cpu.front().is_some_and(|n| {
                id_of(&n.data) == GRAPH_EXIT_ID.0
                    && pid_of(&n.data) == pid_of(record)
                    && u64_at(&n.data, 8) == u64_at(record, 8)
            });
            if is_leaf {
                let ret = next_on_cpu.pop_front().expect("peeked");
                p.entry(event, Some(&ret), out);
            } else {
                p.entry(event, None, out);
            }
        }
        id if id == GRAPH_EXIT_ID.0 => p.exit(event, out),
        _ => p.comment(event, out),
    }
}

/// One record as `trace_pipe` prints it while `function_graph` runs: each record on its own
/// (an entry always opens a `{`, as the kernel's when the return is not yet in the buffer).
/// False when the instance does not run the graph tracer.
pub fn render_graph_event(instance: &Instance, event: &RawEvent, out: &mut Vec<u8>) -> bool {
    if IN_COMMENT.with(|c| c.get()) {
        return false;
    }
    let Some(arc) = find_arc(instance) else {
        return false;
    };
    if !super::tracer::is_graph(&arc) {
        return false;
    }
    let st = super::state(&arc);
    let mut guard = st.pipe_printer.lock().unwrap_or_else(|e| e.into_inner());
    let nr = instance.buffer().nr_cpus();
    let saved = guard.take();
    let mut p = new_printer(instance, nr);
    if let Some(cpus) = saved {
        if cpus.len() == nr {
            p.cpus = cpus;
        }
    }
    let mut text = String::new();
    p.lost(event, &mut text);
    render_graph(&mut p, event, &mut VecDeque::new(), &mut text);
    *guard = Some(p.cpus);
    out.extend_from_slice(text.as_bytes());
    true
}

/// What `trace_pipe` keeps between records of the graph printer (per CPU).
pub(crate) type PipeState = std::sync::Mutex<Option<Vec<CpuState>>>;
