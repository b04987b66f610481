//! The hist-trigger error table (the kernel's `HIST_ERR_*`) and the error a rejected
//! `hist` write carries: its message, the byte of the command the caret points at, and
//! the errno the write returns.
//!
//! The kernel logs these to the instance's `error_log` as
//! `hist:SYSTEM:EVENT: error: MESSAGE` / `  Command: hist:...` / a caret line. Some
//! failures log nothing and only fail the write (`EINVAL`); those have no kind.

use std::fmt;

macro_rules! hist_errors {
    ($($name:ident => $text:expr,)*) => {
        /// One entry of the kernel's hist error table, in its order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum HistErrorKind { $(
            #[doc = $text]
            $name,
        )* }

        impl HistErrorKind {
            /// Every kind, in the kernel's table order.
            pub const ALL: &'static [HistErrorKind] = &[$(HistErrorKind::$name,)*];

            /// The kernel's message for this error.
            pub fn message(self) -> &'static str {
                match self { $(HistErrorKind::$name => $text,)* }
            }
        }
    };
}

hist_errors! {
    None => "No error",
    DuplicateVar => "Variable already defined",
    VarNotUnique => "Variable name not unique, need to use fully qualified name (subsys.event.var) for variable",
    TooManyVars => "Too many variables defined",
    MalformedAssignment => "Malformed assignment",
    NamedMismatch => "Named hist trigger doesn't match existing named trigger (includes variables)",
    TriggerEexist => "Hist trigger already exists",
    TriggerEnoentClear => "Can't clear or continue a nonexistent hist trigger",
    SetClockFail => "Couldn't set trace_clock",
    BadFieldModifier => "Invalid field modifier",
    TooManySubexpr => "Too many subexpressions (3 max)",
    TimestampMismatch => "Timestamp units in expression don't match",
    TooManyFieldVars => "Too many field variables defined",
    EventFileNotFound => "Event file not found",
    HistNotFound => "Matching event histogram not found",
    HistCreateFail => "Couldn't create histogram for field",
    SynthVarNotFound => "Couldn't find synthetic variable",
    SynthEventNotFound => "Couldn't find synthetic event",
    SynthTypeMismatch => "Param type doesn't match synthetic event field type",
    SynthCountMismatch => "Param count doesn't match synthetic event field count",
    FieldVarParseFail => "Couldn't parse field variable",
    VarCreateFindFail => "Couldn't create or find variable",
    OnxNotVar => "For onmax(x) or onchange(x), x must be a variable",
    OnxVarNotFound => "Couldn't find onmax or onchange variable",
    OnxVarCreateFail => "Couldn't create onmax or onchange variable",
    FieldVarCreateFail => "Couldn't create field variable",
    TooManyParams => "Too many action params",
    ParamNotFound => "Couldn't find param",
    InvalidParam => "Invalid action param",
    ActionNotFound => "No action found",
    NoSaveParams => "No params found for save()",
    TooManySaveActions => "Can't have more than one save() action per hist",
    ActionMismatch => "Handler doesn't support action",
    NoClosingParen => "No closing paren found",
    SubsysNotFound => "Missing subsystem",
    InvalidSubsysEvent => "Invalid subsystem or event name",
    InvalidRefKey => "Using variable references in keys not supported",
    VarNotFound => "Couldn't find variable",
    FieldNotFound => "Couldn't find field",
    EmptyAssignment => "Empty assignment",
    InvalidSortModifier => "Invalid sort modifier",
    EmptySortField => "Empty sort field",
    TooManySortFields => "Too many sort fields (Max = 2)",
    InvalidSortField => "Sort field must be a key or a val",
    InvalidStrOperand => "String type can not be an operand in expression",
    ExpectNumber => "Expecting numeric literal",
    UnaryMinusSubexpr => "Unary minus not supported in sub-expressions",
    DivisionByZero => "Division by zero",
    NeedNohcVal => "Non-hitcount value is required for 'nohitcount'",
}

/// `EINVAL`, the errno of nearly every rejected hist write.
pub const EINVAL: i32 = 22;
/// `ENOENT`: `:cont`/`:clear` of a missing trigger, `nohitcount` without a value.
pub const ENOENT: i32 = 2;
/// `EEXIST`: the same hist trigger is already on the event.
pub const EEXIST: i32 = 17;
/// `EDOM`: a division by the constant 0.
pub const EDOM: i32 = 33;
/// `EBUSY`: removing a trigger whose variables others reference.
pub const EBUSY: i32 = 16;
/// `ENOMEM`.
pub const ENOMEM: i32 = 12;

/// Why a hist trigger write was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistError {
    /// The logged error, `None` when the kernel fails the write without logging.
    pub kind: Option<HistErrorKind>,
    /// Byte of the command (`hist:` + the written parameters) the caret points at.
    pub pos: usize,
    /// Positive errno of the failed write.
    pub errno: i32,
}

impl HistError {
    /// A logged error with `EINVAL`.
    pub fn new(kind: HistErrorKind, pos: usize) -> HistError {
        HistError {
            kind: Some(kind),
            pos,
            errno: EINVAL,
        }
    }

    /// A logged error with another errno.
    pub fn with_errno(kind: HistErrorKind, pos: usize, errno: i32) -> HistError {
        HistError {
            kind: Some(kind),
            pos,
            errno,
        }
    }

    /// A failure the kernel does not log.
    pub fn silent(errno: i32) -> HistError {
        HistError {
            kind: None,
            pos: 0,
            errno,
        }
    }

    /// The message, if the error is logged.
    pub fn message(&self) -> Option<&'static str> {
        self.kind.map(HistErrorKind::message)
    }
}

impl fmt::Display for HistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Some(kind) => write!(
                f,
                "hist trigger error at byte {}: {} (errno {})",
                self.pos,
                kind.message(),
                self.errno
            ),
            None => write!(f, "hist trigger rejected (errno {})", self.errno),
        }
    }
}

impl std::error::Error for HistError {}
