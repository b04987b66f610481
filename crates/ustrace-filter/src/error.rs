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
    InvalidCpulist,
    InvalidValue,
    NoFunction,
    NoFilter,
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
            ErrorKind::InvalidCpulist => "Invalid cpulist",
            ErrorKind::InvalidValue => "Invalid value (did you forget quotes)?",
            ErrorKind::NoFunction => "Function not found",
            ErrorKind::NoFilter => "No filter found",
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
}

/// The kernel's limit on one write to `filter`/`trigger` (`PAGE_SIZE`).
pub const MAX_WRITE: usize = 4096;

impl FilterError {
    pub(crate) fn new(kind: ErrorKind, pos: usize, errno: i32) -> Self {
        FilterError {
            kind: Some(kind),
            pos,
            errno,
        }
    }

    pub(crate) fn bare(errno: i32) -> Self {
        FilterError {
            kind: None,
            pos: 0,
            errno,
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

    /// Exactly what reading `filter` shows after this error, for the written
    /// text `expr` (trailing whitespace is stripped as the kernel does).
    pub fn filter_file_text(&self, expr: &str) -> String {
        let shown = shown_expr(expr);
        match self.kind {
            Some(kind) => {
                let col = self.pos.min(shown.len());
                format!("{shown}\n{:col$}^\nparse_error: {}\n\n", "", kind.message())
            }
            None => format!("{shown}\nError: (0)\n\n"),
        }
    }

    /// The `error_log` entry after its `[timestamp] ` prefix: the first line
    /// (`event filter parse error: error: MSG`) and the remaining lines
    /// (`  Command: EXPR` and the caret line), without trailing newlines.
    pub fn error_log_entry(&self, expr: &str) -> (String, String) {
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
    let bytes = crate::ctype::strip_trailing(crate::ctype::c_str(expr.as_bytes()));
    String::from_utf8_lossy(bytes).into_owned()
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
            None => write!(f, "filter rejected (errno {})", self.errno),
        }
    }
}

impl std::error::Error for FilterError {}
