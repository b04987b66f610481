//! Events as text, in the layout `trace-cmd report` prints them (libtraceevent's), so that
//! `ustrace report` and the real tool agree line for line on the same file:
//!
//! ```text
//!  {comm:>16}-{pid:<5} [{cpu:03}] {secs:>5}.{usecs:06}: {name}: {padding to 20} {info}
//! ```
//!
//! The time is in seconds and microseconds when the file's clock counts nanoseconds
//! (trace-cmd's list: local, global, uptime, perf, mono*, tai), else the raw count right
//! aligned in 12 columns (`counter`, `x86-tsc`, `boot`, as trace-cmd does). The info is the
//! event's `print fmt` evaluated on the record by ustrace's print-format engine, with
//! libtraceevent's spelling of pointers: `0x…` for an address no symbol covers, `sym` for
//! `%ps`, `sym+0xoff` for `%pS`.

use std::collections::HashMap;
use std::fmt::Write;

use ustrace::event::print_fmt::{PrintFmt, Symbolizer};
use ustrace::event::{FieldDesc, FieldKind};

use crate::format::{EventFormat, Field, FieldType};
use crate::read::{Event, Reader, Value};

/// Clocks trace-cmd shows as seconds.microseconds (the others as raw counts).
pub fn clock_in_usecs(clock: &str) -> bool {
    matches!(
        clock,
        "local" | "global" | "uptime" | "perf" | "tai" | "tsc2nsec"
    ) || clock.starts_with("mono")
}

/// The symbols of a `/proc/kallsyms`-style text, for `%ps`/`%pS`.
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    sorted: Vec<(u64, String)>,
}

impl Symbols {
    /// Parses `ADDR TYPE NAME [MODULE]` lines; others are ignored.
    pub fn parse(text: &[u8]) -> Symbols {
        let mut sorted: Vec<(u64, String)> = String::from_utf8_lossy(text)
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let _kind = it.next()?;
                Some((addr, it.next()?.to_string()))
            })
            .collect();
        sorted.sort();
        Symbols { sorted }
    }
}

impl Symbolizer for Symbols {
    fn symbolize(&self, addr: u64, with_offset: bool) -> Option<String> {
        let i = self.sorted.partition_point(|(a, _)| *a <= addr);
        let (start, name) = self.sorted.get(i.checked_sub(1)?)?;
        Some(if with_offset {
            format!("{name}+0x{:x}", addr - start)
        } else {
            name.clone()
        })
    }

    fn plain_pointer(&self, addr: u64) -> String {
        // glibc's `%p`, which libtraceevent uses.
        if addr == 0 {
            "(nil)".to_string()
        } else {
            format!("0x{addr:x}")
        }
    }
}

fn field_desc(f: &Field) -> FieldDesc {
    let kind = match f.ty {
        FieldType::Int => FieldKind::Int,
        FieldType::IntArray { elem_size, len } => FieldKind::IntArray { elem_size, len },
        FieldType::CharArray => FieldKind::CharArray,
        FieldType::DynString | FieldType::RelString => FieldKind::DynString,
        FieldType::DynArray => FieldKind::DynBytes,
        FieldType::TailString => FieldKind::TailString,
        FieldType::Pointer => FieldKind::StringPtr,
    };
    FieldDesc {
        name: f.name.clone().into(),
        c_type: f.c_type.clone().into(),
        offset: f.offset,
        size: f.size,
        signed: f.signed,
        kind,
    }
}

/// How `--raw` prints one field, as libtraceevent's field printer decides it.
enum RawField {
    /// With the field's own conversion from the print format (`0x` kept when the format
    /// text before it ends in `0x`).
    Conv { fmt: PrintFmt, zero_x: bool },
    /// By its type alone.
    Plain,
}

/// Prints events as `trace-cmd report` does.
pub struct Printer {
    fmts: HashMap<u16, Result<PrintFmt, String>>,
    raw: HashMap<u16, Vec<(Field, RawField)>>,
    usecs: bool,
    symbols: Symbols,
}

impl std::fmt::Debug for Printer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Printer")
            .field("usecs", &self.usecs)
            .finish()
    }
}

impl Printer {
    /// A printer for events of these formats, recorded with `clock`, with the symbols of
    /// a kallsyms-style text (may be empty).
    pub fn new<'a>(
        formats: impl IntoIterator<Item = &'a EventFormat>,
        clock: &str,
        kallsyms: &[u8],
    ) -> Printer {
        let mut fmts = HashMap::new();
        let mut raw = HashMap::new();
        for f in formats {
            let fields: Vec<FieldDesc> = f
                .common
                .iter()
                .chain(f.fields.iter())
                .map(field_desc)
                .collect();
            let compiled = PrintFmt::compile(&f.print_fmt, &fields).map_err(|e| e.to_string());
            raw.insert(f.id, raw_plan(f, &fields, compiled.is_ok()));
            fmts.insert(f.id, compiled);
        }
        Printer {
            fmts,
            raw,
            usecs: clock_in_usecs(clock),
            symbols: Symbols::parse(kallsyms),
        }
    }

    /// A printer for the events of `reader`'s file.
    pub fn for_reader(reader: &Reader) -> Printer {
        Printer::new(
            reader.formats().map(|f| &**f),
            &reader.meta().trace_clock,
            &reader.meta().kallsyms,
        )
    }

    /// The event's own text: its print format evaluated on the record.
    pub fn info(&self, ev: &Event, out: &mut String) {
        match self.fmts.get(&ev.id) {
            Some(Ok(fmt)) => fmt.render(&ev.data, &self.symbols, out),
            _ => {
                // As libtraceevent: the fields, raw.
                out.push_str("[FAILED TO PARSE]");
                raw_fields(ev, out);
            }
        }
    }

    /// The whole line(s) for `ev` without the final newline: a `CPU:N [.. EVENTS
    /// DROPPED]` line first when events were lost just before it.
    pub fn line(&self, ev: &Event, raw: bool) -> String {
        let mut s = String::new();
        if ev.missed_events > 0 {
            let _ = writeln!(s, "CPU:{} [{} EVENTS DROPPED]", ev.cpu, ev.missed_events);
        } else if ev.missed_events < 0 {
            let _ = writeln!(s, "CPU:{} [EVENTS DROPPED]", ev.cpu);
        }
        let _ = write!(s, "{:>16}-{:<5} [{:03}]", ev.comm, ev.pid, ev.cpu);
        if self.usecs {
            let us = ev.ts.saturating_add(500) / 1000;
            let _ = write!(s, " {:5}.{:06}:", us / 1_000_000, us % 1_000_000);
        } else {
            let _ = write!(s, "{:12}:", ev.ts);
        }
        let name = if ev.name.is_empty() {
            "(NULL)"
        } else {
            &ev.name
        };
        let _ = write!(s, " {name}: ");
        if name.len() < 20 {
            s.push_str(&" ".repeat(20 - name.len()));
        }
        if raw {
            self.raw_info(ev, &mut s);
        } else {
            self.info(ev, &mut s);
        }
        if s.ends_with('\n') {
            s.pop();
        }
        s
    }
}

impl Printer {
    /// ` name=value` for every field, as libtraceevent's field printer (`trace-cmd
    /// report -R`) writes them.
    pub fn raw_info(&self, ev: &Event, out: &mut String) {
        let Some(plan) = self.raw.get(&ev.id) else {
            raw_fields(ev, out);
            return;
        };
        for (field, how) in plan {
            let _ = write!(out, " {}=", field.name);
            match how {
                RawField::Conv { fmt, zero_x } => {
                    if *zero_x {
                        out.push_str("0x");
                    }
                    fmt.render(&ev.data, &self.symbols, out);
                }
                RawField::Plain => plain_field(&ev.data, field, out),
            }
        }
    }
}

/// A field printed by its type (libtraceevent's rules): printable strings as text, other
/// arrays as `ARRAY[hex bytes]`, pointers and `long`s in hex, other integers in decimal.
fn plain_field(data: &[u8], field: &Field, out: &mut String) {
    let bytes: Option<&[u8]> = match field.ty {
        FieldType::CharArray | FieldType::IntArray { .. } => {
            data.get(field.offset..field.offset.saturating_add(field.size))
        }
        FieldType::TailString => data.get(field.offset..),
        FieldType::DynString | FieldType::DynArray | FieldType::RelString => {
            crate::read::loc_bytes(data, field)
        }
        FieldType::Int | FieldType::Pointer => None,
    };
    if let Some(bytes) = bytes {
        let text = bytes.split(|&b| b == 0).next().unwrap_or(&[]);
        let is_string = matches!(
            field.ty,
            FieldType::CharArray
                | FieldType::TailString
                | FieldType::DynString
                | FieldType::RelString
        );
        if is_string
            && text
                .iter()
                .all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace())
        {
            out.push_str(&String::from_utf8_lossy(text));
        } else {
            out.push_str("ARRAY[");
            for (i, b) in bytes.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "{b:02x}");
            }
            out.push(']');
        }
        return;
    }
    let raw = match crate::read::field_value(data, field) {
        Value::Int(v) => v as u64,
        Value::UInt(v) => v,
        _ => 0,
    };
    let long = field.c_type.ends_with("long") && !field.c_type.ends_with("long long");
    if field.ty == FieldType::Pointer {
        let _ = write!(out, "0x{raw:x}");
    } else if field.signed {
        let v = raw as i64;
        let _ = match field.size {
            4 if long => write!(out, "0x{:x}", v as i32),
            4 => write!(out, "{}", v as i32),
            2 => write!(out, "{:2}", v as i16),
            1 => write!(out, "{}", v as i8),
            _ => write!(out, "{v}"),
        };
    } else if long {
        let _ = write!(out, "0x{raw:x}");
    } else {
        let _ = write!(out, "{raw}");
    }
}

/// One conversion of a print format: the text before it, the conversion, its argument.
struct Conversion {
    before: String,
    spec: String,
    arg: String,
}

/// Splits `"text", arg, arg` into its conversions, or `None` if it cannot.
fn conversions(print_fmt: &str) -> Option<Vec<Conversion>> {
    let text = print_fmt.trim();
    let mut chars = text.strip_prefix('"')?.chars();
    let mut literal = String::new();
    loop {
        match chars.next()? {
            '"' => break,
            '\\' => {
                let c = chars.next()?;
                literal.push(match c {
                    'n' => '\n',
                    't' => '\t',
                    other => other,
                });
            }
            c => literal.push(c),
        }
    }
    let rest: String = chars.collect();
    let mut args = Vec::new();
    let (mut depth, mut quoted, mut cur) = (0i32, false, String::new());
    for c in rest.trim_start().trim_start_matches(',').chars() {
        match c {
            '"' => quoted = !quoted,
            '(' | '[' | '{' if !quoted => depth += 1,
            ')' | ']' | '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                args.push(std::mem::take(&mut cur).trim().to_string());
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        args.push(cur.trim().to_string());
    }
    let mut out = Vec::new();
    let mut args = args.into_iter();
    let mut before = String::new();
    let mut it = literal.chars().peekable();
    while let Some(c) = it.next() {
        if c != '%' {
            before.push(c);
            continue;
        }
        if it.peek() == Some(&'%') {
            it.next();
            before.push('%');
            continue;
        }
        let mut spec = String::from("%");
        while let Some(&c) = it.peek() {
            spec.push(c);
            it.next();
            if c.is_ascii_alphabetic() && !matches!(c, 'h' | 'l' | 'z' | 'j' | 't' | 'L' | 'q') {
                if c == 'p' {
                    while let Some(&e) = it.peek() {
                        if !e.is_ascii_alphanumeric() {
                            break;
                        }
                        spec.push(e);
                        it.next();
                    }
                }
                break;
            }
        }
        out.push(Conversion {
            before: std::mem::take(&mut before),
            spec,
            arg: args.next()?,
        });
    }
    Some(out)
}

/// The argument with its casts and outer parentheses taken off: `(void *)REC->ip` and
/// `(REC->ip)` are `REC->ip`.
fn strip_casts(arg: &str) -> &str {
    let mut a = arg.trim();
    while a.starts_with('(') {
        let mut depth = 0;
        let mut close = None;
        for (i, c) in a.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        match close {
            // `(T)expr`: a cast.
            Some(i) if i + 1 < a.len() => a = a[i + 1..].trim(),
            // `(expr)`: parentheses around the whole.
            Some(i) if i + 1 == a.len() => a = a[1..i].trim(),
            _ => break,
        }
    }
    a
}

/// How each field of `f` prints raw: libtraceevent looks, for a number, for the next
/// conversion (cyclically, from after the last one used) whose argument is that field.
fn raw_plan(f: &EventFormat, fields: &[FieldDesc], fmt_ok: bool) -> Vec<(Field, RawField)> {
    let convs = if fmt_ok {
        conversions(&f.print_fmt).unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut next = 0usize;
    f.fields
        .iter()
        .map(|field| {
            let is_number = matches!(field.ty, FieldType::Int | FieldType::Pointer);
            let want = format!("REC->{}", field.name);
            let found = (0..convs.len())
                .map(|k| (next + k) % convs.len())
                .find(|&i| is_number && strip_casts(&convs[i].arg) == want);
            let how = found
                .and_then(|i| {
                    let c = &convs[i];
                    let fmt =
                        PrintFmt::compile(&format!("\"{}\", {}", c.spec, c.arg), fields).ok()?;
                    next = i + 1;
                    Some(RawField::Conv {
                        fmt,
                        zero_x: c.before.ends_with("0x"),
                    })
                })
                .unwrap_or(RawField::Plain);
            (field.clone(), how)
        })
        .collect()
}

/// `name=value` for every field, by value alone (for events without a format).
pub fn raw_fields(ev: &Event, out: &mut String) {
    for (name, value) in &ev.fields {
        let _ = write!(out, " {name}=");
        match value {
            Value::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Value::UInt(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Str(v) => out.push_str(v),
            Value::Bytes(b) => {
                out.push('{');
                for (i, x) in b.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{x}");
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('{');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{x}");
                }
                out.push('}');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_spell_as_libtraceevent() {
        let s = Symbols::parse(b"1000 T foo\n2000 t bar\n");
        assert_eq!(s.symbolize(0x1010, true).as_deref(), Some("foo+0x10"));
        assert_eq!(s.symbolize(0x2000, false).as_deref(), Some("bar"));
        assert_eq!(s.symbolize(0x10, false), None);
        assert_eq!(s.plain_pointer(0), "(nil)");
    }

    #[test]
    fn print_formats_split_into_conversions() {
        let c =
            conversions(r#""(%lx) a=0x%x s=%s%%", REC->__probe_ip, (u32)(REC->a), __get_str(s)"#)
                .unwrap();
        let got: Vec<_> = c
            .iter()
            .map(|c| (c.before.as_str(), c.spec.as_str(), strip_casts(&c.arg)))
            .collect();
        assert_eq!(
            got,
            [
                ("(", "%lx", "REC->__probe_ip"),
                (") a=0x", "%x", "REC->a"),
                (" s=", "%s", "__get_str(s)"),
            ]
        );
        assert_eq!(
            conversions(r#""%ps: %s", (void *)REC->ip, REC->buf"#).unwrap()[0].spec,
            "%ps"
        );
    }

    #[test]
    fn ns_clocks_print_as_seconds() {
        assert!(clock_in_usecs("local") && clock_in_usecs("mono_raw"));
        assert!(!clock_in_usecs("counter") && !clock_in_usecs("boot"));
    }
}
