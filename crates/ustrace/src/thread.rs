//! Who is running: the thread id every record carries, and the thread names
//! (`saved_cmdlines`) that turn ids back into names when the trace is read.
//!
//! A record carries the thread id (the kernel's `common_pid`). Asking the kernel for it costs
//! a syscall, so it is asked once per thread and cached in a thread-local; a child after
//! `fork` forgets the cache. On that first event the thread's name is also saved (when the
//! `record-cmd` option is on), as the kernel saves `comm` for `saved_cmdlines`; a thread
//! renamed after its first event keeps its first name in the trace.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};

thread_local! {
    static TID: Cell<i32> = const { Cell::new(0) };
}

static CMDLINES: Mutex<Option<HashMap<i32, String>>> = Mutex::new(None);
static ATFORK: Once = Once::new();

/// The kernel keeps this many `saved_cmdlines` entries by default.
pub const SAVED_CMDLINES_SIZE: usize = 128;

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

/// Remembers `comm` for `tid`.
pub fn save_comm(tid: i32, comm: &str) {
    let mut table = CMDLINES.lock().unwrap_or_else(|e| e.into_inner());
    let table = table.get_or_insert_with(HashMap::new);
    if table.len() >= SAVED_CMDLINES_SIZE && !table.contains_key(&tid) {
        // Forget the lowest id: a cheap, deterministic stand-in for the kernel's ring.
        if let Some(&oldest) = table.keys().min() {
            table.remove(&oldest);
        }
    }
    table.insert(tid, comm.to_string());
}

/// The saved name of `tid`, if any.
pub fn comm_of(tid: i32) -> Option<String> {
    CMDLINES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()?
        .get(&tid)
        .cloned()
}

/// The `saved_cmdlines` text: `PID COMM` lines.
pub fn saved_cmdlines() -> String {
    let table = CMDLINES.lock().unwrap_or_else(|e| e.into_inner());
    let mut entries: Vec<_> = table.iter().flat_map(|t| t.iter()).collect();
    entries.sort();
    entries
        .into_iter()
        .map(|(tid, comm)| format!("{tid} {comm}\n"))
        .collect()
}
