//! Inter-event hist commands (histogram.rst 2.2): what a hist trigger write needs to know
//! about the other hist triggers of its instance, one floor above the stages.
//!
//! - A registry of the instance's hist triggers and their variables, so a `$var` written
//!   on one event finds the trigger of another event that defines it (the kernel's
//!   `find_event_var`: `onmatch` events first, then any event if the name is unique, or
//!   the event a qualified `system.event.$var` names), and so a trigger whose variables are
//!   referenced cannot be removed (`EBUSY`). What a histogram holds (its references, the
//!   synthetic events its actions generate, its hidden triggers) is given back when the
//!   last trigger feeding it goes, whether by `!hist`, a truncating open of `trigger`, or
//!   with its event or instance ([`attach`]/[`detach`]).
//! - Creating a trigger's actions (the kernel's `create_actions`): finding the synthetic
//!   event of `onmatch().trace()` and checking the parameters against its fields; making
//!   field variables, on the target event by reading the record and on the matching event
//!   by adding a hidden `synthetic_FIELD=FIELD` trigger there; the tracked variable of
//!   `onmax()`/`onchange()`; the fields `save()` keeps.
//!
//! The result is the stage's [`Inter`], which the record
//! path runs without looking anything up.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ustrace_filter::hist::{
    flags, Action as ActionSpec, ActionKind, Handler, HistData, HistError, HistErrorKind as K,
    HistField, VarTarget, EEXIST, EINVAL, VARS_MAX,
};
use ustrace_filter::FieldClass;

use crate::event::{FieldDesc, FieldKind};
use crate::stage::hist::inter::{
    Action, FieldRead, Inter, Param, RefSlot, SaveVar, SnapshotState, StrFrom, StrVar, TraceAction,
    TrackThen, SAVE_STR_MAX,
};
use crate::stage::hist::{Hist, STACKTRACE_DEPTH};
use crate::trace::{EventFile, Instance};

/// One registered hist trigger, as the other triggers of its instance see it.
pub struct Registered {
    /// The identity [`VarTarget::hist`] carries.
    pub id: u64,
    instance: usize,
    system: String,
    event: String,
    hist: Weak<Hist>,
    /// How many other triggers reference a variable of this one.
    referenced: AtomicUsize,
    /// How many event triggers feed the histogram (more than one when `name=` shares it):
    /// what it holds is given back when the last goes, however it goes.
    attached: AtomicUsize,
    /// Its string and stack variables: (variable index, first slot, slots) of their bytes
    /// or frames.
    strings: Vec<(usize, usize, usize)>,
}

impl Registered {
    fn live(&self) -> Option<Arc<Hist>> {
        self.hist.upgrade()
    }
}

static REGISTRY: Mutex<Vec<Arc<Registered>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn registry() -> std::sync::MutexGuard<'static, Vec<Arc<Registered>>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

fn instance_key(instance: &Instance) -> usize {
    instance as *const Instance as usize
}

/// A fresh identity for a trigger about to be registered.
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Makes a live hist trigger visible to the other triggers of `instance` (the kernel's
/// `save_hist_vars` and trigger list together). `id` is the one its own references were
/// made with ([`next_id`]).
pub fn register(
    id: u64,
    instance: &Instance,
    file: &EventFile,
    hist: &Arc<Hist>,
    strings: Vec<(usize, usize, usize)>,
) {
    let mut reg = registry();
    // Entries of histograms that are gone (their instance or event went away).
    reg.retain(|r| r.hist.strong_count() > 0);
    reg.push(Arc::new(Registered {
        id,
        instance: instance_key(instance),
        system: file.event.system().to_string(),
        event: file.event.name().to_string(),
        hist: Arc::downgrade(hist),
        referenced: AtomicUsize::new(0),
        attached: AtomicUsize::new(0),
        strings,
    }));
    // Hidden triggers of histograms that went away with their instance or event are gone
    // with them: drop what kept their event files.
    let live: Vec<u64> = reg.iter().map(|r| r.id).collect();
    drop(reg);
    HIDDEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(id, _)| live.contains(id));
}

fn id_of(hist: &Arc<Hist>) -> Option<u64> {
    registry()
        .iter()
        .find(|r| std::ptr::eq(r.hist.as_ptr(), Arc::as_ptr(hist)))
        .map(|r| r.id)
}

/// Whether another trigger references a variable of `hist` (its removal is `EBUSY`, the
/// kernel's `hist_trigger_check_refs`).
pub fn is_referenced(hist: &Arc<Hist>) -> bool {
    registry().iter().any(|r| {
        std::ptr::eq(r.hist.as_ptr(), Arc::as_ptr(hist)) && r.referenced.load(Ordering::Relaxed) > 0
    })
}

fn entries_of(instance: usize, system: &str, event: &str) -> Vec<(Arc<Registered>, Arc<Hist>)> {
    registry()
        .iter()
        .filter(|r| r.instance == instance && r.system == system && r.event == event)
        .filter_map(|r| Some((r.clone(), r.live()?)))
        .collect()
}

fn var_field<'d>(data: &'d HistData, name: &str) -> Option<&'d HistField> {
    data.fields
        .iter()
        .find(|f| f.has(flags::VAR) && f.var_name.as_deref() == Some(name))
}

fn target(id: u64, f: &HistField) -> VarTarget {
    VarTarget {
        hist: id,
        idx: f.var_idx,
        size: f.size,
        signed: f.signed,
        c_type: f.c_type.clone(),
        ts_flags: f.flags & (flags::TIMESTAMP | flags::TIMESTAMP_USECS),
        is_string: f.has(flags::STRING),
        var_flags: f.flags,
        constant: f.has(flags::CONST).then_some(f.constant),
    }
}

/// The first trigger of `system:event` that defines `name` (the kernel's `find_file_var`).
fn find_file_var(instance: usize, system: &str, event: &str, name: &str) -> Option<VarTarget> {
    entries_of(instance, system, event)
        .iter()
        .find_map(|(e, h)| var_field(&h.data, name).map(|f| target(e.id, f)))
}

/// Whether a trigger of `system:event` in `instance` already defines variable `name`.
pub fn var_defined_on_event(instance: &Instance, system: &str, event: &str, name: &str) -> bool {
    find_file_var(instance_key(instance), system, event, name).is_some()
}

/// Resolves `[system.event.]$name` for a trigger being written (the kernel's
/// `find_event_var`): with no event named, the `onmatch` events first, then the one event
/// of the instance defining `name` (two are "not unique"); else the named event.
/// `command` places the caret of a "not unique" error.
pub fn find_var(
    instance: &Instance,
    system: Option<&str>,
    event: Option<&str>,
    name: &str,
    onmatch: &[(&str, &str)],
    command: &str,
) -> Result<Option<VarTarget>, HistError> {
    let key = instance_key(instance);
    let not_unique = || HistError::new(K::VarNotUnique, command.find(name).unwrap_or(0));
    let (system, event) = match (system, event) {
        (Some(s), Some(e)) => (s, e),
        _ => {
            let mut found = None;
            for (s, e) in onmatch {
                if let Some(t) = find_file_var(key, s, e, name) {
                    if found.is_some() {
                        return Err(not_unique());
                    }
                    found = Some(t);
                }
            }
            if found.is_some() {
                return Ok(found);
            }
            let mut events: Vec<(String, String)> = Vec::new();
            let live: Vec<(Arc<Registered>, Arc<Hist>)> = registry()
                .iter()
                .filter(|r| r.instance == key)
                .filter_map(|r| Some((r.clone(), r.live()?)))
                .collect();
            for (r, h) in &live {
                if var_field(&h.data, name).is_some()
                    && !events.iter().any(|(s, e)| *s == r.system && *e == r.event)
                {
                    events.push((r.system.clone(), r.event.clone()));
                }
            }
            match events.as_slice() {
                [] => return Ok(None),
                [(s, e)] => return Ok(find_file_var(key, s, e, name)),
                _ => return Err(not_unique()),
            }
        }
    };
    Ok(find_file_var(key, system, event, name))
}

/// What the hist stage needs from a trigger's actions, made before its map: how many
/// variable slots to add, and what to build the stage state from once the map exists.
pub struct Prepared {
    actions: Vec<PAction>,
    save_vars: Vec<SaveVar>,
    /// Variable slots the actions keep per entry, after the trigger's own.
    pub extra_vars: usize,
    /// Hidden triggers made on other events for field variables, removed with this one.
    pub hidden: Vec<Hidden>,
}

/// A trigger made on another event to hold a field variable (`synthetic_prio=prio`).
pub struct Hidden {
    file: Arc<EventFile>,
    /// The trigger's text after `hist:`.
    pub cmd: String,
}

enum PAction {
    Trace(PTrace),
    Track {
        max: bool,
        var_ref: usize,
        track_var: usize,
        var_str: String,
        then: PThen,
    },
}

struct PTrace {
    synth: Arc<crate::synth::Synthetic>,
    params: Vec<Param>,
}

enum PThen {
    Save,
    Snapshot,
    Trace(PTrace),
}

/// What the record being written to is: its instance, event file and fields.
pub struct Target<'a> {
    /// The instance.
    pub instance: &'a Instance,
    /// The event file the trigger is written to.
    pub file: &'a Arc<EventFile>,
    /// The trigger's identity (from [`next_id`]).
    pub id: u64,
    /// Its string variables: (variable index, first slot, slots) of their bytes.
    pub strings: &'a [(usize, usize, usize)],
    /// The first variable slot the actions may take.
    pub first_extra: usize,
}

impl Target<'_> {
    fn system(&self) -> &str {
        self.file.event.system()
    }
    fn event(&self) -> &str {
        self.file.event.name()
    }
    fn is(&self, system: Option<&str>, event: Option<&str>) -> bool {
        match (system, event) {
            (Some(s), Some(e)) => s == self.system() && e == self.event(),
            (None, None) => true,
            _ => false,
        }
    }
}

/// How the record path reads a field of the event.
pub fn field_read(f: &FieldDesc) -> Option<FieldRead> {
    let class = match f.kind {
        FieldKind::Int if matches!(f.size, 1 | 2 | 4 | 8) => FieldClass::Other,
        FieldKind::CharArray => FieldClass::StaticString,
        FieldKind::DynString => FieldClass::DynString,
        _ => return None,
    };
    Some(FieldRead {
        offset: f.offset,
        size: f.size,
        signed: f.signed,
        class,
    })
}

/// A field of the target event usable as a field variable: how to read it and its type
/// (C type, size, signedness, string).
fn target_field(t: &Target<'_>, name: &str) -> Option<(FieldRead, String, usize, bool)> {
    let f = t
        .file
        .event
        .all_fields()
        .into_iter()
        .find(|f| f.name == name)?;
    let read = field_read(&f)?;
    Some((read, f.c_type.to_string(), f.size, f.signed))
}

/// The reference index of `target` in `data`, adding a reference when there is none.
fn var_ref(
    data: &mut HistData,
    target: VarTarget,
    name: &str,
    system: Option<&str>,
    event: Option<&str>,
) -> usize {
    if let Some(i) = data.var_refs.iter().position(|r| {
        r.var_ref
            .as_ref()
            .is_some_and(|t| t.hist == target.hist && t.idx == target.idx)
    }) {
        return i;
    }
    let mut r = data
        .fields
        .first()
        .cloned()
        .expect("hitcount is always the first field");
    r.flags = flags::VAR_REF | (target.ts_flags & (flags::TIMESTAMP | flags::TIMESTAMP_USECS));
    r.field = None;
    r.operands.clear();
    r.size = target.size;
    r.signed = target.signed;
    r.c_type = target.c_type.clone();
    r.system = system.map(str::to_string);
    r.event = event.map(str::to_string);
    r.name = Some(name.to_string());
    r.var_name = None;
    r.read_once = false;
    r.var_ref_idx = data.var_refs.len();
    r.var_ref = Some(target);
    data.var_refs.push(r);
    data.var_refs.len() - 1
}

/// Whether a hist value of C type `c_type` is a stack trace (`unsigned long[]`, the
/// kernel's `strstr(type, "long[")`).
fn is_stack_type(c_type: &str) -> bool {
    c_type.contains("long[")
}

/// The kernel's `check_synth_field`: a `char[...]` goes into a dynamic string field, a
/// stack trace into a stack field; otherwise the types match, or the sizes do (and, for
/// numbers, the signedness).
fn synth_field_accepts(
    field: &crate::synth::SynthField,
    c_type: &str,
    size: usize,
    signed: bool,
) -> bool {
    // A stack field takes a stack trace and nothing else. (The kernel would also let a
    // signed 8-byte integer through, as its size and signedness match the field's, and read
    // that number as the address of frames.) A stack trace fits no other field.
    if field.is_stack() || is_stack_type(c_type) {
        return field.is_stack() && is_stack_type(c_type);
    }
    if c_type.contains("char[") && field.is_string() && field.c_type().starts_with("__data_loc") {
        return true;
    }
    let field_type = field
        .c_type()
        .strip_prefix("__data_loc ")
        .unwrap_or(field.c_type());
    if field_type == c_type {
        return true;
    }
    field.size() == size && (field.is_string() || field.signed() == signed)
}

/// Creates the actions of `data` for the trigger `t` (the kernel's `create_actions`), adding
/// the references they need to `data.var_refs`. Hidden triggers it makes on other events are
/// removed again if it fails.
pub fn prepare(t: &Target<'_>, data: &mut HistData) -> Result<Prepared, HistError> {
    let mut p = Prepared {
        actions: Vec::new(),
        save_vars: Vec::new(),
        extra_vars: 0,
        hidden: Vec::new(),
    };
    match create_actions(t, data, &mut p) {
        Ok(()) => Ok(p),
        Err(e) => {
            p.abandon();
            Err(e)
        }
    }
}

fn create_actions(t: &Target<'_>, data: &mut HistData, p: &mut Prepared) -> Result<(), HistError> {
    let specs = data.actions.clone();
    let first_extra = t.first_extra;
    for spec in &specs {
        let made = match &spec.handler {
            Handler::OnMatch { system, event } => {
                let trace = trace_action(t, data, spec, Some((system, event)), p)?;
                PAction::Trace(trace)
            }
            Handler::OnMax { var } | Handler::OnChange { var } => {
                let max = matches!(spec.handler, Handler::OnMax { .. });
                let Some(name) = var.strip_prefix('$') else {
                    return Err(HistError::new(K::OnxNotVar, data.errpos(var)));
                };
                let Some(f) = var_field(data, name) else {
                    return Err(HistError::new(K::OnxVarNotFound, data.errpos(name)));
                };
                let own = VarTarget {
                    hist: t.id,
                    idx: f.var_idx,
                    size: f.size,
                    signed: f.signed,
                    c_type: f.c_type.clone(),
                    ts_flags: f.flags & (flags::TIMESTAMP | flags::TIMESTAMP_USECS),
                    is_string: f.has(flags::STRING),
                    var_flags: f.flags,
                    constant: None,
                };
                let var_ref = var_ref(data, own, name, None, None);
                let track_var = first_extra + p.extra_vars;
                p.extra_vars += 1;
                let then = match spec.kind {
                    ActionKind::Save => {
                        if !p.save_vars.is_empty() {
                            return Err(HistError::with_errno(K::TooManySaveActions, 0, EEXIST));
                        }
                        for param in &spec.params {
                            let Some((read, _, size, _)) = target_field(t, param) else {
                                return Err(HistError::new(
                                    K::FieldVarCreateFail,
                                    data.errpos(param),
                                ));
                            };
                            let words = if read.is_string() {
                                size.clamp(8, SAVE_STR_MAX).div_ceil(8)
                            } else {
                                1
                            };
                            p.save_vars.push(SaveVar {
                                name: param.clone(),
                                read,
                                var: first_extra + p.extra_vars,
                                words,
                            });
                            p.extra_vars += words;
                        }
                        PThen::Save
                    }
                    ActionKind::Snapshot => {
                        if let Err(e) = t.file.shared.allocate_snapshot() {
                            return Err(HistError::silent(e.0));
                        }
                        PThen::Snapshot
                    }
                    ActionKind::Trace => PThen::Trace(trace_action(t, data, spec, None, p)?),
                };
                PAction::Track {
                    max,
                    var_ref,
                    track_var,
                    var_str: var.clone(),
                    then,
                }
            }
        };
        p.actions.push(made);
    }
    Ok(())
}

/// The kernel's `trace_action_create`.
fn trace_action(
    t: &Target<'_>,
    data: &mut HistData,
    spec: &ActionSpec,
    matching: Option<(&String, &String)>,
    p: &mut Prepared,
) -> Result<PTrace, HistError> {
    let name = spec.synth_name().unwrap_or("").to_string();
    let Some(synth) = crate::synth::find(&name) else {
        return Err(HistError::new(K::SynthEventNotFound, data.errpos(&name)));
    };
    let n_fields = synth.fields().len();
    let mut params = Vec::new();
    for (pos, param) in spec.params.iter().enumerate() {
        let (mut system, mut event, var) = match param.split_once('.') {
            None => (None, None, param.as_str()),
            Some((s, rest)) => match rest.split_once('.') {
                Some((e, v)) => (Some(s), Some(e), v),
                None => return Err(HistError::silent(EINVAL)),
            },
        };
        // (type, size, signed, string variable) of the value, and the parameter.
        let (c_type, size, signed, string_var, made) = if let Some(vname) = var.strip_prefix('$') {
            let own = if t.is(system, event) {
                var_field(data, vname).map(|f| target(t.id, f))
            } else {
                None
            };
            let found = match own {
                Some(own) => Some(own),
                None => {
                    if system.is_none() {
                        if let Some((s, e)) = matching {
                            system = Some(s);
                            event = Some(e);
                        }
                    }
                    find_var(t.instance, system, event, vname, &[], &data.command).unwrap_or(None)
                }
            };
            let Some(found) = found else {
                return Err(HistError::new(K::ParamNotFound, data.errpos(vname)));
            };
            let (c, s, sg) = (found.c_type.clone(), found.size, found.signed);
            // A string or a stack is passed from the entry that keeps its bytes or frames,
            // also through an alias (`x=$str`), which carries the type of the variable it
            // names but keeps nothing itself.
            let kept = found.is_string || is_stack_type(&c) || is_string_type(&c);
            let string = kept.then(|| kept_param(t, data, &found));
            let r = var_ref(data, found, vname, system, event);
            match string {
                None => (c, s, sg, false, Param::Ref(r)),
                Some(Some(p)) => (c, s, sg, false, p),
                Some(None) => (c, s, sg, true, Param::Ref(r)),
            }
        } else if t.is(system, event) && target_field(t, var).is_some() {
            let (read, c, s, sg) = target_field(t, var).expect("checked");
            (c, s, sg, false, Param::Field(read))
        } else if t.is(system, event) && var == "common_comm" {
            // The kernel makes a field variable of `common_comm` on the target event as of
            // any of its fields (`create_target_field_var` parses it as a hist field): the
            // name of the thread that hit this event, typed as the hist field is.
            let size = ustrace_filter::hist::STR_MAX;
            ("char[]".to_string(), size, false, false, Param::Comm)
        } else if t.is(system, event) && var == "common_timestamp" {
            // Likewise the time of this event, typed and scaled as the trigger's own
            // `common_timestamp` (`.usecs` anywhere in the trigger makes it microseconds).
            let usecs = data.attrs.ts_in_usecs;
            (
                "u64".to_string(),
                8,
                false,
                false,
                Param::Timestamp { usecs },
            )
        } else if t.is(system, event) && matches!(var, "common_cpu" | "cpu" | "CPU") {
            // And the CPU this event ran on (`cpu` when the event has no field of that name,
            // which `target_field` would have found above).
            ("unsigned int".to_string(), 4, false, false, Param::Cpu)
        } else {
            if system.is_none() {
                if let Some((s, e)) = matching {
                    system = Some(s);
                    event = Some(e);
                }
            }
            let (Some(s), Some(e)) = (system, event) else {
                return Err(HistError::silent(EINVAL));
            };
            let found = field_var_hist(t, data, s, e, var, p)?;
            let (c, sz, sg) = (found.c_type.clone(), found.size, found.signed);
            let string = found.is_string.then(|| string_param(t, &found));
            let vname = format!("synthetic_{var}");
            let r = var_ref(data, found, &vname, Some(s), Some(e));
            match string {
                None => (c, sz, sg, false, Param::Ref(r)),
                Some(Some(p)) => (c, sz, sg, false, p),
                Some(None) => (c, sz, sg, true, Param::Ref(r)),
            }
        };
        let ok = synth
            .fields()
            .get(pos)
            .is_some_and(|f| synth_field_accepts(f, &c_type, size, signed));
        if !ok {
            return Err(HistError::new(K::SynthTypeMismatch, data.errpos(var)));
        }
        if string_var {
            // A string or a stack that no entry keeps (no variable at the end of the alias
            // chain saves it): refused rather than passed on garbled.
            return Err(HistError::new(K::FieldVarCreateFail, data.errpos(var)));
        }
        params.push(made);
    }
    if params.len() != n_fields {
        return Err(HistError::new(
            K::SynthCountMismatch,
            data.errpos(synth.name()),
        ));
    }
    Ok(PTrace { synth, params })
}

/// Where the bytes of the string variable `target` are kept: this trigger's entry or the
/// defining trigger's (`None` when no entry keeps them).
fn string_param(t: &Target<'_>, target: &VarTarget) -> Option<Param> {
    let slot = |strings: &[(usize, usize, usize)]| {
        strings
            .iter()
            .find(|(var, _, _)| *var == target.idx)
            .map(|&(_, first, words)| (first, words))
    };
    if target.hist == t.id {
        let (first, words) = slot(t.strings)?;
        return Some(Param::RefStr {
            hist: None,
            first,
            words,
        });
    }
    let reg = registry();
    let entry = reg.iter().find(|r| r.id == target.hist)?;
    let (first, words) = slot(&entry.strings)?;
    Some(Param::RefStr {
        hist: Some(entry.live()?),
        first,
        words,
    })
}

/// Whether a hist value of C type `c_type` is a string the hist code copies (`char[...]`,
/// what `check_synth_field` looks for).
fn is_string_type(c_type: &str) -> bool {
    c_type.contains("char[")
}

/// Where the bytes of the string variable or the frames of the stack variable `target`
/// are kept: in the entries of the trigger whose variable saved them, found through
/// aliases (`s=$st` passes on the frames `st=common_stacktrace` saved, `x=$str` the bytes
/// of a string variable, as the kernel's alias passes on the address of that storage).
/// `None` when no entry keeps them.
fn kept_param(t: &Target<'_>, data: &HistData, target: &VarTarget) -> Option<Param> {
    let mut target = target.clone();
    // An alias of an alias is still an alias: a few steps at most, never a cycle.
    for _ in 0..VARS_MAX {
        let field = if target.hist == t.id {
            data.fields
                .iter()
                .find(|f| f.has(flags::VAR) && f.var_idx == target.idx)
                .cloned()
        } else {
            let live = registry()
                .iter()
                .find(|r| r.id == target.hist)
                .and_then(|r| r.live());
            live.and_then(|h| {
                h.data
                    .fields
                    .iter()
                    .find(|f| f.has(flags::VAR) && f.var_idx == target.idx)
                    .cloned()
            })
        }?;
        match field.var_ref {
            Some(inner) if field.has(flags::ALIAS) => target = inner,
            _ if field.has(flags::STACKTRACE) => {
                return match string_param(t, &target)? {
                    Param::RefStr { hist, first, words } if words == STACKTRACE_DEPTH => {
                        Some(Param::RefStack { hist, first })
                    }
                    _ => None,
                };
            }
            _ if field.has(flags::STRING) => return string_param(t, &target),
            _ => return None,
        }
    }
    None
}

/// The kernel's `create_field_var_hist`: a trigger on `system:event` with the keys of a
/// compatible trigger there and a variable `synthetic_FIELD=FIELD`, whose variable the
/// action then references.
fn field_var_hist(
    t: &Target<'_>,
    data: &HistData,
    system: &str,
    event: &str,
    field: &str,
    p: &mut Prepared,
) -> Result<VarTarget, HistError> {
    let pos = data.errpos(field);
    if (system, event) == (t.system(), t.event()) {
        // Not a field of the target event itself (that would be a field variable here).
        return Err(HistError::new(K::FieldVarParseFail, pos));
    }
    let Some(file) = t
        .instance
        .files_of(Some(system))
        .into_iter()
        .find(|f| f.event.name() == event)
    else {
        return Err(HistError::new(K::EventFileNotFound, pos));
    };
    let key = instance_key(t.instance);
    let keys: Vec<(String, usize, bool)> = data
        .keys()
        .iter()
        .map(|k| (k.c_type.clone(), k.size, k.signed))
        .collect();
    let compatible = entries_of(key, system, event).into_iter().find(|(_, h)| {
        h.data.keys().len() == keys.len()
            && h.data
                .keys()
                .iter()
                .zip(&keys)
                .all(|(k, (c, s, sg))| k.c_type == *c && k.size == *s && k.signed == *sg)
    });
    let Some((_, compatible)) = compatible else {
        return Err(HistError::new(K::HistNotFound, pos));
    };
    let var = format!("synthetic_{field}");
    if let Some(found) = find_file_var(key, system, event, &var) {
        return Ok(found);
    }
    let names: Vec<&str> = compatible
        .data
        .keys()
        .iter()
        .map(|k| k.field.as_ref().map_or("", |f| f.name.as_str()))
        .collect();
    let mut cmd = format!("keys={}:{var}={field}", names.join(","));
    if let Some(filter) = &compatible.data.filter {
        cmd.push_str(" if ");
        cmd.push_str(filter);
    }
    if crate::trigger::write(t.instance, &file, &format!("hist:{cmd}")).is_err() {
        return Err(HistError::new(K::HistCreateFail, pos));
    }
    p.hidden.push(Hidden { file, cmd });
    find_file_var(key, system, event, &var).ok_or(HistError::new(K::SynthVarNotFound, pos))
}

impl Prepared {
    /// Removes what preparing made on other events (the trigger was not added).
    pub fn abandon(self) {
        remove_hidden(self.hidden);
    }

    /// Builds the stage state once the trigger's map exists and the trigger is registered
    /// (references to its own variables read its entries). Counts a reference on every
    /// other trigger this one reads variables of; [`release`] gives them back.
    pub fn build(self, t: &Target<'_>, data: &HistData) -> Inter {
        let id = t.id;
        let reg = registry();
        let mut refs = Vec::with_capacity(data.var_refs.len());
        let mut counted: Vec<u64> = Vec::new();
        for (i, r) in data.var_refs.iter().enumerate() {
            let Some(t) = &r.var_ref else { continue };
            let read_once = reads_once(data, i);
            if t.hist == id {
                refs.push(RefSlot::new(None, t.idx, read_once, t.is_string));
                continue;
            }
            let entry = reg.iter().find(|e| e.id == t.hist);
            if let Some(entry) = entry {
                if !counted.contains(&entry.id) {
                    entry.referenced.fetch_add(1, Ordering::Relaxed);
                    counted.push(entry.id);
                }
            }
            refs.push(RefSlot::new(
                entry.and_then(|e| e.live()),
                t.idx,
                read_once,
                t.is_string,
            ));
        }
        drop(reg);
        let trace = |pt: PTrace| {
            let hold = pt.synth.hold();
            TraceAction::new(pt.synth, hold, pt.params)
        };
        let actions: Vec<Action> = self
            .actions
            .into_iter()
            .map(|a| match a {
                PAction::Trace(pt) => Action::OnMatch(trace(pt)),
                PAction::Track {
                    max,
                    var_ref,
                    track_var,
                    var_str,
                    then,
                } => Action::Track {
                    max,
                    var_ref,
                    track_var,
                    then: match then {
                        PThen::Save => TrackThen::Save,
                        PThen::Snapshot => {
                            TrackThen::Snapshot(Arc::new(SnapshotState::new(max, &var_str)))
                        }
                        PThen::Trace(pt) => TrackThen::Trace(trace(pt)),
                    },
                },
            })
            .collect();
        let snapshots = actions.iter().any(|a| {
            matches!(
                a,
                Action::Track {
                    then: TrackThen::Snapshot(_),
                    ..
                }
            )
        });
        let inter = Inter {
            refs,
            actions,
            save_vars: self.save_vars,
            extra_vars: self.extra_vars,
            string_vars: Vec::new(),
            stack_vars: Vec::new(),
            stack_skip: Default::default(),
            shared: snapshots.then(|| t.file.shared.clone()),
        };
        HIDDEN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, self.hidden));
        inter
    }
}

static HIDDEN: Mutex<Vec<(u64, Vec<Hidden>)>> = Mutex::new(Vec::new());

/// Whether reference `i` is read inside an expression (which consumes the variable).
fn reads_once(data: &HistData, i: usize) -> bool {
    fn walk(f: &HistField, i: usize, level: u32) -> bool {
        if level > 4 {
            return false;
        }
        if f.has(flags::VAR_REF) && f.var_ref_idx == i && f.read_once {
            return true;
        }
        f.operands.iter().any(|o| walk(o, i, level + 1))
    }
    data.fields.iter().any(|f| walk(f, i, 0))
}

fn remove_hidden(hidden: Vec<Hidden>) {
    for h in hidden.into_iter().rev() {
        let Some(instance) = crate::trace::tracing()
            .all()
            .into_iter()
            .find(|i| i.files().iter().any(|f| Arc::ptr_eq(f, &h.file)))
        else {
            continue;
        };
        let _ = crate::trigger::write(&instance, &h.file, &format!("!hist:{}", h.cmd));
    }
}

/// Counts one more event trigger feeding `hist` (a new trigger, or one sharing a named
/// histogram); [`detach`] undoes it.
pub fn attach(hist: &Arc<Hist>) {
    if let Some(r) = registry()
        .iter()
        .find(|r| std::ptr::eq(r.hist.as_ptr(), Arc::as_ptr(hist)))
    {
        r.attached.fetch_add(1, Ordering::Relaxed);
    }
}

/// An event trigger feeding `hist` is gone: removed by `!hist`, by a truncating open of its
/// `trigger` file, or with its event or instance (the kernel frees a hist trigger's data
/// the same way on each of these paths). When it was the last, the histogram's references
/// and hidden triggers are given back ([`release`]), so nothing it read stays busy.
pub fn detach(hist: &Arc<Hist>) {
    let last = registry()
        .iter()
        .find(|r| std::ptr::eq(r.hist.as_ptr(), Arc::as_ptr(hist)))
        .is_some_and(|r| {
            let before = r.attached.load(Ordering::Relaxed);
            r.attached
                .store(before.saturating_sub(1), Ordering::Relaxed);
            before <= 1
        });
    if last {
        release(hist);
    }
}

/// Gives back what a removed trigger's histogram held: the references it counted on other
/// triggers (see [`Prepared::build`]) and the hidden triggers it made; then forgets it.
pub fn release(hist: &Arc<Hist>) {
    let Some(id) = id_of(hist) else { return };
    release_id(id, &hist.data);
}

/// [`release`] by identity, for a trigger whose histogram was never made.
pub fn release_id(id: u64, data: &HistData) {
    {
        let reg = registry();
        let mut counted: Vec<u64> = Vec::new();
        for r in &data.var_refs {
            let Some(t) = &r.var_ref else { continue };
            if t.hist == id || counted.contains(&t.hist) {
                continue;
            }
            counted.push(t.hist);
            if let Some(e) = reg.iter().find(|e| e.id == t.hist) {
                e.referenced.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
    registry().retain(|r| r.id != id);
    let hidden = {
        let mut all = HIDDEN.lock().unwrap_or_else(|e| e.into_inner());
        match all.iter().position(|(h, _)| *h == id) {
            Some(at) => all.remove(at).1,
            None => Vec::new(),
        }
    };
    remove_hidden(hidden);
}

/// The parser's view of an event for a hist trigger write: the event's fields (as
/// [`FileEnv`](crate::hist::FileEnv) gives them) and the variables of the instance's other
/// hist triggers.
pub struct Env<'a> {
    /// The event file and its instance.
    pub file: crate::hist::FileEnv<'a>,
    /// `hist:` and the written parameters (carets of "not unique" errors).
    pub command: &'a str,
}

impl ustrace_filter::hist::HistEnv for Env<'_> {
    fn event(&self) -> (&str, &str) {
        self.file.event()
    }

    fn field(&self, name: &str) -> Option<ustrace_filter::hist::EventField> {
        self.file.field(name)
    }

    fn find_var(
        &self,
        system: Option<&str>,
        event: Option<&str>,
        name: &str,
        onmatch: &[(&str, &str)],
    ) -> Result<Option<VarTarget>, HistError> {
        find_var(
            self.file.instance,
            system,
            event,
            name,
            onmatch,
            self.command,
        )
    }

    fn var_defined_on_event(&self, name: &str) -> bool {
        self.file.var_defined_on_event(name)
    }

    fn event_exists(&self, system: &str, event: &str) -> bool {
        self.file.event_exists(system, event)
    }
}

/// Makes the histogram of a new trigger on `file` (the kernel's `create_hist_data` after
/// parsing, `create_actions` and registration): its references and actions resolved, its
/// map sized for their extra variables, and visible to the instance's other triggers.
pub fn create(
    instance: &Instance,
    file: &Arc<EventFile>,
    mut data: HistData,
) -> Result<Arc<Hist>, HistError> {
    // String variables keep their bytes in slots of their own after the trigger's
    // variables (the kernel's per-entry string buffers), stack variables their frames;
    // the actions' slots follow.
    let mut string_vars = Vec::new();
    let mut stack_vars = Vec::new();
    let mut strings = Vec::new();
    let mut used = 0;
    for f in data.vals() {
        // An alias (`s=$st`) keeps nothing: it names the frames of the variable it refers to.
        if f.has(flags::VAR) && f.has(flags::STACKTRACE) && !f.has(flags::ALIAS) {
            let first = data.n_vars + used;
            strings.push((f.var_idx, first, STACKTRACE_DEPTH));
            stack_vars.push(first);
            used += STACKTRACE_DEPTH;
            continue;
        }
        if !f.has(flags::VAR) || !f.has(flags::STRING) || f.has(flags::ALIAS) {
            continue;
        }
        // `common_pid.execname` and `common_comm` are task names, not record fields.
        let from = if f.has(flags::EXECNAME) {
            StrFrom::ExecName
        } else if f.has(flags::COMM) {
            StrFrom::Comm
        } else {
            let Some(ef) = &f.field else { continue };
            let read = FieldRead {
                offset: ef.offset,
                size: ef.size,
                signed: false,
                class: ef.class(),
            };
            if !read.is_string() {
                continue;
            }
            StrFrom::Field(read)
        };
        // A task name is at most 15 bytes and its NUL (`TASK_COMM_LEN`).
        let size = if matches!(from, StrFrom::Field(_)) {
            f.size
        } else {
            16
        };
        let words = size.clamp(8, SAVE_STR_MAX).div_ceil(8);
        let first = data.n_vars + used;
        strings.push((f.var_idx, first, words));
        string_vars.push(StrVar { from, first, words });
        used += words;
    }
    let t = Target {
        instance,
        file,
        id: next_id(),
        strings: &strings,
        first_extra: data.n_vars + used,
    };
    let prepared = prepare(&t, &mut data)?;
    let extra = used + prepared.extra_vars;
    let mut inter = prepared.build(&t, &data);
    inter.string_vars = string_vars;
    inter.stack_vars = stack_vars;
    let inter = (!inter.is_empty()).then_some(inter);
    let made = Hist::new(data.clone(), extra, inter);
    let Ok(hist) = made else {
        release_id(t.id, &data);
        return Err(HistError::silent(ustrace_filter::hist::ENOMEM));
    };
    let hist = Arc::new(hist);
    register(t.id, instance, file, &hist, strings);
    Ok(hist)
}
