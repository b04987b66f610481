//! The fetch types (`u8` … `x64`, `char`, `string`, `ustring`, `symbol`,
//! `symstr`, bitfields) with their record size, format-file type and
//! print-format conversion, as the kernel's type table has them.

/// A fetch type: how a fetched value is stored in the record and printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FetchType {
    /// Unsigned decimal (`%u` / `%Lu`), 1, 2, 4 or 8 bytes.
    U(u8),
    /// Signed decimal (`%d` / `%Ld`).
    S(u8),
    /// Hexadecimal (`0x%x` / `0x%Lx`).
    X(u8),
    /// One character (`'%c'`).
    Char,
    /// An address printed as `symbol+off/size` (`%pS`).
    Symbol,
    /// A NUL-terminated string read from memory, stored as `__data_loc`.
    String,
    /// As `String`, but the source is user memory.
    UString,
    /// An address turned into `symbol+0xoff/0xsize` text at record time.
    SymStr,
}

impl FetchType {
    /// Looks a type name up (`u32`, `string`); bitfields map to their container.
    /// `user` is true for uprobes, which have no `symbol`/`symstr`.
    pub fn lookup(name: Option<&str>, user: bool) -> Option<FetchType> {
        let Some(name) = name else {
            return Some(FetchType::X(8));
        };
        if user && (name == "symbol" || name == "symstr") {
            return None;
        }
        if name.starts_with('b') {
            let slash = name.find('/')?;
            return match crate::num::kstrtoul(&name[slash + 1..], 0)? {
                8 => Some(FetchType::U(1)),
                16 => Some(FetchType::U(2)),
                32 => Some(FetchType::U(4)),
                64 => Some(FetchType::U(8)),
                _ => None,
            };
        }
        Some(match name {
            "string" => FetchType::String,
            "ustring" => FetchType::UString,
            "symstr" => FetchType::SymStr,
            "u8" => FetchType::U(1),
            "u16" => FetchType::U(2),
            "u32" => FetchType::U(4),
            "u64" => FetchType::U(8),
            "s8" => FetchType::S(1),
            "s16" => FetchType::S(2),
            "s32" => FetchType::S(4),
            "s64" => FetchType::S(8),
            "x8" => FetchType::X(1),
            "x16" => FetchType::X(2),
            "x32" => FetchType::X(4),
            "x64" => FetchType::X(8),
            "char" => FetchType::Char,
            "symbol" => FetchType::Symbol,
            _ => return None,
        })
    }

    /// Bytes the type takes in the fixed part of a record.
    pub fn size(self) -> usize {
        match self {
            FetchType::U(n) | FetchType::S(n) | FetchType::X(n) => usize::from(n),
            FetchType::Char => 1,
            FetchType::Symbol => 8,
            FetchType::String | FetchType::UString | FetchType::SymStr => 4,
        }
    }

    /// Whether the format file says `signed:1` (the kernel marks strings signed).
    pub fn is_signed(self) -> bool {
        matches!(
            self,
            FetchType::S(_) | FetchType::String | FetchType::UString | FetchType::SymStr
        )
    }

    /// Whether the value is a `__data_loc` string.
    pub fn is_string(self) -> bool {
        matches!(
            self,
            FetchType::String | FetchType::UString | FetchType::SymStr
        )
    }

    /// The type name as written in definitions (`x64`).
    pub fn name(self) -> &'static str {
        match self {
            FetchType::U(1) => "u8",
            FetchType::U(2) => "u16",
            FetchType::U(4) => "u32",
            FetchType::U(_) => "u64",
            FetchType::S(1) => "s8",
            FetchType::S(2) => "s16",
            FetchType::S(4) => "s32",
            FetchType::S(_) => "s64",
            FetchType::X(1) => "x8",
            FetchType::X(2) => "x16",
            FetchType::X(4) => "x32",
            FetchType::X(_) => "x64",
            FetchType::Char => "char",
            FetchType::Symbol => "symbol",
            FetchType::String => "string",
            FetchType::UString => "ustring",
            FetchType::SymStr => "symstr",
        }
    }

    /// The type in the event's `format` file (`u64`, `s32`, `__data_loc char[]`).
    pub fn format_type(self) -> &'static str {
        match self {
            FetchType::U(n) | FetchType::X(n) => match n {
                1 => "u8",
                2 => "u16",
                4 => "u32",
                _ => "u64",
            },
            FetchType::S(n) => match n {
                1 => "s8",
                2 => "s16",
                4 => "s32",
                _ => "s64",
            },
            FetchType::Char => "u8",
            FetchType::Symbol => "u64",
            FetchType::String | FetchType::UString | FetchType::SymStr => "__data_loc char[]",
        }
    }

    /// The conversion in the print format (`%Lu`, `0x%x`, `\"%s\"`).
    pub fn print_conv(self) -> &'static str {
        match self {
            FetchType::U(8) => "%Lu",
            FetchType::U(_) => "%u",
            FetchType::S(8) => "%Ld",
            FetchType::S(_) => "%d",
            FetchType::X(8) => "0x%Lx",
            FetchType::X(_) => "0x%x",
            FetchType::Char => "'%c'",
            FetchType::Symbol => "%pS",
            FetchType::String | FetchType::UString | FetchType::SymStr => "\\\"%s\\\"",
        }
    }
}
