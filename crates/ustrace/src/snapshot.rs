//! The `snapshot` file: a second buffer swapped with the live one on demand.
//!
//! `echo 1 > snapshot` allocates the snapshot buffer if needed and swaps it with the live
//! buffer, so the snapshot holds what was traced until then and tracing goes on in the other;
//! `echo 0` frees it; any other number clears it. Reading shows the snapshot as `trace` shows
//! the live buffer, or, when none is allocated, how to take one.

use std::sync::Arc;

use ustrace_ctl::vfs::{Errno, OpenFile, OpenFlags};

use crate::trace::{Instance, Shared};
use crate::tracefs::files::{parse_ulong, TextFile};

const NOT_ALLOCATED: &str = "# *** SNAPSHOT NOT ALLOCATED ***\n";

const HELP: &str = "\
# Snapshot commands:
# echo 0 > snapshot : frees the snapshot buffer
# echo 1 > snapshot : allocates the snapshot buffer if needed and takes a snapshot
# echo 2 > snapshot : clears the snapshot buffer (any number but 0 and 1 does)
";

fn render(instance: &Instance) -> Vec<u8> {
    let guard = instance
        .shared
        .snapshot
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let Some(snapshot) = guard.as_ref() else {
        return format!("{NOT_ALLOCATED}{HELP}").into_bytes();
    };
    let mut out = crate::output::header_for(instance, snapshot);
    out.push_str("#\n# * Snapshot is allocated *\n#\n");
    out.push_str(HELP);
    let mut out = out.into_bytes();
    for event in snapshot.iter() {
        crate::output::format_event(instance, &event, &mut out);
    }
    out
}

/// Allocates the snapshot buffer if there is none, shaped like the live one.
pub(crate) fn allocate(shared: &Shared) -> Result<(), Errno> {
    let mut guard = shared.snapshot.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        // Shaped like the live buffer CPU by CPU, and made of the regions an earlier snapshot
        // left the live buffer (see `RingBuffer::new_like`), so that taking and freeing
        // snapshots over and over holds no more memory or files than one snapshot does.
        *guard = Some(
            shared
                .buffer
                .new_like("snapshot")
                .map_err(|_| Errno::ENOMEM)?,
        );
    }
    Ok(())
}

/// Takes a snapshot: the snapshot buffer gets what the live one holds, the live one goes on
/// empty. What `echo 1 > snapshot` and the `snapshot` trigger do.
pub(crate) fn swap(shared: &Shared) -> Result<(), Errno> {
    allocate(shared)?;
    let guard = shared.snapshot.lock().unwrap_or_else(|e| e.into_inner());
    let snapshot = guard.as_ref().expect("allocated above");
    snapshot.reset();
    shared.buffer.swap(snapshot).map_err(|_| Errno::EBUSY)
}

fn command(instance: &Instance, value: u64) -> Result<(), Errno> {
    match value {
        0 => {
            *instance
                .shared
                .snapshot
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = None
        }
        1 => swap(&instance.shared)?,
        _ => {
            let guard = instance
                .shared
                .snapshot
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(snapshot) = guard.as_ref() {
                snapshot.reset();
            }
        }
    }
    Ok(())
}

/// Takes a snapshot now, as `echo 1 > snapshot` does.
pub fn take(instance: &Instance) -> Result<(), Errno> {
    swap(&instance.shared)
}

/// Opens the `snapshot` file of `instance`: reads show the snapshot buffer, writes take,
/// clear or free it as ftrace.rst says.
pub fn open(instance: Arc<Instance>, flags: OpenFlags) -> Result<Box<dyn OpenFile>, Errno> {
    let content = if flags.read {
        render(&instance)
    } else {
        Vec::new()
    };
    Ok(Box::new(TextFile::new(
        content,
        Some(Box::new(move |data| {
            command(&instance, parse_ulong(data)?)?;
            Ok(data.len())
        })),
    )))
}
