//! Events defined at run time by another crate: the API event sources outside `ustrace`
//! (the `tracing` bridge, `ustrace-tracing`) use to become ordinary events.
//!
//! A source describes the record once (fields with their C types and offsets, a print
//! format, optionally its own line renderer) and [`RuntimeEvent::register`] makes it an
//! event like any other: an id, a `format` file, a line in `available_events`, an event file
//! in every instance with `enable`, `filter` and `trigger`. The source then writes records
//! itself:
//!
//! ```text
//!  producer ── is_enabled(): one relaxed load ──> off: nothing
//!     │ on
//!     ▼
//!  emit(len, fill) ── RCU list of the event files that are attached (one per instance
//!     that enabled the event or holds it in soft mode) ──> EventFile::wants_record
//!     ──> EventFile::record(len, fill): filters, triggers, ring buffer, as for any event
//! ```
//!
//! Enabling an event in an instance attaches its file to that list (as a static event's
//! probe is attached to its tracepoint) and then calls the source's change hook, so a source
//! with a cache of its own (`tracing`'s callsite interest) can refresh it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use ustrace_ctl::vfs::Errno;

use crate::event::{registry, Attachment, EventClass, EventId, FieldDesc};
use crate::event_file::EventFile;
use crate::rcu::RcuCell;
use crate::trace::tracing;

/// Renders a record's line text (after `name: `) for events whose fields a print format
/// cannot show well; returns false to fall back to the print format.
pub type Renderer = Box<dyn Fn(&[u8], &mut String) -> bool + Send + Sync>;

/// Called after the set of instances recording an event changed.
pub type ChangeHook = Box<dyn Fn() + Send + Sync>;

/// What a source says about an event it registers.
pub struct RuntimeEventDef {
    /// The system (the `events/` directory the event lives in).
    pub system: String,
    /// The event's name within its system.
    pub name: String,
    /// The event's own fields, offsets from the record start (the common header is 8 bytes).
    pub fields: Vec<FieldDesc>,
    /// The `print fmt:` text of the `format` file.
    pub print_fmt: String,
    /// Renders the line text instead of the print format, where given.
    pub render: Option<Renderer>,
    /// Told when the set of instances recording the event changes (e.g. to rebuild a
    /// `tracing` callsite's interest).
    pub on_change: Option<ChangeHook>,
}

/// A registered run-time event; the source keeps it to test and write records.
pub struct RuntimeEvent {
    id: EventId,
    class: Arc<RuntimeClass>,
}

struct RuntimeClass {
    def: RuntimeEventDef,
    /// How many event files are attached: the word the producer tests.
    attached: AtomicUsize,
    /// The attached files, for the producer.
    files: RcuCell<Vec<Arc<EventFile>>>,
    /// The same list, for writers (attach and detach), which it serializes.
    control: Mutex<Vec<Arc<EventFile>>>,
    /// This class, for the attachments it hands out.
    me: Weak<RuntimeClass>,
}

impl RuntimeEvent {
    /// Registers the event and gives every instance a file for it. `EEXIST` when the
    /// system already has an event of that name.
    pub fn register(def: RuntimeEventDef) -> Result<RuntimeEvent, Errno> {
        let class = Arc::new_cyclic(|me| RuntimeClass {
            def,
            attached: AtomicUsize::new(0),
            files: RcuCell::empty(),
            control: Mutex::new(Vec::new()),
            me: me.clone(),
        });
        let event = registry().add(class.clone())?;
        tracing().add_event(event.clone());
        Ok(RuntimeEvent {
            id: event.id,
            class,
        })
    }

    /// The event's id (its `id` file).
    pub fn id(&self) -> EventId {
        self.id
    }

    /// The event's system.
    pub fn system(&self) -> &str {
        &self.class.def.system
    }

    /// The event's name.
    pub fn name(&self) -> &str {
        &self.class.def.name
    }

    /// Whether any instance records the event (or holds it for triggers): one relaxed load.
    #[inline(always)]
    pub fn is_enabled(&self) -> bool {
        self.class.attached.load(Ordering::Relaxed) != 0
    }

    /// Writes one record of `len` bytes (common header included) into every instance that
    /// records the event; `fill` writes the fields after the header, once per instance.
    /// No lock, no allocation.
    #[inline]
    pub fn emit(&self, len: usize, fill: impl Fn(&mut [u8])) {
        let guard = crate::rcu::read_lock();
        let Some(files) = self.class.files.get(&guard) else {
            return;
        };
        for file in files {
            if file.wants_record() {
                file.record(len, &fill);
            }
        }
    }
}

/// Detaches one instance's file from the event.
struct Attached {
    class: Weak<RuntimeClass>,
    file: Weak<EventFile>,
}

impl Attachment for Attached {
    fn detach(self: Box<Self>) {
        let Some(class) = self.class.upgrade() else {
            return;
        };
        {
            let mut list = class.control.lock().unwrap_or_else(|e| e.into_inner());
            list.retain(|f| !std::ptr::eq(Arc::as_ptr(f), self.file.as_ptr()));
            class.attached.store(list.len(), Ordering::Relaxed);
            let published = (!list.is_empty()).then(|| list.clone());
            class.files.replace(published);
        }
        if let Some(hook) = &class.def.on_change {
            hook();
        }
    }
}

impl EventClass for RuntimeClass {
    fn system(&self) -> &str {
        &self.def.system
    }
    fn name(&self) -> &str {
        &self.def.name
    }
    fn fields(&self) -> Vec<FieldDesc> {
        self.def.fields.clone()
    }
    fn print_fmt(&self, _fields: &[FieldDesc]) -> String {
        self.def.print_fmt.clone()
    }
    fn render_line(&self, record: &[u8], out: &mut String) -> bool {
        match &self.def.render {
            Some(render) => render(record, out),
            None => false,
        }
    }
    fn attach(&self, file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        let weak_file = Arc::downgrade(&file);
        {
            let mut list = self.control.lock().unwrap_or_else(|e| e.into_inner());
            list.push(file);
            // Published before the count rises, so a producer that sees the count finds
            // the file.
            self.files.replace(Some(list.clone()));
            self.attached.store(list.len(), Ordering::Relaxed);
        }
        if let Some(hook) = &self.def.on_change {
            hook();
        }
        Ok(Box::new(Attached {
            class: self.me.clone(),
            file: weak_file,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::FieldKind;
    use std::sync::atomic::AtomicUsize;

    static CHANGES: AtomicUsize = AtomicUsize::new(0);

    /// The trace lines of an instance.
    fn lines(instance: &crate::trace::Instance) -> usize {
        use ustrace_ctl::vfs::{FileSystem, OpenFlags};
        let path = format!("instances/{}/trace", instance.name);
        let mut file = crate::tracefs().open(&path, OpenFlags::READ).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = file.read(&mut buf, None).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&out);
        text.lines().filter(|l| !l.starts_with('#')).count()
    }

    #[test]
    fn an_instance_that_enables_the_event_gets_its_records() {
        let event = RuntimeEvent::register(RuntimeEventDef {
            system: "rt_test".into(),
            name: "one".into(),
            fields: vec![FieldDesc {
                name: "v".into(),
                c_type: "u64".into(),
                offset: 8,
                size: 8,
                signed: false,
                kind: FieldKind::Int,
            }],
            print_fmt: "\"v=%llu\", REC->v".into(),
            render: None,
            on_change: Some(Box::new(|| {
                CHANGES.fetch_add(1, Ordering::SeqCst);
            })),
        })
        .unwrap();
        let write = |v: u64| {
            event.emit(16, |rec| rec[8..16].copy_from_slice(&v.to_ne_bytes()));
        };
        let on = tracing().create_instance("rt_test_on").unwrap();
        let off = tracing().create_instance("rt_test_off").unwrap();
        assert!(!event.is_enabled());
        write(1);
        let file = on.file(event.id()).unwrap();
        file.set_enabled(true).unwrap();
        assert!(event.is_enabled());
        assert_eq!(CHANGES.load(Ordering::SeqCst), 1);
        write(2);
        file.set_enabled(false).unwrap();
        assert!(!event.is_enabled());
        assert_eq!(CHANGES.load(Ordering::SeqCst), 2);
        write(3);
        assert_eq!(lines(&on), 1);
        assert_eq!(lines(&off), 0);
        assert_eq!(
            RuntimeEvent::register(RuntimeEventDef {
                system: "rt_test".into(),
                name: "one".into(),
                fields: Vec::new(),
                print_fmt: "\"\"".into(),
                render: None,
                on_change: None,
            })
            .err(),
            Some(Errno::EEXIST)
        );
        drop((on, off));
        tracing().remove_instance("rt_test_on").unwrap();
        tracing().remove_instance("rt_test_off").unwrap();
    }
}
