//! Event triggers (events.rst 6): commands an event runs when it fires.
//!
//! A `trigger` file write is parsed by `ustrace_filter::trigger` and registered here on the
//! event's [`EventFile`]. Registering puts the event in *soft mode* — its probe is attached
//! even while it is not enabled — so its triggers run whether or not it records.
//!
//! This is the command floor: it acts on an instance (an `enable_event` target is looked up
//! among the instance's events, a trigger's `if` filter logs its errors to the instance)
//! and on event files (soft mode), then publishes the list on the event file. What runs on
//! each record — which triggers fire, and their actions after the record is committed or
//! discarded — is the trigger stage, [`crate::stage::trigger`], which knows no instance.

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use ustrace_ctl::vfs::Errno;
use ustrace_filter::trigger::{self as syntax, Command, Kind, Trigger};

use crate::event_file::EventFile;
use crate::stage::trigger::SoftSwitch;
use crate::trace::Instance;

pub use crate::stage::trigger::{RecordHook, Registered, MAX_STACK, MAX_TRIGGERS};

/// The trigger commands we support, in the kernel's order (its `# Available triggers:`).
pub const AVAILABLE: &[&str] = &[
    "traceon",
    "traceoff",
    "snapshot",
    "stacktrace",
    "enable_event",
    "disable_event",
    "enable_hist",
    "disable_hist",
    "hist",
];

/// Identifies a record hook for [`remove_hook`].
#[derive(Clone)]
pub struct HookId(Arc<Registered>);

/// Runs `hook` on every record of `file` that passes `filter`, whether or not the event is
/// enabled (it is held in soft mode), as the kernel attaches an eprobe to its source event.
pub fn add_hook(
    file: &Arc<EventFile>,
    filter: Option<crate::stage::filter::Compiled>,
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
        hist: None,
    });
    list.push(entry.clone());
    file.publish_triggers(&list);
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
    file.publish_triggers(&list);
    drop(list);
    file.soft_mode_put();
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

/// Runs `change` as the only trigger change in the process, as the kernel's `event_mutex`
/// serialises them. A hist trigger with inter-event parts reads and writes the trigger lists
/// of other events while its own is locked (and may register hidden triggers through
/// [`write`], which nests here on the same thread), so two such writes in opposite
/// directions at once would each wait for the other's list; one at a time, they cannot.
pub(crate) fn serialized<R>(change: impl FnOnce() -> R) -> R {
    static CHANGES: Mutex<()> = Mutex::new(());
    thread_local! {
        static HOLDING: Cell<bool> = const { Cell::new(false) };
    }
    if HOLDING.with(Cell::get) {
        return change();
    }
    let _serial = CHANGES.lock().unwrap_or_else(|e| e.into_inner());
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            HOLDING.with(|h| h.set(false));
        }
    }
    HOLDING.with(|h| h.set(true));
    let _release = Release;
    change()
}

/// Applies one write to an event's `trigger` file.
pub fn write(instance: &Instance, file: &Arc<EventFile>, text: &str) -> Result<(), Errno> {
    serialized(|| write_serialized(instance, file, text))
}

fn write_serialized(instance: &Instance, file: &Arc<EventFile>, text: &str) -> Result<(), Errno> {
    // A write of nothing succeeds and does nothing, as on the kernel.
    if text.is_empty() {
        return Ok(());
    }
    let command = syntax::parse_with(text, AVAILABLE).map_err(|e| Errno(e.errno()))?;
    if matches!(command.kind, Kind::Hist { .. }) {
        return crate::hist::write(instance, file, &command);
    }
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
        file.shared.allocate_snapshot()?;
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
            target: target.map(|t| t as Arc<dyn SoftSwitch>),
            hook: None,
            hist: None,
        }),
    );
    file.publish_triggers(&list);
    drop(list);
    // Soft mode keeps the triggering event's probe attached while it has triggers.
    file.soft_mode_get()
}

fn remove(file: &Arc<EventFile>, command: &Command) {
    let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
    let Some(at) = list
        .iter()
        .position(|t| t.hist.is_none() && t.trigger.command().conflicts(command))
    else {
        // Removing what is not there succeeds, as on the kernel.
        return;
    };
    let removed = list.remove(at);
    file.publish_triggers(&list);
    drop(list);
    if let Some(target) = &removed.target {
        target.release_soft_mode();
    }
    file.soft_mode_put();
}

/// Removes every trigger (the event or its instance is going away).
pub fn clear(file: &Arc<EventFile>) {
    file.clear_triggers();
}
