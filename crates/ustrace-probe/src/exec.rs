//! Running compiled definitions on the probe-hit path, and laying out and
//! printing the records they produce.
//!
//! A record is the 8-byte common header (written by the caller), the probe
//! header, the fixed argument area and the dynamic area for strings:
//!
//! ```text
//!  off 0   common header (caller)
//!  off 8   __probe_ip                     (exit probes: __probe_func, __probe_ret_ip)
//!  off 16  count  u64
//!  off 24  name   u32 __data_loc = len << 16 | offset-from-record-start ─┐
//!  off 28  "file.txt\0"  ◄────────────────────────────────────────────────┘
//! ```
//!
//! [`Program::record_size`] walks the arguments once to size the strings
//! (the kernel's `__get_data_size`), then [`Program::run`] stores them; both
//! only read through [`FetchContext`], take no lock and allocate nothing.
//! A fault while fetching a string stores length 0, printed `(fault)`; a
//! fault while fetching a number stores 0.
//!
//! Two shapes skip the interpreter, resolved when the program is built: arguments
//! that are each one plain load (`$argN`, a register, `$retval`) and an eprobe's
//! numeric source-record fields, which become fixed-width copies (adjacent fields
//! merged) beside whatever the interpreter still runs.

use std::fmt::Write as _;
use std::sync::Arc;

use ustrace_inspect::symbols::Inventory;
use ustrace_inspect::uaccess;

use crate::command::{ProbeDefinition, ProbeKind};
use crate::env::{FieldKind, FieldSpec};
use crate::fetch::{ArgDef, Insn, MAX_STRING_SIZE, REGISTER_NAMES};
use crate::types::FetchType;

/// Size of the common header every record starts with.
pub const COMMON_HEADER_SIZE: usize = 8;

/// What a probe hit offers the fetch program. Memory reads default to the
/// fault-safe `ustrace_inspect::uaccess` routines.
pub trait FetchContext {
    /// The n-th (0-based) integer argument of the probed function.
    fn arg(&self, n: usize) -> u64;

    /// A register by its kernel name (`di`, `r8`, `ip`); `None` when unknown
    /// (the fetch faults).
    fn register(&self, name: &str) -> Option<u64> {
        let _ = name;
        None
    }

    /// The stack pointer at the probe.
    fn stack_pointer(&self) -> u64;

    /// The n-th word of the stack (default: read at `sp + 8n`).
    fn stack_word(&self, n: usize) -> Option<u64> {
        let addr = self
            .stack_pointer()
            .checked_add((n as u64).checked_mul(8)?)?;
        uaccess::read_u64(addr as usize).ok()
    }

    /// The return value (exit probes).
    fn return_value(&self) -> u64 {
        0
    }

    /// The current task's name (up to 16 bytes, NUL padded).
    fn comm(&self) -> &[u8];

    /// The record of the event an eprobe is attached to (common header
    /// included, as field offsets count from it).
    fn event_record(&self) -> &[u8] {
        &[]
    }

    /// Words saved at function entry by [`Program::save_entry`] (exit probes).
    fn entry_data(&self) -> &[u64] {
        &[]
    }

    /// Load base of the probed object (uprobes' `@+OFFSET`).
    fn file_base(&self) -> u64 {
        0
    }

    /// `__probe_ip`, or `__probe_func` for exit probes (the function's entry).
    fn probe_ip(&self) -> u64 {
        0
    }

    /// `__probe_ret_ip` for exit probes (where the function returns to).
    fn return_ip(&self) -> u64 {
        0
    }

    /// Copies memory; false on a fault.
    fn read(&self, addr: u64, buf: &mut [u8], user: bool) -> bool {
        let _ = user;
        uaccess::read(addr as usize, buf).is_ok()
    }

    /// Copies a NUL-terminated string as `strncpy_from_user`; `None` on a fault.
    fn read_str(&self, addr: u64, buf: &mut [u8], user: bool) -> Option<usize> {
        let _ = user;
        uaccess::read_str(addr as usize, buf).ok()
    }
}

/// A definition compiled for the hot path.
#[derive(Debug, Clone)]
pub struct Program {
    kind: ProbeKind,
    header: usize,
    fixed: usize,
    args: Box<[ArgDef]>,
    entry: Box<[u32]>,
    inventory: Option<Arc<Inventory>>,
    /// When every argument is one plain load stored as is (`len=$arg2`,
    /// `x=%di:u32`, `r=$retval`): the loads, so `run` skips the interpreter.
    direct: Option<Box<[DirectArg]>>,
    /// Eprobes: the numeric source-record fields as precompiled copies.
    copies: Option<FieldCopies>,
    /// Whether any argument is a string (its size is known only per hit).
    has_dynamic: bool,
}

/// An argument that is one load stored as is (see [`Program::direct_args`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectArg {
    /// What the argument loads.
    pub src: DirectSrc,
    /// Offset of the field after the common header (probe header included).
    pub at: usize,
    /// Bytes stored: the value's low bytes, little-endian (1, 2, 4 or 8).
    pub size: usize,
}

/// What a [`DirectArg`] loads, read through [`FetchContext`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectSrc {
    /// `$argN` (0-based here): [`FetchContext::arg`].
    Arg(usize),
    /// `%REG`: [`FetchContext::register`] by this name, 0 when it gives `None`.
    Reg(&'static str),
    /// `$retval`: [`FetchContext::return_value`].
    RetVal,
    /// A constant (`\VALUE`, `@ADDR`, `@SYM`).
    Imm(u64),
    /// `$stack`: [`FetchContext::stack_pointer`].
    StackP,
}

impl DirectArg {
    /// The argument as a direct load, if it is one: a scalar (no array,
    /// string or bitfield) whose code is exactly "load, store raw, end".
    fn of(a: &ArgDef, header: usize) -> Option<DirectArg> {
        if a.count != 0 || a.ty.is_string() {
            return None;
        }
        let [load, Insn::StRaw(n), Insn::End] = a.code.as_slice() else {
            return None;
        };
        if usize::from(*n) != a.ty.size() {
            return None;
        }
        let src = match *load {
            Insn::Arg(n) => DirectSrc::Arg(n as usize),
            Insn::Reg(r) => DirectSrc::Reg(REGISTER_NAMES[r as usize]),
            Insn::RetVal => DirectSrc::RetVal,
            Insn::Imm(v) => DirectSrc::Imm(v),
            Insn::StackP => DirectSrc::StackP,
            // Source-record fields are the copy plan's (`FieldCopies`).
            _ => return None,
        };
        Some(DirectArg {
            src,
            at: header + a.offset,
            size: a.ty.size(),
        })
    }

    #[inline]
    fn value<C: FetchContext>(&self, ctx: &C) -> Option<u64> {
        Some(match self.src {
            DirectSrc::Arg(n) => ctx.arg(n),
            DirectSrc::Reg(name) => ctx.register(name)?,
            DirectSrc::RetVal => ctx.return_value(),
            DirectSrc::Imm(v) => v,
            DirectSrc::StackP => ctx.stack_pointer(),
        })
    }
}

/// An eprobe's numeric source-record fields, resolved when the program is built into
/// copies from the source record to the new one, so that a hit moves each field (or each
/// run of fields adjacent in both records) with fixed-width loads and stores instead of
/// going through the interpreter's dispatch on the source and the size. The arguments
/// it does not cover (strings, char arrays, dereferences) go through the interpreter.
#[derive(Debug, Clone)]
struct FieldCopies {
    /// The source record must hold this many bytes for every copied field to be whole; a
    /// shorter one goes through the interpreter, which stores 0 for a missing field.
    src_end: usize,
    /// End of the last byte written in the record body.
    dst_end: usize,
    ops: Box<[FieldCopy]>,
    /// Indexes of the arguments the interpreter runs, in argument order.
    rest: Box<[u16]>,
}

/// One copy from the source record (`src`, record start) into the record body (`dst`,
/// after the common header). Little-endian: a store no wider than the field keeps its
/// low bytes, which come first, so truncation (sign or not) is a plain byte copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldCopy {
    B1 {
        src: u32,
        dst: u32,
    },
    B2 {
        src: u32,
        dst: u32,
    },
    B4 {
        src: u32,
        dst: u32,
    },
    B8 {
        src: u32,
        dst: u32,
    },
    /// 9 to 16 bytes (adjacent fields): two overlapping 8-byte moves.
    B16 {
        src: u32,
        dst: u32,
        len: u32,
    },
    /// Any other run of adjacent fields.
    Span {
        src: u32,
        dst: u32,
        len: u32,
    },
    /// A field of `from` bytes stored wider (`to` bytes), zero- or sign-extended.
    Widen {
        src: u32,
        dst: u32,
        from: u8,
        to: u8,
        signed: bool,
    },
}

impl FieldCopy {
    /// A plain copy of `len` bytes in its narrowest form.
    fn bytes(src: u32, dst: u32, len: u32) -> FieldCopy {
        match len {
            1 => FieldCopy::B1 { src, dst },
            2 => FieldCopy::B2 { src, dst },
            4 => FieldCopy::B4 { src, dst },
            8 => FieldCopy::B8 { src, dst },
            9..=16 => FieldCopy::B16 { src, dst, len },
            _ => FieldCopy::Span { src, dst, len },
        }
    }

    /// `(src, dst, len)` when the copy moves bytes as they are.
    fn as_bytes(self) -> Option<(u32, u32, u32)> {
        match self {
            FieldCopy::B1 { src, dst } => Some((src, dst, 1)),
            FieldCopy::B2 { src, dst } => Some((src, dst, 2)),
            FieldCopy::B4 { src, dst } => Some((src, dst, 4)),
            FieldCopy::B8 { src, dst } => Some((src, dst, 8)),
            FieldCopy::B16 { src, dst, len } | FieldCopy::Span { src, dst, len } => {
                Some((src, dst, len))
            }
            FieldCopy::Widen { .. } => None,
        }
    }

    /// End of the bytes the copy writes in the record body.
    fn dst_end(self) -> usize {
        let (dst, len) = match self {
            FieldCopy::Widen { dst, to, .. } => (dst, u32::from(to)),
            other => {
                let (_, dst, len) = other.as_bytes().expect("a byte copy");
                (dst, len)
            }
        };
        (dst + len) as usize
    }
}

impl FieldCopies {
    /// The plan for an eprobe's arguments (`header` is 0 for eprobes but kept general),
    /// or `None` when no argument is a plain numeric field load.
    fn of(args: &[ArgDef], header: usize, fixed: usize) -> Option<FieldCopies> {
        let mut ops: Vec<FieldCopy> = Vec::new();
        let mut rest = Vec::new();
        let mut src_end = 0;
        for (i, a) in args.iter().enumerate() {
            match Self::copy_of(a, header) {
                Some((op, field_end)) => {
                    match (ops.last().and_then(|l| l.as_bytes()), op.as_bytes()) {
                        // Adjacent in both records: one longer copy.
                        (Some((ls, ld, ll)), Some((s, d, l))) if ls + ll == s && ld + ll == d => {
                            *ops.last_mut().expect("a last op") = FieldCopy::bytes(ls, ld, ll + l);
                            src_end = src_end.max(field_end);
                        }
                        _ => {
                            ops.push(op);
                            src_end = src_end.max(field_end);
                        }
                    }
                }
                None => rest.push(u16::try_from(i).ok()?),
            }
        }
        if ops.is_empty() {
            return None;
        }
        // Copies write only the fixed area, where the interpreter would.
        let dst_end = ops.iter().map(|op| op.dst_end()).max().unwrap_or(0);
        if dst_end > header + fixed {
            return None;
        }
        Some(FieldCopies {
            src_end,
            dst_end,
            ops: ops.into_boxed_slice(),
            rest: rest.into_boxed_slice(),
        })
    }

    /// The copy for an argument that is exactly "load a numeric field, store it raw",
    /// and the end of the field in the source record: the interpreter loads a field only
    /// when all of it is there, even when fewer bytes are stored.
    fn copy_of(a: &ArgDef, header: usize) -> Option<(FieldCopy, usize)> {
        if a.count != 0 || a.ty.is_string() {
            return None;
        }
        let [Insn::EventField {
            offset,
            size,
            signed,
            kind,
        }, Insn::StRaw(n), Insn::End] = a.code.as_slice()
        else {
            return None;
        };
        let to = a.ty.size();
        if usize::from(*n) != to || !matches!(to, 1 | 2 | 4 | 8) || !matches!(size, 1 | 2 | 4 | 8) {
            return None;
        }
        if matches!(
            kind,
            FieldKind::DynString
                | FieldKind::DynBytes
                | FieldKind::CharArray
                | FieldKind::TailString
        ) {
            return None;
        }
        let src = *offset;
        let dst = u32::try_from(header + a.offset).ok()?;
        let field_end = src.checked_add(u32::from(*size))? as usize;
        let op = if to <= usize::from(*size) {
            FieldCopy::bytes(src, dst, to as u32)
        } else {
            FieldCopy::Widen {
                src,
                dst,
                from: *size,
                to: to as u8,
                signed: *signed,
            }
        };
        Some((op, field_end))
    }

    /// Runs the copies; false (nothing written) when `rec` is shorter than the plan
    /// reads or `out` than it writes.
    #[inline(always)]
    fn apply(&self, rec: &[u8], out: &mut [u8]) -> bool {
        // One check for every copy below.
        if rec.len() < self.src_end || out.len() < self.dst_end {
            return false;
        }
        let (s, d) = (rec.as_ptr(), out.as_mut_ptr());
        macro_rules! mv {
            ($t:ty, $src:expr, $dst:expr) => {
                // SAFETY: `FieldCopies::of` made every copy read `[src, src + width)`
                // inside a field that ends by `src_end <= rec.len()` and write
                // `[dst, dst + width)` with `dst + width <= dst_end <= out.len()` (both
                // checked above); the slices are distinct borrows; the moves are unaligned.
                unsafe {
                    d.add($dst as usize)
                        .cast::<$t>()
                        .write_unaligned(s.add($src as usize).cast::<$t>().read_unaligned())
                }
            };
        }
        for op in self.ops.iter() {
            match *op {
                FieldCopy::B1 { src, dst } => mv!(u8, src, dst),
                FieldCopy::B2 { src, dst } => mv!(u16, src, dst),
                FieldCopy::B4 { src, dst } => mv!(u32, src, dst),
                FieldCopy::B8 { src, dst } => mv!(u64, src, dst),
                FieldCopy::B16 { src, dst, len } => {
                    // The halves overlap in the middle, where both write the same bytes.
                    mv!(u64, src, dst);
                    mv!(u64, src + len - 8, dst + len - 8);
                }
                FieldCopy::Span { src, dst, len } => {
                    let (src, dst, len) = (src as usize, dst as usize, len as usize);
                    out[dst..dst + len].copy_from_slice(&rec[src..src + len]);
                }
                FieldCopy::Widen {
                    src,
                    dst,
                    from,
                    to,
                    signed,
                } => {
                    let src = src as usize;
                    let raw = le_load(&rec[src..src + usize::from(from)]);
                    let v = match (from, signed) {
                        (1, true) => raw as u8 as i8 as i64 as u64,
                        (2, true) => raw as u16 as i16 as i64 as u64,
                        (4, true) => raw as u32 as i32 as i64 as u64,
                        _ => raw,
                    };
                    let dst = dst as usize;
                    le_store(&mut out[dst..dst + usize::from(to)], v);
                }
            }
        }
        true
    }
}

/// A value during a fetch: the number, and for in-process sources (comm,
/// immediate strings, source-record strings) the bytes it points at.
#[derive(Clone, Copy)]
struct Val<'c> {
    v: u64,
    local: Option<&'c [u8]>,
}

impl ProbeDefinition {
    /// Compiles for the hot path. `inventory` is needed only for `symstr`
    /// arguments (address → `symbol+off/size` at record time).
    pub fn compile(&self, inventory: Option<Arc<Inventory>>) -> Program {
        let header = match self.kind {
            ProbeKind::Eprobe => 0,
            k if k.is_return() => 16,
            _ => 8,
        };
        let fixed: usize = self.args.iter().map(ArgDef::fixed_size).sum();
        let direct: Option<Vec<DirectArg>> =
            self.args.iter().map(|a| DirectArg::of(a, header)).collect();
        // Direct stores must tile the fixed area (then nothing needs zeroing), and each must
        // lie inside it: `run` stores them without a bounds check of its own.
        let direct = direct.filter(|d| {
            d.iter().map(|a| a.size).sum::<usize>() == fixed
                && d.iter().all(|a| a.at + a.size <= header + fixed)
        });
        Program {
            kind: self.kind,
            header,
            fixed,
            args: self.args.clone().into_boxed_slice(),
            entry: self.entry_args.args.clone().into_boxed_slice(),
            inventory,
            direct: direct.map(Vec::into_boxed_slice),
            // `run` tests copies before storing a probe header: eprobes have none.
            copies: match self.kind {
                ProbeKind::Eprobe if header == 0 => FieldCopies::of(&self.args, header, fixed),
                _ => None,
            },
            has_dynamic: self.args.iter().any(ArgDef::dynamic),
        }
    }
}

#[inline]
fn le_store(dest: &mut [u8], v: u64) {
    // The common sizes as fixed-width stores, not a memcpy call.
    match dest.len() {
        1 => dest[0] = v as u8,
        2 => dest.copy_from_slice(&(v as u16).to_le_bytes()),
        4 => dest.copy_from_slice(&(v as u32).to_le_bytes()),
        8 => dest.copy_from_slice(&v.to_le_bytes()),
        len => {
            let n = len.min(8);
            dest[..n].copy_from_slice(&v.to_le_bytes()[..n]);
        }
    }
}

fn le_load(src: &[u8]) -> u64 {
    // The common sizes as fixed-width loads, not a memcpy call.
    match *src {
        [a] => u64::from(a),
        [a, b] => u64::from(u16::from_le_bytes([a, b])),
        [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
        [a, b, c, d, e, f, g, h] => u64::from_le_bytes([a, b, c, d, e, f, g, h]),
        _ => {
            let mut b = [0u8; 8];
            let n = src.len().min(8);
            b[..n].copy_from_slice(&src[..n]);
            u64::from_le_bytes(b)
        }
    }
}

/// `fmt::Write` into a byte slice, silently truncating.
struct SliceWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl std::fmt::Write for SliceWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len() - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Where strings go while storing: the whole record body and the next free byte.
struct DynArea<'o> {
    out: &'o mut [u8],
    pos: usize,
}

impl Program {
    /// The probe kind.
    pub fn kind(&self) -> ProbeKind {
        self.kind
    }

    /// Bytes of the probe header that starts the record after the common header: 8
    /// (`__probe_ip`), 16 for exit probes (`__probe_func`, `__probe_ret_ip`), 0 for eprobes.
    pub fn header_size(&self) -> usize {
        self.header
    }

    /// When every argument is one plain load stored as is, the loads in argument order,
    /// which is all [`Program::run`] does after the probe header: a probe that can read
    /// the sources more directly than through [`FetchContext`] may store them itself. The
    /// stores tile the fixed area exactly, each inside `header_size() .. record_size()`.
    /// `None` when some argument needs the interpreter.
    pub fn direct_args(&self) -> Option<&[DirectArg]> {
        self.direct.as_deref()
    }

    /// Bytes of entry data the exit handler must keep per call (0: none).
    pub fn entry_data_size(&self) -> usize {
        self.entry.len() * 8
    }

    /// Saves, at function entry, the arguments an exit probe reads
    /// (`$argN` in a `%return` probe). `edata` needs
    /// `entry_data_size() / 8` words; hand them back through
    /// [`FetchContext::entry_data`] at exit.
    ///
    /// Generic, like [`Program::run`], so that the hit's context inlines.
    pub fn save_entry<C: FetchContext>(&self, ctx: &C, edata: &mut [u64]) {
        for (slot, &arg) in edata.iter_mut().zip(self.entry.iter()) {
            *slot = ctx.arg(arg as usize);
        }
    }

    /// Record fields after the common header, offsets from the record start.
    pub fn fields(&self) -> Vec<FieldSpec> {
        let mut f = Vec::with_capacity(self.args.len() + 2);
        let ulong = |name: &str, offset| FieldSpec {
            name: name.to_owned(),
            c_type: "unsigned long".to_owned(),
            offset,
            size: 8,
            signed: false,
            kind: FieldKind::Int,
        };
        match self.header {
            8 => f.push(ulong("__probe_ip", COMMON_HEADER_SIZE)),
            16 => {
                f.push(ulong("__probe_func", COMMON_HEADER_SIZE));
                f.push(ulong("__probe_ret_ip", COMMON_HEADER_SIZE + 8));
            }
            _ => {}
        }
        let base = COMMON_HEADER_SIZE + self.header;
        for a in self.args.iter() {
            let ty = a.ty;
            let (c_type, kind) = if a.count > 0 {
                (
                    format!("{}[{}]", ty.format_type(), a.count),
                    FieldKind::IntArray {
                        elem_size: ty.size(),
                        len: a.count as usize,
                    },
                )
            } else if ty.is_string() {
                (ty.format_type().to_owned(), FieldKind::DynString)
            } else {
                (ty.format_type().to_owned(), FieldKind::Int)
            };
            f.push(FieldSpec {
                name: a.name.clone(),
                c_type,
                offset: base + a.offset,
                size: a.fixed_size(),
                signed: ty.is_signed(),
                kind,
            });
        }
        f
    }

    /// The format file's `print fmt:` value, built as the kernel builds it.
    pub fn print_fmt(&self) -> String {
        let (head, tail) = match self.header {
            8 => ("(%lx)", ", REC->__probe_ip"),
            16 => ("(%lx <- %lx)", ", REC->__probe_func, REC->__probe_ret_ip"),
            _ => ("", ""),
        };
        let mut s = format!("\"{head}");
        for a in self.args.iter() {
            let conv = a.ty.print_conv();
            let _ = write!(s, " {}=", a.name);
            if a.count > 0 {
                s.push('{');
                for j in 0..a.count {
                    if j > 0 {
                        s.push(',');
                    }
                    s.push_str(conv);
                }
                s.push('}');
            } else {
                s.push_str(conv);
            }
        }
        s.push('"');
        s.push_str(tail);
        for a in self.args.iter() {
            let string = a.ty.is_string();
            if a.count > 0 {
                for j in 0..a.count {
                    if string {
                        let _ = write!(s, ", __get_str({}[{j}])", a.name);
                    } else {
                        let _ = write!(s, ", REC->{}[{j}]", a.name);
                    }
                }
            } else if string {
                let _ = write!(s, ", __get_str({})", a.name);
            } else {
                let _ = write!(s, ", REC->{}", a.name);
            }
        }
        s
    }

    /// Bytes of the record after the common header that [`Program::run`]
    /// needs for this hit (probe header + arguments + strings).
    #[inline]
    pub fn record_size<C: FetchContext>(&self, ctx: &C) -> usize {
        if self.direct.is_some() || !self.has_dynamic {
            return self.header + self.fixed;
        }
        let ctx: &dyn FetchContext = ctx;
        let mut dynamic = 0;
        for a in self.args.iter().filter(|a| a.dynamic()) {
            dynamic += self.exec(a, ctx, None, None);
        }
        self.header + self.fixed + dynamic
    }

    /// Fills `out` (the record after its common header): probe header, the
    /// fixed area, then strings. Returns the bytes used; 0 when `out` cannot
    /// hold the fixed part. Strings are cut to what fits.
    ///
    /// Generic over the context so that the plain-load fast path (`direct`)
    /// inlines the hit's register reads; the interpreter takes it as `dyn`.
    #[inline]
    pub fn run<C: FetchContext>(&self, ctx: &C, out: &mut [u8]) -> usize {
        let fixed_end = self.header + self.fixed;
        if out.len() < fixed_end {
            return 0;
        }
        // Only eprobes have copies, and they have no probe header: tested first.
        if let Some(plan) = &self.copies {
            if !plan.apply(ctx.event_record(), out) {
                // A source record too short for some copy: the interpreter stores 0 for
                // what is missing.
                return self.run_interpreted(ctx, out);
            }
            if plan.rest.is_empty() {
                return fixed_end;
            }
            return self.run_rest(ctx, out, &plan.rest);
        }
        match self.header {
            8 => le_store(&mut out[0..8], ctx.probe_ip()),
            16 => {
                le_store(&mut out[0..8], ctx.probe_ip());
                le_store(&mut out[8..16], ctx.return_ip());
            }
            _ => {}
        }
        if let Some(direct) = &self.direct {
            for d in direct.iter() {
                // A register that does not exist reads as 0, as the
                // interpreter leaves an unfetched field.
                let v = match d.src {
                    // The usual `$argN`, first: no detour through the general match.
                    DirectSrc::Arg(n) => ctx.arg(n),
                    _ => d.value(ctx).unwrap_or(0),
                };
                if d.size == 8 {
                    // SAFETY: `compile` kept the direct path only when every store lies
                    // inside the fixed area (`at + size <= fixed_end`), and `out` holds
                    // the fixed area (checked above).
                    unsafe {
                        out.as_mut_ptr()
                            .add(d.at)
                            .cast::<u64>()
                            .write_unaligned(v.to_le())
                    };
                } else {
                    le_store(&mut out[d.at..d.at + d.size], v);
                }
            }
            return fixed_end;
        }
        self.run_interpreted(ctx, out)
    }

    /// The general case of [`Program::run`] after the probe header: every
    /// argument through the interpreter. Out of line, so that `run` stays
    /// small enough to inline into the hit.
    #[inline(never)]
    fn run_interpreted(&self, ctx: &dyn FetchContext, out: &mut [u8]) -> usize {
        let fixed_end = self.header + self.fixed;
        out[self.header..fixed_end].fill(0);
        let mut area = DynArea {
            out,
            pos: fixed_end,
        };
        for a in self.args.iter() {
            let at = self.header + a.offset;
            self.exec(a, ctx, Some(at), Some(&mut area));
        }
        area.pos
    }

    /// The arguments the copy plan leaves to the interpreter (`rest`), after the copies
    /// ran: each slot is cleared as `run_interpreted` clears the whole fixed area, and
    /// strings go to the dynamic area in argument order, as there.
    #[inline(never)]
    fn run_rest(&self, ctx: &dyn FetchContext, out: &mut [u8], rest: &[u16]) -> usize {
        let fixed_end = self.header + self.fixed;
        let mut area = DynArea {
            out,
            pos: fixed_end,
        };
        for &i in rest {
            let a = &self.args[usize::from(i)];
            let at = self.header + a.offset;
            area.out[at..at + a.fixed_size()].fill(0);
            self.exec(a, ctx, Some(at), Some(&mut area));
        }
        area.pos
    }

    fn load<'c>(&self, insn: &'c Insn, ctx: &'c dyn FetchContext) -> Option<Val<'c>> {
        let plain = |v| Some(Val { v, local: None });
        match insn {
            Insn::Reg(n) => plain(ctx.register(REGISTER_NAMES[*n as usize])?),
            Insn::Stack(n) => plain(ctx.stack_word(*n as usize)?),
            Insn::StackP => plain(ctx.stack_pointer()),
            Insn::RetVal => plain(ctx.return_value()),
            Insn::Imm(v) => plain(*v),
            Insn::Arg(n) => plain(ctx.arg(*n as usize)),
            Insn::EntryData(off) => plain(*ctx.entry_data().get(*off as usize / 8)?),
            Insn::FileOffset(o) => plain(ctx.file_base().wrapping_add(*o as u64)),
            Insn::Comm => {
                let c = ctx.comm();
                Some(Val {
                    v: c.as_ptr() as u64,
                    local: Some(c),
                })
            }
            Insn::Data(d) => Some(Val {
                v: d.as_ptr() as u64,
                local: Some(d),
            }),
            Insn::EventField {
                offset,
                size,
                signed,
                kind,
            } => {
                let rec = ctx.event_record();
                let off = *offset as usize;
                let size = *size as usize;
                let field = rec.get(off..off.checked_add(size)?)?;
                let local = |s: &'c [u8]| {
                    Some(Val {
                        v: s.as_ptr() as u64,
                        local: Some(s),
                    })
                };
                match kind {
                    FieldKind::DynString | FieldKind::DynBytes => {
                        let dl = le_load(field) as u32;
                        let (len, start) = ((dl >> 16) as usize, (dl & 0xffff) as usize);
                        local(rec.get(start..start.checked_add(len)?)?)
                    }
                    FieldKind::CharArray => local(field),
                    FieldKind::TailString => local(&rec[off..]),
                    // A field no load fits (an array such as raw_syscalls' `args[6]`) gives
                    // its address in the record, as the kernel's `get_event_field` does, so
                    // `+8($args)` reads `args[1]`.
                    _ if !matches!(size, 1 | 2 | 4 | 8) => local(field),
                    _ => {
                        let raw = le_load(field);
                        let v = match (size, *signed) {
                            (1, true) => raw as u8 as i8 as i64 as u64,
                            (2, true) => raw as u16 as i16 as i64 as u64,
                            (4, true) => raw as u32 as i32 as i64 as u64,
                            _ => raw,
                        };
                        plain(v)
                    }
                }
            }
            _ => None,
        }
    }

    /// Runs one argument. With `dest` (the argument's fixed slot in
    /// `area.out`) it stores; without, it returns the string bytes needed.
    fn exec(
        &self,
        a: &ArgDef,
        ctx: &dyn FetchContext,
        dest: Option<usize>,
        mut area: Option<&mut DynArea<'_>>,
    ) -> usize {
        let code = &a.code;
        let mut i = 0;
        while matches!(code.get(i), Some(Insn::SymbolPlaceholder)) {
            i += 1;
        }
        let Some(mut val) = code.get(i).and_then(|insn| self.load(insn, ctx)) else {
            return 0;
        };
        i += 1;
        let mut lval = val.v;
        // Stage 2: dereferences.
        let mut deref_at = None;
        while let Some(Insn::Deref { offset, user }) = code.get(i) {
            lval = val.v;
            let mut w = [0u8; 8];
            if !ctx.read(val.v.wrapping_add(*offset as u64), &mut w, *user) {
                return 0;
            }
            val = Val {
                v: u64::from_le_bytes(w),
                local: None,
            };
            deref_at = Some(i);
            i += 1;
        }
        let s3 = i;
        let count = match code.iter().rev().nth(1) {
            Some(Insn::LpArray(n)) => *n as usize,
            _ => 1,
        };
        let mut total = 0;
        let mut dest = dest;
        for elem in 0..count {
            if elem > 0 && a.ty.is_string() {
                // Next string pointer: re-run the last dereference one word on.
                lval = lval.wrapping_add(8);
                val = Val {
                    v: lval,
                    local: None,
                };
                if let Some(d) = deref_at {
                    if let Insn::Deref { offset, user } = code[d] {
                        let mut w = [0u8; 8];
                        if !ctx.read(val.v.wrapping_add(offset as u64), &mut w, user) {
                            break;
                        }
                        val.v = u64::from_le_bytes(w);
                    }
                }
            }
            let n = self.store(&code[s3], a.ty, val, ctx, dest, area.as_deref_mut());
            total += n;
            if let (Some(d), Some(Insn::ModBitfield { .. })) = (dest, code.get(s3 + 1)) {
                if let Some(ar) = area.as_deref_mut() {
                    apply_bitfield(&code[s3 + 1], &mut ar.out[d..]);
                }
            }
            if !a.ty.is_string() {
                val.v = val.v.wrapping_add(a.ty.size() as u64);
            }
            dest = dest.map(|d| d + a.ty.size());
        }
        total
    }

    /// Stage 3 for one element; returns string bytes consumed.
    fn store(
        &self,
        insn: &Insn,
        ty: FetchType,
        val: Val<'_>,
        ctx: &dyn FetchContext,
        dest: Option<usize>,
        area: Option<&mut DynArea<'_>>,
    ) -> usize {
        let size = ty.size();
        match insn {
            Insn::StRaw(n) => {
                if let (Some(d), Some(ar)) = (dest, area) {
                    le_store(&mut ar.out[d..d + *n as usize], val.v);
                }
                0
            }
            Insn::StMem { offset, size, user } => {
                if let (Some(d), Some(ar)) = (dest, area) {
                    let slot = &mut ar.out[d..d + *size as usize];
                    if !ctx.read(val.v.wrapping_add(*offset as u64), slot, *user) {
                        slot.fill(0);
                    }
                }
                0
            }
            Insn::StString { offset, user } => {
                let src_local = val.local.filter(|_| *offset == 0);
                let addr = val.v.wrapping_add(*offset as u64);
                match (dest, area) {
                    (Some(d), Some(ar)) => {
                        let start = ar.pos;
                        let room = (ar.out.len() - start).min(MAX_STRING_SIZE);
                        let buf = &mut ar.out[start..start + room];
                        let len = if room == 0 {
                            0
                        } else {
                            let copied = match src_local {
                                Some(l) => {
                                    let n = l.iter().position(|&c| c == 0).unwrap_or(l.len());
                                    let n = n.min(room);
                                    buf[..n].copy_from_slice(&l[..n]);
                                    Some(n)
                                }
                                None => ctx.read_str(addr, buf, *user),
                            };
                            match copied {
                                Some(n) if n >= room => {
                                    buf[room - 1] = 0;
                                    room
                                }
                                Some(n) => {
                                    buf[n] = 0;
                                    n + 1
                                }
                                None => 0,
                            }
                        };
                        let dl =
                            ((len as u32) << 16) | ((COMMON_HEADER_SIZE + start) as u32 & 0xffff);
                        ar.out[d..d + size].copy_from_slice(&dl.to_le_bytes());
                        ar.pos += len;
                        len
                    }
                    _ => match src_local {
                        Some(l) => {
                            l.iter()
                                .position(|&c| c == 0)
                                .unwrap_or(l.len())
                                .min(MAX_STRING_SIZE - 1)
                                + 1
                        }
                        None => string_len(ctx, addr, *user),
                    },
                }
            }
            Insn::StSymStr => {
                let mut tmp = [0u8; 256];
                let mut w = SliceWriter {
                    buf: &mut tmp,
                    len: 0,
                };
                match self
                    .inventory
                    .as_ref()
                    .and_then(|inv| inv.lookup(val.v as usize))
                {
                    Some((sym, off)) => {
                        let _ = write!(w, "{}+{:#x}/{:#x}", sym.name, off, sym.size);
                    }
                    None => {
                        let _ = write!(w, "{:#x}", val.v);
                    }
                }
                let n = w.len.min(tmp.len() - 1);
                match (dest, area) {
                    (Some(d), Some(ar)) => {
                        let start = ar.pos;
                        let room = ar.out.len() - start;
                        let len = if room == 0 {
                            0
                        } else {
                            let k = n.min(room - 1);
                            ar.out[start..start + k].copy_from_slice(&tmp[..k]);
                            ar.out[start + k] = 0;
                            k + 1
                        };
                        let dl =
                            ((len as u32) << 16) | ((COMMON_HEADER_SIZE + start) as u32 & 0xffff);
                        ar.out[d..d + 4].copy_from_slice(&dl.to_le_bytes());
                        ar.pos += len;
                        len
                    }
                    _ => n + 1,
                }
            }
            _ => 0,
        }
    }
}

/// `strnlen` of a string in memory, NUL included; 0 on a fault.
fn string_len(ctx: &dyn FetchContext, addr: u64, user: bool) -> usize {
    let mut chunk = [0u8; 64];
    let mut total = 0;
    while total < MAX_STRING_SIZE {
        let want = chunk.len().min(MAX_STRING_SIZE - total);
        match ctx.read_str(addr.wrapping_add(total as u64), &mut chunk[..want], user) {
            None => return if total == 0 { 0 } else { total + 1 },
            Some(n) if n < want => return total + n + 1,
            Some(n) => total += n,
        }
    }
    MAX_STRING_SIZE
}

fn apply_bitfield(insn: &Insn, slot: &mut [u8]) {
    if let Insn::ModBitfield {
        basesize,
        lshift,
        rshift,
    } = *insn
    {
        let n = basesize as usize;
        let bits = (n * 8) as u32;
        let v = le_load(&slot[..n]);
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let v = ((v << lshift) & mask) >> rshift;
        le_store(&mut slot[..n], v);
    }
}

impl Program {
    /// Appends ` name=value` for every argument of `record` (the whole
    /// record, common header included), as `trace_probe_print_args`.
    /// `inventory` resolves `symbol` arguments (`%pS`).
    pub fn print_args(&self, record: &[u8], inventory: Option<&Inventory>, out: &mut String) {
        let base = COMMON_HEADER_SIZE + self.header;
        for a in self.args.iter() {
            let _ = write!(out, " {}=", a.name);
            let start = base + a.offset;
            let n = a.count.max(1) as usize;
            if a.count > 0 {
                out.push('{');
            }
            for j in 0..n {
                let at = start + j * a.ty.size();
                print_value(a.ty, record, at, inventory, out);
                if a.count > 0 {
                    out.push(if j + 1 == n { '}' } else { ',' });
                }
            }
        }
    }

    /// The whole trace line body as the kernel prints it:
    /// `name: (vfs_read+0x4/0x340) count=1`, `name: (caller+0x75/0x100 <- vfs_read) arg1=1`,
    /// `name: (sched.sched_switch) prev=1`.
    pub fn print_event(
        &self,
        def: &ProbeDefinition,
        record: &[u8],
        inventory: Option<&Inventory>,
        out: &mut String,
    ) {
        let word = |at: usize| record.get(at..at + 8).map_or(0, le_load) as usize;
        let sym = |addr: usize, offset: bool, out: &mut String| match inventory {
            Some(inv) => inv.write_sym(out, addr, offset),
            None => {
                let _ = write!(out, "0x{addr:08x}");
            }
        };
        let _ = write!(out, "{}: (", def.event);
        match self.kind {
            ProbeKind::Eprobe => {
                let _ = write!(out, "{}.{}", def.target_system, def.target);
            }
            k if k.is_return() => {
                sym(word(COMMON_HEADER_SIZE + 8), true, out);
                out.push_str(" <- ");
                sym(word(COMMON_HEADER_SIZE), false, out);
            }
            _ => sym(word(COMMON_HEADER_SIZE), true, out),
        }
        out.push(')');
        self.print_args(record, inventory, out);
    }
}

fn print_value(ty: FetchType, rec: &[u8], at: usize, inv: Option<&Inventory>, out: &mut String) {
    let size = ty.size();
    let Some(raw) = rec.get(at..at + size) else {
        out.push_str("(fault)");
        return;
    };
    let v = le_load(raw);
    let _ = match ty {
        FetchType::U(_) => write!(out, "{v}"),
        FetchType::S(n) => {
            let s = match n {
                1 => v as u8 as i8 as i64,
                2 => v as u16 as i16 as i64,
                4 => v as u32 as i32 as i64,
                _ => v as i64,
            };
            write!(out, "{s}")
        }
        FetchType::X(_) => write!(out, "0x{v:x}"),
        FetchType::Char => write!(out, "'{}'", char::from(v as u8)),
        FetchType::Symbol => match inv {
            Some(inv) => write!(out, "{}", inv.format_sym_off(v as usize)),
            None => write!(out, "{v:#x}"),
        },
        FetchType::String | FetchType::UString | FetchType::SymStr => {
            let dl = v as u32;
            let (len, off) = ((dl >> 16) as usize, (dl & 0xffff) as usize);
            match rec.get(off..off + len) {
                Some(s) if len > 0 => {
                    let s = &s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())];
                    write!(out, "\"{}\"", String::from_utf8_lossy(s))
                }
                _ => write!(out, "(fault)"),
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_command, DynCommand, ProbeEnv};

    struct Regs([u64; 6]);

    struct RegsEnv;

    impl ProbeEnv for RegsEnv {
        fn fprobe_registers(&self) -> bool {
            true
        }
    }

    impl FetchContext for Regs {
        fn arg(&self, n: usize) -> u64 {
            self.0.get(n).copied().unwrap_or(0)
        }
        fn register(&self, name: &str) -> Option<u64> {
            match name {
                "di" => Some(self.0[0]),
                "si" => Some(self.0[1]),
                "dx" => Some(self.0[2]),
                _ => None,
            }
        }
        fn stack_pointer(&self) -> u64 {
            0x7ffd_0000_1000
        }
        fn return_value(&self) -> u64 {
            0xdead_beef_f00d
        }
        fn comm(&self) -> &[u8] {
            b"t\0"
        }
        fn probe_ip(&self) -> u64 {
            0x401000
        }
        fn return_ip(&self) -> u64 {
            0x402000
        }
    }

    /// The direct path writes exactly what the interpreter writes, for
    /// every shape it takes, and is not taken for the others.
    #[test]
    fn direct_loads_match_the_interpreter() {
        let ctx = Regs([0x1122_3344_5566_7788, u64::MAX - 5, 0x80, 3, 0xffff_ffff, 9]);
        let cases = [
            ("f:t/a f a=$arg1 b=$arg2", true),
            (
                "f:t/b f a=$arg1:u8 b=$arg2:s16 c=$arg3:x32 d=$arg6:s64",
                true,
            ),
            ("f:t/c f%return r=$retval ret=$retval:u32", true),
            (
                "f:t/d f x=%di y=%si:u16 z=%ax:u64 imm=\\42:s32 sp=$stack",
                true,
            ),
            ("f:t/e f s=+0($arg1):u32", false),
            ("f:t/f f c=$comm", false),
            ("f:t/g f b=$arg1:b3@2/32", false),
        ];
        for (line, direct) in cases {
            direct_matches_interpreter(line, &RegsEnv, &ctx, direct);
        }
    }

    /// Compiles `line` and checks that it takes the direct path exactly when `direct`
    /// says, and that the direct path stores what the interpreter stores.
    fn direct_matches_interpreter<C: FetchContext>(
        line: &str,
        env: &dyn ProbeEnv,
        ctx: &C,
        direct: bool,
    ) {
        let d = match parse_command(line, env) {
            Ok(DynCommand::Create(d)) => d,
            other => panic!("{line}: {other:?}"),
        };
        let fast = d.compile(None);
        let codes: Vec<_> = d.args.iter().map(|a| (&a.code, a.ty, a.count)).collect();
        let taken = fast.direct.is_some() || fast.copies.is_some();
        assert_eq!(taken, direct, "{line}: {codes:?}");
        let mut slow = fast.clone();
        slow.direct = None;
        slow.copies = None;
        let n = fast.record_size(ctx);
        assert_eq!(n, slow.record_size(ctx), "{line}");
        let (mut a, mut b) = (vec![0xAAu8; n], vec![0x55u8; n]);
        assert_eq!(fast.run(ctx, &mut a), slow.run(ctx, &mut b), "{line}");
        assert_eq!(a, b, "{line}");
    }

    /// A source record for eprobes: fields of every layout class.
    struct Rec(Vec<u8>);

    struct RecEnv;

    impl ProbeEnv for RecEnv {
        fn event_fields(&self, _system: &str, _event: &str) -> Option<Vec<FieldSpec>> {
            let f = |name: &str, c_type: &str, offset, size, signed, kind| FieldSpec {
                name: name.into(),
                c_type: c_type.into(),
                offset,
                size,
                signed,
                kind,
            };
            Some(vec![
                f("b", "s8", 8, 1, true, FieldKind::Int),
                f("h", "s16", 10, 2, true, FieldKind::Int),
                f("w", "int", 12, 4, true, FieldKind::Int),
                f("u", "unsigned int", 16, 4, false, FieldKind::Int),
                f("pad", "u32", 20, 4, false, FieldKind::Int),
                f("q", "u64", 24, 8, false, FieldKind::Int),
                f(
                    "arr",
                    "u8[4]",
                    32,
                    4,
                    false,
                    FieldKind::IntArray {
                        elem_size: 1,
                        len: 4,
                    },
                ),
                f("name", "char[8]", 40, 8, false, FieldKind::CharArray),
                f("s", "__data_loc char[]", 48, 4, false, FieldKind::DynString),
            ])
        }
    }

    impl FetchContext for Rec {
        fn arg(&self, _n: usize) -> u64 {
            0
        }
        fn stack_pointer(&self) -> u64 {
            0
        }
        fn comm(&self) -> &[u8] {
            b"t\0"
        }
        fn event_record(&self) -> &[u8] {
            &self.0
        }
    }

    /// The source record of [`RecEnv`]'s event, every field a distinct value.
    fn rec_bytes() -> Vec<u8> {
        let mut rec = vec![0u8; 64];
        rec[8] = 0xfe;
        rec[10..12].copy_from_slice(&(-300i16).to_le_bytes());
        rec[12..16].copy_from_slice(&(-7i32).to_le_bytes());
        rec[16..20].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        rec[20..24].copy_from_slice(&0x8765_4321u32.to_le_bytes());
        rec[24..32].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        rec[32..36].copy_from_slice(&[1, 2, 3, 4]);
        rec[40..44].copy_from_slice(b"abc\0");
        rec[48..52].copy_from_slice(&((3u32 << 16) | 56).to_le_bytes());
        rec[56..59].copy_from_slice(b"xy\0");
        rec
    }

    /// Numbers read from the source record take the copy plan and store what the
    /// interpreter stores (sign extension, truncation, adjacent fields merged, strings
    /// and char arrays beside them, a source record too short for the plan); programs
    /// with no numeric field do not take it.
    #[test]
    fn field_copies_match_the_interpreter() {
        let cases = [
            ("e:t/a s.e b=$b h=$h w=$w u=$u q=$q", true),
            (
                "e:t/b s.e b=$b:u64 h=$h:s64 w=$w:x64 u=$u:s8 arr=$arr:u32",
                true,
            ),
            ("e:t/c s.e q=$q:u16 w=$w:u8", true),
            ("e:t/d s.e n=$name", false),
            ("e:t/e s.e s=$s", false),
            ("e:t/f s.e q=$q s=$s:string", true),
            ("e:t/g s.e h=$h w=$w u=$u pad=$pad q=$q", true),
            ("e:t/h s.e u=$u pad=$pad q=$q arr=$arr:u8", true),
            ("e:t/i s.e n=$name w=$w s=$s u=$u c=$comm b=$b:s16", true),
            ("e:t/j s.e w=$w u=$u:u16 pad=$pad", true),
        ];
        for len in [64, 28, 0] {
            let ctx = Rec(rec_bytes()[..len].to_vec());
            for (line, direct) in cases {
                direct_matches_interpreter(line, &RecEnv, &ctx, direct);
            }
        }
    }

    /// Fields adjacent in both records become one copy of the right width; a gap in
    /// either record, a widening or an argument between them keeps them apart.
    #[test]
    fn field_copies_merge_adjacent_fields() {
        use FieldCopy::*;
        let plan = |line: &str| {
            let Ok(DynCommand::Create(d)) = parse_command(line, &RecEnv) else {
                panic!("{line}");
            };
            let copies = d.compile(None).copies.expect("a copy plan");
            (copies.ops.to_vec(), copies.rest.to_vec())
        };
        let cases: [(&str, Vec<FieldCopy>, Vec<u16>); 6] = [
            // Source 12..20 into body 0..8.
            (
                "e:t/a s.e w=$w:s32 u=$u:u32",
                vec![B8 { src: 12, dst: 0 }],
                vec![],
            ),
            // 10..32: 22 bytes.
            (
                "e:t/b s.e h=$h:s16 w=$w:s32 u=$u:u32 pad=$pad:u32 q=$q",
                vec![Span {
                    src: 10,
                    dst: 0,
                    len: 22,
                }],
                vec![],
            ),
            (
                "e:t/c s.e q=$q arr=$arr:u32",
                vec![B16 {
                    src: 24,
                    dst: 0,
                    len: 12,
                }],
                vec![],
            ),
            // A gap in the source (8..9, then 10).
            (
                "e:t/d s.e b=$b:s8 h=$h:s16",
                vec![B1 { src: 8, dst: 0 }, B2 { src: 10, dst: 1 }],
                vec![],
            ),
            // A narrower store leaves a gap in the source.
            (
                "e:t/e s.e u=$u:u16 pad=$pad:u8",
                vec![B2 { src: 16, dst: 0 }, B1 { src: 20, dst: 2 }],
                vec![],
            ),
            (
                "e:t/f s.e w=$w:s64 s=$s:string u=$u:u32",
                vec![
                    Widen {
                        src: 12,
                        dst: 0,
                        from: 4,
                        to: 8,
                        signed: true,
                    },
                    B4 { src: 16, dst: 12 },
                ],
                vec![1],
            ),
        ];
        for (line, ops, rest) in cases {
            assert_eq!(plan(line), (ops, rest), "{line}");
        }
    }
}
