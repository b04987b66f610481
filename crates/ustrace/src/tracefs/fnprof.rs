//! The profiler's files: `function_profile_enabled` and `trace_stat/function<cpu>` (top
//! level only, as on the kernel). They hand their text to `crate::ftrace::profile`.

use std::sync::Arc;

use ustrace_ctl::vfs::{Errno, OpenFile};

use super::files::{parse_ulong, TextFile};
use crate::ftrace::profile;
use crate::trace::Instance;

/// Mode of `function_profile_enabled` (the kernel's `TRACE_MODE_WRITE`).
pub(super) const ENABLED_MODE: u32 = 0o640;

/// The names in `trace_stat/`: `function0` .. `function<N-1>`.
pub(super) fn stat_names(top: &Instance) -> Vec<String> {
    (0..top.buffer().nr_cpus())
        .map(|cpu| format!("function{cpu}"))
        .collect()
}

/// The CPU a `trace_stat/` name stands for.
pub(super) fn stat_cpu(top: &Instance, name: &str) -> Option<usize> {
    let digits = name.strip_prefix("function")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<usize>()
        .ok()
        .filter(|&cpu| cpu < top.buffer().nr_cpus() && digits == cpu.to_string())
}

/// The functions the profiler patches: what the function tracer of the top instance would
/// (its `set_ftrace_filter` minus its `set_ftrace_notrace`, every function of the process
/// when the filter is empty, never the tracing machinery and the Rust runtime under it; the
/// kernel's profiler takes the global filter). The sets are read when it is turned on.
fn selected_functions(top: &Arc<Instance>) -> Vec<(usize, String)> {
    let inv = ustrace_inspect::symbols::inventory();
    let (addrs, _own) = crate::ftrace::tracer::targets(top);
    addrs
        .into_iter()
        .map(|addr| {
            let name = inv
                .lookup(addr)
                .map_or_else(|| format!("{addr:#x}"), |(s, _)| s.name.clone());
            (addr, name)
        })
        .collect()
}

/// Turns the profiler on or off as a write of `function_profile_enabled` does: any non-zero
/// number is 1, and writing the current state changes nothing.
pub fn set_enabled(top: &Arc<Instance>, on: bool) -> Result<(), Errno> {
    if on == profile::enabled() {
        return Ok(());
    }
    if !on {
        return profile::stop().map_err(|_| Errno::EBUSY);
    }
    let graph_time = crate::options::bit("graph-time");
    let options_of = top.clone();
    // Without a `graph-time` option the kernel's default (on) applies.
    let graph_time: Arc<dyn Fn() -> bool + Send + Sync> = match graph_time {
        Some(bit) => Arc::new(move || options_of.options.has_bit(bit)),
        None => Arc::new(|| true),
    };
    match profile::start(selected_functions(top), top.buffer().nr_cpus(), graph_time) {
        Ok(()) => Ok(()),
        Err(profile::Error::NoFunction) => Err(Errno::ENODEV),
        Err(profile::Error::Fprobe(ustrace_fprobe::Error::Unsupported(_))) => Err(Errno::ENODEV),
        Err(_) => Err(Errno::ENOMEM),
    }
}

/// Opens `function_profile_enabled`.
pub(super) fn open_enabled(top: Arc<Instance>) -> Result<Box<dyn OpenFile>, Errno> {
    let content = if profile::enabled() { "1\n" } else { "0\n" };
    Ok(Box::new(TextFile::new(
        content,
        Some(Box::new(move |data| {
            // The kernel reads at most 63 bytes of number (`kstrtoul_from_user`).
            if data.len() >= 64 {
                return Err(Errno::EINVAL);
            }
            set_enabled(&top, parse_ulong(data)? != 0)?;
            Ok(data.len())
        })),
    )))
}

/// Opens `trace_stat/function<cpu>`: the rows of that CPU as the profiler has them now.
pub(super) fn open_stat(cpu: usize) -> Result<Box<dyn OpenFile>, Errno> {
    let stats = profile::current()
        .map(|p| p.stats(Some(cpu)))
        .unwrap_or_default();
    // As the kernel's, functions whose average is below `tracing_thresh` are left out.
    let thresh =
        crate::ftrace::tracer::TRACING_THRESH_NS.load(std::sync::atomic::Ordering::Relaxed);
    Ok(Box::new(TextFile::new(
        profile::format_stats(&stats, thresh),
        None,
    )))
}
