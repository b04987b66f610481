//! Fetch arguments: the text after the probe point, compiled into flat
//! instruction lists (the kernel's `fetch_insn` arrays).
//!
//! Every argument becomes at most 16 instructions run in five stages:
//!
//! ```text
//!  +8(+0($arg1)):u32[2]
//!  ─────────────────────   load      Arg(0)                 value = 1st argument
//!                          deref     Deref{+0}              value = *(value + 0)
//!                          store     StMem{+8, 4 bytes}     copy 4 bytes at value+8
//!                          modify    (bitfield shifts, when `b<w>@<o>/<s>`)
//!                          loop      LpArray(2)             repeat the store one element on
//! ```
//!
//! Parsing follows the kernel's order of checks so that a rejected argument
//! reports the same error id at the same byte. Offsets in errors are
//! relative to the start of the argument word.

use ustrace_inspect::debuginfo::{BaseEncoding, FunctionInfo, TypeId, TypeKind, TypeTable};

use crate::env::{FieldKind, FieldSpec, ProbeEnv};
use crate::error::{ArgError, Errno, ErrorId as E};
use crate::num::{
    kstrtol, kstrtol_checked, kstrtouint, kstrtoul, kstrtoul_checked, simple_strtoul, NumError,
};
use crate::types::FetchType;

/// Longest argument expression (`MAX_ARGSTR_LEN`).
pub const MAX_ARGSTR_LEN: usize = 63;
/// Longest argument name (`MAX_ARG_NAME_LEN`).
pub const MAX_ARG_NAME_LEN: usize = 32;
/// Most elements in a `TYPE[N]` array.
pub const MAX_ARRAY_LEN: u32 = 64;
/// Most instructions per argument, the final `End` included.
pub const FETCH_INSN_MAX: usize = 16;
/// Largest `$stackN`/`$argN` index (kernel thread stack / word size).
pub const PARAM_MAX_STACK: u64 = 16384 / 8;
/// Largest fixed part of a probe record (`MAX_PROBE_EVENT_SIZE`).
pub const MAX_PROBE_EVENT_SIZE: usize = 3072;
/// Longest string one argument stores, NUL included (`MAX_STRING_SIZE`).
pub const MAX_STRING_SIZE: usize = 4096;

const RESERVED_FIELD_NAMES: &[&str] = &[
    "common_type",
    "common_flags",
    "common_preempt_count",
    "common_pid",
    "common_tgid",
    "__probe_ip",
    "__probe_ret_ip",
    "__probe_func",
];

/// x86-64 `pt_regs` register names accepted by `%REG`, in `pt_regs` order.
pub const REGISTER_NAMES: &[&str] = &[
    "r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8", "ax", "cx", "dx", "si", "di",
    "orig_ax", "ip", "cs", "flags", "sp", "ss",
];

/// One instruction of a fetch program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Insn {
    /// Load register `REGISTER_NAMES[n]`.
    Reg(u8),
    /// Load the n-th word of the stack.
    Stack(u32),
    /// Load the stack pointer.
    StackP,
    /// Load the return value.
    RetVal,
    /// Load an immediate (also the address of `@ADDR` and `@SYM`).
    Imm(u64),
    /// Where the kernel keeps an unresolved `@SYM`; skipped when run.
    SymbolPlaceholder,
    /// Load the address of the current task's comm (a string source).
    Comm,
    /// Load the n-th (0-based) integer argument.
    Arg(u32),
    /// Load a word saved at function entry, at this byte offset of the entry data.
    EntryData(u32),
    /// Load file offset + the probed object's load base (uprobes' `@+OFFS`).
    FileOffset(i64),
    /// Load the address of immediate string bytes (`\"text"`).
    Data(Box<[u8]>),
    /// Load a field of the source event record (eprobes' `$FIELD`).
    EventField {
        /// Byte offset in the source record.
        offset: u32,
        /// Size in bytes.
        size: u8,
        /// Sign-extend when loading.
        signed: bool,
        /// How the field is laid out (strings load their address).
        kind: FieldKind,
    },
    /// value = *(value + offset), kernel or user memory.
    Deref {
        /// Byte offset added before the load.
        offset: i64,
        /// `+u` user dereference.
        user: bool,
    },
    /// Store the value itself, `size` bytes.
    StRaw(u8),
    /// Store `size` bytes read at value + offset.
    StMem {
        /// Byte offset.
        offset: i64,
        /// Bytes to copy.
        size: u8,
        /// User memory.
        user: bool,
    },
    /// Store the NUL-terminated string at value + offset as `__data_loc`.
    StString {
        /// Byte offset.
        offset: i64,
        /// User memory.
        user: bool,
    },
    /// Store `symbol+0xoff/0xsize` of the value as `__data_loc` text.
    StSymStr,
    /// Keep bits: `v = (v << lshift) >> rshift` on the stored `basesize` bytes.
    ModBitfield {
        /// Size of the stored value.
        basesize: u8,
        /// Left shift.
        lshift: u8,
        /// Right shift.
        rshift: u8,
    },
    /// Repeat the store for `n` elements.
    LpArray(u32),
    /// End of the program.
    End,
}

/// What kind of probe an argument belongs to (the kernel's `TPARG_FL_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArgFlags {
    /// Kernel-side probe (everything but uprobes).
    pub kernel: bool,
    /// Function exit (return value, entry data).
    pub ret: bool,
    /// Function entry (arguments readable).
    pub fentry: bool,
    /// Tracepoint probe.
    pub tpoint: bool,
    /// fprobe/tprobe (no registers).
    pub fprobe: bool,
    /// Event probe (`$FIELD`).
    pub tevent: bool,
}

impl ArgFlags {
    fn is_function_entry(self) -> bool {
        self.kernel && self.fentry && !self.ret
    }

    fn is_function_return(self) -> bool {
        self.kernel && self.ret
    }
}

/// One compiled argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgDef {
    /// Field name.
    pub name: String,
    /// The expression as written (shown after `name=` when read back).
    pub comm: String,
    /// Fetch type.
    pub ty: FetchType,
    /// Array length (`0` for a scalar).
    pub count: u32,
    /// Offset of the field in the argument area.
    pub offset: usize,
    /// Instructions.
    pub code: Vec<Insn>,
}

impl ArgDef {
    /// Whether this argument stores a `__data_loc` string.
    pub fn dynamic(&self) -> bool {
        self.ty.is_string()
    }

    /// Bytes in the fixed part of the record.
    pub fn fixed_size(&self) -> usize {
        self.ty.size() * (self.count.max(1) as usize)
    }
}

/// Function arguments an exit probe needs saved at entry (the kernel's
/// `probe_entry_arg`): `args[i]` is stored at byte `8 * i` of the entry data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryArgs {
    /// 0-based argument indexes, in storing order.
    pub args: Vec<u32>,
}

impl EntryArgs {
    fn offset_of(&mut self, arg: u32) -> u32 {
        if let Some(i) = self.args.iter().position(|&a| a == arg) {
            return (i * 8) as u32;
        }
        self.args.push(arg);
        ((self.args.len() - 1) * 8) as u32
    }

    /// Bytes of entry data the exit handler needs.
    pub fn size(&self) -> usize {
        self.args.len() * 8
    }
}

/// Lazily-queried debug info of the probed function (`query_btf_context`).
pub(crate) struct DebugInfo<'e> {
    env: &'e dyn ProbeEnv,
    func: String,
    /// Whether `func` names a tracepoint (`t` probes) rather than a function.
    tracepoint: bool,
    state: Option<Option<FunctionInfo>>,
}

impl<'e> DebugInfo<'e> {
    pub(crate) fn new(env: &'e dyn ProbeEnv, func: &str) -> DebugInfo<'e> {
        DebugInfo {
            env,
            func: func.to_owned(),
            tracepoint: false,
            state: None,
        }
    }

    /// Signature lookups for a tracepoint rather than a function.
    pub(crate) fn for_tracepoint(env: &'e dyn ProbeEnv, name: &str) -> DebugInfo<'e> {
        DebugInfo {
            tracepoint: true,
            ..DebugInfo::new(env, name)
        }
    }

    pub(crate) fn get(&mut self) -> Option<&FunctionInfo> {
        if self.state.is_none() {
            self.state = Some(if self.func.is_empty() {
                None
            } else if self.tracepoint {
                self.env.tracepoint_info(&self.func)
            } else {
                self.env.function_info(&self.func)
            });
        }
        self.state.as_ref().and_then(Option::as_ref)
    }
}

/// Per-command parsing state shared by all arguments.
pub(crate) struct ArgParser<'a, 'e> {
    pub flags: ArgFlags,
    pub debug: &'a mut DebugInfo<'e>,
    pub env: &'e dyn ProbeEnv,
    pub fields: Option<&'a [FieldSpec]>,
    pub entry: &'a mut EntryArgs,
    /// Bytes of the argument area used so far.
    pub size: usize,
    /// Set when an `@SYM` does not resolve: the kernel reports it at
    /// registration, against the probe point.
    pub unresolved_symbol: bool,
}

/// Per-argument state (`traceprobe_parse_context` fields that change).
struct Cursor {
    offset: usize,
    code: Vec<Insn>,
    last_type: Option<TypeId>,
    last_bits: Option<(u64, u64)>,
}

impl Cursor {
    /// Appends an instruction where the kernel does `++code == end`.
    fn push(&mut self, insn: Insn, err_offset: usize, errno: Errno) -> Result<(), ArgError> {
        if self.code.len() >= FETCH_INSN_MAX - 1 {
            return Err(ArgError::with(E::TOO_MANY_OPS, err_offset, errno));
        }
        self.code.push(insn);
        Ok(())
    }
}

fn is_good_name(name: &str) -> bool {
    let b = name.as_bytes();
    match b.first() {
        Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {}
        _ => return false,
    }
    b[1..]
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

pub(crate) fn is_good_identifier(name: &str) -> bool {
    is_good_name(name)
}

impl ArgParser<'_, '_> {
    /// `traceprobe_parse_probe_arg`: one `[NAME=]FETCHARG[:TYPE]` word, the
    /// `index`-th argument (0-based), given the args parsed so far.
    pub(crate) fn parse(
        &mut self,
        index: usize,
        word: &str,
        previous: &[ArgDef],
    ) -> Result<ArgDef, ArgError> {
        let (name, body, body_off) = match word.find('=') {
            Some(eq) => {
                if eq > MAX_ARG_NAME_LEN {
                    return Err(ArgError::new(E::ARG_NAME_TOO_LONG, 0));
                }
                if eq == 0 {
                    return Err(ArgError::new(E::NO_ARG_NAME, 0));
                }
                (word[..eq].to_owned(), &word[eq + 1..], eq + 1)
            }
            None => {
                let end = word.find(':').unwrap_or(word.len());
                let candidate = &word[..end];
                let name = if is_good_name(candidate) {
                    candidate.to_owned()
                } else {
                    format!("arg{}", index + 1)
                };
                (name, word, 0)
            }
        };
        if !is_good_name(&name) {
            return Err(ArgError::new(E::BAD_ARG_NAME, 0));
        }
        if RESERVED_FIELD_NAMES.contains(&name.as_str()) || previous.iter().any(|a| a.name == name)
        {
            return Err(ArgError::new(E::USED_ARG_NAME, 0));
        }
        self.parse_body(name, body, body_off)
    }

    /// `traceprobe_parse_probe_arg_body`.
    fn parse_body(&mut self, name: String, body: &str, offset: usize) -> Result<ArgDef, ArgError> {
        if body.len() > MAX_ARGSTR_LEN {
            return Err(ArgError::with(E::ARG_TOO_LONG, offset, Errno::TooBig));
        }
        if body.is_empty() {
            return Err(ArgError::new(E::NO_ARG_BODY, offset));
        }
        let comm = body.to_owned();

        // Split off ":TYPE[N]".
        let (expr, type_name, type_off, count) = match body.find(':') {
            None => (body, None, 0, 0u32),
            Some(colon) => {
                let t_start = colon + 1;
                let t = &body[t_start..];
                let mut count = 0;
                let tname = match t.find('[') {
                    None => t,
                    Some(lb) => {
                        let inner_start = t_start + lb + 1;
                        let inner = &body[inner_start..];
                        let Some(rb) = inner.find(']') else {
                            return Err(ArgError::new(E::ARRAY_NO_CLOSE, offset + body.len()));
                        };
                        if rb + 1 != inner.len() {
                            return Err(ArgError::new(
                                E::BAD_ARRAY_SUFFIX,
                                offset + inner_start + rb + 1,
                            ));
                        }
                        match kstrtouint(&inner[..rb], 0) {
                            Some(n) if n > 0 => count = n,
                            _ => return Err(ArgError::new(E::BAD_ARRAY_NUM, offset + inner_start)),
                        }
                        if count > MAX_ARRAY_LEN {
                            return Err(ArgError::new(E::ARRAY_TOO_BIG, offset + inner_start));
                        }
                        &t[..lb]
                    }
                };
                (&body[..colon], Some(tname), t_start, count)
            }
        };

        let user = !self.flags.kernel;
        let string_only =
            !self.flags.tevent && (expr == "$comm" || expr == "$COMM" || expr.starts_with("\\\""));
        let mut ty = if string_only {
            if count != 0 || type_name.is_some_and(|t| t != "string") {
                return Err(ArgError::new(E::NEED_STRING_TYPE, offset + type_off));
            }
            FetchType::String
        } else {
            match FetchType::lookup(type_name, user) {
                Some(t) => t,
                None => return Err(ArgError::new(E::BAD_TYPE, offset + type_off)),
            }
        };

        let mut cur = Cursor {
            offset,
            code: Vec::with_capacity(FETCH_INSN_MAX),
            last_type: None,
            last_bits: None,
        };
        self.parse_expr(expr, &mut cur)?;

        // Debug-info typed values: pick the type, or prepare a string fetch.
        if let Some(last) = cur.last_type {
            let info = self.debug.get().cloned();
            if let Some(info) = info {
                match type_name {
                    None => {
                        ty = btf_fetch_type(&info.types, last, &cur);
                    }
                    Some(t) if t.contains("string") => {
                        let types = &info.types;
                        if is_byte_array(types, last) {
                        } else if is_byte_pointer(types, last) {
                            let user = t.starts_with('u');
                            cur.push(Insn::Deref { offset: 0, user }, cur.offset, Errno::TooBig)?;
                        } else {
                            return Err(ArgError::new(E::BAD_TYPE4STR, cur.offset));
                        }
                    }
                    Some(_) => {}
                }
            }
        }

        let arg_offset = self.size;
        self.size += ty.size() * (count.max(1) as usize);
        if self.size > MAX_PROBE_EVENT_SIZE {
            return Err(ArgError::with(E::EVENT_TOO_BIG, cur.offset, Errno::TooBig));
        }
        let base_off = offset;
        self.finalize(&mut cur, ty, count, type_name, base_off + type_off)?;
        Ok(ArgDef {
            name,
            comm,
            ty,
            count,
            offset: arg_offset,
            code: cur.code,
        })
    }

    /// `finalize_fetch_insn`: store, modify and loop stages.
    fn finalize(
        &mut self,
        cur: &mut Cursor,
        ty: FetchType,
        count: u32,
        type_name: Option<&str>,
        type_pos: usize,
    ) -> Result<(), ArgError> {
        let last = cur.code.last().cloned().unwrap_or(Insn::End);
        if ty.is_string() {
            let is_load_value = matches!(
                last,
                Insn::Imm(_) | Insn::Comm | Insn::Data(_) | Insn::EventField { .. }
            );
            if ty == FetchType::SymStr {
                let ok = matches!(
                    last,
                    Insn::Reg(_)
                        | Insn::Stack(_)
                        | Insn::RetVal
                        | Insn::Arg(_)
                        | Insn::Deref { user: false, .. }
                        | Insn::EventField { .. }
                );
                if !ok {
                    return Err(ArgError::new(E::BAD_SYMSTRING, type_pos));
                }
            } else {
                let ok = matches!(last, Insn::Deref { .. }) || is_load_value;
                if !ok {
                    return Err(ArgError::new(E::BAD_STRING, type_pos));
                }
            }
            let keep_last = ty == FetchType::SymStr || is_load_value || count != 0;
            let user_deref = matches!(last, Insn::Deref { user: true, .. });
            let (deref_off, replace) = match (&last, keep_last) {
                (Insn::Deref { offset, .. }, false) => (*offset, true),
                _ => (0, false),
            };
            let store = if ty == FetchType::SymStr {
                Insn::StSymStr
            } else {
                Insn::StString {
                    offset: deref_off,
                    user: ty == FetchType::UString || (user_deref && replace),
                }
            };
            if replace {
                *cur.code.last_mut().expect("a deref precedes") = store;
            } else {
                cur.push(store, cur.offset, Errno::Inval)?;
            }
        } else if let Insn::Deref { offset, user } = last {
            *cur.code.last_mut().expect("a deref precedes") = Insn::StMem {
                offset,
                size: ty.size() as u8,
                user,
            };
        } else {
            cur.push(Insn::StRaw(ty.size() as u8), cur.offset, Errno::TooBig)?;
        }
        let store_at = cur.code.len() - 1;

        if let Some(t) = type_name {
            if t.starts_with('b') {
                let bf = parse_bitfield(t, ty)
                    .ok_or_else(|| ArgError::new(E::BAD_BITFIELD, type_pos))?;
                if cur.code.len() >= FETCH_INSN_MAX - 1 {
                    return Err(ArgError::new(E::BAD_BITFIELD, type_pos));
                }
                cur.code.push(bf);
            }
        } else if let Some((bit_off, width)) = cur.last_bits {
            if width % 8 != 0 || bit_off != 0 {
                let bits = (ty.size() * 8) as u64;
                if width + bit_off <= bits {
                    cur.push(
                        Insn::ModBitfield {
                            basesize: ty.size() as u8,
                            lshift: (bits - (width + bit_off)) as u8,
                            rshift: (bits - width) as u8,
                        },
                        cur.offset,
                        Errno::Inval,
                    )?;
                }
            }
        }

        if count != 0 {
            let ok = matches!(
                cur.code[store_at],
                Insn::StMem { .. } | Insn::StString { .. }
            );
            if !ok {
                return Err(ArgError::new(E::BAD_STRING, type_pos));
            }
            cur.push(Insn::LpArray(count), cur.offset, Errno::TooBig)?;
        }
        cur.code.push(Insn::End);
        Ok(())
    }

    /// `parse_probe_arg`: the recursive expression parser. `arg` starts at
    /// `cur.offset` in the argument word.
    fn parse_expr(&mut self, arg: &str, cur: &mut Cursor) -> Result<(), ArgError> {
        let b = arg.as_bytes();
        let first = b.first().copied().unwrap_or(0);
        let before = cur.code.len();
        match first {
            b'$' => self.parse_var(arg, cur)?,
            b'%' => {
                if self.flags.tevent || (self.flags.fprobe && !self.env.fprobe_registers()) {
                    return Err(ArgError::new(E::BAD_VAR, cur.offset));
                }
                match REGISTER_NAMES.iter().position(|r| *r == &arg[1..]) {
                    Some(n) => cur.code.push(Insn::Reg(n as u8)),
                    None => return Err(ArgError::new(E::BAD_REG_NAME, cur.offset)),
                }
            }
            b'@' => {
                let second = b.get(1).copied().unwrap_or(0);
                if second.is_ascii_digit() {
                    let addr = kstrtoul_checked(&arg[1..], 0)
                        .map_err(|e| num_error(E::BAD_MEM_ADDR, cur.offset, e))?;
                    cur.code.push(Insn::Imm(addr));
                } else if second == b'+' {
                    if self.flags.kernel {
                        return Err(ArgError::new(E::FILE_ON_KPROBE, cur.offset));
                    }
                    let off = kstrtol_checked(&arg[2..], 0)
                        .map_err(|e| num_error(E::BAD_FILE_OFFS, cur.offset, e))?;
                    cur.code.push(Insn::FileOffset(off));
                } else {
                    if !self.flags.kernel {
                        return Err(ArgError::new(E::SYM_ON_UPROBE, cur.offset));
                    }
                    let spec = &arg[1..];
                    let (sym, off) = match spec.find(['+', '-']) {
                        Some(p) => match kstrtol(&spec[p..], 0) {
                            Some(o) => (&spec[..p], o),
                            None => {
                                self.unresolved_symbol = true;
                                (spec, 0)
                            }
                        },
                        None => (spec, 0),
                    };
                    let addr = match self.env.resolve_symbol(sym) {
                        Some(a) => a.wrapping_add(off as u64),
                        None => {
                            self.unresolved_symbol = true;
                            0
                        }
                    };
                    // The kernel keeps a symbol placeholder before the load.
                    cur.code.push(Insn::SymbolPlaceholder);
                    cur.push(Insn::Imm(addr), cur.offset, Errno::Inval)?;
                }
                cur.push(
                    Insn::Deref {
                        offset: 0,
                        user: false,
                    },
                    cur.offset,
                    Errno::Inval,
                )?;
            }
            b'+' | b'-' => {
                // The kernel drops the 'u' without advancing its offset base,
                // so carets after "+u" sit one byte early; kept for parity.
                let user = b.get(1) == Some(&b'u');
                let mut s: String = if user {
                    let mut t = String::with_capacity(arg.len());
                    t.push(first as char);
                    t.push_str(&arg[2..]);
                    t
                } else {
                    arg.to_owned()
                };
                if s.starts_with('+') {
                    s.remove(0);
                }
                let Some(lp) = s.find('(') else {
                    return Err(ArgError::new(E::DEREF_NEED_BRACE, cur.offset));
                };
                let offset = kstrtol_checked(&s[..lp], 0)
                    .map_err(|e| num_error(E::BAD_DEREF_OFFS, cur.offset, e))?;
                cur.offset += lp + 1 + usize::from(!s.starts_with('-'));
                let inner_all = &s[lp + 1..];
                let Some(rp) = inner_all.rfind(')') else {
                    return Err(ArgError::new(
                        E::DEREF_OPEN_BRACE,
                        cur.offset + inner_all.len(),
                    ));
                };
                let saved = cur.offset;
                self.parse_expr(&inner_all[..rp], cur)?;
                cur.offset = saved;
                if matches!(cur.code.last(), Some(Insn::Comm | Insn::Data(_))) {
                    return Err(ArgError::new(E::COMM_CANT_DEREF, cur.offset));
                }
                cur.push(Insn::Deref { offset, user }, cur.offset, Errno::Inval)?;
                cur.last_type = None;
                cur.last_bits = None;
            }
            b'\\' => {
                if b.get(1) == Some(&b'"') {
                    let s = &arg[2..];
                    if !s.ends_with('"') {
                        return Err(ArgError::new(E::IMMSTR_NO_CLOSE, cur.offset + 2 + s.len()));
                    }
                    let mut bytes = s.as_bytes()[..s.len() - 1].to_vec();
                    bytes.push(0);
                    cur.code.push(Insn::Data(bytes.into_boxed_slice()));
                } else {
                    let s = &arg[1..];
                    let v = match s.as_bytes().first() {
                        Some(c) if c.is_ascii_digit() => kstrtoul_checked(s, 0),
                        Some(b'-') => kstrtol_checked(s, 0).map(|v| v as u64),
                        Some(b'+') => kstrtol_checked(&s[1..], 0).map(|v| v as u64),
                        _ => Err(NumError::Invalid),
                    };
                    match v {
                        Ok(v) => cur.code.push(Insn::Imm(v)),
                        Err(e) => return Err(num_error(E::BAD_IMM, cur.offset + 1, e)),
                    }
                }
            }
            // 6.18 reads `(TYPE)EXPR` as a debug-info typecast; ustrace has
            // none, and the kernel without BTF refuses it the same way.
            b'(' => {
                return Err(ArgError::with(
                    E::NOSUP_BTFARG,
                    cur.offset,
                    Errno::NotSupported,
                ))
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                if !self.flags.is_function_entry() && !self.flags.is_function_return() {
                    return Err(ArgError::new(E::NOSUP_BTFARG, cur.offset));
                }
                self.parse_btf_arg(arg, cur)?;
            }
            _ => {}
        }
        if cur.code.len() == before {
            return Err(ArgError::new(E::BAD_FETCH_ARG, cur.offset));
        }
        Ok(())
    }

    /// `parse_probe_vars`: `$retval`, `$stack`, `$stackN`, `$comm`, `$argN`, `$FIELD`.
    fn parse_var(&mut self, orig: &str, cur: &mut Cursor) -> Result<(), ArgError> {
        let arg = &orig[1..];
        if self.flags.tevent {
            if let Some(f) = self.fields.and_then(|fs| fs.iter().find(|f| f.name == arg)) {
                cur.code.push(Insn::EventField {
                    offset: f.offset as u32,
                    size: f.size.min(255) as u8,
                    signed: f.signed,
                    kind: f.kind,
                });
                return Ok(());
            }
            if arg == "comm" || arg == "COMM" {
                cur.code.push(Insn::Comm);
                return Ok(());
            }
            // At the `$`, past any `NAME=`, as the kernel's parse_probe_vars reports it
            // (the selftest dynevent/eprobes_syntax_errors.tc checks the caret).
            return Err(ArgError::new(E::BAD_VAR, cur.offset));
        }
        let inval = |id| Err(ArgError::new(id, cur.offset));
        if arg.starts_with("retval") {
            if !self.flags.ret {
                return inval(E::RETVAL_ON_PROBE);
            }
            if !self.flags.kernel {
                cur.code.push(Insn::RetVal);
                return Ok(());
            }
            return self.parse_btf_arg(orig, cur);
        }
        if let Some(rest) = arg.strip_prefix("stack") {
            if rest.is_empty() {
                cur.code.push(Insn::StackP);
                return Ok(());
            }
            if rest.as_bytes()[0].is_ascii_digit() {
                let Some(n) = kstrtoul(rest, 10) else {
                    return inval(E::BAD_VAR);
                };
                if self.flags.kernel && n > PARAM_MAX_STACK {
                    return inval(E::BAD_STACK_NUM);
                }
                cur.code.push(Insn::Stack(n as u32));
                return Ok(());
            }
            return inval(E::BAD_VAR);
        }
        if arg == "comm" || arg == "COMM" {
            cur.code.push(Insn::Comm);
            return Ok(());
        }
        if let Some(rest) = arg.strip_prefix("arg") {
            let Some(n) = kstrtoul(rest, 10) else {
                return inval(E::BAD_VAR);
            };
            if n == 0 || n > PARAM_MAX_STACK {
                return inval(E::BAD_ARG_NUM);
            }
            let idx = (n - 1) as u32;
            if self.flags.is_function_entry() {
                cur.code.push(Insn::Arg(idx));
            } else if self.flags.is_function_return() {
                let off = self.entry.offset_of(idx);
                cur.code.push(Insn::EntryData(off));
            } else {
                return inval(E::NOFENTRY_ARGS);
            }
            return Ok(());
        }
        inval(E::BAD_VAR)
    }

    /// `parse_btf_arg`: a parameter name or `$retval`, then `->`/`.` fields.
    fn parse_btf_arg(&mut self, varname: &str, cur: &mut Cursor) -> Result<(), ArgError> {
        let (base, field) = match split_next_field(varname, cur.offset)? {
            (base, Some((false, _, sep_at))) => {
                let _ = base;
                return Err(ArgError::with(
                    E::NOSUP_DAT_ARG,
                    cur.offset + sep_at,
                    Errno::NotSupported,
                ));
            }
            (base, Some((true, rest_at, _))) => (base, Some(rest_at)),
            (base, None) => (base, None),
        };
        let flags = self.flags;
        let info = self.debug.get().cloned();
        let tid;
        if flags.ret && base == "$retval" {
            cur.code.push(Insn::RetVal);
            match &info {
                Some(info) => match info.ret {
                    None => return Err(ArgError::with(E::NO_RETVAL, cur.offset, Errno::NoEnt)),
                    Some(t) => tid = t,
                },
                None => {
                    if let Some(at) = field {
                        return Err(ArgError::with(
                            E::NO_BTF_ENTRY,
                            cur.offset + at,
                            Errno::NoEnt,
                        ));
                    }
                    return Ok(());
                }
            }
        } else {
            let Some(info) = info.as_ref().filter(|i| !i.params.is_empty()) else {
                return Err(ArgError::with(E::NO_BTF_ENTRY, cur.offset, Errno::NoEnt));
            };
            let Some(p) = info.params.iter().find(|p| p.name == base) else {
                return Err(ArgError::with(E::NO_BTFARG, cur.offset, Errno::NoEnt));
            };
            let Some(abi) = p.abi_index else {
                return Err(ArgError::with(
                    E::NOSUP_BTFARG,
                    cur.offset,
                    Errno::NotSupported,
                ));
            };
            if flags.is_function_entry() {
                cur.code.push(Insn::Arg(abi as u32));
            } else {
                let off = self.entry.offset_of(abi as u32);
                cur.code.push(Insn::EntryData(off));
            }
            tid = p.ty;
        }
        cur.last_type = Some(tid);
        cur.last_bits = None;
        if let Some(at) = field {
            cur.offset += at;
            let info = info.expect("checked above");
            return self.parse_btf_field(&varname[at..], tid, &info.types, cur);
        }
        Ok(())
    }

    /// `parse_btf_field`: `a.b->c` below a pointer of type `ty`.
    fn parse_btf_field(
        &mut self,
        mut fieldname: &str,
        mut ty: TypeId,
        types: &TypeTable,
        cur: &mut Cursor,
    ) -> Result<(), ArgError> {
        loop {
            let TypeKind::Pointer(target) = types.get(types.strip(ty)).kind else {
                return Err(ArgError::new(E::NO_PTR_STRCT, cur.offset));
            };
            let mut agg = target;
            let mut bitoffs: u64 = 0;
            let mut bits;
            let mut more_arrow;
            loop {
                let (name, next) = split_next_field(fieldname, cur.offset)?;
                let Some((off, m)) = types.member(agg, name) else {
                    return Err(ArgError::with(E::NO_BTF_FIELD, cur.offset, Errno::NoEnt));
                };
                let (bo, width) = m.bits.unwrap_or((0, 0));
                bitoffs += off * 8 + bo;
                bits = m.bits.map(|_| width);
                ty = m.ty;
                agg = types.strip(ty);
                match next {
                    Some((arrow, at, _)) => {
                        cur.offset += at;
                        fieldname = &fieldname[at..];
                        more_arrow = arrow;
                        if arrow {
                            break;
                        }
                    }
                    None => {
                        cur.offset += fieldname.len();
                        fieldname = "";
                        more_arrow = false;
                        break;
                    }
                }
            }
            cur.push(
                Insn::Deref {
                    offset: (bitoffs / 8) as i64,
                    user: false,
                },
                cur.offset,
                Errno::Inval,
            )?;
            cur.last_type = Some(ty);
            cur.last_bits = bits.map(|w| (bitoffs % 8, w));
            if !more_arrow {
                return Ok(());
            }
        }
    }
}

/// A failed number: syntax errors are `EINVAL`, overflow `ERANGE`.
fn num_error(id: E, offset: usize, e: NumError) -> ArgError {
    let errno = match e {
        NumError::Invalid => Errno::Inval,
        NumError::Range => Errno::Range,
    };
    ArgError::with(id, offset, errno)
}

/// (is `->`, index after it, index of it).
type Separator = (bool, usize, usize);

/// Splits `a->b` / `a.b` at the first separator: (head, Some((is_arrow,
/// index after separator, index of separator))). A lone `-` is an error.
fn split_next_field(s: &str, base: usize) -> Result<(&str, Option<Separator>), ArgError> {
    match s.find(['.', '-']) {
        None => Ok((s, None)),
        Some(i) => {
            if s.as_bytes()[i] == b'.' {
                Ok((&s[..i], Some((false, i + 1, i))))
            } else if s.as_bytes().get(i + 1) == Some(&b'>') {
                Ok((&s[..i], Some((true, i + 2, i))))
            } else {
                Err(ArgError::new(E::BAD_HYPHEN, base + i))
            }
        }
    }
}

/// Whether `id` is an 8-bit integer or character type (C `char`, Rust `u8`/`i8`).
fn is_byte(types: &TypeTable, id: TypeId) -> bool {
    let n = types.get(types.strip(id));
    matches!(n.kind, TypeKind::Base(BaseEncoding::Char { .. }))
        || (matches!(
            n.kind,
            TypeKind::Base(BaseEncoding::Signed | BaseEncoding::Unsigned)
        ) && n.size == Some(1))
}

/// `char *` (or a pointer to any byte type): a string behind a pointer.
fn is_byte_pointer(types: &TypeTable, id: TypeId) -> bool {
    match types.get(types.strip(id)).kind {
        TypeKind::Pointer(t) => is_byte(types, t),
        _ => false,
    }
}

/// `char[N]` (or an array of any byte type): a string in place.
fn is_byte_array(types: &TypeTable, id: TypeId) -> bool {
    match types.get(types.strip(id)).kind {
        TypeKind::Array { elem, .. } => is_byte(types, elem),
        _ => false,
    }
}

/// The fetch type a debug-info type maps to (`fetch_type_from_btf_type`).
fn btf_fetch_type(types: &TypeTable, id: TypeId, cur: &Cursor) -> FetchType {
    let node = types.get(types.strip(id));
    let size = node.size.unwrap_or(8);
    let sized = |signed: bool| -> Option<FetchType> {
        let n = match size {
            1 | 2 | 4 | 8 => size as u8,
            _ => return None,
        };
        Some(if signed {
            FetchType::S(n)
        } else {
            FetchType::U(n)
        })
    };
    let t = match node.kind {
        TypeKind::Pointer(_) => Some(FetchType::X(8)),
        TypeKind::Enum { signed } => sized(signed),
        TypeKind::Base(BaseEncoding::Signed) => sized(true),
        TypeKind::Base(BaseEncoding::Unsigned) => sized(false),
        TypeKind::Base(BaseEncoding::Char { signed }) => sized(signed),
        _ => None,
    };
    match (t, cur.last_bits) {
        // A bitfield is extracted from an unsigned container.
        (Some(FetchType::S(n)), Some(_)) => FetchType::U(n),
        (Some(t), _) => t,
        (None, _) => FetchType::X(8),
    }
}

/// `b<width>@<offset>/<size>` into the shift instruction.
fn parse_bitfield(t: &str, ty: FetchType) -> Option<Insn> {
    let rest = &t[1..];
    let (bw, n) = simple_strtoul(rest, 0);
    if bw == 0 || rest.as_bytes().get(n) != Some(&b'@') {
        return None;
    }
    let rest = &rest[n + 1..];
    let (bo, n) = simple_strtoul(rest, 0);
    if n == 0 || rest.as_bytes().get(n) != Some(&b'/') {
        return None;
    }
    let bits = (ty.size() * 8) as u64;
    let sum = bw.checked_add(bo)?;
    if sum > bits {
        return None;
    }
    Some(Insn::ModBitfield {
        basesize: ty.size() as u8,
        lshift: (bits - sum) as u8,
        rshift: (bits - bw) as u8,
    })
}

/// Where `$retval` occurs as a whole token in a word (for `t` probes'
/// `RETVAL_ON_PROBE` and fprobes' implicit `%return`).
pub(crate) fn find_retval(word: &str) -> Option<usize> {
    let p = word.find("$retval")?;
    let next = word.as_bytes().get(p + 7).copied().unwrap_or(0);
    if next.is_ascii_alphanumeric() || next == b'_' {
        None
    } else {
        Some(p)
    }
}
