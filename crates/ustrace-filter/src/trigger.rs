//! The trigger-command language: one write to an event's `trigger` file.
//!
//! ```text
//!   [!]command[:count] [if filter]
//!   [!]enable_event:<system>:<event>[:count] [if filter]     (also disable_event,
//!                                                            enable_hist, disable_hist)
//! ```
//!
//! [`parse`] reproduces the kernel's tokenizer (it is looser than the grammar
//! above: `traceon 5` sets a count, `traceon:3:junk` ignores the junk, a
//! removal with `!` ignores everything after the command) and its errnos.
//! What it cannot check, the caller must, in this order, to agree with the
//! kernel:
//!
//! 1. for `enable_event`-like commands, that `<system>:<event>` exists
//!    (`EINVAL` otherwise — even for a removal);
//! 2. for an addition, compile [`Command::filter`] against the *triggering*
//!    event's fields with [`crate::compile`]; on error return its errno and log
//!    its `error_log` entry (the `trigger` file keeps its old content);
//! 3. that no registered trigger [`Command::conflicts`] with it (`EEXIST`);
//!    a removal drops the first registered trigger it conflicts with (and
//!    succeeds when there is none).
//!
//! The `trigger` file lists triggers newest first, one [`Trigger::listing`]
//! line each, or [`available_triggers_text`] when there are none.

use crate::ctype::{c_str, is_digit, skip_leading, strip_trailing};
use crate::error::MAX_WRITE;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

const EINVAL: i32 = 22;
const ERANGE: i32 = 34;

/// Every command the kernel knows, in its registration order (the order the
/// help text lists them).
pub const ALL_COMMANDS: [&str; 9] = [
    "traceon",
    "traceoff",
    "snapshot",
    "stacktrace",
    "enable_event",
    "disable_event",
    "enable_hist",
    "disable_hist",
    "hist",
];

/// What a trigger does when it fires.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    TraceOn,
    TraceOff,
    Snapshot,
    StackTrace,
    EnableEvent {
        system: String,
        event: String,
    },
    DisableEvent {
        system: String,
        event: String,
    },
    EnableHist {
        system: String,
        event: String,
    },
    DisableHist {
        system: String,
        event: String,
    },
    /// A `hist` trigger, kept as the text after `hist` for a later parser.
    Hist {
        spec: String,
    },
}

impl Kind {
    /// The command name as written.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::TraceOn => "traceon",
            Kind::TraceOff => "traceoff",
            Kind::Snapshot => "snapshot",
            Kind::StackTrace => "stacktrace",
            Kind::EnableEvent { .. } => "enable_event",
            Kind::DisableEvent { .. } => "disable_event",
            Kind::EnableHist { .. } => "enable_hist",
            Kind::DisableHist { .. } => "disable_hist",
            Kind::Hist { .. } => "hist",
        }
    }

    /// The `(system, event)` an enable/disable command acts on.
    pub fn target(&self) -> Option<(&str, &str)> {
        match self {
            Kind::EnableEvent { system, event }
            | Kind::DisableEvent { system, event }
            | Kind::EnableHist { system, event }
            | Kind::DisableHist { system, event } => Some((system, event)),
            _ => None,
        }
    }

    /// The kernel's trigger type: at most one trigger per type (and target)
    /// on an event; traceon and traceoff share one.
    fn slot(&self) -> u8 {
        match self {
            Kind::TraceOn | Kind::TraceOff => 0,
            Kind::Snapshot => 1,
            Kind::StackTrace => 2,
            Kind::EnableEvent { .. } | Kind::DisableEvent { .. } => 3,
            Kind::EnableHist { .. } | Kind::DisableHist { .. } => 4,
            Kind::Hist { .. } => 5,
        }
    }
}

/// One parsed write to a `trigger` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// Written with a leading `!`: remove the matching trigger.
    pub remove: bool,
    pub kind: Kind,
    /// How many more times it may fire; `None` = unlimited. Not parsed for removals.
    pub count: Option<u64>,
    /// The filter after `if ` exactly as the kernel keeps it (leading
    /// whitespace included); compile it against the triggering event. Not
    /// parsed for removals.
    pub filter: Option<String>,
}

/// Why a trigger write was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerError {
    errno: i32,
    reason: &'static str,
}

impl TriggerError {
    fn inval(reason: &'static str) -> Self {
        TriggerError {
            errno: EINVAL,
            reason,
        }
    }

    /// The positive errno of the failed write.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// What was wrong (ours: the kernel gives no message for trigger syntax).
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for TriggerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid trigger: {} (errno {})", self.reason, self.errno)
    }
}

impl std::error::Error for TriggerError {}

/// Split at the first of `delims` like C's `strsep`.
fn strsep<'a>(s: &'a [u8], delims: &[u8]) -> (&'a [u8], Option<&'a [u8]>) {
    match s.iter().position(|c| delims.contains(c)) {
        Some(k) => (&s[..k], Some(&s[k + 1..])),
        None => (s, None),
    }
}

fn string(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `kstrtoul(s, 0)`: the digits are read first, so an overflowing number
/// is `ERANGE` even with junk after it; no digits or junk is `EINVAL`.
fn kstrtoul(s: &[u8]) -> Result<u64, TriggerError> {
    let s = s.strip_prefix(b"+").unwrap_or(s);
    let (radix, digits) = if s.first() == Some(&b'0') {
        if matches!(s.get(1), Some(b'x' | b'X')) && s.get(2).is_some_and(|c| c.is_ascii_hexdigit())
        {
            (16u32, &s[2..])
        } else {
            (8, s)
        }
    } else {
        (10, s)
    };
    let mut v: u64 = 0;
    let mut overflow = false;
    let mut used = 0;
    for &c in digits {
        let Some(d) = (c as char).to_digit(16).filter(|&d| d < radix) else {
            break;
        };
        match v
            .checked_mul(u64::from(radix))
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(n) => v = n,
            None => overflow = true,
        }
        used += 1;
    }
    if overflow {
        return Err(TriggerError {
            errno: ERANGE,
            reason: "count out of range",
        });
    }
    let rest = &digits[used..];
    if used == 0 || !(rest.is_empty() || rest == b"\n") {
        return Err(TriggerError::inval("count is not a number"));
    }
    Ok(v)
}

/// `param[:ignored]` into a count (`u64::MAX`, the kernel's -1, is unlimited).
fn parse_count(param: Option<&[u8]>) -> Result<Option<u64>, TriggerError> {
    let Some(param) = param else {
        return Ok(None);
    };
    let (number, _) = strsep(param, b":");
    if number.is_empty() {
        return Err(TriggerError::inval("empty count"));
    }
    let n = kstrtoul(number)?;
    Ok((n != u64::MAX).then_some(n))
}

/// `if FILTER` into the filter text.
fn parse_filter(filter: Option<&[u8]>) -> Result<Option<String>, TriggerError> {
    let Some(filter) = filter else {
        return Ok(None);
    };
    let (word, rest) = strsep(filter, b" \t");
    if word != b"if" {
        return Err(TriggerError::inval("expected 'if' before the filter"));
    }
    match rest {
        Some(rest) => Ok(Some(string(rest))),
        None => Err(TriggerError::inval("missing filter after 'if'")),
    }
}

/// Parse a trigger write, every command of [`ALL_COMMANDS`] available.
pub fn parse(text: &str) -> Result<Command, TriggerError> {
    parse_with(text, &ALL_COMMANDS)
}

/// Parse a trigger write where only the commands in `available` exist
/// (e.g. a kernel without snapshot or hist support).
pub fn parse_with(text: &str, available: &[&str]) -> Result<Command, TriggerError> {
    if text.len() >= MAX_WRITE {
        return Err(TriggerError::inval("write too long"));
    }
    let buf = skip_leading(strip_trailing(c_str(text.as_bytes())));
    let (command, next) = strsep(buf, b": \t");
    let next = next.map(skip_leading).filter(|n| !n.is_empty());
    let (remove, name) = match command.strip_prefix(b"!") {
        Some(name) => (true, name),
        None => (false, command),
    };
    let Some(&name) = available.iter().find(|c| c.as_bytes() == name) else {
        return Err(TriggerError::inval("unknown trigger command"));
    };
    match name {
        "enable_event" | "disable_event" | "enable_hist" | "disable_hist" => {
            let Some(param_and_filter) = next else {
                return Err(TriggerError::inval("missing system:event"));
            };
            let (param, filter) = strsep(param_and_filter, b" \t");
            let filter = filter.map(skip_leading).filter(|f| !f.is_empty());
            let (system, rest) = strsep(param, b":");
            let Some(rest) = rest else {
                return Err(TriggerError::inval("missing event name"));
            };
            let (event, count) = strsep(rest, b":");
            let (system, event) = (string(system), string(event));
            let kind = match name {
                "enable_event" => Kind::EnableEvent { system, event },
                "disable_event" => Kind::DisableEvent { system, event },
                "enable_hist" => Kind::EnableHist { system, event },
                _ => Kind::DisableHist { system, event },
            };
            finish(remove, kind, count, filter)
        }
        "hist" => Ok(Command {
            remove,
            kind: Kind::Hist {
                spec: next.map(string).unwrap_or_default(),
            },
            count: None,
            filter: None,
        }),
        _ => {
            let kind = match name {
                "traceon" => Kind::TraceOn,
                "traceoff" => Kind::TraceOff,
                "snapshot" => Kind::Snapshot,
                _ => Kind::StackTrace,
            };
            let (param, filter) = match next {
                None => (None, None),
                Some(n) if !is_digit(n[0]) => (None, Some(n)),
                Some(n) => {
                    let (param, rest) = strsep(n, b" \t");
                    (
                        Some(param),
                        rest.map(skip_leading).filter(|f| !f.is_empty()),
                    )
                }
            };
            finish(remove, kind, param, filter)
        }
    }
}

fn finish(
    remove: bool,
    kind: Kind,
    param: Option<&[u8]>,
    filter: Option<&[u8]>,
) -> Result<Command, TriggerError> {
    if remove {
        return Ok(Command {
            remove,
            kind,
            count: None,
            filter: None,
        });
    }
    let count = parse_count(param)?;
    let filter = parse_filter(filter)?;
    Ok(Command {
        remove,
        kind,
        count,
        filter,
    })
}

impl Command {
    /// Whether `self` and `other` occupy the same slot on one event: adding
    /// `self` while `other` is registered fails with `EEXIST`, and removing
    /// `self` removes `other`. (`traceon` and `traceoff` share a slot;
    /// `enable_event` and `disable_event` share one per target event.)
    pub fn conflicts(&self, other: &Command) -> bool {
        if self.kind.slot() != other.kind.slot() {
            return false;
        }
        match (&self.kind, &other.kind) {
            (Kind::Hist { .. }, _) => false,
            (a, b) => a.target() == b.target(),
        }
    }

    /// The `trigger` file line for this command with `remaining` firings left
    /// (`None` = unlimited), without the newline.
    pub fn listing(&self, remaining: Option<u64>) -> String {
        let mut line = match &self.kind {
            Kind::Hist { spec } => return format!("hist:{spec}"),
            k => match k.target() {
                Some((system, event)) => format!("{}:{system}:{event}", k.name()),
                None => k.name().to_string(),
            },
        };
        match remaining {
            None => line.push_str(":unlimited"),
            Some(n) => line.push_str(&format!(":count={}", n as i64)),
        }
        if let Some(f) = &self.filter {
            line.push_str(" if ");
            line.push_str(f);
        }
        line
    }
}

/// A registered trigger: the command plus its lock-free firing counter.
#[derive(Debug)]
pub struct Trigger {
    command: Command,
    remaining: AtomicU64,
}

const UNLIMITED: u64 = u64::MAX;

impl Trigger {
    /// Register-time state for an added (not removing) command.
    pub fn new(command: Command) -> Trigger {
        let remaining = AtomicU64::new(command.count.unwrap_or(UNLIMITED));
        Trigger { command, remaining }
    }

    /// The command as parsed.
    pub fn command(&self) -> &Command {
        &self.command
    }

    /// Call when the trigger's event passed its filter: returns whether the
    /// action should run now, consuming one count if it is limited. A
    /// count of 0 never runs; unlimited always runs.
    ///
    /// The kernel consumes a count only when the action changes something:
    /// `traceon`/`traceoff` skip (without consuming) when tracing is already
    /// in the wanted state, `enable_event`/`disable_event` when the target
    /// event already is; `stacktrace` and `snapshot` always consume. Check
    /// that first and call `fire` only when the action would have an effect.
    pub fn fire(&self) -> bool {
        self.remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| match n {
                0 => None,
                UNLIMITED => Some(UNLIMITED),
                n => Some(n - 1),
            })
            .is_ok()
    }

    /// Firings left, `None` if unlimited.
    pub fn remaining(&self) -> Option<u64> {
        match self.remaining.load(Ordering::Acquire) {
            UNLIMITED => None,
            n => Some(n),
        }
    }

    /// The `trigger` file line, with the current count, without the newline.
    pub fn listing(&self) -> String {
        self.command.listing(self.remaining())
    }
}

/// What the `trigger` file shows when the event has no trigger.
pub fn available_triggers_text(available: &[&str]) -> String {
    let mut s = String::from("# Available triggers:\n#");
    for name in available {
        s.push(' ');
        s.push_str(name);
    }
    s.push('\n');
    s
}
