//! Synthetic event definitions: the grammar of the `synthetic_events` file and of `s:`
//! lines in `dynamic_events`, parsed as the kernel parses them (`trace_events_synth.c`).
//!
//! ```text
//!  "wakeup_latency u64 lat; pid_t pid; char comm[16]"   (synthetic_events)
//!  "s:synthetic/wakeup_latency u64 lat; pid_t pid"      (dynamic_events)
//!  "!wakeup_latency"                                     (synthetic_events: remove)
//!        │
//!        ▼  parse_line / parse_dyn_line
//!  SynthCommand::Create(SynthDef { name, fields: [SynthFieldDef] })
//!        │  (the event core registers it as events/synthetic/NAME and
//!        ▼   lays each field out in a u64 slot, strings in 256 bytes)
//! ```
//!
//! This module only decides what a definition means: each field's C type as the `format`
//! file shows it, its size, signedness and kind (integer, fixed string, dynamic string,
//! stack trace), the listing line and the print format. It knows nothing of events; the
//! caller says which names are taken. Errors carry the kernel's message, errno and the
//! caret position its `error_log` shows (the kernel finds the offending word with
//! `strstr` in the command, and so does [`SynthError::pos`]).
//!
//! Kernel facts kept here: fields may be separated by `;` or, in the old form, by blanks
//! alone (`a u64 x u64 y` has two fields); `unsigned` joins the next word; the array part
//! of a name moves to the type (`char name[16]` is type `char[16]`); `char[]` (or `[0]`)
//! is a dynamic string and anything with `long[` a stack trace, both `__data_loc`; a fixed
//! string is at most 256 bytes; integer arrays (`u64 x[4]`, `u64[]`) are not accepted
//! ("Invalid type"); a type is signed unless it starts with `u` or is `gfp_t`.

use std::fmt;

/// At most this many fields in one synthetic event (the kernel's `SYNTH_FIELDS_MAX`).
pub const SYNTH_FIELDS_MAX: usize = 64;

/// Bytes a fixed string occupies in a record, whatever its declared size, and the
/// largest size it may declare (the kernel's `STR_VAR_LEN_MAX`).
pub const STR_VAR_LEN_MAX: usize = 256;

/// Most return addresses a stack-trace field holds (the kernel's `HIST_STACKTRACE_DEPTH`).
pub const STACK_DEPTH: usize = 16;

/// The system every synthetic event lives in.
pub const SYNTH_SYSTEM: &str = "synthetic";

/// What one field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthFieldKind {
    /// An integer of `size` bytes (1, 2, 4 or 8), stored in a u64 slot.
    Int,
    /// A NUL-terminated string in a 256-byte slot (`char name[N]`, `N` the declared size).
    StaticString,
    /// A `__data_loc` string (`char name[]`).
    DynString,
    /// A `__data_loc` array of return addresses (`unsigned long[] name`, `long[] name`).
    Stack,
}

/// One field of a synthetic event, as the kernel records it after parsing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthFieldDef {
    /// The field's name (without any `[N]`).
    pub name: String,
    /// The C type the `format` file shows: `u64`, `unsigned int`, `char[16]`,
    /// `__data_loc char[]`, `__data_loc unsigned long[]`.
    pub c_type: String,
    /// The size the `format` file shows: the integer's size, a fixed string's declared
    /// size, 8 for `__data_loc` fields.
    pub size: usize,
    /// `signed:` in the `format` file: true unless the type starts with `u` or is `gfp_t`.
    pub signed: bool,
    /// What the field holds.
    pub kind: SynthFieldKind,
}

impl SynthFieldDef {
    /// The type as `synthetic_events` lists it (without `__data_loc `).
    pub fn listed_type(&self) -> &str {
        self.c_type
            .strip_prefix("__data_loc ")
            .unwrap_or(&self.c_type)
    }

    /// The printf conversion the kernel uses for this type (`synth_field_fmt`).
    pub fn conversion(&self) -> &'static str {
        match self.kind {
            SynthFieldKind::StaticString | SynthFieldKind::DynString => return "%.*s",
            SynthFieldKind::Stack => return "%s",
            SynthFieldKind::Int => {}
        }
        match self.c_type.as_str() {
            "s64" => "%lld",
            "s32" | "s16" | "s8" | "char" | "int" | "bool" | "pid_t" => "%d",
            "u32" | "u16" | "u8" | "unsigned char" | "unsigned int" => "%u",
            "long" => "%ld",
            "unsigned long" => "%lu",
            "gfp_t" => "%x",
            _ => "%llu",
        }
    }

    /// Bytes the field takes in the fixed part of a record: a u64 slot, or 256 bytes for
    /// a fixed string.
    pub fn slot_size(&self) -> usize {
        match self.kind {
            SynthFieldKind::StaticString => STR_VAR_LEN_MAX,
            _ => 8,
        }
    }

    /// Whether the field holds a string (fixed or dynamic).
    pub fn is_string(&self) -> bool {
        matches!(
            self.kind,
            SynthFieldKind::StaticString | SynthFieldKind::DynString
        )
    }

    /// Whether the field's bytes are in the dynamic part of the record.
    pub fn is_dynamic(&self) -> bool {
        matches!(self.kind, SynthFieldKind::DynString | SynthFieldKind::Stack)
    }
}

/// A parsed synthetic event definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthDef {
    /// The event's name (its directory under `events/synthetic/`).
    pub name: String,
    /// Its fields, in order.
    pub fields: Vec<SynthFieldDef>,
}

impl SynthDef {
    /// The line `synthetic_events` shows (no newline): `name\ttype field; type field`.
    pub fn listing(&self) -> String {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|f| format!("{} {}", f.listed_type(), f.name))
            .collect();
        format!("{}\t{}", self.name, fields.join("; "))
    }

    /// The line `dynamic_events` shows (no newline): `s:synthetic/` and the listing.
    pub fn dyn_listing(&self) -> String {
        format!("s:{SYNTH_SYSTEM}/{}", self.listing())
    }

    /// The `print fmt:` of the event's `format` file, as the kernel builds it.
    pub fn print_fmt(&self) -> String {
        let convs: Vec<String> = self
            .fields
            .iter()
            .map(|f| format!("{}={}", f.name, f.conversion()))
            .collect();
        let mut out = format!("\"{}\"", convs.join(", "));
        for f in &self.fields {
            match f.kind {
                SynthFieldKind::DynString => out.push_str(&format!(", __get_str({})", f.name)),
                SynthFieldKind::Stack => out.push_str(&format!(", __get_stacktrace({})", f.name)),
                _ => out.push_str(&format!(", REC->{}", f.name)),
            }
        }
        out
    }

    /// The text that defines this event again (`synthetic_events` input).
    pub fn command(&self) -> String {
        self.listing().replacen('\t', " ", 1)
    }
}

/// What one line written to `synthetic_events` (or an `s:` line) asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SynthCommand {
    /// Nothing: a blank line.
    Empty,
    /// Define this event.
    Create(SynthDef),
    /// Remove the event of this name (`!name`).
    Delete(String),
}

/// The kernel's synthetic-event error table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthErrorKind {
    /// `Illegal name`.
    BadName,
    /// `Command must be of the form: <name> field[;field] ...`.
    InvalidCmd,
    /// `Command must be of the form: s or -:[synthetic/]<name> field[;field] ...`.
    InvalidDynCmd,
    /// `Event already exists`.
    EventExists,
    /// `Too many fields`.
    TooManyFields,
    /// `Incomplete type`.
    IncompleteType,
    /// `Invalid type`.
    InvalidType,
    /// `Invalid field`.
    InvalidField,
    /// `Invalid array specification`.
    InvalidArraySpec,
}

impl SynthErrorKind {
    /// The message `error_log` shows.
    pub fn message(self) -> &'static str {
        match self {
            SynthErrorKind::BadName => "Illegal name",
            SynthErrorKind::InvalidCmd => "Command must be of the form: <name> field[;field] ...",
            SynthErrorKind::InvalidDynCmd => {
                "Command must be of the form: s or -:[synthetic/]<name> field[;field] ..."
            }
            SynthErrorKind::EventExists => "Event already exists",
            SynthErrorKind::TooManyFields => "Too many fields",
            SynthErrorKind::IncompleteType => "Incomplete type",
            SynthErrorKind::InvalidType => "Invalid type",
            SynthErrorKind::InvalidField => "Invalid field",
            SynthErrorKind::InvalidArraySpec => "Invalid array specification",
        }
    }
}

/// `EINVAL`: the errno of every parse error.
pub const EINVAL: i32 = 22;
/// `EEXIST`: the name is taken.
pub const EEXIST: i32 = 17;

/// A rejected definition: the errno the write fails with and the `error_log` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthError {
    /// What is wrong.
    pub kind: SynthErrorKind,
    /// The errno (`EINVAL`, or `EEXIST` for a taken name).
    pub errno: i32,
    /// The command as the kernel keeps it for `error_log` (leading blanks skipped).
    pub command: String,
    /// Byte of `command` the caret points at.
    pub pos: usize,
}

impl SynthError {
    fn new(kind: SynthErrorKind, command: &str, pos: usize) -> SynthError {
        SynthError {
            kind,
            errno: if kind == SynthErrorKind::EventExists {
                EEXIST
            } else {
                EINVAL
            },
            command: command.to_string(),
            pos,
        }
    }

    /// An error whose caret sits under the first occurrence of `word` in the command, as
    /// the kernel's `err_pos` finds it (0 when absent).
    fn at(kind: SynthErrorKind, command: &str, word: &str) -> SynthError {
        let pos = if word.is_empty() {
            0
        } else {
            command.find(word).unwrap_or(0)
        };
        SynthError::new(kind, command, pos)
    }

    /// The `error_log` entry without its timestamp: location `synthetic_events` (also for
    /// `s:` lines of `dynamic_events`, as on the kernel), message, command, caret.
    pub fn log_text(&self) -> String {
        const PREFIX: &str = "  Command: ";
        format!(
            "synthetic_events: error: {}\n{PREFIX}{}\n{}^\n",
            self.kind.message(),
            self.command,
            " ".repeat(self.pos + PREFIX.len())
        )
    }
}

impl fmt::Display for SynthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (at byte {} of '{}')",
            self.kind.message(),
            self.pos,
            self.command
        )
    }
}

impl std::error::Error for SynthError {}

/// C's `isspace`: what `argv_split` and `skip_spaces` treat as blanks.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

fn skip_spaces(s: &str) -> &str {
    s.trim_start_matches(is_space)
}

fn words(s: &str) -> Vec<&str> {
    s.split(is_space).filter(|w| !w.is_empty()).collect()
}

/// The kernel's `is_good_name`: a letter or `_`, then letters, digits and `_`.
pub fn is_good_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    match bytes.next() {
        Some(c) if c.is_ascii_alphabetic() || c == b'_' => {}
        _ => return false,
    }
    bytes.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The first `;`-separated part must have a name and at least one type and field
/// (`!name` needs nothing more).
fn check_command(command: &str) -> bool {
    let first = command.split(';').next().unwrap_or("");
    first.starts_with('!') || words(first).len() >= 3
}

/// The size of an integer type the kernel knows, by exact name.
fn int_size(ty: &str) -> Option<usize> {
    Some(match ty {
        "s64" | "u64" | "long" | "unsigned long" => 8,
        "s32" | "u32" | "int" | "unsigned int" | "pid_t" | "gfp_t" => 4,
        "s16" | "u16" => 2,
        "s8" | "u8" | "char" | "unsigned char" | "bool" => 1,
        _ => return None,
    })
}

/// `kstrtouint(s, 0)`: an optional `+`, then hex after `0x`, octal after `0`, or
/// decimal, all of the text.
fn parse_c_uint(s: &str) -> Option<u32> {
    let s = s.strip_prefix('+').unwrap_or(s);
    let b = s.as_bytes();
    let (radix, digits) =
        if b.len() > 2 && b[0] == b'0' && (b[1] | 0x20) == b'x' && b[2].is_ascii_hexdigit() {
            (16, &s[2..])
        } else if b.first() == Some(&b'0') {
            (8, s)
        } else {
            (10, s)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

/// A string type's declared size (`synth_field_string_size`): `Some(0)` for `[]`.
fn string_size(ty: &str) -> Option<usize> {
    let start = ty.find("char[")? + "char[".len();
    let end = ty.find(']')?;
    if end < start || end + 1 != ty.len() {
        return None;
    }
    let inside = &ty[start..end];
    if inside.len() > 3 {
        return None;
    }
    if inside.is_empty() {
        return Some(0);
    }
    let size = parse_c_uint(inside)? as usize;
    (size <= STR_VAR_LEN_MAX).then_some(size)
}

/// Whether `ty` (type text, array part included) is one the kernel accepts, as its
/// `synth_event_add_field` checks before the command runs.
pub fn is_valid_type(ty: &str) -> bool {
    if int_size(ty).is_some() {
        return true;
    }
    if ty.contains("char[") {
        return string_size(ty).is_some();
    }
    ty.contains("long[")
}

/// Parses the field starting at `argv[0]`; returns it and how many words it used.
fn parse_field(argv: &[&str], command: &str) -> Result<(SynthFieldDef, usize), SynthError> {
    use SynthErrorKind::*;
    let first = argv[0];
    let (prefix, ty, name, used) = if first == "unsigned" {
        if argv.len() < 3 {
            return Err(SynthError::at(IncompleteType, command, first));
        }
        ("unsigned ", argv[1], Some(argv[2]), 3)
    } else {
        ("", first, argv.get(1).copied(), 2)
    };
    let Some(name) = name else {
        return Err(SynthError::at(InvalidField, command, ty));
    };
    let (bare, array) = match name.find('[') {
        Some(i) => (&name[..i], &name[i..]),
        None => (name, ""),
    };
    if !is_good_name(bare) {
        return Err(SynthError::at(BadName, command, name));
    }
    let mut c_type = format!("{prefix}{ty}{array}");
    let is_string = c_type.contains("char[");
    let is_stack = !is_string && c_type.contains("long[");
    let size = match int_size(&c_type) {
        Some(size) => size,
        None if is_string => match string_size(&c_type) {
            Some(size) => size,
            None if !array.is_empty() => {
                return Err(SynthError::at(InvalidArraySpec, command, name))
            }
            None => return Err(SynthError::at(InvalidType, command, ty)),
        },
        None if is_stack => 0,
        None => return Err(SynthError::at(InvalidType, command, ty)),
    };
    let (size, kind) = if size == 0 {
        c_type = format!("__data_loc {c_type}");
        let kind = if is_string {
            SynthFieldKind::DynString
        } else {
            SynthFieldKind::Stack
        };
        (8, kind)
    } else if is_string {
        (size, SynthFieldKind::StaticString)
    } else {
        (size, SynthFieldKind::Int)
    };
    let signed = !c_type.starts_with('u') && c_type != "gfp_t";
    Ok((
        SynthFieldDef {
            name: bare.to_string(),
            c_type,
            size,
            signed,
            kind,
        },
        used,
    ))
}

/// Parses a definition's name and fields (`__create_synth_event`); `command` is the whole
/// command for error positions and `exists` says whether a name is taken.
pub fn parse_def(
    name: &str,
    fields: &str,
    command: &str,
    exists: &dyn Fn(&str) -> bool,
) -> Result<SynthDef, SynthError> {
    use SynthErrorKind::*;
    if name.is_empty() {
        return Err(SynthError::new(InvalidCmd, command, 0));
    }
    if !is_good_name(name) {
        return Err(SynthError::at(BadName, command, name));
    }
    if exists(name) {
        return Err(SynthError::at(EventExists, command, name));
    }
    let mut out: Vec<SynthFieldDef> = Vec::new();
    for part in fields.split(';') {
        let argv = words(part);
        let mut consumed = 0;
        while consumed < argv.len() {
            let (field, used) = parse_field(&argv[consumed..], command)?;
            consumed += used;
            if out.len() == SYNTH_FIELDS_MAX {
                return Err(SynthError::new(TooManyFields, command, 0));
            }
            out.push(field);
        }
    }
    if out.is_empty() {
        return Err(SynthError::new(InvalidCmd, command, 0));
    }
    Ok(SynthDef {
        name: name.to_string(),
        fields: out,
    })
}

/// Parses one line written to `synthetic_events` (comments already cut off):
/// `name fields`, or `!name` to remove.
pub fn parse_line(line: &str, exists: &dyn Fn(&str) -> bool) -> Result<SynthCommand, SynthError> {
    let command = skip_spaces(line);
    if command.is_empty() {
        return Ok(SynthCommand::Empty);
    }
    if !check_command(command) {
        return Err(SynthError::new(SynthErrorKind::InvalidCmd, command, 0));
    }
    let blank = command.find([' ', '\t']);
    if blank.is_none() && !command.starts_with('!') {
        return Err(SynthError::new(SynthErrorKind::InvalidCmd, command, 0));
    }
    let name = &command[..blank.unwrap_or(command.len())];
    if let Some(target) = name.strip_prefix('!') {
        return Ok(SynthCommand::Delete(target.to_string()));
    }
    let fields = skip_spaces(&command[name.len()..]);
    parse_def(name, fields, command, exists).map(SynthCommand::Create)
}

/// Parses an `s:[synthetic/]name fields` line of `dynamic_events`. `None` when the line
/// is not an `s:` command (another kind of dynamic event).
pub fn parse_dyn_line(
    line: &str,
    exists: &dyn Fn(&str) -> bool,
) -> Option<Result<SynthCommand, SynthError>> {
    use SynthErrorKind::*;
    let command = skip_spaces(line);
    let rest = command.strip_prefix("s:")?;
    let Some(blank) = command.find([' ', '\t']) else {
        return Some(Err(SynthError::new(InvalidCmd, command, 0)));
    };
    let fields = skip_spaces(&command[blank..]);
    // The kernel looks for a group in the whole rest of the line, fields included.
    let mut start = 2;
    if rest.contains('/') {
        let group = format!("{SYNTH_SYSTEM}/");
        if !rest.starts_with(&group) {
            return Some(Err(SynthError::new(InvalidDynCmd, command, 0)));
        }
        start += group.len();
    }
    if !check_command(&command[start..]) {
        return Some(Err(SynthError::new(InvalidCmd, command, 0)));
    }
    let name = command.get(start..blank).unwrap_or("");
    Some(parse_def(name, fields, command, exists).map(SynthCommand::Create))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> bool {
        false
    }

    fn def(line: &str) -> SynthDef {
        match parse_line(line, &none) {
            Ok(SynthCommand::Create(def)) => def,
            other => panic!("{line}: {other:?}"),
        }
    }

    /// The caret position, written as `^` in the command as the selftests write it.
    fn check_error(marked: &str, kind: SynthErrorKind) {
        let pos = marked.find('^').unwrap();
        let line = marked.replacen('^', "", 1);
        let err = parse_line(&line, &none).unwrap_err();
        assert_eq!((err.kind, err.pos), (kind, pos), "{marked}");
        assert_eq!(err.errno, EINVAL);
    }

    #[test]
    fn the_selftests_syntax_errors() {
        use SynthErrorKind::*;
        check_error("myevent ^chr arg", InvalidType);
        check_error("myevent ^unsigned arg", IncompleteType);
        check_error("myevent char ^str]; int v", BadName);
        check_error("^mye-vent char str[]", BadName);
        check_error("myevent char ^st-r[]", BadName);
        check_error("myevent char str;^[]", InvalidField);
        check_error("myevent char str; ^int", InvalidField);
        check_error("myevent char ^str[; int v", InvalidArraySpec);
        check_error("myevent char ^str[kdjdk]", InvalidArraySpec);
        check_error("myevent char ^str[257]", InvalidArraySpec);
        check_error("^mye;vent char str[]", InvalidCmd);
        check_error("^myevent ; char str[]", InvalidCmd);
        check_error("^myevent; char str[]", InvalidCmd);
        check_error("^myevent ;char str[]", InvalidCmd);
        check_error("^; char str[]", InvalidCmd);
        check_error("^;myevent char str[]", InvalidCmd);
        check_error("^myevent", InvalidCmd);
        let err = parse_dyn_line("s:junk/myevent char str[", &none)
            .unwrap()
            .unwrap_err();
        assert_eq!((err.kind, err.pos), (InvalidDynCmd, 0));
        assert_eq!(
            err.log_text(),
            "synthetic_events: error: Command must be of the form: s or -:[synthetic/]<name> \
             field[;field] ...\n  Command: s:junk/myevent char str[\n           ^\n"
        );
    }

    #[test]
    fn every_accepted_type() {
        let d = def(
            "t s64 a; u64 b; s32 c; u32 d; s16 e; u16 f; s8 g; u8 h; char i; \
                     unsigned char j; int k; unsigned int l; long m; unsigned long n; \
                     bool o; pid_t p; gfp_t q; char r[16]; char s[]; unsigned long[] t; \
                     long u[]; char[8] v",
        );
        let got: Vec<(&str, &str, usize, bool, SynthFieldKind)> = d
            .fields
            .iter()
            .map(|f| (f.name.as_str(), f.c_type.as_str(), f.size, f.signed, f.kind))
            .collect();
        use SynthFieldKind::*;
        assert_eq!(
            got,
            [
                ("a", "s64", 8, true, Int),
                ("b", "u64", 8, false, Int),
                ("c", "s32", 4, true, Int),
                ("d", "u32", 4, false, Int),
                ("e", "s16", 2, true, Int),
                ("f", "u16", 2, false, Int),
                ("g", "s8", 1, true, Int),
                ("h", "u8", 1, false, Int),
                ("i", "char", 1, true, Int),
                ("j", "unsigned char", 1, false, Int),
                ("k", "int", 4, true, Int),
                ("l", "unsigned int", 4, false, Int),
                ("m", "long", 8, true, Int),
                ("n", "unsigned long", 8, false, Int),
                ("o", "bool", 1, true, Int),
                ("p", "pid_t", 4, true, Int),
                ("q", "gfp_t", 4, false, Int),
                ("r", "char[16]", 16, true, StaticString),
                ("s", "__data_loc char[]", 8, true, DynString),
                ("t", "__data_loc unsigned long[]", 8, true, Stack),
                ("u", "__data_loc long[]", 8, true, Stack),
                ("v", "char[8]", 8, true, StaticString),
            ]
        );
    }

    #[test]
    fn integer_arrays_and_unknown_types_are_invalid() {
        use SynthErrorKind::*;
        check_error("e ^u64[] s", InvalidType);
        check_error("e ^u64 x[4]", InvalidType);
        check_error("e unsigned ^u64 x", InvalidType);
        check_error("e char ^x[0x1ff]", InvalidArraySpec);
        // Octal and hex sizes, as kstrtouint reads them.
        assert_eq!(def("e char x[010]").fields[0].size, 8);
        assert_eq!(def("e char x[0x1]").fields[0].size, 1);
        assert_eq!(def("e char x[0]").fields[0].kind, SynthFieldKind::DynString);
    }

    #[test]
    fn the_selftests_syntax_forms() {
        for line in [
            "myevent u64 var1; u64 var2;",
            "myevent u64 var1 ; u64 var2 ;",
            "myevent u64 var1 ;u64 var2",
            "myevent u64 var1 u64 var2",
        ] {
            assert_eq!(def(line).listing(), "myevent\tu64 var1; u64 var2", "{line}");
        }
        assert_eq!(
            def("myevent unsigned long var").listing(),
            "myevent\tunsigned long var"
        );
        assert_eq!(
            def("myevent char var[10]").listing(),
            "myevent\tchar[10] var"
        );
        assert_eq!(
            def("myevent unsigned long[] var").listing(),
            "myevent\tunsigned long[] var"
        );
        assert_eq!(
            parse_line("!myevent", &none),
            Ok(SynthCommand::Delete("myevent".into()))
        );
        assert_eq!(parse_line("  \t", &none), Ok(SynthCommand::Empty));
        let exists = |n: &str| n == "myevent";
        let err = parse_line("myevent u64 var2", &exists).unwrap_err();
        assert_eq!(
            (err.kind, err.errno, err.pos),
            (SynthErrorKind::EventExists, EEXIST, 0)
        );
    }

    #[test]
    fn dyn_lines() {
        let got = parse_dyn_line("s:latency1 u64 lat; pid_t pid;", &none)
            .unwrap()
            .unwrap();
        let SynthCommand::Create(d) = got else {
            panic!()
        };
        assert_eq!(d.dyn_listing(), "s:synthetic/latency1\tu64 lat; pid_t pid");
        assert!(parse_dyn_line("s:synthetic/l2 u64 lat", &none)
            .unwrap()
            .is_ok());
        assert!(parse_dyn_line("f:x foo", &none).is_none());
        let err = parse_dyn_line("s:nofields", &none).unwrap().unwrap_err();
        assert_eq!(err.kind, SynthErrorKind::InvalidCmd);
    }

    #[test]
    fn print_fmt_as_the_kernel_builds_it() {
        let d = def("wakeup u64 lat; pid_t pid; char comm[16]; char fn[]; unsigned long[] st");
        assert_eq!(
            d.print_fmt(),
            "\"lat=%llu, pid=%d, comm=%.*s, fn=%.*s, st=%s\", REC->lat, REC->pid, \
             REC->comm, __get_str(fn), __get_stacktrace(st)"
        );
    }

    #[test]
    fn too_many_fields() {
        let fields: Vec<String> = (0..=SYNTH_FIELDS_MAX)
            .map(|i| format!("u64 f{i}"))
            .collect();
        let line = format!("big {}", fields.join("; "));
        let err = parse_line(&line, &none).unwrap_err();
        assert_eq!((err.kind, err.pos), (SynthErrorKind::TooManyFields, 0));
        let ok = format!("big {}", fields[..SYNTH_FIELDS_MAX].join("; "));
        assert_eq!(def(&ok).fields.len(), SYNTH_FIELDS_MAX);
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        const TYPES: &[&str] = &[
            "u64",
            "s64",
            "u32",
            "s32",
            "u16",
            "s16",
            "u8",
            "s8",
            "char",
            "unsigned char",
            "int",
            "unsigned int",
            "long",
            "unsigned long",
            "bool",
            "pid_t",
            "gfp_t",
            "char[16]",
            "char[]",
            "unsigned long[]",
            "long[]",
        ];

        proptest! {
            /// Any line parses or fails cleanly, with a caret inside the command.
            #[test]
            fn never_panics(line in "\\PC{0,80}") {
                match parse_line(&line, &|_| false) {
                    Ok(_) => {}
                    Err(e) => prop_assert!(e.pos <= e.command.len()),
                }
                if let Some(Err(e)) = parse_dyn_line(&format!("s:{line}"), &|_| false) {
                    prop_assert!(e.pos <= e.command.len());
                }
            }

            /// A definition listed and parsed again is the same definition.
            #[test]
            fn listing_round_trips(
                name in "[a-z_][a-z0-9_]{0,10}",
                fields in proptest::collection::vec((0..TYPES.len(), "[a-z_][a-z0-9_]{0,8}"), 1..10),
            ) {
                let text: Vec<String> = fields
                    .iter()
                    .map(|(t, n)| format!("{} {n}", TYPES[*t]))
                    .collect();
                let line = format!("{name} {}", text.join("; "));
                let Ok(SynthCommand::Create(def)) = parse_line(&line, &|_| false) else {
                    return Err(TestCaseError::fail(format!("rejected: {line}")));
                };
                prop_assert_eq!(def.fields.len(), fields.len());
                let again = parse_line(&def.command(), &|_| false);
                prop_assert_eq!(again, Ok(SynthCommand::Create(def.clone())));
                let dyn_again = parse_dyn_line(&def.dyn_listing().replacen('\t', " ", 1), &|_| false);
                prop_assert_eq!(dyn_again, Some(Ok(SynthCommand::Create(def))));
            }
        }
    }
}
