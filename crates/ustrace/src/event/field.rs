//! How a Rust value becomes bytes of an event record, and how the record's layout is told.
//!
//! A record is laid out as the kernel lays out `struct trace_event_raw_NAME`:
//!
//! ```text
//!  0        2       3            4          8
//!  ┌────────┬───────┬────────────┬──────────┬─────────────────────┬──────────────────────┐
//!  │ type   │ flags │ preempt    │ pid      │ fields, each at its │ dynamic data: the    │
//!  │ u16    │ u8    │ count u8   │ i32      │ natural alignment   │ bytes of __data_loc  │
//!  └────────┴───────┴────────────┴──────────┴─────────────────────┴──────────────────────┘
//!    common_* fields (every event)            fixed part            strings, byte slices
//! ```
//!
//! A `__data_loc` field is a `u32` whose low half is the offset of its bytes within the
//! record and whose high half their length (a string's length counts its NUL), so that
//! `format` readers (libtraceevent, `trace-cmd`) find them as they find the kernel's.
//!
//! [`FieldValue`] is implemented by every type an event field may have. Offsets follow one
//! rule, [`align_up`] field after field, used both by the record writer the macro generates
//! (where it folds to constants) and by [`Layout`], which describes the same layout to the
//! `format` file and to filters.

use std::borrow::Cow;

/// Size of the common header every record starts with.
pub const COMMON_SIZE: usize = 8;

/// Rounds `offset` up to a multiple of `align` (a power of two).
#[inline(always)]
pub const fn align_up(offset: usize, align: usize) -> usize {
    (offset + align - 1) & !(align - 1)
}

/// What kind of data a field holds, as filters and printers need to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    /// An integer (or bool) of the field's size and signedness.
    Int,
    /// A fixed array of `len` integers of `elem_size` bytes.
    IntArray {
        /// Bytes per element.
        elem_size: usize,
        /// Number of elements.
        len: usize,
    },
    /// A fixed, NUL-padded string (`char name[N]`).
    CharArray,
    /// A `__data_loc char[]` string.
    DynString,
    /// A `__data_loc` array of bytes.
    DynBytes,
    /// A string running to the end of the record (`char buf[]`, as `ftrace:print` has).
    TailString,
    /// A pointer to a NUL-terminated string in the process (`const char *`).
    StringPtr,
}

/// One field as the `format` file, filters and printers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDesc {
    /// The field's name, as filters and print formats use it.
    pub name: Cow<'static, str>,
    /// The C type as filters expect it: `"u64"`, `"char[16]"`, `"__data_loc char[]"`.
    pub c_type: Cow<'static, str>,
    /// Byte offset from the start of the record (common header included).
    pub offset: usize,
    /// Size in bytes of the fixed part (4 for a `__data_loc` field).
    pub size: usize,
    /// Whether an integer field is signed (`signed:1` in the `format` file).
    pub signed: bool,
    /// What the field holds.
    pub kind: FieldKind,
}

impl FieldDesc {
    /// The `field:` line of a `format` file, e.g.
    /// `\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;`.
    pub fn format_line(&self) -> String {
        let (base, dims) = match (self.c_type.starts_with("__data_loc"), self.c_type.find('[')) {
            (false, Some(bracket)) => (&self.c_type[..bracket], &self.c_type[bracket..]),
            _ => (&self.c_type[..], ""),
        };
        format!(
            "\tfield:{base} {}{dims};\toffset:{};\tsize:{};\tsigned:{};",
            self.name,
            self.offset,
            self.size,
            u8::from(self.signed)
        )
    }

    /// The expression a `print fmt:` uses for this field's value.
    pub fn print_arg(&self) -> String {
        match self.kind {
            FieldKind::DynString => format!("__get_str({})", self.name),
            FieldKind::DynBytes => format!(
                "__print_hex(__get_dynamic_array({0}), __get_dynamic_array_len({0}))",
                self.name
            ),
            FieldKind::IntArray { elem_size, len } => {
                format!("__print_array(REC->{}, {len}, {elem_size})", self.name)
            }
            _ => format!("REC->{}", self.name),
        }
    }
}

/// A type an event field can have.
///
/// Implementations store `SIZE` bytes in the fixed part of the record and, for dynamic
/// fields, `dyn_len()` more bytes in the dynamic part.
pub trait FieldValue {
    /// The C type the `format` file shows (`"u64"`, `"__data_loc char[]"`).
    const C_TYPE: &'static str;
    /// Bytes in the fixed part of the record.
    const SIZE: usize;
    /// Alignment of the fixed part; the field's offset is the previous end rounded up to it.
    const ALIGN: usize;
    /// Whether the value is a signed integer.
    const SIGNED: bool;
    /// What filters and printers see.
    const KIND: FieldKind;

    /// Bytes this value needs in the dynamic part.
    #[inline(always)]
    fn dyn_len(&self) -> usize {
        0
    }

    /// Writes the fixed part into `fixed` (exactly `SIZE` bytes) and the dynamic part into
    /// `dynamic` (exactly `dyn_len()` bytes), which starts at `dyn_offset` in the record.
    fn write(&self, fixed: &mut [u8], dynamic: &mut [u8], dyn_offset: usize);
}

macro_rules! int_field {
    ($($t:ty => $c:literal, $signed:literal;)*) => {$(
        impl FieldValue for $t {
            const C_TYPE: &'static str = $c;
            const SIZE: usize = std::mem::size_of::<$t>();
            const ALIGN: usize = std::mem::align_of::<$t>();
            const SIGNED: bool = $signed;
            const KIND: FieldKind = FieldKind::Int;
            #[inline(always)]
            fn write(&self, fixed: &mut [u8], _dynamic: &mut [u8], _dyn_offset: usize) {
                fixed.copy_from_slice(&self.to_ne_bytes());
            }
        }
    )*};
}

int_field! {
    u8 => "u8", false;
    u16 => "u16", false;
    u32 => "u32", false;
    u64 => "u64", false;
    i8 => "s8", true;
    i16 => "s16", true;
    i32 => "s32", true;
    i64 => "s64", true;
    usize => "unsigned long", false;
    isize => "long", true;
}

impl FieldValue for bool {
    const C_TYPE: &'static str = "bool";
    const SIZE: usize = 1;
    const ALIGN: usize = 1;
    const SIGNED: bool = false;
    const KIND: FieldKind = FieldKind::Int;
    #[inline(always)]
    fn write(&self, fixed: &mut [u8], _dynamic: &mut [u8], _dyn_offset: usize) {
        fixed[0] = u8::from(*self);
    }
}

/// Integer arrays: `u32 name[4]`.
impl<T: FieldValue + Copy, const N: usize> FieldValue for [T; N] {
    const C_TYPE: &'static str = T::C_TYPE; // completed with `[N]` by `Layout`
    const SIZE: usize = T::SIZE * N;
    const ALIGN: usize = T::ALIGN;
    const SIGNED: bool = T::SIGNED;
    const KIND: FieldKind = FieldKind::IntArray {
        elem_size: T::SIZE,
        len: N,
    };
    #[inline(always)]
    fn write(&self, fixed: &mut [u8], dynamic: &mut [u8], dyn_offset: usize) {
        for (value, slot) in self.iter().zip(fixed.chunks_exact_mut(T::SIZE)) {
            value.write(slot, dynamic, dyn_offset);
        }
    }
}

/// A fixed-size, NUL-padded string field (`char name[N]`), like the kernel's `comm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedStr<const N: usize>(pub [u8; N]);

impl<const N: usize> FixedStr<N> {
    /// Copies at most `N - 1` bytes of `s`, so that the field is always NUL-terminated.
    pub fn new(s: &str) -> Self {
        let mut bytes = [0u8; N];
        let n = s.len().min(N.saturating_sub(1));
        bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
        FixedStr(bytes)
    }
}

impl<const N: usize> FieldValue for FixedStr<N> {
    const C_TYPE: &'static str = "char";
    const SIZE: usize = N;
    const ALIGN: usize = 1;
    const SIGNED: bool = false;
    const KIND: FieldKind = FieldKind::CharArray;
    #[inline(always)]
    fn write(&self, fixed: &mut [u8], _dynamic: &mut [u8], _dyn_offset: usize) {
        fixed.copy_from_slice(&self.0);
    }
}

#[inline(always)]
fn data_loc(fixed: &mut [u8], dyn_offset: usize, len: usize) {
    let loc = ((len as u32) << 16) | (dyn_offset as u32 & 0xffff);
    fixed.copy_from_slice(&loc.to_ne_bytes());
}

/// Strings are stored as `__data_loc char[]`: their bytes and a NUL.
impl FieldValue for &str {
    const C_TYPE: &'static str = "__data_loc char[]";
    const SIZE: usize = 4;
    const ALIGN: usize = 4;
    const SIGNED: bool = false;
    const KIND: FieldKind = FieldKind::DynString;
    #[inline(always)]
    fn dyn_len(&self) -> usize {
        self.len() + 1
    }
    #[inline(always)]
    fn write(&self, fixed: &mut [u8], dynamic: &mut [u8], dyn_offset: usize) {
        let (text, nul) = dynamic.split_at_mut(self.len());
        text.copy_from_slice(self.as_bytes());
        nul[0] = 0;
        data_loc(fixed, dyn_offset, self.len() + 1);
    }
}

/// Byte slices are stored as `__data_loc u8[]`.
impl FieldValue for &[u8] {
    const C_TYPE: &'static str = "__data_loc u8[]";
    const SIZE: usize = 4;
    const ALIGN: usize = 4;
    const SIGNED: bool = false;
    const KIND: FieldKind = FieldKind::DynBytes;
    #[inline(always)]
    fn dyn_len(&self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn write(&self, fixed: &mut [u8], dynamic: &mut [u8], dyn_offset: usize) {
        dynamic.copy_from_slice(self);
        data_loc(fixed, dyn_offset, self.len());
    }
}

/// A pointer to a C string in this process, for `.ustring` filters and fetch arguments.
impl FieldValue for *const std::ffi::c_char {
    const C_TYPE: &'static str = "const char *";
    const SIZE: usize = 8;
    const ALIGN: usize = 8;
    const SIGNED: bool = false;
    const KIND: FieldKind = FieldKind::StringPtr;
    #[inline(always)]
    fn write(&self, fixed: &mut [u8], _dynamic: &mut [u8], _dyn_offset: usize) {
        fixed.copy_from_slice(&(*self as usize as u64).to_ne_bytes());
    }
}

/// Builds the description of a record layout, field by field, by the same rule the record
/// writer follows.
#[derive(Default)]
pub struct Layout {
    fields: Vec<FieldDesc>,
    end: usize,
}

impl Layout {
    /// An empty layout: the next field starts after the common header.
    pub fn new() -> Self {
        Layout {
            fields: Vec::new(),
            end: COMMON_SIZE,
        }
    }

    /// Appends a field of type `T`.
    pub fn push<T: FieldValue + ?Sized>(&mut self, name: &'static str) -> &mut Self {
        let offset = align_up(self.end, T::ALIGN);
        let c_type: Cow<'static, str> = match T::KIND {
            FieldKind::IntArray { len, .. } => format!("{}[{len}]", T::C_TYPE).into(),
            FieldKind::CharArray => format!("char[{}]", T::SIZE).into(),
            _ => T::C_TYPE.into(),
        };
        self.fields.push(FieldDesc {
            name: name.into(),
            c_type,
            offset,
            size: T::SIZE,
            signed: T::SIGNED,
            kind: T::KIND,
        });
        self.end = offset + T::SIZE;
        self
    }

    /// Appends an already described field at the next suitable offset (dynamic events).
    pub fn push_desc(&mut self, mut field: FieldDesc, align: usize) -> &mut Self {
        field.offset = align_up(self.end, align);
        self.end = field.offset + field.size;
        self.fields.push(field);
        self
    }

    /// The size of the fixed part, common header included.
    pub fn fixed_size(&self) -> usize {
        self.end
    }

    /// The fields pushed, with their offsets.
    pub fn finish(self) -> Vec<FieldDesc> {
        self.fields
    }
}

/// Writes the common header: the event id (`common_type`), zero flags and preempt count
/// (user space has neither), and the thread id (`common_pid`).
#[inline(always)]
pub fn write_common_header(record: &mut [u8], id: u16, pid: i32) {
    record[..8].copy_from_slice(&common_header(id, pid));
}

/// The common header's eight bytes (see [`write_common_header`]): one value, so that a
/// record path can make it before reserving and keep one register, not two, until it
/// stores it.
#[inline(always)]
pub fn common_header(id: u16, pid: i32) -> [u8; 8] {
    let mut header = [0u8; 8];
    header[0..2].copy_from_slice(&id.to_ne_bytes());
    header[4..8].copy_from_slice(&pid.to_ne_bytes());
    header
}

/// The four fields every record starts with.
pub fn common_fields() -> Vec<FieldDesc> {
    let f = |name: &'static str, c_type: &'static str, offset, size, signed| FieldDesc {
        name: name.into(),
        c_type: c_type.into(),
        offset,
        size,
        signed,
        kind: FieldKind::Int,
    };
    vec![
        f("common_type", "unsigned short", 0, 2, false),
        f("common_flags", "unsigned char", 2, 1, false),
        f("common_preempt_count", "unsigned char", 3, 1, false),
        f("common_pid", "int", 4, 4, true),
    ]
}

/// Reads an integer field of a record as the kernel's printers do: sign-extended when
/// signed. Returns 0 when the record is too short (it never is for a record we wrote).
pub fn read_int(record: &[u8], offset: usize, size: usize, signed: bool) -> u64 {
    let Some(bytes) = record.get(offset..offset + size) else {
        return 0;
    };
    let mut buf = [0u8; 8];
    buf[..size.min(8)].copy_from_slice(&bytes[..size.min(8)]);
    let raw = u64::from_ne_bytes(buf);
    if signed && size < 8 {
        let shift = 64 - 8 * size as u32;
        (((raw << shift) as i64) >> shift) as u64
    } else {
        raw
    }
}

/// The bytes a `__data_loc` field points at, if they lie inside the record.
pub fn data_loc_bytes(record: &[u8], field_offset: usize) -> Option<&[u8]> {
    let loc = read_int(record, field_offset, 4, false) as u32;
    let (offset, len) = ((loc & 0xffff) as usize, (loc >> 16) as usize);
    record.get(offset..offset + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_aligns_fields_like_a_c_struct() {
        let mut layout = Layout::new();
        layout
            .push::<u8>("a")
            .push::<u64>("b")
            .push::<&str>("s")
            .push::<[usize; 6]>("args");
        layout.push::<FixedStr<16>>("comm");
        let fields = layout.finish();
        let offsets: Vec<_> = fields
            .iter()
            .map(|f| (f.name.as_ref(), f.offset, f.size))
            .collect();
        assert_eq!(
            offsets,
            [
                ("a", 8, 1),
                ("b", 16, 8),
                ("s", 24, 4),
                ("args", 32, 48),
                ("comm", 80, 16)
            ]
        );
        assert_eq!(
            fields[3].format_line(),
            "\tfield:unsigned long args[6];\toffset:32;\tsize:48;\tsigned:0;"
        );
        assert_eq!(
            fields[4].format_line(),
            "\tfield:char comm[16];\toffset:80;\tsize:16;\tsigned:0;"
        );
        assert_eq!(
            fields[2].format_line(),
            "\tfield:__data_loc char[] s;\toffset:24;\tsize:4;\tsigned:0;"
        );
    }

    #[test]
    fn data_loc_round_trips() {
        let mut record = vec![0u8; 16];
        let s = "hey";
        let (fixed, dynamic) = record.split_at_mut(12);
        s.write(&mut fixed[8..12], &mut dynamic[..s.dyn_len()], 12);
        assert_eq!(data_loc_bytes(&record, 8), Some(&b"hey\0"[..]));
    }

    #[test]
    fn signed_fields_sign_extend() {
        let record = [0u8, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff];
        assert_eq!(read_int(&record, 4, 4, true) as i64, -2);
        assert_eq!(read_int(&record, 4, 4, false), 0xffff_fffe);
    }
}
