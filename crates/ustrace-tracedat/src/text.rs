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

/// Prints events as `trace-cmd report` does.
pub struct Printer {
    fmts: HashMap<u16, Result<PrintFmt, String>>,
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
        let fmts = formats
            .into_iter()
            .map(|f| {
                let fields: Vec<FieldDesc> = f
                    .common
                    .iter()
                    .chain(f.fields.iter())
                    .map(field_desc)
                    .collect();
                let compiled = PrintFmt::compile(&f.print_fmt, &fields).map_err(|e| e.to_string());
                (f.id, compiled)
            })
            .collect();
        Printer {
            fmts,
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
            raw_fields(ev, &mut s);
        } else {
            self.info(ev, &mut s);
        }
        if s.ends_with('\n') {
            s.pop();
        }
        s
    }
}

/// `name=value` for every field, as libtraceevent's raw output.
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
    fn ns_clocks_print_as_seconds() {
        assert!(clock_in_usecs("local") && clock_in_usecs("mono_raw"));
        assert!(!clock_in_usecs("counter") && !clock_in_usecs("boot"));
    }
}
