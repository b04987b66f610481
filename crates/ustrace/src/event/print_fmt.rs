//! Evaluating an event's `print fmt:` on a record, as the kernel's text output does.
//!
//! A print format is the text after `print fmt:` in a `format` file: a C string literal and
//! the argument expressions, e.g.
//!
//! ```text
//! "key=%s hit=%d latency=%llu", __get_str(key), REC->hit, REC->latency
//! ```
//!
//! It is compiled once, when the event is registered, into a list of `Piece`s — literal text
//! and conversions bound to an argument — and rendered for each record read. The argument
//! language is the part of C the kernel's event definitions use and libtraceevent knows:
//! `REC->field`, `__get_str(f)`, `__get_dynamic_array(f)`, `__print_hex(…)`, `__print_array(…)`,
//! and casts, which only matter when they make a value a pointer (`(void *)REC->ip`).
//! Conversions follow printf: flags `-+ #0`, width, precision, length `hh h l ll z j t`,
//! and `d i u x X o c s p %`, with `%pS`/`%ps` for symbols.
//!
//! Rendering is not on the hot path (it runs when `trace` is read), so it favours clarity.
//! It needs only a record and its layout, so it sits with the layout in `event`: the
//! registry compiles each event's format here, and [`crate::output`] (which re-exports this
//! module as `output::print_fmt`) renders with it.

use std::fmt::Write;

use crate::event::field::{data_loc_bytes, read_int, FieldDesc, FieldKind};

/// A compiled print format.
#[derive(Clone, Debug)]
pub struct PrintFmt {
    pieces: Vec<Piece>,
}

#[derive(Clone, Debug)]
enum Piece {
    Text(String),
    Conv(Conv, Option<Arg>),
}

#[derive(Clone, Debug, Default)]
struct Conv {
    left: bool,
    plus: bool,
    space: bool,
    alt: bool,
    zero: bool,
    width: Option<usize>,
    precision: Option<usize>,
    /// Bits the length modifier keeps of an integer: 8, 16, 32 or 64.
    bits: u32,
    conv: char,
    /// `%pS`, `%ps`, `%pB`…: the letter after `p`.
    pointer_ext: Option<char>,
}

/// What an argument expression reads from the record.
#[derive(Clone, Debug)]
enum Arg {
    /// An integer field (or one element of an integer array).
    Int {
        offset: usize,
        size: usize,
        signed: bool,
    },
    /// A fixed `char[N]` field.
    CharArray { offset: usize, size: usize },
    /// A `__data_loc` string.
    DynStr { offset: usize },
    /// The rest of the record from `offset` (a `char buf[]` tail).
    TailStr { offset: usize },
    /// `__print_hex` of a `__data_loc` array.
    Hex { offset: usize },
    /// `__print_array` of a fixed integer array.
    Array {
        offset: usize,
        elem_size: usize,
        len: usize,
        signed: bool,
    },
    /// A string pointer: printed as its address.
    Unsupported(String),
}

/// Why a print format could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad print fmt: {0}")]
pub struct PrintFmtError(String);

/// Turns an address into `sym+off/size` (for `%pS`) or `sym` (for `%ps`), and says how a
/// plain `%p` prints.
pub trait Symbolizer {
    /// `sym+off/size` with `with_offset`, else `sym`; `None` when no symbol covers `addr`.
    fn symbolize(&self, addr: u64, with_offset: bool) -> Option<String>;

    /// A plain `%p`: the address itself in 16 hex digits, as the kernel's `%px` (what the
    /// kernel prints with the `hash-ptr` option off).
    fn plain_pointer(&self, addr: u64) -> String {
        format!("{addr:016x}")
    }
}

/// A symbolizer that knows no symbols.
pub struct NoSymbols;

impl Symbolizer for NoSymbols {
    fn symbolize(&self, _addr: u64, _with_offset: bool) -> Option<String> {
        None
    }
}

impl PrintFmt {
    /// Compiles `text` (what follows `print fmt: `) against the event's fields.
    pub fn compile(text: &str, fields: &[FieldDesc]) -> Result<PrintFmt, PrintFmtError> {
        let text = text.trim();
        let (format, rest) = split_string_literal(text)?;
        let args = split_args(rest);
        let mut args = args.into_iter();
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = format.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                literal.push(c);
                continue;
            }
            if chars.peek() == Some(&'%') {
                chars.next();
                literal.push('%');
                continue;
            }
            let mut conv = Conv {
                bits: 32,
                ..Conv::default()
            };
            while let Some(&flag) = chars.peek() {
                match flag {
                    '-' => conv.left = true,
                    '+' => conv.plus = true,
                    ' ' => conv.space = true,
                    '#' => conv.alt = true,
                    '0' => conv.zero = true,
                    _ => break,
                }
                chars.next();
            }
            conv.width = take_number(&mut chars);
            if chars.peek() == Some(&'.') {
                chars.next();
                conv.precision = Some(take_number(&mut chars).unwrap_or(0));
            }
            loop {
                match chars.peek() {
                    Some('h') => conv.bits = if conv.bits == 16 { 8 } else { 16 },
                    Some('l' | 'z' | 'j' | 't' | 'L' | 'q') => conv.bits = 64,
                    _ => break,
                }
                chars.next();
            }
            let Some(letter) = chars.next() else {
                return Err(PrintFmtError("format ends inside a conversion".into()));
            };
            if !"diuxXocsp".contains(letter) {
                return Err(PrintFmtError(format!("unknown conversion %{letter}")));
            }
            conv.conv = letter;
            if letter == 'p' {
                if let Some(&ext) = chars.peek() {
                    if ext.is_ascii_alphabetic() {
                        conv.pointer_ext = Some(ext);
                        chars.next();
                    }
                }
                conv.bits = 64;
            }
            if !literal.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut literal)));
            }
            let arg = args.next().map(|a| compile_arg(&a, fields));
            pieces.push(Piece::Conv(conv, arg));
        }
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(PrintFmt { pieces })
    }

    /// Renders the record's text (what follows `EVENT: ` in a trace line).
    pub fn render(&self, record: &[u8], symbols: &dyn Symbolizer, out: &mut String) {
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Conv(conv, arg) => render_conv(conv, arg.as_ref(), record, symbols, out),
            }
        }
    }
}

fn take_number(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<usize> {
    let mut value: Option<usize> = None;
    while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
        value = Some(
            value
                .unwrap_or(0)
                .saturating_mul(10)
                .saturating_add(d as usize),
        );
        chars.next();
    }
    value
}

/// Splits `"…", rest` into the unescaped literal and the text after its closing quote.
fn split_string_literal(text: &str) -> Result<(String, &str), PrintFmtError> {
    let body = text
        .strip_prefix('"')
        .ok_or_else(|| PrintFmtError("print fmt does not start with a string".into()))?;
    let mut literal = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((literal, &body[i + 1..])),
            '\\' => match chars.next().map(|(_, e)| e) {
                Some('n') => literal.push('\n'),
                Some('t') => literal.push('\t'),
                Some('\\') => literal.push('\\'),
                Some('"') => literal.push('"'),
                Some(other) => {
                    literal.push('\\');
                    literal.push(other);
                }
                None => break,
            },
            c => literal.push(c),
        }
    }
    Err(PrintFmtError("unterminated string in print fmt".into()))
}

/// Splits `, a, f(b, c), d` at top-level commas.
fn split_args(rest: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    let mut in_string = false;
    for c in rest.chars() {
        match c {
            '"' => in_string = !in_string,
            '(' | '[' | '{' if !in_string => depth += 1,
            ')' | ']' | '}' if !in_string => depth -= 1,
            ',' if depth == 0 && !in_string => {
                if !current.trim().is_empty() {
                    args.push(current.trim().to_string());
                }
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        args.push(current.trim().to_string());
    }
    args
}

fn field<'a>(fields: &'a [FieldDesc], name: &str) -> Option<&'a FieldDesc> {
    fields.iter().find(|f| f.name == name.trim())
}

/// The text inside `name(…)` if `expr` is that call.
fn call_body<'a>(expr: &'a str, name: &str) -> Option<&'a str> {
    expr.strip_prefix(name)?
        .trim_start()
        .strip_prefix('(')?
        .strip_suffix(')')
}

fn compile_arg(expr: &str, fields: &[FieldDesc]) -> Arg {
    let mut expr = expr.trim();
    // Casts change nothing we print, except that %p wants an address, which it gets anyway.
    while expr.starts_with('(') && !expr.starts_with("((") {
        match expr.find(')') {
            Some(close) if close + 1 < expr.len() => expr = expr[close + 1..].trim(),
            _ => break,
        }
    }
    let unsupported = || Arg::Unsupported(expr.to_string());
    if let Some(name) = call_body(expr, "__get_str") {
        return match field(fields, name) {
            Some(f) if f.kind == FieldKind::DynString => Arg::DynStr { offset: f.offset },
            Some(f) if f.kind == FieldKind::TailString => Arg::TailStr { offset: f.offset },
            _ => unsupported(),
        };
    }
    if let Some(body) = call_body(expr, "__print_hex") {
        let inner = split_args(body);
        if let Some(name) = inner
            .first()
            .and_then(|a| call_body(a, "__get_dynamic_array"))
        {
            if let Some(f) = field(fields, name) {
                return Arg::Hex { offset: f.offset };
            }
        }
        return unsupported();
    }
    if let Some(body) = call_body(expr, "__print_array") {
        let inner = split_args(body);
        if let Some(name) = inner.first().and_then(|a| a.trim().strip_prefix("REC->")) {
            if let Some(f) = field(fields, name) {
                if let FieldKind::IntArray { elem_size, len } = f.kind {
                    return Arg::Array {
                        offset: f.offset,
                        elem_size,
                        len,
                        signed: f.signed,
                    };
                }
            }
        }
        return unsupported();
    }
    if let Some(rest) = expr.strip_prefix("REC->") {
        let (name, index) = match rest.find('[') {
            Some(open) => (&rest[..open], rest[open + 1..].strip_suffix(']')),
            None => (rest, None),
        };
        let Some(f) = field(fields, name) else {
            return unsupported();
        };
        return match (f.kind, index) {
            (FieldKind::CharArray, None) => Arg::CharArray {
                offset: f.offset,
                size: f.size,
            },
            (FieldKind::TailString, None) => Arg::TailStr { offset: f.offset },
            (FieldKind::IntArray { elem_size, len }, Some(i)) => match i.trim().parse::<usize>() {
                Ok(i) if i < len => Arg::Int {
                    offset: f.offset + i * elem_size,
                    size: elem_size,
                    signed: f.signed,
                },
                _ => unsupported(),
            },
            (FieldKind::Int | FieldKind::StringPtr, None) => Arg::Int {
                offset: f.offset,
                size: f.size,
                signed: f.signed,
            },
            _ => unsupported(),
        };
    }
    unsupported()
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn pad(conv: &Conv, body: &str, out: &mut String) {
    let len = body.chars().count();
    let width = conv.width.unwrap_or(0);
    if len >= width {
        out.push_str(body);
    } else if conv.left {
        out.push_str(body);
        out.extend(std::iter::repeat_n(' ', width - len));
    } else if conv.zero && "diuxXo".contains(conv.conv) && conv.precision.is_none() {
        // Zeros go after a sign or 0x prefix.
        let split = body
            .find(|c: char| {
                c.is_ascii_hexdigit() && !(body.starts_with("0x") || body.starts_with("0X"))
            })
            .unwrap_or(0);
        let split = if body.starts_with("0x") || body.starts_with("0X") {
            2
        } else {
            split
        };
        out.push_str(&body[..split]);
        out.extend(std::iter::repeat_n('0', width - len));
        out.push_str(&body[split..]);
    } else {
        out.extend(std::iter::repeat_n(' ', width - len));
        out.push_str(body);
    }
}

fn truncate(value: u64, bits: u32, signed: bool) -> (u64, i64) {
    if bits >= 64 {
        return (value, value as i64);
    }
    let mask = (1u64 << bits) - 1;
    let unsigned = value & mask;
    let shift = 64 - bits;
    let signed_value = if signed {
        ((unsigned << shift) as i64) >> shift
    } else {
        unsigned as i64
    };
    (unsigned, signed_value)
}

fn format_int(conv: &Conv, raw: u64) -> String {
    let (unsigned, signed) = truncate(raw, conv.bits, matches!(conv.conv, 'd' | 'i'));
    let mut digits = match conv.conv {
        'd' | 'i' => signed.unsigned_abs().to_string(),
        'u' => unsigned.to_string(),
        'x' => format!("{unsigned:x}"),
        'X' => format!("{unsigned:X}"),
        'o' => format!("{unsigned:o}"),
        'c' => return char::from(unsigned as u8).to_string(),
        _ => unsigned.to_string(),
    };
    if let Some(p) = conv.precision {
        if digits.len() < p {
            digits = "0".repeat(p - digits.len()) + &digits;
        }
    }
    let prefix = match conv.conv {
        'd' | 'i' if signed < 0 => "-",
        'd' | 'i' if conv.plus => "+",
        'd' | 'i' if conv.space => " ",
        'x' if conv.alt && unsigned != 0 => "0x",
        'X' if conv.alt && unsigned != 0 => "0X",
        'o' if conv.alt && !digits.starts_with('0') => "0",
        _ => "",
    };
    format!("{prefix}{digits}")
}

fn render_conv(
    conv: &Conv,
    arg: Option<&Arg>,
    record: &[u8],
    symbols: &dyn Symbolizer,
    out: &mut String,
) {
    let Some(arg) = arg else {
        out.push_str("[MISSING ARG]");
        return;
    };
    let body = match arg {
        Arg::Int {
            offset,
            size,
            signed,
        } => {
            let raw = read_int(record, *offset, *size, *signed);
            if conv.conv == 'p' {
                match conv.pointer_ext {
                    Some(ext @ ('S' | 's' | 'B' | 'F' | 'f')) => symbols
                        .symbolize(raw, matches!(ext, 'S' | 'B' | 'F'))
                        .unwrap_or_else(|| format!("0x{raw:x}")),
                    None => symbols.plain_pointer(raw),
                    Some('x') => format!("{raw:016x}"),
                    _ => format!("0x{raw:x}"),
                }
            } else if conv.conv == 's' {
                format!("{raw}")
            } else {
                format_int(conv, raw)
            }
        }
        Arg::CharArray { offset, size } => {
            c_string(record.get(*offset..*offset + *size).unwrap_or_default())
        }
        Arg::DynStr { offset } => c_string(data_loc_bytes(record, *offset).unwrap_or_default()),
        Arg::TailStr { offset } => c_string(record.get(*offset..).unwrap_or_default()),
        Arg::Hex { offset } => {
            let bytes = data_loc_bytes(record, *offset).unwrap_or_default();
            let mut s = String::new();
            for (i, b) in bytes.iter().enumerate() {
                if i > 0 {
                    s.push(' ');
                }
                let _ = write!(s, "{b:02x}");
            }
            s
        }
        Arg::Array {
            offset,
            elem_size,
            len,
            signed,
        } => {
            let mut s = String::from("{");
            for i in 0..*len {
                if i > 0 {
                    s.push(',');
                }
                let v = read_int(record, offset + i * elem_size, *elem_size, *signed);
                let _ = write!(s, "0x{:x}", truncate(v, 8 * *elem_size as u32, false).0);
            }
            s.push('}');
            s
        }
        Arg::Unsupported(expr) => format!("[UNSUPPORTED: {expr}]"),
    };
    let body = match (conv.conv, conv.precision) {
        ('s', Some(p)) => body.chars().take(p).collect(),
        _ => body,
    };
    pad(conv, &body, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::field::{FieldValue, Layout};

    fn record_of(layout_fields: &[FieldDesc], fill: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut record = vec![
            0u8;
            layout_fields
                .iter()
                .map(|f| f.offset + f.size)
                .max()
                .unwrap()
        ];
        fill(&mut record);
        record
    }

    #[test]
    fn renders_integers_strings_and_widths() {
        let mut layout = Layout::new();
        layout
            .push::<i32>("n")
            .push::<u64>("big")
            .push::<&str>("key")
            .push::<u8>("flag");
        let fields = layout.finish();
        let key = "alpha";
        let record = record_of(&fields, |r| {
            let end = r.len();
            r.resize(end + key.dyn_len(), 0);
            r[8..12].copy_from_slice(&(-42i32).to_ne_bytes());
            r[16..24].copy_from_slice(&0xdead_beefu64.to_ne_bytes());
            let (fixed, dynamic) = r.split_at_mut(end);
            key.write(&mut fixed[24..28], dynamic, end);
            r[28] = 1;
        });
        let fmt = PrintFmt::compile(
            "\"n=%d u=%u hex=%#llx pad=[%5d|%-5d|%05d] key=%s/%.3s/%8s flag=%u %%\", REC->n, REC->n, REC->big, REC->n, REC->n, REC->n, __get_str(key), __get_str(key), __get_str(key), REC->flag",
            &fields,
        )
        .unwrap();
        let mut out = String::new();
        fmt.render(&record, &NoSymbols, &mut out);
        assert_eq!(
            out,
            "n=-42 u=4294967254 hex=0xdeadbeef pad=[  -42|-42  |-0042] key=alpha/alp/   alpha flag=1 %"
        );
    }

    #[test]
    fn renders_arrays_char_arrays_and_missing_args() {
        let mut layout = Layout::new();
        layout
            .push::<[u32; 3]>("a")
            .push::<crate::event::field::FixedStr<8>>("comm");
        let fields = layout.finish();
        let record = record_of(&fields, |r| {
            for (i, v) in [1u32, 2, 0xff].iter().enumerate() {
                r[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_ne_bytes());
            }
            r[20..23].copy_from_slice(b"ksh");
        });
        let fmt = PrintFmt::compile(
            "\"%s a1=%u comm=%s %d\", __print_array(REC->a, 3, 4), REC->a[1], REC->comm",
            &fields,
        )
        .unwrap();
        let mut out = String::new();
        fmt.render(&record, &NoSymbols, &mut out);
        assert_eq!(out, "{0x1,0x2,0xff} a1=2 comm=ksh [MISSING ARG]");
    }

    #[test]
    fn rejects_formats_that_are_not_c_strings() {
        assert!(PrintFmt::compile("key=%s", &[]).is_err());
        assert!(PrintFmt::compile("\"unterminated", &[]).is_err());
        assert!(PrintFmt::compile("\"bad %", &[]).is_err());
    }
}
