//! Keeping unwinders working while return addresses are hooked.
//!
//! A hooked frame's return slot holds `return_trampoline`, which no unwinder can step through
//! (where the real caller is lives in a thread-local shadow stack, not in anything DWARF can
//! describe). Every walk of the stack in a process goes through one of libgcc's entry points,
//! so before the first fprobe with an exit handler is registered, this module probes them with
//! an internal entry handler:
//!
//! ```text
//!   panic!/C++ throw  -> _Unwind_RaiseException   \
//!   rethrow           -> _Unwind_Resume_or_Rethrow  }  entry handler: put every real return
//!   pthread_exit      -> _Unwind_ForcedUnwind      /   address of this thread back on the
//!   backtrace(3), std::backtrace -> _Unwind_Backtrace  stack, forget those shadow frames
//! ```
//!
//! After that the unwinder sees the true stack: panics and exceptions propagate through probed
//! functions, pthread_exit/cancel unwinds them, and backtraces show the real callers. The price:
//! exit handlers of the frames that were outstanding on that thread at that moment do not run
//! (each counts one miss), including frames that survive, e.g. an outer probed function that
//! catches the panic or that took the backtrace. The unwinder's own functions never get their
//! return hooked (their callers must stay visible to them).
//!
//! The stack captures of `ustrace_inspect::stack` (the `stacktrace` trigger and option) need
//! no such price: they only read the stack and return to their caller. A walk guard puts the
//! real return addresses back for the length of the capture and hooks them again afterwards,
//! so the frames it walks keep their exits.
//!
//! `longjmp` needs no hook: frames it skips are recognised by their stack pointer and dropped
//! at the next probe event of that thread (see `dispatch`).

use std::sync::Mutex;

use crate::dispatch::{self, EntryAction};
use crate::fprobe::{find_versioned, FprobeBuilder, Target};

/// libgcc entry points that start a stack walk.
pub const UNWIND_ENTRY_POINTS: [&str; 4] = [
    "_Unwind_RaiseException",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
    "_Unwind_Backtrace",
];

/// (function, object, error) for each entry point found; `None` error means hooked.
type HookStatus = Vec<(String, String, Option<String>)>;

static STATUS: Mutex<Option<HookStatus>> = Mutex::new(None);

/// Installs the hooks once (idempotent). Called before registering any fprobe with an exit
/// handler, outside the registry lock.
pub(crate) fn ensure_hooks() {
    // Our own stack captures (the `stacktrace` trigger and option) walk a stack whose hooked
    // returns are put back just for the walk: those frames keep their exits.
    ustrace_inspect::stack::set_walk_guard(ustrace_inspect::stack::WalkGuard {
        begin: dispatch::show_real_returns,
        end: dispatch::hide_real_returns,
    });
    hook_once(&STATUS, &UNWIND_ENTRY_POINTS, || {
        FprobeBuilder::new()
            .internal()
            .entry_handler(|_, _, _, _, _| {
                dispatch::detach_thread_frames();
                EntryAction::Continue
            })
    });
}

/// Probes every definition of `names` once with an internal fprobe that `build` makes; the
/// fprobes live as long as the process, and `status` records one row per definition with the
/// error when it could not be hooked.
fn hook_once(
    status: &Mutex<Option<HookStatus>>,
    names: &[&str],
    build: impl Fn() -> FprobeBuilder,
) {
    let mut st = status.lock().unwrap_or_else(|e| e.into_inner());
    if st.is_some() {
        return;
    }
    let inv = ustrace_inspect::symbols::inventory();
    let mut rows = Vec::new();
    for name in names {
        for s in find_versioned(&inv, name) {
            let target = Target {
                addr: s.addr,
                size: Some(s.size).filter(|&n| n > 0),
                name: s.name.clone(),
            };
            let err = match build().register_internal(vec![target]) {
                Ok(fp) => {
                    // Lives as long as the process.
                    std::mem::forget(fp);
                    None
                }
                Err(e) => Some(e.to_string()),
            };
            rows.push((s.name.clone(), s.object_name().to_string(), err));
        }
    }
    *st = Some(rows);
}

fn rows(status: &Mutex<Option<HookStatus>>) -> HookStatus {
    status
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default()
}

/// What `ensure_hooks` did: one row per unwinder entry point found in the process, with the
/// error when it could not be hooked (a panic through a probed frame then aborts the process).
pub fn unwind_hook_status() -> Vec<(String, String, Option<String>)> {
    rows(&STATUS)
}

static DLOPEN_STATUS: Mutex<Option<HookStatus>> = Mutex::new(None);

/// Entry points after which a filter fprobe may have new matches.
pub const DLOPEN_ENTRY_POINTS: [&str; 2] = ["dlopen", "dlmopen"];

/// Probes `dlopen`/`dlmopen` with an internal exit handler that asks for
/// [`crate::rescan_filters`] once the call returned (see `dispatch::on_exit`). Idempotent.
pub(crate) fn ensure_dlopen_hook() {
    hook_once(&DLOPEN_STATUS, &DLOPEN_ENTRY_POINTS, || {
        FprobeBuilder::new()
            .internal_with_exit()
            .exit_handler(|_, _, _, _, _| dispatch::request_rescan())
    });
}

/// What `ensure_dlopen_hook` did, one row per `dlopen`/`dlmopen` definition found. When no
/// row is hooked, call [`crate::rescan_filters`] (or [`crate::Fprobe::rescan`]) after loading.
pub fn dlopen_hook_status() -> Vec<(String, String, Option<String>)> {
    rows(&DLOPEN_STATUS)
}
