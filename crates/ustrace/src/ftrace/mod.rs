//! Function tracing: the function profiler and the function commands of `set_ftrace_filter`.
pub mod profile;
