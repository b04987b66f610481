//! The hist-trigger language (histogram.rst 2): one write of `hist:...` to an event's
//! `trigger` file, parsed the way the kernel's `trace_events_hist.c` parses it.
//!
//! ```text
//!   hist:keys=<field1[,field2,...]>[:values=<field1[,field2,...]>]
//!     [:sort=<field1[,field2]>][:size=#entries][:pause][:continue][:clear]
//!     [:name=histname1][:nohitcount][:<var>=<expr>,...][:<handler>.<action>]
//!     [if <filter>]
//! ```
//!
//! Where it sits on the data path:
//!
//! ```text
//!   write "hist:keys=call_site.sym:vals=bytes_req" to events/S/E/trigger
//!        │  trigger::parse splits off the command ─► Kind::Hist { spec }
//!        ▼
//!   hist::parse(spec, env) ──► HistData (fields, sort keys, attributes, actions)
//!        │  error: HistError → errno + error_log entry with a caret
//!        ▼
//!   ustrace's hist stage compiles HistData into a key builder and value updaters
//!   over a tracing map; each record: key → insert → sums and variables
//! ```
//!
//! [`parse`] follows the kernel's `create_hist_data` step by step and in the same order,
//! so a write with a mistake fails with the same errno, the same `error_log` message and
//! the same caret: attributes (`parse_hist_trigger_attrs`), actions (`parse_actions`),
//! variable definitions, values, variables, keys, sort keys. The event's fields come from
//! a [`HistEnv`]; so do the things only the caller can know (variables of other
//! triggers, other events), which is where inter-event support hooks in: a
//! [`HistEnv::find_var`] that finds `$var` on other events' triggers turns a reference
//! into a [`FieldKind::VarRef`] node, which the engine reads from the values resolved
//! for the record.
//!
//! The parsed fields mirror the kernel's `struct hist_field` (flags, size, type, key
//! offset, operands), because what the `hist` and `trigger` files print, what sorts, and
//! which triggers are "the same" are all defined on them; [`HistData::info`] prints the
//! `trigger info` line from them.

mod error;
mod print;

pub use error::{HistError, HistErrorKind, EBUSY, EDOM, EEXIST, EINVAL, ENOENT, ENOMEM};

use crate::field::FieldClass;

/// Most key fields (`TRACING_MAP_KEYS_MAX`).
pub const KEYS_MAX: usize = 3;
/// Most sum fields, `hitcount` included (`TRACING_MAP_VALS_MAX`).
pub const VALS_MAX: usize = 3;
/// Most variables per trigger (`TRACING_MAP_VARS_MAX`).
pub const VARS_MAX: usize = 16;
/// Most sort keys (`TRACING_MAP_SORT_KEYS_MAX`).
pub const SORT_KEYS_MAX: usize = 2;
/// Smallest table: 2^7 = 128 entries.
pub const BITS_MIN: u32 = 7;
/// Largest table: 2^17 = 131072 entries.
pub const BITS_MAX: u32 = 17;
/// Default table: 2^11 = 2048 entries.
pub const BITS_DEFAULT: u32 = 11;
/// Most `onmatch`/`onmax`/`onchange` handlers per trigger (`HIST_ACTIONS_MAX`).
pub const ACTIONS_MAX: usize = 8;
/// Most parameters of one action (`SYNTH_FIELDS_MAX`).
pub const PARAMS_MAX: usize = 64;
/// Bytes a string key or string variable keeps (`MAX_FILTER_STR_VAL`).
pub const STR_MAX: usize = 256;
/// Frames of a stacktrace key (`HIST_STACKTRACE_DEPTH`).
pub const STACKTRACE_DEPTH: usize = 16;
/// Largest compound key in bytes (`HIST_KEY_SIZE_MAX`).
pub const KEY_SIZE_MAX: usize = STR_MAX + STACKTRACE_DEPTH * 8;
/// Most subexpressions in one expression.
pub const SUBEXPRS_MAX: u32 = 3;
/// The shift of the kernel's division-by-constant multiplier.
pub const DIV_SHIFT: u32 = 20;

/// The kernel's `HIST_FIELD_FL_*` flags, with the same meaning.
pub mod flags {
    #![allow(missing_docs)]
    pub const HITCOUNT: u32 = 1 << 0;
    pub const KEY: u32 = 1 << 1;
    pub const STRING: u32 = 1 << 2;
    pub const HEX: u32 = 1 << 3;
    pub const SYM: u32 = 1 << 4;
    pub const SYM_OFFSET: u32 = 1 << 5;
    pub const EXECNAME: u32 = 1 << 6;
    pub const SYSCALL: u32 = 1 << 7;
    pub const STACKTRACE: u32 = 1 << 8;
    pub const LOG2: u32 = 1 << 9;
    pub const TIMESTAMP: u32 = 1 << 10;
    pub const TIMESTAMP_USECS: u32 = 1 << 11;
    pub const VAR: u32 = 1 << 12;
    pub const EXPR: u32 = 1 << 13;
    pub const VAR_REF: u32 = 1 << 14;
    pub const CPU: u32 = 1 << 15;
    pub const ALIAS: u32 = 1 << 16;
    pub const BUCKET: u32 = 1 << 17;
    pub const CONST: u32 = 1 << 18;
    pub const PERCENT: u32 = 1 << 19;
    pub const GRAPH: u32 = 1 << 20;
    pub const COMM: u32 = 1 << 21;
}

/// An event field as a hist trigger sees it (the `format` file's description).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventField {
    /// Field name.
    pub name: String,
    /// C type as the `format` file has it.
    pub c_type: String,
    /// Offset in the record.
    pub offset: usize,
    /// Size in bytes (4 for `__data_loc`).
    pub size: usize,
    /// Signed integer.
    pub signed: bool,
}

impl EventField {
    /// How the kernel's filter code classifies the field's type.
    pub fn class(&self) -> FieldClass {
        FieldClass::of_c_type(&self.c_type)
    }

    /// A string the hist code copies into keys (a `char *` is only a pointer to it).
    pub fn is_hist_string(&self) -> bool {
        matches!(
            self.class(),
            FieldClass::StaticString | FieldClass::DynString | FieldClass::RelDynString
        )
    }
}

/// What a `$var` reference resolved to (filled in by [`HistEnv::find_var`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarTarget {
    /// Identifies the trigger (histogram) that defines the variable; opaque here.
    pub hist: u64,
    /// The variable's index in that histogram's element variables.
    pub idx: usize,
    /// Value size in bytes.
    pub size: usize,
    /// Signed value.
    pub signed: bool,
    /// C type of the value.
    pub c_type: String,
    /// The defining expression's timestamp flags (`TIMESTAMP`, `TIMESTAMP_USECS`).
    pub ts_flags: u32,
    /// The variable holds a string.
    pub is_string: bool,
    /// The variable's defining field flags (for expression checks).
    pub var_flags: u32,
    /// The constant the variable holds, when it was defined as one.
    pub constant: Option<u64>,
}

/// What a hist trigger needs to know about its event and the world around it.
pub trait HistEnv {
    /// `(system, name)` of the event the trigger is written to.
    fn event(&self) -> (&str, &str);
    /// The event field `name` as `trace_find_event_field` finds it (own fields first,
    /// then the common ones), or `None`.
    fn field(&self, name: &str) -> Option<EventField>;
    /// Resolves `$name` (optionally `system.event.$name`) to a variable of some
    /// registered hist trigger, as the kernel's `find_event_var`; `onmatch` lists the
    /// `(system, event)` of this trigger's `onmatch()` handlers, searched first when no
    /// event is named. `Err(pos)` is "not unique" at byte `pos`. Without inter-event
    /// support nothing is found.
    fn find_var(
        &self,
        _system: Option<&str>,
        _event: Option<&str>,
        _name: &str,
        _onmatch: &[(&str, &str)],
    ) -> Result<Option<VarTarget>, HistError> {
        Ok(None)
    }
    /// Whether another hist trigger of this event defines a variable `name`.
    fn var_defined_on_event(&self, _name: &str) -> bool {
        false
    }
    /// Whether `system:event` exists (for `onmatch(system.event)`).
    fn event_exists(&self, _system: &str, _event: &str) -> bool {
        true
    }
}

/// An arithmetic operator of an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Not an expression.
    None,
    /// `a+b`.
    Plus,
    /// `a-b`.
    Minus,
    /// `-(a)`.
    UnaryMinus,
    /// `a/b`.
    Div,
    /// `a*b`.
    Mult,
}

/// How a division by a constant is computed, as the kernel picks it once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DivBy {
    /// The divisor is not a constant.
    Runtime,
    /// Power of two: a shift.
    Shift(u32),
    /// Small divisor: multiply by `2^20 / d` and shift, rounding up (the kernel's).
    MultShift {
        /// `2^20 / divisor`.
        mult: u64,
        /// The divisor.
        divisor: u64,
    },
    /// A large divisor: a division.
    Const(u64),
}

/// One field of a hist trigger: a value, a variable, a key, or an operand of one (the
/// kernel's `struct hist_field`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistField {
    /// `flags::*`.
    pub flags: u32,
    /// The event field it reads, if any.
    pub field: Option<EventField>,
    /// Bucket size of `.buckets=N`.
    pub buckets: u64,
    /// C type of the value.
    pub c_type: String,
    /// Size in bytes (for keys, the slot size in the compound key).
    pub size: usize,
    /// Offset of a key in the compound key.
    pub offset: usize,
    /// Signed value.
    pub signed: bool,
    /// Operands of an expression, `.log2` and `.buckets` (one or two).
    pub operands: Vec<HistField>,
    /// The expression's operator.
    pub operator: Op,
    /// How a division is computed.
    pub div: DivBy,
    /// A constant's value.
    pub constant: u64,
    /// The variable name, for a variable definition.
    pub var_name: Option<String>,
    /// Display name of an expression or a variable reference.
    pub name: Option<String>,
    /// `system` of a qualified variable reference.
    pub system: Option<String>,
    /// `event` of a qualified variable reference.
    pub event: Option<String>,
    /// For a variable reference: what it refers to.
    pub var_ref: Option<VarTarget>,
    /// For a variable reference: its slot in [`HistData::var_refs`].
    pub var_ref_idx: usize,
    /// For a variable definition: its index among the trigger's variables.
    pub var_idx: usize,
    /// A reference inside an expression consumes the variable (reads it once).
    pub read_once: bool,
}

impl HistField {
    fn new(flags: u32) -> HistField {
        HistField {
            flags,
            field: None,
            buckets: 0,
            c_type: String::new(),
            size: 0,
            offset: 0,
            signed: false,
            operands: Vec::new(),
            operator: Op::None,
            div: DivBy::Runtime,
            constant: 0,
            var_name: None,
            name: None,
            system: None,
            event: None,
            var_ref: None,
            var_ref_idx: 0,
            var_idx: 0,
            read_once: false,
        }
    }

    /// Whether every flag of `f` is set.
    pub fn has(&self, f: u32) -> bool {
        self.flags & f != 0
    }

    /// Whether this field or an operand (three levels down) is or uses a variable.
    pub fn has_vars(&self) -> bool {
        fn walk(f: &HistField, level: u32) -> bool {
            if level > 3 {
                return false;
            }
            if f.has(flags::VAR | flags::VAR_REF) {
                return true;
            }
            f.operands.iter().any(|o| walk(o, level + 1))
        }
        walk(self, 0)
    }
}

/// One sort key: which map field (0 = hitcount, then values, then keys) and the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortKey {
    /// Index among hitcount, the non-variable values, then the keys.
    pub field_idx: usize,
    /// `.descending`.
    pub descending: bool,
}

/// The handler of an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    /// `onmatch(system.event)`.
    OnMatch {
        /// Subsystem.
        system: String,
        /// Event.
        event: String,
    },
    /// `onmax($var)`: the variable as written (with its `$`).
    OnMax {
        /// `$var`.
        var: String,
    },
    /// `onchange($var)`.
    OnChange {
        /// `$var`.
        var: String,
    },
}

/// What an action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    /// `save(field,...)`.
    Save,
    /// `trace(synth,params)` or `synth(params)`.
    Trace,
    /// `snapshot()`.
    Snapshot,
}

/// One `handler.action(params)` of a hist trigger, parsed (creating it — finding the
/// synthetic event, the variables, the fields to save — is inter-event work).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// When it runs.
    pub handler: Handler,
    /// What it does.
    pub kind: ActionKind,
    /// The action's name as written (`trace`, `save`, `snapshot`, or a synthetic event).
    pub action_name: String,
    /// Written as `trace(synth, ...)`: the first parameter names the synthetic event.
    pub use_trace_keyword: bool,
    /// The synthetic event of `trace(...)`.
    pub synth_event_name: Option<String>,
    /// The parameters, whitespace stripped.
    pub params: Vec<String>,
}

impl Action {
    /// The synthetic event an `onmatch().trace()`/`.synth()` generates.
    pub fn synth_name(&self) -> Option<&str> {
        match self.kind {
            ActionKind::Trace if self.use_trace_keyword => self.synth_event_name.as_deref(),
            ActionKind::Trace => Some(&self.action_name),
            _ => None,
        }
    }
}

/// The attributes of a hist trigger (the kernel's `struct hist_trigger_attrs`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attrs {
    /// `keys=`/`key=`.
    pub keys_str: Option<String>,
    /// `vals=`/`val=`/`values=`.
    pub vals_str: Option<String>,
    /// `sort=`.
    pub sort_key_str: Option<String>,
    /// `name=` (the name only).
    pub name: Option<String>,
    /// `clock=` (default `global`).
    pub clock: String,
    /// `:pause`.
    pub pause: bool,
    /// `:cont`/`:continue`.
    pub cont: bool,
    /// `:clear`.
    pub clear: bool,
    /// `:nohitcount`/`:NOHC`.
    pub no_hitcount: bool,
    /// Some `common_timestamp` is in microseconds.
    pub ts_in_usecs: bool,
    /// `size=` as table bits (0: not given).
    pub map_bits: u32,
    /// `var=expr[,var=expr]` attributes, as written.
    pub assignments: Vec<String>,
    /// Handler strings, as written.
    pub actions: Vec<String>,
}

/// A parsed hist trigger (the kernel's `struct hist_trigger_data` without its map).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistData {
    /// Hitcount, the values, the variables, then the keys.
    pub fields: Vec<HistField>,
    /// Values (hitcount and variables included).
    pub n_vals: usize,
    /// Keys.
    pub n_keys: usize,
    /// Variables defined by the trigger.
    pub n_vars: usize,
    /// Bytes of the compound key.
    pub key_size: usize,
    /// Sort keys (at least one).
    pub sort_keys: Vec<SortKey>,
    /// Attributes.
    pub attrs: Attrs,
    /// Handlers and actions.
    pub actions: Vec<Action>,
    /// Variable references, in creation order (each read into `var_ref_vals[i]`).
    pub var_refs: Vec<HistField>,
    /// Some field uses `common_timestamp`.
    pub enable_timestamps: bool,
    /// The filter after `if`, as the kernel keeps it.
    pub filter: Option<String>,
    /// The parameters before the filter (what a `!hist` removal is matched on).
    pub param: String,
    /// `hist:` plus what was written, for error positions.
    pub command: String,
    /// Written with `!` (a removal): duplicate variables are not errors then.
    pub remove: bool,
}

impl HistData {
    /// The key fields.
    pub fn keys(&self) -> &[HistField] {
        &self.fields[self.n_vals..]
    }

    /// The value fields (hitcount first; variables included).
    pub fn vals(&self) -> &[HistField] {
        &self.fields[..self.n_vals]
    }

    /// Number of sums the map keeps (hitcount and values, not variables).
    pub fn n_sums(&self) -> usize {
        self.n_vals - self.n_vars
    }

    /// The map field a sort key's `field_idx` names (hitcount, a value, or a key).
    pub fn sort_field(&self, field_idx: usize) -> &HistField {
        let first_key = self.n_vals - self.n_vars;
        let idx = if field_idx >= first_key {
            field_idx + self.n_vars
        } else {
            field_idx
        };
        &self.fields[idx]
    }

    /// Byte of the command where `needle` first occurs (the kernel's `errpos`).
    pub fn errpos(&self, needle: &str) -> usize {
        errpos(&self.command, needle)
    }

    /// The `trigger info` line (`hist:keys=...:size=2048 [active]`) without the newline,
    /// for a trigger sharing these fields under `name`, with its own `filter`.
    pub fn info(&self, name: Option<&str>, filter: Option<&str>, paused: bool) -> String {
        print::trigger_info(self, name, filter, paused)
    }

    /// Whether `other` has the same fields, sort keys and actions (the kernel's
    /// `hist_trigger_match` without its filter and name conditions).
    pub fn same_shape(&self, other: &HistData) -> bool {
        print::same_shape(self, other)
    }

    /// The display name of a field, as `hist` lines and `sort=` use it.
    pub fn field_name(f: &HistField) -> String {
        print::field_name(f, 0)
    }
}

/// Byte of `cmd` where `needle` first occurs, 0 when it does not (the kernel's `err_pos`).
pub fn errpos(cmd: &str, needle: &str) -> usize {
    cmd.find(needle).unwrap_or(0)
}

/// C's `strsep`: the text before the first of `delims`, and the rest after it.
fn strsep<'a>(s: &'a str, delims: &[char]) -> (&'a str, Option<&'a str>) {
    match s.find(|c| delims.contains(&c)) {
        Some(k) => (&s[..k], Some(&s[k + 1..])),
        None => (s, None),
    }
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// `kstrtoull(s, 0)`: a whole number in C notation (`0x` hex, `0` octal), one trailing
/// newline allowed.
pub fn kstrtoull(s: &str) -> Option<u64> {
    let s = s.strip_suffix('\n').unwrap_or(s);
    let s = s.strip_prefix('+').unwrap_or(s);
    let (radix, digits) = if let Some(h) = s.strip_prefix("0x").or(s.strip_prefix("0X")) {
        (16, h)
    } else if s.len() > 1 && s.starts_with('0') {
        (8, &s[1..])
    } else {
        (10, s)
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix)?;
        v = v.checked_mul(u64::from(radix))?.checked_add(u64::from(d))?;
    }
    Some(v)
}

/// `size=N` into table bits: rounded up to a power of two, 128 to 131072.
pub fn parse_map_size(s: &str) -> Result<u32, HistError> {
    let size = kstrtoull(s).ok_or(HistError::silent(EINVAL))?;
    if size == 0 {
        return Err(HistError::silent(EINVAL));
    }
    let bits = 64 - (size - 1).leading_zeros();
    let bits = if size == 1 { 0 } else { bits };
    if !(BITS_MIN..=BITS_MAX).contains(&bits) {
        return Err(HistError::silent(EINVAL));
    }
    Ok(bits)
}

struct Parser<'e> {
    env: &'e dyn HistEnv,
    cmd: String,
    attrs: Attrs,
    fields: Vec<HistField>,
    var_defs: Vec<(String, String)>,
    var_refs: Vec<HistField>,
    n_vals: usize,
    n_vars: usize,
    n_keys: usize,
    key_size: usize,
    enable_timestamps: bool,
    actions: Vec<Action>,
    remove: bool,
}

/// Parses the text after `hist:` (what the kernel calls `param_and_filter`) for the event
/// `env` describes. `remove` is set for a `!hist` write (duplicate variables are then
/// not errors, as on the kernel).
pub fn parse(
    param_and_filter: &str,
    env: &dyn HistEnv,
    remove: bool,
) -> Result<HistData, HistError> {
    let cmd = format!("hist:{param_and_filter}");
    if param_and_filter.is_empty() {
        return Err(HistError::silent(EINVAL));
    }
    let (param, filter) = split_filter(param_and_filter)?;
    // The kernel rewrites `.sym-offset` so that its `-` is not taken for a minus.
    let param = param.replace(".sym-offset", ".symXoffset");
    let mut p = Parser {
        env,
        cmd,
        attrs: Attrs::default(),
        fields: Vec::new(),
        var_defs: Vec::new(),
        var_refs: Vec::new(),
        n_vals: 0,
        n_vars: 0,
        n_keys: 0,
        key_size: 0,
        enable_timestamps: false,
        actions: Vec::new(),
        remove,
    };
    p.parse_attrs(&param)?;
    p.parse_actions()?;
    p.parse_var_defs()?;
    p.create_val_fields()?;
    p.create_var_fields()?;
    p.create_key_fields()?;
    let sort_keys = p.create_sort_keys()?;
    p.check_actions()?;
    Ok(HistData {
        fields: p.fields,
        n_vals: p.n_vals,
        n_keys: p.n_keys,
        n_vars: p.n_vars,
        key_size: p.key_size,
        sort_keys,
        attrs: p.attrs,
        actions: p.actions,
        var_refs: p.var_refs,
        enable_timestamps: p.enable_timestamps,
        filter,
        param: param.replace(".symXoffset", ".sym-offset"),
        command: p.cmd,
        remove,
    })
}

/// Separates `param if filter` as the kernel does: the first `if` with a blank before and
/// after it. The filter keeps what follows the one blank after `if`.
fn split_filter(s: &str) -> Result<(String, Option<String>), HistError> {
    let b = s.as_bytes();
    let mut from = 0;
    loop {
        let Some(found) = s[from..].find("if") else {
            return Ok((s.to_string(), None));
        };
        let p = from + found;
        if p == 0 {
            return Err(HistError::silent(EINVAL));
        }
        if b[p - 1] != b' ' && b[p - 1] != b'\t' {
            from = p + 1;
            continue;
        }
        if p + 3 >= b.len() {
            return Err(HistError::silent(EINVAL));
        }
        if b[p + 2] != b' ' && b[p + 2] != b'\t' {
            from = p + 1;
            continue;
        }
        let param = s[..p - 1].trim_matches(is_space).to_string();
        let filter = s[p..].trim_matches(is_space);
        // `if` and one separator, then the filter as the kernel stores it.
        let filter = &filter[3.min(filter.len())..];
        if filter.is_empty() {
            return Err(HistError::silent(EINVAL));
        }
        return Ok((param, Some(filter.to_string())));
    }
}

impl Parser<'_> {
    fn errpos(&self, needle: &str) -> usize {
        errpos(&self.cmd, needle)
    }

    fn err(&self, kind: HistErrorKind, needle: &str) -> HistError {
        HistError::new(kind, self.errpos(needle))
    }

    fn parse_attrs(&mut self, param: &str) -> Result<(), HistError> {
        self.attrs.clock = "global".into();
        let mut rest = Some(param);
        while let Some(text) = rest {
            let (s, next) = strsep(text, &[':']);
            rest = next;
            if let Some(eq) = s.find('=') {
                if s[eq + 1..].is_empty() {
                    return Err(self.err(HistErrorKind::EmptyAssignment, s));
                }
                self.parse_assignment(s)?;
            } else if s == "nohitcount" || s == "NOHC" {
                self.attrs.no_hitcount = true;
            } else if s == "pause" {
                self.attrs.pause = true;
            } else if s == "cont" || s == "continue" {
                self.attrs.cont = true;
            } else if s == "clear" {
                self.attrs.clear = true;
            } else {
                if self.attrs.actions.len() >= ACTIONS_MAX {
                    return Err(HistError::silent(EINVAL));
                }
                if s.starts_with("onmatch(")
                    || s.starts_with("onmax(")
                    || s.starts_with("onchange(")
                {
                    self.attrs.actions.push(s.to_string());
                } else {
                    return Err(HistError::silent(EINVAL));
                }
            }
        }
        if self.attrs.keys_str.is_none() {
            return Err(HistError::silent(EINVAL));
        }
        Ok(())
    }

    fn parse_assignment(&mut self, s: &str) -> Result<(), HistError> {
        let after = |p: &str| s.strip_prefix(p).map(str::to_string);
        if let Some(v) = after("key=").or_else(|| after("keys=")) {
            self.attrs.keys_str = Some(v);
        } else if let Some(v) = after("val=")
            .or_else(|| after("vals="))
            .or_else(|| after("values="))
        {
            self.attrs.vals_str = Some(v);
        } else if let Some(v) = after("sort=") {
            self.attrs.sort_key_str = Some(v);
        } else if let Some(v) = after("name=") {
            self.attrs.name = Some(v);
        } else if let Some(v) = after("clock=") {
            self.attrs.clock = v.trim_matches(is_space).to_string();
        } else if let Some(v) = after("size=") {
            self.attrs.map_bits = parse_map_size(&v)?;
        } else {
            if self.attrs.assignments.len() == VARS_MAX {
                return Err(self.err(HistErrorKind::TooManyVars, s));
            }
            self.attrs.assignments.push(s.to_string());
        }
        Ok(())
    }

    fn parse_actions(&mut self) -> Result<(), HistError> {
        for s in self.attrs.actions.clone() {
            let action = if let Some(rest) = s.strip_prefix("onmatch(") {
                self.onmatch_parse(rest)?
            } else if let Some(rest) = s.strip_prefix("onmax(") {
                self.track_data_parse(rest, true)?
            } else if let Some(rest) = s.strip_prefix("onchange(") {
                self.track_data_parse(rest, false)?
            } else {
                return Err(HistError::silent(EINVAL));
            };
            self.actions.push(action);
        }
        Ok(())
    }

    fn onmatch_parse(&self, s: &str) -> Result<Action, HistError> {
        let (match_event, rest) = strsep(s, &[')']);
        let Some(rest) = rest else {
            return Err(self.err(HistErrorKind::NoClosingParen, match_event));
        };
        let (system, event) = strsep(match_event, &['.']);
        let Some(event) = event else {
            return Err(self.err(HistErrorKind::SubsysNotFound, system));
        };
        if !self.env.event_exists(system, event) {
            return Err(self.err(HistErrorKind::InvalidSubsysEvent, event));
        }
        let handler = Handler::OnMatch {
            system: system.to_string(),
            event: event.to_string(),
        };
        self.action_parse(rest, handler)
    }

    fn track_data_parse(&self, s: &str, max: bool) -> Result<Action, HistError> {
        let (var, rest) = strsep(s, &[')']);
        let Some(rest) = rest else {
            return Err(HistError::silent(EINVAL));
        };
        let var = var.to_string();
        let handler = if max {
            Handler::OnMax { var }
        } else {
            Handler::OnChange { var }
        };
        self.action_parse(rest, handler)
    }

    fn action_parse(&self, s: &str, handler: Handler) -> Result<Action, HistError> {
        let (_, rest) = strsep(s, &['.']);
        let Some(rest) = rest else {
            return Err(HistError::new(HistErrorKind::ActionNotFound, 0));
        };
        let (action_name, rest) = strsep(rest, &['(']);
        let Some(rest) = rest else {
            return Err(HistError::new(HistErrorKind::ActionNotFound, 0));
        };
        let onmatch = matches!(handler, Handler::OnMatch { .. });
        let mut action = Action {
            handler,
            kind: ActionKind::Trace,
            action_name: action_name.to_string(),
            use_trace_keyword: false,
            synth_event_name: None,
            params: Vec::new(),
        };
        let (params, after) = strsep(rest, &[')']);
        if action_name.starts_with("save") {
            self.parse_action_params(params, &mut action)?;
            if onmatch {
                return Err(self.err(HistErrorKind::ActionMismatch, action_name));
            }
            action.kind = ActionKind::Save;
        } else if action_name.starts_with("snapshot") {
            if after.is_none() {
                return Err(self.err(HistErrorKind::NoClosingParen, params));
            }
            if onmatch {
                return Err(self.err(HistErrorKind::ActionMismatch, action_name));
            }
            action.kind = ActionKind::Snapshot;
        } else {
            action.use_trace_keyword = action_name.starts_with("trace");
            self.parse_action_params(params, &mut action)?;
            action.kind = ActionKind::Trace;
        }
        Ok(action)
    }

    fn parse_action_params(&self, params: &str, action: &mut Action) -> Result<(), HistError> {
        let mut rest = Some(params);
        let mut first = true;
        while let Some(text) = rest {
            if action.params.len() >= PARAMS_MAX {
                return Err(HistError::new(HistErrorKind::TooManyParams, 0));
            }
            let (param, next) = strsep(text, &[',']);
            rest = next;
            let param = param.trim_matches(is_space);
            if param.len() < 2 {
                return Err(self.err(HistErrorKind::InvalidParam, param));
            }
            if first && action.use_trace_keyword {
                action.synth_event_name = Some(param.to_string());
                first = false;
                continue;
            }
            first = false;
            action.params.push(param.to_string());
        }
        Ok(())
    }

    fn parse_var_defs(&mut self) -> Result<(), HistError> {
        for assignment in self.attrs.assignments.clone() {
            let mut rest = Some(assignment.as_str());
            for _ in 0..VARS_MAX {
                let Some(text) = rest else { break };
                let (field_str, next) = strsep(text, &[',']);
                rest = next;
                let (var_name, expr) = strsep(field_str, &['=']);
                let Some(expr) = expr else {
                    return Err(self.err(HistErrorKind::MalformedAssignment, var_name));
                };
                if self.var_defs.len() == VARS_MAX {
                    return Err(self.err(HistErrorKind::TooManyVars, var_name));
                }
                self.var_defs.push((var_name.to_string(), expr.to_string()));
            }
        }
        Ok(())
    }

    fn create_val_fields(&mut self) -> Result<(), HistError> {
        let mut hitcount = HistField::new(flags::HITCOUNT);
        hitcount.size = 8;
        hitcount.c_type = "u64".into();
        self.fields.push(hitcount);
        self.n_vals = 1;
        let mut j = 1;
        let mut rest = self.attrs.vals_str.clone();
        let mut i = 0;
        let mut n_hitcount = 0;
        while i < VALS_MAX && j < VALS_MAX {
            let Some(text) = rest.take() else { break };
            let (field_str, next) = strsep(&text, &[',']);
            let field_str = field_str.to_string();
            rest = next.map(str::to_string);
            i += 1;
            // The first `hitcount` is the implicit one; another is a value of its own.
            if field_str == "hitcount" {
                n_hitcount += 1;
                if n_hitcount == 1 {
                    continue;
                }
            }
            self.create_val_field(&field_str, None, 0)?;
            j += 1;
        }
        let result = match rest {
            Some(r) if r != "hitcount" => Err(HistError::silent(EINVAL)),
            _ => Ok(()),
        };
        if j == 1 && self.attrs.no_hitcount {
            return Err(HistError::with_errno(HistErrorKind::NeedNohcVal, 0, ENOENT));
        }
        result
    }

    fn create_val_field(
        &mut self,
        field_str: &str,
        var_name: Option<&str>,
        fl: u32,
    ) -> Result<(), HistError> {
        let mut n_subexprs = 0;
        let f = self.parse_expr(field_str, fl, var_name, &mut n_subexprs)?;
        // Values print sums, so only `.hex` — and `.percent`/`.graph`, which histogram.rst
        // documents for values (`vals=hitcount.percent`) — apply; variables may not be
        // bucketed or drawn. (Mainline's `__create_val_field` also refuses `.percent` and
        // `.graph` on values since its 2023 "values cannot have modifiers" fix, which leaves
        // them usable nowhere; we keep the documented behaviour.)
        let banned = if f.has(flags::VAR) {
            flags::GRAPH | flags::PERCENT | flags::BUCKET | flags::LOG2
        } else {
            flags::BUCKET
                | flags::LOG2
                | flags::SYM
                | flags::SYM_OFFSET
                | flags::SYSCALL
                | flags::STACKTRACE
        };
        if f.flags & banned != 0 {
            return Err(self.err(HistErrorKind::BadFieldModifier, field_str));
        }
        self.fields.push(f);
        self.n_vals += 1;
        Ok(())
    }

    fn create_var_fields(&mut self) -> Result<(), HistError> {
        for (name, expr) in self.var_defs.clone() {
            let defined_here = self
                .fields
                .iter()
                .any(|f| f.var_name.as_deref() == Some(&name));
            if (defined_here || self.env.var_defined_on_event(&name)) && !self.remove {
                return Err(self.err(HistErrorKind::DuplicateVar, &name));
            }
            self.n_vars += 1;
            self.create_val_field(&expr, Some(&name), flags::VAR)?;
            let idx = self.n_vars - 1;
            let f = self.fields.last_mut().expect("just pushed");
            f.var_idx = idx;
            if f.has(flags::EXECNAME) {
                f.flags = flags::STRING | flags::VAR | flags::EXECNAME;
                f.size = STR_MAX;
                f.signed = false;
                f.c_type = "char[]".into();
            }
        }
        Ok(())
    }

    fn create_key_fields(&mut self) -> Result<(), HistError> {
        let mut rest = self.attrs.keys_str.clone();
        let mut key_offset = 0;
        for _ in 0..KEYS_MAX {
            let Some(text) = rest.take() else { break };
            let (field_str, next) = strsep(&text, &[',']);
            let field_str = field_str.to_string();
            rest = next.map(str::to_string);
            let mut n_subexprs = 0;
            // The legacy key `stacktrace` is the stack even on an event with a field of
            // that name, as the kernel's `create_key_field` checks it first.
            let mut f = if field_str == "stacktrace" {
                create_hist_field(None, flags::KEY | flags::STACKTRACE)?
            } else {
                self.parse_expr(&field_str, flags::KEY, None, &mut n_subexprs)?
            };
            if f.has_vars() {
                return Err(self.err(HistErrorKind::InvalidRefKey, &field_str));
            }
            let size = if f.has(flags::STACKTRACE) {
                STACKTRACE_DEPTH * 8
            } else {
                f.size
            };
            let size = (size + 7) & !7;
            f.size = size;
            f.offset = key_offset;
            self.key_size += size;
            if self.key_size > KEY_SIZE_MAX {
                return Err(HistError::silent(EINVAL));
            }
            key_offset += size;
            self.fields.push(f);
            self.n_keys += 1;
        }
        if rest.is_some() {
            return Err(HistError::silent(EINVAL));
        }
        Ok(())
    }

    fn create_sort_keys(&self) -> Result<Vec<SortKey>, HistError> {
        let mut keys = vec![SortKey {
            field_idx: 0,
            descending: false,
        }];
        let Some(text) = self.attrs.sort_key_str.clone() else {
            return Ok(keys);
        };
        let mut rest = Some(text.as_str());
        let mut i = 0;
        while i < SORT_KEYS_MAX {
            let Some(t) = rest else { break };
            let (field_str, next) = strsep(t, &[',']);
            rest = next;
            if field_str.is_empty() {
                return Err(self.err(HistErrorKind::EmptySortField, "sort="));
            }
            if i == SORT_KEYS_MAX - 1 && rest.is_some() {
                return Err(self.err(HistErrorKind::TooManySortFields, "sort="));
            }
            let (field_name, modifier) = strsep(field_str, &['.']);
            if field_name.is_empty() {
                return Err(self.err(HistErrorKind::EmptySortField, "sort="));
            }
            if keys.len() <= i {
                keys.push(SortKey {
                    field_idx: 0,
                    descending: false,
                });
            }
            if field_name == "hitcount" {
                keys[i].descending = self.is_descending(modifier)?;
                i += 1;
                continue;
            }
            let mut k = 1;
            let mut found = false;
            for f in &self.fields[1..] {
                if f.has(flags::VAR) {
                    continue;
                }
                let idx = k;
                k += 1;
                if print::field_name(f, 0) == field_name {
                    keys[i].field_idx = idx;
                    keys[i].descending = self.is_descending(modifier)?;
                    found = true;
                    break;
                }
            }
            if !found {
                return Err(self.err(HistErrorKind::InvalidSortField, field_name));
            }
            i += 1;
        }
        keys.truncate(i.max(1));
        if i == 0 {
            keys[0] = SortKey {
                field_idx: 0,
                descending: false,
            };
        }
        Ok(keys)
    }

    fn is_descending(&self, modifier: Option<&str>) -> Result<bool, HistError> {
        match modifier {
            None => Ok(false),
            Some("descending") => Ok(true),
            Some("ascending") => Ok(false),
            Some(m) => Err(self.err(HistErrorKind::InvalidSortModifier, m)),
        }
    }

    /// Checks the kernel makes when it creates `onmax()`/`onchange()` handlers that need
    /// nothing beyond this trigger.
    fn check_actions(&self) -> Result<(), HistError> {
        for action in &self.actions {
            if let Handler::OnMax { var } | Handler::OnChange { var } = &action.handler {
                let Some(name) = var.strip_prefix('$') else {
                    return Err(self.err(HistErrorKind::OnxNotVar, var));
                };
                if !self
                    .fields
                    .iter()
                    .any(|f| f.var_name.as_deref() == Some(name))
                {
                    return Err(self.err(HistErrorKind::OnxVarNotFound, name));
                }
            }
        }
        Ok(())
    }

    fn parse_expr(
        &mut self,
        s: &str,
        fl: u32,
        var_name: Option<&str>,
        n_subexprs: &mut u32,
    ) -> Result<HistField, HistError> {
        if *n_subexprs > SUBEXPRS_MAX {
            return Err(self.err(HistErrorKind::TooManySubexpr, s));
        }
        let (op, sep) = contains_operator(s);
        match op {
            Op::None => return self.parse_atom(s, fl, var_name),
            Op::UnaryMinus => return self.parse_unary(s, fl, var_name, n_subexprs),
            _ => {}
        }
        *n_subexprs += 1;
        let sep = sep.expect("operator found");
        let (lhs, rhs) = (&s[..sep], &s[sep + 1..]);
        if lhs.is_empty() || rhs.is_empty() {
            return Err(HistError::silent(EINVAL));
        }
        let mut op1 = self.parse_expr(lhs, 0, None, n_subexprs)?;
        if op1.has(flags::STRING) {
            return Err(self.err(HistErrorKind::InvalidStrOperand, lhs));
        }
        let mut op2 = self.parse_expr(rhs, 0, None, n_subexprs)?;
        if op2.has(flags::STRING) {
            return Err(self.err(HistErrorKind::InvalidStrOperand, rhs));
        }
        // Timestamp units must agree (a variable counts with its definition's flags).
        let eff = |f: &HistField| -> (u32, Option<u64>) {
            match &f.var_ref {
                Some(t) if f.has(flags::VAR_REF | flags::ALIAS) => (t.var_flags, t.constant),
                _ => (f.flags, f.has(flags::CONST).then_some(f.constant)),
            }
        };
        let (f1, c1) = eff(&op1);
        let (f2, c2) = eff(&op2);
        if (f1 & flags::TIMESTAMP_USECS) != (f2 & flags::TIMESTAMP_USECS) {
            return Err(HistError::new(HistErrorKind::TimestampMismatch, 0));
        }
        let combine = f1 & f2 & flags::CONST != 0;
        let mut expr = HistField::new(
            fl | if combine { flags::CONST } else { flags::EXPR }
                | (op1.flags & (flags::TIMESTAMP | flags::TIMESTAMP_USECS)),
        );
        expr.var_name = var_name.map(str::to_string);
        op1.read_once = true;
        op2.read_once = true;
        if op == Op::Div && f2 & flags::CONST != 0 {
            let divisor = c2.unwrap_or(0);
            if divisor == 0 {
                return Err(HistError::with_errno(
                    HistErrorKind::DivisionByZero,
                    self.errpos(rhs),
                    EDOM,
                ));
            }
            op2.constant = divisor;
            expr.div = div_by(divisor);
        }
        expr.operator = op;
        if combine {
            let a = c1.unwrap_or(0);
            let b = c2.unwrap_or(0);
            expr.constant = eval_op(op, expr.div, a, b);
            expr.size = 8;
            expr.c_type = "u64".into();
            expr.operator = Op::None;
            expr.name = print::expr_str(&expr);
            return Ok(expr);
        }
        expr.size = op1.size;
        expr.signed = op1.signed;
        expr.c_type = op1.c_type.clone();
        expr.operands = vec![op1, op2];
        expr.name = print::expr_str(&expr);
        Ok(expr)
    }

    fn parse_unary(
        &mut self,
        s: &str,
        fl: u32,
        var_name: Option<&str>,
        n_subexprs: &mut u32,
    ) -> Result<HistField, HistError> {
        *n_subexprs += 1;
        if *n_subexprs > SUBEXPRS_MAX {
            return Err(self.err(HistErrorKind::TooManySubexpr, s));
        }
        let s = &s[1..];
        if !s.contains('(') {
            return Err(HistError::silent(EINVAL));
        }
        let s = &s[1..];
        let Some(close) = s.rfind(')') else {
            return Err(HistError::silent(EINVAL));
        };
        if close + 1 != s.len() {
            return Err(self.err(HistErrorKind::UnaryMinusSubexpr, s));
        }
        let inner = &s[..close];
        let op1 = self.parse_expr(inner, 0, None, n_subexprs)?;
        if op1.has(flags::STRING) {
            return Err(self.err(HistErrorKind::InvalidStrOperand, s));
        }
        let mut expr = HistField::new(
            fl | flags::EXPR | (op1.flags & (flags::TIMESTAMP | flags::TIMESTAMP_USECS)),
        );
        expr.var_name = var_name.map(str::to_string);
        expr.operator = Op::UnaryMinus;
        expr.size = op1.size;
        expr.signed = op1.signed;
        expr.c_type = op1.c_type.clone();
        expr.operands = vec![op1];
        expr.name = print::expr_str(&expr);
        Ok(expr)
    }

    fn parse_atom(
        &mut self,
        s: &str,
        fl: u32,
        var_name: Option<&str>,
    ) -> Result<HistField, HistError> {
        if s.as_bytes().first().is_some_and(u8::is_ascii_digit) {
            let Some(constant) = kstrtoull(s) else {
                return Err(self.err(HistErrorKind::ExpectNumber, s));
            };
            let mut f = HistField::new(fl | flags::CONST);
            f.constant = constant;
            f.size = 8;
            f.c_type = "u64".into();
            f.var_name = var_name.map(str::to_string);
            return Ok(f);
        }
        let (mut system, mut event, mut var) = (None, None, s);
        if let Some(d1) = s.find('.') {
            if let Some(d2) = s[d1 + 1..].find('.') {
                let d2 = d1 + 1 + d2;
                system = Some(&s[..d1]);
                event = Some(&s[d1 + 1..d2]);
                var = &s[d2 + 1..];
            }
        }
        let local = self.local_field_var_ref(system, event, var);
        let text = match local {
            Some(text) => text,
            None => {
                if let Some(r) = self.parse_var_ref(system, event, var)? {
                    if let Some(name) = var_name {
                        let mut alias = HistField::new(fl | flags::ALIAS | flags::VAR);
                        alias.var_name = Some(name.to_string());
                        alias.size = r.size;
                        alias.signed = r.signed;
                        alias.c_type = r.c_type.clone();
                        alias.name = r.name.clone();
                        alias.var_ref = r.var_ref.clone();
                        alias.var_ref_idx = r.var_ref_idx;
                        alias.flags |= r.flags & (flags::TIMESTAMP | flags::TIMESTAMP_USECS);
                        alias.operands = vec![r];
                        return Ok(alias);
                    }
                    return Ok(r);
                }
                var.to_string()
            }
        };
        self.parse_field(&text, fl, var_name)
    }

    fn local_field_var_ref(
        &self,
        system: Option<&str>,
        event: Option<&str>,
        var: &str,
    ) -> Option<String> {
        if let (Some(system), Some(event)) = (system, event) {
            let (sys, ev) = self.env.event();
            if system != sys || event != ev {
                return None;
            }
        }
        let name = var.strip_prefix('$').filter(|n| !n.is_empty())?;
        self.var_defs
            .iter()
            .find(|(n, e)| n == name && contains_operator(e).0 == Op::None && !is_var_ref(e))
            .map(|(_, e)| e.clone())
    }

    fn parse_var_ref(
        &mut self,
        system: Option<&str>,
        event: Option<&str>,
        var: &str,
    ) -> Result<Option<HistField>, HistError> {
        if !is_var_ref(var) {
            return Ok(None);
        }
        let name = &var[1..];
        let onmatch: Vec<(&str, &str)> = self
            .actions
            .iter()
            .filter_map(|a| match &a.handler {
                Handler::OnMatch { system, event } => Some((system.as_str(), event.as_str())),
                _ => None,
            })
            .collect();
        let found = self.env.find_var(system, event, name, &onmatch)?;
        let Some(target) = found else {
            return Err(self.err(HistErrorKind::VarNotFound, name));
        };
        Ok(Some(self.create_var_ref(target, system, event, name)))
    }

    /// A reference to a variable, shared with earlier references to the same variable.
    fn create_var_ref(
        &mut self,
        target: VarTarget,
        system: Option<&str>,
        event: Option<&str>,
        name: &str,
    ) -> HistField {
        if let Some(existing) = self.var_refs.iter().find(|r| {
            r.var_ref
                .as_ref()
                .is_some_and(|t| t.hist == target.hist && t.idx == target.idx)
        }) {
            return existing.clone();
        }
        let mut r = HistField::new(
            flags::VAR_REF | (target.ts_flags & (flags::TIMESTAMP | flags::TIMESTAMP_USECS)),
        );
        r.size = target.size;
        r.signed = target.signed;
        r.c_type = target.c_type.clone();
        r.system = system.map(str::to_string);
        r.event = event.map(str::to_string);
        r.name = Some(name.to_string());
        r.var_ref_idx = self.var_refs.len();
        r.var_ref = Some(target);
        self.var_refs.push(r.clone());
        r
    }

    fn parse_field(
        &mut self,
        s: &str,
        fl: u32,
        var_name: Option<&str>,
    ) -> Result<HistField, HistError> {
        let mut fl = fl;
        let mut buckets = 0;
        let (field_name, modifier) = strsep(s, &['.']);
        if let Some(m) = modifier {
            let bad = |needle: &str| Err(self.err(HistErrorKind::BadFieldModifier, needle));
            match m {
                "hex" => fl |= flags::HEX,
                "sym" => fl |= flags::SYM,
                "symXoffset" => fl |= flags::SYM_OFFSET,
                "execname" if field_name == "common_pid" => fl |= flags::EXECNAME,
                "syscall" => fl |= flags::SYSCALL,
                "log2" => fl |= flags::LOG2,
                "usecs" => fl |= flags::TIMESTAMP_USECS,
                "stacktrace" => fl |= flags::STACKTRACE,
                m if m.starts_with("bucket") => {
                    let rest = &m[6..];
                    let rest = rest.strip_prefix('s').unwrap_or(rest);
                    let Some(n) = rest.strip_prefix('=') else {
                        return bad(rest);
                    };
                    match kstrtoull(n) {
                        Some(v) if v != 0 => buckets = v,
                        _ => return bad(n),
                    }
                    fl |= flags::BUCKET;
                }
                m if m.starts_with("percent") => {
                    if fl & (flags::VAR | flags::KEY) != 0 {
                        return bad(m);
                    }
                    fl |= flags::PERCENT;
                }
                m if m.starts_with("graph") => {
                    if fl & (flags::VAR | flags::KEY) != 0 {
                        return bad(m);
                    }
                    fl |= flags::GRAPH;
                }
                m => return bad(m),
            }
        }
        let mut field = None;
        match field_name {
            "common_timestamp" => {
                fl |= flags::TIMESTAMP;
                self.enable_timestamps = true;
                if fl & flags::TIMESTAMP_USECS != 0 {
                    self.attrs.ts_in_usecs = true;
                }
            }
            "common_stacktrace" => fl |= flags::STACKTRACE,
            "common_cpu" => fl |= flags::CPU,
            "common_comm" => fl |= flags::COMM | flags::STRING,
            "hitcount" => fl |= flags::HITCOUNT,
            name => match self.env.field(name).filter(|f| f.size != 0) {
                Some(f) => field = Some(f),
                None => match name {
                    "cpu" | "CPU" => fl |= flags::CPU,
                    "stacktrace" | "STACKTRACE" => fl |= flags::STACKTRACE,
                    _ => return Err(self.err(HistErrorKind::FieldNotFound, name)),
                },
            },
        }
        let mut f = create_hist_field(field, fl)?;
        f.buckets = buckets;
        f.var_name = var_name.map(str::to_string);
        Ok(f)
    }
}

/// The kernel's `create_hist_field` for an atom: sizes and types by what it reads.
fn create_hist_field(field: Option<EventField>, fl: u32) -> Result<HistField, HistError> {
    let mut f = HistField::new(fl);
    if fl & flags::HITCOUNT != 0 {
        f.size = 8;
        f.c_type = "u64".into();
    } else if fl & flags::STACKTRACE != 0 {
        f.size = STACKTRACE_DEPTH * 8;
        f.c_type = "unsigned long[]".into();
    } else if fl & (flags::LOG2 | flags::BUCKET) != 0 {
        let inner = create_hist_field(field.clone(), fl & !(flags::LOG2 | flags::BUCKET))?;
        f.size = inner.size;
        f.signed = inner.signed;
        f.c_type = inner.c_type.clone();
        f.operands = vec![inner];
    } else if fl & flags::TIMESTAMP != 0 {
        f.size = 8;
        f.c_type = "u64".into();
    } else if fl & flags::CPU != 0 {
        f.size = 4;
        f.c_type = "unsigned int".into();
    } else if fl & flags::COMM != 0 {
        f.size = STR_MAX;
        f.c_type = "char[]".into();
    } else if let Some(ef) = &field {
        if ef.is_hist_string() {
            f.flags |= flags::STRING;
            f.c_type = ef.c_type.clone();
            f.size = if ef.class() == FieldClass::StaticString {
                ef.size
            } else {
                STR_MAX
            };
        } else {
            if !matches!(ef.size, 1 | 2 | 4 | 8) {
                return Err(HistError::silent(ENOMEM));
            }
            f.size = ef.size;
            f.signed = ef.signed;
            f.c_type = ef.c_type.clone();
        }
    }
    f.field = field;
    Ok(f)
}

fn is_var_ref(s: &str) -> bool {
    s.len() >= 2 && s.starts_with('$')
}

/// The root operator of `s` and where it is, as the kernel's `contains_operator`: the
/// rightmost `+`/`-` first (so evaluation goes left to right), else the rightmost `*`/`/`;
/// a `-` at the very start is a unary minus.
pub fn contains_operator(s: &str) -> (Op, Option<usize>) {
    let minus = s.rfind('-');
    if minus == Some(0) {
        return (Op::UnaryMinus, Some(0));
    }
    let plus = s.rfind('+');
    if plus.is_some() || minus.is_some() {
        return if plus > minus {
            (Op::Plus, plus)
        } else {
            (Op::Minus, minus)
        };
    }
    let div = s.rfind('/');
    let mult = s.rfind('*');
    if mult > div {
        return (Op::Mult, mult);
    }
    if div.is_some() {
        return (Op::Div, div);
    }
    (Op::None, None)
}

/// How the kernel divides by the constant `d` (nonzero).
pub fn div_by(d: u64) -> DivBy {
    if d & (d - 1) == 0 {
        DivBy::Shift(d.trailing_zeros())
    } else if d > (1 << DIV_SHIFT) {
        DivBy::Const(d)
    } else {
        DivBy::MultShift {
            mult: (1u64 << DIV_SHIFT) / d,
            divisor: d,
        }
    }
}

/// Applies `op` the way the kernel's hist functions do (wrapping; `x/0` is `u64::MAX`).
#[inline]
pub fn eval_op(op: Op, div: DivBy, a: u64, b: u64) -> u64 {
    match op {
        Op::Plus => a.wrapping_add(b),
        Op::Minus => a.wrapping_sub(b),
        Op::Mult => a.wrapping_mul(b),
        Op::UnaryMinus => (a as i64).wrapping_neg() as u64,
        Op::Div => match div {
            DivBy::Shift(s) => a >> s,
            DivBy::Const(d) => a / d,
            DivBy::MultShift { mult, divisor } => {
                if a < (1 << DIV_SHIFT) {
                    (a * mult + ((1 << DIV_SHIFT) - 1)) >> DIV_SHIFT
                } else {
                    a / divisor
                }
            }
            DivBy::Runtime => {
                if b == 0 {
                    u64::MAX
                } else if b & (b - 1) == 0 {
                    a >> b.trailing_zeros()
                } else {
                    a / b
                }
            }
        },
        Op::None => a,
    }
}

#[cfg(test)]
mod tests;
