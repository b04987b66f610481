//! An event's `format` file, parsed: the layout a record of that event has in a page.
//!
//! trace.dat stores every event format as the text tracefs gave (`events/SYS/EVENT/format`);
//! the reader parses them here once and decodes each record's fields with the result. The
//! parser accepts what the kernel and ustrace write (`field:TYPE NAME[DIM];\toffset:N;...`)
//! and rejects anything else with an error naming the line, because the files come from
//! untrusted trace.dat files.

use std::io;

/// What a field holds, from its C type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// An integer of the field's size and signedness.
    Int,
    /// A fixed array of `len` integers of `elem_size` bytes (`u32 ids[4]`).
    IntArray {
        /// Bytes per element.
        elem_size: usize,
        /// Number of elements.
        len: usize,
    },
    /// A fixed NUL-padded string (`char comm[16]`).
    CharArray,
    /// A `__data_loc char[]` string.
    DynString,
    /// Any other `__data_loc` array (bytes).
    DynArray,
    /// A `__rel_loc` array: offset relative to the end of the field.
    RelString,
    /// A string running to the end of the record (`char buf[]`).
    TailString,
    /// A pointer to a string elsewhere (`const char *`): only its address is recorded.
    Pointer,
}

/// One `field:` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The field's name.
    pub name: String,
    /// The C type with the array dimensions, as ustrace spells it: `u64`, `char[16]`,
    /// `__data_loc char[]`.
    pub c_type: String,
    /// Byte offset in the record (common header included).
    pub offset: usize,
    /// Size in bytes (4 for `__data_loc`).
    pub size: usize,
    /// `signed:1`.
    pub signed: bool,
    /// What it holds.
    pub ty: FieldType,
}

/// A parsed `format` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventFormat {
    /// The subsystem (not in the file: the directory it came from).
    pub system: String,
    /// `name:`.
    pub name: String,
    /// `ID:`.
    pub id: u16,
    /// The `common_*` fields.
    pub common: Vec<Field>,
    /// The event's own fields, in file order.
    pub fields: Vec<Field>,
    /// The text after `print fmt: `.
    pub print_fmt: String,
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

impl EventFormat {
    /// Parses the text of a `format` file of subsystem `system`.
    pub fn parse(system: &str, text: &str) -> io::Result<EventFormat> {
        let mut name = None;
        let mut id = None;
        let mut common = Vec::new();
        let mut fields = Vec::new();
        let mut print_fmt = String::new();
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            if let Some(v) = t.strip_prefix("name:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = t.strip_prefix("ID:") {
                id = Some(
                    v.trim()
                        .parse::<u16>()
                        .map_err(|_| bad(format!("format line {}: bad ID {v:?}", n + 1)))?,
                );
            } else if let Some(v) = t.strip_prefix("field:") {
                let field = parse_field(v)
                    .ok_or_else(|| bad(format!("format line {}: bad field {t:?}", n + 1)))?;
                if field.name.starts_with("common_") {
                    common.push(field);
                } else {
                    fields.push(field);
                }
            } else if let Some(v) = t.strip_prefix("print fmt:") {
                print_fmt = v.trim().to_string();
            }
        }
        let name = name.ok_or_else(|| bad(format!("format of {system}: no name: line")))?;
        let id = id.ok_or_else(|| bad(format!("format of {system}:{name}: no ID: line")))?;
        Ok(EventFormat {
            system: system.to_string(),
            name,
            id,
            common,
            fields,
            print_fmt,
        })
    }

    /// A common field by name (`common_pid`, ...).
    pub fn common_field(&self, name: &str) -> Option<&Field> {
        self.common.iter().find(|f| f.name == name)
    }
}

/// `TYPE NAME[DIM];\toffset:N;\tsize:N;\tsigned:N;` (after `field:`).
fn parse_field(text: &str) -> Option<Field> {
    let mut parts = text.split(';').map(str::trim);
    let decl = parts.next()?;
    let mut offset = None;
    let mut size = None;
    let mut signed = false;
    for part in parts {
        if let Some(v) = part.strip_prefix("offset:") {
            offset = v.trim().parse::<usize>().ok();
        } else if let Some(v) = part.strip_prefix("size:") {
            size = v.trim().parse::<usize>().ok();
        } else if let Some(v) = part.strip_prefix("signed:") {
            signed = v.trim() == "1";
        }
    }
    let (offset, size) = (offset?, size?);
    // Bound what an untrusted file may claim: a record lives in one page.
    if offset > 1 << 20 || size > 1 << 20 {
        return None;
    }
    // The name is the last identifier of the declaration, before any trailing `[DIM]`
    // (`u32 ids[4]`); a `__data_loc char[] name` has its brackets before the name.
    let decl = decl.trim();
    let (head, dims) = if decl.ends_with(']') {
        match decl.find('[') {
            Some(b) if !decl[..b].contains("__data_loc") && !decl[..b].contains("__rel_loc") => {
                (&decl[..b], &decl[b..])
            }
            _ => (decl, ""),
        }
    } else {
        (decl, "")
    };
    let head = head.trim_end();
    // The byte after the last character that cannot be in a name (which may be any
    // character of an untrusted file, multi-byte included).
    let start = head
        .char_indices()
        .rev()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
        .map(|(i, c)| i + c.len_utf8())?;
    let name = &head[start..];
    if name.is_empty() {
        return None;
    }
    let base = head[..start].trim();
    if base.is_empty() {
        return None;
    }
    let c_type = format!("{base}{dims}");
    let ty = classify(base, dims, size);
    Some(Field {
        name: name.to_string(),
        c_type,
        offset,
        size,
        signed,
        ty,
    })
}

fn classify(base: &str, dims: &str, size: usize) -> FieldType {
    let is_char = matches!(
        base,
        "char" | "signed char" | "unsigned char" | "const char" | "u8" | "s8"
    );
    if base.starts_with("__data_loc") {
        if base.contains("char") {
            return FieldType::DynString;
        }
        return FieldType::DynArray;
    }
    if base.starts_with("__rel_loc") {
        return FieldType::RelString;
    }
    if base.ends_with('*') {
        return FieldType::Pointer;
    }
    if dims.is_empty() {
        return FieldType::Int;
    }
    let len: Option<usize> = dims
        .trim_start_matches('[')
        .split(']')
        .next()
        .and_then(|d| d.trim().parse().ok());
    match len {
        None | Some(0) if is_char => FieldType::TailString,
        None | Some(0) => FieldType::DynArray,
        Some(_) if base == "char" || base == "const char" => FieldType::CharArray,
        Some(n) => FieldType::IntArray {
            elem_size: (size / n).max(1),
            len: n,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRINT: &str = "name: print\nID: 5\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:0;\n\
\tfield:__data_loc char[] msg;\toffset:16;\tsize:4;\tsigned:0;\n\
\tfield:u32 ids[4];\toffset:20;\tsize:16;\tsigned:0;\n\
\tfield:char comm[16];\toffset:36;\tsize:16;\tsigned:0;\n\n\
print fmt: \"%ps: %s\", (void *)REC->ip, REC->buf\n";

    #[test]
    fn parses_the_kernel_print_format() {
        let f = EventFormat::parse("ftrace", PRINT).unwrap();
        assert_eq!((f.name.as_str(), f.id), ("print", 5));
        assert_eq!(f.common.len(), 4);
        let kinds: Vec<_> = f.fields.iter().map(|f| (f.name.as_str(), f.ty)).collect();
        assert_eq!(
            kinds,
            [
                ("ip", FieldType::Int),
                ("buf", FieldType::TailString),
                ("msg", FieldType::DynString),
                (
                    "ids",
                    FieldType::IntArray {
                        elem_size: 4,
                        len: 4
                    }
                ),
                ("comm", FieldType::CharArray),
            ]
        );
        assert_eq!(f.fields[3].c_type, "u32[4]");
        assert_eq!(f.print_fmt, "\"%ps: %s\", (void *)REC->ip, REC->buf");
    }

    #[test]
    fn a_multibyte_character_before_the_name_is_no_panic() {
        let f = parse_field("unsigned short\u{fffd}common_type;\toffset:0;\tsize:2;\tsigned:0;")
            .unwrap();
        assert_eq!(f.name, "common_type");
        assert!(parse_field("\u{fffd};\toffset:0;\tsize:2;").is_none());
    }

    #[test]
    fn rejects_a_field_without_offset() {
        let text = "name: x\nID: 1\n\tfield:int a;\tsize:4;\tsigned:1;\n";
        let err = EventFormat::parse("s", text).unwrap_err();
        assert!(err.to_string().contains("line 3"), "{err}");
    }
}
