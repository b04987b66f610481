//! Dynamic events: the `dynamic_events` file (fprobetrace.rst, eprobetrace.rst).
//!
//! A line written to `dynamic_events` is parsed and compiled by `ustrace_probe` into a
//! definition and a flat fetch program; here it becomes an event like any other — registered,
//! given an id and a file in every instance, with `enable`, `filter`, `trigger` and
//! `format` — whose records are produced by what the definition attaches to:
//!
//! ```text
//!  f SYM / f SYM%return ──> an fprobe (ustrace-fprobe) on SYM: entry handler, or entry
//!                           (saving the entry args an exit probe reads) + exit handler
//!  t TRACEPOINT         ──> a raw probe on the tracepoint: its arguments as words
//!  e SYS.EVENT          ──> a record hook on SYS.EVENT in the same instance: runs on every
//!                           record of it (filtered by `if FILTER`), even while it is off
//!          │
//!          ▼  the probe: wants_record? ─> size the record ─> EventFile::record: run the
//!             fetch program into it (no allocation, faults become the kernel's marks)
//! ```
//!
//! Nothing is attached until the event is enabled (or a trigger holds it in soft mode), as
//! with static events. A definition that names something missing fails when written, with
//! the kernel's error message in `error_log`.
//!
//! An `f` or `t` line that names an event of the same kind that already exists appends a
//! probe to it (the kernel's `trace_probe_append`): the event then records from every one
//! of its probes, which must agree in direction (entry or exit), kind and arguments (name,
//! type, count), and may not repeat a probe it has. `dynamic_events` lists each probe on
//! its own line, and `-:EVENT TARGET ...` removes one of them.

use std::sync::{Arc, Mutex, Weak};

use ustrace_ctl::vfs::{Errno, OpenFile, OpenFlags};
use ustrace_fprobe::{EntryAction, Fprobe, FprobeBuilder, PtRegs};
use ustrace_probe::{
    parse_command, DirectSrc, DynCommand, Errno as ProbeErrno, ErrorId, FetchContext, FieldSpec,
    ProbeDefinition, ProbeEnv, ProbeKind, Program,
};

use crate::event::{registry, Attachment, EventClass, EventId, FieldDesc, FieldKind};
use crate::event_file::EventFile;
use crate::trace::tracing;
use crate::tracefs::files::TextFile;

/// A dynamic event's class: its probes (one, or more appended) and what they share.
pub struct DynEvent {
    group: String,
    name: String,
    fields: Vec<FieldDesc>,
    /// The first probe's program: every probe of the event lays records out the same way,
    /// so this one formats and prints them.
    program: Arc<Program>,
    /// The first probe's definition, the one [`EventClass::render_line`] names fields by.
    first: ProbeDefinition,
    /// For eprobes: the source event's id.
    source: Option<EventId>,
    state: Mutex<ProbeState>,
}

/// The probes of an event and the event files they are attached to. Held only on the
/// control path (enabling, appending, removing).
#[derive(Default)]
struct ProbeState {
    probes: Vec<Arc<Probe>>,
    live: Vec<Weak<LiveAttachment>>,
}

/// One probe of a dynamic event.
struct Probe {
    definition: ProbeDefinition,
    program: Arc<Program>,
    /// Where `dynamic_events` lists it: the kernel lists probes in the order they were
    /// added, so an appended probe comes after the newest event of its time.
    order: (EventId, u64),
}

/// An event's probes attached to one event file; appended probes join it.
struct LiveAttachment {
    file: Arc<EventFile>,
    parts: Mutex<Vec<(Arc<Probe>, Attached)>>,
}

/// What [`EventClass::attach`] hands the event file.
struct AttachHandle(Arc<LiveAttachment>);

impl Attachment for AttachHandle {
    fn detach(self: Box<Self>) {
        let parts = std::mem::take(&mut *self.0.parts.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, part) in parts {
            Box::new(part).detach();
        }
    }
}

impl DynEvent {
    /// The definition of the event's first probe.
    pub fn definition(&self) -> ProbeDefinition {
        self.first.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ProbeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the `f`/`t` probes of `definition` may join this event's, and if not the
    /// kernel's error (`append_trace_fprobe`).
    fn check_append(&self, definition: &ProbeDefinition) -> Result<(), ustrace_probe::ProbeError> {
        let exist = |id, index| Err(definition.error(id, index, 0, ProbeErrno::Exist));
        let is_return = |k: ProbeKind| k == ProbeKind::Fexit;
        let is_tracepoint = |k: ProbeKind| k == ProbeKind::Tracepoint;
        let first = &self.first;
        if is_return(first.kind) != is_return(definition.kind)
            || is_tracepoint(first.kind) != is_tracepoint(definition.kind)
        {
            return exist(ErrorId::DIFF_PROBE_TYPE, 0);
        }
        if let Some(position) = differing_arg(&definition.args, &first.args) {
            // Arguments start at word 2 of the command; `position` counts from 1.
            return exist(ErrorId::DIFF_ARG_TYPE, position + 1);
        }
        let same = self.state().probes.iter().any(|p| {
            p.definition.target == definition.target
                && p.definition
                    .args
                    .iter()
                    .zip(&definition.args)
                    .all(|(a, b)| a.comm == b.comm)
        });
        if same {
            return exist(ErrorId::SAME_PROBE, 0);
        }
        Ok(())
    }

    /// Attaches one probe to `file`.
    fn attach_probe(&self, probe: &Probe, file: Arc<EventFile>) -> Result<Attached, Errno> {
        let program = probe.program.clone();
        let definition = &probe.definition;
        match definition.kind {
            ProbeKind::Fentry => {
                let plan = RegisterPlan::of(&program);
                // Up to six whole words in argument order (`a=$arg1 b=$arg2`): the record's
                // length and offsets are constants of the handler.
                let fixed = plan.as_ref().and_then(|p| fixed_words_builder(&file, p));
                let builder = match (fixed, plan) {
                    (Some(builder), _) => builder,
                    // Every argument a register or a constant: the hit copies words.
                    (None, Some(plan)) => Fprobe::builder().entry_handler(
                        move |_fp, entry_ip, _ret_ip, regs, _data| {
                            // Read before the record path writes the header, which could
                            // alias the plan for all the compiler knows: then the check
                            // below folds against the reservation's own length.
                            let (plan, len) = (&plan, plan.len());
                            // Everything by value, so that `len` stays the value the
                            // reservation was asked for.
                            let fill = move |record: &mut [u8]| {
                                if record.len() >= len {
                                    // SAFETY: `len` is the plan's length.
                                    unsafe { plan.store_unchecked(entry_ip as u64, regs, record) }
                                }
                            };
                            record_register_event(&file, len, fill);
                            EntryAction::Continue
                        },
                    ),
                    (None, None) => Fprobe::builder().entry_handler(
                        move |_fp, entry_ip, _ret_ip, regs, _data| {
                            let ctx = HitContext {
                                regs: Some(regs),
                                ip: entry_ip as u64,
                                ..HitContext::empty()
                            };
                            emit(&file, &program, &ctx);
                            EntryAction::Continue
                        },
                    ),
                };
                let fp = builder
                    .register_ips(&fprobe_targets(&definition.target)?)
                    .map_err(fprobe_errno)?;
                Ok(Attached::Fprobe(Some(fp)))
            }
            ProbeKind::Fexit => {
                let entry_words = program.entry_data_size() / 8;
                let saver = program.clone();
                let mut builder = Fprobe::builder();
                if definition.maxactive > 0 {
                    builder = builder.nr_maxactive(definition.maxactive);
                }
                let fp = builder
                    .entry_data_size(program.entry_data_size().max(8))
                    .entry_handler(move |_fp, entry_ip, _ret_ip, regs, data| {
                        if entry_words > 0 {
                            let ctx = HitContext {
                                regs: Some(regs),
                                ip: entry_ip as u64,
                                ..HitContext::empty()
                            };
                            let mut words = [0u64; 16];
                            let n = entry_words.min(words.len());
                            saver.save_entry(&ctx, &mut words[..n]);
                            for (chunk, w) in data.chunks_exact_mut(8).zip(&words[..n]) {
                                chunk.copy_from_slice(&w.to_ne_bytes());
                            }
                        }
                        EntryAction::Continue
                    })
                    .exit_handler(move |_fp, entry_ip, ret_ip, regs, data| {
                        let mut words = [0u64; 16];
                        let n = entry_words.min(words.len());
                        for (w, chunk) in words[..n].iter_mut().zip(data.chunks_exact(8)) {
                            *w = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
                        }
                        let ctx = HitContext {
                            regs: Some(regs),
                            entry: &words[..n],
                            ip: entry_ip as u64,
                            ret_ip: ret_ip as u64,
                            ..HitContext::empty()
                        };
                        emit(&file, &program, &ctx);
                    })
                    .register_ips(&fprobe_targets(&definition.target)?)
                    .map_err(fprobe_errno)?;
                Ok(Attached::Fprobe(Some(fp)))
            }
            ProbeKind::Tracepoint => {
                let tp = crate::tracepoint::find(&definition.target).ok_or(Errno::ENOENT)?;
                let register = tp.info().register_raw.ok_or(Errno::EINVAL)?;
                // The kernel records the address of the tracepoint's probe stub
                // (`__probestub_NAME`), the function its tprobe hooks. Here the function
                // that hands the tracepoint's arguments to raw probes plays that part:
                // the tracepoint's own `register_raw`, which names the tracepoint.
                let stub = register as usize as u64;
                let id = register(
                    0,
                    Arc::new(move |words: &[u64]| {
                        let ctx = HitContext {
                            words,
                            ip: stub,
                            ..HitContext::empty()
                        };
                        emit(&file, &program, &ctx);
                    }),
                );
                Ok(Attached::Tracepoint(tp, id))
            }
            ProbeKind::Eprobe => {
                let instance = crate::trace::instance_of(&file).ok_or(Errno::ENODEV)?;
                let source = instance
                    .file(self.source.ok_or(Errno::ENOENT)?)
                    .ok_or(Errno::ENOENT)?;
                let filter = match &definition.filter {
                    Some(text) => Some(crate::filter::compile_for(&instance, &source.event, text)?),
                    None => None,
                };
                let id = crate::trigger::add_hook(
                    &source,
                    filter,
                    Arc::new(move |record: &[u8]| {
                        let ctx = RecordContext {
                            record,
                            comm: std::cell::OnceCell::new(),
                        };
                        emit(&file, &program, &ctx);
                    }),
                )?;
                Ok(Attached::Hook(source, id))
            }
            ProbeKind::Uprobe | ProbeKind::Uretprobe => Err(Errno::EINVAL),
        }
    }
}

/// The first argument (counted from 1) whose name, type or count differs, or where one
/// list ends before the other (the kernel's `trace_probe_compare_arg_type`).
fn differing_arg(a: &[ustrace_probe::ArgDef], b: &[ustrace_probe::ArgDef]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()) + 1);
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| x.name != y.name || x.ty != y.ty || x.count != y.count)
        .map(|i| i + 1)
}
/// Dynamic events in creation order.
static DYNAMIC: Mutex<Vec<(EventId, Arc<DynEvent>)>> = Mutex::new(Vec::new());

fn to_desc(spec: &FieldSpec) -> FieldDesc {
    let kind = match spec.kind {
        ustrace_probe::FieldKind::Int => FieldKind::Int,
        ustrace_probe::FieldKind::IntArray { elem_size, len } => {
            FieldKind::IntArray { elem_size, len }
        }
        ustrace_probe::FieldKind::CharArray => FieldKind::CharArray,
        ustrace_probe::FieldKind::DynString => FieldKind::DynString,
        ustrace_probe::FieldKind::DynBytes => FieldKind::DynBytes,
        ustrace_probe::FieldKind::TailString => FieldKind::TailString,
        ustrace_probe::FieldKind::StringPtr => FieldKind::StringPtr,
    };
    FieldDesc {
        name: spec.name.clone().into(),
        c_type: spec.c_type.clone().into(),
        offset: spec.offset,
        size: spec.size,
        signed: spec.signed,
        kind,
    }
}

fn to_spec(desc: &FieldDesc) -> FieldSpec {
    let kind = match desc.kind {
        FieldKind::Int => ustrace_probe::FieldKind::Int,
        FieldKind::IntArray { elem_size, len } => {
            ustrace_probe::FieldKind::IntArray { elem_size, len }
        }
        FieldKind::CharArray => ustrace_probe::FieldKind::CharArray,
        FieldKind::DynString => ustrace_probe::FieldKind::DynString,
        FieldKind::DynBytes => ustrace_probe::FieldKind::DynBytes,
        FieldKind::TailString => ustrace_probe::FieldKind::TailString,
        FieldKind::StringPtr => ustrace_probe::FieldKind::StringPtr,
    };
    FieldSpec {
        name: desc.name.to_string(),
        c_type: desc.c_type.to_string(),
        offset: desc.offset,
        size: desc.size,
        signed: desc.signed,
        kind,
    }
}

/// What a definition may name: this process's functions, debug info, tracepoints, events.
struct CoreEnv {
    inspect: ustrace_probe::InspectEnv,
}

impl ProbeEnv for CoreEnv {
    fn function_info(&self, name: &str) -> Option<ustrace_inspect::debuginfo::FunctionInfo> {
        self.inspect.function_info(name)
    }
    /// A `t` probe's target is a tracepoint, not a function: its signature comes from the
    /// tracepoint's declaration.
    fn tracepoint_info(&self, name: &str) -> Option<ustrace_inspect::debuginfo::FunctionInfo> {
        tracepoint_signature(crate::tracepoint::find(name)?.info())
    }
    fn has_tracepoint(&self, name: &str) -> bool {
        crate::tracepoint::find(name).is_some()
    }
    fn event_fields(&self, system: &str, event: &str) -> Option<Vec<FieldSpec>> {
        let event = registry().find(system, event)?;
        Some(event.all_fields().iter().map(to_spec).collect())
    }
    fn resolve_symbol(&self, name: &str) -> Option<u64> {
        self.inspect.resolve_symbol(name)
    }
}

/// A tracepoint's signature as the probe parser sees a function's, built from the
/// declaration (`["key: &str", "hit: bool"]`) so `t` probes can name arguments. Integers and
/// `bool` keep their type; references and pointers are pointers to an opaque type (members
/// cannot be named without debug info; `+OFFS(name)` reads them); `&str` and slices occupy
/// two raw words, the address (`name`) and the length (`name_len`), as [`RawArg`] passes them.
///
/// [`RawArg`]: crate::tracepoint::RawArg
fn tracepoint_signature(
    info: &crate::tracepoint::TracepointInfo,
) -> Option<ustrace_inspect::debuginfo::FunctionInfo> {
    use ustrace_inspect::debuginfo::{
        BaseEncoding, FunctionInfo, Param, TypeKind, TypeNode, TypeTable,
    };
    let mut types = TypeTable::default();
    let mut params = Vec::new();
    let mut slot = 0usize;
    let base = |types: &mut TypeTable, name: &str, size: u64, encoding: BaseEncoding| {
        types.push(TypeNode {
            name: Some(name.into()),
            size: Some(size),
            kind: TypeKind::Base(encoding),
        })
    };
    for decl in info.args {
        let (name, ty) = decl.split_once(':')?;
        let (name, ty) = (name.trim(), ty.trim());
        let integer = match ty {
            "u8" | "bool" => Some(("u8", 1, BaseEncoding::Unsigned)),
            "u16" => Some(("u16", 2, BaseEncoding::Unsigned)),
            "u32" | "char" => Some(("u32", 4, BaseEncoding::Unsigned)),
            "u64" | "usize" => Some(("u64", 8, BaseEncoding::Unsigned)),
            "i8" => Some(("s8", 1, BaseEncoding::Signed)),
            "i16" => Some(("s16", 2, BaseEncoding::Signed)),
            "i32" => Some(("s32", 4, BaseEncoding::Signed)),
            "i64" | "isize" => Some(("s64", 8, BaseEncoding::Signed)),
            _ => None,
        };
        if let Some((c_name, size, encoding)) = integer {
            let ty = base(&mut types, c_name, size, encoding);
            params.push(Param {
                name: name.into(),
                ty,
                abi_index: Some(slot),
            });
            slot += 1;
            continue;
        }
        let sized = ty.trim_start_matches('&').trim_start_matches("mut ").trim();
        let (pointee, with_len) = if sized == "str" {
            (
                base(&mut types, "char", 1, BaseEncoding::Char { signed: false }),
                true,
            )
        } else if sized.starts_with('[') {
            (base(&mut types, "u8", 1, BaseEncoding::Unsigned), true)
        } else {
            let opaque = sized
                .trim_start_matches("*const ")
                .trim_start_matches("*mut ");
            (
                types.push(TypeNode {
                    name: Some(opaque.into()),
                    size: None,
                    kind: TypeKind::Struct(Vec::new()),
                }),
                false,
            )
        };
        let pointer = types.push(TypeNode {
            name: None,
            size: Some(8),
            kind: TypeKind::Pointer(pointee),
        });
        params.push(Param {
            name: name.into(),
            ty: pointer,
            abi_index: Some(slot),
        });
        slot += 1;
        if with_len {
            let len = base(&mut types, "u64", 8, BaseEncoding::Unsigned);
            params.push(Param {
                name: format!("{name}_len"),
                ty: len,
                abi_index: Some(slot),
            });
            slot += 1;
        }
    }
    Some(FunctionInfo {
        name: info.name.into(),
        params,
        ret: None,
        types,
        source: Arc::from("tracepoint declaration"),
    })
}

/// What a probe hit offers the fetch program.
struct HitContext<'a> {
    regs: Option<&'a PtRegs>,
    /// Raw tracepoint arguments (`t` probes).
    words: &'a [u64],
    record: &'a [u8],
    entry: &'a [u64],
    ip: u64,
    ret_ip: u64,
    /// The thread's name, looked up only if the program reads `$comm`.
    comm: std::cell::OnceCell<[u8; 16]>,
}

impl HitContext<'_> {
    /// A hit that offers nothing but the thread's name; callers fill in what they have.
    fn empty() -> HitContext<'static> {
        HitContext {
            regs: None,
            words: &[],
            record: &[],
            entry: &[],
            ip: 0,
            ret_ip: 0,
            comm: std::cell::OnceCell::new(),
        }
    }
}

impl FetchContext for HitContext<'_> {
    #[inline]
    fn arg(&self, n: usize) -> u64 {
        match self.regs {
            Some(regs) => regs.arg(n).unwrap_or(0),
            None => self.words.get(n).copied().unwrap_or(0),
        }
    }
    fn register(&self, name: &str) -> Option<u64> {
        let r = self.regs?;
        Some(regs_words(r)[register_word(name)?])
    }
    fn stack_pointer(&self) -> u64 {
        self.regs.map_or(0, |r| r.sp)
    }
    fn return_value(&self) -> u64 {
        self.regs.map_or(0, |r| r.ax)
    }
    fn comm(&self) -> &[u8] {
        self.comm.get_or_init(crate::thread::current_comm_bytes)
    }
    fn event_record(&self) -> &[u8] {
        self.record
    }
    fn entry_data(&self) -> &[u64] {
        self.entry
    }
    #[inline]
    fn probe_ip(&self) -> u64 {
        self.ip
    }
    #[inline]
    fn return_ip(&self) -> u64 {
        self.ret_ip
    }
}

/// Words in [`PtRegs`]: every field is a `u64` (or an array of them), so the frame is an
/// array of words, which is how [`RegisterPlan`] and `%REG` fetches index it.
const PT_REGS_WORDS: usize = std::mem::size_of::<PtRegs>() / 8;
const _: () = assert!(std::mem::size_of::<PtRegs>() == PT_REGS_WORDS * 8);
const _: () = assert!(std::mem::align_of::<PtRegs>() == 8);

/// The saved registers as words.
#[inline(always)]
fn regs_words(regs: &PtRegs) -> &[u64; PT_REGS_WORDS] {
    // SAFETY: `PtRegs` is `repr(C)` with only `u64` fields and arrays of them, so it has no
    // padding, is 8-aligned and exactly `PT_REGS_WORDS` initialized words (asserted above).
    unsafe { &*(regs as *const PtRegs).cast::<[u64; PT_REGS_WORDS]>() }
}

/// The word of [`PtRegs`] that holds register `name` (the kernel's names, with or without
/// the `r` of the 64-bit ones), as `%REG` reads it; `None` for a name it does not capture.
fn register_word(name: &str) -> Option<usize> {
    use std::mem::offset_of;
    let offset = match name {
        "ax" | "rax" => offset_of!(PtRegs, ax),
        "bx" | "rbx" => offset_of!(PtRegs, bx),
        "cx" | "rcx" => offset_of!(PtRegs, cx),
        "dx" | "rdx" => offset_of!(PtRegs, dx),
        "si" | "rsi" => offset_of!(PtRegs, si),
        "di" | "rdi" => offset_of!(PtRegs, di),
        "bp" | "rbp" => offset_of!(PtRegs, bp),
        "sp" | "rsp" => offset_of!(PtRegs, sp),
        "ip" | "rip" => offset_of!(PtRegs, ip),
        "r8" => offset_of!(PtRegs, r8),
        "r9" => offset_of!(PtRegs, r9),
        "r10" => offset_of!(PtRegs, r10),
        "r11" => offset_of!(PtRegs, r11),
        "r12" => offset_of!(PtRegs, r12),
        "r13" => offset_of!(PtRegs, r13),
        "r14" => offset_of!(PtRegs, r14),
        "r15" => offset_of!(PtRegs, r15),
        "flags" => offset_of!(PtRegs, flags),
        "orig_ax" => offset_of!(PtRegs, orig_ax),
        _ => return None,
    };
    Some(offset / 8)
}

/// The registers of the integer arguments [`PtRegs::arg`] reads, by position: past them
/// arguments are on the stack (a fault-safe read, left to the program).
const ARG_REGISTERS: [&str; 6] = ["di", "si", "dx", "cx", "r8", "r9"];

/// How an `f` entry probe whose arguments are all plain register loads or constants
/// (`a=$arg1 b=$arg2:u32 c=\7`: what [`Program::direct_args`] describes) writes its record,
/// worked out when the probe is attached: the word of the saved registers each value comes
/// from and the record offset it goes to. A hit then moves words, where the program would
/// go through [`FetchContext`] per argument (an `Option` test, a bound check, a table
/// lookup and a dispatch on the size each) from a context built for it. It stores exactly
/// what [`Program::run`] stores (`fast_register_stores_match_the_program` checks both on
/// the same registers).
#[derive(Debug)]
struct RegisterPlan {
    /// Record bytes, common header included: at least [`RegisterPlan::MIN_LEN`].
    len: usize,
    /// Whole words (the usual `$argN`, `x64`), with no dispatch on the size, ended by
    /// [`WideStore::END`] (a loop whose count is not known ahead is not unrolled: for the
    /// few arguments of a probe, unrolling cost more than it saved).
    wide: Box<[WideStore]>,
    /// Whether `narrow` or `consts` has any store: one test on the hit for both.
    rest: bool,
    /// Narrower register values (`:u32`, `:s16`, `:char`).
    narrow: Box<[NarrowStore]>,
    /// Constants (`\VALUE`, `@SYM`) and registers the frame does not hold (0), usually none.
    consts: Box<[ConstStore]>,
}

/// A register word of a [`RegisterPlan`] stored whole.
#[derive(Clone, Copy, Debug)]
struct WideStore {
    /// Index into [`regs_words`], below [`PT_REGS_WORDS`]; [`WideStore::END`] ends the list.
    word: u16,
    /// Record offset (common header included); `at + 8 <= len`.
    at: u16,
}

impl WideStore {
    /// The entry that ends [`RegisterPlan::wide`].
    const END: WideStore = WideStore {
        word: u16::MAX,
        at: 0,
    };
}

/// A register value of a [`RegisterPlan`] stored in fewer bytes.
#[derive(Clone, Copy, Debug)]
struct NarrowStore {
    /// Index into [`regs_words`], below [`PT_REGS_WORDS`].
    word: u16,
    /// Record offset (common header included); `at + size <= len`.
    at: u16,
    /// 1, 2 or 4: the value's low bytes, little-endian.
    size: u8,
}

/// A constant of a [`RegisterPlan`].
#[derive(Clone, Copy, Debug)]
struct ConstStore {
    value: u64,
    /// Record offset (common header included); `at + size <= len`.
    at: u16,
    /// 1, 2, 4 or 8.
    size: u8,
}

impl RegisterPlan {
    /// The shortest record: the common header and `__probe_ip`.
    const MIN_LEN: usize = crate::event::field::COMMON_SIZE + 8;

    /// The plan for `program`, if it is an entry probe's made only of loads from the
    /// registers [`HitContext`] reads directly (`$argN` of the first six, `%REG`,
    /// `$stack`) and constants.
    fn of(program: &Program) -> Option<RegisterPlan> {
        let header = crate::event::field::COMMON_SIZE;
        if program.kind() != ProbeKind::Fentry || program.header_size() != 8 {
            return None;
        }
        let len = header + program.record_size(&HitContext::empty());
        if len < Self::MIN_LEN {
            return None;
        }
        let (mut wide, mut narrow, mut consts) = (Vec::new(), Vec::new(), Vec::new());
        for arg in program.direct_args()? {
            let at = header + arg.at;
            if !matches!(arg.size, 1 | 2 | 4 | 8) || at < Self::MIN_LEN || at + arg.size > len {
                return None;
            }
            let (at, size) = (u16::try_from(at).ok()?, arg.size as u8);
            let word = match arg.src {
                DirectSrc::Arg(n) => register_word(ARG_REGISTERS.get(n)?),
                DirectSrc::Reg(name) => register_word(name),
                DirectSrc::StackP => register_word("sp"),
                DirectSrc::Imm(value) => {
                    consts.push(ConstStore { value, at, size });
                    continue;
                }
                // An exit probe's: not an entry probe's program.
                DirectSrc::RetVal => return None,
            };
            // A register the frame does not hold reads as 0, as `run` stores it.
            let Some(word) = word else {
                consts.push(ConstStore { value: 0, at, size });
                continue;
            };
            let word = u16::try_from(word).ok()?;
            if size == 8 {
                wide.push(WideStore { word, at });
            } else {
                narrow.push(NarrowStore { word, at, size });
            }
        }
        wide.push(WideStore::END);
        Some(RegisterPlan {
            len,
            wide: wide.into_boxed_slice(),
            rest: !narrow.is_empty() || !consts.is_empty(),
            narrow: narrow.into_boxed_slice(),
            consts: consts.into_boxed_slice(),
        })
    }

    /// The register words of a plan that stores nothing but whole words, one after the
    /// other from the first argument's offset to the record's end (`len` is
    /// `fixed_words_len` of their count): what [`store_words`] stores.
    fn fixed_words(&self) -> Option<Vec<u16>> {
        if self.rest {
            return None;
        }
        let wide = &self.wide[..self.wide.len() - 1];
        let in_turn = wide
            .iter()
            .enumerate()
            .all(|(i, s)| usize::from(s.at) == Self::MIN_LEN + 8 * i);
        (in_turn && self.len == fixed_words_len(wide.len()))
            .then(|| wide.iter().map(|s| s.word).collect())
    }

    /// The record's length, common header included.
    #[inline(always)]
    fn len(&self) -> usize {
        // SAFETY: `of` makes no plan shorter than that. Said to the compiler so that the
        // record path's own header store (`record[..8]`) needs no bound check, whose panic
        // would keep the reservation in memory for the unwind.
        unsafe { std::hint::assert_unchecked(self.len >= Self::MIN_LEN) };
        self.len
    }

    /// [`RegisterPlan::store_unchecked`], or nothing when `record` is too short, as `run`
    /// does (what the handler's fill does).
    #[cfg(test)]
    fn store(&self, ip: u64, regs: &PtRegs, record: &mut [u8]) {
        if record.len() >= self.len {
            // SAFETY: checked just above.
            unsafe { self.store_unchecked(ip, regs, record) }
        }
    }

    /// Writes the probe header and the arguments into `record` (the common header is the
    /// record path's).
    ///
    /// # Safety
    /// `record` holds at least `self.len` bytes.
    #[inline(always)]
    unsafe fn store_unchecked(&self, ip: u64, regs: &PtRegs, record: &mut [u8]) {
        let words = regs_words(regs);
        let out = record.as_mut_ptr();
        // SAFETY: `record` holds `self.len` bytes, and `of` made every store end inside
        // them (`at + size <= len`, the probe header in bytes 8..16 of at least `MIN_LEN`)
        // and every word index below `PT_REGS_WORDS`; `wide` ends with `END`, so the walk
        // reads only its entries.
        unsafe {
            put(out.add(crate::event::field::COMMON_SIZE), 8, ip);
            let mut wide = self.wide.as_ptr();
            loop {
                let s = *wide;
                if s.word == WideStore::END.word {
                    break;
                }
                let v = *words.get_unchecked(usize::from(s.word));
                out.add(usize::from(s.at))
                    .cast::<u64>()
                    .write_unaligned(v.to_le());
                wide = wide.add(1);
            }
            if self.rest {
                self.store_rest(words, out);
            }
        }
    }

    /// The narrow and constant stores of [`RegisterPlan::store_unchecked`].
    ///
    /// # Safety
    /// `out` holds `self.len` bytes.
    #[inline(always)]
    unsafe fn store_rest(&self, words: &[u64; PT_REGS_WORDS], out: *mut u8) {
        // SAFETY: as in `store_unchecked`.
        unsafe {
            for s in self.narrow.iter() {
                let v = *words.get_unchecked(usize::from(s.word));
                put(out.add(usize::from(s.at)), s.size, v);
            }
            for c in self.consts.iter() {
                put(out.add(usize::from(c.at)), c.size, c.value);
            }
        }
    }
}

/// The record path of both register-plan handlers: one flag load when the event needs no
/// check; otherwise the checks `emit` makes, in its order.
#[inline(always)]
fn record_register_event(file: &EventFile, len: usize, fill: impl FnOnce(&mut [u8])) {
    if let Some(direct) = file.direct() {
        direct.record(len, fill);
    } else if let Some(checked) = file.wanted() {
        checked.record(len, fill);
    }
}

/// Largest count of words [`fixed_words_builder`] makes a handler of its own for.
const MAX_FIXED_WORDS: usize = 6;

/// The handler for a [`RegisterPlan`] that is only whole words stored one after the other
/// from the first argument's offset on (`a=$arg1 b=$arg2`, `x64` or `u64`, the default
/// type), as at most [`MAX_FIXED_WORDS`] of them: one instance per count, so that the
/// record's length, and with it the ring buffer's event size and data header, and every
/// offset are constants, and the stores need no loop. `None` for any other plan.
fn fixed_words_builder(file: &Arc<EventFile>, plan: &RegisterPlan) -> Option<FprobeBuilder> {
    fn build<const N: usize>(file: &Arc<EventFile>, plan: &RegisterPlan) -> Option<FprobeBuilder> {
        let words: [u16; N] = plan.fixed_words()?.try_into().ok()?;
        let file = file.clone();
        Some(
            Fprobe::builder().entry_handler(move |_fp, entry_ip, _ret_ip, regs, _data| {
                let fill =
                    move |record: &mut [u8]| store_words(&words, entry_ip as u64, regs, record);
                record_register_event(&file, fixed_words_len(N), fill);
                EntryAction::Continue
            }),
        )
    }
    match plan.fixed_words()?.len() {
        0 => build::<0>(file, plan),
        1 => build::<1>(file, plan),
        2 => build::<2>(file, plan),
        3 => build::<3>(file, plan),
        4 => build::<4>(file, plan),
        5 => build::<5>(file, plan),
        MAX_FIXED_WORDS => build::<MAX_FIXED_WORDS>(file, plan),
        _ => None,
    }
}

/// Record bytes of `n` words after the common header and `__probe_ip`.
#[inline(always)]
const fn fixed_words_len(n: usize) -> usize {
    RegisterPlan::MIN_LEN + 8 * n
}

/// [`RegisterPlan::store_unchecked`] for a plan of [`RegisterPlan::fixed_words`]: `__probe_ip`, then
/// each register word in turn; nothing when `record` is too short.
#[inline(always)]
fn store_words<const N: usize>(words: &[u16; N], ip: u64, regs: &PtRegs, record: &mut [u8]) {
    let header = crate::event::field::COMMON_SIZE;
    let Some(body) = record.get_mut(header..fixed_words_len(N)) else {
        return;
    };
    let regs = regs_words(regs);
    body[..8].copy_from_slice(&ip.to_le_bytes());
    for (slot, &word) in body[8..].chunks_exact_mut(8).zip(words) {
        // `fixed_words` gives only the plan's indices, each below `PT_REGS_WORDS`.
        let v = regs.get(usize::from(word)).copied().unwrap_or(0);
        slot.copy_from_slice(&v.to_le_bytes());
    }
}

/// Stores the low `size` bytes of `v` at `at`, little-endian, as `Program::run` does.
///
/// # Safety
/// `at` is valid for `size` bytes of writes; `size` is 1, 2, 4 or 8.
#[inline(always)]
unsafe fn put(at: *mut u8, size: u8, v: u64) {
    // SAFETY: the caller's.
    unsafe {
        match size {
            8 => at.cast::<u64>().write_unaligned(v.to_le()),
            4 => at.cast::<u32>().write_unaligned((v as u32).to_le()),
            2 => at.cast::<u16>().write_unaligned((v as u16).to_le()),
            _ => at.write(v as u8),
        }
    }
}

/// What an eprobe's hit offers the fetch program: the source record, and the thread's
/// name if read. Everything else reads as [`HitContext::empty`] gives it (0, none), with
/// a smaller context to build on every record of the source event.
struct RecordContext<'a> {
    record: &'a [u8],
    comm: std::cell::OnceCell<[u8; 16]>,
}

impl FetchContext for RecordContext<'_> {
    #[inline]
    fn arg(&self, _n: usize) -> u64 {
        0
    }
    fn stack_pointer(&self) -> u64 {
        0
    }
    fn comm(&self) -> &[u8] {
        self.comm.get_or_init(crate::thread::current_comm_bytes)
    }
    #[inline]
    fn event_record(&self) -> &[u8] {
        self.record
    }
}

/// Writes one record of `program` for this hit into `file`.
// Always inlined into each probe's handler: the hit then builds its context, tests the event
// and reserves in one frame instead of two.
#[inline(always)]
fn emit<C: FetchContext>(file: &EventFile, program: &Program, ctx: &C) {
    if !file.wants_record() {
        return;
    }
    let header = crate::event::field::COMMON_SIZE;
    let size = program.record_size(ctx);
    file.record(header + size, |record| {
        program.run(ctx, &mut record[header..]);
    });
}

/// Detaches on drop.
enum Attached {
    Fprobe(Option<Fprobe>),
    Tracepoint(
        &'static dyn crate::tracepoint::TracepointEntry,
        crate::tracepoint::ProbeId,
    ),
    Hook(Arc<EventFile>, crate::trigger::HookId),
}

impl Attachment for Attached {
    fn detach(self: Box<Self>) {
        match *self {
            Attached::Fprobe(mut fp) => {
                if let Some(fp) = fp.take() {
                    let _ = fp.unregister();
                }
            }
            Attached::Tracepoint(tp, id) => {
                let _ = tp.unregister_id(id);
            }
            Attached::Hook(source, id) => crate::trigger::remove_hook(&source, &id),
        }
    }
}

impl EventClass for DynEvent {
    fn system(&self) -> &str {
        &self.group
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn fields(&self) -> Vec<FieldDesc> {
        self.fields.clone()
    }
    fn print_fmt(&self, _fields: &[FieldDesc]) -> String {
        self.program.print_fmt()
    }
    fn render_line(&self, record: &[u8], out: &mut String) -> bool {
        let inventory = ustrace_inspect::symbols::inventory();
        self.program
            .print_event(&self.first, record, Some(&inventory), out);
        true
    }
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        // Fetches dereference pointers the probe did not check, made safe by the
        // fault handler of `uaccess`. Another runtime may have replaced that handler
        // since it was installed: reclaim it now, in front of the newcomer (checking
        // per read would cost a syscall on the hit path).
        ustrace_inspect::uaccess::install().map_err(|_| Errno::EIO)?;
        let live = Arc::new(LiveAttachment {
            file: file.clone(),
            parts: Mutex::new(Vec::new()),
        });
        let mut state = self.state();
        for probe in &state.probes {
            match self.attach_probe(probe, file.clone()) {
                Ok(part) => live
                    .parts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((probe.clone(), part)),
                Err(e) => {
                    Box::new(AttachHandle(live)).detach();
                    return Err(e);
                }
            }
        }
        state.live.retain(|w| w.strong_count() > 0);
        state.live.push(Arc::downgrade(&live));
        Ok(Box::new(AttachHandle(live)))
    }
}

/// The entry addresses an `f` probe on `spec` patches: every definition the symbol spec
/// names (`name`, `name@VERSION`, `name@@VERSION`; see `Inventory::find`), one per address.
fn fprobe_targets(spec: &str) -> Result<Vec<usize>, Errno> {
    let inventory = ustrace_inspect::symbols::inventory();
    let mut addrs: Vec<usize> = Vec::new();
    for symbol in inventory.find(spec) {
        if !addrs.contains(&symbol.addr) {
            addrs.push(symbol.addr);
        }
    }
    if addrs.is_empty() {
        return Err(Errno::ENOENT);
    }
    Ok(addrs)
}

fn fprobe_errno(e: ustrace_fprobe::Error) -> Errno {
    match e {
        ustrace_fprobe::Error::NoMatch(_) => Errno::ENOENT,
        ustrace_fprobe::Error::Unsupported(_) => Errno(libc::EOPNOTSUPP),
        ustrace_fprobe::Error::TooManySites | ustrace_fprobe::Error::TooManyProbes => Errno::ENOSPC,
        _ => Errno::EINVAL,
    }
}

/// The `dynamic_events` listing: every probe of every dynamic event in the kernel's
/// canonical form, in the order they were made.
pub fn listing() -> String {
    let mut lines: Vec<((EventId, u64), String)> = Vec::new();
    for (_, event) in DYNAMIC.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        for probe in &event.state().probes {
            lines.push((probe.order, format!("{}\n", probe.definition.canonical())));
        }
    }
    // Ids rise with creation, so merging by id lists every kind in creation order.
    lines.extend(
        crate::synth::dyn_listing()
            .into_iter()
            .map(|(id, line)| ((id, 0), line)),
    );
    lines.sort_by_key(|(order, _)| *order);
    lines.into_iter().map(|(_, line)| line).collect()
}

/// Whether event `id` is enabled or held by a trigger in any instance, or read by an eprobe.
pub(crate) fn in_use(id: EventId) -> bool {
    tracing().all().iter().any(|instance| {
        instance
            .file(id)
            .is_some_and(|f| f.is_enabled() || f.is_soft_disabled())
    }) || DYNAMIC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|(_, e)| e.source == Some(id))
}

/// Creates one dynamic event from a parsed definition; a failure is logged in `error_log`
/// as the kernel logs it.
pub fn create(definition: ProbeDefinition) -> Result<EventId, Errno> {
    create_checked(definition).map_err(|(errno, log)| {
        if let Some(text) = log {
            tracing().top().log_error_text(&text);
        }
        errno
    })
}

/// [`create`] without the logging: the errno, and the `error_log` entry the failure calls for.
fn create_checked(definition: ProbeDefinition) -> Result<EventId, (Errno, Option<String>)> {
    let logged = |e: ustrace_probe::ProbeError| (Errno(e.errno.code()), Some(e.log_text()));
    // An `f`/`t` line naming an existing event of the same family appends to it; the
    // kernel checks that before it looks for the probed symbol.
    let existing = match definition.kind {
        ProbeKind::Fentry | ProbeKind::Fexit | ProbeKind::Tracepoint => {
            find_event(Some(&definition.group), &definition.event).filter(|(_, e)| {
                matches!(
                    e.first.kind,
                    ProbeKind::Fentry | ProbeKind::Fexit | ProbeKind::Tracepoint
                )
            })
        }
        _ => None,
    };
    if let Some((_, event)) = &existing {
        event.check_append(&definition).map_err(logged)?;
    }
    let source = match definition.kind {
        ProbeKind::Eprobe => Some(
            registry()
                .find(&definition.target_system, &definition.target)
                .ok_or((Errno::ENOENT, None))?
                .id,
        ),
        ProbeKind::Fentry | ProbeKind::Fexit => {
            // Check now that every function the symbol names exists and can be patched, so
            // the error comes at definition. The kernel (6.18) verifies the symbol when the
            // event is defined: "Invalid probed address or symbol" under the symbol, and
            // EINVAL; any other failure to register is "Failed to register probe event".
            let Ok(addrs) = fprobe_targets(&definition.target) else {
                return Err(logged(definition.error(
                    ErrorId::BAD_PROBE_ADDR,
                    1,
                    0,
                    ProbeErrno::Inval,
                )));
            };
            if addrs
                .iter()
                .any(|&addr| ustrace_fprobe::check_patchable(addr).is_some())
            {
                return Err(logged(definition.error(
                    ErrorId::FAIL_REG_PROBE,
                    1,
                    0,
                    ProbeErrno::Inval,
                )));
            }
            None
        }
        ProbeKind::Uprobe | ProbeKind::Uretprobe => return Err((Errno::EINVAL, None)),
        ProbeKind::Tracepoint => None,
    };
    let program = Arc::new(definition.compile(Some(ustrace_inspect::symbols::inventory())));
    if let Some((id, event)) = existing {
        // Registering the new probe where the event is enabled can still fail; its error is
        // logged under the probed symbol, as the kernel logs it.
        let words = definition.clone();
        append(&event, definition, program).map_err(|e| {
            let id = if e == Errno::ENOENT {
                ErrorId::BAD_PROBE_ADDR
            } else {
                ErrorId::FAIL_REG_PROBE
            };
            (e, Some(words.error(id, 1, 0, ProbeErrno::Inval).log_text()))
        })?;
        return Ok(id);
    }
    let fields = program.fields().iter().map(to_desc).collect();
    let event_exists = definition.error(ErrorId::EVENT_EXIST, 0, 0, ProbeErrno::Exist);
    let probe = Arc::new(Probe {
        definition: definition.clone(),
        program: program.clone(),
        order: (EventId(0), 0),
    });
    let class = Arc::new(DynEvent {
        group: definition.group.clone(),
        name: definition.event.clone(),
        fields,
        program,
        first: definition,
        source,
        state: Mutex::new(ProbeState {
            probes: vec![probe],
            live: Vec::new(),
        }),
    });
    let event = registry().add(class.clone()).map_err(|e| {
        if e == Errno::EEXIST {
            logged(event_exists)
        } else {
            (e, None)
        }
    })?;
    if let Some(first) = class.state().probes.first_mut() {
        // Only this thread holds the probe yet: give it its place in the listing.
        if let Some(probe) = Arc::get_mut(first) {
            probe.order = (event.id, 0);
        }
    }
    tracing().add_event(event.clone());
    DYNAMIC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((event.id, class));
    Ok(event.id)
}

/// Adds a probe to `event` and attaches it wherever the event is attached.
fn append(
    event: &DynEvent,
    definition: ProbeDefinition,
    program: Arc<Program>,
) -> Result<(), Errno> {
    let newest = registry()
        .all()
        .iter()
        .map(|e| e.id)
        .max()
        .unwrap_or(EventId(0));
    static APPENDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let probe = Arc::new(Probe {
        definition,
        program,
        order: (
            newest,
            APPENDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        ),
    });
    let mut state = event.state();
    let live: Vec<Arc<LiveAttachment>> = state.live.iter().filter_map(Weak::upgrade).collect();
    let mut done: Vec<(Arc<LiveAttachment>, Attached)> = Vec::new();
    for attachment in &live {
        match event.attach_probe(&probe, attachment.file.clone()) {
            Ok(part) => done.push((attachment.clone(), part)),
            Err(e) => {
                for (_, part) in done {
                    Box::new(part).detach();
                }
                return Err(e);
            }
        }
    }
    for (attachment, part) in done {
        attachment
            .parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((probe.clone(), part));
    }
    state.probes.push(probe);
    Ok(())
}

/// Removes one probe of an event that has others, detaching it wherever it is attached;
/// the event stays (the kernel's unregister of a probe with siblings, allowed while enabled).
fn remove_probe(event: &DynEvent, probe: &Arc<Probe>) {
    let mut state = event.state();
    state.probes.retain(|p| !Arc::ptr_eq(p, probe));
    for attachment in state.live.iter().filter_map(Weak::upgrade) {
        let mut parts = attachment.parts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = parts.iter().position(|(p, _)| Arc::ptr_eq(p, probe)) {
            let (_, part) = parts.remove(at);
            Box::new(part).detach();
        }
    }
    drop(state);
    crate::tracepoint::synchronize_unregister();
}

/// Removes one dynamic event; `EBUSY` while it is enabled, held by triggers, or the source
/// of an eprobe.
pub fn remove(id: EventId) -> Result<(), Errno> {
    if in_use(id) {
        return Err(Errno::EBUSY);
    }
    tracing().remove_event(id);
    registry().remove(id);
    DYNAMIC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(e, _)| *e != id);
    crate::tracepoint::synchronize_unregister();
    Ok(())
}

/// Applies one line of `dynamic_events` input.
fn run_line(line: &str) -> Result<(), Errno> {
    run_command(line).map_err(|(errno, _)| errno)
}

/// Applies one command; a failure says its errno and the `error_log` entry it wrote.
pub fn run_command(line: &str) -> Result<(), (Errno, Option<String>)> {
    if let Some(result) = crate::synth::run_dyn_line(line) {
        return result.map_err(|e| {
            let log = match &e {
                crate::synth::SynthError::Definition(d) => Some(d.log_text()),
                _ => None,
            };
            (e.errno(), log)
        });
    }
    let env = CoreEnv {
        inspect: ustrace_probe::InspectEnv::new(),
    };
    let command = parse_command(line, &env).map_err(|e| {
        let text = e.log_text();
        if !text.is_empty() {
            tracing().top().log_error_text(&text);
        }
        (Errno(e.errno.code()), Some(text).filter(|t| !t.is_empty()))
    })?;
    apply(command).map_err(|(errno, log)| {
        if let Some(text) = &log {
            tracing().top().log_error_text(text);
        }
        (errno, log)
    })
}

/// Finds a dynamic event by group (any when `None`) and name.
pub fn find(group: Option<&str>, event: &str) -> Option<EventId> {
    find_event(group, event).map(|(id, _)| id)
}

fn find_event(group: Option<&str>, event: &str) -> Option<(EventId, Arc<DynEvent>)> {
    DYNAMIC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(_, e)| e.name == event && group.is_none_or(|g| e.group == g))
        .cloned()
}

fn apply(command: DynCommand) -> Result<(), (Errno, Option<String>)> {
    match command {
        DynCommand::Empty => Ok(()),
        DynCommand::Create(definition) => create_checked(definition).map(|_| ()),
        DynCommand::Remove(removal) => {
            // Each matching probe goes; an event goes with its last probe.
            let mut whole: Vec<EventId> = Vec::new();
            let mut some: Vec<(Arc<DynEvent>, Vec<Arc<Probe>>)> = Vec::new();
            for (id, event) in DYNAMIC.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let state = event.state();
                let matching: Vec<Arc<Probe>> = state
                    .probes
                    .iter()
                    .filter(|p| p.definition.matches(&removal))
                    .cloned()
                    .collect();
                if matching.len() == state.probes.len() && !matching.is_empty() {
                    whole.push(*id);
                } else if !matching.is_empty() {
                    some.push((event.clone(), matching));
                }
            }
            let synthetic =
                crate::synth::remove_matching(removal.group.as_deref(), removal.event.as_deref())
                    .map_err(|e| (e, None))?;
            if whole.is_empty() && some.is_empty() && synthetic == 0 {
                return Err((Errno::ENOENT, None));
            }
            for (event, probes) in some {
                for probe in &probes {
                    remove_probe(&event, probe);
                }
            }
            for id in whole {
                remove(id).map_err(|e| (e, None))?;
            }
            Ok(())
        }
    }
}

/// Removes every dynamic event (a truncating open of `dynamic_events`): `EBUSY`, and nothing
/// removed, while any is in use.
pub fn remove_all() -> Result<(), Errno> {
    let ids: Vec<EventId> = DYNAMIC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(id, _)| *id)
        .collect();
    if ids.iter().any(|id| in_use(*id)) || crate::synth::any_busy() {
        return Err(Errno::EBUSY);
    }
    for id in ids.into_iter().rev() {
        remove(id)?;
    }
    crate::synth::remove_all()
}

/// Applies a write to `dynamic_events`: one definition a line.
pub fn write(data: &[u8]) -> Result<usize, Errno> {
    let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
    for line in text.split('\n') {
        run_line(line)?;
    }
    Ok(data.len())
}

/// Opens `dynamic_events`.
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

    /// Lets definitions name registers (`%di`), as a probe environment with full frames may.
    struct RegsEnv;

    impl ProbeEnv for RegsEnv {
        fn fprobe_registers(&self) -> bool {
            true
        }
    }

    fn program(line: &str) -> Program {
        match parse_command(line, &RegsEnv) {
            Ok(DynCommand::Create(d)) => d.compile(None),
            other => panic!("{line}: {other:?}"),
        }
    }

    /// A frame whose every word differs from every other, bytes included.
    fn frame() -> PtRegs {
        let mut regs = PtRegs::default();
        // SAFETY: `PtRegs` is plain words (see `regs_words`); every bit pattern is valid.
        let words = unsafe { &mut *(&mut regs as *mut PtRegs).cast::<[u64; PT_REGS_WORDS]>() };
        for (i, w) in words.iter_mut().enumerate() {
            *w = 0x8070_6050_4030_2010u64.wrapping_mul(i as u64 + 1) ^ (i as u64) << 56;
        }
        regs
    }

    /// The record the program writes through the general path ([`emit`]'s fill).
    fn general(program: &Program, regs: &PtRegs, ip: u64, len: usize) -> Vec<u8> {
        let ctx = HitContext {
            regs: Some(regs),
            ip,
            ..HitContext::empty()
        };
        let header = crate::event::field::COMMON_SIZE;
        assert_eq!(header + program.record_size(&ctx), len);
        let mut record = vec![0xa5u8; len];
        program.run(&ctx, &mut record[header..]);
        record
    }

    /// Where a plan applies, its stores are byte for byte what the program stores on the
    /// same registers; where it does not (stack arguments, dereferences, strings, exit
    /// probes), no plan is made and the general path records.
    #[test]
    fn fast_register_stores_match_the_program() {
        let regs = frame();
        let ip = 0x5555_0000_1234;
        // Each with the number of words of its own handler (`fixed_words`), if it has one.
        let fast = [
            ("f:t/a f a=$arg1 b=$arg2", Some(2)),
            (
                "f:t/b f a=$arg1:u8 b=$arg2:s16 c=$arg3:x32 d=$arg4 e=$arg5:u32 f=$arg6:s64",
                None,
            ),
            (
                "f:t/c f x=%di y=%si:u16 z=%ax:u64 imm=\\42:s32 sp=$stack fl=%flags ip=%ip",
                None,
            ),
            (
                "f:t/d f cs=%cs:u32 ss=%ss r15=%r15 bp=%bp:x8 c=$arg1:char",
                None,
            ),
            ("f:t/e f", Some(0)),
            (
                "f:t/f f a=$arg1 b=$arg2 c=$arg3 d=$arg4 e=$arg5 f=$arg6",
                Some(6),
            ),
            ("f:t/l f a=$arg1:u64 b=$arg1:x64 sp=$stack", Some(3)),
            (
                "f:t/m f a=$arg1 b=$arg2 c=$arg3 d=$arg4 e=$arg5 f=$arg6 g=%ax",
                None,
            ),
        ];
        for (line, fixed) in fast {
            let program = program(line);
            let plan = RegisterPlan::of(&program).unwrap_or_else(|| panic!("{line}: no plan"));
            let want = general(&program, &regs, ip, plan.len);
            let mut got = vec![0xa5u8; plan.len];
            plan.store(ip, &regs, &mut got);
            assert_eq!(got, want, "{line}");
            let words = plan.fixed_words().filter(|w| w.len() <= MAX_FIXED_WORDS);
            assert_eq!(words.as_ref().map(Vec::len), fixed, "{line}");
            if let Some(words) = words {
                let mut got = vec![0xa5u8; plan.len];
                store_fixed(&words, ip, &regs, &mut got);
                assert_eq!(got, want, "{line}: fixed words");
                let mut short = vec![0xa5u8; plan.len - 1];
                store_fixed(&words, ip, &regs, &mut short);
                assert!(short.iter().all(|&b| b == 0xa5), "{line}: fixed words");
            }
            // A record too short for the fields is left alone, as `run` leaves it.
            let mut short = vec![0xa5u8; plan.len - 1];
            plan.store(ip, &regs, &mut short);
            assert!(short.iter().all(|&b| b == 0xa5), "{line}");
        }
        let general_only = [
            "f:t/g f a=$arg7",
            "f:t/h f a=$arg1 s=+0($arg2):u32",
            "f:t/i f a=$arg1 c=$comm",
            "f:t/j f%return r=$retval",
            "f:t/k f b=$arg1:b3@2/32",
        ];
        for line in general_only {
            assert!(RegisterPlan::of(&program(line)).is_none(), "{line}");
        }
    }

    /// [`store_words`] for as many words as `words` has.
    fn store_fixed(words: &[u16], ip: u64, regs: &PtRegs, record: &mut [u8]) {
        fn one<const N: usize>(words: &[u16], ip: u64, regs: &PtRegs, record: &mut [u8]) {
            store_words::<N>(words.try_into().unwrap(), ip, regs, record)
        }
        match words.len() {
            0 => one::<0>(words, ip, regs, record),
            1 => one::<1>(words, ip, regs, record),
            2 => one::<2>(words, ip, regs, record),
            3 => one::<3>(words, ip, regs, record),
            4 => one::<4>(words, ip, regs, record),
            5 => one::<5>(words, ip, regs, record),
            6 => one::<6>(words, ip, regs, record),
            n => panic!("{n} words"),
        }
    }

    /// `%REG` reads the word `register_word` names, and the argument registers are the ones
    /// `PtRegs::arg` reads.
    #[test]
    fn register_words_name_the_frames_fields() {
        let regs = frame();
        let ctx = HitContext {
            regs: Some(&regs),
            ..HitContext::empty()
        };
        for (n, name) in ARG_REGISTERS.iter().enumerate() {
            assert_eq!(regs.arg(n), ctx.register(name), "{name}");
        }
        assert_eq!(ctx.register("ax"), Some(regs.ax));
        assert_eq!(ctx.register("rsp"), Some(regs.sp));
        assert_eq!(ctx.register("r15"), Some(regs.r15));
        assert_eq!(ctx.register("orig_ax"), Some(regs.orig_ax));
        assert_eq!(ctx.register("cs"), None);
    }
}
