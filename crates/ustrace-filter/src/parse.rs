//! The filter-language compiler: text to [`Program`], with the kernel's
//! acceptance rules, error ids, caret positions and errnos.
//!
//! Compilation follows the kernel's three stages so that every rejection lands
//! on the same message and byte:
//!
//! 1. `count_terms` — one pass over the text counting predicates and paren
//!    depth, skipping quoted text; reports unbalanced parens and quotes
//!    (errnos `EPERM`/`ENOENT`/`ESRCH`, which the kernel leaks as is).
//! 2. `build_steps` — the logical structure: `(`, `)`, `!`, `&&`, `||` around
//!    predicates, emitting one step per predicate with branch targets patched
//!    as operators are seen (`&&` binds tighter than `||`).
//! 3. `parse_predicate` — `field[.ustring][.function] op value` for one
//!    predicate, checking the operator and value against the field's class.
//!
//! Positions: the kernel reports a predicate error at "start of predicate + 1
//! + offset inside it"; the + 1 is kept because it is what users see.

use crate::cpulist::CpuMask;
use crate::ctype::{is_alnum, is_digit, is_space};
use crate::error::{ErrorKind, FilterError, MAX_WRITE};
use crate::field::{resolve, Field, FieldClass};
use crate::program::{IntRange, NumOp, Pred, Program, Step, StrPred, StrSource};
use crate::strmatch::StrMatcher;
use std::ops::Range;

const EPERM: i32 = 1;
const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const ENOMEM: i32 = 12;
const EINVAL: i32 = 22;

/// Longest string constant (the kernel's `MAX_FILTER_STR_VAL` minus its NUL).
pub const MAX_STRING: usize = 255;
/// Longest numeric constant (the kernel's 24-byte number buffer minus its NUL).
pub const MAX_NUMBER: usize = 23;

/// Maps a function name to its address range `[start, end)`.
pub type FunctionResolver<'a> = &'a dyn Fn(&str) -> Option<Range<u64>>;
/// Maps an address to the range of the function containing it.
pub type AddressResolver<'a> = &'a dyn Fn(u64) -> Option<Range<u64>>;

/// What compilation needs from the world outside the record.
pub struct CompileEnv<'a> {
    /// `field.function == NAME`: the address range `[start, end)` of function NAME.
    pub resolve_function: Option<FunctionResolver<'a>>,
    /// `field.function == 0xADDR`: the range of the function containing ADDR.
    pub resolve_address: Option<AddressResolver<'a>>,
    /// Number of possible CPUs: `CPUS{}` lists naming a CPU at or past it are invalid.
    pub nr_cpus: u32,
}

impl Default for CompileEnv<'_> {
    fn default() -> Self {
        CompileEnv {
            resolve_function: None,
            resolve_address: None,
            nr_cpus: possible_cpus(),
        }
    }
}

impl std::fmt::Debug for CompileEnv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileEnv")
            .field("resolve_function", &self.resolve_function.is_some())
            .field("resolve_address", &self.resolve_address.is_some())
            .field("nr_cpus", &self.nr_cpus)
            .finish()
    }
}

/// Number of possible CPUs of this machine (from
/// `/sys/devices/system/cpu/possible`, else the available parallelism),
/// read once per process.
pub fn possible_cpus() -> u32 {
    static CPUS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        if let Ok(s) = std::fs::read_to_string("/sys/devices/system/cpu/possible") {
            let last = s
                .trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<u32>().ok())
                .max();
            if let Some(last) = last {
                return last + 1;
            }
        }
        std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
    })
}

/// Whether a write to `filter` means "clear the filter": the kernel strips
/// the text and compares it with `0` before parsing anything. The caller must
/// check this first; [`compile`] would reject `0` as "Field not found".
///
/// A write of [`MAX_WRITE`] bytes or more is never the clear command, however
/// blank its tail: the kernel refuses it on its size before looking at it,
/// and [`compile`] reports that refusal.
pub fn is_clear(text: &str) -> bool {
    if text.len() >= MAX_WRITE {
        return false;
    }
    let b = crate::ctype::c_str(text.as_bytes());
    crate::ctype::skip_leading(crate::ctype::strip_trailing(b)) == b"0"
}

/// Compile a filter expression against an event's fields.
///
/// `fields` are the event's own fields (the common fields may be included or
/// left out; they are found either way). The text is taken up to its first
/// NUL with trailing whitespace removed, like the kernel. `"0"` is not a
/// filter but the clear command: test [`is_clear`] first.
pub fn compile(
    expr: &str,
    fields: &[Field<'_>],
    env: &CompileEnv<'_>,
) -> Result<Program, FilterError> {
    if expr.len() >= MAX_WRITE {
        return Err(FilterError::write_too_long());
    }
    let text = crate::ctype::strip_trailing(crate::ctype::c_str(expr.as_bytes()));
    let (nr_parens, nr_preds) = count_terms(text)?;
    if nr_preds == 0 {
        return Err(FilterError::bare(EINVAL));
    }
    let steps = build_steps(text, nr_parens, nr_preds, fields, env)?;
    Ok(Program::new(
        String::from_utf8_lossy(text).into_owned(),
        steps.into_boxed_slice(),
    ))
}

#[inline]
fn at(s: &[u8], i: usize) -> u8 {
    s.get(i).copied().unwrap_or(0)
}

/// Stage 1: (max paren depth + 1, number of predicates), or the kernel's
/// early rejection of unbalanced parens and quotes.
fn count_terms(s: &[u8]) -> Result<(usize, usize), FilterError> {
    let mut in_pred = false;
    let mut preds = 0usize;
    let mut open = 1usize;
    let mut max_open = 1usize;
    let mut quote = 0u8;
    let mut last_quote = 0usize;
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        i += 1;
        if is_space(c) {
            continue;
        }
        if quote != 0 {
            if c == quote {
                quote = 0;
            }
            continue;
        }
        match c {
            b'\'' | b'"' => {
                quote = c;
                last_quote = i - 1;
            }
            b'|' | b'&' if at(s, i) == c => {
                in_pred = false;
                continue;
            }
            b'(' => {
                in_pred = false;
                open += 1;
                max_open = max_open.max(open);
                continue;
            }
            b')' => {
                in_pred = false;
                if open == 1 {
                    return Err(FilterError::new(ErrorKind::TooManyClose, i - 1, EPERM));
                }
                open -= 1;
                continue;
            }
            _ => {}
        }
        if !in_pred {
            preds += 1;
            in_pred = true;
        }
    }
    if quote != 0 {
        return Err(FilterError::new(ErrorKind::MissingQuote, last_quote, ESRCH));
    }
    if open != 1 {
        // Walk back to the '(' that was never closed.
        let mut level = open;
        let mut q = 0u8;
        let mut j = s.len();
        while j > 1 {
            j -= 1;
            let c = s[j];
            if q != 0 {
                if c == q {
                    q = 0;
                }
                continue;
            }
            match c {
                b'(' => {
                    if level == open {
                        return Err(FilterError::new(ErrorKind::TooManyOpen, j, ENOENT));
                    }
                    level -= 1;
                }
                b')' => level += 1,
                b'\'' | b'"' => q = c,
                _ => {}
            }
        }
        return Err(FilterError::new(ErrorKind::TooManyOpen, 0, ENOENT));
    }
    Ok((max_open, preds))
}

const INVERT: u8 = 1;
const PROCESS_AND: u8 = 2;
const PROCESS_OR: u8 = 4;

struct Draft {
    pred: Option<Pred>,
    target: isize,
    branch_when: bool,
}

/// Point the step that `n` currently links to at label `n`, taking over its
/// old link: this is how an `&&`/`||` learns where its short-circuit goes.
fn patch(prog: &mut [Draft], n: usize, when: bool) -> Result<(), FilterError> {
    let t = prog[n].target;
    if t < 0 || t as usize >= prog.len() {
        return Err(FilterError::bare(EINVAL));
    }
    let t = t as usize;
    let s = prog[t].target;
    prog[t].branch_when = when;
    prog[t].target = n as isize;
    prog[n].target = s;
    Ok(())
}

/// Stage 2: the logical structure into steps.
fn build_steps(
    s: &[u8],
    nr_parens: usize,
    nr_preds: usize,
    fields: &[Field<'_>],
    env: &CompileEnv<'_>,
) -> Result<Vec<Step>, FilterError> {
    let max_preds = nr_preds + 2;
    let mut stack: Vec<u8> = vec![0];
    let mut prog: Vec<Draft> = Vec::with_capacity(nr_preds);
    let mut inverts: Vec<bool> = Vec::with_capacity(nr_preds);
    let mut invert = false;
    let mut errno = ENOMEM;
    let mut ptr = 0usize;
    // Only the end of the text right after a predicate (or a `)`) completes the expression;
    // running out of text after `&&`, `||` or `!` leaves an operator without its operand.
    let mut complete = false;
    'outer: while at(s, ptr) != 0 {
        let next = ptr;
        ptr += 1;
        let c = s[next];
        if is_space(c) {
            continue;
        }
        match c {
            b'(' => {
                if stack.len() - 1 > nr_parens {
                    return Err(FilterError::bare(EINVAL));
                }
                stack.push(u8::from(invert));
                continue;
            }
            b'!' if !matches!(at(s, next + 1), b'=' | b'~') => {
                invert = !invert;
                continue;
            }
            _ => {}
        }
        if prog.len() >= max_preds {
            return Err(FilterError::new(ErrorKind::TooManyPreds, next, errno));
        }
        inverts.push(invert);
        let n = prog.len();
        let pred = parse_predicate(s, next, ptr, fields, env)?;
        prog.push(Draft {
            pred: Some(pred.0),
            target: n as isize - 1,
            branch_when: false,
        });
        ptr = next + pred.1;
        errno = EPERM;
        loop {
            let next = ptr;
            ptr += 1;
            let c = at(s, next);
            if is_space(c) {
                continue;
            }
            match c {
                b')' | 0 => {}
                b'&' | b'|' if at(s, next + 1) == c => ptr += 1,
                _ => return Err(FilterError::new(ErrorKind::TooManyPreds, next, EPERM)),
            }
            let top = stack.len() - 1;
            invert = stack[top] & INVERT != 0;
            let last = prog.len() - 1;
            if stack[top] & PROCESS_AND != 0 {
                patch(&mut prog, last, invert)?;
                stack[top] &= !PROCESS_AND;
            }
            if c == b'&' {
                stack[top] |= PROCESS_AND;
                break;
            }
            if stack[top] & PROCESS_OR != 0 {
                patch(&mut prog, last, !invert)?;
                stack[top] &= !PROCESS_OR;
            }
            if c == b'|' {
                stack[top] |= PROCESS_OR;
                break;
            }
            if c == 0 {
                complete = true;
                break 'outer;
            }
            if top == 0 {
                return Err(FilterError::new(ErrorKind::TooManyClose, ptr, EPERM));
            }
            stack.pop();
        }
    }
    if !complete && !prog.is_empty() {
        return Err(FilterError::new(ErrorKind::InvalidFilter, ptr, EINVAL));
    }
    if stack.len() != 1 {
        return Err(FilterError::new(ErrorKind::TooManyOpen, ptr, errno));
    }
    let n = prog.len();
    if n == 0 {
        return Err(FilterError::new(ErrorKind::NoFilter, ptr, EINVAL));
    }
    prog[n - 1].target = n as isize;
    prog[n - 1].branch_when = false;
    // Jumps to a step that branches the same way can go straight to its target.
    let mut i = n - 1;
    while i > 0 {
        i -= 1;
        let t = prog[i].target;
        if t < 0 || t as usize >= n {
            return Err(FilterError::bare(EINVAL));
        }
        let t = t as usize;
        if prog[i].branch_when == prog[t].branch_when {
            prog[i].target = prog[t].target;
        }
    }
    let mut steps = Vec::with_capacity(n);
    for (i, d) in prog.into_iter().enumerate() {
        if d.target <= i as isize || d.target > n as isize {
            return Err(FilterError::bare(EINVAL));
        }
        steps.push(Step {
            pred: d.pred.expect("every draft step holds a predicate"),
            branch_when: d.branch_when ^ inverts[i],
            target: d.target as u32,
        });
    }
    Ok(steps)
}

fn op_at(s: &[u8], i: usize) -> Option<(Op, usize)> {
    const OPS: [(&[u8], Op); 8] = [
        (b"~", Op::Glob),
        (b"!=", Op::Num(NumOp::Ne)),
        (b"==", Op::Num(NumOp::Eq)),
        (b"<=", Op::Num(NumOp::Le)),
        (b"<", Op::Num(NumOp::Lt)),
        (b">=", Op::Num(NumOp::Ge)),
        (b">", Op::Num(NumOp::Gt)),
        (b"&", Op::Num(NumOp::Band)),
    ];
    OPS.iter()
        .find(|(t, _)| s.get(i..).is_some_and(|r| r.starts_with(t)))
        .map(|(t, op)| (*op, t.len()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Glob,
    Num(NumOp),
}

/// Parse an integer the way `kstrtoull`/`kstrtoll` with base 0 do.
fn kstrto(num: &[u8], signed: bool) -> Option<u64> {
    fn unsigned(s: &[u8]) -> Option<u64> {
        let s = s.strip_prefix(b"+").unwrap_or(s);
        let (radix, digits) = if s.first() == Some(&b'0') {
            if matches!(s.get(1), Some(b'x' | b'X'))
                && s.get(2).is_some_and(|c| c.is_ascii_hexdigit())
            {
                (16, &s[2..])
            } else {
                (8, s)
            }
        } else {
            (10, s)
        };
        let digits = digits.strip_suffix(b"\n").unwrap_or(digits);
        if digits.is_empty() {
            return None;
        }
        let mut v: u64 = 0;
        for &c in digits {
            let d = (c as char).to_digit(16)?;
            if d >= radix {
                return None;
            }
            v = v.checked_mul(u64::from(radix))?.checked_add(u64::from(d))?;
        }
        Some(v)
    }
    if !signed {
        return unsigned(num);
    }
    if let Some(rest) = num.strip_prefix(b"-") {
        let v = unsigned(rest)?;
        if v > i64::MAX as u64 + 1 {
            return None;
        }
        Some((v as i64).wrapping_neg() as u64)
    } else {
        let v = unsigned(num)?;
        if v > i64::MAX as u64 {
            return None;
        }
        Some(v)
    }
}

/// Stage 3: one predicate starting at `start`; `pos` is the kernel's base for
/// error positions (start + 1). Returns the predicate and its length.
fn parse_predicate(
    text: &[u8],
    start: usize,
    pos: usize,
    fields: &[Field<'_>],
    env: &CompileEnv<'_>,
) -> Result<(Pred, usize), FilterError> {
    let s = &text[start..];
    let err = |kind, i: usize| Err(FilterError::new(kind, pos + i, EINVAL));
    let mut i = 0usize;
    while is_space(at(s, i)) {
        i += 1;
    }
    let name_start = i;
    while is_alnum(at(s, i)) || at(s, i) == b'_' {
        i += 1;
    }
    if i == name_start {
        // The kernel returns a bare -1 here: EPERM and "Error: (0)".
        return Err(FilterError::bare(EPERM));
    }
    let Some(field) = resolve(&s[name_start..i], fields) else {
        return err(ErrorKind::FieldNotFound, i);
    };
    // `.ustring` tells the kernel a `char *` points to user memory; in one
    // address space both kinds are read through `Context::read_str`, so the
    // suffix is accepted (on any field, as the kernel does) and changes nothing.
    if s[i..].starts_with(b".ustring") {
        i += 8;
    }
    let mut function = false;
    if s[i..].starts_with(b".function") {
        function = true;
        i += 9;
    }
    while is_space(at(s, i)) {
        i += 1;
    }
    let Some((op, op_len)) = op_at(s, i) else {
        return err(ErrorKind::InvalidOp, i);
    };
    i += op_len;
    while is_space(at(s, i)) {
        i += 1;
    }
    let value_start = i;
    let offset = field.offset as u32;

    if function {
        if field.size != 8 {
            return err(ErrorKind::IllegalFieldOp, i);
        }
        let negate = match op {
            Op::Num(NumOp::Eq) => false,
            Op::Num(NumOp::Ne) => true,
            _ => return err(ErrorKind::InvalidOp, i),
        };
        let range = if is_digit(at(s, i)) {
            while is_alnum(at(s, i)) {
                i += 1;
            }
            if i - value_start > MAX_NUMBER {
                return err(ErrorKind::OperandTooLong, i);
            }
            let Some(addr) = kstrto(&s[value_start..i], false) else {
                return err(ErrorKind::InvalidValue, i);
            };
            env.resolve_address.and_then(|f| f(addr))
        } else {
            while at(s, i) != 0 && !is_space(at(s, i)) {
                i += 1;
            }
            let name = String::from_utf8_lossy(&s[value_start..i]);
            env.resolve_function.and_then(|f| f(&name))
        };
        let Some(range) = range else {
            return err(ErrorKind::NoFunction, i);
        };
        return Ok((
            Pred::Function {
                offset,
                start: range.start,
                end: range.end,
                negate,
            },
            i,
        ));
    }

    if s[i..].starts_with(b"CPUS") {
        if !matches!(
            field.class,
            FieldClass::CpuMask { .. } | FieldClass::Cpu | FieldClass::Other
        ) {
            return err(ErrorKind::IllegalFieldOp, i);
        }
        let op = match op {
            Op::Num(o @ (NumOp::Eq | NumOp::Ne | NumOp::Band)) => o,
            _ => return err(ErrorKind::IllegalFieldOp, i),
        };
        i += 4;
        let brace = at(s, i);
        i += 1;
        if brace != b'{' {
            return err(ErrorKind::MissingBraceOpen, i);
        }
        let list_start = i;
        while at(s, i) != 0 && at(s, i) != b'}' {
            i += 1;
        }
        if at(s, i) != b'}' {
            return err(ErrorKind::MissingBraceClose, i);
        }
        if list_start == i {
            return err(ErrorKind::InvalidCpulist, i);
        }
        let Some(mask) = CpuMask::parse(&s[list_start..i], env.nr_cpus) else {
            return err(ErrorKind::InvalidCpulist, i);
        };
        i += 1;
        let single = (mask.weight() == 1).then(|| mask.first()).flatten();
        let pred = match (field.class, single) {
            (FieldClass::CpuMask { relative }, Some(cpu)) => Pred::MaskVsCpu {
                offset,
                relative,
                op,
                cpu,
                nr_cpus: env.nr_cpus,
            },
            (FieldClass::CpuMask { relative }, None) => Pred::MaskVsMask {
                offset,
                relative,
                op,
                mask,
            },
            (FieldClass::Cpu, Some(cpu)) => Pred::Cpu {
                op: if op == NumOp::Band { NumOp::Eq } else { op },
                val: cpu as i32,
            },
            (FieldClass::Cpu, None) => Pred::CpuInMask { op, mask },
            (_, Some(cpu)) => int_pred(
                offset,
                field.size,
                false,
                if op == NumOp::Band { NumOp::Eq } else { op },
                u64::from(cpu),
            ),
            (_, None) => match field.size {
                1 | 2 | 4 | 8 => Pred::ScalarInMask {
                    offset,
                    size: field.size as u8,
                    op,
                    mask,
                },
                // The kernel accepts the mask but has no predicate for the size.
                _ => Pred::Never,
            },
        };
        return Ok((pred, i));
    }

    let c = at(s, i);
    if c == b'\'' || c == b'"' {
        let negate = match op {
            Op::Num(NumOp::Ne) => true,
            Op::Glob | Op::Num(NumOp::Eq) => false,
            _ => return err(ErrorKind::IllegalFieldOp, i),
        };
        if !field.class.is_string() {
            return err(ErrorKind::ExpectDigit, i);
        }
        i += 1;
        while at(s, i) != 0 && at(s, i) != c {
            i += 1;
        }
        if at(s, i) == 0 {
            return err(ErrorKind::MissingQuote, i);
        }
        let raw = &s[value_start + 1..i];
        if raw.len() > MAX_STRING {
            return err(ErrorKind::OperandTooLong, i);
        }
        i += 1;
        let (matcher, negate) = if op == Op::Glob {
            StrMatcher::glob(raw)
        } else {
            (StrMatcher::full(raw), negate)
        };
        let src = match field.class {
            FieldClass::Comm => StrSource::Comm,
            FieldClass::StaticString => StrSource::Static {
                offset,
                size: field.size as u32,
            },
            FieldClass::DynString => StrSource::Dyn {
                offset,
                relative: false,
            },
            FieldClass::RelDynString => StrSource::Dyn {
                offset,
                relative: true,
            },
            _ => StrSource::Ptr { offset },
        };
        return Ok((
            Pred::Str(Box::new(StrPred {
                src,
                matcher,
                negate,
            })),
            i,
        ));
    }

    if is_digit(c) || c == b'-' {
        if field.class.is_string() {
            return err(ErrorKind::ExpectString, i);
        }
        let op = match op {
            Op::Glob => return err(ErrorKind::IllegalFieldOp, i),
            Op::Num(o) => o,
        };
        if c == b'-' {
            i += 1;
        }
        while is_alnum(at(s, i)) {
            i += 1;
        }
        if i - value_start > MAX_NUMBER {
            return err(ErrorKind::OperandTooLong, i);
        }
        let Some(val) = kstrto(&s[value_start..i], field.signed) else {
            return err(ErrorKind::IllegalIntval, value_start);
        };
        let pred = if field.class == FieldClass::Cpu {
            Pred::Cpu {
                op,
                val: val as i32,
            }
        } else {
            int_pred(offset, field.size, field.signed, op, val)
        };
        return Ok((pred, i));
    }

    err(ErrorKind::InvalidValue, i)
}

/// An integer comparison; sizes other than 1, 2, 4, 8 never match (kernel no-op).
/// The constant is cut to the field's width, as the kernel's C cast does.
fn int_pred(offset: u32, size: usize, signed: bool, op: NumOp, val: u64) -> Pred {
    if !matches!(size, 1 | 2 | 4 | 8) {
        return Pred::Never;
    }
    let size = size as u8;
    let truncated = if size == 8 {
        val
    } else {
        val & ((1u64 << (8 * size)) - 1)
    };
    if op == NumOp::Band {
        return Pred::Band {
            offset,
            size,
            val: truncated,
        };
    }
    let v = IntRange::encode(truncated, size, signed);
    // (lo, hi, negate); an empty range is "not the full range".
    let (lo, hi, negate) = match op {
        NumOp::Eq => (v, v, false),
        NumOp::Ne => (v, v, true),
        NumOp::Lt if v == 0 => (0, u64::MAX, true),
        NumOp::Lt => (0, v - 1, false),
        NumOp::Le => (0, v, false),
        NumOp::Gt if v == u64::MAX => (0, u64::MAX, true),
        NumOp::Gt => (v + 1, u64::MAX, false),
        NumOp::Ge => (v, u64::MAX, false),
        NumOp::Band => unreachable!("handled above"),
    };
    Pred::Range(IntRange::new(offset, size, signed, lo, hi - lo, negate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kstrto_follows_the_kernel() {
        assert_eq!(kstrto(b"10", false), Some(10));
        assert_eq!(kstrto(b"0x1f", false), Some(31));
        assert_eq!(kstrto(b"0X1F", false), Some(31));
        assert_eq!(kstrto(b"010", false), Some(8));
        assert_eq!(kstrto(b"08", false), None);
        assert_eq!(kstrto(b"0x", false), None);
        assert_eq!(kstrto(b"-1", false), None);
        assert_eq!(kstrto(b"-1", true), Some(u64::MAX));
        assert_eq!(kstrto(b"-0x10", true), Some((-16i64) as u64));
        assert_eq!(kstrto(b"-", true), None);
        assert_eq!(kstrto(b"18446744073709551615", false), Some(u64::MAX));
        assert_eq!(kstrto(b"18446744073709551616", false), None);
        assert_eq!(kstrto(b"9223372036854775808", true), None);
        assert_eq!(kstrto(b"-9223372036854775808", true), Some(i64::MIN as u64));
    }

    #[test]
    fn clear_command() {
        assert!(is_clear("0"));
        assert!(is_clear(" 0\n"));
        assert!(!is_clear("00"));
        assert!(!is_clear("id == 0"));
        assert!(is_clear(&format!("0{}", " ".repeat(MAX_WRITE - 2))));
        assert!(!is_clear(&format!("0{}", " ".repeat(MAX_WRITE - 1))));
    }
}
