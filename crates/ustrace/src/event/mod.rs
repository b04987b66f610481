//! Trace events: named, typed records produced by tracepoints, known by id and format.
//!
//! An *event* (`kv:get`) is a tracepoint plus a description of the record it writes: its
//! fields, how the tracepoint's arguments fill them, and how the record prints. This is the
//! kernel's `TRACE_EVENT`; in Rust it is the [`trace_event!`](crate::trace_event) macro.
//!
//! ```text
//!  trace_event! ──> tracepoint `get` ──(probe per instance, attached on enable)──┐
//!               └─> EventClass ──> registry: id, fields, print fmt               │
//!                                                                                ▼
//!                     EventFile (one per event per instance): soft-disable, filter,
//!                     triggers ──> reserve in the instance's ring buffer ──> commit
//! ```
//!
//! Events are described by [`EventClass`], implemented for macro-defined events
//! ([`StaticEvent`]), for the built-in `ftrace:print` (`trace_marker`), and later for dynamic
//! events. The [`registry`](mod@registry) gives each one an [`EventId`] and compiles its print format
//! once; instances keep one [`EventFile`] per event.

pub mod field;
pub(crate) mod id;
mod macros;
pub mod print_fmt;
pub mod registry;

use std::sync::Arc;

pub use field::{FieldDesc, FieldKind, FieldValue, FixedStr, Layout};
pub use registry::{registry, Event, EventId};

pub use crate::event_file::Attachment;
use crate::event_file::EventFile;
use ustrace_ctl::vfs::Errno;

/// What makes an event: its names, its record layout, its print format, and how it is
/// connected to the code that produces it.
pub trait EventClass: Send + Sync + 'static {
    /// The system (`kv` in `kv:get`): the directory under `events/`.
    fn system(&self) -> &str;
    /// The event's name (`get` in `kv:get`).
    fn name(&self) -> &str;
    /// The event's own fields (not the common ones), with offsets.
    fn fields(&self) -> Vec<FieldDesc>;
    /// The `print fmt:` text.
    fn print_fmt(&self, fields: &[FieldDesc]) -> String;
    /// Starts producing records into `file`.
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno>;
    /// The module that declared the event, as `set_event`'s `:mod:MODULE` names it: the
    /// crate for `trace_event!` events; none for built-in and dynamic events.
    fn module(&self) -> Option<&str> {
        None
    }
    /// The name trace lines show before the text (`tracing_mark_write` for `ftrace:print`).
    fn output_name(&self) -> &str {
        self.name()
    }
    /// The print format trace lines render; the `format` file's one unless an event prints
    /// differently from what it declares (as `ftrace:print` does).
    fn display_fmt(&self, fields: &[FieldDesc]) -> String {
        self.print_fmt(fields)
    }
    /// Writes the whole line text after the context (`name: …`) itself, for events whose
    /// lines are not a print format (dynamic events); false leaves it to the print format.
    fn render_line(&self, _record: &[u8], _out: &mut String) -> bool {
        false
    }
    /// [`EventClass::render_line`] knowing the instance's `verbose` option, for events
    /// whose lines change with it (synthetic events then show each value's conversion).
    fn render_line_verbose(&self, record: &[u8], out: &mut String, _verbose: bool) -> bool {
        self.render_line(record, out)
    }
}

/// An event defined with [`trace_event!`](crate::trace_event): everything is known at
/// compile time.
pub struct StaticEvent {
    /// The system (`kv` in `kv:get`).
    pub system: &'static str,
    /// The event's name (`get` in `kv:get`).
    pub name: &'static str,
    /// Where the event was declared (`module_path!()`); its first segment is the crate,
    /// the event's "module" for `set_event`'s `:mod:` form.
    pub module_path: &'static str,
    /// The event's own fields, laid out by [`Layout`].
    pub layout: fn() -> Vec<FieldDesc>,
    /// The C format string, without quotes.
    pub format: &'static str,
    /// Field names the format's conversions print, in order.
    pub print_args: &'static [&'static str],
    /// Registers the probe that records into an event file.
    pub attach: fn(Arc<EventFile>) -> crate::tracepoint::ProbeId,
    /// Unregisters a probe `attach` registered.
    pub detach: fn(crate::tracepoint::ProbeId),
}

struct StaticAttachment {
    detach: fn(crate::tracepoint::ProbeId),
    id: crate::tracepoint::ProbeId,
}

impl Attachment for StaticAttachment {
    fn detach(self: Box<Self>) {
        (self.detach)(self.id)
    }
}

/// Every event defined in the program, collected at link time.
#[linkme::distributed_slice]
pub static EVENTS: [&'static StaticEvent];

impl EventClass for StaticEvent {
    fn system(&self) -> &str {
        self.system
    }
    fn module(&self) -> Option<&str> {
        self.module_path.split("::").next()
    }
    fn name(&self) -> &str {
        self.name
    }
    fn fields(&self) -> Vec<FieldDesc> {
        (self.layout)()
    }
    fn print_fmt(&self, fields: &[FieldDesc]) -> String {
        let mut text = format!("\"{}\"", escape_c(self.format));
        for arg in self.print_args {
            text.push_str(", ");
            match fields.iter().find(|f| f.name == *arg) {
                Some(field) => text.push_str(&field.print_arg()),
                None => text.push_str(&format!("REC->{arg}")),
            }
        }
        text
    }
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        let id = (self.attach)(file);
        Ok(Box::new(StaticAttachment {
            detach: self.detach,
            id,
        }))
    }
}

/// Escapes a format string as a C literal's body.
pub fn escape_c(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

/// The attachment of an event whose records are written by its own producer.
struct NothingAttached;

impl Attachment for NothingAttached {
    fn detach(self: Box<Self>) {}
}

/// The built-in `ftrace:print` event that `trace_marker` writes produce.
pub(crate) struct MarkerEvent;

impl EventClass for MarkerEvent {
    fn system(&self) -> &str {
        "ftrace"
    }
    fn name(&self) -> &str {
        "print"
    }
    fn fields(&self) -> Vec<FieldDesc> {
        vec![
            FieldDesc {
                name: "ip".into(),
                c_type: "unsigned long".into(),
                offset: 8,
                size: 8,
                signed: false,
                kind: FieldKind::Int,
            },
            FieldDesc {
                name: "buf".into(),
                c_type: "char[]".into(),
                offset: 16,
                size: 0,
                signed: false,
                kind: FieldKind::TailString,
            },
        ]
    }
    fn print_fmt(&self, _fields: &[FieldDesc]) -> String {
        "\"%ps: %s\", (void *)REC->ip, REC->buf".into()
    }
    fn attach(&self, _file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        // Records are written by `trace_marker` itself, so there is nothing to attach; this
        // lets triggers put the event in soft mode. It has no `enable` file, as on the kernel.
        Ok(Box::new(NothingAttached))
    }
    fn output_name(&self) -> &str {
        "tracing_mark_write"
    }
    fn display_fmt(&self, _fields: &[FieldDesc]) -> String {
        "\"%s\", REC->buf".into()
    }
}

/// The built-in `ftrace:kernel_stack` event that the `stacktrace` trigger writes: the
/// calling thread's return addresses (ours are user-space stacks, in the kernel's entry).
pub(crate) struct StackEvent;

impl EventClass for StackEvent {
    fn system(&self) -> &str {
        "ftrace"
    }
    fn name(&self) -> &str {
        "kernel_stack"
    }
    fn fields(&self) -> Vec<FieldDesc> {
        vec![
            FieldDesc {
                name: "size".into(),
                c_type: "int".into(),
                offset: 8,
                size: 4,
                signed: true,
                kind: FieldKind::Int,
            },
            FieldDesc {
                name: "caller".into(),
                c_type: "unsigned long[8]".into(),
                offset: 16,
                size: 64,
                signed: false,
                kind: FieldKind::IntArray {
                    elem_size: 8,
                    len: 8,
                },
            },
        ]
    }
    fn print_fmt(&self, _fields: &[FieldDesc]) -> String {
        // Eight conversions in three literals, as the kernel's own format file has them.
        let line = "\\t=> %ps\\n";
        let literals = [3, 3, 2].map(|n| format!("\"{}\"", line.repeat(n)));
        let args: Vec<String> = (0..8)
            .map(|i| format!("(void *)REC->caller[{i}]"))
            .collect();
        format!("{}, {}", literals.join(" "), args.join(", "))
    }
    fn attach(&self, _file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        Err(Errno::EPERM)
    }
}

/// The built-in `ftrace:user_stack` event that the `userstacktrace` option writes: the
/// writer's process id and the first eight return addresses of its stack, laid out as the
/// kernel's `userstack_entry` (a 0 address ends the list).
pub(crate) struct UserStackEvent;

impl EventClass for UserStackEvent {
    fn system(&self) -> &str {
        "ftrace"
    }
    fn name(&self) -> &str {
        "user_stack"
    }
    fn fields(&self) -> Vec<FieldDesc> {
        let mut fields = StackEvent.fields();
        fields[0] = FieldDesc {
            name: "tgid".into(),
            c_type: "unsigned int".into(),
            offset: 8,
            size: 4,
            signed: false,
            kind: FieldKind::Int,
        };
        fields
    }
    fn print_fmt(&self, fields: &[FieldDesc]) -> String {
        StackEvent.print_fmt(fields)
    }
    fn attach(&self, _file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        Err(Errno::EPERM)
    }
}
