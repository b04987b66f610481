//! The registry of events: ids, lookup by name, and compiled print formats.
//!
//! Ids are handed out once per process: the kernel's fixed id for `ftrace:print` (5), then
//! the events defined with `trace_event!` in (system, name) order from 1000 on, so that ids
//! are stable between runs of the same program, then dynamic events as they are created.

use std::sync::{Arc, OnceLock, RwLock};

use super::field::{common_fields, FieldDesc};
use super::print_fmt::PrintFmt;
use super::{EventClass, MarkerEvent, StackEvent, UserStackEvent, EVENTS};
use crate::event_file::{Attachment, EventFile, EventSource};
use ustrace_ctl::vfs::Errno;

pub use super::id::{EventId, MARKER_ID, STACK_ID, USER_STACK_ID};

const FIRST_STATIC_ID: u16 = 1000;

/// A registered event.
pub struct Event {
    /// The id records carry (`common_type`) and the `id` file shows.
    pub id: EventId,
    /// What the event is: names, layout, print format, how it attaches.
    pub class: Arc<dyn EventClass>,
    /// The event's own fields (not the common ones).
    pub fields: Vec<FieldDesc>,
    /// The `print fmt:` text of the `format` file.
    pub print_fmt: String,
    /// What trace lines render.
    pub display: PrintFmt,
}

impl Event {
    fn new(id: EventId, class: Arc<dyn EventClass>) -> Arc<Event> {
        let fields = class.fields();
        let print_fmt = class.print_fmt(&fields);
        // A format we cannot evaluate still leaves the event usable: its lines print the
        // marker libtraceevent prints, unless the class renders them itself.
        let display = PrintFmt::compile(&class.display_fmt(&fields), &fields)
            .or_else(|_| PrintFmt::compile("\"[FAILED TO PARSE]\"", &[]))
            .expect("a literal format compiles");
        Arc::new(Event {
            id,
            class,
            fields,
            print_fmt,
            display,
        })
    }

    /// The system (`kv` in `kv:get`).
    pub fn system(&self) -> &str {
        self.class.system()
    }

    /// The event's name (`get` in `kv:get`).
    pub fn name(&self) -> &str {
        self.class.name()
    }

    /// The crate that declared the event (`set_event`'s `:mod:`), if any.
    pub fn module(&self) -> Option<&str> {
        self.class.module()
    }

    /// Common fields followed by the event's own: what filters may name.
    pub fn all_fields(&self) -> Vec<FieldDesc> {
        let mut all = common_fields();
        all.extend(self.fields.iter().cloned());
        all
    }

    /// The text of the event's `format` file, laid out as the kernel's.
    pub fn format_file(&self) -> String {
        let mut out = format!("name: {}\nID: {}\nformat:\n", self.name(), self.id.0);
        for field in common_fields() {
            out.push_str(&field.format_line());
            out.push('\n');
        }
        out.push('\n');
        for field in &self.fields {
            out.push_str(&field.format_line());
            out.push('\n');
        }
        out.push_str(&format!("\nprint fmt: {}\n", self.print_fmt));
        out
    }
}

impl EventSource for Event {
    fn id(&self) -> EventId {
        self.id
    }
    fn system(&self) -> &str {
        Event::system(self)
    }
    fn name(&self) -> &str {
        Event::name(self)
    }
    fn module(&self) -> Option<&str> {
        Event::module(self)
    }
    fn all_fields(&self) -> Vec<FieldDesc> {
        Event::all_fields(self)
    }
    fn format_file(&self) -> String {
        Event::format_file(self)
    }
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        self.class.attach(file)
    }
}

/// All events of the process.
pub struct Registry {
    events: RwLock<Vec<Arc<Event>>>,
}

/// The process's event registry, built on first use from the events linked into it.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut events = vec![
            Event::new(STACK_ID, Arc::new(StackEvent)),
            Event::new(MARKER_ID, Arc::new(MarkerEvent)),
            Event::new(USER_STACK_ID, Arc::new(UserStackEvent)),
            Event::new(
                crate::ftrace::events::FUNCTION_ID,
                Arc::new(crate::ftrace::events::FtraceRecord::Function),
            ),
            Event::new(
                crate::ftrace::events::GRAPH_ENTRY_ID,
                Arc::new(crate::ftrace::events::FtraceRecord::GraphEntry),
            ),
            Event::new(
                crate::ftrace::events::GRAPH_EXIT_ID,
                Arc::new(crate::ftrace::events::FtraceRecord::GraphExit),
            ),
        ];
        let mut statics: Vec<_> = EVENTS.iter().copied().collect();
        statics.sort_by_key(|e| (e.system, e.name));
        statics.dedup_by_key(|e| (e.system, e.name));
        for (i, def) in statics.into_iter().enumerate() {
            let id = EventId(FIRST_STATIC_ID + i as u16);
            events.push(Event::new(id, Arc::new(StaticRef(def))));
        }
        Registry {
            events: RwLock::new(events),
        }
    })
}

/// A `&'static StaticEvent` as an owned class.
struct StaticRef(&'static super::StaticEvent);

impl EventClass for StaticRef {
    fn system(&self) -> &str {
        self.0.system
    }
    fn name(&self) -> &str {
        self.0.name
    }
    fn module(&self) -> Option<&str> {
        self.0.module()
    }
    fn fields(&self) -> Vec<FieldDesc> {
        self.0.fields()
    }
    fn print_fmt(&self, fields: &[FieldDesc]) -> String {
        self.0.print_fmt(fields)
    }
    fn attach(
        &self,
        file: Arc<crate::event_file::EventFile>,
    ) -> Result<Box<dyn super::Attachment>, ustrace_ctl::vfs::Errno> {
        self.0.attach(file)
    }
}

impl Registry {
    /// Every event, in id order.
    pub fn all(&self) -> Vec<Arc<Event>> {
        self.events
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The event with this id.
    pub fn by_id(&self, id: EventId) -> Option<Arc<Event>> {
        self.all().into_iter().find(|e| e.id == id)
    }

    /// The event `system:name`.
    pub fn find(&self, system: &str, name: &str) -> Option<Arc<Event>> {
        self.all()
            .into_iter()
            .find(|e| e.system() == system && e.name() == name)
    }

    /// Adds an event created at run time; fails if the name is taken.
    pub fn add(&self, class: Arc<dyn EventClass>) -> Result<Arc<Event>, ustrace_ctl::vfs::Errno> {
        let mut events = self.events.write().unwrap_or_else(|e| e.into_inner());
        if events
            .iter()
            .any(|e| e.system() == class.system() && e.name() == class.name())
        {
            return Err(ustrace_ctl::vfs::Errno::EEXIST);
        }
        // Never just above the built-in ftrace ids, even with no static events: trace-cmd
        // takes `user_stack`'s id + 1 for its made-up `ftrace:blktrace` format, so an event
        // there would be reported as blktrace.
        let next = events
            .iter()
            .map(|e| e.id.0)
            .max()
            .unwrap_or(FIRST_STATIC_ID)
            .max(FIRST_STATIC_ID - 1)
            + 1;
        let event = Event::new(EventId(next), class);
        events.push(event.clone());
        Ok(event)
    }

    /// Removes an event created at run time.
    pub fn remove(&self, id: EventId) -> Option<Arc<Event>> {
        let mut events = self.events.write().unwrap_or_else(|e| e.into_inner());
        let at = events.iter().position(|e| e.id == id)?;
        Some(events.remove(at))
    }

    /// The `available_events` text: `system:event` lines.
    pub fn available_events(&self) -> String {
        let mut lines: Vec<String> = self
            .all()
            .iter()
            .filter(|e| e.system() != "ftrace")
            .map(|e| format!("{}:{}\n", e.system(), e.name()))
            .collect();
        lines.sort();
        lines.concat()
    }
}
