//! Filter compile errors with the kernel's message, caret position and errno.
//!
//! When a write to an event's `filter` file fails, the kernel returns an errno
//! (not always `EINVAL`: its parser leaks small negative codes), replaces the
//! file's content with the expression, a caret line and `parse_error: MSG`,
//! drops the previous filter (the event becomes unfiltered) and appends an
//! entry to the instance's `error_log`. [`FilterError`] carries what is needed
//! to reproduce all three texts exactly.
//!
//! ```text
//!   filter file after `id =`:        error_log entry:
//!   id =                             [ 12.345] event filter parse error: error: Invalid operator
//!       ^                              Command: id =
//!   parse_error: Invalid operator                   ^
//!   (blank line)
//! ```

use std::fmt;

/// The kernel's filter error ids (`FILT_ERR_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    InvalidOp,
    TooManyOpen,
    TooManyClose,
    MissingQuote,
    MissingBraceOpen,
    MissingBraceClose,
    OperandTooLong,
    ExpectString,
    ExpectDigit,
    IllegalFieldOp,
    FieldNotFound,
    IllegalIntval,
    TooManyPreds,
    InvalidFilter,
    InvalidCpulist,
    InvalidValue,
    NoFunction,
    NoFilter,
    BadSubsysFilter,
}

impl ErrorKind {
    /// The kernel's message text for this id.
    pub fn message(self) -> &'static str {
        match self {
            ErrorKind::InvalidOp => "Invalid operator",
            ErrorKind::TooManyOpen => "Too many '('",
            ErrorKind::TooManyClose => "Too few '('",
            ErrorKind::MissingQuote => "Missing matching quote",
            ErrorKind::MissingBraceOpen => "Missing '{'",
            ErrorKind::MissingBraceClose => "Missing '}'",
            ErrorKind::OperandTooLong => "Operand too long",
            ErrorKind::ExpectString => "Expecting string field",
            ErrorKind::ExpectDigit => "Expecting numeric field",
            ErrorKind::IllegalFieldOp => "Illegal operation for field type",
            ErrorKind::FieldNotFound => "Field not found",
            ErrorKind::IllegalIntval => "Illegal integer value",
            ErrorKind::TooManyPreds => "Too many terms in predicate expression",
            ErrorKind::InvalidFilter => "Meaningless filter expression",
            ErrorKind::InvalidCpulist => "Invalid cpulist",
            ErrorKind::InvalidValue => "Invalid value (did you forget quotes)?",
            ErrorKind::NoFunction => "Function not found",
            ErrorKind::NoFilter => "No filter found",
            ErrorKind::BadSubsysFilter => {
                "Couldn't find or set field in one of a subsystem's events"
            }
        }
    }
}

/// Why a filter expression was rejected.
///
/// `kind == None` is the kernel's bare failure (empty expression, `()`, a
/// predicate with no field name...) which shows `Error: (0)` instead of a caret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    pub(crate) kind: Option<ErrorKind>,
    pub(crate) pos: usize,
    pub(crate) errno: i32,
    pub(crate) too_long: bool,
}

/// The kernel's limit on one write to `filter`/`trigger` (`PAGE_SIZE`):
/// writes of this many bytes or more are refused with `EINVAL`.
pub const MAX_WRITE: usize = 4096;

/// What a subsystem's `filter` file shows (the kernel never shows the
/// filter written there).
pub const SUBSYSTEM_FILTER_HELP: &str = "### global filter ###\n\
# Use this to set filters for multiple events.\n\
# Only events with the given fields will be affected.\n\
# If no events are modified, an error message will be displayed here\n";

/// Most bytes the kernel's text buffer (`trace_seq`) holds when it formats
/// a filter error or the `filter` file (two pages minus its bookkeeping,
/// minus the NUL); measured on a live kernel.
pub const SEQ_LIMIT: usize = 8155;

impl FilterError {
    pub(crate) fn new(kind: ErrorKind, pos: usize, errno: i32) -> Self {
        FilterError {
            kind: Some(kind),
            pos,
            errno,
            too_long: false,
        }
    }

    pub(crate) fn bare(errno: i32) -> Self {
        FilterError {
            kind: None,
            pos: 0,
            errno,
            too_long: false,
        }
    }

    pub(crate) fn write_too_long() -> Self {
        FilterError {
            kind: None,
            pos: 0,
            errno: 22,
            too_long: true,
        }
    }

    /// The error id, `None` for the kernel's bare `Error: (0)` failures.
    pub fn kind(&self) -> Option<ErrorKind> {
        self.kind
    }

    /// The kernel's message (`"Error"` for the bare failures, as in `error_log`).
    pub fn message(&self) -> &'static str {
        self.kind.map_or("Error", ErrorKind::message)
    }

    /// Byte offset the kernel reports (may lie one past the end of the text).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The positive errno the failed `write(2)` returns (`EINVAL`, but also
    /// `EPERM`, `ENOENT`, `ESRCH`, `ERANGE` where the kernel leaks them).
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The error an event gets when a filter written to its *subsystem's*
    /// `filter` file does not compile for it. The kernel then still replaces
    /// that event's filter (leaving the event unfiltered), shows this error
    /// with the caret at 0 in the event's `filter` file and logs it once per
    /// such event; the subsystem write itself succeeds as long as the
    /// subsystem has events, and the subsystem file keeps showing
    /// [`SUBSYSTEM_FILTER_HELP`].
    pub fn for_subsystem(&self) -> FilterError {
        if self.too_long {
            return self.clone();
        }
        FilterError::new(ErrorKind::BadSubsysFilter, 0, self.errno)
    }

    /// Whether the write was refused before parsing (4096 bytes or more):
    /// the kernel then leaves the `filter` file, the current filter and the
    /// `error_log` untouched, and [`FilterError::filter_file_text`] and
    /// [`FilterError::error_log_entry`] return empty strings.
    pub fn is_write_too_long(&self) -> bool {
        self.too_long
    }

    /// Exactly what reading `filter` shows after this error, for the written
    /// text `expr` (trailing whitespace is stripped as the kernel does).
    ///
    /// The kernel builds the text in a bounded buffer ([`SEQ_LIMIT`] bytes):
    /// the caret line and the message line are each added only if they fit
    /// (and nothing after the first that does not), and a read whose text
    /// plus newline does not fit shows nothing at all. Only expressions of
    /// about 4000 bytes get there; this reproduces it.
    pub fn filter_file_text(&self, expr: &str) -> String {
        if self.too_long {
            return String::new();
        }
        let shown = shown_bytes(expr);
        let mut stored = shown.to_vec();
        let pieces: Vec<Vec<u8>> = match self.kind {
            Some(kind) => {
                let col = self.pos.min(shown.len());
                vec![
                    format!("\n{:col$}^", "").into_bytes(),
                    format!("\nparse_error: {}\n", kind.message()).into_bytes(),
                ]
            }
            None => vec![b"\nError: (0)\n".to_vec()],
        };
        for piece in pieces {
            if stored.len() + piece.len() > SEQ_LIMIT {
                break;
            }
            stored.extend_from_slice(&piece);
        }
        if stored.len() + 1 > SEQ_LIMIT {
            return String::new();
        }
        stored.push(b'\n');
        String::from_utf8_lossy(&stored).into_owned()
    }

    /// The `error_log` entry after its `[timestamp] ` prefix: the first line
    /// (`event filter parse error: error: MSG`) and the remaining lines
    /// (`  Command: EXPR` and the caret line), without trailing newlines.
    pub fn error_log_entry(&self, expr: &str) -> (String, String) {
        if self.too_long {
            return (String::new(), String::new());
        }
        let shown = shown_expr(expr);
        let col = 11 + self.pos;
        (
            format!("event filter parse error: error: {}", self.message()),
            format!("  Command: {shown}\n{:col$}^", ""),
        )
    }
}

/// The expression as the kernel keeps it: up to the first NUL, trailing
/// whitespace removed, leading whitespace kept.
pub(crate) fn shown_expr(expr: &str) -> String {
    String::from_utf8_lossy(shown_bytes(expr)).into_owned()
}

fn shown_bytes(expr: &str) -> &[u8] {
    crate::ctype::strip_trailing(crate::ctype::c_str(expr.as_bytes()))
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Some(kind) => write!(
                f,
                "filter parse error at byte {}: {} (errno {})",
                self.pos,
                kind.message().to_lowercase(),
                self.errno
            ),
            None if self.too_long => write!(f, "filter write of {MAX_WRITE} bytes or more refused"),
            None => write!(f, "filter rejected (errno {})", self.errno),
        }
    }
}

impl std::error::Error for FilterError {}
