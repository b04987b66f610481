//! Who is running: the thread id every record carries, and the thread names
//! (`saved_cmdlines`) that turn ids back into names when the trace is read.
//!
//! A record carries the thread id (the kernel's `common_pid`). Asking the kernel for it costs
//! a syscall, so it is asked once per thread and cached in a thread-local; a child after
//! `fork` forgets the cache. On that first event the thread's name is also saved (when the
//! `record-cmd` option is on), as the kernel saves `comm` for `saved_cmdlines`; a thread
//! renamed after its first event keeps its first name in the trace.
//!
//! The names live in a ring of `saved_cmdlines_size` slots, as the kernel's: each newly
//! saved thread takes the next slot, so the last N distinct threads are kept. One
//! difference: the kernel saves again on a later event of a thread it forgot; here a thread
//! saves once, so a thread pushed out of the ring prints as `<...>` from then on.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once, OnceLock};

thread_local! {
    static TID: Cell<i32> = const { Cell::new(0) };
}

static CMDLINES: Mutex<Option<CmdlineTable>> = Mutex::new(None);
static ATFORK: Once = Once::new();

/// The kernel keeps this many `saved_cmdlines` entries by default.
pub const SAVED_CMDLINES_SIZE: usize = 128;

/// The most `saved_cmdlines_size` takes: the kernel's `PID_MAX_DEFAULT`.
pub const SAVED_CMDLINES_MAX: usize = 32768;

/// The saved names: a ring of `slots` as the kernel's `saved_cmdlines_buffer`. A thread
/// seen for the first time takes the slot after the last one taken, forgetting whoever
/// held it, so with size N the last N distinct threads are kept; a thread already saved
/// keeps its slot (its name is updated in place).
struct CmdlineTable {
    slots: Vec<Option<(i32, String)>>,
    /// Where each saved thread is in `slots`.
    index: HashMap<i32, usize>,
    /// The slot taken last.
    last: usize,
}

impl CmdlineTable {
    fn new(size: usize) -> CmdlineTable {
        CmdlineTable {
            slots: vec![None; size],
            index: HashMap::new(),
            last: 0,
        }
    }

    fn save(&mut self, tid: i32, comm: &str) {
        if let Some(&slot) = self.index.get(&tid) {
            if let Some(entry) = &mut self.slots[slot] {
                entry.1 = comm.to_string();
            }
            return;
        }
        let slot = (self.last + 1) % self.slots.len();
        if let Some((old, _)) = self.slots[slot].take() {
            self.index.remove(&old);
        }
        self.slots[slot] = Some((tid, comm.to_string()));
        self.index.insert(tid, slot);
        self.last = slot;
    }

    /// The entries from the oldest taken to the newest.
    fn oldest_first(&self) -> impl Iterator<Item = &(i32, String)> {
        let n = self.slots.len();
        (1..=n).filter_map(move |i| self.slots[(self.last + i) % n].as_ref())
    }
}

fn table() -> std::sync::MutexGuard<'static, Option<CmdlineTable>> {
    CMDLINES.lock().unwrap_or_else(|e| e.into_inner())
}

extern "C" fn forget_tid_in_child() {
    let _ = TID.try_with(|t| t.set(0));
}

/// The calling thread's id, cached after the first call.
#[inline(always)]
pub fn current_tid(record_cmd: &AtomicBool) -> i32 {
    let tid = TID.try_with(|t| t.get()).unwrap_or(0);
    if tid != 0 {
        return tid;
    }
    first_sight(record_cmd)
}

#[cold]
#[inline(never)]
fn first_sight(record_cmd: &AtomicBool) -> i32 {
    ATFORK.call_once(|| {
        // SAFETY: the handler only resets a thread-local integer.
        unsafe {
            libc::pthread_atfork(None, None, Some(forget_tid_in_child));
        }
    });
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    let _ = TID.try_with(|t| t.set(tid));
    // With event-fork, a listed thread leaves set_event_pid when it exits.
    watch_exit();
    if record_cmd.load(Ordering::Relaxed) {
        save_comm(tid, &current_comm());
    }
    tid
}

/// The calling thread's name, as `/proc/self/task/TID/comm` shows it.
pub fn current_comm() -> String {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes plus NUL into the buffer.
    unsafe {
        libc::prctl(
            libc::PR_GET_NAME,
            name.as_mut_ptr() as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let end = name.iter().position(|&b| b == 0).unwrap_or(16);
    String::from_utf8_lossy(&name[..end]).into_owned()
}

thread_local! {
    static COMM_BYTES: std::cell::Cell<Option<[u8; 16]>> = const { std::cell::Cell::new(None) };
}

/// The calling thread's name as the kernel's 16-byte `comm` (NUL padded), asked of the
/// kernel once per thread: filters and hist keys that name `comm` read it on the record
/// path, which makes no system call. (A thread that renames itself later keeps its first
/// name here.)
pub fn current_comm_bytes() -> [u8; 16] {
    let ask = || {
        let name = current_comm();
        let mut bytes = [0u8; 16];
        let n = name.len().min(15);
        bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
        bytes
    };
    COMM_BYTES
        .try_with(|cached| {
            cached.get().unwrap_or_else(|| {
                let bytes = ask();
                cached.set(Some(bytes));
                bytes
            })
        })
        .unwrap_or_else(|_| ask())
}

/// Remembers `comm` for `tid`.
pub fn save_comm(tid: i32, comm: &str) {
    table()
        .get_or_insert_with(|| CmdlineTable::new(SAVED_CMDLINES_SIZE))
        .save(tid, comm);
}

/// The saved name of `tid`, if any.
pub fn comm_of(tid: i32) -> Option<String> {
    let table = table();
    let table = table.as_ref()?;
    let slot = *table.index.get(&tid)?;
    table.slots[slot].as_ref().map(|(_, comm)| comm.clone())
}

/// The `saved_cmdlines` text: `PID COMM` lines, in slot order as the kernel lists them.
pub fn saved_cmdlines() -> String {
    let table = table();
    table
        .iter()
        .flat_map(|t| t.slots.iter().flatten())
        .map(|(tid, comm)| format!("{tid} {comm}\n"))
        .collect()
}

/// How many names `saved_cmdlines` keeps.
pub fn saved_cmdlines_size() -> usize {
    table()
        .as_ref()
        .map_or(SAVED_CMDLINES_SIZE, |t| t.slots.len())
}

/// Applies a write to `saved_cmdlines_size`: 1 to [`SAVED_CMDLINES_MAX`] entries, else
/// `EINVAL`, as the kernel. The kernel starts an empty table; here the newest entries that
/// fit are kept, because a thread saves its name only on its first event (see the module
/// docs) and would otherwise print as `<...>` for good. The kernel also rounds the size
/// up to fill its allocation (6.18 reads back 6552 for any size up to that); here the
/// size is exactly what was written.
pub fn set_saved_cmdlines_size(size: u64) -> Result<(), ustrace_ctl::vfs::Errno> {
    if size == 0 || size > SAVED_CMDLINES_MAX as u64 {
        return Err(ustrace_ctl::vfs::Errno::EINVAL);
    }
    let mut table = table();
    let mut resized = CmdlineTable::new(size as usize);
    if let Some(old) = table.as_ref() {
        let kept: Vec<&(i32, String)> = old.oldest_first().collect();
        for (tid, comm) in &kept[kept.len().saturating_sub(size as usize)..] {
            resized.save(*tid, comm);
        }
    }
    *table = Some(resized);
    Ok(())
}

/// What runs as a thread that ustrace has seen exits (set once, by the first
/// `set_event_pid` write: the pid lists forget the thread).
static EXIT_HOOK: OnceLock<fn(i32)> = OnceLock::new();

/// Makes `hook` run with the thread id of every thread that ustrace has seen as it exits.
/// The thread layer knows nothing of the pid lists; the `set_event_pid` command installs
/// its cleanup here, once.
pub(crate) fn on_thread_exit(hook: fn(i32)) {
    let _ = EXIT_HOOK.get_or_init(|| hook);
}

thread_local! {
    /// Dropped when the thread exits: runs the exit hook.
    static EXIT_WATCH: ExitWatch = const { ExitWatch };
}

struct ExitWatch;

impl Drop for ExitWatch {
    fn drop(&mut self) {
        let Some(hook) = EXIT_HOOK.get() else {
            return;
        };
        // SAFETY: gettid has no arguments and cannot fail.
        hook(unsafe { libc::gettid() });
    }
}

/// Makes the calling thread's exit run the exit hook (see [`on_thread_exit`]); called once
/// per thread, off the data path (a thread's first event, a followed thread's start).
pub(crate) fn watch_exit() {
    let _ = EXIT_WATCH.try_with(|_| ());
}
