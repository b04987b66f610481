//! Trace instances: a ring buffer with its own event states, options and error log.
//!
//! The top-level tracefs directory is one instance and `instances/NAME` directories are
//! others, each fully independent, as on the kernel. An instance keeps one [`EventFile`] per
//! event — the per-instance state the kernel keeps in `struct trace_event_file`, in
//! [`crate::event_file`] with the record path — and the event's probe on the tracepoint
//! records into that instance's buffer. Everything here is control: the instances, their
//! files, options, pid lists, error log and lifetime.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use ustrace_ctl::vfs::Errno;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

use crate::buffers::{PidLists, Shared};
use crate::event::{registry, Event, EventId};

pub use crate::event_file::EventFile;

/// Default buffer size per CPU, as the kernel's default `buffer_size_kb` (1410 KiB here is
/// what the kernel shows for its 1.4 MB default; we keep a smaller, round default).
pub const DEFAULT_BUFFER_KB: usize = 1408;

/// The instance that owns `file`, while it lives.
pub fn instance_of(file: &EventFile) -> Option<Arc<Instance>> {
    file.owner.upgrade()?.downcast::<Instance>().ok()
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
    /// What each `events/SYS/filter` shows, by system.
    system_filters: Mutex<BTreeMap<String, String>>,
    /// This instance's `options/` and `trace_options`.
    pub options: crate::options::Options,
    error_log: Mutex<VecDeque<LoggedError>>,
    /// Open readers that make `rmdir` fail with `EBUSY`.
    pub(crate) users: AtomicUsize,
    /// Serializes changes of the pid lists.
    pid_lock: Mutex<()>,
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
        let shared = Arc::new(Shared::new(buffer, nr_cpus));
        let instance = Arc::new(Instance {
            name: name.to_string(),
            shared,
            files: RwLock::new(BTreeMap::new()),
            system_filters: Mutex::new(BTreeMap::new()),
            options: crate::options::Options::new(),
            error_log: Mutex::new(VecDeque::new()),
            users: AtomicUsize::new(0),
            pid_lock: Mutex::new(()),
        });
        for event in registry().all() {
            instance.add_event(event);
        }
        Ok(instance)
    }

    /// The instance's per-CPU ring buffer.
    pub fn buffer(&self) -> &RingBuffer {
        &self.shared.buffer
    }

    /// When the buffer was last cleared (0 if never), in the buffer's clock.
    pub fn time_start(&self) -> u64 {
        self.shared.time_start.load(Ordering::Relaxed)
    }

    /// Clears every CPU's buffer (`echo > trace`, a new clock) and notes when, as the
    /// kernel's `tracing_reset_online_cpus`.
    pub fn reset_buffer(&self) {
        let now = ustrace_ringbuf::clock::now(self.shared.buffer.clock());
        self.shared.time_start.store(now, Ordering::Relaxed);
        self.shared.buffer.reset();
    }

    /// Tells every event file what the `stacktrace` and `userstacktrace` options now say.
    pub(crate) fn apply_stack_options(&self) {
        let kernel = self.options.get("stacktrace");
        let user = self.options.get("userstacktrace");
        for file in self.files() {
            file.set_stack_options(kernel, user);
        }
    }

    /// Gives this instance a file for a newly registered event.
    pub fn add_event(self: &Arc<Self>, event: Arc<Event>) {
        let pid_filter = self.shared.pids.is_set();
        let owner: Arc<dyn std::any::Any + Send + Sync> = self.clone();
        let file = Arc::new(EventFile::new(
            event.clone(),
            Arc::downgrade(&owner),
            self.shared.clone(),
        ));
        file.set_pid_filter(pid_filter);
        file.set_cpu_masked(!self.shared.cpumask.is_full());
        self.files
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(event.id, file.clone());
        // After the insert, so an option written meanwhile reaches this file either way.
        file.set_stack_options(
            self.options.get("stacktrace"),
            self.options.get("userstacktrace"),
        );
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

    /// The instance's event file for event `id`.
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
    /// Appends an already formatted entry (`LOCATION: error: …` lines) to `error_log`,
    /// stamped with the time.
    pub fn log_error_text(&self, text: &str) {
        let ts = ustrace_ringbuf::clock::now(self.shared.buffer.clock());
        let text = format!("[{}] {text}", crate::buffers::Seconds(ts));
        let mut log = self.error_log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() == ERROR_LOG_MAX {
            log.pop_front();
        }
        log.push_back(LoggedError { text });
    }

    /// Appends an entry in the kernel's `tracing_log_err` layout: a location, the message,
    /// the command, and a caret under byte `pos` of the command. The command ends at its
    /// first NUL, as the kernel's C string does.
    pub fn log_error(&self, location: &str, message: &str, command: &str, pos: usize) {
        const PREFIX: &str = "  Command: ";
        let command = command.split('\0').next().unwrap_or("");
        self.log_error_text(&format!(
            "{location}: error: {message}\n{PREFIX}{command}\n{}^\n",
            " ".repeat(pos + PREFIX.len())
        ));
    }

    /// What `events/SYS/filter` shows after the header (`None`: `none`).
    pub(crate) fn system_filter_text(&self, system: &str) -> Option<String> {
        self.system_filters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(system)
            .cloned()
    }

    pub(crate) fn set_system_filter_text(&self, system: &str, text: Option<String>) {
        let mut map = self
            .system_filters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match text {
            Some(text) => map.insert(system.to_string(), text),
            None => map.remove(system),
        };
    }

    /// Applies a `tracing_cpumask` write and tells every event file whether to check it.
    pub(crate) fn write_cpumask(&self, data: &[u8]) -> Result<(), Errno> {
        let _serialize = self.pid_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.cpumask.write(data)?;
        let masked = !self.shared.cpumask.is_full();
        for file in self.files() {
            file.set_cpu_masked(masked);
        }
        Ok(())
    }

    /// The pid lists (`set_event_pid`, `set_event_notrace_pid`).
    pub fn pids(&self) -> PidLists {
        let guard = crate::rcu::read_lock();
        self.shared.pids.get(&guard).cloned().unwrap_or_default()
    }

    /// Changes the pid lists and tells every event file whether to check them.
    pub(crate) fn update_pids(&self, change: impl FnOnce(&mut PidLists)) {
        let _serialize = self.pid_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut lists = self.pids();
        change(&mut lists);
        let on = !lists.is_empty();
        if !on {
            for file in self.files() {
                file.set_pid_filter(false);
            }
        }
        self.shared
            .pids
            .replace(if on { Some(lists) } else { None });
        if on {
            for file in self.files() {
                file.set_pid_filter(true);
            }
        }
    }

    /// What `error_log` shows.
    pub fn error_log_text(&self) -> String {
        let log = self.error_log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().map(|e| e.text.as_str()).collect()
    }

    /// Empties `error_log`, as a truncating open of it does.
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

static TRACING: OnceLock<Tracing> = OnceLock::new();

/// The longest instance name, in bytes (the kernel's `NAME_MAX`).
const NAME_MAX: usize = 255;

/// The tracing state if it was ever created (never creates it; safe after `fork`).
pub(crate) fn existing_tracing() -> Option<&'static Tracing> {
    TRACING.get()
}

/// The process's tracing state, created on first use.
///
/// # Panics
/// If the top-level buffer cannot be allocated (no memory, no file descriptor left);
/// [`try_tracing`] reports that as an error instead, and is what the library itself uses.
pub fn tracing() -> &'static Tracing {
    try_tracing().unwrap_or_else(|e| panic!("cannot allocate the top-level trace buffer: {e}"))
}

/// The process's tracing state, created on first use; an error if the top-level buffer
/// cannot be allocated now (a later call tries again).
pub fn try_tracing() -> std::io::Result<&'static Tracing> {
    if let Some(tracing) = TRACING.get() {
        return Ok(tracing);
    }
    // Two threads may both get here: one's instance is kept, the other's dropped unused.
    let mut top = Some(Instance::new("")?);
    Ok(TRACING.get_or_init(|| Tracing {
        top: top.take().expect("taken once"),
        instances: RwLock::new(BTreeMap::new()),
    }))
}

impl Tracing {
    /// The top-level instance (the tracefs root).
    pub fn top(&self) -> &Arc<Instance> {
        &self.top
    }

    /// The instance `instances/NAME`.
    pub fn instance(&self, name: &str) -> Option<Arc<Instance>> {
        self.instances
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// The names of the instances under `instances/`.
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

    /// Every instance, without waiting for a lock another thread may hold (after `fork`,
    /// that thread no longer exists): the top one always, others when the list is free.
    pub(crate) fn all_nonblocking(&self) -> Vec<Arc<Instance>> {
        let mut all = vec![self.top.clone()];
        if let Ok(instances) = self.instances.try_read() {
            all.extend(instances.values().cloned());
        }
        all
    }

    /// `mkdir instances/NAME`.
    pub fn create_instance(&self, name: &str) -> Result<Arc<Instance>, Errno> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(Errno::EINVAL);
        }
        // A directory name, so the VFS's NAME_MAX limit; the kernel takes any other bytes
        // (spaces, `*`, `:`, newlines; checked on 6.18).
        if name.len() > NAME_MAX {
            return Err(Errno(libc::ENAMETOOLONG));
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
