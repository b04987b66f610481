//! The function tracers: `function` and `function_graph` (ftrace.rst), built on fprobes as
//! the kernel builds its own on ftrace_ops.
//!
//! ```text
//!  tracefs files ── filter (set_ftrace_filter, set_ftrace_notrace, set_graph_*: function sets)
//!       │           files  (current_tracer, set_ftrace_pid, max_graph_depth, tracing_thresh)
//!       ▼
//!  per-instance State ── tracer: which functions to patch (filter minus notrace, all when
//!       │                empty), one fprobe per instance whose handlers record
//!       ▼
//!  patched function ── fprobe entry/exit ── function / funcgraph_entry / funcgraph_exit
//!                                           records in the instance's ring buffer
//! ```
//!
//! The state of an instance lives here, beside the instance (looked up by its address), so
//! the instance itself knows nothing of function tracing.

pub mod commands;
pub mod events;
pub mod files;
pub mod filter;
pub mod output;
pub mod profile;
pub mod tracer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::trace::Instance;

/// What function tracing keeps per instance.
pub struct State {
    /// The four function sets.
    pub(crate) sets: Arc<filter::Sets>,
    /// The tracer and what its handlers read.
    pub(crate) tracer: tracer::TracerState,
    /// The graph printer's memory between `trace_pipe` reads.
    pub(crate) pipe_printer: output::PipeState,
}

type StateMap = Mutex<HashMap<usize, (Weak<Instance>, Arc<State>)>>;

fn states() -> &'static StateMap {
    static STATES: OnceLock<StateMap> = OnceLock::new();
    STATES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The function-tracing state of `instance`, made on first use.
pub(crate) fn state(instance: &Arc<Instance>) -> Arc<State> {
    commands::init();
    let key = Arc::as_ptr(instance) as usize;
    let mut map = states().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((weak, state)) = map.get(&key) {
        if weak.strong_count() > 0 && std::ptr::eq(weak.as_ptr(), Arc::as_ptr(instance)) {
            return state.clone();
        }
    }
    // States of removed instances go (their address may be reused by a new one).
    map.retain(|_, (weak, _)| weak.strong_count() > 0);
    let state = Arc::new(State {
        sets: Arc::new(filter::Sets::default()),
        tracer: tracer::TracerState::default(),
        pipe_printer: Default::default(),
    });
    map.insert(key, (Arc::downgrade(instance), state.clone()));
    state
}

/// An option the function tracers' handlers read changed on `instance`.
pub(crate) fn option_changed(instance: &Instance, name: &str, on: bool) {
    let Some(arc) = output::find_arc(instance) else {
        return;
    };
    let bit = match name {
        "func_stack_trace" => tracer::opt::STACK,
        _ => return,
    };
    let st = state(&arc);
    if on {
        st.tracer
            .options
            .fetch_or(bit, std::sync::atomic::Ordering::Relaxed);
    } else {
        st.tracer
            .options
            .fetch_and(!bit, std::sync::atomic::Ordering::Relaxed);
    }
    tracer::republish_all(&arc);
}
