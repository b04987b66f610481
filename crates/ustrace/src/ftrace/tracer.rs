//! The `function` and `function_graph` tracers of one instance: which functions are patched,
//! and the fprobe handlers that write their records (the hot path of function tracing).
//!
//! Switching `current_tracer` registers one fprobe on the functions the filter files select
//! (`set_ftrace_filter`, every function when it is empty, minus `set_ftrace_notrace`); a
//! change of those sets while the tracer runs registers the new fprobe before the old one is
//! dropped. What the handlers check per call (`set_ftrace_pid`, `set_graph_function`,
//! `set_graph_notrace`, `max_graph_depth`, `tracing_thresh`, the tracer's options) reaches
//! them as one gate word (a bit per setting that is in force, and the depth limit) and an
//! RCU-published `Knobs` read only when the word says so, so the handlers take no lock,
//! allocate nothing and make no system call, and the common case is a straight line.
//!
//! ```text
//!  function:        entry ─ gate: pid? ─ reserve 24 B ─ ip, parent_ip ─ commit [─ kernel_stack]
//!  function_graph:  entry ─ gate: pid? graph filters? thresh? ─ depth < max? ─ thread depth = d + 1
//!                          ─ funcgraph_entry (depth d), its timestamp is calltime
//!                          per-call data: calltime, d, flags
//!                   exit  ─ thread depth = d ─ flags? (graph marks, thresh: cold path)
//!                          ─ funcgraph_exit, its timestamp is rettime
//! ```
//!
//! One clock read per call and one per return: the records' own timestamps are the call and
//! return times. Under `tracing_thresh` the entry writes no record and the exit reads the
//! clock before deciding whether to write one.
//!
//! The depth is a per-thread counter per tracer, restored from the call's own data at each
//! exit, so a frame left by `longjmp` or an exception (whose exit never runs; the fprobe
//! counts it missed) is repaired by the next exit below it. A function the handler itself
//! calls is entered with the fprobe's recursion guard set: it records nothing and counts as
//! missed, as the kernel counts recursion.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ustrace_ctl::vfs::Errno;
use ustrace_fprobe::{EntryAction, Fprobe, Refusal};

use super::events::{
    FUNCTION_ID, FUNCTION_LEN, GRAPH_ENTRY_ID, GRAPH_ENTRY_LEN, GRAPH_EXIT_ID, GRAPH_EXIT_LEN,
};
use super::filter::{FunctionSet, SetKind};
use crate::buffers::{PidLists, Shared};
use crate::rcu::{read_lock, RcuCell};
use crate::trace::Instance;

/// The tracers `available_tracers` lists, in the kernel's order.
pub const TRACERS: &[&str] = &["function_graph", "function", "nop"];

/// Which tracer an instance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `nop`: no function is patched.
    Nop,
    /// `function`: one `function` record per call.
    Function,
    /// `function_graph`: `funcgraph_entry` and `funcgraph_exit` records with durations.
    Graph,
}

impl Kind {
    /// The tracer's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Nop => "nop",
            Kind::Function => "function",
            Kind::Graph => "function_graph",
        }
    }

    /// The tracer named `name`.
    pub fn from_name(name: &str) -> Option<Kind> {
        match name {
            "nop" => Some(Kind::Nop),
            "function" => Some(Kind::Function),
            "function_graph" => Some(Kind::Graph),
            _ => None,
        }
    }

    fn code(self) -> u32 {
        self as u32
    }
}

/// What the graph handlers look at beyond the patched set, published RCU-style.
#[derive(Default)]
pub(crate) struct Knobs {
    pids: PidLists,
    graph: Arc<FunctionSet>,
    graph_notrace: Arc<FunctionSet>,
}

/// Most function_graph tracers running at once (each has its own per-thread depth).
const GRAPH_SLOTS: usize = 8;

thread_local! {
    /// Per tracer slot: the calling thread's call depth.
    static DEPTH: [Cell<u32>; GRAPH_SLOTS] = const { [const { Cell::new(0) }; GRAPH_SLOTS] };
    /// Per tracer slot: depth + 1 of the `set_graph_function` function the thread is in (0:
    /// none).
    static GRAPH_IN: [Cell<u32>; GRAPH_SLOTS] = const { [const { Cell::new(0) }; GRAPH_SLOTS] };
    /// Per tracer slot: depth + 1 of the `set_graph_notrace` function the thread is in.
    static NOTRACE_IN: [Cell<u32>; GRAPH_SLOTS] = const { [const { Cell::new(0) }; GRAPH_SLOTS] };
}

static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

/// Option bits the handlers read.
pub(crate) mod opt {
    /// `func_stack_trace`: a `kernel_stack` entry after each `function` record.
    pub const STACK: u32 = 1;
}

/// Bits of the high half of [`Live::gate`]: each sends a call off the handlers' straight
/// line, into the path that looks it up.
mod gate {
    /// `set_ftrace_pid`/`set_ftrace_notrace_pid` has threads.
    pub const PIDS: u32 = 1;
    /// `set_graph_function`/`set_graph_notrace` has functions.
    pub const GRAPH: u32 = 2;
    /// `tracing_thresh` is set (only exits are recorded, and only long ones).
    pub const THRESH: u32 = 4;
    /// `func_stack_trace` is on.
    pub const STACK: u32 = 8;
}

/// The state the handlers of one instance share with the control side.
pub(crate) struct Live {
    shared: Arc<Shared>,
    /// `gate` bits `<< 32 | depth limit` (`max_graph_depth`, `u32::MAX` for none): what the
    /// handlers check per call, in one load. All bits clear is the common case, which then
    /// needs nothing else of the knobs.
    gate: AtomicU64,
    knobs: RcuCell<Knobs>,
    thresh_ns: AtomicU64,
    slot: usize,
}

impl Live {
    /// The [`gate`](Live::gate) word for these settings.
    fn gate_word(knobs: &Knobs, max_depth: u32, thresh_ns: u64, options: u32) -> u64 {
        let mut bits = 0;
        if !knobs.pids.is_empty() {
            bits |= gate::PIDS;
        }
        if !knobs.graph.is_empty() || !knobs.graph_notrace.is_empty() {
            bits |= gate::GRAPH;
        }
        if thresh_ns != 0 {
            bits |= gate::THRESH;
        }
        if options & opt::STACK != 0 {
            bits |= gate::STACK;
        }
        let limit = if max_depth == 0 { u32::MAX } else { max_depth };
        u64::from(bits) << 32 | u64::from(limit)
    }
}

/// The running tracer of an instance.
pub(crate) struct Running {
    kind: Kind,
    fprobe: Option<Fprobe>,
    live: Arc<Live>,
}

/// The tracer part of an instance's state.
#[derive(Default)]
pub(crate) struct TracerState {
    current: AtomicU32,
    running: Mutex<Option<Running>>,
    /// `set_ftrace_pid` and `set_ftrace_notrace_pid`.
    pub(crate) pids: Mutex<PidLists>,
    /// `func_stack_trace` and the other option bits.
    pub(crate) options: AtomicU32,
    /// Functions the last switch could not patch.
    pub(crate) refused: Mutex<Vec<Refusal>>,
    /// How many functions the last switch patched.
    pub(crate) patched: AtomicUsize,
}

/// `max_graph_depth` (0: no limit): process-wide, as the kernel's.
pub(crate) static MAX_GRAPH_DEPTH: AtomicU32 = AtomicU32::new(0);

/// `tracing_thresh`, in nanoseconds: process-wide, as the kernel's.
pub(crate) static TRACING_THRESH_NS: AtomicU64 = AtomicU64::new(0);

/// The tracer `instance` runs.
pub fn current(instance: &Arc<Instance>) -> Kind {
    match super::state(instance)
        .tracer
        .current
        .load(Ordering::Acquire)
    {
        1 => Kind::Function,
        2 => Kind::Graph,
        _ => Kind::Nop,
    }
}

/// Whether `instance` runs `function_graph` (its trace prints as a call graph).
pub fn is_graph(instance: &Arc<Instance>) -> bool {
    current(instance) == Kind::Graph
}

/// Functions the running tracer could not patch, with the reasons.
pub fn refused(instance: &Arc<Instance>) -> Vec<Refusal> {
    super::state(instance)
        .tracer
        .refused
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// How many functions the running tracer patched.
pub fn patched(instance: &Arc<Instance>) -> usize {
    super::state(instance)
        .tracer
        .patched
        .load(Ordering::Relaxed)
}

/// Missed calls of the running tracer (recursion from inside its handlers, frames left by
/// `longjmp`/exceptions, full per-thread stacks).
pub fn missed(instance: &Arc<Instance>) -> u64 {
    let st = super::state(instance);
    let running = st.tracer.running.lock().unwrap_or_else(|e| e.into_inner());
    running
        .as_ref()
        .and_then(|r| r.fprobe.as_ref())
        .map_or(0, |f| f.nmissed())
}

/// Whether a function of this name belongs to the tracer itself or to the Rust runtime
/// library code it runs on (the kernel's `notrace` on its tracing code and `lib/`): the
/// record path, the patching machinery and its int3 handler call these (out of line in an
/// unoptimised build), so patching them would put the tracer inside every traced call, or
/// an int3 inside the handler that resolves int3s.
fn tracer_internal(name: &str) -> bool {
    // Some legacy Rust symbols reach the inventory still escaped
    // (`_$LT$I$u20$as$u20$core..iter..IntoIterator$GT$::into_iter::h…`): judge them unescaped.
    if name.contains('$') {
        let plain = name
            .strip_prefix('_')
            .unwrap_or(name)
            .replace("$LT$", "<")
            .replace("$GT$", ">")
            .replace("$u20$", " ")
            .replace("$u5b$", "[")
            .replace("$u5d$", "]")
            .replace("$u3b$", ";")
            .replace("$RF$", "&")
            .replace("$BP$", "*")
            .replace("..", "::");
        return own_or_runtime(&plain);
    }
    own_or_runtime(name)
}

fn own_or_runtime(name: &str) -> bool {
    // This library's modules, not a program's crate that is also called `ustrace` (the
    // command's own `ustrace::demo` is traced like any program).
    if let Some(rest) = name
        .strip_prefix("ustrace::")
        .or_else(|| name.strip_prefix("<ustrace::"))
    {
        let module = rest.split("::").next().unwrap_or(rest);
        return LIBRARY_MODULES.contains(&module);
    }
    const OWN: &[&str] = &[
        "ustrace_ringbuf::",
        "ustrace_fprobe::",
        "ustrace_inspect::",
        "ustrace_ctl::",
        "<ustrace_",
        "core::",
        "<core::",
        "alloc::",
        "<alloc::",
        "std::",
        "<std::",
        "compiler_builtins::",
        "<&",
        "<*",
        "<[",
        "<(",
    ];
    OWN.iter().any(|p| name.starts_with(p))
        || name.contains("ustrace_ringbuf")
        || name.contains("ustrace_fprobe")
        || generic_runtime_impl(name)
}

/// The modules of this library (`crate::*`), whose functions the tracer and the tracefs
/// behind it run.
const LIBRARY_MODULES: &[&str] = &[
    "__private",
    "buffers",
    "cpumask",
    "dynevent",
    "dynevent_cmd",
    "event",
    "event_file",
    "filter",
    "ftrace",
    "hist",
    "hist_inter",
    "marker",
    "options",
    "output",
    "rcu",
    "runtime_event",
    "serve",
    "set_event",
    "setup",
    "snapshot",
    "stage",
    "synth",
    "thread",
    "trace",
    "tracefs",
    "tracepoint",
    "trigger",
];

/// `<I as core::iter::IntoIterator>::into_iter`, `<u64 as core::ops::Add>::add`: the
/// standard library's code instantiated for a type parameter or a primitive (what a trait
/// impl of the program's own types, `<my::Type as core::fmt::Debug>::fmt`, is not).
fn generic_runtime_impl(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('<') else {
        return false;
    };
    let Some((self_ty, _)) = rest.split_once(" as ") else {
        return false;
    };
    const PRIMITIVES: &[&str] = &[
        "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
        "f32", "f64", "bool", "char", "str", "!",
    ];
    let param = self_ty.len() <= 3
        && self_ty
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
    param || PRIMITIVES.contains(&self_ty)
}

/// The functions the tracer of `instance` patches: `set_ftrace_filter` (all when empty)
/// minus `set_ftrace_notrace`, minus the tracer's own code (reported as refused). The
/// function profiler patches the same.
pub(crate) fn targets(instance: &Arc<Instance>) -> (Vec<usize>, Vec<Refusal>) {
    let filter = super::filter::selected(instance, SetKind::Filter);
    let notrace = super::filter::selected(instance, SetKind::Notrace);
    let inv = ustrace_inspect::symbols::inventory();
    let mut out = Vec::new();
    let mut own = Vec::new();
    let mut last = None;
    for s in inv.functions() {
        if last == Some(s.addr) {
            continue;
        }
        last = Some(s.addr);
        if (!filter.is_empty() && !filter.contains(s.addr)) || notrace.contains(s.addr) {
            continue;
        }
        let (name, _) = inv.lookup(s.addr).unwrap_or((s, 0));
        // Usually both are the same symbol: its name is judged once.
        if tracer_internal(&name.name) || (s.name != name.name && tracer_internal(&s.name)) {
            own.push(Refusal {
                function: name.name.clone(),
                addr: s.addr,
                reason: "part of the tracer or the runtime it runs on (notrace)".into(),
            });
            continue;
        }
        out.push(s.addr);
    }
    (out, own)
}

/// Switches `instance` to `kind` (a write of `current_tracer`).
pub fn switch(instance: &Arc<Instance>, kind: Kind) -> Result<(), Errno> {
    let st = super::state(instance);
    let mut running = st.tracer.running.lock().unwrap_or_else(|e| e.into_inner());
    if current(instance) == kind {
        return Ok(());
    }
    let old = running.take();
    if let Some(old) = old {
        stop(old);
    }
    st.tracer.patched.store(0, Ordering::Relaxed);
    if kind == Kind::Nop {
        st.tracer.current.store(kind.code(), Ordering::Release);
        return Ok(());
    }
    let (started, refused) = start(instance, &st, kind)?;
    st.tracer.patched.store(
        started.fprobe.as_ref().map_or(0, |f| f.functions().len()),
        Ordering::Relaxed,
    );
    *st.tracer.refused.lock().unwrap_or_else(|e| e.into_inner()) = refused;
    // As the kernel's tracer switch: the buffer starts empty for the new tracer.
    instance.reset_buffer();
    *running = Some(started);
    st.tracer.current.store(kind.code(), Ordering::Release);
    Ok(())
}

fn stop(old: Running) {
    if let Some(fp) = old.fprobe {
        let _ = fp.unregister();
    }
    if old.kind == Kind::Graph {
        SLOTS_USED.fetch_and(!(1 << old.live.slot), Ordering::AcqRel);
    }
}

fn knobs_of(instance: &Arc<Instance>, st: &super::State) -> Knobs {
    Knobs {
        pids: st
            .tracer
            .pids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        graph: graph_set(instance, SetKind::Graph),
        graph_notrace: graph_set(instance, SetKind::GraphNotrace),
    }
}

/// `set_graph_function` and `set_graph_notrace` are the top level's, for every instance (the
/// kernel's graph hashes are global).
fn graph_set(instance: &Arc<Instance>, kind: SetKind) -> Arc<FunctionSet> {
    match crate::trace::existing_tracing() {
        Some(t) => super::filter::selected(t.top(), kind),
        None => super::filter::selected(instance, kind),
    }
}

/// Starts `kind` on the instance: what runs, and the functions it could not patch.
fn start(
    instance: &Arc<Instance>,
    st: &super::State,
    kind: Kind,
) -> Result<(Running, Vec<Refusal>), Errno> {
    let slot = if kind == Kind::Graph {
        claim_slot().ok_or(Errno(libc::EBUSY))?
    } else {
        0
    };
    let live = Arc::new(Live {
        shared: instance.shared.clone(),
        gate: AtomicU64::new(0),
        knobs: RcuCell::empty(),
        thresh_ns: AtomicU64::new(0),
        slot,
    });
    republish(instance, st, &live);
    let (ips, mut refused) = targets(instance);
    let fprobe = match register(kind, &live, &ips, &mut refused) {
        Ok(fp) => fp,
        Err(e) => {
            if kind == Kind::Graph {
                SLOTS_USED.fetch_and(!(1 << slot), Ordering::AcqRel);
            }
            return Err(e);
        }
    };
    Ok((Running { kind, fprobe, live }, refused))
}

fn claim_slot() -> Option<usize> {
    loop {
        let used = SLOTS_USED.load(Ordering::Acquire);
        let free = (0..GRAPH_SLOTS).find(|i| used & (1 << i) == 0)?;
        if SLOTS_USED
            .compare_exchange(used, used | 1 << free, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Some(free);
        }
    }
}

/// Registers the tracer's fprobe on `ips`, adding the functions it could not patch to
/// `refused`. Nothing to patch (every selected function is the tracer's own or cannot be
/// patched) is not an error: the tracer runs and records nothing, as the kernel's does with
/// a filter whose functions are never called, and `unpatchable_functions` says why.
fn register(
    kind: Kind,
    live: &Arc<Live>,
    ips: &[usize],
    refused: &mut Vec<Refusal>,
) -> Result<Option<Fprobe>, Errno> {
    if ips.is_empty() {
        return Ok(None);
    }
    let builder = match kind {
        Kind::Function => {
            // `Shared` held directly, as the graph handlers do (one dependent load less).
            let (l, sh) = (live.clone(), live.shared.clone());
            Fprobe::builder().entry_handler(move |_, ip, parent, _, _| {
                function_entry(&l, &sh, ip, parent);
                EntryAction::Continue
            })
        }
        Kind::Graph => match live.graph_slot() {
            0 => graph_handlers::<0>(live),
            1 => graph_handlers::<1>(live),
            2 => graph_handlers::<2>(live),
            3 => graph_handlers::<3>(live),
            4 => graph_handlers::<4>(live),
            5 => graph_handlers::<5>(live),
            6 => graph_handlers::<6>(live),
            _ => graph_handlers::<7>(live),
        },
        Kind::Nop => return Err(Errno::EINVAL),
    };
    match builder.register_ips_lenient(ips) {
        Ok(fp) => {
            refused.extend(fp.refused());
            Ok(Some(fp))
        }
        // None of them could be patched: each is listed with its reason.
        Err(ustrace_fprobe::Error::Refused(why)) => {
            let inv = ustrace_inspect::symbols::inventory();
            refused.extend(ips.iter().map(|&ip| {
                Refusal {
                    function: inv
                        .lookup(ip)
                        .map_or_else(|| format!("{ip:#x}"), |(s, _)| s.name.clone()),
                    addr: ip,
                    reason: ustrace_fprobe::check_patchable(ip).unwrap_or_else(|| why.clone()),
                }
            }));
            Ok(None)
        }
        Err(_) => Err(Errno(libc::ENODEV)),
    }
}

/// The graph tracer's handlers for the tracer in slot `S`. The slot is a constant of the
/// handlers rather than a field they load: the per-thread depth counter is then at a fixed
/// thread-local address (`%fs:const`), so the exit's store of the depth and the next
/// entry's load of it need no load of their own before their address is known, and the
/// two `slot` loads per call go. Each handler also holds the instance's `Shared` itself: the
/// ring buffer is then one load away from the closure instead of two (closure, `Live`,
/// `Shared`), a shorter chain of dependent loads ahead of each reservation (1 to 3 ns per
/// call measured, over both handlers).
fn graph_handlers<const S: usize>(live: &Arc<Live>) -> ustrace_fprobe::FprobeBuilder {
    debug_assert_eq!(live.graph_slot(), S);
    let (le, lx) = (live.clone(), live.clone());
    let (se, sx) = (live.shared.clone(), live.shared.clone());
    Fprobe::builder()
        .entry_data_size(ENTRY_DATA)
        .entry_handler(move |_, ip, _, _, data| graph_entry::<S>(&le, &se, ip, data))
        .exit_handler(move |_, ip, _, _, data| graph_exit::<S>(&lx, &sx, ip, data))
}

/// Re-applies the instance's sets after one changed: a new patched set for the filter
/// files, new knobs for the graph files.
pub(crate) fn sets_changed(instance: &Arc<Instance>, kind: SetKind) {
    if matches!(kind, SetKind::Graph | SetKind::GraphNotrace) {
        thresh_changed();
        return;
    }
    let st = super::state(instance);
    let mut running = st.tracer.running.lock().unwrap_or_else(|e| e.into_inner());
    let Some(run) = running.as_mut() else {
        return;
    };
    match kind {
        SetKind::Graph | SetKind::GraphNotrace => {}
        SetKind::Filter | SetKind::Notrace => {
            let (ips, mut refused) = targets(instance);
            // The new fprobe first, then the old one goes: no call in between is missed.
            let new = register(run.kind, &run.live, &ips, &mut refused)
                .ok()
                .flatten();
            st.tracer.patched.store(
                new.as_ref().map_or(0, |f| f.functions().len()),
                Ordering::Relaxed,
            );
            *st.tracer.refused.lock().unwrap_or_else(|e| e.into_inner()) = refused;
            if let Some(old) = std::mem::replace(&mut run.fprobe, new) {
                let _ = old.unregister();
            }
        }
    }
}

/// Publishes the pid lists, graph sets, depth limit, threshold and options to the handlers.
pub(crate) fn republish_all(instance: &Arc<Instance>) {
    let st = super::state(instance);
    let running = st.tracer.running.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(run) = running.as_ref() {
        republish(instance, &st, &run.live);
    }
}

fn republish(instance: &Arc<Instance>, st: &super::State, live: &Live) {
    let knobs = knobs_of(instance, st);
    let thresh = TRACING_THRESH_NS.load(Ordering::Relaxed);
    let word = Live::gate_word(
        &knobs,
        MAX_GRAPH_DEPTH.load(Ordering::Relaxed),
        thresh,
        st.tracer.options.load(Ordering::Relaxed),
    );
    // The knobs and the threshold before the word that sends handlers to them.
    live.knobs.replace(Some(knobs));
    live.thresh_ns.store(thresh, Ordering::Relaxed);
    live.gate.store(word, Ordering::Release);
}

/// Republishes the process-wide settings (`tracing_thresh`, `max_graph_depth`, the graph
/// sets) to every running tracer.
pub(crate) fn thresh_changed() {
    let Some(tracing) = crate::trace::existing_tracing() else {
        return;
    };
    for instance in tracing.all() {
        republish_all(&instance);
    }
}

impl Live {
    /// Whether `set_ftrace_pid`/`set_ftrace_notrace_pid` keep the calling thread out (only
    /// asked when the gate says there are lists).
    #[cold]
    #[inline(never)]
    fn ignores(&self, tid: i32) -> bool {
        let guard = read_lock();
        self.knobs.get(&guard).is_some_and(|k| k.pids.ignores(tid))
    }

    /// The graph tracer's slot, known in range (so indexing the per-thread arrays needs no
    /// check).
    #[inline(always)]
    fn graph_slot(&self) -> usize {
        self.slot & (GRAPH_SLOTS - 1)
    }

    /// The time now on the buffer's clock, for a call or return time that no record of
    /// this handler carries.
    #[inline(never)]
    fn now(&self) -> u64 {
        ustrace_ringbuf::clock::now(self.shared.buffer.clock())
    }
}

const _: () = assert!(GRAPH_SLOTS.is_power_of_two());

#[inline(always)]
fn put_u64(record: &mut [u8], at: usize, v: u64) {
    record[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

#[inline(always)]
fn put_u32(record: &mut [u8], at: usize, v: u32) {
    record[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

/// The `function` tracer's handler: one record per call.
#[inline]
fn function_entry(live: &Live, sh: &Shared, ip: usize, parent: usize) {
    let bits = (live.gate.load(Ordering::Relaxed) >> 32) as u32;
    let tid = crate::thread::current_tid(&sh.record_cmd);
    if bits & gate::PIDS != 0 && live.ignores(tid) {
        return;
    }
    let Some(mut slot) = sh.buffer.reserve(FUNCTION_LEN) else {
        return;
    };
    let record: &mut [u8] = &mut slot;
    crate::event::field::write_common_header(record, FUNCTION_ID.0, tid);
    put_u64(record, 8, ip as u64);
    put_u64(record, 16, parent as u64);
    slot.commit();
    if bits & gate::STACK != 0 {
        stack_after(live, tid);
    }
}

#[cold]
#[inline(never)]
fn stack_after(live: &Live, tid: i32) {
    let mut frames = [0usize; 64];
    // Skipped: this function and the handler closure's frames down to the dispatcher.
    let n = ustrace_inspect::stack::capture(1, &mut frames);
    live.shared.write_kernel_stack(tid, &frames[..n]);
}

/// Per-call flags kept in the graph tracer's entry data.
const LEFT_GRAPH: u32 = 1;
const LEFT_NOTRACE: u32 = 2;
const SILENT: u32 = 4;
/// `tracing_thresh` was set at the call: no entry record, and the exit is kept only when
/// the call took at least that long (the kernel's threshold tracer, chosen per call here).
const THRESHED: u32 = 8;

/// What the graph tracer keeps per call, in the fprobe's entry data: `calltime`, the depth
/// the call was entered at, and its flags.
const ENTRY_DATA: usize = 16;

#[inline(always)]
fn put_entry_data(data: &mut [u8; ENTRY_DATA], calltime: u64, depth: u32, flags: u32) {
    data[0..8].copy_from_slice(&calltime.to_ne_bytes());
    data[8..12].copy_from_slice(&depth.to_ne_bytes());
    data[12..16].copy_from_slice(&flags.to_ne_bytes());
}

/// The gate bits the graph tracer's handlers take a look up for (`func_stack_trace` is
/// the function tracer's).
const GRAPH_GATES: u64 = ((gate::PIDS | gate::GRAPH | gate::THRESH) as u64) << 32;

/// The graph tracer's entry handler. The common case (no pid list, no graph set, no
/// threshold, within `max_graph_depth`) is a straight line: one look at the gate, the
/// depth, one record, whose timestamp is also the call's `calltime` (one clock read).
#[inline]
fn graph_entry<const S: usize>(
    live: &Live,
    sh: &Shared,
    ip: usize,
    data: &mut [u8],
) -> EntryAction {
    let Some(data) = data.first_chunk_mut::<ENTRY_DATA>() else {
        // The fprobe was registered with this size: never taken.
        return EntryAction::SkipExit;
    };
    let word = live.gate.load(Ordering::Relaxed);
    let slot = S & (GRAPH_SLOTS - 1);
    let depth = DEPTH.with(|d| d[slot].get());
    if word & GRAPH_GATES != 0 {
        return graph_entry_gated(live, ip, data, word, depth);
    }
    if depth >= word as u32 {
        return EntryAction::SkipExit;
    }
    DEPTH.with(|d| d[slot].set(depth + 1));
    let tid = crate::thread::current_tid(&sh.record_cmd);
    let calltime = write_graph_entry(live, sh, tid, ip, depth);
    put_entry_data(data, calltime, depth, 0);
    EntryAction::Continue
}

/// Writes a `funcgraph_entry` record; its time is the call's `calltime` (read from the
/// clock when no record could be written: recording off, or dropped).
#[inline(always)]
fn write_graph_entry(live: &Live, sh: &Shared, tid: i32, ip: usize, depth: u32) -> u64 {
    let Some(mut slot) = sh.buffer.reserve(GRAPH_ENTRY_LEN) else {
        return live.now();
    };
    let calltime = slot.timestamp();
    let record: &mut [u8] = &mut slot;
    crate::event::field::write_common_header(record, GRAPH_ENTRY_ID.0, tid);
    put_u64(record, 8, ip as u64);
    put_u32(record, 16, depth);
    put_u32(record, 20, 0);
    slot.commit();
    calltime
}

/// The graph tracer's entry when any of pid lists, graph sets, threshold or stack option
/// is set.
#[cold]
#[inline(never)]
fn graph_entry_gated(
    live: &Live,
    ip: usize,
    data: &mut [u8; ENTRY_DATA],
    word: u64,
    depth: u32,
) -> EntryAction {
    let bits = (word >> 32) as u32;
    let tid = crate::thread::current_tid(&live.shared.record_cmd);
    if bits & gate::PIDS != 0 && live.ignores(tid) {
        return EntryAction::SkipExit;
    }
    let slot = live.graph_slot();
    let mut flags = 0;
    if bits & gate::GRAPH != 0 {
        if NOTRACE_IN.with(|n| n[slot].get()) != 0 {
            return EntryAction::SkipExit;
        }
        let guard = read_lock();
        if let Some(k) = live.knobs.get(&guard) {
            if k.graph_notrace.contains(ip) {
                // Neither this function nor its callees are recorded; its exit clears the mark.
                NOTRACE_IN.with(|n| n[slot].set(depth + 1));
                flags |= LEFT_NOTRACE | SILENT;
            } else if !k.graph.is_empty() && GRAPH_IN.with(|g| g[slot].get()) == 0 {
                if !k.graph.contains(ip) {
                    return EntryAction::SkipExit;
                }
                GRAPH_IN.with(|g| g[slot].set(depth + 1));
                flags |= LEFT_GRAPH;
            }
        }
    }
    if depth >= word as u32 && flags == 0 {
        return EntryAction::SkipExit;
    }
    DEPTH.with(|d| d[slot].set(depth + 1));
    if bits & gate::THRESH != 0 {
        flags |= THRESHED;
    }
    // With tracing_thresh only exits are kept, as the kernel's thresh entry handler.
    let calltime = if flags & (SILENT | THRESHED) != 0 {
        live.now()
    } else {
        write_graph_entry(live, &live.shared, tid, ip, depth)
    };
    put_entry_data(data, calltime, depth, flags);
    EntryAction::Continue
}

/// The graph tracer's exit handler. The common case (the entry set no flag) writes one
/// record, whose timestamp is also the call's `rettime` (one clock read).
#[inline]
fn graph_exit<const S: usize>(live: &Live, sh: &Shared, ip: usize, data: &mut [u8]) {
    let Some(data) = data.first_chunk::<ENTRY_DATA>() else {
        return;
    };
    let calltime = u64::from_ne_bytes(data[0..8].try_into().expect("8 bytes"));
    let depth = u32::from_ne_bytes(data[8..12].try_into().expect("4 bytes"));
    let flags = u32::from_ne_bytes(data[12..16].try_into().expect("4 bytes"));
    DEPTH.with(|d| d[S & (GRAPH_SLOTS - 1)].set(depth));
    if flags != 0 {
        graph_exit_flagged(live, ip, depth, calltime, flags);
        return;
    }
    write_graph_exit_now(sh, ip, depth, calltime);
}

/// Writes a `funcgraph_exit` record whose time is the return's `rettime`.
#[inline(always)]
fn write_graph_exit_now(sh: &Shared, ip: usize, depth: u32, calltime: u64) {
    let tid = crate::thread::current_tid(&sh.record_cmd);
    let Some(mut slot) = sh.buffer.reserve(GRAPH_EXIT_LEN) else {
        return;
    };
    let rettime = slot.timestamp();
    let record: &mut [u8] = &mut slot;
    write_graph_exit(record, tid, ip, depth, calltime, rettime);
    slot.commit();
}

/// The graph tracer's exit of a call whose entry set flags: the graph-set marks it set are
/// cleared; a `set_graph_notrace` call records nothing; under `tracing_thresh` the return
/// time decides whether a record is written at all, so it is read before reserving.
#[cold]
#[inline(never)]
fn graph_exit_flagged(live: &Live, ip: usize, depth: u32, calltime: u64, flags: u32) {
    let slot = live.graph_slot();
    if flags & LEFT_GRAPH != 0 {
        GRAPH_IN.with(|g| g[slot].set(0));
    }
    if flags & LEFT_NOTRACE != 0 {
        NOTRACE_IN.with(|n| n[slot].set(0));
    }
    if flags & SILENT != 0 {
        return;
    }
    if flags & THRESHED == 0 {
        write_graph_exit_now(&live.shared, ip, depth, calltime);
        return;
    }
    let rettime = live.now();
    if rettime.wrapping_sub(calltime) < live.thresh_ns.load(Ordering::Relaxed) {
        return;
    }
    let tid = crate::thread::current_tid(&live.shared.record_cmd);
    if let Some(mut slot) = live.shared.buffer.reserve(GRAPH_EXIT_LEN) {
        let record: &mut [u8] = &mut slot;
        write_graph_exit(record, tid, ip, depth, calltime, rettime);
        slot.commit();
    }
}

#[inline(always)]
fn write_graph_exit(
    record: &mut [u8],
    tid: i32,
    ip: usize,
    depth: u32,
    calltime: u64,
    rettime: u64,
) {
    crate::event::field::write_common_header(record, GRAPH_EXIT_ID.0, tid);
    put_u64(record, 8, ip as u64);
    put_u32(record, 16, depth);
    put_u32(record, 20, 0);
    put_u64(record, 24, calltime);
    put_u64(record, 32, rettime);
}
