//! The `snapshot` file: a second buffer swapped with the live one on demand.
//!
//! `echo 1 > snapshot` allocates the snapshot buffer if needed and swaps it with the live
//! buffer, so the snapshot holds what was traced until then and tracing goes on in the other;
//! `echo 0` frees it; any other number clears it. Reading shows the snapshot as `trace` shows
//! the live buffer, or, when none is allocated, how to take one.

use std::sync::Arc;

use ustrace_ctl::vfs::{Errno, OpenFile, OpenFlags};

use crate::trace::Instance;
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

fn command(instance: &Instance, value: u64) -> Result<(), Errno> {
    match value {
        0 => {
            *instance
                .shared
                .snapshot
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = None
        }
        1 => instance.shared.take_snapshot()?,
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
    instance.shared.take_snapshot()
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
