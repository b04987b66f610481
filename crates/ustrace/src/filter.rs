//! Event filters (events.rst 5): the `filter` files, subsystem filters and pid filtering.
//!
//! Pid filtering follows the kernel's tasks, which are threads: with `event-fork`, a thread
//! created by a listed thread joins `set_event_pid` before its start routine runs, and a
//! listed thread leaves the list when it exits (a forked child joins in the child, as
//! before). Thread creation is seen by wrapping `pthread_create` (see [`pthread_create`]).
//!
//! The language itself is `ustrace_filter`: a write compiles once into a flat program that
//! runs on the record without a lock or an allocation; that program is the filter stage
//! ([`crate::stage::filter`]), which sees only the record. This module is the command floor
//! above it: it binds programs to event files, applies subsystem filters and the pid lists
//! to an instance, keeps the text each `filter` file shows, and logs errors as the kernel does.
//!
//! A rejected write removes the event's filter, as the kernel's does (checked on 6.18 with
//! recorded events): every event passes from then on, and the file shows the error. Only a
//! write of a page or more is refused before anything changes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::event_file::{EventFile, EventSource};
use crate::stage::filter::compile;
use crate::trace::Instance;
use ustrace_ctl::vfs::Errno;

pub use crate::buffers::PidLists;
pub use crate::stage::filter::Compiled;

/// What `filter` shows for an event with none.
pub const NONE: &str = "none\n";

/// The header the kernel shows at the top of a subsystem `filter` file.
pub const SYSTEM_HEADER: &str = "### global filter ###\n\
# Use this to set filters for multiple events.\n\
# Only events with the given fields will be affected.\n\
# If no events are modified, an error message will be displayed here\n";

/// Compiles a trigger's `if` filter; an error is logged as the kernel logs it.
pub fn compile_for(
    instance: &Instance,
    event: &dyn EventSource,
    text: &str,
) -> Result<Compiled, Errno> {
    compile(&event.all_fields(), text)
        .map(Compiled::new)
        .map_err(|e| {
            log(instance, &e, text);
            Errno(e.errno())
        })
}

fn log(instance: &Instance, error: &ustrace_filter::FilterError, text: &str) {
    // The kernel logs every parse failure (one without a known kind as `error: Error`,
    // caret at 0), except a write too long to take at all. The entry's command is the text
    // as the kernel keeps it (up to a NUL, trailing blanks removed), which the filter crate
    // knows.
    if error.is_write_too_long() {
        return;
    }
    let (first, rest) = error.error_log_entry(text);
    instance.log_error_text(&format!("{first}\n{rest}\n"));
}

/// What an event's `filter` file shows.
pub fn text(file: &EventFile) -> String {
    file.filter_text
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| NONE.into())
}

/// Applies one write to an event's `filter` file. `text` is the whole write, untrimmed:
/// its length decides whether it is taken at all.
pub fn write_event(instance: &Instance, file: &EventFile, text: &str) -> Result<(), Errno> {
    if ustrace_filter::is_clear(text) {
        file.set_filter(None, None);
        return Ok(());
    }
    match compile(&file.event.all_fields(), text) {
        Ok(program) => {
            let shown = format!("{}\n", program.text());
            file.set_filter(Some(Compiled::new(program)), Some(shown));
            Ok(())
        }
        // Refused on its size: the filter, its text and the log stay as they were.
        Err(error) if error.is_write_too_long() => Err(Errno(error.errno())),
        Err(error) => {
            log(instance, &error, text);
            // The previous program goes too (see the module docs); the file shows why.
            file.set_filter(None, Some(error.filter_file_text(text)));
            Err(Errno(error.errno()))
        }
    }
}

/// The text of `events/SYS/filter`.
pub fn system_text(instance: &Instance, system: &str) -> String {
    let shown = instance.system_filter_text(system);
    format!("{SYSTEM_HEADER}{}", shown.unwrap_or_else(|| NONE.into()))
}

/// Applies one write to `events/SYS/filter` (events.rst 5.4), `text` untrimmed: each event
/// of the system that has the fields takes the filter; each other one loses its own (it is
/// unfiltered, as on the kernel) and shows why not.
pub fn write_system(instance: &Instance, system: &str, text: &str) -> Result<(), Errno> {
    let files = instance.files_of(Some(system));
    if files.is_empty() {
        return Err(Errno::ENODEV);
    }
    // A write of a page or more is refused before any event is touched.
    if text.len() >= ustrace_filter::MAX_WRITE {
        return Err(Errno::EINVAL);
    }
    if ustrace_filter::is_clear(text) {
        for file in &files {
            file.set_filter(None, None);
        }
        instance.set_system_filter_text(system, None);
        return Ok(());
    }
    for file in &files {
        match compile(&file.event.all_fields(), text) {
            Ok(program) => {
                let shown = format!("{}\n", program.text());
                file.set_filter(Some(Compiled::new(program)), Some(shown));
            }
            Err(error) => {
                let error = error.for_subsystem();
                log(instance, &error, text);
                file.set_filter(None, Some(error.filter_file_text(text)));
            }
        }
    }
    // Once written, the kernel's subsystem file shows only its header; the write succeeds
    // even when no event took the filter (observed on 6.18).
    instance.set_system_filter_text(system, Some(String::new()));
    Ok(())
}

/// Parses the ids of a `set_event_pid` write; nothing is applied unless all parse.
pub fn parse_pids(data: &[u8]) -> Result<Vec<i32>, Errno> {
    let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
    text.split_whitespace()
        .map(|word| {
            word.parse::<u32>()
                .ok()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or(Errno::EINVAL)
        })
        .collect()
}

/// The text of a pid file: one id a line, in order.
pub fn pids_text(pids: &[i32]) -> String {
    pids.iter().map(|p| format!("{p}\n")).collect()
}

/// Applies a write to `set_event_pid` (`notrace` false) or `set_event_notrace_pid`.
pub fn write_pids(instance: &Arc<Instance>, notrace: bool, data: &[u8]) -> Result<(), Errno> {
    let new = parse_pids(data)?;
    install_fork_handlers();
    crate::thread::on_thread_exit(forget_exited_thread);
    if !notrace && !new.is_empty() {
        PID_LISTS_USED.store(true, Ordering::Relaxed);
    }
    instance.update_pids(|lists| {
        let list = if notrace {
            &mut lists.notrace
        } else {
            &mut lists.trace
        };
        list.extend(new);
        list.sort_unstable();
        list.dedup();
    });
    Ok(())
}

/// Set once some `set_event_pid` has held an id: until then thread creation and exit are
/// not looked at.
static PID_LISTS_USED: AtomicBool = AtomicBool::new(false);

/// The instances that follow the calling thread's children: `event-fork` on and the
/// thread in `set_event_pid`.
fn instances_following(tid: i32) -> Vec<std::sync::Weak<Instance>> {
    let Some(tracing) = crate::trace::existing_tracing() else {
        return Vec::new();
    };
    tracing
        .all()
        .iter()
        .filter(|i| i.options.get("event-fork") && i.pids().trace.binary_search(&tid).is_ok())
        .map(Arc::downgrade)
        .collect()
}

fn add_pid(instance: &Instance, tid: i32) {
    instance.update_pids(|lists| {
        if let Err(at) = lists.trace.binary_search(&tid) {
            lists.trace.insert(at, tid);
        }
    });
}

/// Takes an exited thread out of `set_event_pid` of the instances with `event-fork` on, as
/// the kernel does when a listed task exits; [`crate::thread`] calls it as a thread ends.
fn forget_exited_thread(tid: i32) {
    if !PID_LISTS_USED.load(Ordering::Relaxed) {
        return;
    }
    let Some(tracing) = crate::trace::existing_tracing() else {
        return;
    };
    for instance in tracing.all() {
        if instance.options.get("event-fork") && instance.pids().trace.binary_search(&tid).is_ok() {
            instance.update_pids(|lists| lists.trace.retain(|&t| t != tid));
        }
    }
}

type StartRoutine = extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartRoutine,
    *mut libc::c_void,
) -> libc::c_int;

/// The C library's `pthread_create`, found once.
fn real_pthread_create() -> Option<PthreadCreate> {
    static REAL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let addr = *REAL.get_or_init(|| {
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name only looks a symbol up;
        // RTLD_NEXT finds the definition after this object's, the C library's.
        unsafe { libc::dlsym(libc::RTLD_NEXT, c"pthread_create".as_ptr()) as usize }
    });
    // SAFETY: a non-null result is the C library's pthread_create, of this type.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, PthreadCreate>(addr) })
}

/// What a followed thread starts with.
struct FollowedStart {
    start: StartRoutine,
    arg: *mut libc::c_void,
    instances: Vec<std::sync::Weak<Instance>>,
}

extern "C" fn followed_thread_start(data: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `data` is the Box that `pthread_create` leaked for this thread alone.
    let start = unsafe { Box::from_raw(data as *mut FollowedStart) };
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    for instance in start.instances.iter().filter_map(std::sync::Weak::upgrade) {
        add_pid(&instance, tid);
    }
    crate::thread::watch_exit();
    (start.start)(start.arg)
}

/// `pthread_create`, wrapped so that `event-fork` follows new threads as the kernel
/// follows new tasks: this definition takes the place of the C library's for the program
/// that links ustrace (`std::thread::spawn` comes here), and calls the C library's.
/// While no instance follows the calling thread it only forwards the call; otherwise the
/// new thread starts in a trampoline that adds it to those instances' `set_event_pid`
/// before the start routine runs, so none of its events are missed.
///
/// # Safety
///
/// The C library's contract for `pthread_create`.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartRoutine,
    arg: *mut libc::c_void,
) -> libc::c_int {
    let Some(real) = real_pthread_create() else {
        return libc::ENOSYS;
    };
    let instances = if PID_LISTS_USED.load(Ordering::Relaxed) {
        // SAFETY: gettid has no arguments and cannot fail.
        instances_following(unsafe { libc::gettid() })
    } else {
        Vec::new()
    };
    if instances.is_empty() {
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real(thread, attr, start, arg) };
    }
    let data = Box::into_raw(Box::new(FollowedStart {
        start,
        arg,
        instances,
    }));
    // SAFETY: as the caller's call; the trampoline takes `data` back exactly once.
    let ret = unsafe {
        real(
            thread,
            attr,
            followed_thread_start,
            data as *mut libc::c_void,
        )
    };
    if ret != 0 {
        // SAFETY: no thread was created, so `data` is still ours.
        drop(unsafe { Box::from_raw(data) });
    }
    ret
}

/// The thread that called `fork`, saved just before, for the child's `event-fork` handling.
static FORKING_TID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn before_fork() {
    // SAFETY: gettid has no arguments and cannot fail.
    FORKING_TID.store(
        unsafe { libc::gettid() },
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// With the `event-fork` option, a child of a traced thread is traced too: in the child,
/// the new process's id joins `set_event_pid` of every instance that lists its parent.
/// (New threads are followed by [`pthread_create`].)
extern "C" fn in_child_after_fork() {
    let parent = FORKING_TID.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: getpid has no arguments and cannot fail.
    let child = unsafe { libc::getpid() };
    let Some(tracing) = crate::trace::existing_tracing() else {
        return;
    };
    for instance in tracing.all_nonblocking() {
        if !instance.options.get("event-fork") {
            continue;
        }
        let lists = instance.pids();
        if lists.trace.binary_search(&parent).is_ok() {
            instance.update_pids(|lists| {
                lists.trace.push(child);
                lists.trace.sort_unstable();
                lists.trace.dedup();
            });
        }
    }
}

/// Installs the `event-fork` handlers once.
pub(crate) fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers touch only atomics and ustrace's own state.
        unsafe {
            libc::pthread_atfork(Some(before_fork), None, Some(in_child_after_fork));
        }
    });
}
