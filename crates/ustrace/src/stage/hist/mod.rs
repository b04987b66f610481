//! The hist stage (histogram.rst 2): on one record of one event, build the key, find or
//! claim its element in the trigger's tracing map, and add the values.
//!
//! ```text
//!   record ─► key builder (fields, .log2/.buckets, strings, stack) ─► TracingMap::insert
//!                                                                       │ Elt
//!             hitcount += 1, sums += values, variables = expressions ◄──┘
//! ```
//!
//! A [`Hist`] is one histogram: the parsed trigger ([`HistData`], from
//! `ustrace_filter::hist`), compiled once into flat evaluators over the record, and its
//! preallocated [`TracingMap`]. Triggers that share a histogram by `name=` hold the same
//! `Arc<Hist>`; each registered trigger is an [`Attached`] (its own pause switch and filter
//! text), which the trigger stage runs on the built record ([`crate::stage::trigger`]).
//! The update takes no lock and allocates nothing: the key is built in a stack buffer, the
//! map is lock-free, values are relaxed atomic adds.
//!
//! Registering, `name=` sharing, `:pause`/`:cont`/`:clear`, `!hist` removal and the `hist`
//! file's text are the command floor's business ([`crate::hist`]); printing lives in
//! [`show`].
//!
//! # Hook points for inter-event support
//!
//! Variables defined on this trigger (`ts0=common_timestamp`) are stored here, in the
//! element's variable slot `HistField::var_idx` ([`Elt::set_var`](ustrace_tracemap::Elt::set_var)), on every update. The
//! places of the hitcount, sums and variables in an element are resolved once, when the
//! histogram is made, so an update reaches each with one bounds check. What needs other
//! events is left to the [`Inter`] the histogram is built with ([`Hist::new`]), called
//! directly (no dynamic dispatch on the update path):
//! - [`Inter::resolve_cross`] runs before the insert when the trigger has variable
//!   references (`HistData::var_refs`): it fills `refs[i]` for reference `i` (read from
//!   the defining histogram's element with the same key) and may veto the update, as the
//!   kernel's `resolve_var_refs`. Expressions read reference `i` as `refs[i]`.
//! - [`Inter::after_update`] runs after the element is updated, with the key, the
//!   element and the references: actions (`onmatch().trace()`, `onmax().save()`) go there.
//!   References to this trigger's own variables that the update has just computed are
//!   passed as computed, not read back from the element.
//! - [`Hist::extra_vars`] reserves variable slots beyond the trigger's own (field
//!   variables, tracking variables), numbered from `HistData::n_vars`.

pub mod inter;
pub mod show;
pub mod syscalls;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ustrace_filter::hist::{self as syntax, flags, DivBy, HistData, HistField, Op};
use ustrace_filter::FieldClass;
use ustrace_tracemap::{HashedKey, MapConfig, TracingMap, ValAt, VarAt};

use crate::event::field::read_int;
use crate::stage::hist::inter::Inter;

pub use syntax::{KEY_SIZE_MAX, STACKTRACE_DEPTH, STR_MAX};

/// Whether a frame belongs to the record path rather than to the traced program: ustrace
/// itself, the thread-local access of its scratch buffer, and the probe functions the
/// event macros generate.
fn is_record_path(name: &str) -> bool {
    name.starts_with("ustrace::")
        || name.starts_with("<ustrace")
        || name.starts_with("std::thread::local::")
        || name.contains("::__attach::")
        || name.contains("::__call_probes")
}

/// How many frames (from its caller, [`fill_stack`] or the stack variables' `save_stack`,
/// out) belong to the record path, stored in `skip_slot`.
#[cold]
#[inline(never)]
pub(crate) fn calibrate_stack_skip(skip_slot: &AtomicUsize) -> usize {
    let mut frames = [0usize; 64];
    let n = ustrace_inspect::stack::capture(1, &mut frames);
    let inventory = ustrace_inspect::symbols::inventory();
    let skip = frames[..n]
        .iter()
        .position(|&addr| {
            inventory
                .lookup(addr)
                .is_none_or(|(sym, _)| !is_record_path(&sym.name))
        })
        .unwrap_or(0);
    skip_slot.store(skip, Ordering::Relaxed);
    skip
}

/// How a compiled field gets its value from a record.
#[derive(Debug)]
enum Ev {
    Const(u64),
    One,
    Int(IntAt),
    Timestamp,
    Cpu,
    Pid,
    VarRef(usize),
    Log2(Box<Ev>),
    Bucket(Box<Ev>, u64),
    Neg(Box<Ev>),
    Bin(Op, DivBy, Box<Ev>, Box<Ev>),
}

/// Where a string key comes from.
#[derive(Debug, Clone, Copy)]
enum StrSrc {
    Static { offset: usize, size: usize },
    Dyn { offset: usize },
    RelDyn { offset: usize },
    Comm,
}

#[derive(Debug)]
enum KeyKind {
    Num(Ev),
    Str(StrSrc),
    Stack(Option<usize>),
}

#[derive(Debug)]
struct KeyPart {
    kind: KeyKind,
    offset: usize,
    size: usize,
}

/// The record and what evaluating fields may need beside it.
struct Ctx<'a> {
    record: &'a [u8],
    refs: &'a [u64],
    usecs: bool,
    clock: ustrace_ringbuf::clock::Clock,
}

impl Ctx<'_> {
    /// `common_timestamp` (`.usecs` when the trigger says so).
    #[inline(always)]
    fn timestamp(&self) -> u64 {
        timestamp(self.clock, self.usecs)
    }
}

/// `common_timestamp` as a trigger reads it: the clock now, in microseconds when the
/// trigger uses `.usecs` (the kernel's `ts_in_usecs`, a property of the whole trigger).
#[inline(always)]
pub(crate) fn timestamp(clock: ustrace_ringbuf::clock::Clock, usecs: bool) -> u64 {
    let ns = ustrace_ringbuf::clock::now(clock);
    // `.usecs` converts only a clock that counts nanoseconds, as the kernel's.
    if usecs && clock.in_nanos() {
        (ns + 500) / 1000
    } else {
        ns
    }
}

impl Ev {
    fn compile(f: &HistField) -> Ev {
        if f.has(flags::VAR_REF) || (f.has(flags::ALIAS) && f.operands.len() == 1) {
            return Ev::VarRef(f.var_ref_idx);
        }
        if f.has(flags::CONST) {
            return Ev::Const(f.constant);
        }
        if f.has(flags::LOG2) && !f.operands.is_empty() {
            return Ev::Log2(Box::new(Ev::compile(&f.operands[0])));
        }
        if f.has(flags::BUCKET) && !f.operands.is_empty() {
            return Ev::Bucket(Box::new(Ev::compile(&f.operands[0])), f.buckets.max(1));
        }
        match f.operator {
            Op::UnaryMinus => return Ev::Neg(Box::new(Ev::compile(&f.operands[0]))),
            Op::Plus | Op::Minus | Op::Div | Op::Mult => {
                return Ev::Bin(
                    f.operator,
                    f.div,
                    Box::new(Ev::compile(&f.operands[0])),
                    Box::new(Ev::compile(&f.operands[1])),
                )
            }
            Op::None => {}
        }
        if f.has(flags::HITCOUNT) {
            return Ev::One;
        }
        if f.has(flags::TIMESTAMP) {
            return Ev::Timestamp;
        }
        if f.has(flags::CPU) {
            return Ev::Cpu;
        }
        if f.has(flags::EXECNAME) {
            // A variable of `common_pid.execname` keeps the pid; the name is the pid's.
            return Ev::Pid;
        }
        match &f.field {
            Some(ef) => Ev::Int(IntAt(ef.offset, ef.size, ef.signed)),
            None => Ev::Const(0),
        }
    }

    /// The field's value. Leaves a record read or a reference (most keys, values and
    /// operands) are evaluated in the caller; the rest in [`Ev::eval_node`], out of line.
    #[inline(always)]
    fn eval(&self, ctx: &Ctx<'_>) -> u64 {
        match self {
            // A latency's `common_timestamp - $ts0`: both operands leaves, so the whole
            // expression is evaluated here, with no call.
            Ev::Bin(op, div, a, b) => {
                syntax::eval_op(*op, *div, a.eval_leaf(ctx), b.eval_leaf(ctx))
            }
            _ => self.eval_leaf(ctx),
        }
    }

    /// [`Ev::eval`] of a leaf inline; anything else out of line.
    #[inline(always)]
    fn eval_leaf(&self, ctx: &Ctx<'_>) -> u64 {
        match self {
            Ev::Int(at) => at.read(ctx.record),
            Ev::VarRef(i) => ctx.refs.get(*i).copied().unwrap_or(0),
            Ev::Const(c) => *c,
            Ev::Timestamp => ctx.timestamp(),
            _ => self.eval_node(ctx),
        }
    }

    #[inline(never)]
    fn eval_node(&self, ctx: &Ctx<'_>) -> u64 {
        match self {
            Ev::Const(c) => *c,
            Ev::One => 1,
            // Fixed-size loads: `read_int`'s copy of a run-time length is a `memcpy` call.
            Ev::Int(at) => at.read(ctx.record),
            Ev::Timestamp => ctx.timestamp(),
            Ev::Cpu => ustrace_ringbuf::cpu::current_cpu() as u64,
            Ev::Pid => IntAt(4, 4, true).read(ctx.record),
            Ev::VarRef(i) => ctx.refs.get(*i).copied().unwrap_or(0),
            Ev::Log2(e) => log2_roundup(e.eval(ctx)),
            Ev::Bucket(e, b) => e.eval(ctx) / b * b,
            Ev::Neg(e) => (e.eval(ctx) as i64).wrapping_neg() as u64,
            Ev::Bin(op, div, a, b) => syntax::eval_op(*op, *div, a.eval(ctx), b.eval(ctx)),
        }
    }
}

/// `ilog2(roundup_pow_of_two(v))` as the kernel computes it (0 and 1 give 0).
pub fn log2_roundup(v: u64) -> u64 {
    if v <= 1 || v > 1 << 63 {
        0
    } else {
        u64::from(64 - (v - 1).leading_zeros())
    }
}

fn str_src(f: &HistField) -> Option<StrSrc> {
    if f.has(flags::COMM) {
        return Some(StrSrc::Comm);
    }
    let ef = f.field.as_ref()?;
    Some(match ef.class() {
        FieldClass::StaticString => StrSrc::Static {
            offset: ef.offset,
            size: ef.size,
        },
        FieldClass::DynString => StrSrc::Dyn { offset: ef.offset },
        FieldClass::RelDynString => StrSrc::RelDyn { offset: ef.offset },
        _ => return None,
    })
}

/// One histogram: the parsed trigger, its compiled fields and its map.
pub struct Hist {
    /// The trigger as parsed (fields, sort keys, attributes, actions).
    pub data: HistData,
    /// The table of elements.
    pub map: TracingMap,
    /// `name=` the histogram is shared under.
    pub name: Option<String>,
    /// Variable slots reserved past the trigger's own (for inter-event support).
    pub extra_vars: usize,
    keys: Vec<KeyPart>,
    /// Where the hitcount (sum 0) lives in an element.
    hits: ValAt,
    /// `(place, evaluator)` of each value after hitcount.
    sums: Vec<(ValAt, Ev)>,
    /// `(variable index, place, evaluator)` of each variable defined on values and keys.
    vars: Vec<(usize, VarAt, Ev)>,
    /// `(reference, entry of vars)`: references to this trigger's own variables that every
    /// update computes, passed to the actions as computed.
    own_refs: Vec<(usize, usize)>,
    /// The references `own_refs` covers, one bit each (references 0..64), or
    /// [`inter::ALL_OWN_DONE`] when it covers every reference to an own variable.
    own_refs_mask: u64,
    /// One numeric key: no compound key to assemble.
    single_num_key: bool,
    /// Plain integer fields only (one key, sums, no variables, no hooks): the update
    /// reads them straight from the record, without the evaluator.
    plain: Option<Plain>,
    /// Inter-event support, when the trigger needs it.
    pub inter: Option<Arc<Inter>>,
    /// Frames of ustrace's record path above the function that hit the tracepoint, for
    /// stacktrace keys: found once, by name, on the first such key (the kernel skips a
    /// fixed count of its own frames; ours depend on inlining and on the producer, a probe
    /// or `trace_marker`, so each histogram finds its own). `usize::MAX` until then.
    stack_skip: AtomicUsize,
    /// Set while [`Hist::clear`] runs: updates of every trigger that shares the histogram
    /// stop, as the kernel pauses the named triggers around its clear.
    clearing: AtomicBool,
}

impl std::fmt::Debug for Hist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hist")
            .field("name", &self.name)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// An integer field read straight from the record: offset, size, signedness.
#[derive(Debug, Clone, Copy)]
struct IntAt(usize, usize, bool);

impl IntAt {
    /// The field's value, sign-extended when signed: fixed-size loads for the sizes the
    /// kernel's hist fields have (no `memcpy` call on the update path).
    #[inline(always)]
    fn read(self, record: &[u8]) -> u64 {
        let IntAt(offset, size, signed) = self;
        macro_rules! load {
            ($t:ty, $s:ty) => {
                match record.get(offset..offset + std::mem::size_of::<$t>()) {
                    Some(b) => {
                        let v = <$t>::from_ne_bytes(b.try_into().unwrap_or_default());
                        if signed {
                            v as $s as i64 as u64
                        } else {
                            v as u64
                        }
                    }
                    None => 0,
                }
            };
        }
        match size {
            8 => load!(u64, i64),
            4 => load!(u32, i32),
            2 => load!(u16, i16),
            1 => load!(u8, i8),
            _ => read_int(record, offset, size, signed),
        }
    }
}

/// The common shape `keys=field:vals=field,...`, compiled to offsets.
#[derive(Debug)]
struct Plain {
    key: IntAt,
    sums: Vec<(ValAt, IntAt)>,
}

fn plain_int(ev: &Ev) -> Option<IntAt> {
    match ev {
        Ev::Int(at) => Some(*at),
        _ => None,
    }
}

/// A histogram could not be made (its table could not be allocated).
#[derive(Debug)]
pub struct NoMemory;

impl Hist {
    /// Compiles `data` and allocates its table (`size=` entries, `extra_vars` variable
    /// slots past the trigger's own).
    pub fn new(data: HistData, extra_vars: usize, inter: Option<Inter>) -> Result<Hist, NoMemory> {
        let bits = if data.attrs.map_bits != 0 {
            data.attrs.map_bits
        } else {
            syntax::BITS_DEFAULT
        };
        let map = TracingMap::new(MapConfig {
            max_elts: 1 << bits,
            key_size: data.key_size.max(8),
            n_vals: data.n_sums(),
            n_vars: data.n_vars + extra_vars,
        })
        .map_err(|_| NoMemory)?;
        let keys: Vec<KeyPart> = data
            .keys()
            .iter()
            .map(|k| {
                let kind = if k.has(flags::STACKTRACE) {
                    KeyKind::Stack(k.field.as_ref().map(|f| f.offset))
                } else if k.has(flags::STRING) {
                    match str_src(k) {
                        Some(src) => KeyKind::Str(src),
                        None => KeyKind::Num(Ev::compile(k)),
                    }
                } else {
                    KeyKind::Num(Ev::compile(k))
                };
                KeyPart {
                    kind,
                    offset: k.offset,
                    size: k.size,
                }
            })
            .collect();
        let mut sums = Vec::new();
        let mut vars = Vec::new();
        let n_vars = map.config().n_vars;
        for (i, f) in data.vals().iter().enumerate().skip(1) {
            if f.has(flags::VAR) {
                // The parser numbers variables below `n_vars`; one that is not is never
                // stored (as `set_var` would refuse it), not a panic on the update path.
                if f.var_idx < n_vars {
                    vars.push((f.var_idx, map.var_at(f.var_idx), Ev::compile(f)));
                }
            } else {
                sums.push((map.val_at(i), Ev::compile(f)));
            }
        }
        let hits = map.val_at(0);
        let mut own_refs = Vec::new();
        let mut own_refs_mask = 0u64;
        if let Some(inter) = &inter {
            for (i, r) in inter.refs.iter().enumerate() {
                if r.hist.is_some() || i >= 64 {
                    continue;
                }
                let computed = vars.iter().position(|(v, _, _)| *v == r.var);
                if let Some(j) = computed.filter(|&j| j < syntax::VARS_MAX) {
                    own_refs.push((i, j));
                    own_refs_mask |= 1 << i;
                }
            }
            let own_left = inter
                .refs
                .iter()
                .enumerate()
                .any(|(i, r)| r.hist.is_none() && (i >= 64 || own_refs_mask & (1 << i) == 0));
            if !own_left {
                own_refs_mask = inter::ALL_OWN_DONE;
            }
        }
        let hooks = inter.map(Arc::new);
        let single_num_key = keys.len() == 1 && matches!(keys[0].kind, KeyKind::Num(_));
        let plain = match (&keys[..], vars.is_empty() && hooks.is_none()) {
            (
                [KeyPart {
                    kind: KeyKind::Num(ev),
                    ..
                }],
                true,
            ) => plain_int(ev).and_then(|key| {
                let sums: Option<Vec<_>> = sums
                    .iter()
                    .map(|(i, ev)| plain_int(ev).map(|f| (*i, f)))
                    .collect();
                sums.map(|sums| Plain { key, sums })
            }),
            _ => None,
        };
        Ok(Hist {
            stack_skip: AtomicUsize::new(usize::MAX),
            clearing: AtomicBool::new(false),
            plain,
            name: data.attrs.name.clone(),
            data,
            map,
            extra_vars,
            keys,
            hits,
            sums,
            vars,
            own_refs,
            own_refs_mask,
            single_num_key,
            inter: hooks,
        })
    }

    /// Empties the histogram (`:clear`) with no update in flight: updates stop, every record
    /// path already inside one finishes (an RCU grace period: updates run inside the trigger
    /// stage's read section), the map is cleared, updates resume. So no count is torn and
    /// no key that arrives meanwhile is lost uncounted; records during the clear are not
    /// counted, as on the kernel. Control path only; must not run inside a read section.
    pub fn clear(&self) {
        self.clearing.store(true, Ordering::SeqCst);
        crate::rcu::synchronize();
        self.map.clear();
        self.clearing.store(false, Ordering::SeqCst);
    }

    /// Adds one record. No lock, no allocation.
    #[inline]
    pub fn update(&self, record: &[u8], clock: ustrace_ringbuf::clock::Clock) {
        if self.clearing.load(Ordering::Relaxed) {
            return;
        }
        if let Some(plain) = &self.plain {
            let key = plain.key.read(record).to_ne_bytes();
            let Some(elt) = self.map.insert(&key) else {
                return;
            };
            elt.add_at(self.hits, 1);
            for (at, f) in &plain.sums {
                elt.add_at(*at, f.read(record));
            }
            return;
        }
        // Keys never read variable references (the parser refuses them).
        let ctx = Ctx {
            record,
            refs: &[],
            usecs: self.data.attrs.ts_in_usecs,
            clock,
        };
        if self.single_num_key {
            let KeyKind::Num(ev) = &self.keys[0].kind else {
                return;
            };
            let key = ev.eval(&ctx).to_ne_bytes();
            self.update_key(&key, &ctx);
            return;
        }
        let mut buf = [0u8; KEY_SIZE_MAX];
        let key_size = self.data.key_size.max(8);
        for part in &self.keys {
            let slot = &mut buf[part.offset..part.offset + part.size];
            match &part.kind {
                KeyKind::Num(ev) => {
                    let v = ev.eval(&ctx).to_ne_bytes();
                    let n = slot.len().min(8);
                    slot[..n].copy_from_slice(&v[..n]);
                }
                KeyKind::Str(src) => copy_str(record, *src, slot),
                KeyKind::Stack(field) => fill_stack(record, *field, slot, &self.stack_skip),
            }
        }
        self.update_key(&buf[..key_size], &ctx);
    }

    #[inline]
    fn update_key(&self, key: &[u8], ctx: &Ctx<'_>) {
        let key = HashedKey::new(key);
        if let Some(inter) = self.inter.as_deref() {
            return self.update_inter(inter, key, ctx);
        }
        let Some(elt) = self.map.insert_hashed(key) else {
            return;
        };
        elt.add_at(self.hits, 1);
        for (at, ev) in &self.sums {
            elt.add_at(*at, ev.eval(ctx));
        }
        for (_, at, ev) in &self.vars {
            elt.set_var_at(*at, ev.eval(ctx));
        }
    }

    /// [`Hist::update_key`] of a trigger with inter-event support: references resolved
    /// before the insert, actions after the update.
    #[inline]
    fn update_inter(&self, inter: &Inter, key: HashedKey<'_>, ctx: &Ctx<'_>) {
        let mut refs = [0u64; syntax::VARS_MAX];
        if !self.data.var_refs.is_empty() && !inter.resolve_cross(key, &mut refs) {
            return;
        }
        let Some(elt) = self.map.insert_hashed(key) else {
            return;
        };
        let record = ctx.record;
        let mut computed = [0u64; syntax::VARS_MAX];
        {
            let ctx = Ctx {
                record,
                refs: &refs,
                usecs: ctx.usecs,
                clock: ctx.clock,
            };
            elt.add_at(self.hits, 1);
            for (at, ev) in &self.sums {
                elt.add_at(*at, ev.eval(&ctx));
            }
            for (j, (_, at, ev)) in self.vars.iter().enumerate() {
                let v = ev.eval(&ctx);
                elt.set_var_at(*at, v);
                if let Some(slot) = computed.get_mut(j) {
                    *slot = v;
                }
            }
        }
        for &(i, j) in &self.own_refs {
            if let (Some(slot), Some(&v)) = (refs.get_mut(i), computed.get(j)) {
                *slot = v;
            }
        }
        inter.after_update(elt, key, record, ctx.clock, &mut refs, self.own_refs_mask);
    }
}

/// Copies a string field into its key slot, NUL-terminated (the kernel's `strncpy` of at
/// most the slot size less one).
fn copy_str(record: &[u8], src: StrSrc, slot: &mut [u8]) {
    let comm;
    let bytes: &[u8] = match src {
        StrSrc::Static { offset, size } => record.get(offset..offset + size).unwrap_or(&[]),
        StrSrc::Dyn { offset } => {
            crate::event::field::data_loc_bytes(record, offset).unwrap_or(&[])
        }
        StrSrc::RelDyn { offset } => {
            let loc = read_int(record, offset, 4, false) as usize;
            let start = offset + 4 + (loc & 0xffff);
            record.get(start..start + (loc >> 16)).unwrap_or(&[])
        }
        StrSrc::Comm => {
            comm = crate::thread::current_comm_bytes();
            &comm
        }
    };
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let n = end.min(slot.len().saturating_sub(1));
    slot[..n].copy_from_slice(&bytes[..n]);
}

/// Fills a stacktrace key: the calling thread's return addresses (from the function that
/// hit the tracepoint outwards), or a `__data_loc`
/// array of addresses in the record (`field.stacktrace`).
#[inline(never)]
fn fill_stack(record: &[u8], field: Option<usize>, slot: &mut [u8], skip_slot: &AtomicUsize) {
    let mut frames = [0usize; STACKTRACE_DEPTH];
    let n = match field {
        None => {
            let skip = match skip_slot.load(Ordering::Relaxed) {
                usize::MAX => calibrate_stack_skip(skip_slot),
                skip => skip,
            };
            // Frame 0 is this function, as in the calibration.
            ustrace_inspect::stack::capture(skip, &mut frames)
        }
        Some(offset) => {
            let bytes = crate::event::field::data_loc_bytes(record, offset).unwrap_or(&[]);
            let mut n = 0;
            for (i, chunk) in bytes.chunks_exact(8).take(STACKTRACE_DEPTH).enumerate() {
                frames[i] = u64::from_ne_bytes(chunk.try_into().unwrap_or([0; 8])) as usize;
                n = i + 1;
            }
            n
        }
    };
    for (i, f) in frames[..n].iter().enumerate() {
        if let Some(dst) = slot.get_mut(i * 8..i * 8 + 8) {
            dst.copy_from_slice(&(*f as u64).to_ne_bytes());
        }
    }
}

/// One hist trigger registered on an event (the kernel's `event_trigger_data`): the
/// histogram it feeds, which `name=` triggers share, and its own pause switch and filter.
pub struct Attached {
    /// The histogram.
    pub hist: Arc<Hist>,
    /// `:pause`d (or stopped by `disable_hist`).
    pub paused: AtomicBool,
    /// The filter after `if`, as written.
    pub filter_text: Option<String>,
}

impl Attached {
    /// The trigger's line in `trigger` and `hist` (without the newline).
    pub fn info(&self) -> String {
        self.hist.data.info(
            self.hist.name.as_deref(),
            self.filter_text.as_deref(),
            self.paused.load(Ordering::Relaxed),
        )
    }

    /// Runs the trigger on a built record (its filter already passed).
    #[inline]
    pub(crate) fn hit(&self, record: &[u8], clock: ustrace_ringbuf::clock::Clock) {
        if self.paused.load(Ordering::Relaxed) {
            return;
        }
        self.hist.update(record, clock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ustrace_filter::hist::{EventField, HistEnv};
    use ustrace_ringbuf::clock::Clock;

    /// A wakeup-like event: `pid` (int) at 8, `prio` (int) at 12, `delay` (u64) at 16.
    struct Wakeup;

    impl HistEnv for Wakeup {
        fn event(&self) -> (&str, &str) {
            ("sched", "wakeup")
        }
        fn field(&self, name: &str) -> Option<EventField> {
            let f = |name: &str, c_type: &str, offset, size, signed| EventField {
                name: name.into(),
                c_type: c_type.into(),
                offset,
                size,
                signed,
            };
            [
                f("common_pid", "int", 4, 4, true),
                f("pid", "int", 8, 4, true),
                f("prio", "int", 12, 4, true),
                f("delay", "u64", 16, 8, false),
            ]
            .into_iter()
            .find(|f| f.name == name)
        }
    }

    fn record(pid: i32, prio: i32, delay: u64) -> [u8; 24] {
        let mut r = [0u8; 24];
        r[4..8].copy_from_slice(&pid.to_ne_bytes());
        r[8..12].copy_from_slice(&pid.to_ne_bytes());
        r[12..16].copy_from_slice(&prio.to_ne_bytes());
        r[16..24].copy_from_slice(&delay.to_ne_bytes());
        r
    }

    fn hist(spec: &str) -> Hist {
        let data = ustrace_filter::hist::parse(spec, &Wakeup, false).unwrap();
        Hist::new(data, 0, None).unwrap()
    }

    #[test]
    fn variables_are_stored_in_the_element_of_the_key() {
        let h = hist("keys=pid:ts0=common_timestamp.usecs,d=delay*2+1,p=$pid_alias:pid_alias=prio");
        // `p=$pid_alias` names a plain-field variable of the same trigger: it reads `prio`.
        let before = ustrace_ringbuf::clock::now(Clock::Mono) / 1000;
        h.update(&record(7, 120, 10), Clock::Mono);
        h.update(&record(8, 99, 3), Clock::Mono);
        h.update(&record(7, 110, 20), Clock::Mono);
        let after = ustrace_ringbuf::clock::now(Clock::Mono) / 1000 + 1;
        let idx = |name: &str| {
            h.data
                .fields
                .iter()
                .find(|f| f.var_name.as_deref() == Some(name))
                .unwrap()
                .var_idx
        };
        // Keys are 8-byte slots: the int pid is sign-extended into one.
        let key = (7i64 as u64).to_ne_bytes();
        let elt = h.map.lookup(&key).unwrap();
        assert_eq!(elt.val(0), 2);
        let ts = elt.var(idx("ts0")).unwrap();
        assert!(
            (before..=after).contains(&ts),
            "{before} <= {ts} <= {after}"
        );
        assert_eq!(elt.var(idx("d")), Some(41));
        assert_eq!(elt.var(idx("p")), Some(110));
        assert_eq!(elt.var(idx("pid_alias")), Some(110));
        let other = h.map.lookup(&(8i64 as u64).to_ne_bytes()).unwrap();
        assert_eq!(other.var(idx("d")), Some(7));
        // A variable is a slot of the element, not a sum: nothing else reads it as one.
        assert_eq!(h.data.n_sums(), 1);
    }

    #[test]
    fn signed_fields_and_log2_keys_fill_eight_byte_slots() {
        let h = hist("keys=prio,delay.log2:vals=delay");
        h.update(&record(1, -5, 1000), Clock::Mono);
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&(-5i64 as u64).to_ne_bytes());
        key[8..].copy_from_slice(&10u64.to_ne_bytes());
        let elt = h.map.lookup(&key).unwrap();
        assert_eq!((elt.val(0), elt.val(1)), (1, 1000));
    }

    #[test]
    fn fixed_size_reads_agree_with_read_int() {
        let record: Vec<u8> = (0..32u8)
            .map(|b| b.wrapping_mul(37).wrapping_add(0x80))
            .collect();
        for size in [1, 2, 4, 8] {
            for signed in [false, true] {
                for offset in 0..=32 {
                    assert_eq!(
                        IntAt(offset, size, signed).read(&record),
                        read_int(&record, offset, size, signed),
                        "{offset} {size} {signed}"
                    );
                }
            }
        }
    }

    #[test]
    fn log2_rounds_up_as_the_kernel() {
        let got: Vec<u64> = [0, 1, 2, 3, 4, 5, 1024, 1025, u64::MAX]
            .map(log2_roundup)
            .to_vec();
        assert_eq!(got, [0, 0, 1, 2, 2, 3, 10, 11, 0]);
    }
}
