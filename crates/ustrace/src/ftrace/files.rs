//! The tracefs files of the function tracers besides the function sets: `available_tracers`,
//! `current_tracer`, `set_ftrace_pid`, `set_ftrace_notrace_pid`, `max_graph_depth`,
//! `tracing_thresh`, and `unpatchable_functions` (ours, in every instance: what its running
//! tracer could not patch, and why). Text in and out only; the tracer module acts.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ustrace_ctl::vfs::{Errno, OpenFile, OpenFlags};

use super::tracer::{self, Kind};
use crate::trace::Instance;
use crate::tracefs::files::{parse_ulong, text_arg, TextFile};

/// Files every instance has.
pub const INSTANCE_FILES: &[&str] = &[
    "available_tracers",
    "current_tracer",
    "set_ftrace_pid",
    "set_ftrace_notrace_pid",
    "unpatchable_functions",
];

/// Files only the top level has.
pub const TOP_FILES: &[&str] = &["max_graph_depth", "tracing_thresh"];

/// Opens one of these files of `instance`; `None` when `name` is not one of them.
pub fn open(
    instance: Arc<Instance>,
    name: &str,
    flags: OpenFlags,
) -> Option<Result<Box<dyn OpenFile>, Errno>> {
    let file: Box<dyn OpenFile> = match name {
        "available_tracers" => Box::new(TextFile::new(
            format!("{}\n", tracer::TRACERS.join(" ")),
            None,
        )),
        "current_tracer" => Box::new(TextFile::new(
            format!("{}\n", tracer::current(&instance).name()),
            Some(Box::new(move |data| {
                let name = text_arg(data)?.trim_end();
                let kind = Kind::from_name(name).ok_or(Errno::EINVAL)?;
                tracer::switch(&instance, kind)?;
                Ok(data.len())
            })),
        )),
        "set_ftrace_pid" | "set_ftrace_notrace_pid" => {
            let notrace = name == "set_ftrace_notrace_pid";
            let st = super::state(&instance);
            if flags.write && flags.truncate && !flags.append {
                update_pids(&instance, notrace, |list| list.clear());
            }
            let lists = st.tracer.pids.lock().unwrap_or_else(|e| e.into_inner());
            let list = if notrace {
                &lists.notrace
            } else {
                &lists.trace
            };
            let text = if list.is_empty() {
                "no pid\n".to_string()
            } else {
                crate::filter::pids_text(list)
            };
            drop(lists);
            Box::new(TextFile::new(
                text,
                Some(Box::new(move |data| {
                    let new = crate::filter::parse_pids(data)?;
                    update_pids(&instance, notrace, |list| list.extend(new));
                    Ok(data.len())
                })),
            ))
        }
        "max_graph_depth" => Box::new(TextFile::new(
            format!("{}\n", tracer::MAX_GRAPH_DEPTH.load(Ordering::Relaxed)),
            Some(Box::new(|data| {
                let n = parse_ulong(data)?;
                let n = u32::try_from(n).map_err(|_| Errno::EINVAL)?;
                tracer::MAX_GRAPH_DEPTH.store(n, Ordering::Relaxed);
                tracer::thresh_changed();
                Ok(data.len())
            })),
        )),
        "tracing_thresh" => Box::new(TextFile::new(
            // Shown and written in microseconds, kept in nanoseconds, as the kernel's.
            format!(
                "{}\n",
                tracer::TRACING_THRESH_NS.load(Ordering::Relaxed) / 1000
            ),
            Some(Box::new(|data| {
                let us = parse_ulong(data)?;
                let ns = us.checked_mul(1000).ok_or(Errno::EINVAL)?;
                tracer::TRACING_THRESH_NS.store(ns, Ordering::Relaxed);
                tracer::thresh_changed();
                Ok(data.len())
            })),
        )),
        "unpatchable_functions" => {
            let mut text = String::new();
            for r in tracer::refused(&instance) {
                text.push_str(&format!("{}\t{}\n", r.function, r.reason));
            }
            Box::new(TextFile::new(text, None))
        }
        _ => return None,
    };
    Some(Ok(file))
}

fn update_pids(instance: &Arc<Instance>, notrace: bool, change: impl FnOnce(&mut Vec<i32>)) {
    let st = super::state(instance);
    {
        let mut lists = st.tracer.pids.lock().unwrap_or_else(|e| e.into_inner());
        let list = if notrace {
            &mut lists.notrace
        } else {
            &mut lists.trace
        };
        change(list);
        list.sort_unstable();
        list.dedup();
    }
    tracer::republish_all(instance);
}
