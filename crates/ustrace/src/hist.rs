//! Hist triggers (histogram.rst 2, events.rst 6.2): the command floor of `hist:` writes
//! to an event's `trigger` file and of its `hist` file.
//!
//! A write is parsed by `ustrace_filter::hist` against the event's fields (a
//! [`HistEnv`] over the event file and its instance), then, as the kernel's
//! `event_hist_trigger_parse`: a `!hist` removal drops the matching trigger; a `:pause`,
//! `:cont` or `:clear` of an existing trigger acts on it; otherwise the trigger is
//! registered — sharing the histogram of an existing trigger with the same `name=`
//! (which must have the same fields), refusing a duplicate (`EEXIST`) — and appended to
//! the event's trigger list, which puts the event in soft mode. Mistakes are logged to the
//! instance's `error_log` as `hist:SYSTEM:EVENT: error: ...` with the kernel's caret.
//!
//! What runs on each record is the hist stage ([`crate::stage::hist`]); this floor only
//! sets it up and reads it back (the `hist` file, [`show`]).
//!
//! # Where inter-event support plugs in
//!
//! - [`FileEnv`]'s `HistEnv::find_var` resolves `$var` (and `system.event.$var`) to a
//!   variable of another registered trigger; without it every reference is "Couldn't find
//!   variable", as on a kernel where no trigger defines it.
//! - [`crate::hist_inter::create`] turns the parsed `onmatch`/`onmax`/`onchange` handlers
//!   and the variable references into the histogram's
//!   [`Inter`](crate::stage::hist::inter::Inter) and extra variable slots, after the
//!   trigger is known not to exist yet (the kernel's `create_actions` runs there too).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ustrace_ctl::vfs::Errno;
use ustrace_filter::hist::{
    self as syntax, EventField, HistData, HistEnv, HistError, HistErrorKind,
};
use ustrace_filter::trigger::{Command, Kind, Trigger};

use crate::stage::hist::{Attached, Hist};
use crate::stage::trigger::{Registered, MAX_TRIGGERS};
use crate::trace::{EventFile, Instance};

/// Histograms shared by `name=`, across events and instances, as the kernel's named
/// triggers are.
fn named() -> &'static Mutex<HashMap<String, Weak<Hist>>> {
    static NAMED: std::sync::OnceLock<Mutex<HashMap<String, Weak<Hist>>>> =
        std::sync::OnceLock::new();
    NAMED.get_or_init(Default::default)
}

fn find_named(name: &str) -> Option<Arc<Hist>> {
    let mut map = named().lock().unwrap_or_else(|e| e.into_inner());
    map.retain(|_, w| w.strong_count() > 0);
    map.get(name).and_then(Weak::upgrade)
}

/// The event a hist trigger is written to, and its instance, as the parser sees them.
pub struct FileEnv<'a> {
    /// The instance (for `onmatch(system.event)` lookups).
    pub instance: &'a Instance,
    /// The event file.
    pub file: &'a EventFile,
}

impl HistEnv for FileEnv<'_> {
    fn event(&self) -> (&str, &str) {
        (self.file.event.system(), self.file.event.name())
    }

    fn field(&self, name: &str) -> Option<EventField> {
        self.file
            .event
            .all_fields()
            .into_iter()
            .find(|f| f.name == name)
            .map(|f| EventField {
                name: f.name.to_string(),
                c_type: f.c_type.to_string(),
                offset: f.offset,
                size: f.size,
                signed: f.signed,
            })
    }

    fn var_defined_on_event(&self, name: &str) -> bool {
        let list = self
            .file
            .trigger_list
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        list.iter().filter_map(|t| t.hist.as_ref()).any(|h| {
            h.hist
                .data
                .fields
                .iter()
                .any(|f| f.var_name.as_deref() == Some(name))
        })
    }

    fn event_exists(&self, system: &str, event: &str) -> bool {
        self.instance
            .files()
            .iter()
            .any(|f| f.event.system() == system && f.event.name() == event)
    }
}

fn log(instance: &Instance, file: &EventFile, command: &str, e: &HistError) {
    if let Some(kind) = e.kind {
        instance.log_error(
            &format!("hist:{}:{}", file.event.system(), file.event.name()),
            kind.message(),
            command,
            e.pos,
        );
    }
}

/// Whether `test` is the trigger `data` (with `filter`) names: the kernel's
/// `hist_trigger_match`. With a named histogram only triggers sharing it match;
/// without one, named triggers never do.
fn matches(
    data: &HistData,
    filter: Option<&str>,
    test: &Attached,
    named: Option<&Arc<Hist>>,
    ignore_filter: bool,
) -> bool {
    match named {
        Some(n) if !Arc::ptr_eq(n, &test.hist) => return false,
        None if test.hist.name.is_some() => return false,
        _ => {}
    }
    if !data.same_shape(&test.hist.data) {
        return false;
    }
    ignore_filter || filter == test.filter_text.as_deref()
}

/// Applies one `hist:` (or `!hist:`) write to `file`'s `trigger` file.
pub fn write(instance: &Instance, file: &Arc<EventFile>, command: &Command) -> Result<(), Errno> {
    let Kind::Hist { spec } = &command.kind else {
        return Err(Errno::EINVAL);
    };
    let cmd = format!("hist:{spec}");
    let env = crate::hist_inter::Env {
        file: FileEnv {
            instance,
            file: file.as_ref(),
        },
        command: &cmd,
    };
    let data = syntax::parse(spec, &env, command.remove).map_err(|e| {
        log(instance, file, &cmd, &e);
        Errno(e.errno)
    })?;
    let fail = |kind: HistErrorKind, pos: usize, errno: i32| {
        log(
            instance,
            file,
            &cmd,
            &HistError::with_errno(kind, pos, errno),
        );
        Err(Errno(errno))
    };
    let filter = match &data.filter {
        Some(text) => Some(crate::filter::compile_for(instance, &file.event, text)?),
        None => None,
    };
    let filter_text = data.filter.clone();
    let named_hist = data.attrs.name.as_deref().and_then(find_named);

    if command.remove {
        let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
        let Some(at) = list.iter().position(|t| {
            t.hist.as_ref().is_some_and(|h| {
                matches(&data, filter_text.as_deref(), h, named_hist.as_ref(), false)
            })
        }) else {
            // Removing what is not there succeeds, as on the kernel.
            return Ok(());
        };
        // A trigger whose variables another trigger reads stays (the kernel's EBUSY).
        let removed = list[at].hist.as_ref().map(|h| h.hist.clone());
        if removed
            .as_ref()
            .is_some_and(crate::hist_inter::is_referenced)
        {
            return Err(Errno::EBUSY);
        }
        list.remove(at);
        file.publish_triggers(&list);
        drop(list);
        file.soft_mode_put();
        if let Some(hist) = removed {
            crate::hist_inter::detach(&hist);
        }
        return Ok(());
    }

    // `:pause`, `:cont` and `:clear` act on an existing trigger when there is one.
    if data.attrs.pause || data.attrs.cont || data.attrs.clear {
        let named_ok = match (&data.attrs.name, &named_hist) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(n)) => data.same_shape(&n.data),
        };
        if named_ok {
            let list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
            let found = list
                .iter()
                .filter_map(|t| t.hist.as_ref())
                .find(|h| matches(&data, filter_text.as_deref(), h, named_hist.as_ref(), false));
            if let Some(h) = found {
                if data.attrs.pause {
                    h.paused.store(true, Ordering::Relaxed);
                } else if data.attrs.cont {
                    h.paused.store(false, Ordering::Relaxed);
                } else {
                    h.hist.clear();
                }
                return Ok(());
            }
        }
    }

    if let (Some(name), Some(n)) = (&data.attrs.name, &named_hist) {
        if !data.same_shape(&n.data) {
            return fail(
                HistErrorKind::NamedMismatch,
                data.errpos(&format!("name={name}")),
                syntax::EINVAL,
            );
        }
    }
    let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
    if data.attrs.name.is_none() || named_hist.is_some() {
        let exists = list
            .iter()
            .filter_map(|t| t.hist.as_ref())
            .any(|h| matches(&data, filter_text.as_deref(), h, named_hist.as_ref(), false));
        if exists {
            return fail(HistErrorKind::TriggerEexist, 0, syntax::EEXIST);
        }
    }
    if data.attrs.cont || data.attrs.clear {
        return fail(HistErrorKind::TriggerEnoentClear, 0, syntax::ENOENT);
    }
    if list.len() >= MAX_TRIGGERS {
        return Err(Errno::ENOSPC);
    }
    if data.enable_timestamps {
        // As the kernel, a trigger that uses timestamps sets the instance's clock to its
        // `clock=` (default `global`), which clears the buffer when it changes.
        let Some(clock) = ustrace_ringbuf::clock::Clock::from_name(&data.attrs.clock) else {
            return fail(
                HistErrorKind::SetClockFail,
                data.errpos(&data.attrs.clock),
                syntax::EINVAL,
            );
        };
        if clock != instance.buffer().clock() {
            instance.buffer().set_clock(clock);
            instance.reset_buffer();
        }
    }
    let paused = data.attrs.pause;
    let hist = match named_hist {
        Some(n) => n,
        None => {
            let name = data.attrs.name.clone();
            // Variable references and actions (inter-event) are resolved here.
            let hist = crate::hist_inter::create(instance, file, data).map_err(|e| {
                log(instance, file, &cmd, &e);
                Errno(e.errno)
            })?;
            if let Some(name) = name {
                named()
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name, Arc::downgrade(&hist));
            }
            hist
        }
    };
    crate::hist_inter::attach(&hist);
    let attached = Arc::new(Attached {
        hist,
        paused: AtomicBool::new(paused),
        filter_text,
    });
    // The kernel appends hist triggers (other triggers go first).
    list.push(Arc::new(Registered {
        trigger: Trigger::new(command.clone()),
        filter,
        target: None,
        hook: None,
        hist: Some(attached),
    }));
    file.publish_triggers(&list);
    drop(list);
    file.soft_mode_get()
}

/// What the event's `hist` file shows: one section per hist trigger, in list order.
pub fn show(file: &EventFile) -> String {
    let hists: Vec<Arc<Attached>> = {
        let list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
        list.iter().filter_map(|t| t.hist.clone()).collect()
    };
    hists
        .iter()
        .enumerate()
        .map(|(n, h)| crate::stage::hist::show::section(h, n))
        .collect()
}

/// Removes every `hist`, `enable_hist` and `disable_hist` trigger of `file` (a truncating
/// open of its `trigger` file, as the kernel's `unreg_all`).
pub fn unregister_all(file: &Arc<EventFile>) {
    let removed: Vec<Arc<Registered>> = {
        let mut list = file.trigger_list.lock().unwrap_or_else(|e| e.into_inner());
        // Nothing goes while another trigger reads a variable of one of them (the
        // kernel's `hist_file_check_refs`).
        if list
            .iter()
            .filter_map(|t| t.hist.as_ref())
            .any(|h| crate::hist_inter::is_referenced(&h.hist))
        {
            return;
        }
        let (gone, kept): (Vec<_>, Vec<_>) =
            std::mem::take(&mut *list).into_iter().partition(|t| {
                t.hook.is_none()
                    && matches!(
                        t.trigger.command().kind,
                        Kind::Hist { .. } | Kind::EnableHist { .. } | Kind::DisableHist { .. }
                    )
            });
        *list = kept;
        if !gone.is_empty() {
            file.publish_triggers(&list);
        }
        gone
    };
    for t in removed {
        if let Some(target) = &t.target {
            target.release_soft_mode();
        }
        file.soft_mode_put();
        if let Some(h) = &t.hist {
            crate::hist_inter::detach(&h.hist);
        }
    }
}
