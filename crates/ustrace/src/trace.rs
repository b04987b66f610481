//! Trace instances: a ring buffer with its own event states, options and error log.
//!
//! The top-level tracefs directory is one instance and `instances/NAME` directories are
//! others, each fully independent, as on the kernel. An instance keeps one [`EventFile`] per
//! event — the per-instance state the kernel keeps in `struct trace_event_file` — and the
//! event's probe on the tracepoint records into that instance's buffer.
//!
//! The hot path is [`EventFile::record`]: read the file's flags (one relaxed load), reserve in
//! the buffer of the current CPU, write the common header and the fields, commit. Everything
//! else here is control: enabling, soft mode, options, instance lifetime.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use ustrace_ctl::vfs::Errno;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

use crate::event::{registry, Attachment, Event, EventId};
use crate::thread;

/// Default buffer size per CPU, as the kernel's default `buffer_size_kb` (1410 KiB here is
/// what the kernel shows for its 1.4 MB default; we keep a smaller, round default).
pub const DEFAULT_BUFFER_KB: usize = 1408;

/// `EventFile::flags` bits.
mod flag {
    /// Recording is wanted (the `enable` file reads 1).
    pub const ENABLED: u32 = 1 << 0;
    /// Probes run for triggers but records are not kept (`enable` reads `0*`).
    pub const SOFT_DISABLED: u32 = 1 << 1;
    /// Something is attached because of soft mode (triggers of other events).
    pub const SOFT_MODE: u32 = 1 << 2;
}

/// One event in one instance: whether it records, and the probe that records it.
pub struct EventFile {
    pub event: Arc<Event>,
    id: u16,
    flags: AtomicU32,
    shared: Arc<Shared>,
    control: Mutex<Control>,
}

#[derive(Default)]
struct Control {
    attachment: Option<Box<dyn Attachment>>,
    /// How many triggers hold this event in soft mode.
    soft_refs: usize,
}

/// What an instance's event files need on the hot path.
pub(crate) struct Shared {
    pub(crate) buffer: RingBuffer,
    pub(crate) record_cmd: AtomicBool,
}

impl EventFile {
    /// Whether the probe should build a record at all: false while soft-disabled.
    #[inline(always)]
    pub fn wants_record(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & flag::SOFT_DISABLED == 0
    }

    /// Reserves `len` bytes in the instance's buffer, writes the common header, lets `fill`
    /// write the fields, and commits. No lock, no allocation, no syscall.
    #[inline(always)]
    pub fn record(&self, len: usize, fill: impl FnOnce(&mut [u8])) {
        let pid = thread::current_tid(&self.shared.record_cmd);
        let Some(mut slot) = self.shared.buffer.reserve(len) else {
            return;
        };
        let record: &mut [u8] = &mut slot;
        record[0..2].copy_from_slice(&self.id.to_ne_bytes());
        record[2] = 0;
        record[3] = 0;
        record[4..8].copy_from_slice(&pid.to_ne_bytes());
        fill(record);
        slot.commit();
    }

    /// Whether the event is enabled, as `enable` shows it: `0`, `1`, `0*`, `1*`.
    pub fn enable_text(&self) -> &'static str {
        let flags = self.flags.load(Ordering::Relaxed);
        match (flags & flag::ENABLED != 0, flags & flag::SOFT_MODE != 0) {
            (false, false) => "0\n",
            (true, false) => "1\n",
            (false, true) => "0*\n",
            (true, true) => "1*\n",
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & flag::ENABLED != 0
    }

    /// Turns recording on or off (the `enable` file).
    pub fn set_enabled(self: &Arc<Self>, on: bool) -> Result<(), Errno> {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        if on {
            self.ensure_attached(&mut control)?;
            self.flags.fetch_or(flag::ENABLED, Ordering::Relaxed);
            self.flags
                .fetch_and(!flag::SOFT_DISABLED, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!flag::ENABLED, Ordering::Relaxed);
            if control.soft_refs > 0 {
                self.flags.fetch_or(flag::SOFT_DISABLED, Ordering::Relaxed);
            } else if let Some(attachment) = control.attachment.take() {
                attachment.detach();
            }
        }
        Ok(())
    }

    /// Holds the event attached without recording (soft mode), for triggers that enable or
    /// disable it, or that must run while it is off.
    pub fn soft_mode_get(self: &Arc<Self>) -> Result<(), Errno> {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        self.ensure_attached(&mut control)?;
        control.soft_refs += 1;
        self.flags.fetch_or(flag::SOFT_MODE, Ordering::Relaxed);
        if self.flags.load(Ordering::Relaxed) & flag::ENABLED == 0 {
            self.flags.fetch_or(flag::SOFT_DISABLED, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Releases one soft-mode hold; detaches when nothing needs the probe any more.
    pub fn soft_mode_put(&self) {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        control.soft_refs = control.soft_refs.saturating_sub(1);
        if control.soft_refs == 0 {
            self.flags
                .fetch_and(!(flag::SOFT_MODE | flag::SOFT_DISABLED), Ordering::Relaxed);
            if self.flags.load(Ordering::Relaxed) & flag::ENABLED == 0 {
                if let Some(attachment) = control.attachment.take() {
                    attachment.detach();
                }
            }
        }
    }

    /// Soft-disables or re-enables recording while staying attached (what an
    /// `enable_event`/`disable_event` trigger flips).
    pub fn set_soft_disabled(&self, disabled: bool) {
        if disabled {
            self.flags.fetch_or(flag::SOFT_DISABLED, Ordering::Relaxed);
        } else {
            self.flags
                .fetch_and(!flag::SOFT_DISABLED, Ordering::Relaxed);
        }
    }

    fn ensure_attached(self: &Arc<Self>, control: &mut Control) -> Result<(), Errno> {
        if control.attachment.is_none() {
            control.attachment = Some(self.event.class.attach(self.clone())?);
        }
        Ok(())
    }

    fn detach_all(&self) {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        self.flags.store(0, Ordering::Relaxed);
        control.soft_refs = 0;
        if let Some(attachment) = control.attachment.take() {
            attachment.detach();
        }
    }
}

/// One entry of `error_log`.
struct LoggedError {
    text: String,
}

/// The kernel keeps the last few errors per instance.
const ERROR_LOG_MAX: usize = 16;

/// A trace instance.
pub struct Instance {
    /// Empty for the top-level instance.
    pub name: String,
    pub(crate) shared: Arc<Shared>,
    files: RwLock<BTreeMap<EventId, Arc<EventFile>>>,
    pub(crate) snapshot: Mutex<Option<RingBuffer>>,
    pub options: crate::options::Options,
    error_log: Mutex<VecDeque<LoggedError>>,
    /// Open readers that make `rmdir` fail with `EBUSY`.
    pub(crate) users: AtomicUsize,
}

impl Instance {
    pub(crate) fn new(name: &str) -> std::io::Result<Arc<Instance>> {
        let nr_cpus = ustrace_ringbuf::cpu::possible_cpus();
        let buffer = RingBuffer::new(Config {
            nr_cpus,
            size_per_cpu: DEFAULT_BUFFER_KB * 1024,
            overwrite: true,
            clock: Clock::Local,
            name: if name.is_empty() {
                "top".into()
            } else {
                name.into()
            },
        })?;
        let shared = Arc::new(Shared {
            buffer,
            record_cmd: AtomicBool::new(true),
        });
        let instance = Arc::new(Instance {
            name: name.to_string(),
            shared,
            files: RwLock::new(BTreeMap::new()),
            snapshot: Mutex::new(None),
            options: crate::options::Options::new(),
            error_log: Mutex::new(VecDeque::new()),
            users: AtomicUsize::new(0),
        });
        for event in registry().all() {
            instance.add_event(event);
        }
        Ok(instance)
    }

    pub fn buffer(&self) -> &RingBuffer {
        &self.shared.buffer
    }

    /// Gives this instance a file for a newly registered event.
    pub fn add_event(&self, event: Arc<Event>) {
        let file = Arc::new(EventFile {
            id: event.id.0,
            event: event.clone(),
            flags: AtomicU32::new(0),
            shared: self.shared.clone(),
            control: Mutex::new(Control::default()),
        });
        self.files
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(event.id, file);
    }

    /// Drops the file of an event that is going away; it must be disabled.
    pub fn remove_event(&self, id: EventId) {
        if let Some(file) = self
            .files
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
        {
            file.detach_all();
        }
    }

    pub fn file(&self, id: EventId) -> Option<Arc<EventFile>> {
        self.files
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Every event file, in id order.
    pub fn files(&self) -> Vec<Arc<EventFile>> {
        self.files
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The files of `system` (all systems when `None`), events that cannot be enabled
    /// (`ftrace:*`) left out.
    pub fn files_of(&self, system: Option<&str>) -> Vec<Arc<EventFile>> {
        self.files()
            .into_iter()
            .filter(|f| f.event.system() != "ftrace")
            .filter(|f| system.is_none_or(|s| f.event.system() == s))
            .collect()
    }

    /// Appends an entry to `error_log`, as the kernel's `tracing_log_err`: a location, the
    /// message, the command, and a caret under byte `pos` of the command.
    pub fn log_error(&self, location: &str, message: &str, command: &str, pos: usize) {
        let ts = ustrace_ringbuf::clock::now(self.shared.buffer.clock());
        let text = format!(
            "[{:>5}.{:06}] {location}: error: {message}\n  Command: {command}\n{}^\n",
            ts / 1_000_000_000,
            (ts % 1_000_000_000) / 1000,
            " ".repeat(pos + "  Command: ".len())
        );
        let mut log = self.error_log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() == ERROR_LOG_MAX {
            log.pop_front();
        }
        log.push_back(LoggedError { text });
    }

    pub fn error_log_text(&self) -> String {
        let log = self.error_log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().map(|e| e.text.as_str()).collect()
    }

    pub fn clear_error_log(&self) {
        self.error_log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Disables every event and detaches every probe (before the instance goes away).
    fn shut_down(&self) {
        for file in self.files() {
            file.detach_all();
        }
    }
}

/// All instances of the process.
pub struct Tracing {
    top: Arc<Instance>,
    instances: RwLock<BTreeMap<String, Arc<Instance>>>,
}

/// The process's tracing state, created on first use.
pub fn tracing() -> &'static Tracing {
    static TRACING: OnceLock<Tracing> = OnceLock::new();
    TRACING.get_or_init(|| Tracing {
        top: Instance::new("").expect("cannot allocate the top-level trace buffer"),
        instances: RwLock::new(BTreeMap::new()),
    })
}

impl Tracing {
    pub fn top(&self) -> &Arc<Instance> {
        &self.top
    }

    pub fn instance(&self, name: &str) -> Option<Arc<Instance>> {
        self.instances
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    pub fn instance_names(&self) -> Vec<String> {
        self.instances
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Every instance, the top one first.
    pub fn all(&self) -> Vec<Arc<Instance>> {
        let mut all = vec![self.top.clone()];
        all.extend(
            self.instances
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned(),
        );
        all
    }

    /// `mkdir instances/NAME`.
    pub fn create_instance(&self, name: &str) -> Result<Arc<Instance>, Errno> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(Errno::EINVAL);
        }
        let mut instances = self.instances.write().unwrap_or_else(|e| e.into_inner());
        if instances.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let instance = Instance::new(name).map_err(|_| Errno::ENOMEM)?;
        instances.insert(name.to_string(), instance.clone());
        Ok(instance)
    }

    /// `rmdir instances/NAME`: `EBUSY` while a reader has one of its files open.
    pub fn remove_instance(&self, name: &str) -> Result<(), Errno> {
        let mut instances = self.instances.write().unwrap_or_else(|e| e.into_inner());
        let instance = instances.get(name).ok_or(Errno::ENOENT)?;
        if instance.users.load(Ordering::SeqCst) > 0 {
            return Err(Errno::EBUSY);
        }
        let instance = instances.remove(name).expect("present");
        drop(instances);
        instance.shut_down();
        crate::tracepoint::synchronize_unregister();
        Ok(())
    }

    /// Adds a file for a new event to every instance.
    pub fn add_event(&self, event: Arc<Event>) {
        for instance in self.all() {
            instance.add_event(event.clone());
        }
    }

    /// Removes an event's file from every instance.
    pub fn remove_event(&self, id: EventId) {
        for instance in self.all() {
            instance.remove_event(id);
        }
    }
}
