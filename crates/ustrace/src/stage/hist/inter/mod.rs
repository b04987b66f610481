//! The inter-event part of the hist stage (histogram.rst 2.2): on each record of an event
//! whose hist trigger references variables or has actions, find the values other
//! histograms saved under the same key, and run `onmatch`/`onmax`/`onchange` actions after
//! the entry is updated.
//!
//! ```text
//!  record ─> key ─> resolve_cross: for each $var of another trigger, look that trigger's
//!                   map up with this key and take the variable (read once); any missing
//!                   ──> the record updates nothing (the kernel's resolve_var_refs)
//!              ─> insert + update (hist stage: sums, variables, expressions on the refs)
//!              ─> after_update: references to this trigger's own variables, then actions:
//!                   onmatch: generate the synthetic event from refs and fields
//!                   onmax/onchange: compare with the entry's tracked value; save fields
//!                   into the entry, take a snapshot, or generate an event
//! ```
//!
//! Everything here is resolved when the trigger is registered (a command one floor up,
//! [`crate::hist_inter`], finds the variables, the synthetic event and the fields), so the
//! record path takes no lock, allocates nothing and makes no system call; the one
//! exception is `snapshot()`, which swaps buffers as the `snapshot` trigger does. Values
//! this module keeps per entry (string variables' bytes, stack variables' frames, tracked
//! maxima, saved fields) live in extra variable slots of the trigger's own map, after the
//! trigger's variables.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ustrace_filter::FieldClass;
use ustrace_ringbuf::clock::Clock;
use ustrace_tracemap::{Elt, HashedKey, VarAt};

use crate::buffers::Shared;
use crate::stage::hist::{show, timestamp, Hist, STACKTRACE_DEPTH};
use crate::synth::{SynthHold, SynthValue, Synthetic};

/// Most variable references one trigger resolves per record (the kernel's
/// `TRACING_MAP_VARS_MAX` sized array).
pub const MAX_REFS: usize = ustrace_filter::hist::VARS_MAX;

/// Bytes a saved string keeps (what `save()` prints is padded to 32).
pub const SAVE_STR_MAX: usize = 256;

/// Where one variable reference reads from.
pub struct RefSlot {
    /// The histogram of the trigger that defines the variable; `None` for this trigger's
    /// own.
    pub hist: Option<Arc<Hist>>,
    /// The variable's slot in that map.
    pub var: usize,
    /// Referenced inside an expression: reading consumes the variable.
    pub read_once: bool,
    /// The variable holds the address of a string kept in its entry.
    pub string: bool,
    /// Where the variable lives in the defining histogram's elements, resolved once;
    /// `None` for this trigger's own (or a variable that map does not have: never set).
    at: Option<VarAt>,
}

impl RefSlot {
    /// The variable in `map`'s element of `key` (taken, when read once).
    #[inline(always)]
    fn read(&self, map: &ustrace_tracemap::TracingMap, key: HashedKey<'_>) -> Option<u64> {
        let elt = map.lookup_hashed(key)?;
        let at = self.at?;
        if self.read_once {
            elt.take_var_at(at)
        } else {
            elt.var_at(at)
        }
    }

    /// A reference to variable `var` of `hist` (`None`: this trigger's own).
    pub fn new(hist: Option<Arc<Hist>>, var: usize, read_once: bool, string: bool) -> RefSlot {
        let at = hist
            .as_ref()
            .filter(|h| var < h.map.config().n_vars)
            .map(|h| h.map.var_at(var));
        RefSlot {
            hist,
            var,
            read_once,
            string,
            at,
        }
    }
}

/// How to read one field of the triggering record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldRead {
    /// Byte offset in the record.
    pub offset: usize,
    /// Size of the fixed part.
    pub size: usize,
    /// Sign-extend an integer.
    pub signed: bool,
    /// How the field holds a string, if it is one.
    pub class: FieldClass,
}

impl FieldRead {
    /// Whether the field is a string.
    pub fn is_string(&self) -> bool {
        matches!(
            self.class,
            FieldClass::StaticString | FieldClass::DynString | FieldClass::RelDynString
        )
    }

    /// An integer field's value, sign-extended to 64 bits when signed (as the kernel's
    /// `hist_field_s32` and friends cast it).
    #[inline(always)]
    pub fn int(&self, record: &[u8]) -> u64 {
        let Some(b) = record.get(self.offset..self.offset + self.size) else {
            return 0;
        };
        match (self.size, self.signed) {
            (1, false) => u64::from(b[0]),
            (1, true) => b[0] as i8 as i64 as u64,
            (2, false) => u64::from(u16::from_ne_bytes([b[0], b[1]])),
            (2, true) => i16::from_ne_bytes([b[0], b[1]]) as i64 as u64,
            (4, false) => u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
            (4, true) => i32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as i64 as u64,
            (8, _) => u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])),
            _ => 0,
        }
    }

    /// A string field's bytes, up to the first NUL.
    #[inline]
    pub fn str<'r>(&self, record: &'r [u8]) -> &'r [u8] {
        let raw: &[u8] = match self.class {
            FieldClass::StaticString => record
                .get(self.offset..self.offset + self.size)
                .unwrap_or(&[]),
            FieldClass::DynString | FieldClass::RelDynString => {
                let Some(loc) = record.get(self.offset..self.offset + 4) else {
                    return &[];
                };
                let loc = u32::from_ne_bytes([loc[0], loc[1], loc[2], loc[3]]);
                let mut start = (loc & 0xffff) as usize;
                if self.class == FieldClass::RelDynString {
                    start += self.offset + 4;
                }
                record
                    .get(start..start + (loc >> 16) as usize)
                    .unwrap_or(&[])
            }
            _ => &[],
        };
        let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
        &raw[..end]
    }
}

/// Where a string variable's bytes come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrFrom {
    /// A string field of the record.
    Field(FieldRead),
    /// `common_comm`: the calling thread's name, on every update.
    Comm,
    /// `common_pid.execname`: the name of the thread that made the entry, saved on its
    /// first update only (the kernel saves it when it initialises the entry).
    ExecName,
}

/// A string variable of a trigger: what it copies, and where its bytes are kept in
/// the entry (extra variable slots; the kernel keeps a per-entry string buffer).
pub struct StrVar {
    /// What the bytes are.
    pub from: StrFrom,
    /// First extra slot of the bytes.
    pub first: usize,
    /// Slots the bytes take (8 bytes each).
    pub words: usize,
}

/// The `done` mask that says the update computed every reference to the trigger's own
/// variables ([`Inter::resolve_own`] has nothing to read).
pub const ALL_OWN_DONE: u64 = u64::MAX;

/// Whether a snapshot action was ever made: until then no record can have left a snapshot
/// pending, and [`run_deferred`] looks at no thread-local. Set before the action is
/// published to the record path, so a record that runs the action sees it set.
static SNAPSHOT_ACTIONS: AtomicBool = AtomicBool::new(false);

/// Most string parameters one action passes (more are passed empty).
const MAX_STR_PARAMS: usize = 4;

/// Most stack-trace parameters one action passes (more are passed empty).
const MAX_STACK_PARAMS: usize = 2;

/// Frames of the record path above `save_stack`, found by name on the first save
/// (`usize::MAX` until then), as the stacktrace keys find theirs.
pub struct StackSkip(AtomicUsize);

impl Default for StackSkip {
    fn default() -> Self {
        StackSkip(AtomicUsize::new(usize::MAX))
    }
}

/// One value passed to a synthetic event.
pub enum Param {
    /// A variable reference's resolved value.
    Ref(usize),
    /// A string variable: its bytes in the entry with this record's key, of `hist` (`None`:
    /// this trigger's own entry). The reference itself is resolved as any other, so the
    /// action runs only when the variable is set (and a read-once use consumes it).
    RefStr {
        /// The defining histogram, when it is another trigger's.
        hist: Option<Arc<Hist>>,
        /// First slot of the bytes.
        first: usize,
        /// Slots of the bytes.
        words: usize,
    },
    /// A field of the triggering record (the kernel makes a field variable of it and
    /// reads it back at once; reading the record is the same value).
    Field(FieldRead),
    /// `common_comm` of the triggering event: the name of the thread that hit it.
    Comm,
    /// `common_timestamp` of the triggering event: the clock now, in microseconds when the
    /// trigger uses `.usecs` anywhere (the kernel's `ts_in_usecs`, a property of the
    /// whole trigger) and the clock counts nanoseconds.
    Timestamp {
        /// The trigger's `ts_in_usecs`.
        usecs: bool,
    },
    /// `common_cpu` of the triggering event: the CPU it ran on.
    Cpu,
    /// A stack variable (`st=common_stacktrace`, or an alias of one such as `s=$st`): its
    /// frames in the entry with this record's key, of `hist` (`None`: this trigger's own),
    /// in [`STACKTRACE_DEPTH`] slots from `first`. As for strings, the reference itself is
    /// resolved as any other, so the action runs only when the variable is set.
    RefStack {
        /// The histogram that captured the frames, when it is another trigger's.
        hist: Option<Arc<Hist>>,
        /// First slot of the frames.
        first: usize,
    },
}

/// Generating a synthetic event.
pub struct TraceAction {
    /// The event generated.
    pub synth: Arc<Synthetic>,
    /// Keeps the event from being deleted while the action exists (`EBUSY`).
    pub hold: SynthHold,
    /// One parameter per synthetic field, in order.
    pub params: Vec<Param>,
    /// Every parameter an integer, at most 8, into an integers-only event: the action
    /// takes [`TraceAction::fire_ints`], decided once here rather than on every match.
    ints: bool,
    /// Some parameter is a [`Param::RefStr`] (found once, not per record).
    strings: bool,
    /// Some parameter is a [`Param::RefStack`].
    stacks: bool,
    /// Some parameter is [`Param::Comm`].
    comm: bool,
}

/// A field `save()` copies into the entry.
pub struct SaveVar {
    /// The name printed before the value.
    pub name: String,
    /// Where the value comes from.
    pub read: FieldRead,
    /// First extra variable slot holding it.
    pub var: usize,
    /// Slots it takes (strings take several).
    pub words: usize,
}

/// What `onmax()`/`onchange()` does when the tracked value moves.
pub enum TrackThen {
    /// `save(...)`: the trigger's save variables are stored.
    Save,
    /// `snapshot()`.
    Snapshot(Arc<SnapshotState>),
    /// `trace(...)` / `synth(...)`.
    Trace(TraceAction),
}

/// The instance-wide record of the last snapshot a tracking action took (the kernel's
/// conditional snapshot data), printed at the end of the `hist` file.
pub struct SnapshotState {
    /// `onmax` rather than `onchange`.
    pub max: bool,
    /// The tracked variable as written (`$wakeup_lat`).
    pub var_str: String,
    /// The value that triggered the last snapshot.
    pub value: AtomicU64,
    /// A snapshot was taken.
    pub updated: AtomicBool,
    /// The key of the entry that triggered it; the lock serializes snapshots, as the
    /// kernel's `max_lock` does.
    pub key: Mutex<Vec<u8>>,
}

/// One handler and its action.
pub enum Action {
    /// `onmatch(...).trace(...)`: on every update whose references resolved.
    OnMatch(TraceAction),
    /// `onmax($var)` / `onchange($var)`.
    Track {
        /// `onmax` (else `onchange`).
        max: bool,
        /// The reference to the tracked variable.
        var_ref: usize,
        /// The extra variable slot holding the tracked value.
        track_var: usize,
        /// What happens when it moves.
        then: TrackThen,
    },
}

/// The inter-event state of one hist trigger.
#[derive(Default)]
pub struct Inter {
    /// Variable references, by the index the trigger's expressions use.
    pub refs: Vec<RefSlot>,
    /// Handlers and actions, in the order written.
    pub actions: Vec<Action>,
    /// The fields `save()` stores.
    pub save_vars: Vec<SaveVar>,
    /// Variable slots this module needs after the trigger's own.
    pub extra_vars: usize,
    /// This trigger's string variables, copied into their entry on each update.
    pub string_vars: Vec<StrVar>,
    /// This trigger's stack variables (`st=common_stacktrace`): the first of the
    /// [`STACKTRACE_DEPTH`] slots each saves the calling thread's frames in on each
    /// update (the kernel keeps them in the entry's string storage).
    pub stack_vars: Vec<usize>,
    /// The record-path frames those saves skip.
    pub stack_skip: StackSkip,
    /// The buffers `snapshot()` acts on (the triggering event's instance).
    pub(crate) shared: Option<Arc<Shared>>,
}

/// Builds the key of `len` bytes another map expects from this trigger's key: the same
/// prefix, zero-padded (the kernel looks the other map up with this trigger's key buffer).
/// A map of the same key size takes the key as it is, hash included.
#[inline]
fn with_key_len<R>(key: HashedKey<'_>, len: usize, f: impl FnOnce(HashedKey<'_>) -> R) -> R {
    let bytes = key.bytes();
    if bytes.len() == len {
        return f(key);
    }
    if bytes.len() > len {
        return f(HashedKey::new(&bytes[..len]));
    }
    let mut buf = [0u8; 512];
    let n = bytes.len().min(buf.len());
    buf[..n].copy_from_slice(&bytes[..n]);
    f(HashedKey::new(&buf[..len.min(buf.len())]))
}

impl Inter {
    /// Whether the trigger needs this stage at all.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
            && self.actions.is_empty()
            && self.string_vars.is_empty()
            && self.stack_vars.is_empty()
    }

    /// Resolves the references to other triggers' variables for a record with `key`, into
    /// `vals`. `false` when one is missing: the record then updates nothing. Read-once
    /// references consumed before the missing one stay consumed, as on the kernel.
    #[inline]
    pub fn resolve_cross(&self, key: HashedKey<'_>, vals: &mut [u64]) -> bool {
        for (i, r) in self.refs.iter().enumerate() {
            let Some(hist) = &r.hist else { continue };
            let map = &hist.map;
            // A map keyed as this one (the usual pair keyed by the same field) takes the
            // key and its hash as they are, inline.
            let key_size = map.config().key_size;
            let found = if key.bytes().len() == key_size {
                r.read(map, key)
            } else {
                with_key_len(key, key_size, |k| r.read(map, k))
            };
            match (found, vals.get_mut(i)) {
                (Some(v), Some(slot)) => *slot = v,
                _ => return false,
            }
        }
        true
    }

    /// Resolves the references to this trigger's own variables from the updated entry,
    /// never consuming them, but those in `done` (one bit per reference), which the update
    /// computed; [`ALL_OWN_DONE`] says every one was. `false` when one is unset: the
    /// actions do not run.
    #[inline]
    pub fn resolve_own(&self, elt: &Elt, vals: &mut [u64], done: u64) -> bool {
        if done == ALL_OWN_DONE {
            return true;
        }
        for (i, r) in self.refs.iter().enumerate() {
            if r.hist.is_some() || (i < 64 && done & (1 << i) != 0) {
                continue;
            }
            match (elt.var(r.var), vals.get_mut(i)) {
                (Some(v), Some(slot)) => *slot = v,
                _ => return false,
            }
        }
        true
    }

    /// Runs the actions after the entry `elt` (key `key`) was updated from `record`, with
    /// the references' values in `vals` (own references not in `done` resolved here).
    pub(crate) fn run_actions(
        &self,
        elt: &Elt,
        key: HashedKey<'_>,
        record: &[u8],
        clock: Clock,
        vals: &mut [u64],
        done: u64,
    ) {
        if self.actions.is_empty() || !self.resolve_own(elt, vals, done) {
            return;
        }
        for action in &self.actions {
            match action {
                Action::OnMatch(t) => t.fire(elt, key, record, clock, vals),
                Action::Track {
                    max,
                    var_ref,
                    track_var,
                    then,
                } => {
                    let value = vals.get(*var_ref).copied().unwrap_or(0);
                    let tracked = elt.var(*track_var).unwrap_or(0);
                    let moved = if *max {
                        value > tracked
                    } else {
                        value != tracked
                    };
                    if !moved {
                        continue;
                    }
                    elt.set_var(*track_var, value);
                    match then {
                        TrackThen::Save => self.save(elt, record),
                        TrackThen::Trace(t) => t.fire(elt, key, record, clock, vals),
                        TrackThen::Snapshot(state) => {
                            if let Some(shared) = &self.shared {
                                state.take(value, key.bytes(), shared);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Saves the calling thread's frames into each stack variable of the entry: out of
    /// line, so triggers without one pay only the emptiness check.
    #[cold]
    #[inline(never)]
    fn save_stacks(&self, elt: &Elt) {
        for &first in &self.stack_vars {
            save_stack(elt, first, &self.stack_skip.0);
        }
    }

    /// Copies the save variables' fields from `record` into the entry.
    fn save(&self, elt: &Elt, record: &[u8]) {
        for s in &self.save_vars {
            if s.read.is_string() {
                let bytes = s.read.str(record);
                for w in 0..s.words {
                    let mut word = [0u8; 8];
                    let from = (w * 8).min(bytes.len());
                    let to = (w * 8 + 8).min(bytes.len());
                    word[..to - from].copy_from_slice(&bytes[from..to]);
                    elt.set_var(s.var + w, u64::from_ne_bytes(word));
                }
            } else {
                elt.set_var(s.var, s.read.int(record));
            }
        }
    }

    /// What follows an entry's values in the `hist` file: each tracking action's value and
    /// the saved fields (the kernel's `print_actions`).
    pub fn print_entry(&self, entry: &show::Entry, out: &mut String) {
        let var = |i: usize| entry.vars.get(i).copied().flatten();
        use std::fmt::Write;
        for action in &self.actions {
            let Action::Track {
                max,
                track_var,
                then,
                ..
            } = action
            else {
                continue;
            };
            if matches!(then, TrackThen::Snapshot(_)) {
                continue;
            }
            let label = if *max { "max" } else { "changed" };
            let _ = write!(out, "\n\t{label}: {:>10}", var(*track_var).unwrap_or(0));
            for s in &self.save_vars {
                if s.read.is_string() {
                    let mut bytes = Vec::with_capacity(s.words * 8);
                    for w in 0..s.words {
                        bytes.extend_from_slice(&var(s.var + w).unwrap_or(0).to_ne_bytes());
                    }
                    let end = bytes.iter().position(|&c| c == 0).unwrap_or(bytes.len());
                    let text = String::from_utf8_lossy(&bytes[..end]);
                    let _ = write!(out, "  {}: {:<32}", s.name, text);
                } else {
                    let _ = write!(out, "  {}: {:>10}", s.name, var(s.var).unwrap_or(0));
                }
            }
        }
    }

    /// The `Snapshot taken` block printed before the totals, when a snapshot action took
    /// one; `print_key` prints a key as the entry lines do.
    pub fn print_snapshot(&self, out: &mut String, print_key: &dyn Fn(&[u8], &mut String)) {
        use std::fmt::Write;
        for action in &self.actions {
            let Action::Track {
                then: TrackThen::Snapshot(state),
                ..
            } = action
            else {
                continue;
            };
            if !state.updated.load(Ordering::Acquire) {
                return;
            }
            let key = state.key.lock().unwrap_or_else(|e| e.into_inner()).clone();
            out.push_str("\nSnapshot taken (see tracing/snapshot).  Details:\n");
            let _ = write!(
                out,
                "\ttriggering value {{ {}({}) }}: {:>10}",
                if state.max { "onmax" } else { "onchange" },
                state.var_str,
                state.value.load(Ordering::Relaxed)
            );
            out.push_str("\ttriggered by event with key: ");
            print_key(&key, out);
            out.push('\n');
            return;
        }
    }
}

impl Inter {
    /// Runs after the element of `key` was updated for `record`: the string variables are
    /// copied into it, then the actions run. `refs` holds the resolved references (those
    /// to own variables in `done` already computed) and is this stage's to fill further,
    /// so no copy of it is made per record.
    #[inline]
    pub fn after_update(
        &self,
        elt: &Elt,
        key: HashedKey<'_>,
        record: &[u8],
        clock: Clock,
        refs: &mut [u64],
        done: u64,
    ) {
        for v in &self.string_vars {
            match v.from {
                StrFrom::Field(read) => store_str(elt, v.first, v.words, read.str(record)),
                StrFrom::Comm => store_comm(elt, v.first, v.words),
                // Unset until the entry's first update stores it.
                StrFrom::ExecName if elt.var(v.first).is_none() => {
                    store_comm(elt, v.first, v.words)
                }
                StrFrom::ExecName => {}
            }
        }
        if !self.stack_vars.is_empty() {
            self.save_stacks(elt);
        }
        if self.actions.is_empty() {
            return;
        }
        self.run_actions(elt, key, record, clock, refs, done);
    }
}

impl TraceAction {
    /// An action generating `synth` from `params` (one per field), holding it with `hold`.
    pub fn new(synth: Arc<Synthetic>, hold: SynthHold, params: Vec<Param>) -> TraceAction {
        let ints = params.len() <= 8
            && synth.ints_only()
            && params.iter().all(|p| match p {
                Param::Ref(_) => true,
                Param::Field(f) => !f.is_string(),
                Param::Timestamp { .. } | Param::Cpu => true,
                Param::RefStr { .. } | Param::RefStack { .. } | Param::Comm => false,
            });
        let strings = params
            .iter()
            .any(|p| matches!(p, Param::RefStr { .. } | Param::Comm));
        let stacks = params.iter().any(|p| matches!(p, Param::RefStack { .. }));
        let comm = params.iter().any(|p| matches!(p, Param::Comm));
        TraceAction {
            comm,
            synth,
            hold,
            params,
            ints,
            strings,
            stacks,
        }
    }

    /// Generates the synthetic event from the resolved references, the entry `elt` of
    /// `key` (for string variables) and the record. Always inlined into the handlers, with
    /// the paths it picks out of line: left to the compiler, the stack path's branch made it
    /// a call of its own, which cost the integer path ~14 instructions per action.
    #[inline(always)]
    fn fire(&self, elt: &Elt, key: HashedKey<'_>, record: &[u8], clock: Clock, vals: &[u64]) {
        // The common case, latencies and ids: integer fields from references and integer
        // record fields, passed as plain words with no value kinds to check.
        if self.ints && self.fire_ints(record, clock, vals) {
            return;
        }
        if self.stacks {
            return self.fire_stacks(elt, key, record, clock, vals);
        }
        // Most synthetic events have a few fields and no string variable: fill only small
        // arrays for them.
        match (self.params.len() <= 8, self.strings) {
            (true, false) => self.fire_with::<8, 0, 0>(elt, key, record, clock, vals),
            (true, true) => self.fire_with::<8, MAX_STR_PARAMS, 0>(elt, key, record, clock, vals),
            (false, _) => self.fire_with::<{ crate::synth::SYNTH_FIELDS_MAX }, MAX_STR_PARAMS, 0>(
                elt, key, record, clock, vals,
            ),
        }
    }

    /// Generates an integers-only synthetic event when every parameter is an integer;
    /// `false` (nothing done) when one is not, for the general path to refuse as it does.
    #[inline]
    fn fire_ints(&self, record: &[u8], clock: Clock, vals: &[u64]) -> bool {
        let mut ints = [0u64; 8];
        for (slot, p) in ints.iter_mut().zip(&self.params) {
            *slot = match p {
                Param::Ref(r) => vals.get(*r).copied().unwrap_or(0),
                Param::Field(f) if !f.is_string() => f.int(record),
                Param::Timestamp { usecs } => timestamp(clock, *usecs),
                Param::Cpu => ustrace_ringbuf::cpu::current_cpu() as u64,
                _ => return false,
            };
        }
        let n = self.params.len().min(ints.len());
        let _ = self.synth.trace_ints(&ints[..n]);
        true
    }

    /// [`TraceAction::fire`] of an action passing stack variables: out of line, so the
    /// other actions' path stays as small as it was.
    #[cold]
    #[inline(never)]
    fn fire_stacks(
        &self,
        elt: &Elt,
        key: HashedKey<'_>,
        record: &[u8],
        clock: Clock,
        vals: &[u64],
    ) {
        if self.params.len() <= 8 {
            self.fire_with::<8, MAX_STR_PARAMS, MAX_STACK_PARAMS>(elt, key, record, clock, vals)
        } else {
            self.fire_with::<{ crate::synth::SYNTH_FIELDS_MAX }, MAX_STR_PARAMS, MAX_STACK_PARAMS>(
                elt, key, record, clock, vals,
            )
        }
    }

    /// `N` values at most, `S` of them string variables and `K` stack variables.
    #[inline]
    fn fire_with<const N: usize, const S: usize, const K: usize>(
        &self,
        elt: &Elt,
        key: HashedKey<'_>,
        record: &[u8],
        clock: Clock,
        vals: &[u64],
    ) {
        // String variables are copied out of their entries first (atomic loads), so the
        // values below borrow only this stack.
        let mut strs = [[0u8; SAVE_STR_MAX]; S];
        let mut lens = [0usize; S];
        let mut j = 0;
        for p in &self.params {
            let Param::RefStr { hist, first, words } = p else {
                continue;
            };
            if j == S {
                break;
            }
            let copy = |e: &Elt, buf: &mut [u8; SAVE_STR_MAX]| load_str(e, *first, *words, buf);
            lens[j] = match hist {
                None => copy(elt, &mut strs[j]),
                Some(h) => with_key_len(key, h.map.config().key_size, |k| {
                    h.map.lookup_hashed(k).map_or(0, |e| copy(e, &mut strs[j]))
                }),
            };
            j += 1;
        }
        let mut stacks = [[0u64; STACKTRACE_DEPTH]; K];
        let mut k = 0;
        // `K == 0` (no stack parameter) is known at compile time: no scan then.
        for p in self.params.iter().take(if K == 0 { 0 } else { usize::MAX }) {
            let Param::RefStack { hist, first } = p else {
                continue;
            };
            if k == K {
                break;
            }
            match hist {
                None => load_stack(elt, *first, &mut stacks[k]),
                Some(h) => with_key_len(key, h.map.config().key_size, |hk| {
                    if let Some(e) = h.map.lookup_hashed(hk) {
                        load_stack(e, *first, &mut stacks[k]);
                    }
                }),
            }
            k += 1;
        }
        // The thread's cached name, read only by the actions that pass it.
        let comm = if S != 0 && self.comm {
            crate::thread::current_comm_bytes()
        } else {
            [0u8; 16]
        };
        let comm_len = comm.iter().position(|&c| c == 0).unwrap_or(comm.len());
        let mut values = [SynthValue::U64(0); N];
        let n = self.params.len().min(N);
        let mut j = 0;
        let mut k = 0;
        for (i, p) in self.params.iter().take(n).enumerate() {
            values[i] = match p {
                Param::Ref(r) => SynthValue::U64(vals.get(*r).copied().unwrap_or(0)),
                Param::RefStr { .. } => {
                    let v = match (strs.get(j), lens.get(j)) {
                        (Some(s), Some(&len)) => SynthValue::Str(&s[..len]),
                        _ => SynthValue::Str(&[]),
                    };
                    j += 1;
                    v
                }
                Param::RefStack { .. } => {
                    let v = stacks
                        .get(k)
                        .map_or(SynthValue::Stack(&[]), |s| SynthValue::Stack(s));
                    k += 1;
                    v
                }
                Param::Field(f) if f.is_string() => SynthValue::Str(f.str(record)),
                Param::Field(f) => SynthValue::U64(f.int(record)),
                Param::Comm => SynthValue::Str(&comm[..comm_len]),
                Param::Timestamp { usecs } => SynthValue::U64(timestamp(clock, *usecs)),
                Param::Cpu => SynthValue::U64(ustrace_ringbuf::cpu::current_cpu() as u64),
            };
        }
        let _ = self.synth.trace(&values[..n]);
    }
}

/// Stores `bytes` (cut to the slots, NUL-padded) in `words` variable slots from `first`.
fn store_str(elt: &Elt, first: usize, words: usize, bytes: &[u8]) {
    let n = bytes.len().min(words * 8 - 1);
    for w in 0..words {
        let mut word = [0u8; 8];
        let from = (w * 8).min(n);
        let to = (w * 8 + 8).min(n);
        word[..to - from].copy_from_slice(&bytes[from..to]);
        elt.set_var(first + w, u64::from_ne_bytes(word));
    }
}

/// Stores the calling thread's name (cached per thread: no system call) as a string
/// variable's bytes.
#[inline(never)]
fn store_comm(elt: &Elt, first: usize, words: usize) {
    let comm = crate::thread::current_comm_bytes();
    let end = comm.iter().position(|&c| c == 0).unwrap_or(comm.len());
    store_str(elt, first, words, &comm[..end]);
}

/// Saves the calling thread's frames (from the function that hit the tracepoint outwards,
/// the record path skipped) in [`STACKTRACE_DEPTH`] slots from `first`, zero after the last:
/// the kernel's `stack_trace_save` into a stack variable's storage.
#[inline(never)]
fn save_stack(elt: &Elt, first: usize, skip_slot: &AtomicUsize) {
    let mut frames = [0usize; STACKTRACE_DEPTH];
    let skip = match skip_slot.load(Ordering::Relaxed) {
        usize::MAX => crate::stage::hist::calibrate_stack_skip(skip_slot),
        skip => skip,
    };
    // Frame 0 is this function, as in the calibration.
    let n = ustrace_inspect::stack::capture(skip, &mut frames);
    for (w, &addr) in frames.iter().enumerate() {
        elt.set_var(first + w, if w < n { addr as u64 } else { 0 });
    }
}

/// Copies the frames kept in [`STACKTRACE_DEPTH`] slots from `first` into `buf`.
fn load_stack(elt: &Elt, first: usize, buf: &mut [u64; STACKTRACE_DEPTH]) {
    for (w, slot) in buf.iter_mut().enumerate() {
        *slot = elt.var(first + w).unwrap_or(0);
    }
}

/// Copies the string kept in `words` slots from `first` into `buf`; its length to the NUL.
fn load_str(elt: &Elt, first: usize, words: usize, buf: &mut [u8; SAVE_STR_MAX]) -> usize {
    let words = words.min(SAVE_STR_MAX / 8);
    for w in 0..words {
        let v = elt.var(first + w).unwrap_or(0).to_ne_bytes();
        buf[w * 8..w * 8 + 8].copy_from_slice(&v);
    }
    buf[..words * 8]
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(words * 8)
}

impl SnapshotState {
    /// A new state for `onmax` (`max`) or `onchange` of `var_str`.
    pub fn new(max: bool, var_str: &str) -> SnapshotState {
        SNAPSHOT_ACTIONS.store(true, Ordering::Relaxed);
        SnapshotState {
            max,
            var_str: var_str.to_string(),
            value: AtomicU64::new(0),
            updated: AtomicBool::new(false),
            // Room for any key, so taking a snapshot allocates nothing.
            key: Mutex::new(Vec::with_capacity(crate::stage::hist::KEY_SIZE_MAX)),
        }
    }

    /// The kernel's `cond_snapshot_update`: a snapshot only when the value beats the
    /// instance-wide one (or differs from it, for `onchange`). The snapshot itself is taken
    /// once the triggering record is in the buffer ([`run_deferred`]), so the snapshot
    /// ends with it, as the kernel's (whose record is already reserved when it swaps).
    fn take(&self, value: u64, key: &[u8], shared: &Arc<Shared>) {
        let mut saved = self.key.lock().unwrap_or_else(|e| e.into_inner());
        let last = self.value.load(Ordering::Relaxed);
        let moved = if self.max {
            value > last
        } else {
            value != last
        };
        if !moved {
            return;
        }
        self.value.store(value, Ordering::Relaxed);
        saved.clear();
        saved.extend_from_slice(key);
        self.updated.store(true, Ordering::Release);
        PENDING_SNAPSHOT.with(|p| p.set(Some(shared.clone())));
    }
}

thread_local! {
    /// A snapshot an action decided on while its record was being built.
    static PENDING_SNAPSHOT: std::cell::Cell<Option<Arc<Shared>>> =
        const { std::cell::Cell::new(None) };
}

/// Takes the snapshot an action of this thread decided on, if any: called by the trigger
/// stage after the triggering record was committed or discarded.
#[inline]
pub(crate) fn run_deferred() {
    if !SNAPSHOT_ACTIONS.load(Ordering::Relaxed) {
        return;
    }
    let pending = PENDING_SNAPSHOT.try_with(|p| p.take()).ok().flatten();
    if let Some(shared) = pending {
        let _ = shared.take_snapshot();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(offset: usize, size: usize, signed: bool, class: FieldClass) -> FieldRead {
        FieldRead {
            offset,
            size,
            signed,
            class,
        }
    }

    #[test]
    fn integers_sign_extend_as_the_kernel_casts_them() {
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&(-5i32).to_ne_bytes());
        rec[4..6].copy_from_slice(&0xfffeu16.to_ne_bytes());
        assert_eq!(read(0, 4, true, FieldClass::Other).int(&rec) as i64, -5);
        assert_eq!(read(0, 4, false, FieldClass::Other).int(&rec), 0xffff_fffb);
        assert_eq!(read(4, 2, false, FieldClass::Other).int(&rec), 0xfffe);
        // Past the record: 0, never a panic.
        assert_eq!(read(12, 8, false, FieldClass::Other).int(&rec), 0);
    }

    #[test]
    fn strings_stop_at_nul_and_data_loc_points_into_the_record() {
        let mut rec = [0u8; 32];
        rec[0..4].copy_from_slice(b"ping");
        // __data_loc at 16: 5 bytes at offset 24.
        rec[16..20].copy_from_slice(&((5u32 << 16) | 24).to_ne_bytes());
        rec[24..29].copy_from_slice(b"abcd\0");
        assert_eq!(
            read(0, 16, false, FieldClass::StaticString).str(&rec),
            b"ping"
        );
        assert_eq!(read(16, 4, false, FieldClass::DynString).str(&rec), b"abcd");
        // __rel_loc counts from the end of its word.
        rec[16..20].copy_from_slice(&((3u32 << 16) | 4).to_ne_bytes());
        assert_eq!(
            read(16, 4, false, FieldClass::RelDynString).str(&rec),
            b"abc"
        );
    }

    #[test]
    fn another_maps_key_is_this_keys_prefix_zero_padded() {
        let key = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];
        let hashed = HashedKey::new(&key);
        let bytes = |len| with_key_len(hashed, len, |k| k.bytes().to_vec());
        assert_eq!(bytes(8), key[..8].to_vec());
        assert_eq!(bytes(16), key.to_vec());
        let mut padded = key.to_vec();
        padded.resize(24, 0);
        assert_eq!(bytes(24), padded);
    }
}
