//! The `set_event` command language (events.rst 2.1).
//!
//! Each whitespace-separated word names events to enable, or with a leading `!` to disable:
//! `SYS:EVENT`, `SYS:` or `SYS:*` (a whole system), `*:*` or `*:` (everything), `:EVENT` or
//! `*:EVENT` (that event in any system), and a bare `NAME`, which matches events *or* systems
//! of that name, as the kernel's does. A word that matches nothing fails the write with
//! `EINVAL`. Every word is checked before any is applied, so a bad write changes nothing.
//!
//! Any of those may end in `:mod:MODULE`, which keeps only the events MODULE declared; a
//! bare `:mod:MODULE` (or `*:mod:MODULE`) is all of them. The kernel's module is a loadable
//! kernel module; ours is the crate whose `trace_event!` declared the event (the first
//! segment of its `module_path!()`, so `my_app`, not `my-app`). Built-in and dynamic events
//! belong to no module. A module that declares no event fails with `EINVAL`, as the 6.18
//! kernel answers for a module it does not have.

use std::sync::Arc;

use ustrace_ctl::vfs::Errno;

use crate::event_file::EventFile;
use crate::trace::Instance;

/// The event files one word selects.
fn select(instance: &Instance, word: &str) -> Vec<Arc<EventFile>> {
    let wild = |s: &str| s.is_empty() || s == "*";
    let (spec, module) = match word.split_once(":mod:") {
        Some((spec, module)) => (spec, Some(module)),
        None => (word, None),
    };
    instance
        .files_of(None)
        .into_iter()
        .filter(|f| module.is_none() || f.event.module() == module)
        .filter(|f| {
            let (system, name) = (f.event.system(), f.event.name());
            match spec.split_once(':') {
                Some((sys, ev)) => (wild(sys) || sys == system) && (wild(ev) || ev == name),
                // With a module, an empty or `*` word is every event of the module.
                None if module.is_some() && wild(spec) => true,
                None => spec == name || spec == system,
            }
        })
        .collect()
}

/// Applies one write to `set_event`.
pub fn write(instance: &Instance, data: &[u8]) -> Result<(), Errno> {
    let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
    let mut plan = Vec::new();
    for word in text.split_whitespace() {
        let (enable, spec) = match word.strip_prefix('!') {
            Some(rest) => (false, rest),
            None => (true, word),
        };
        let files = select(instance, spec);
        if files.is_empty() {
            return Err(Errno::EINVAL);
        }
        plan.push((enable, files));
    }
    for (enable, files) in plan {
        for file in files {
            file.set_enabled(enable)?;
        }
    }
    Ok(())
}
