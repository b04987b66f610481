//! The trigger stage (events.rst 6): on one record of one event, decide which of the
//! event's triggers fire, then run their actions.
//!
//! It sees the record, the event file's published trigger list, and the instance's
//! [`buffers`](crate::buffers) that `traceon`/`traceoff`, `snapshot` and `stacktrace` act
//! on; another event that `enable_event`/`disable_event` flips is seen only through its
//! soft-disable switch ([`SoftSwitch`]). Parsing a `trigger` write, finding the target event in the
//! instance and soft-mode accounting are the `trigger` files' business ([`crate::trigger`]).
//!
//! Triggers without a filter run before the record is built; when any has a filter, all run
//! on the built record (the kernel's `TRIGGER_COND`). Either way the actions are collected
//! first and run after the triggering record is committed or discarded, so no action runs
//! while a ring-buffer reservation is open. The list is published through an
//! [`RcuCell`]: evaluating takes no lock; each trigger's count is an atomic.

use std::sync::Arc;

use ustrace_filter::trigger::{Kind, Trigger};

use crate::buffers::Shared;
use crate::rcu::{read_lock, RcuCell};
use crate::stage::filter::Compiled;

/// Most triggers one event may carry (the evaluation keeps a 64-bit set of fired ones).
pub const MAX_TRIGGERS: usize = 64;

/// Most stack frames a `stacktrace` trigger records.
pub const MAX_STACK: usize = 32;

/// Code that runs on every record of an event (an eprobe on its source event).
pub type RecordHook = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// What an `enable_event`/`disable_event` trigger holds of its target event: the switch
/// it flips when it fires, and the soft-mode hold it gives back when it is removed.
pub trait SoftSwitch: Send + Sync {
    /// Whether the target is soft-disabled (attached, recording nothing).
    fn is_soft_disabled(&self) -> bool;
    /// Flips the target's soft-disable bit; atomics only (runs on the record path).
    fn set_soft_disabled(&self, disabled: bool);
    /// Pauses or continues every hist trigger of the target (`disable_hist`/`enable_hist`);
    /// atomics only.
    fn set_hist_paused(&self, _paused: bool) {}
    /// Gives back the soft-mode hold the trigger took when it was registered.
    fn release_soft_mode(&self);
}

/// The slot of an event file that holds its published triggers.
pub(crate) type Triggers = RcuCell<Vec<Arc<Registered>>>;

/// One registered trigger.
pub struct Registered {
    pub(crate) trigger: Trigger,
    pub(crate) filter: Option<Compiled>,
    /// The event an `enable_event`/`disable_event` acts on (held in soft mode).
    pub(crate) target: Option<Arc<dyn SoftSwitch>>,
    /// Set for internal record hooks, which the `trigger` file neither lists nor matches.
    pub(crate) hook: Option<RecordHook>,
    /// Set for a `hist` trigger: the histogram it feeds.
    pub(crate) hist: Option<Arc<crate::stage::hist::Attached>>,
}

impl Registered {
    /// The trigger as its `trigger` file lists it.
    pub fn listing(&self) -> String {
        match &self.hist {
            Some(hist) => hist.info(),
            None => self.trigger.listing(),
        }
    }
}

/// Runs the triggers of one event (`triggers`, acting on `shared`): on `record` when they
/// need it (conditional triggers), or with none. Actions run after the caller committed or
/// discarded the record: this returns the set of fired triggers for [`run_actions`].
pub(crate) fn evaluate(triggers: &Triggers, shared: &Shared, record: Option<&[u8]>) -> u64 {
    let guard = read_lock();
    let Some(triggers) = triggers.get(&guard) else {
        return 0;
    };
    let mut fired = 0u64;
    for (i, t) in triggers.iter().enumerate().take(MAX_TRIGGERS) {
        if let Some(filter) = &t.filter {
            let Some(record) = record else { continue };
            if !filter.matches(record) {
                continue;
            }
        }
        if let Some(hook) = &t.hook {
            if let Some(record) = record {
                hook(record);
            }
            continue;
        }
        if let Some(hist) = &t.hist {
            if let Some(record) = record {
                hist.hit(record, shared.buffer.clock());
            }
            continue;
        }
        if !wants_to_fire(shared, t) {
            continue;
        }
        if t.trigger.fire() {
            fired |= 1 << i;
        }
    }
    fired
}

/// Count-limited triggers count only firings that change something, as the kernel's.
fn wants_to_fire(shared: &Shared, t: &Registered) -> bool {
    match &t.trigger.command().kind {
        Kind::TraceOn => !shared.tracing_on(),
        Kind::TraceOff => shared.tracing_on(),
        Kind::EnableEvent { .. } => t.target.as_ref().is_some_and(|f| f.is_soft_disabled()),
        Kind::DisableEvent { .. } => t.target.as_ref().is_some_and(|f| !f.is_soft_disabled()),
        _ => true,
    }
}

/// Runs the actions of the triggers `fired` selected.
#[inline]
pub(crate) fn run_actions(triggers: &Triggers, shared: &Shared, fired: u64) {
    // Nearly always nothing fired: no call for that.
    if fired != 0 {
        run_fired_actions(triggers, shared, fired);
    }
    // A hist action's snapshot goes after its record (one thread-local read).
    crate::stage::hist::inter::run_deferred();
}

#[inline(never)]
fn run_fired_actions(triggers: &Triggers, shared: &Shared, fired: u64) {
    let guard = read_lock();
    let Some(triggers) = triggers.get(&guard) else {
        return;
    };
    for (i, t) in triggers.iter().enumerate().take(MAX_TRIGGERS) {
        if fired & (1 << i) == 0 {
            continue;
        }
        if t.hook.is_some() || t.hist.is_some() {
            continue;
        }
        match &t.trigger.command().kind {
            Kind::TraceOn => shared.set_tracing_on(true),
            Kind::TraceOff => shared.set_tracing_on(false),
            Kind::Snapshot => {
                let _ = shared.take_snapshot();
            }
            Kind::StackTrace => record_stack(shared),
            Kind::EnableEvent { .. } => {
                if let Some(target) = &t.target {
                    target.set_soft_disabled(false);
                }
            }
            Kind::DisableEvent { .. } => {
                if let Some(target) = &t.target {
                    target.set_soft_disabled(true);
                }
            }
            Kind::EnableHist { .. } | Kind::DisableHist { .. } => {
                if let Some(target) = &t.target {
                    target.set_hist_paused(matches!(
                        t.trigger.command().kind,
                        Kind::DisableHist { .. }
                    ));
                }
            }
            Kind::Hist { .. } => {}
        }
    }
}

/// Records the calling thread's stack as a `<stack trace>` entry.
fn record_stack(shared: &Shared) {
    let mut frames = [0usize; MAX_STACK];
    // Skip the frames of ustrace itself: this function, the trigger runner, the record path.
    let n = ustrace_inspect::stack::capture(3, &mut frames);
    let pid = crate::thread::current_tid(&shared.record_cmd);
    shared.write_kernel_stack(pid, &frames[..n]);
}
