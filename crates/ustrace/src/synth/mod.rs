//! Synthetic events: events defined at run time by their fields alone, recorded from code
//! (the API of events.rst 7.1–7.2) or by hist trigger actions (`onmatch().trace()`).
//!
//! A definition comes from one of three doors, all parsed by
//! [`ustrace_filter::synth`] and applied by one function, so they cannot differ:
//!
//! ```text
//!  synthetic_events  "lat u64 d; pid_t pid"  ──┐
//!  dynamic_events    "s:synthetic/lat ..."   ──┼─> parse ─> Synthetic (an EventClass)
//!  SynthEventCmd / create()  (in process)    ──┘        └─> registry: id, format, and a
//!                                                            file in every instance:
//!                                                            events/synthetic/lat/{enable,
//!                                                            filter, trigger, format, id}
//!
//!  Synthetic::trace(&[values]) ── attached count: one relaxed load ──> off: return
//!     │ on
//!     ▼ check values, size the record, then for each attached event file (RCU list):
//!       EventFile::wants_record ─> EventFile::record(len, fill) ─> filter, triggers,
//!       ring buffer, as for any event
//! ```
//!
//! An event file is attached when its instance enables the event or a trigger holds it in
//! soft mode, as a static event's probe is. A synthetic event cannot be removed while any
//! instance has it enabled or holds it for a trigger, while an eprobe reads it, or while
//! a [`SynthHold`] lives (the kernel's `ref`, taken by hist actions that generate it):
//! that removal fails with `EBUSY` and nothing changes.
//!
//! Recording allocates nothing: the values are borrowed, the record is sized first and
//! written in place. Off, [`Synthetic::trace`] costs the value check and one relaxed load.
//! Recordings nested on one thread (a hist action on a synthetic event generating another)
//! stop at [`MAX_NESTING`] levels, so a loop of actions drops records instead of
//! overflowing the stack.

mod api;
mod record;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ustrace_ctl::vfs::{Errno, OpenFile, OpenFlags};
use ustrace_filter::synth::{self as grammar, SynthCommand};

use crate::event::{registry, Attachment, EventClass, EventId, FieldDesc};
use crate::rcu::RcuCell;
use crate::trace::{tracing, EventFile};
use crate::tracefs::files::TextFile;

pub use api::{create, delete, SynthEventCmd, SynthTrace};
pub use record::{SynthField, MAX_DYN_STRING};
pub use ustrace_filter::synth::{
    SynthDef, SynthErrorKind, SynthFieldDef, SynthFieldKind, STACK_DEPTH, STR_VAR_LEN_MAX,
    SYNTH_FIELDS_MAX, SYNTH_SYSTEM,
};

/// One value of a synthetic event field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthValue<'a> {
    /// An integer field's value (cut to the field's size, as the kernel stores it).
    U64(u64),
    /// A string field's value: the bytes up to the first NUL (a fixed `char[N]` field
    /// keeps at most 255 of them, a dynamic one 4095).
    Str(&'a [u8]),
    /// A stack-trace field's value: return addresses up to the first 0, at most
    /// [`STACK_DEPTH`].
    Stack(&'a [u64]),
}

macro_rules! value_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for SynthValue<'_> {
            fn from(v: $t) -> Self {
                // Signed values are sign-extended, as C's cast to u64 does.
                SynthValue::U64(v as u64)
            }
        }
    )*};
}
value_from_int!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);

impl From<bool> for SynthValue<'_> {
    fn from(v: bool) -> Self {
        SynthValue::U64(u64::from(v))
    }
}

impl<'a> From<&'a str> for SynthValue<'a> {
    fn from(v: &'a str) -> Self {
        SynthValue::Str(v.as_bytes())
    }
}

impl<'a> From<&'a [u8]> for SynthValue<'a> {
    fn from(v: &'a [u8]) -> Self {
        SynthValue::Str(v)
    }
}

impl<'a> From<&'a [u64]> for SynthValue<'a> {
    fn from(v: &'a [u64]) -> Self {
        SynthValue::Stack(v)
    }
}

/// Why a synthetic-event operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SynthError {
    /// The definition was rejected; the kernel's message and caret are in `error_log`.
    Definition(grammar::SynthError),
    /// A field type the kernel does not accept (`synth_event_add_field`): `EINVAL`.
    InvalidType(String),
    /// More than [`SYNTH_FIELDS_MAX`] fields: `EINVAL`.
    TooManyFields,
    /// No synthetic event of that name (or it was deleted): `ENOENT`.
    NotFound,
    /// The event is enabled, held by a trigger, an eprobe or a [`SynthHold`]: `EBUSY`.
    Busy,
    /// The registry refused the event (`EEXIST` when another event has the name).
    Registry(Errno),
    /// A trace gave a different number of values than the event has fields: `EINVAL`.
    WrongCount {
        /// The event's fields.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A value of the wrong kind for field `field` (0-based): `EINVAL`.
    WrongType {
        /// The field's position.
        field: usize,
        /// What it takes: "an integer", "a string" or "a stack trace".
        expected: &'static str,
    },
    /// A piecewise trace named a field the event does not have: `EINVAL`.
    NoSuchField,
    /// A piecewise trace added more values than the event has fields: `EINVAL`.
    TooManyValues,
    /// A piecewise trace mixed `add_next_val` and `add_val`: `EINVAL`.
    MixedAdd,
}

impl SynthError {
    /// The errno the kernel returns for the same mistake.
    pub fn errno(&self) -> Errno {
        match self {
            SynthError::Definition(e) => Errno(e.errno),
            SynthError::NotFound => Errno::ENOENT,
            SynthError::Busy => Errno::EBUSY,
            SynthError::Registry(e) => *e,
            _ => Errno::EINVAL,
        }
    }
}

impl std::fmt::Display for SynthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SynthError::Definition(e) => write!(f, "{e}"),
            SynthError::InvalidType(t) => write!(f, "invalid synthetic field type '{t}'"),
            SynthError::TooManyFields => write!(f, "too many fields (at most {SYNTH_FIELDS_MAX})"),
            SynthError::NotFound => write!(f, "no such synthetic event"),
            SynthError::Busy => write!(f, "the synthetic event is in use"),
            SynthError::Registry(e) => write!(f, "the event cannot be registered: {e}"),
            SynthError::WrongCount { expected, got } => {
                write!(f, "{got} values for {expected} fields")
            }
            SynthError::WrongType { field, expected } => {
                write!(f, "field {field} takes {expected}")
            }
            SynthError::NoSuchField => write!(f, "no field of that name"),
            SynthError::TooManyValues => write!(f, "more values than fields"),
            SynthError::MixedAdd => write!(f, "add_next_val and add_val mixed in one trace"),
        }
    }
}

impl std::error::Error for SynthError {}

impl From<SynthError> for Errno {
    fn from(e: SynthError) -> Errno {
        e.errno()
    }
}

/// A synthetic event: its definition, record layout, and the event files it writes to.
pub struct Synthetic {
    def: SynthDef,
    layout: record::Layout,
    id: OnceLock<EventId>,
    /// How many event files are attached: the word `trace` tests first.
    attached: AtomicUsize,
    /// The attached files, for writers of records.
    files: RcuCell<Vec<Arc<EventFile>>>,
    /// The same list, for attach and detach, which it serializes.
    control: Mutex<Vec<Arc<EventFile>>>,
    /// Live [`SynthHold`]s.
    holds: AtomicUsize,
    deleted: AtomicBool,
    me: Weak<Synthetic>,
}

impl std::fmt::Debug for Synthetic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Synthetic")
            .field("name", &self.def.name)
            .field("id", &self.id.get())
            .field("fields", &self.layout.fields)
            .finish()
    }
}

/// Synthetic events in creation order (the order `synthetic_events` lists them). Also
/// serializes creation and removal.
static SYNTHS: Mutex<Vec<Arc<Synthetic>>> = Mutex::new(Vec::new());

fn synths() -> std::sync::MutexGuard<'static, Vec<Arc<Synthetic>>> {
    SYNTHS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The synthetic event `name`.
pub fn find(name: &str) -> Option<Arc<Synthetic>> {
    synths().iter().find(|s| s.def.name == name).cloned()
}

/// Every synthetic event, in creation order.
pub fn all() -> Vec<Arc<Synthetic>> {
    synths().clone()
}

/// While it lives, the event cannot be deleted (`EBUSY`): what a hist action that
/// generates the event holds, as the kernel's `synth_event->ref`.
pub struct SynthHold {
    event: Arc<Synthetic>,
}

impl SynthHold {
    /// The held event.
    pub fn event(&self) -> &Arc<Synthetic> {
        &self.event
    }
}

impl Drop for SynthHold {
    fn drop(&mut self) {
        self.event.holds.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Synthetic {
    /// The event's name (in system `synthetic`).
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The parsed definition.
    pub fn definition(&self) -> &SynthDef {
        &self.def
    }

    /// The event's fields, in order.
    pub fn fields(&self) -> &[SynthField] {
        &self.layout.fields
    }

    /// The field named `name` and its position.
    pub fn field(&self, name: &str) -> Option<(usize, &SynthField)> {
        self.layout
            .fields
            .iter()
            .enumerate()
            .find(|(_, f)| f.name() == name)
    }

    /// The event's id (its `id` file).
    pub fn id(&self) -> EventId {
        *self.id.get().expect("registered before it is shared")
    }

    /// Whether any instance records the event or holds it for triggers: one relaxed load.
    #[inline(always)]
    pub fn is_enabled(&self) -> bool {
        self.attached.load(Ordering::Relaxed) != 0
    }

    /// Keeps the event from being deleted while the hold lives.
    pub fn hold(&self) -> SynthHold {
        self.holds.fetch_add(1, Ordering::AcqRel);
        SynthHold {
            event: self.me.upgrade().expect("a live event is in an Arc"),
        }
    }

    /// Records one event with `values`, one per field in order, into every instance that
    /// has the event enabled (`synth_event_trace_array`). The values are checked first
    /// (count and kinds), so a mistake shows whether or not the event is on. No lock,
    /// no allocation, no syscall.
    ///
    /// ```
    /// use ustrace::synth::{self, SynthValue};
    /// use ustrace::FileSystem;
    ///
    /// let lat = synth::create("doc_trace_lat", &[("u64", "lat"), ("char[]", "op")])?;
    /// ustrace::tracefs().write_file("events/synthetic/doc_trace_lat/enable", "1")?;
    /// lat.trace(&[SynthValue::U64(1200), "get".into()])?;
    /// assert!(lat.trace(&[SynthValue::U64(1)]).is_err()); // one value short
    /// # ustrace::tracefs().write_file("events/synthetic/doc_trace_lat/enable", "0")?;
    /// # let text = ustrace::tracefs().read_to_string("trace")?;
    /// # assert!(text.contains("doc_trace_lat: lat=1200 op=get"), "{text}");
    /// # synth::delete("doc_trace_lat")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn trace(&self, values: &[SynthValue<'_>]) -> Result<(), SynthError> {
        self.layout.check(values)?;
        if self.deleted.load(Ordering::Relaxed) {
            return Err(SynthError::NotFound);
        }
        if !self.is_enabled() {
            return Ok(());
        }
        self.emit(values);
        Ok(())
    }

    /// [`Synthetic::trace`] for an event whose fields are all integers
    /// ([`Synthetic::ints_only`]), from the values themselves, one per field: what a hist
    /// action generating the event calls on every match, so it skips checking each value's
    /// kind and sizing a dynamic part. A wrong count is refused as `trace` refuses it.
    #[inline]
    pub(crate) fn trace_ints(&self, values: &[u64]) -> Result<(), SynthError> {
        if !self.layout.ints_only() || values.len() != self.layout.fields.len() {
            return Err(SynthError::WrongCount {
                expected: self.layout.fields.len(),
                got: values.len(),
            });
        }
        if self.deleted.load(Ordering::Relaxed) {
            return Err(SynthError::NotFound);
        }
        if !self.is_enabled() {
            return Ok(());
        }
        let Some(_nested) = Nested::enter() else {
            return Ok(());
        };
        let guard = crate::rcu::read_lock();
        let Some(files) = self.files.get(&guard) else {
            return Ok(());
        };
        let len = self.layout.fixed_len();
        for file in files {
            if file.wants_record() {
                file.record(len, |rec| self.layout.fill_ints(values, rec));
            }
        }
        Ok(())
    }

    /// Whether every field is an integer, so [`Synthetic::trace_ints`] can record it.
    #[inline]
    pub(crate) fn ints_only(&self) -> bool {
        self.layout.ints_only()
    }

    /// Writes checked values to every attached file.
    #[inline]
    fn emit(&self, values: &[SynthValue<'_>]) {
        let Some(_nested) = Nested::enter() else {
            return;
        };
        let guard = crate::rcu::read_lock();
        let Some(files) = self.files.get(&guard) else {
            return;
        };
        let len = self.layout.record_len(values);
        for file in files {
            if file.wants_record() {
                file.record(len, |rec| self.layout.fill(values, rec));
            }
        }
    }

    /// Starts a piecewise trace (`synth_event_trace_start`): add the values one after the
    /// other or by name, then [`SynthTrace::end`] records them.
    pub fn trace_start<'v>(&self) -> SynthTrace<'_, 'v> {
        SynthTrace::new(self, None)
    }

    /// The event's file in one instance (`trace_get_event_file`; `None` is the top
    /// instance), to enable the event there and record into that instance alone. While
    /// the file is held the event cannot be deleted.
    ///
    /// ```
    /// use ustrace::synth;
    /// let event = synth::create("doc_file", &[("u64", "v")])?;
    /// let file = event.file(None)?;
    /// file.set_enabled(true)?; // trace_array_set_clr_event(tr, "synthetic", "doc_file", true)
    /// file.trace(&[42u64.into()])?;
    /// file.set_enabled(false)?;
    /// assert!(synth::delete("doc_file").is_err()); // EBUSY: the file is held
    /// drop(file); // trace_put_event_file
    /// synth::delete("doc_file")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn file(&self, instance: Option<&str>) -> Result<SynthEventFile, SynthError> {
        let tracing = tracing();
        let instance = match instance {
            Some(name) => tracing.instance(name).ok_or(SynthError::NotFound)?,
            None => tracing.top().clone(),
        };
        if self.deleted.load(Ordering::Relaxed) {
            return Err(SynthError::NotFound);
        }
        let file = instance.file(self.id()).ok_or(SynthError::NotFound)?;
        Ok(SynthEventFile {
            hold: self.hold(),
            file,
        })
    }

    /// Records checked values into one event file, if it is attached there.
    #[inline]
    fn trace_file(&self, file: &EventFile, values: &[SynthValue<'_>]) -> Result<(), SynthError> {
        self.layout.check(values)?;
        if self.deleted.load(Ordering::Relaxed) {
            return Err(SynthError::NotFound);
        }
        // Not attached: the event is off in that instance. Soft-disabled: `wants_record`
        // runs the triggers and says no, as the kernel's trace init does.
        let Some(_nested) = Nested::enter() else {
            return Ok(());
        };
        if (file.is_enabled() || file.is_soft_disabled()) && file.wants_record() {
            let len = self.layout.record_len(values);
            file.record(len, |rec| self.layout.fill(values, rec));
        }
        Ok(())
    }

    /// Whether the event may not be removed now.
    fn busy(&self) -> bool {
        self.holds.load(Ordering::Acquire) != 0
            || self.id.get().is_some_and(|id| crate::dynevent::in_use(*id))
    }
}

/// How many synthetic records one thread may be writing inside one another: a hist
/// action on a synthetic event may generate a synthetic event, whose hist may generate
/// another. Deeper than this the record is dropped, as the kernel's recursion check drops
/// it, so that a loop of actions cannot overflow the stack.
pub const MAX_NESTING: u32 = 4;

thread_local! {
    static NESTING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// One level of synthetic recording on this thread, left on drop.
struct Nested;

impl Nested {
    #[inline]
    fn enter() -> Option<Nested> {
        NESTING
            .try_with(|n| {
                let depth = n.get();
                (depth < MAX_NESTING).then(|| {
                    n.set(depth + 1);
                    Nested
                })
            })
            .ok()
            .flatten()
    }
}

impl Drop for Nested {
    #[inline]
    fn drop(&mut self) {
        let _ = NESTING.try_with(|n| n.set(n.get() - 1));
    }
}

/// A synthetic event's file in one instance (the kernel's `trace_event_file` that
/// `trace_get_event_file` returns): records go to that instance only. Holds the event.
pub struct SynthEventFile {
    hold: SynthHold,
    file: Arc<EventFile>,
}

impl SynthEventFile {
    /// The event.
    pub fn event(&self) -> &Arc<Synthetic> {
        self.hold.event()
    }

    /// Turns the event on or off in this instance (`trace_array_set_clr_event`).
    pub fn set_enabled(&self, on: bool) -> Result<(), Errno> {
        self.file.set_enabled(on)
    }

    /// Records one event into this instance (`synth_event_trace_array`); nothing while the
    /// event is off there.
    pub fn trace(&self, values: &[SynthValue<'_>]) -> Result<(), SynthError> {
        self.hold.event.trace_file(&self.file, values)
    }

    /// Starts a piecewise trace into this instance (`synth_event_trace_start`).
    pub fn trace_start<'v>(&self) -> SynthTrace<'_, 'v> {
        SynthTrace::new(&self.hold.event, Some(&self.file))
    }
}

/// Detaches one instance's file from the event.
struct Attached {
    event: Weak<Synthetic>,
    file: Weak<EventFile>,
}

impl Attachment for Attached {
    fn detach(self: Box<Self>) {
        let Some(event) = self.event.upgrade() else {
            return;
        };
        let mut list = event.control.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|f| !std::ptr::eq(Arc::as_ptr(f), self.file.as_ptr()));
        event.attached.store(list.len(), Ordering::Relaxed);
        let published = (!list.is_empty()).then(|| list.clone());
        event.files.replace(published);
    }
}

impl EventClass for Synthetic {
    fn system(&self) -> &str {
        SYNTH_SYSTEM
    }
    fn name(&self) -> &str {
        &self.def.name
    }
    fn fields(&self) -> Vec<FieldDesc> {
        self.layout.descs()
    }
    fn print_fmt(&self, _fields: &[FieldDesc]) -> String {
        self.def.print_fmt()
    }
    fn render_line(&self, record: &[u8], out: &mut String) -> bool {
        self.layout.render(&self.def.name, record, out, false);
        true
    }
    fn render_line_verbose(&self, record: &[u8], out: &mut String, verbose: bool) -> bool {
        self.layout.render(&self.def.name, record, out, verbose);
        true
    }
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        let weak_file = Arc::downgrade(&file);
        let mut list = self.control.lock().unwrap_or_else(|e| e.into_inner());
        list.push(file);
        // Published before the count rises, so a writer that sees the count finds the file.
        self.files.replace(Some(list.clone()));
        self.attached.store(list.len(), Ordering::Relaxed);
        Ok(Box::new(Attached {
            event: self.me.clone(),
            file: weak_file,
        }))
    }
}

/// Registers a parsed definition as an event in every instance.
fn register(def: SynthDef) -> Result<Arc<Synthetic>, SynthError> {
    let layout = record::Layout::new(&def);
    let event = Arc::new_cyclic(|me| Synthetic {
        def,
        layout,
        id: OnceLock::new(),
        attached: AtomicUsize::new(0),
        files: RcuCell::empty(),
        control: Mutex::new(Vec::new()),
        holds: AtomicUsize::new(0),
        deleted: AtomicBool::new(false),
        me: me.clone(),
    });
    let registered = registry()
        .add(event.clone())
        .map_err(SynthError::Registry)?;
    let _ = event.id.set(registered.id);
    tracing().add_event(registered);
    Ok(event)
}

/// Removes one event from the registry and every instance (the caller checked it is not
/// busy, under the `SYNTHS` lock).
fn unregister(list: &mut Vec<Arc<Synthetic>>, at: usize) {
    let event = list.remove(at);
    event.deleted.store(true, Ordering::Relaxed);
    let id = event.id();
    tracing().remove_event(id);
    registry().remove(id);
    crate::tracepoint::synchronize_unregister();
}

/// Removes the synthetic event `name`: `ENOENT` when there is none, `EBUSY` while in use.
fn remove_named(name: &str) -> Result<(), SynthError> {
    let mut list = synths();
    let at = list
        .iter()
        .position(|s| s.def.name == name)
        .ok_or(SynthError::NotFound)?;
    if list[at].busy() {
        return Err(SynthError::Busy);
    }
    unregister(&mut list, at);
    Ok(())
}

/// Removes every synthetic event (a truncating open of `synthetic_events`): `EBUSY`, and
/// nothing removed, while any is in use.
pub fn remove_all() -> Result<(), Errno> {
    let mut list = synths();
    if list.iter().any(|s| s.busy()) {
        return Err(Errno::EBUSY);
    }
    while !list.is_empty() {
        let last = list.len() - 1;
        unregister(&mut list, last);
    }
    Ok(())
}

/// Whether any synthetic event is in use (for a truncation of `dynamic_events`).
pub(crate) fn any_busy() -> bool {
    synths().iter().any(|s| s.busy())
}

/// Applies a parsed command. Creation checks the name under the same lock it registers
/// under, so two writers cannot both create one name.
fn apply(line: &str, dynamic: bool) -> Result<(), SynthError> {
    let mut list = synths();
    let exists = |name: &str| list.iter().any(|s| s.def.name == name);
    let parsed = if dynamic {
        match grammar::parse_dyn_line(line, &exists) {
            Some(parsed) => parsed,
            None => return Err(SynthError::NotFound),
        }
    } else {
        grammar::parse_line(line, &exists)
    };
    let command = parsed.map_err(|e| {
        tracing().top().log_error_text(&e.log_text());
        SynthError::Definition(e)
    })?;
    match command {
        SynthCommand::Empty => Ok(()),
        SynthCommand::Create(def) => {
            let event = register(def)?;
            list.push(event);
            Ok(())
        }
        SynthCommand::Delete(name) => {
            drop(list);
            remove_named(&name)
        }
    }
}

/// Runs one line of `synthetic_events` input (a comment after `#` already cut off).
pub fn run_line(line: &str) -> Result<(), SynthError> {
    apply(line, false)
}

/// Runs an `s:` line of `dynamic_events`; `None` when the line is not one.
pub fn run_dyn_line(line: &str) -> Option<Result<(), SynthError>> {
    let trimmed = line.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    if !trimmed.starts_with("s:") {
        return None;
    }
    Some(apply(line, true))
}

/// Removes the synthetic events a `-:[synthetic/]name` line names; how many it removed,
/// or `EBUSY` (nothing removed) when one is in use.
pub(crate) fn remove_matching(group: Option<&str>, event: Option<&str>) -> Result<usize, Errno> {
    if group.is_some_and(|g| g != SYNTH_SYSTEM) {
        return Ok(0);
    }
    let mut list = synths();
    let hits: Vec<usize> = (0..list.len())
        .filter(|&i| event.is_none_or(|e| list[i].def.name == e))
        .collect();
    if hits.iter().any(|&i| list[i].busy()) {
        return Err(Errno::EBUSY);
    }
    for &i in hits.iter().rev() {
        unregister(&mut list, i);
    }
    Ok(hits.len())
}

/// The `synthetic_events` listing: one `name\tfields` line per event.
pub fn listing() -> String {
    synths()
        .iter()
        .map(|s| format!("{}\n", s.def.listing()))
        .collect()
}

/// The `dynamic_events` lines of synthetic events, with their ids (creation order).
pub(crate) fn dyn_listing() -> Vec<(EventId, String)> {
    synths()
        .iter()
        .map(|s| (s.id(), format!("{}\n", s.def.dyn_listing())))
        .collect()
}

/// Applies a write to `synthetic_events`: one command a line, `#` starting a comment.
/// Lines before a failing one stay applied, as on the kernel.
pub fn write(data: &[u8]) -> Result<usize, Errno> {
    let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
    let text = text.split('\0').next().unwrap_or("");
    for line in text.split('\n') {
        let line = line.split('#').next().unwrap_or("");
        run_line(line).map_err(|e| e.errno())?;
    }
    Ok(data.len())
}

/// Opens `synthetic_events`: a truncating open removes every synthetic event first.
pub fn open(flags: OpenFlags) -> Result<Box<dyn OpenFile>, Errno> {
    if flags.truncate && !flags.append {
        remove_all()?;
    }
    let content = if flags.read { listing() } else { String::new() };
    Ok(Box::new(TextFile::new(content, Some(Box::new(write)))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hook on a synthetic event that records the same event again (what a loop of hist
    /// actions does) stops at the nesting limit instead of overflowing the stack.
    #[test]
    fn a_recording_loop_stops_at_the_nesting_limit() {
        let event = create("unit_loop", &[("u64", "depth")]).unwrap();
        let inst = tracing().create_instance("unit_synth_loop").unwrap();
        let file = inst.file(event.id()).unwrap();
        file.set_enabled(true).unwrap();
        let again = event.clone();
        let hook = crate::trigger::add_hook(
            &file,
            None,
            Arc::new(move |record: &[u8]| {
                let depth = u64::from_ne_bytes(record[8..16].try_into().unwrap());
                let _ = again.trace(&[SynthValue::U64(depth + 1)]);
            }),
        )
        .unwrap();
        event.trace(&[SynthValue::U64(0)]).unwrap();
        crate::trigger::remove_hook(&file, &hook);
        file.set_enabled(false).unwrap();
        let text = {
            use ustrace_ctl::vfs::FileSystem;
            crate::tracefs()
                .read_to_string("instances/unit_synth_loop/trace")
                .unwrap()
        };
        let lines = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(lines, MAX_NESTING as usize, "{text}");
        drop((file, inst));
        tracing().remove_instance("unit_synth_loop").unwrap();
        delete("unit_loop").unwrap();
    }
}
