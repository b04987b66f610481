//! Errors of the dynamic-event language, shaped like the kernel's.
//!
//! A rejected definition in the kernel leaves three things behind: an errno
//! returned by `write(2)`, and an `error_log` entry made of a location
//! (`trace_fprobe: error: ...`), the command re-joined from its words, and a
//! caret under the offending byte. [`ProbeError`] carries all of them:
//!
//! ```text
//! trace_fprobe: error: Invalid $-variable specified
//!   Command: f vfs_read $foo
//!                       ^
//! ```
//!
//! The caret column is computed as the kernel does: the words of the command
//! are joined by single spaces, `index` names the word being parsed and
//! `offset` the byte inside it; an `index` past the last word puts the caret
//! one column after the end of the command.

use std::fmt;

/// The errno a rejected write returns (positive value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Errno {
    /// Invalid argument (`EINVAL`, 22): almost every syntax error.
    Inval,
    /// No such entry (`ENOENT`, 2): unknown symbol, parameter or field.
    NoEnt,
    /// Argument list too long (`E2BIG`, 7): too many or too big arguments.
    TooBig,
    /// Already exists (`EEXIST`, 17): an event with that name exists.
    Exist,
    /// Not supported (`EOPNOTSUPP`, 95): a debug-info feature that is missing.
    NotSupported,
    /// No such device (`ENODEV`, 19): the event an eprobe attaches to is missing.
    NoDev,
    /// Busy (`EBUSY`, 16): the event is enabled or in use.
    Busy,
    /// Out of range (`ERANGE`, 34): a number in the definition overflows.
    Range,
}

impl Errno {
    /// The numeric errno value.
    pub fn code(self) -> i32 {
        match self {
            Errno::Inval => libc::EINVAL,
            Errno::NoEnt => libc::ENOENT,
            Errno::TooBig => libc::E2BIG,
            Errno::Exist => libc::EEXIST,
            Errno::NotSupported => libc::EOPNOTSUPP,
            Errno::NoDev => libc::ENODEV,
            Errno::Busy => libc::EBUSY,
            Errno::Range => libc::ERANGE,
        }
    }

    /// The symbolic name (`EINVAL`).
    pub fn name(self) -> &'static str {
        match self {
            Errno::Inval => "EINVAL",
            Errno::NoEnt => "ENOENT",
            Errno::TooBig => "E2BIG",
            Errno::Exist => "EEXIST",
            Errno::NotSupported => "EOPNOTSUPP",
            Errno::NoDev => "ENODEV",
            Errno::Busy => "EBUSY",
            Errno::Range => "ERANGE",
        }
    }
}

macro_rules! error_ids {
    ($($id:ident => $text:literal,)*) => {
        /// The kernel's probe error identifiers (`TP_ERR_*`) with their text.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum ErrorId { $(
            #[doc = $text]
            $id,
        )* }

        impl ErrorId {
            /// Every identifier, in the kernel's table order.
            pub const ALL: &'static [ErrorId] = &[$(ErrorId::$id,)*];

            /// The message the kernel writes into `error_log`.
            pub fn message(self) -> &'static str {
                match self { $(ErrorId::$id => $text,)* }
            }

            /// The identifier as the kernel spells it (`BAD_VAR`).
            pub fn name(self) -> &'static str {
                match self { $(ErrorId::$id => stringify!($id),)* }
            }

            /// The identifier named `name` (`BAD_VAR`), if any.
            pub fn from_name(name: &str) -> Option<ErrorId> {
                match name { $(stringify!($id) => Some(ErrorId::$id),)* _ => None }
            }
        }
    };
}

// Interface text: the messages user space sees in error_log (6.18 wording,
// checked against the running kernel where uprobe events reach them).
error_ids! {
    FILE_NOT_FOUND => "Failed to find the given file",
    NO_REGULAR_FILE => "Not a regular file",
    BAD_REFCNT => "Invalid reference counter offset",
    REFCNT_OPEN_BRACE => "Reference counter brace is not closed",
    BAD_REFCNT_SUFFIX => "Reference counter has wrong suffix",
    BAD_UPROBE_OFFS => "Invalid uprobe offset",
    BAD_MAXACT_TYPE => "Maxactive is only for function exit",
    BAD_MAXACT => "Invalid maxactive number",
    MAXACT_TOO_BIG => "Maxactive is too big",
    BAD_PROBE_ADDR => "Invalid probed address or symbol",
    NON_UNIQ_SYMBOL => "The symbol is not unique",
    BAD_RETPROBE => "Retprobe address must be an function entry",
    NO_TRACEPOINT => "Tracepoint is not found",
    BAD_TP_NAME => "Invalid character in tracepoint name",
    BAD_ADDR_SUFFIX => "Invalid probed address suffix",
    NO_GROUP_NAME => "Group name is not specified",
    GROUP_TOO_LONG => "Group name is too long",
    BAD_GROUP_NAME => "Group name must follow the same rules as C identifiers",
    NO_EVENT_NAME => "Event name is not specified",
    EVENT_TOO_LONG => "Event name is too long",
    BAD_EVENT_NAME => "Event name must follow the same rules as C identifiers",
    EVENT_EXIST => "Given group/event name is already used by another event",
    RETVAL_ON_PROBE => "$retval is not available on probe",
    NO_RETVAL => "This function returns 'void' type",
    BAD_STACK_NUM => "Invalid stack number",
    BAD_ARG_NUM => "Invalid argument number",
    BAD_VAR => "Invalid $-variable specified",
    BAD_REG_NAME => "Invalid register name",
    BAD_MEM_ADDR => "Invalid memory address",
    BAD_IMM => "Invalid immediate value",
    IMMSTR_NO_CLOSE => "String is not closed with '\"'",
    FILE_ON_KPROBE => "File offset is not available with kprobe",
    BAD_FILE_OFFS => "Invalid file offset value",
    SYM_ON_UPROBE => "Symbol is not available with uprobe",
    TOO_MANY_OPS => "Dereference is too much nested",
    DEREF_NEED_BRACE => "Dereference needs a brace",
    BAD_DEREF_OFFS => "Invalid dereference offset",
    DEREF_OPEN_BRACE => "Dereference brace is not closed",
    COMM_CANT_DEREF => "$comm can not be dereferenced",
    BAD_FETCH_ARG => "Invalid fetch argument",
    ARRAY_NO_CLOSE => "Array is not closed",
    BAD_ARRAY_SUFFIX => "Array has wrong suffix",
    BAD_ARRAY_NUM => "Invalid array size",
    ARRAY_TOO_BIG => "Array number is too big",
    BAD_TYPE => "Unknown type is specified",
    BAD_STRING => "String accepts only memory argument",
    BAD_SYMSTRING => "Symbol String doesn't accept data/userdata",
    BAD_BITFIELD => "Invalid bitfield",
    ARG_NAME_TOO_LONG => "Argument name is too long",
    NO_ARG_NAME => "Argument name is not specified",
    BAD_ARG_NAME => "Argument name must follow the same rules as C identifiers",
    USED_ARG_NAME => "This argument name is already used",
    ARG_TOO_LONG => "Argument expression is too long",
    NO_ARG_BODY => "No argument expression",
    BAD_INSN_BNDRY => "Probe point is not an instruction boundary",
    FAIL_REG_PROBE => "Failed to register probe event",
    DIFF_PROBE_TYPE => "Probe type is different from existing probe",
    DIFF_ARG_TYPE => "Argument type or name is different from existing probe",
    SAME_PROBE => "There is already the exact same probe event",
    NO_EVENT_INFO => "This requires both group and event name to attach",
    BAD_ATTACH_EVENT => "Attached event does not exist",
    BAD_ATTACH_ARG => "Attached event does not have this field",
    NO_EP_FILTER => "No filter rule after 'if'",
    NOSUP_BTFARG => "BTF is not available or not supported",
    NO_BTFARG => "This variable is not found at this probe point",
    NO_BTF_ENTRY => "No BTF entry for this probe point",
    BAD_VAR_ARGS => "$arg* must be an independent parameter without name etc.",
    NOFENTRY_ARGS => "$arg* can be used only on function entry or exit",
    DOUBLE_ARGS => "$arg* can be used only once in the parameters",
    ARGS_2LONG => "$arg* failed because the argument list is too long",
    ARGIDX_2BIG => "$argN index is too big",
    NO_PTR_STRCT => "This is not a pointer to union/structure.",
    NOSUP_DAT_ARG => "Non pointer structure/union argument is not supported.",
    BAD_HYPHEN => "Failed to parse single hyphen. Forgot '>'?",
    NO_BTF_FIELD => "This field is not found.",
    BAD_BTF_TID => "Failed to get BTF type info.",
    BAD_TYPE4STR => "This type does not fit for string.",
    NEED_STRING_TYPE => "$comm and immediate-string only accepts string type",
    TOO_MANY_ARGS => "Too many arguments are specified",
    TOO_MANY_EARGS => "Too many entry arguments specified",
    EVENT_TOO_BIG => "Event too big (too many fields?)",
}

/// A rejected `dynamic_events` write.
///
/// `id` is `None` for the rejections the kernel does not log (an unknown
/// command letter, a malformed `-:` line): those only return an errno.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeError {
    /// Which error, when the kernel would log one.
    pub id: Option<ErrorId>,
    /// The errno of the failed write.
    pub errno: Errno,
    /// The location prefix of the log line (`trace_fprobe`, `event_probe`, `trace_uprobe`).
    pub subsystem: &'static str,
    /// The words of the command (split at whitespace, as `argv_split`).
    pub argv: Vec<String>,
    /// Which word the error is in (may be `argv.len()`: "after the end").
    pub index: usize,
    /// Byte offset inside that word.
    pub offset: usize,
}

impl ProbeError {
    /// An unlogged rejection (only an errno).
    pub fn silent(errno: Errno) -> ProbeError {
        ProbeError {
            id: None,
            errno,
            subsystem: "",
            argv: Vec::new(),
            index: 0,
            offset: 0,
        }
    }

    /// The message (`""` for an unlogged rejection).
    pub fn message(&self) -> &'static str {
        self.id.map_or("", ErrorId::message)
    }

    /// The command as `error_log` shows it: the words joined by one space.
    pub fn command(&self) -> String {
        self.argv.join(" ")
    }

    /// Byte column of the caret inside [`ProbeError::command`].
    pub fn caret(&self) -> usize {
        let mut pos = 0;
        for (i, w) in self.argv.iter().enumerate() {
            if i == self.index {
                return pos + self.offset;
            }
            pos += w.len() + 1;
        }
        // Past the last word: one column after the end (the kernel counts a
        // separator after every word, including the last).
        pos
    }

    /// The `error_log` entry without its `[timestamp] ` prefix: three lines,
    /// each ending in `\n`. Empty for an unlogged rejection.
    pub fn log_text(&self) -> String {
        let Some(id) = self.id else {
            return String::new();
        };
        const CMD_PREFIX: &str = "  Command: ";
        let mut s = format!(
            "{}: error: {}\n{CMD_PREFIX}{}\n",
            self.subsystem,
            id.message(),
            self.command()
        );
        s.extend(std::iter::repeat_n(' ', CMD_PREFIX.len() + self.caret()));
        s.push_str("^\n");
        s
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id {
            Some(id) => write!(
                f,
                "{}: {} ({}) at byte {} of '{}'",
                self.errno.name(),
                id.message(),
                id.name(),
                self.caret(),
                self.command()
            ),
            None => write!(f, "{}: rejected dynamic event command", self.errno.name()),
        }
    }
}

impl std::error::Error for ProbeError {}

/// An error before the command words are known to the error (filled in by
/// the command parser, which owns the words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArgError {
    pub id: ErrorId,
    pub offset: usize,
    pub errno: Errno,
}

impl ArgError {
    pub(crate) fn new(id: ErrorId, offset: usize) -> ArgError {
        ArgError {
            id,
            offset,
            errno: Errno::Inval,
        }
    }

    pub(crate) fn with(id: ErrorId, offset: usize, errno: Errno) -> ArgError {
        ArgError { id, offset, errno }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caret_matches_kernel_layout() {
        let e = ProbeError {
            id: Some(ErrorId::DEREF_OPEN_BRACE),
            errno: Errno::Inval,
            subsystem: "trace_uprobe",
            argv: vec!["p".into(), "/bin/true:0x1000".into(), "+0(%di".into()],
            index: 2,
            offset: 6,
        };
        // Seen on the running kernel: 36 spaces then '^'.
        let text = e.log_text();
        let last = text.lines().last().unwrap();
        assert_eq!(last.find('^'), Some(36));
        assert!(text.starts_with("trace_uprobe: error: Dereference brace is not closed\n"));
    }

    #[test]
    fn caret_after_end() {
        let e = ProbeError {
            id: Some(ErrorId::NO_EP_FILTER),
            errno: Errno::Inval,
            subsystem: "event_probe",
            argv: vec!["e".into(), "a.b".into(), "if".into()],
            index: 3,
            offset: 0,
        };
        assert_eq!(e.caret(), "e a.b if".len() + 1);
    }

    #[test]
    fn names_round_trip() {
        for id in ErrorId::ALL {
            assert_eq!(ErrorId::from_name(id.name()), Some(*id));
            assert!(!id.message().is_empty());
        }
    }
}
