//! Compiled filters: a flat array of predicates with branch targets, and the
//! allocation-free evaluator that runs on every event record.
//!
//! `a || b && c` compiles (like the kernel's `predicate_parse`) into:
//!
//! ```text
//!   step 0: r = a;  if r  == true  goto T      (target = 2: "after step 2")
//!   step 1: r = b;  if r  == false goto F      (target = 3)
//!   step 2: r = c;  if r  == false goto F      (target = 3)
//!   T (index 3 = len):   match
//!   F (index 4 = len+1): no match
//! ```
//!
//! Each step says: evaluate the predicate; if the result equals
//! `branch_when`, continue after step `target`, else fall through to the next
//! step. Falling off the end means match; jumping past it means no match.
//! `!` never costs a step at run time: it is folded into `branch_when`.

use crate::cpulist::CpuMask;
use crate::strmatch::StrMatcher;

/// Fault-safe string reader: copy the NUL-terminated string at an address
/// into the buffer; the length copied (without NUL), `None` on a fault.
pub type StrReader<'a> = &'a dyn Fn(u64, &mut [u8]) -> Option<usize>;

/// Per-event facts that are not in the record.
pub struct Context<'a> {
    /// The CPU the event fires on (`CPU`, `cpu`, `common_cpu`).
    pub cpu: u32,
    /// The current task's name (`COMM`, `comm`); at most 16 bytes are used.
    pub comm: &'a [u8],
    /// Fault-safe reader for `char *` fields: copy the NUL-terminated string at
    /// the address into the buffer (1024 bytes), return its length without the
    /// NUL (or the buffer length if it did not fit), `None` on a fault. A fault
    /// (or no reader) makes the predicate false, `!=` included.
    pub read_str: Option<StrReader<'a>>,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("cpu", &self.cpu)
            .field("comm", &String::from_utf8_lossy(self.comm))
            .field("read_str", &self.read_str.is_some())
            .finish()
    }
}

/// Numeric comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Band,
}

/// Where a string predicate finds its string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StrSource {
    /// `char[N]` at `offset`, kernel length N.
    Static { offset: u32, size: u32 },
    /// `__data_loc`/`__rel_loc` descriptor at `offset`.
    Dyn { offset: u32, relative: bool },
    /// `char *` at `offset`, read through `Context::read_str`.
    Ptr { offset: u32 },
    /// The task name from `Context::comm`.
    Comm,
}

/// One predicate.
#[derive(Debug, Clone)]
pub(crate) enum Pred {
    /// Always false: the kernel's no-op predicate (integers of odd sizes).
    Never,
    /// Integer comparison as a range test (see [`IntRange`]).
    Range(IntRange),
    /// `field & val`: true when any bit is shared.
    Band { offset: u32, size: u8, val: u64 },
    /// String comparison (boxed: rare and large).
    Str(Box<StrPred>),
    /// `CPU op N`; `&` is always false, as in the kernel.
    Cpu { op: NumOp, val: i32 },
    /// `CPU op CPUS{a,b}` (a mask of several CPUs).
    CpuInMask { op: NumOp, mask: CpuMask },
    /// Integer field read as a CPU number against a multi-CPU mask.
    ScalarInMask {
        offset: u32,
        size: u8,
        op: NumOp,
        mask: CpuMask,
    },
    /// cpumask field against a user mask.
    MaskVsMask {
        offset: u32,
        relative: bool,
        op: NumOp,
        mask: CpuMask,
    },
    /// cpumask field against a single CPU.
    MaskVsCpu {
        offset: u32,
        relative: bool,
        op: NumOp,
        cpu: u32,
        nr_cpus: u32,
    },
    /// `field.function == name`: `start <= value < end`.
    Function {
        offset: u32,
        start: u64,
        end: u64,
        negate: bool,
    },
}

/// A string predicate.
#[derive(Debug, Clone)]
pub(crate) struct StrPred {
    pub src: StrSource,
    pub matcher: StrMatcher,
    pub negate: bool,
}

/// Every integer comparison but `&`, reduced to "is the value inside
/// `[lo, lo + span]`" (optionally negated) on an order-preserving unsigned
/// encoding of the field: signed values get their sign bit flipped, so one
/// unsigned compare serves all sizes, signednesses and operators.
///
/// ```text
///   s32 field, "x < -1":  encode(-1) = 0x7fff_ffff_ffff_ffff
///                         range [0, 0x7fff_ffff_ffff_fffe], not negated
/// ```
///
/// At run time the field is loaded, masked to its width, sign-extended with
/// `(v ^ s) - s` (`s` = the field's sign bit, 0 if unsigned) and compared;
/// the sign-bit flip of the encoding is folded into `lo` at compile time.
/// No branch depends on the field's type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IntRange {
    pub offset: u32,
    pub size: u8,
    pub negate: bool,
    /// The field's bits: `u64::MAX >> (64 - 8 * size)`.
    pub mask: u64,
    /// The field's sign bit if it is signed, else 0.
    pub sign_bit: u64,
    /// `lo` of the encoded range minus the encoding's sign flip.
    pub lo_raw: u64,
    pub span: u64,
}

impl IntRange {
    /// Encode a field value (zero-extended to 64 bits) into the ordered domain.
    pub fn encode(raw: u64, size: u8, signed: bool) -> u64 {
        let shift = 64 - 8 * u32::from(size);
        if signed {
            ((((raw << shift) as i64) >> shift) as u64) ^ (1 << 63)
        } else {
            raw
        }
    }

    /// The range test for `lo..=lo+span` in the encoded domain.
    pub fn new(offset: u32, size: u8, signed: bool, lo: u64, span: u64, negate: bool) -> Self {
        let bits = 8 * u32::from(size);
        IntRange {
            offset,
            size,
            negate,
            mask: u64::MAX >> (64 - bits),
            sign_bit: if signed { 1 << (bits - 1) } else { 0 },
            lo_raw: if signed { lo.wrapping_sub(1 << 63) } else { lo },
            span,
        }
    }

    #[inline(always)]
    fn eval(&self, rec: &[u8]) -> bool {
        let Some(raw) = load(rec, self.offset, self.size) else {
            return false;
        };
        let v = ((raw & self.mask) ^ self.sign_bit).wrapping_sub(self.sign_bit);
        (v.wrapping_sub(self.lo_raw) <= self.span) ^ self.negate
    }
}

/// Load a `size`-byte little-endian field, zero-extended (bytes past the
/// field may be set: callers mask). One 8-byte load when the record has
/// room, a sized load near its end.
#[inline(always)]
fn load(rec: &[u8], offset: u32, size: u8) -> Option<u64> {
    let off = offset as usize;
    if cfg!(target_endian = "little") {
        if let Some(b) = rec.get(off..off + 8) {
            return Some(u64::from_le_bytes(b.try_into().ok()?));
        }
    }
    read_uint(rec, off, usize::from(size))
}

/// One step of the flat program.
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub pred: Pred,
    pub branch_when: bool,
    pub target: u32,
}

/// A compiled filter. Immutable, `Send + Sync`; evaluate with [`Program::matches`].
#[derive(Debug, Clone)]
pub struct Program {
    pub(crate) text: String,
    pub(crate) steps: Box<[Step]>,
    /// The same steps when every predicate is an integer range test (the
    /// common numeric filter), for a loop without per-step dispatch.
    ranges: Option<Ranges>,
}

/// An all-integer program: its steps, and the record length from which
/// every field's 8-byte load is in bounds.
#[derive(Debug, Clone)]
struct Ranges {
    steps: Box<[RangeStep]>,
    min_len: usize,
    /// The lowest record offset any step reads.
    min_offset: usize,
}

/// One step of an all-integer program, reduced for the record path: the
/// step jumps when `((raw & mask) ^ sign_bit) - bias <= span` (wrapping).
/// `bias` folds the sign extension's `- sign_bit` into the range's low end,
/// and the step's `!` and `branch_when` are folded into the range itself:
/// a step that jumps when its value is *outside* `[lo, lo + span]` tests the
/// complement, `[lo + span + 1, lo - 1]`, which is again one wrapping range.
#[derive(Debug, Clone, Copy)]
struct RangeStep {
    mask: u64,
    sign_bit: u64,
    bias: u64,
    span: u64,
    offset: u32,
    /// The step to continue at after a jump: `target + 1` of the flat
    /// program, so `len` is a match and `len + 1` is not.
    next: u32,
}

impl RangeStep {
    fn new(range: &IntRange, branch_when: bool, target: u32) -> RangeStep {
        let bias = range.sign_bit.wrapping_add(range.lo_raw);
        // The step jumps when `in_range ^ negate == branch_when`.
        let (mask, bias, span) = if branch_when ^ range.negate {
            (range.mask, bias, range.span)
        } else if range.span == u64::MAX {
            // The complement of every value is empty: 0 - 1 is above MAX - 1, never a jump.
            (0, 1, u64::MAX - 1)
        } else {
            (
                range.mask,
                bias.wrapping_add(range.span).wrapping_add(1),
                u64::MAX - range.span - 1,
            )
        };
        RangeStep {
            mask,
            sign_bit: if mask == 0 { 0 } else { range.sign_bit },
            bias,
            span,
            offset: range.offset,
            next: target + 1,
        }
    }
}

#[inline]
fn read_uint(rec: &[u8], offset: usize, size: usize) -> Option<u64> {
    let b = rec.get(offset..offset.checked_add(size)?)?;
    Some(match size {
        1 => u64::from(b[0]),
        2 => u64::from(u16::from_ne_bytes([b[0], b[1]])),
        4 => u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
        8 => u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        _ => return None,
    })
}

/// The bytes of a `__data_loc`/`__rel_loc` item: (start, kernel length).
#[inline]
fn data_loc(rec: &[u8], offset: u32, relative: bool) -> Option<(usize, usize)> {
    let item = read_uint(rec, offset as usize, 4)? as u32;
    let mut start = (item & 0xffff) as usize;
    if relative {
        start += offset as usize + 4;
    }
    Some((start, (item >> 16) as usize))
}

#[inline]
fn tail(rec: &[u8], start: usize) -> &[u8] {
    rec.get(start..).unwrap_or(&[])
}

/// `==`/`!=`/`&` of one CPU against a mask with more than one CPU
/// (`==` can only hold for a single-CPU mask, so the weight is checked).
#[inline]
fn scalar_vs_mask(op: NumOp, cpu: u32, mask: &CpuMask) -> bool {
    let single = mask.weight() == 1;
    match op {
        NumOp::Eq => mask.test(cpu) && single,
        NumOp::Ne => !mask.test(cpu) || !single,
        NumOp::Band => mask.test(cpu),
        _ => false,
    }
}

impl Pred {
    #[inline]
    fn eval(&self, rec: &[u8], ctx: &Context<'_>) -> bool {
        match self {
            Pred::Never => false,
            Pred::Range(r) => r.eval(rec),
            // `val` is already cut to the field's width, so bytes past it drop out.
            Pred::Band { offset, size, val } => match load(rec, *offset, *size) {
                Some(raw) => raw & val != 0,
                None => false,
            },
            Pred::Str(sp) => {
                let StrPred {
                    src,
                    matcher,
                    negate,
                } = &**sp;
                match src {
                    StrSource::Static { offset, size: 0 } => {
                        matcher.matches_nul_terminated(tail(rec, *offset as usize)) ^ negate
                    }
                    StrSource::Static { offset, size } => {
                        matcher.matches(tail(rec, *offset as usize), i64::from(*size)) ^ negate
                    }
                    StrSource::Dyn { offset, relative } => {
                        let Some((start, len)) = data_loc(rec, *offset, *relative) else {
                            return false;
                        };
                        matcher.matches(tail(rec, start), len as i64) ^ negate
                    }
                    StrSource::Comm => {
                        let comm = &ctx.comm[..ctx.comm.len().min(16)];
                        matcher.matches(comm, 16) ^ negate
                    }
                    StrSource::Ptr { offset } => {
                        let Some(addr) = read_uint(rec, *offset as usize, 8) else {
                            return false;
                        };
                        let Some(read) = ctx.read_str else {
                            return false;
                        };
                        let mut buf = [0u8; 1024];
                        let Some(n) = read(addr, &mut buf) else {
                            return false;
                        };
                        // The kernel keeps at most 1023 bytes and a NUL.
                        let n = n.min(buf.len() - 1);
                        let s = crate::ctype::c_str(&buf[..n]);
                        matcher.matches(s, s.len() as i64 + 1) ^ negate
                    }
                }
            }
            Pred::Cpu { op, val } => {
                let cpu = ctx.cpu as i32;
                match op {
                    NumOp::Band => false,
                    _ => cmp_op(*op, cpu.cmp(val)),
                }
            }
            Pred::CpuInMask { op, mask } => scalar_vs_mask(*op, ctx.cpu, mask),
            Pred::ScalarInMask {
                offset,
                size,
                op,
                mask,
            } => {
                let Some(raw) = read_uint(rec, *offset as usize, *size as usize) else {
                    return false;
                };
                let cpu = raw as u32;
                if cpu >= mask.nr_cpus() {
                    return false;
                }
                scalar_vs_mask(*op, cpu, mask)
            }
            Pred::MaskVsMask {
                offset,
                relative,
                op,
                mask,
            } => {
                let Some((start, len)) = data_loc(rec, *offset, *relative) else {
                    return false;
                };
                let bits = tail(rec, start);
                let bits = &bits[..bits.len().min(len)];
                match op {
                    NumOp::Eq => mask.equals_bitmap(bits),
                    NumOp::Ne => !mask.equals_bitmap(bits),
                    NumOp::Band => mask.intersects_bitmap(bits),
                    _ => false,
                }
            }
            Pred::MaskVsCpu {
                offset,
                relative,
                op,
                cpu,
                nr_cpus,
            } => {
                let Some((start, len)) = data_loc(rec, *offset, *relative) else {
                    return false;
                };
                let bits = tail(rec, start);
                let bits = &bits[..bits.len().min(len)];
                let has = CpuMask::bitmap_test(bits, *cpu);
                let only = CpuMask::bitmap_is_only(bits, *cpu, *nr_cpus);
                match op {
                    NumOp::Eq => has && only,
                    NumOp::Ne => !has || !only,
                    NumOp::Band => has,
                    _ => false,
                }
            }
            Pred::Function {
                offset,
                start,
                end,
                negate,
            } => {
                let Some(v) = read_uint(rec, *offset as usize, 8) else {
                    return false;
                };
                (*start <= v && v < *end) ^ negate
            }
        }
    }
}

#[inline]
fn cmp_op(op: NumOp, ord: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match op {
        NumOp::Eq => ord == Equal,
        NumOp::Ne => ord != Equal,
        NumOp::Lt => ord == Less,
        NumOp::Le => ord != Greater,
        NumOp::Gt => ord == Greater,
        NumOp::Ge => ord != Less,
        NumOp::Band => false,
    }
}

impl Program {
    pub(crate) fn new(text: String, steps: Box<[Step]>) -> Program {
        let ranges: Option<Box<[RangeStep]>> = steps
            .iter()
            .map(|s| match &s.pred {
                Pred::Range(range) => Some(RangeStep::new(range, s.branch_when, s.target)),
                _ => None,
            })
            .collect();
        // The fast loop reads fields as little-endian words, like `load`.
        let ranges = ranges.filter(|_| cfg!(target_endian = "little"));
        let ranges = ranges.map(|steps| Ranges {
            min_len: steps
                .iter()
                .map(|s| s.offset as usize + 8)
                .max()
                .unwrap_or(0),
            min_offset: steps.iter().map(|s| s.offset as usize).min().unwrap_or(0),
            steps,
        });
        Program {
            text,
            steps,
            ranges,
        }
    }

    /// Whether the event record passes the filter. No allocation, lock or
    /// syscall (a `char *` predicate calls `ctx.read_str`, which must not
    /// either). Fields that lie outside `record` make their predicate false.
    #[inline]
    pub fn matches(&self, record: &[u8], ctx: &Context<'_>) -> bool {
        match self.matches_fields_only(record) {
            Some(m) => m,
            None => self.matches_steps(record, ctx),
        }
    }

    /// [`matches`](Program::matches) for a program that tests integer fields
    /// only, on a record long enough for all of them: such a program needs no
    /// [`Context`], so a caller can skip building one. `None` otherwise.
    #[inline]
    pub fn matches_fields_only(&self, record: &[u8]) -> Option<bool> {
        let r = self.ranges.as_ref()?;
        (record.len() >= r.min_len).then(|| Self::matches_ranges(&r.steps, record))
    }

    /// The general walk, with a dispatch on each predicate's kind: what
    /// [`matches`](Program::matches) does when
    /// [`matches_fields_only`](Program::matches_fields_only) gave `None`,
    /// for a caller that already asked that. Out of line so that callers
    /// inlining the integer loop stay small.
    #[inline(never)]
    pub fn matches_steps(&self, record: &[u8], ctx: &Context<'_>) -> bool {
        let steps = &self.steps[..];
        let mut i = 0usize;
        while let Some(step) = steps.get(i) {
            if step.pred.eval(record, ctx) == step.branch_when {
                i = step.target as usize;
            }
            i += 1;
        }
        i == steps.len()
    }

    /// `matches` for an all-integer program on a record long enough for
    /// every field's 8-byte load: the same walk, without dispatch on the
    /// predicate kind or a length check per load. A jump past the last step
    /// returns at once, so the usual `a && b && c` (every jump a "no") runs
    /// as straight-line tests that each may leave early.
    #[inline(always)]
    fn matches_ranges(steps: &[RangeStep], record: &[u8]) -> bool {
        debug_assert!(steps.iter().all(|s| s.offset as usize + 8 <= record.len()));
        let n = steps.len();
        // A cursor rather than an index: a step that does not jump costs one add.
        let mut rest = steps;
        while let [step, after @ ..] = rest {
            // SAFETY: the caller checked `record.len() >= min_len`, and `min_len` is at least
            // `offset + 8` for every step, so the 8 bytes read lie inside `record`; the read is
            // unaligned-safe.
            let raw = unsafe {
                record
                    .as_ptr()
                    .add(step.offset as usize)
                    .cast::<u64>()
                    .read_unaligned()
            };
            let raw = u64::from_le(raw);
            let jump = ((raw & step.mask) ^ step.sign_bit).wrapping_sub(step.bias) <= step.span;
            if jump {
                let next = step.next as usize;
                match steps.get(next..) {
                    Some(tail) if next < n => rest = tail,
                    _ => return next == n,
                }
            } else {
                rest = after;
            }
        }
        true
    }

    /// The expression as reading `filter` shows it after a successful write
    /// (the file holds this text and a newline): the written text up to a NUL,
    /// trailing whitespace removed, leading whitespace kept.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The lowest record offset the program may read: a caller may leave the bytes
    /// below it unwritten. 0 (everything) unless every predicate is an integer test of a
    /// field, the programs [`matches_fields_only`](Program::matches_fields_only) runs.
    pub fn reads_from(&self) -> usize {
        self.ranges.as_ref().map_or(0, |r| r.min_offset)
    }

    /// Whether some predicate reads `Context::comm` (the caller can skip
    /// fetching the task name otherwise).
    pub fn needs_comm(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(&s.pred, Pred::Str(sp) if sp.src == StrSource::Comm))
    }

    /// Whether some predicate reads `char *` strings through `Context::read_str`.
    pub fn needs_read_str(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(&s.pred, Pred::Str(sp) if matches!(sp.src, StrSource::Ptr { .. })))
    }

    /// Whether some predicate reads `Context::cpu`.
    pub fn needs_cpu(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s.pred, Pred::Cpu { .. } | Pred::CpuInMask { .. }))
    }

    /// Number of predicates.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Always false: a compiled program has at least one predicate.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use crate::{compile, CompileEnv, Field};

    /// u8 at 8, s32 at 12, u64 at 16, s64 at 24.
    const FIELDS: [Field<'static>; 4] = [
        Field {
            name: "b",
            c_type: "u8",
            offset: 8,
            size: 1,
            signed: false,
        },
        Field {
            name: "i",
            c_type: "s32",
            offset: 12,
            size: 4,
            signed: true,
        },
        Field {
            name: "u",
            c_type: "u64",
            offset: 16,
            size: 8,
            signed: false,
        },
        Field {
            name: "s",
            c_type: "s64",
            offset: 24,
            size: 8,
            signed: true,
        },
    ];

    fn record(b: u8, i: i32, u: u64, s: i64) -> Vec<u8> {
        let mut r = vec![0xa5u8; 40];
        r[8] = b;
        r[12..16].copy_from_slice(&i.to_le_bytes());
        r[16..24].copy_from_slice(&u.to_le_bytes());
        r[24..32].copy_from_slice(&s.to_le_bytes());
        r
    }

    /// The all-integer walk folds `!` and the branch sense into each range, and a range
    /// that covers every value has no complement range: every such program must decide as
    /// the general walk does, at the extremes of each type.
    #[test]
    fn integer_walk_agrees_with_general_walk_at_the_extremes() {
        let exprs = [
            "u >= 0",
            "!(u >= 0)",
            "u >= 0 && i != 0",
            "!(u >= 0) || s < 0",
            "!(u >= 0) && s < 0",
            "s <= 9223372036854775807 && !(b >= 0)",
            "s >= -9223372036854775808 || b == 255",
            "!(s >= -9223372036854775808) || b == 255",
            "u == 18446744073709551615 || i == -2147483648",
            "u != 0 && i > -1 && b < 255",
            "!(u != 0 && i > -1) || !(b < 255 || s == -1)",
            "(u < 5 || s > 5) && (b == 1 || i <= 0) && !(s == 7)",
            "b == 0 || b == 1 || b == 2 || b == 255",
            "!(b == 0) && !(i == 0) && !(u == 0) && !(s == 0)",
        ];
        let values_u8 = [0u8, 1, 2, 127, 128, 255];
        let values_i32 = [i32::MIN, -1, 0, 1, i32::MAX];
        let values_u64 = [0u64, 1, 5, 1 << 63, u64::MAX];
        let values_i64 = [i64::MIN, -1, 0, 5, 7, i64::MAX];
        let ctx = super::Context {
            cpu: 0,
            comm: b"x",
            read_str: None,
        };
        for text in exprs {
            let program = compile(text, &FIELDS, &CompileEnv::default()).unwrap();
            assert!(program.ranges.is_some(), "{text}: not an integer program");
            for &b in &values_u8 {
                for &i in &values_i32 {
                    for &u in &values_u64 {
                        for &s in &values_i64 {
                            let rec = record(b, i, u, s);
                            let fast = program.matches_fields_only(&rec);
                            let general = program.matches_steps(&rec, &ctx);
                            assert_eq!(fast, Some(general), "{text} on b={b} i={i} u={u} s={s}");
                        }
                    }
                }
            }
        }
    }

    /// A caller may leave the bytes below `reads_from` unwritten: so it must cover every
    /// byte any predicate reads, and be 0 for programs that read context or strings.
    #[test]
    fn reads_from_is_the_lowest_field_a_program_reads() {
        let at = |text: &str| {
            compile(text, &FIELDS, &CompileEnv::default())
                .unwrap()
                .reads_from()
        };
        assert_eq!(at("u == 1"), 16);
        assert_eq!(at("s < 0 && u == 1"), 16);
        assert_eq!(at("s < 0 || b == 2"), 8);
        assert_eq!(at("!(i == 0) && s > 1"), 12);
        // Not an integer program: conservatively everything.
        assert_eq!(at("u == 1 && CPU == 0"), 0);
        assert_eq!(at("u & 1"), 0);
    }
}
