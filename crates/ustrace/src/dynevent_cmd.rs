//! Building dynamic events in code (events.rst 7.3 and 7.4).
//!
//! The kernel lets a module build a `dynamic_events` command piece by piece
//! (`dynevent_cmd`, `kprobe_event_gen_cmd_start`, `kprobe_event_add_fields`,
//! `kprobe_event_gen_cmd_end`) and delete the event again (`kprobe_event_delete`). Here the
//! same steps are a builder: [`DynEventCmd`] accumulates the command text and
//! [`DynEventCmd::create`] hands it to exactly the parser the `dynamic_events` file uses,
//! so an event built in code and one written from a shell cannot differ.
//!
//! ```no_run
//! use ustrace::dynevent_cmd::{delete, DynEventCmd};
//! // kprobe_event_gen_cmd_start(&cmd, "gen_fprobe_test", "parse_header", "len=$arg2")
//! let mut cmd = DynEventCmd::fprobe("gen_fprobe_test", "parse_header");
//! cmd.add_field("len=$arg2");
//! // kprobe_event_add_fields(&cmd, "flags=$arg3", "first=+0($arg1):u8")
//! cmd.add_fields(["flags=$arg3", "first=+0($arg1):u8"]);
//! // kprobe_event_gen_cmd_end(&cmd)
//! let id = cmd.create()?;
//! // kprobe_event_delete("gen_fprobe_test")
//! delete(None, "gen_fprobe_test")?;
//! # Ok::<(), ustrace::dynevent_cmd::CreateError>(())
//! ```

use std::fmt;

use ustrace_ctl::vfs::Errno;

use crate::event::EventId;

/// A dynamic event command being built (the kernel's `struct dynevent_cmd`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynEventCmd {
    /// `f`, `f%return`, `t` or `e`, with the group/name and the probe point.
    head: String,
    /// Fetch arguments (`NAME=FETCHARG[:TYPE]`), and for eprobes an `if FILTER` last.
    args: Vec<String>,
    filter: Option<String>,
}

/// Why [`DynEventCmd::create`] or [`delete`] failed: the errno the `dynamic_events` file
/// would have returned, and the `error_log` entry it would have written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateError {
    /// The errno the write to `dynamic_events` fails with.
    pub errno: Errno,
    /// The newest `error_log` entry written for this command, if any.
    pub log: Option<String>,
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.log {
            Some(log) => write!(f, "{} ({})", log.trim_end(), self.errno),
            None => write!(f, "{}", self.errno),
        }
    }
}

impl std::error::Error for CreateError {}

fn name_part(group: Option<&str>, event: &str) -> String {
    match group {
        Some(group) => format!("{group}/{event}"),
        None => event.to_string(),
    }
}

impl DynEventCmd {
    /// An fprobe event on `symbol`'s entry (`kprobe_event_gen_cmd_start`).
    pub fn fprobe(event: &str, symbol: &str) -> Self {
        Self::with_head(format!("f:{event} {symbol}"))
    }

    /// An fprobe event on `symbol`'s return (`kretprobe_event_gen_cmd_start`).
    pub fn fprobe_return(event: &str, symbol: &str) -> Self {
        Self::with_head(format!("f:{event} {symbol}%return"))
    }

    /// A tracepoint probe event on `tracepoint`.
    pub fn tracepoint(event: &str, tracepoint: &str) -> Self {
        Self::with_head(format!("t:{event} {tracepoint}"))
    }

    /// An event probe on `system:source`.
    pub fn eprobe(event: &str, system: &str, source: &str) -> Self {
        Self::with_head(format!("e:{event} {system}.{source}"))
    }

    fn with_head(head: String) -> Self {
        DynEventCmd {
            head,
            args: Vec::new(),
            filter: None,
        }
    }

    /// Puts the event in `group` instead of the default one.
    pub fn group(&mut self, group: &str) -> &mut Self {
        if let Some((kind, rest)) = self.head.split_once(':') {
            let (event, point) = rest.split_once(' ').unwrap_or((rest, ""));
            let event = event.rsplit('/').next().unwrap_or(event);
            self.head = format!("{kind}:{} {point}", name_part(Some(group), event));
        }
        self
    }

    /// Adds one fetch argument (`dynevent_arg_add`).
    pub fn add_field(&mut self, arg: &str) -> &mut Self {
        self.args.push(arg.to_string());
        self
    }

    /// Adds several fetch arguments (`kprobe_event_add_fields`).
    pub fn add_fields<'a>(&mut self, args: impl IntoIterator<Item = &'a str>) -> &mut Self {
        self.args.extend(args.into_iter().map(str::to_string));
        self
    }

    /// Adds a `NAME=FETCHARG` pair (`dynevent_arg_pair_add`).
    pub fn add_pair(&mut self, name: &str, fetcharg: &str) -> &mut Self {
        self.args.push(format!("{name}={fetcharg}"));
        self
    }

    /// Sets an eprobe's `if FILTER`.
    pub fn filter(&mut self, filter: &str) -> &mut Self {
        self.filter = Some(filter.to_string());
        self
    }

    /// The command as it would be written to `dynamic_events`.
    pub fn text(&self) -> String {
        let mut text = self.head.clone();
        for arg in &self.args {
            text.push(' ');
            text.push_str(arg);
        }
        if let Some(filter) = &self.filter {
            text.push_str(" if ");
            text.push_str(filter);
        }
        text
    }

    /// Creates the event (`kprobe_event_gen_cmd_end`, `dynevent_create`).
    pub fn create(&self) -> Result<EventId, CreateError> {
        run(&self.text())?;
        let name = self
            .head
            .split_once(':')
            .map(|(_, rest)| rest)
            .unwrap_or_default();
        let name = name.split(' ').next().unwrap_or_default();
        let (group, event) = match name.split_once('/') {
            Some((group, event)) => (Some(group), event),
            None => (None, name),
        };
        crate::dynevent::find(group, event).ok_or(CreateError {
            errno: Errno::ENOENT,
            log: None,
        })
    }
}

/// Runs one command through the `dynamic_events` parser, with the error it logs.
fn run(text: &str) -> Result<(), CreateError> {
    crate::dynevent::run_command(text).map_err(|(errno, log)| CreateError { errno, log })
}

/// Deletes a dynamic event (`kprobe_event_delete`); `EBUSY` while it is in use.
pub fn delete(group: Option<&str>, event: &str) -> Result<(), CreateError> {
    run(&format!("-:{}", name_part(group, event)))
}
