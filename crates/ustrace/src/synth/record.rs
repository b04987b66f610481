//! How a synthetic event's record is laid out, written and printed.
//!
//! The kernel's `struct synth_trace_event`: the common header, then one u64 slot per
//! field (a fixed string takes 256 bytes), then the dynamic part holding `__data_loc`
//! strings and stack traces in field order:
//!
//! ```text
//!  0        8          16            16+256        ...         fixed_len
//!  ┌────────┬──────────┬─────────────┬─────────────┬───────────┬───────────────────┐
//!  │ common │ u64 lat  │ char comm[] │ u32 loc+pad │ ...       │ "name\0" stack... │
//!  └────────┴──────────┴─────────────┴─────────────┴───────────┴───────────────────┘
//!    an integer is stored in the first `size` bytes of its slot; a `__data_loc` slot
//!    holds `len << 16 | offset` in its first 4 bytes
//! ```
//!
//! [`Layout::fill`] writes a record from values without allocating; [`Layout::render`] prints
//! one as the kernel's `print_synth_event` does (`name: a=1 b=str`).

use std::fmt::Write as _;

use ustrace_filter::synth::{SynthDef, SynthFieldKind, STACK_DEPTH, STR_VAR_LEN_MAX};

use crate::event::field::COMMON_SIZE;

use super::{SynthError, SynthValue};

/// The longest dynamic string a record keeps (bytes, NUL excluded): the kernel's fetch
/// limit for strings.
pub const MAX_DYN_STRING: usize = 4095;

/// One field of a synthetic event, as a record holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthField {
    name: String,
    c_type: String,
    size: usize,
    signed: bool,
    kind: SynthFieldKind,
    offset: usize,
    conversion: &'static str,
}

impl SynthField {
    /// The field's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The C type the `format` file shows (`u64`, `char[16]`, `__data_loc char[]`).
    pub fn c_type(&self) -> &str {
        &self.c_type
    }
    /// The size the `format` file shows (an integer's size, a fixed string's declared
    /// size, 8 for `__data_loc` fields).
    pub fn size(&self) -> usize {
        self.size
    }
    /// Whether an integer field is signed (as the `format` file says).
    pub fn signed(&self) -> bool {
        self.signed
    }
    /// What the field holds.
    pub fn kind(&self) -> SynthFieldKind {
        self.kind
    }
    /// Whether the field takes a string value.
    pub fn is_string(&self) -> bool {
        matches!(
            self.kind,
            SynthFieldKind::StaticString | SynthFieldKind::DynString
        )
    }
    /// Whether the field takes a stack trace.
    pub fn is_stack(&self) -> bool {
        self.kind == SynthFieldKind::Stack
    }
    /// Where the field's slot starts in a record (common header included).
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// The value kind this field takes, for error messages.
    pub(crate) fn wants(&self) -> &'static str {
        match self.kind {
            SynthFieldKind::Int => "an integer",
            SynthFieldKind::StaticString | SynthFieldKind::DynString => "a string",
            SynthFieldKind::Stack => "a stack trace",
        }
    }
    /// The value an unset field records.
    pub(crate) fn zero(&self) -> SynthValue<'static> {
        match self.kind {
            SynthFieldKind::Int => SynthValue::U64(0),
            SynthFieldKind::StaticString | SynthFieldKind::DynString => SynthValue::Str(b""),
            SynthFieldKind::Stack => SynthValue::Stack(&[]),
        }
    }
    /// Whether `value` is of the kind this field takes.
    #[inline]
    pub(crate) fn accepts(&self, value: &SynthValue<'_>) -> bool {
        matches!(
            (self.kind, value),
            (SynthFieldKind::Int, SynthValue::U64(_))
                | (
                    SynthFieldKind::StaticString | SynthFieldKind::DynString,
                    SynthValue::Str(_)
                )
                | (SynthFieldKind::Stack, SynthValue::Stack(_))
        )
    }
}

/// A synthetic event's record layout.
#[derive(Debug)]
pub struct Layout {
    pub(crate) fields: Vec<SynthField>,
    /// Bytes before the dynamic part.
    fixed_len: usize,
    /// Every field is an integer: a record is `fixed_len` bytes, one 8-byte slot per
    /// field, and [`Layout::fill_ints`] may write it.
    ints_only: bool,
}

/// The bytes of a string value up to its first NUL, at most `max`.
#[inline]
fn str_bytes(s: &[u8], max: usize) -> &[u8] {
    let end = s.iter().position(|&b| b == 0).unwrap_or(s.len()).min(max);
    &s[..end]
}

/// The return addresses a stack value records, and whether a 0 ends them (the kernel keeps
/// the terminating 0 when the stack is shorter than its depth).
#[inline]
fn stack_words(s: &[u64]) -> (&[u64], bool) {
    let n = s
        .iter()
        .position(|&a| a == 0)
        .unwrap_or(s.len())
        .min(STACK_DEPTH);
    (&s[..n], n < STACK_DEPTH)
}

#[inline]
fn dyn_len(value: &SynthValue<'_>) -> usize {
    match value {
        SynthValue::Str(s) => str_bytes(s, MAX_DYN_STRING).len() + 1,
        SynthValue::Stack(s) => {
            let (words, zero) = stack_words(s);
            (words.len() + usize::from(zero)) * 8
        }
        SynthValue::U64(_) => 0,
    }
}

fn read_u64(record: &[u8], at: usize, size: usize) -> u64 {
    let mut bytes = [0u8; 8];
    if let Some(src) = record.get(at..at + size) {
        bytes[..size].copy_from_slice(src);
    }
    match size {
        1 => u64::from(bytes[0]),
        2 => u64::from(u16::from_ne_bytes([bytes[0], bytes[1]])),
        4 => u64::from(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
        _ => u64::from_ne_bytes(bytes),
    }
}

impl Layout {
    /// Lays out a parsed definition.
    pub fn new(def: &SynthDef) -> Layout {
        let mut offset = COMMON_SIZE;
        let mut fields = Vec::with_capacity(def.fields.len());
        for f in &def.fields {
            fields.push(SynthField {
                name: f.name.clone(),
                c_type: f.c_type.clone(),
                size: f.size,
                signed: f.signed,
                kind: f.kind,
                offset,
                conversion: f.conversion(),
            });
            offset += f.slot_size();
        }
        Layout {
            ints_only: fields.iter().all(|f| f.kind == SynthFieldKind::Int),
            fields,
            fixed_len: offset,
        }
    }

    /// Whether every field is an integer ([`Layout::fill_ints`]).
    #[inline]
    pub fn ints_only(&self) -> bool {
        self.ints_only
    }

    /// The record length of an integers-only layout, common header included.
    #[inline]
    pub fn fixed_len(&self) -> usize {
        self.fixed_len
    }

    /// [`Layout::fill`] for an integers-only layout, from the values themselves: the
    /// bytes [`Layout::fill`] writes for `SynthValue::U64` of each, without matching a
    /// value's kind (`values` has one per field; the caller checked both).
    #[inline]
    pub fn fill_ints(&self, values: &[u64], record: &mut [u8]) {
        debug_assert!(self.ints_only && values.len() == self.fields.len());
        for (field, &v) in self.fields.iter().zip(values) {
            let Some(slot) = record.get_mut(field.offset..field.offset + 8) else {
                return;
            };
            // A value is cut to its field's size and the rest of the slot is zero: on a
            // little-endian machine that is the low bytes of the value, masked.
            let v = match field.size {
                1 => u64::from(v as u8),
                2 => u64::from(v as u16),
                4 => u64::from(v as u32),
                _ => v,
            };
            let bytes = if cfg!(target_endian = "little") || field.size == 8 {
                v.to_ne_bytes()
            } else {
                let mut b = [0u8; 8];
                b[..field.size].copy_from_slice(&v.to_ne_bytes()[8 - field.size..]);
                b
            };
            slot.copy_from_slice(&bytes);
        }
    }

    /// The event's fields as the `format` file and filters see them.
    pub fn descs(&self) -> Vec<crate::event::FieldDesc> {
        use crate::event::FieldKind;
        self.fields
            .iter()
            .map(|f| crate::event::FieldDesc {
                name: f.name.clone().into(),
                c_type: f.c_type.clone().into(),
                offset: f.offset,
                size: f.size,
                signed: f.signed,
                kind: match f.kind {
                    SynthFieldKind::Int => FieldKind::Int,
                    SynthFieldKind::StaticString => FieldKind::CharArray,
                    SynthFieldKind::DynString => FieldKind::DynString,
                    SynthFieldKind::Stack => FieldKind::DynBytes,
                },
            })
            .collect()
    }

    /// Checks `values` against the fields: one per field, each of the field's kind.
    #[inline]
    pub fn check(&self, values: &[SynthValue<'_>]) -> Result<(), SynthError> {
        if values.len() != self.fields.len() {
            return Err(SynthError::WrongCount {
                expected: self.fields.len(),
                got: values.len(),
            });
        }
        for (i, (field, value)) in self.fields.iter().zip(values).enumerate() {
            if !field.accepts(value) {
                return Err(SynthError::WrongType {
                    field: i,
                    expected: field.wants(),
                });
            }
        }
        Ok(())
    }

    /// The record length for checked `values`, common header included.
    #[inline]
    pub fn record_len(&self, values: &[SynthValue<'_>]) -> usize {
        let dynamic = self
            .fields
            .iter()
            .zip(values)
            .filter(|(f, _)| f.kind != SynthFieldKind::StaticString)
            .map(|(_, v)| dyn_len(v))
            .sum::<usize>();
        self.fixed_len + dynamic
    }

    /// Writes checked `values` into `record` (of [`Layout::record_len`] bytes; the
    /// header is the caller's). Every byte after the header is written, so no stale
    /// buffer contents show through padding.
    #[inline]
    pub fn fill(&self, values: &[SynthValue<'_>], record: &mut [u8]) {
        let mut data = self.fixed_len;
        for (field, value) in self.fields.iter().zip(values) {
            let at = field.offset;
            match *value {
                SynthValue::U64(v) => {
                    let slot = &mut record[at..at + 8];
                    slot.fill(0);
                    let bytes = v.to_ne_bytes();
                    match field.size {
                        1 => slot[0] = v as u8,
                        2 => slot[..2].copy_from_slice(&(v as u16).to_ne_bytes()),
                        4 => slot[..4].copy_from_slice(&(v as u32).to_ne_bytes()),
                        _ => slot.copy_from_slice(&bytes),
                    }
                }
                SynthValue::Str(s) if field.kind == SynthFieldKind::StaticString => {
                    let slot = &mut record[at..at + STR_VAR_LEN_MAX];
                    let s = str_bytes(s, STR_VAR_LEN_MAX - 1);
                    slot[..s.len()].copy_from_slice(s);
                    slot[s.len()..].fill(0);
                }
                SynthValue::Str(s) => {
                    let s = str_bytes(s, MAX_DYN_STRING);
                    let len = s.len() + 1;
                    record[data..data + s.len()].copy_from_slice(s);
                    record[data + s.len()] = 0;
                    write_loc(record, at, data, len);
                    data += len;
                }
                SynthValue::Stack(s) => {
                    let (words, zero) = stack_words(s);
                    for (i, w) in words.iter().enumerate() {
                        record[data + 8 * i..data + 8 * i + 8].copy_from_slice(&w.to_ne_bytes());
                    }
                    let mut len = words.len() * 8;
                    if zero {
                        record[data + len..data + len + 8].fill(0);
                        len += 8;
                    }
                    write_loc(record, at, data, len);
                    data += len;
                }
            }
        }
    }

    /// Prints a record as the kernel's `print_synth_event`: `name: ` then `field=value`
    /// separated by blanks; a stack as `name=STACK:` and one `=> symbol` line per address.
    /// With `verbose` (the option), each value is preceded by its printf conversion.
    pub fn render(&self, name: &str, record: &[u8], out: &mut String, verbose: bool) {
        let _ = write!(out, "{name}: ");
        let last = self.fields.len().saturating_sub(1);
        for (i, f) in self.fields.iter().enumerate() {
            let space = if i == last { "" } else { " " };
            if verbose {
                let _ = write!(out, "{} ", f.conversion);
            }
            match f.kind {
                SynthFieldKind::Int => {
                    let _ = write!(out, "{}=", f.name);
                    let v = read_u64(record, f.offset, f.size);
                    // The kernel passes the value cast to the field's size to printf, so
                    // 1- and 2-byte signed values print unsigned, as there.
                    match (f.conversion, f.size) {
                        ("%x", _) => {
                            let _ = write!(out, "{v:x}");
                        }
                        ("%d" | "%ld" | "%lld", 4) => {
                            let _ = write!(out, "{}", v as u32 as i32);
                        }
                        ("%d" | "%ld" | "%lld", 8) => {
                            let _ = write!(out, "{}", v as i64);
                        }
                        _ => {
                            let _ = write!(out, "{v}");
                        }
                    }
                    out.push_str(space);
                    if f.c_type == "gfp_t" {
                        // The kernel names the flags; user space has none, so what is
                        // set prints as a number (nothing when none is set).
                        if v != 0 {
                            let _ = write!(out, " (0x{v:x})");
                        } else {
                            out.push_str(" ()");
                        }
                    }
                }
                SynthFieldKind::StaticString => {
                    let bytes = record
                        .get(f.offset..f.offset + STR_VAR_LEN_MAX)
                        .unwrap_or(&[]);
                    let s = str_bytes(bytes, STR_VAR_LEN_MAX);
                    let _ = write!(out, "{}={}{space}", f.name, String::from_utf8_lossy(s));
                }
                SynthFieldKind::DynString => {
                    let (off, len) = read_loc(record, f.offset);
                    let bytes = record.get(off..off + len).unwrap_or(&[]);
                    let s = str_bytes(bytes, STR_VAR_LEN_MAX);
                    let _ = write!(out, "{}={}{space}", f.name, String::from_utf8_lossy(s));
                }
                SynthFieldKind::Stack => {
                    let (off, len) = read_loc(record, f.offset);
                    let _ = writeln!(out, "{}=STACK:", f.name);
                    let inventory = ustrace_inspect::symbols::inventory();
                    for i in 0..len / 8 {
                        let addr = read_u64(record, off + 8 * i, 8);
                        if addr == 0 {
                            break;
                        }
                        out.push_str("=> ");
                        inventory.write_sym(out, addr as usize, true);
                        out.push('\n');
                    }
                }
            }
        }
        out.push('\n');
    }
}

fn write_loc(record: &mut [u8], at: usize, offset: usize, len: usize) {
    let loc = (offset as u32 & 0xffff) | ((len as u32) << 16);
    let slot = &mut record[at..at + 8];
    slot[..4].copy_from_slice(&loc.to_ne_bytes());
    slot[4..].fill(0);
}

fn read_loc(record: &[u8], at: usize) -> (usize, usize) {
    let loc = read_u64(record, at, 4) as u32;
    ((loc & 0xffff) as usize, (loc >> 16) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ustrace_filter::synth::{parse_line, SynthCommand};

    fn layout(line: &str) -> (SynthDef, Layout) {
        let Ok(SynthCommand::Create(def)) = parse_line(line, &|_| false) else {
            panic!("{line}")
        };
        let l = Layout::new(&def);
        (def, l)
    }

    /// The integer path writes the bytes the general one writes: each value cut to its
    /// field's size, the rest of its slot zero, every byte after the header written.
    #[test]
    fn integers_only_records_match_the_general_fill() {
        let (_, l) = layout("e u8 a; u16 b; s32 c; u64 d; pid_t p");
        assert!(l.ints_only());
        assert!(!layout("e u64 a; char s[]").1.ints_only());
        let ints = [0x1ff, 0x1_0002, -5i64 as u64, u64::MAX - 1, 0x1_0000_0007];
        let values = ints.map(SynthValue::U64);
        l.check(&values).unwrap();
        assert_eq!(l.record_len(&values), l.fixed_len());
        let mut general = vec![0xaa; l.fixed_len()];
        let mut fast = vec![0x55; l.fixed_len()];
        l.fill(&values, &mut general);
        l.fill_ints(&ints, &mut fast);
        assert_eq!(general[COMMON_SIZE..], fast[COMMON_SIZE..]);
        let mut out = String::new();
        l.render("e", &fast, &mut out, false);
        assert_eq!(out, format!("e: a=255 b=2 c=-5 d={} p=7\n", u64::MAX - 1));
    }

    #[test]
    fn offsets_follow_the_kernels_slots() {
        let (_, l) = layout("e u8 a; char s[16]; char d[]; s32 b");
        let offs: Vec<usize> = l.fields.iter().map(|f| f.offset).collect();
        assert_eq!(offs, [8, 16, 16 + 256, 16 + 256 + 8]);
        assert_eq!(l.fixed_len, 16 + 256 + 16);
    }

    #[test]
    fn written_and_printed_as_the_kernel() {
        let (_, l) = layout("e u8 a; char s[16]; char d[]; s32 b; s8 c; u64 e; unsigned long[] st");
        let values = [
            SynthValue::U64(300),
            SynthValue::Str(b"hello\0junk"),
            SynthValue::Str(b"dyn"),
            SynthValue::U64(-5i64 as u64),
            SynthValue::U64(-1i64 as u64),
            SynthValue::U64(u64::MAX),
            SynthValue::Stack(&[]),
        ];
        l.check(&values).unwrap();
        let len = l.record_len(&values);
        assert_eq!(len, l.fixed_len + 4 + 8);
        let mut record = vec![0xaa; len];
        l.fill(&values, &mut record);
        let mut out = String::new();
        l.render("e", &record, &mut out, false);
        assert_eq!(
            out,
            format!(
                "e: a=44 s=hello d=dyn b=-5 c=255 e={} st=STACK:\n\n",
                u64::MAX
            )
        );
        out.clear();
        l.render("e", &record, &mut out, true);
        assert_eq!(
            out,
            format!(
                "e: %u a=44 %.*s s=hello %.*s d=dyn %d b=-5 %d c=255 %llu e={} %s st=STACK:\n\n",
                u64::MAX
            )
        );
        let (off, dlen) = read_loc(&record, l.fields[2].offset);
        assert_eq!((off, dlen), (l.fixed_len, 4));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// A field type and a value of its kind.
        fn field_and_value() -> impl Strategy<Value = (&'static str, OwnedValue)> {
            prop_oneof![
                any::<u64>().prop_map(|v| ("u64", OwnedValue::Int(v))),
                any::<u64>().prop_map(|v| ("s32", OwnedValue::Int(v))),
                any::<u64>().prop_map(|v| ("u16", OwnedValue::Int(v))),
                any::<u64>().prop_map(|v| ("char", OwnedValue::Int(v))),
                proptest::collection::vec(any::<u8>(), 0..300)
                    .prop_map(|v| ("char[16]", OwnedValue::Str(v))),
                proptest::collection::vec(any::<u8>(), 0..300)
                    .prop_map(|v| ("char[]", OwnedValue::Str(v))),
                proptest::collection::vec(any::<u64>(), 0..20)
                    .prop_map(|v| ("unsigned long[]", OwnedValue::Stack(v))),
            ]
        }

        #[derive(Clone, Debug)]
        enum OwnedValue {
            Int(u64),
            Str(Vec<u8>),
            Stack(Vec<u64>),
        }

        impl OwnedValue {
            fn value(&self) -> SynthValue<'_> {
                match self {
                    OwnedValue::Int(v) => SynthValue::U64(*v),
                    OwnedValue::Str(v) => SynthValue::Str(v),
                    OwnedValue::Stack(v) => SynthValue::Stack(v),
                }
            }
        }

        proptest! {
            /// What a record holds is what a reader of the `format` file finds: integers
            /// cut to their size, strings up to their first NUL (255 bytes at most in a
            /// fixed field, 4095 in a dynamic one, NUL-terminated), stacks up to their
            /// first 0 and 16 entries, with the closing 0 when there is room; every byte
            /// after the header is written.
            #[test]
            fn records_read_back_through_the_format(fields in proptest::collection::vec(field_and_value(), 1..12)) {
                let line: Vec<String> = fields
                    .iter()
                    .enumerate()
                    .map(|(i, (ty, _))| format!("{ty} f{i}"))
                    .collect();
                let (_, l) = layout(&format!("p {}", line.join("; ")));
                let values: Vec<SynthValue<'_>> = fields.iter().map(|(_, v)| v.value()).collect();
                l.check(&values).unwrap();
                let len = l.record_len(&values);
                let mut a = vec![0x55u8; len];
                let mut b = vec![0xaau8; len];
                l.fill(&values, &mut a);
                l.fill(&values, &mut b);
                prop_assert_eq!(&a[COMMON_SIZE..], &b[COMMON_SIZE..]);
                for (desc, (_, v)) in l.descs().iter().zip(&fields) {
                    match v {
                        OwnedValue::Int(v) => {
                            let mask = if desc.size == 8 { u64::MAX } else { (1u64 << (8 * desc.size)) - 1 };
                            prop_assert_eq!(read_u64(&a, desc.offset, desc.size), v & mask);
                        }
                        OwnedValue::Str(s) => {
                            let (bytes, max) = if desc.c_type.starts_with("__data_loc") {
                                let (off, n) = read_loc(&a, desc.offset);
                                prop_assert!(n >= 1 && a[off + n - 1] == 0);
                                (&a[off..off + n - 1], MAX_DYN_STRING)
                            } else {
                                let slot = &a[desc.offset..desc.offset + STR_VAR_LEN_MAX];
                                (str_bytes(slot, STR_VAR_LEN_MAX), STR_VAR_LEN_MAX - 1)
                            };
                            prop_assert_eq!(bytes, str_bytes(s, max));
                        }
                        OwnedValue::Stack(st) => {
                            let (off, n) = read_loc(&a, desc.offset);
                            let got: Vec<u64> = (0..n / 8).map(|i| read_u64(&a, off + 8 * i, 8)).collect();
                            let mut want: Vec<u64> = st.iter().copied().take_while(|&x| x != 0).take(STACK_DEPTH).collect();
                            if want.len() < STACK_DEPTH {
                                want.push(0);
                            }
                            prop_assert_eq!(got, want);
                        }
                    }
                }
                let mut out = String::new();
                l.render("p", &a, &mut out, false);
                prop_assert!(out.starts_with("p: ") && out.ends_with('\n'));
            }
        }
    }

    #[test]
    fn wrong_counts_and_kinds_are_refused() {
        let (_, l) = layout("e u64 a; char s[]");
        assert_eq!(
            l.check(&[SynthValue::U64(1)]),
            Err(SynthError::WrongCount {
                expected: 2,
                got: 1
            })
        );
        assert_eq!(
            l.check(&[SynthValue::U64(1), SynthValue::U64(2)]),
            Err(SynthError::WrongType {
                field: 1,
                expected: "a string"
            })
        );
    }
}
