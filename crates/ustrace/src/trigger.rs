//! Event triggers (events.rst 6): commands an event runs when it fires.
//!
//! A `trigger` file write is parsed by `ustrace_filter::trigger` and registered here on the
//! event's [`EventFile`]. Registering puts the event in *soft mode* — its probe is attached
//! even while it is not enabled — so its triggers run whether or not it records.
//!
//! On the hot path, triggers without a filter run before the record is built; when any has
//! a filter, all run on the built record (the kernel's `TRIGGER_COND`). Either way the
//! actions themselves (tracing on/off, snapshot, stack trace, enabling another event) are
//! collected first and run after the triggering record is committed or discarded, so no
//! action runs while a ring-buffer reservation is open.
//!
//! The registered set is published through an [`RcuCell`](crate::rcu::RcuCell): evaluating
//! takes no lock; each trigger's count is an atomic.

use std::sync::Arc;

use ustrace_ctl::vfs::Errno;
use ustrace_filter::trigger::{self as syntax, Command, Kind, Trigger};

use crate::event::registry::STACK_ID;
use crate::trace::{EventFile, Instance};

/// The trigger commands we support, in the kernel's order (its `# Available triggers:`).
pub const AVAILABLE: &[&str] = &[
    "traceon",
    "traceoff",
    "snapshot",
    "stacktrace",
    "enable_event",
    "disable_event",
];

/// Most triggers one event may carry (the evaluation keeps a 64-bit set of fired ones).
pub const MAX_TRIGGERS: usize = 64;

/// Most stack frames a `stacktrace` trigger records.
pub const MAX_STACK: usize = 32;

/// Code that runs on every record of an event (an eprobe on its source event).
pub type RecordHook = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// One registered trigger.
pub struct Registered {
    trigger: Trigger,
    filter: Option<crate::filter::Compiled>,
    /// The event an `enable_event`/`disable_event` acts on (held in soft mode).
    target: Option<Arc<EventFile>>,
    /// Set for internal record hooks, which the `trigger` file neither lists nor matches.
    hook: Option<RecordHook>,
}

/// Identifies a record hook for [`remove_hook`].
#[derive(Clone)]
pub struct HookId(Arc<Registered>);

/// Runs `hook` on every record of `file` that passes `filter`, whether or not the event is
/// enabled (it is held in soft mode), as the kernel attaches an eprobe to its source event.
pub fn add_hook(
    file: &Arc<EventFile>,
    filter: Option<crate::filter::Compiled>,
    hook: RecordHook,
) -> Result<HookId, Errno> {
    let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
    if list.len() >= MAX_TRIGGERS {
        return Err(Errno::ENOSPC);
    }
    let command = syntax::parse("traceon").map_err(|e| Errno(e.errno()))?;
    let entry = Arc::new(Registered {
        trigger: Trigger::new(command),
        filter,
        target: None,
        hook: Some(hook),
    });
    list.push(entry.clone());
    publish(file, &list);
    drop(list);
    file.soft_mode_get()?;
    Ok(HookId(entry))
}

/// Removes a hook added by [`add_hook`].
pub fn remove_hook(file: &Arc<EventFile>, id: &HookId) {
    let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
    let Some(at) = list.iter().position(|t| Arc::ptr_eq(t, &id.0)) else {
        return;
    };
    list.remove(at);
    publish(file, &list);
    drop(list);
    file.soft_mode_put();
}

impl Registered {
    /// The trigger as its `trigger` file lists it.
    pub fn listing(&self) -> String {
        self.trigger.listing()
    }
}

/// The `trigger` file's text.
pub fn listing(file: &EventFile) -> String {
    let list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
    let shown: Vec<String> = list
        .iter()
        .filter(|t| t.hook.is_none())
        .map(|t| format!("{}\n", t.listing()))
        .collect();
    if shown.is_empty() {
        return syntax::available_triggers_text(AVAILABLE);
    }
    shown.concat()
}

/// Applies one write to an event's `trigger` file.
pub fn write(instance: &Instance, file: &Arc<EventFile>, text: &str) -> Result<(), Errno> {
    // A write of nothing succeeds and does nothing, as on the kernel.
    if text.is_empty() {
        return Ok(());
    }
    let command = syntax::parse_with(text, AVAILABLE).map_err(|e| Errno(e.errno()))?;
    // The kernel looks an enable/disable target up before anything else, removals included.
    let target = match command.kind.target() {
        Some((system, event)) => Some(
            instance
                .files_of(Some(system))
                .into_iter()
                .find(|f| f.event.name() == event)
                .ok_or(Errno::EINVAL)?,
        ),
        None => None,
    };
    if command.remove {
        remove(file, &command);
        return Ok(());
    }
    let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
    if list
        .iter()
        .any(|t| t.hook.is_none() && t.trigger.command().conflicts(&command))
    {
        return Err(Errno::EEXIST);
    }
    if list.len() >= MAX_TRIGGERS {
        return Err(Errno::ENOSPC);
    }
    let filter = match &command.filter {
        Some(text) => Some(crate::filter::compile_for(instance, &file.event, text)?),
        None => None,
    };
    if matches!(command.kind, Kind::Snapshot) {
        crate::snapshot::allocate(&file.shared)?;
    }
    if let Some(target) = &target {
        target.soft_mode_get()?;
    }
    // The kernel lists the newest trigger first.
    list.insert(
        0,
        Arc::new(Registered {
            trigger: Trigger::new(command),
            filter,
            target,
            hook: None,
        }),
    );
    publish(file, &list);
    drop(list);
    // Soft mode keeps the triggering event's probe attached while it has triggers.
    file.soft_mode_get()
}

fn remove(file: &Arc<EventFile>, command: &Command) {
    let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
    let Some(at) = list
        .iter()
        .position(|t| t.trigger.command().conflicts(command))
    else {
        // Removing what is not there succeeds, as on the kernel.
        return;
    };
    let removed = list.remove(at);
    publish(file, &list);
    drop(list);
    if let Some(target) = &removed.target {
        target.soft_mode_put();
    }
    file.soft_mode_put();
}

/// Removes every trigger (the event or its instance is going away).
pub fn clear(file: &Arc<EventFile>) {
    let removed: Vec<_> = {
        let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
        let (hooks, removed): (Vec<_>, Vec<_>) = std::mem::take(&mut *list)
            .into_iter()
            .partition(|t| t.hook.is_some());
        // Hooks belong to the dynamic events that added them; they remove their own.
        *list = hooks;
        publish(file, &list);
        removed
    };
    for trigger in removed {
        if let Some(target) = &trigger.target {
            target.soft_mode_put();
        }
        file.soft_mode_put();
    }
}

fn publish(file: &EventFile, list: &[Arc<Registered>]) {
    let conditional = list.iter().any(|t| t.filter.is_some() || t.hook.is_some());
    file.set_trigger_flags(!list.is_empty(), conditional);
    file.triggers.replace(if list.is_empty() {
        None
    } else {
        Some(list.to_vec())
    });
}

/// Runs the triggers of `file`: on `record` when they need it (conditional triggers), or
/// with none. Actions run after the caller committed or discarded the record: this returns
/// the set of fired triggers for [`run_actions`].
pub(crate) fn evaluate(file: &EventFile, record: Option<&[u8]>) -> u64 {
    let guard = crate::rcu::read_lock();
    let Some(triggers) = file.triggers.get(&guard) else {
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
        if !wants_to_fire(file, t) {
            continue;
        }
        if t.trigger.fire() {
            fired |= 1 << i;
        }
    }
    fired
}

/// Count-limited triggers count only firings that change something, as the kernel's.
fn wants_to_fire(file: &EventFile, t: &Registered) -> bool {
    match &t.trigger.command().kind {
        Kind::TraceOn => !file.shared.tracing_on(),
        Kind::TraceOff => file.shared.tracing_on(),
        Kind::EnableEvent { .. } => t.target.as_ref().is_some_and(|f| f.is_soft_disabled()),
        Kind::DisableEvent { .. } => t.target.as_ref().is_some_and(|f| !f.is_soft_disabled()),
        _ => true,
    }
}

/// Runs the actions of the triggers `fired` selected.
#[inline]
pub(crate) fn run_actions(file: &EventFile, fired: u64) {
    // Nearly always nothing fired: no call for that.
    if fired != 0 {
        run_fired_actions(file, fired);
    }
}

#[inline(never)]
fn run_fired_actions(file: &EventFile, fired: u64) {
    let guard = crate::rcu::read_lock();
    let Some(triggers) = file.triggers.get(&guard) else {
        return;
    };
    for (i, t) in triggers.iter().enumerate().take(MAX_TRIGGERS) {
        if fired & (1 << i) == 0 {
            continue;
        }
        if t.hook.is_some() {
            continue;
        }
        match &t.trigger.command().kind {
            Kind::TraceOn => file.shared.set_tracing_on(true),
            Kind::TraceOff => file.shared.set_tracing_on(false),
            Kind::Snapshot => {
                let _ = crate::snapshot::swap(&file.shared);
            }
            Kind::StackTrace => record_stack(file),
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
            Kind::EnableHist { .. } | Kind::DisableHist { .. } | Kind::Hist { .. } => {}
        }
    }
}

/// Records the calling thread's stack as a `<stack trace>` entry.
fn record_stack(file: &EventFile) {
    let mut frames = [0usize; MAX_STACK];
    // Skip the frames of ustrace itself: this function, the trigger runner, the record path.
    let n = ustrace_inspect::stack::capture(3, &mut frames);
    let len = 16 + 8 * n;
    let pid = crate::thread::current_tid(&file.shared.record_cmd);
    let Some(mut slot) = file.shared.buffer.reserve(len) else {
        return;
    };
    let record: &mut [u8] = &mut slot;
    crate::event::field::write_common_header(record, STACK_ID.0, pid);
    record[8..12].copy_from_slice(&(n as i32).to_ne_bytes());
    record[12..16].fill(0);
    for (i, addr) in frames[..n].iter().enumerate() {
        record[16 + 8 * i..24 + 8 * i].copy_from_slice(&(*addr as u64).to_ne_bytes());
    }
    slot.commit();
}
