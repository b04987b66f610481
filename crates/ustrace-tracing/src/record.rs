//! The record layout of a `tracing` callsite and the visitor that fills it.
//!
//! `tracing` tells a callsite's field *names* when it registers but a value's *type* only
//! when it is recorded, and the layout (the `format` file, compiled filters) must be fixed
//! at registration. So each field `NAME` of the callsite gets two record fields, and every
//! value fills the one its type calls for:
//!
//! | recorded as | `s64 NAME` | `__data_loc char[] NAME_str` |
//! | --- | --- | --- |
//! | `i64`, `u64` | the value (a `u64` above `i64::MAX` keeps its bits) | no bytes |
//! | `bool` | 0 or 1 | no bytes |
//! | `f64` (the kernel has no floats) | the value truncated toward 0 | the value as text |
//! | `i128`, `u128` | the low 64 bits | the value as text |
//! | `&str`, `Debug`, errors | 0 | the text |
//!
//! so `status >= 500` and `path ~ "/api/*"` (on `path_str`) both filter as they would on a
//! kernel event. A field a call leaves out reads 0 and no bytes. The field named `message`
//! (what `info!("...")` records) is always text and has only `__data_loc char[] message`.
//! Field names are sanitized as event names are (`http.method` → `http_method`).
//! Every record starts with `int level` (1 ERROR, 2 WARN, 3 INFO, 4 DEBUG, 5 TRACE, so
//! `level <= 2` keeps warnings and errors); span events then have `u64 span_id`.
//!
//! An event's record is built in the caller's stack frame ([`StackRecord`]: strings go there
//! straight from their `Debug`/`Display` impl, no `String` is made) and copied into each
//! recording instance; a span's is kept in a `Vec` in the span's extensions. Both fill
//! through [`Fill`], which finds a value's place by the field's index in its callsite's
//! field set (a load from [`Layout::slots`], no name is compared).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::mem::MaybeUninit;

use tracing_core::field::{Field, Visit};
use tracing_core::Level;
use ustrace::event::field::{align_up, read_int, COMMON_SIZE};
use ustrace::event::{FieldDesc, FieldKind};

/// The longest record built: `__data_loc` offsets are 16 bits, and a record must fit a page.
pub const MAX_RECORD: usize = 3072;

/// Where one callsite field's value goes: record offsets, 0 for none (offset 0 is the
/// common header, never a field). Two plain offsets rather than an enum, so that writing a
/// value is a load and a store, with no match on the field's kind.
#[derive(Clone, Copy, Debug, Default)]
pub struct Slot {
    /// The `s64` of a value field; 0 for `message`, which is text only.
    pub num: u16,
    /// The `__data_loc` word of the field's text.
    pub loc: u16,
}

/// A callsite's record layout.
pub struct Layout {
    /// By the field's index in the callsite's field set.
    pub slots: Box<[Slot]>,
    pub fields: Vec<FieldDesc>,
    /// Size of the fixed part, common header included: dynamic data starts here.
    pub fixed: usize,
    pub print_fmt: String,
    /// `fixed` zero bytes.
    zeros: Box<[u8]>,
}

fn desc(name: String, c_type: &'static str, offset: usize, size: usize, signed: bool) -> FieldDesc {
    let kind = if c_type.starts_with("__data_loc") {
        FieldKind::DynString
    } else {
        FieldKind::Int
    };
    FieldDesc {
        name: Cow::Owned(name),
        c_type: Cow::Borrowed(c_type),
        offset,
        size,
        signed,
        kind,
    }
}

pub const LEVEL_OFFSET: usize = COMMON_SIZE;
pub const SPAN_ID_OFFSET: usize = 16;

impl Layout {
    /// The layout of a callsite with these field names; `span` adds `span_id`.
    pub fn new<'a>(names: impl Iterator<Item = &'a str>, span: bool) -> Layout {
        let names: Vec<&str> = names.collect();
        let mut fields = vec![desc("level".into(), "int", LEVEL_OFFSET, 4, true)];
        let mut end = LEVEL_OFFSET + 4;
        let mut message = None;
        if let Some(at) = names.iter().position(|n| *n == "message") {
            fields.push(desc("message".into(), "__data_loc char[]", end, 4, false));
            message = Some((at, end));
            end += 4;
        }
        if span {
            end = align_up(end, 8);
            debug_assert_eq!(end, SPAN_ID_OFFSET);
            fields.push(desc("span_id".into(), "u64", end, 8, false));
            end += 8;
        }
        let mut slots = vec![Slot::default(); names.len()];
        let mut nums = vec![0; names.len()];
        for (i, name) in names.iter().enumerate() {
            if message.is_some_and(|(at, _)| at == i) {
                continue;
            }
            end = align_up(end, 8);
            fields.push(desc(crate::names::sanitize(name), "s64", end, 8, true));
            nums[i] = end;
            end += 8;
        }
        for (i, name) in names.iter().enumerate() {
            match message {
                Some((at, loc)) if at == i => {
                    slots[i] = Slot {
                        num: 0,
                        loc: loc as u16,
                    }
                }
                _ => {
                    fields.push(desc(
                        format!("{}_str", crate::names::sanitize(name)),
                        "__data_loc char[]",
                        end,
                        4,
                        false,
                    ));
                    slots[i] = Slot {
                        num: nums[i] as u16,
                        loc: end as u16,
                    };
                    end += 4;
                }
            }
        }
        let mut text = String::new();
        let mut args = String::new();
        for f in &fields {
            if !text.is_empty() {
                text.push(' ');
            }
            let conv = match (f.kind, f.c_type.as_ref()) {
                (FieldKind::DynString, _) => "%s",
                (_, "u64") => "%llu",
                (_, "int") => "%d",
                _ => "%lld",
            };
            let _ = write!(text, "{}={conv}", f.name);
            let _ = write!(args, ", {}", f.print_arg());
        }
        // Slots hold 16-bit offsets: a `tracing` callsite has at most 32 fields, 12 bytes
        // each here, so the fixed part stays far below 64 KiB (and below a page).
        assert!(end < MAX_RECORD, "{} fields", names.len());
        Layout {
            slots: slots.into_boxed_slice(),
            fields,
            zeros: vec![0; end].into_boxed_slice(),
            fixed: end,
            print_fmt: format!("\"{text}\"{args}"),
        }
    }

    /// Starts a record of this layout in `buf`: header space, the fixed part zeroed (every
    /// string "no bytes"), the level.
    pub fn begin(&self, buf: &mut Vec<u8>, level: &Level) {
        buf.clear();
        // Copied from a zeroed template: `resize` zero-filled byte by byte here.
        buf.extend_from_slice(&self.zeros);
        buf[LEVEL_OFFSET..LEVEL_OFFSET + 4].copy_from_slice(&level_number(level).to_ne_bytes());
    }
}

/// Where [`Fill`] writes: the record so far, and room to append text after it.
pub trait Buf {
    /// The record so far, header space included.
    fn bytes(&mut self) -> &mut [u8];
    /// Appends `bytes` after the record, as many as fit below [`MAX_RECORD`].
    fn append(&mut self, bytes: &[u8]);
    /// The record's length so far.
    fn len(&self) -> usize;
    /// Whether nothing is built yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Buf for Vec<u8> {
    #[inline(always)]
    fn bytes(&mut self) -> &mut [u8] {
        self
    }
    #[inline(always)]
    fn append(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(MAX_RECORD.saturating_sub(Vec::len(self)));
        self.extend_from_slice(&bytes[..n]);
    }
    #[inline(always)]
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// How many bytes [`StackRecord::begin`] zeroes with fixed-size stores, whatever the layout:
/// the fixed part of a callsite with up to three fields fits, and the stores need no call.
const ZEROED_HEAD: usize = 64;
const _: () = assert!(ZEROED_HEAD <= MAX_RECORD);

/// A record built in the caller's frame. Nothing to look up (no thread-local, no borrow
/// flag), no allocation, and a `Debug` impl that emits an event while its value is being
/// formatted builds that record in a frame of its own. Only the bytes written are touched:
/// the fixed part when the record begins, then each text as it is appended.
pub struct StackRecord {
    /// `bytes[..len]` are initialized.
    len: usize,
    bytes: [MaybeUninit<u8>; MAX_RECORD],
}

impl StackRecord {
    /// Room for a record; [`StackRecord::begin`] starts it.
    #[inline(always)]
    pub fn new() -> StackRecord {
        StackRecord {
            len: 0,
            bytes: [MaybeUninit::uninit(); MAX_RECORD],
        }
    }

    /// Starts a record of `layout`: header space, the fixed part zeroed (every number 0,
    /// every string "no bytes"), the level.
    #[inline(always)]
    pub fn begin(&mut self, layout: &Layout, level: &Level) {
        let fixed = layout.fixed;
        let at = self.bytes.as_mut_ptr().cast::<u8>();
        // SAFETY: `ZEROED_HEAD <= MAX_RECORD`, and `fixed < MAX_RECORD` (`Layout::new`
        // asserts it), so both writes stay inside `bytes`; `u8` has no alignment.
        unsafe {
            at.cast::<[u8; ZEROED_HEAD]>().write([0; ZEROED_HEAD]);
            if fixed > ZEROED_HEAD {
                at.add(ZEROED_HEAD).write_bytes(0, fixed - ZEROED_HEAD);
            }
        }
        self.len = fixed;
        let level = level_number(level).to_ne_bytes();
        // SAFETY: the level lies in the zeroed head (`LEVEL_OFFSET + 4 <= ZEROED_HEAD`).
        unsafe { at.add(LEVEL_OFFSET).cast::<[u8; 4]>().write(level) };
    }

    /// The record as built.
    #[inline(always)]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `bytes[..len]` are initialized.
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<u8>(), self.len) }
    }
}

impl Default for StackRecord {
    fn default() -> Self {
        StackRecord::new()
    }
}

const _: () = assert!(LEVEL_OFFSET + 4 <= ZEROED_HEAD);

impl Buf for StackRecord {
    #[inline(always)]
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `bytes[..len]` are initialized, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.bytes.as_mut_ptr().cast::<u8>(), self.len) }
    }
    #[inline(always)]
    fn append(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(MAX_RECORD - self.len);
        // SAFETY: `len + n <= MAX_RECORD`, so the copy stays inside `bytes`, and a caller's
        // slice cannot overlap our own storage while we hold `&mut self`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.bytes.as_mut_ptr().add(self.len).cast::<u8>(),
                n,
            );
        }
        self.len += n;
    }
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }
}

pub fn level_number(level: &Level) -> i32 {
    match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

pub fn level_name(n: u64) -> &'static str {
    match n {
        1 => "ERROR",
        2 => "WARN",
        3 => "INFO",
        4 => "DEBUG",
        5 => "TRACE",
        _ => "?",
    }
}

/// Appends text to the record's dynamic part, stopping at [`MAX_RECORD`].
struct Text<'a, B: Buf + ?Sized> {
    buf: &'a mut B,
}

impl<B: Buf + ?Sized> std::fmt::Write for Text<'_, B> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        // One byte stays free for the NUL.
        let room = (MAX_RECORD - 1).saturating_sub(self.buf.len());
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf.append(&s.as_bytes()[..n]);
        Ok(())
    }
}

/// Writes recorded values into a record being built.
pub struct Fill<'a, B: Buf + ?Sized> {
    pub layout: &'a Layout,
    pub buf: &'a mut B,
}

impl<B: Buf + ?Sized> Fill<'_, B> {
    #[inline(always)]
    fn num(&mut self, field: &Field, value: u64) {
        let Some(slot) = self.layout.slots.get(field.index()) else {
            return;
        };
        let at = usize::from(slot.num);
        if at == 0 {
            return;
        }
        if let Some(dst) = self.buf.bytes().get_mut(at..at + 8) {
            dst.copy_from_slice(&value.to_ne_bytes());
        }
    }

    fn text(&mut self, field: &Field, write: impl FnOnce(&mut Text<'_, B>)) {
        let Some(slot) = self.layout.slots.get(field.index()) else {
            return;
        };
        let loc = usize::from(slot.loc);
        let start = self.buf.len();
        if loc == 0 || start >= MAX_RECORD {
            return;
        }
        write(&mut Text { buf: self.buf });
        self.buf.append(&[0]);
        let len = self.buf.len() - start;
        let word = ((len as u32) << 16) | (start as u32 & 0xffff);
        if let Some(dst) = self.buf.bytes().get_mut(loc..loc + 4) {
            dst.copy_from_slice(&word.to_ne_bytes());
        }
    }
}

impl<B: Buf + ?Sized> Visit for Fill<'_, B> {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.num(field, value as u64);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.num(field, value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.num(field, u64::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.num(field, value as i64 as u64);
        self.text(field, |t| {
            let _ = write!(t, "{value}");
        });
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.num(field, value as u64);
        self.text(field, |t| {
            let _ = write!(t, "{value}");
        });
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.num(field, value as u64);
        self.text(field, |t| {
            let _ = write!(t, "{value}");
        });
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, |t| {
            let _ = t.write_str(value);
        });
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.text(field, |t| {
            let _ = write!(t, "{value}");
        });
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.text(field, |t| {
            let _ = write!(t, "{value:?}");
        });
    }
}

/// The line text of a record: `LEVEL message name=value …`, each field shown as its text
/// when it has some, else as its number.
pub fn render(fields: &[FieldDesc], record: &[u8], out: &mut String) -> bool {
    let level = read_int(record, LEVEL_OFFSET, 4, true);
    out.push_str(level_name(level));
    for f in &fields[1..] {
        match f.kind {
            FieldKind::DynString if f.name == "message" => {
                if let Some(text) = ustrace::event::field::data_loc_bytes(record, f.offset) {
                    out.push(' ');
                    out.push_str(&String::from_utf8_lossy(
                        text.strip_suffix(b"\0").unwrap_or(text),
                    ));
                }
            }
            FieldKind::DynString => {}
            _ => {
                let name = f.name.as_ref();
                let text = fields
                    .iter()
                    .find(|s| s.name.strip_suffix("_str") == Some(name))
                    .and_then(|s| ustrace::event::field::data_loc_bytes(record, s.offset))
                    .filter(|t| !t.is_empty());
                let _ = write!(out, " {name}=");
                match text {
                    Some(t) => {
                        out.push_str(&String::from_utf8_lossy(t.strip_suffix(b"\0").unwrap_or(t)))
                    }
                    None if f.signed => {
                        let _ = write!(out, "{}", read_int(record, f.offset, 8, true) as i64);
                    }
                    None => {
                        let _ = write!(out, "{}", read_int(record, f.offset, 8, false));
                    }
                }
            }
        }
    }
    true
}
