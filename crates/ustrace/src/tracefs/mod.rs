//! The tracefs tree: `/sys/kernel/tracing`, served from inside the process.
//!
//! One model, three doors: [`TraceFs`] implements [`FileSystem`], which the in-process API,
//! the control socket and the FUSE mount all call, so behaviour cannot drift between them.
//!
//! ```text
//!  ""                      top instance: control files + events/ per_cpu/ options/ instances/
//!  ├─ events/              enable, header_page, header_event
//!  │   └─ SYS/             enable
//!  │       └─ EVENT/       enable, format, id
//!  ├─ per_cpu/cpuN/        trace, trace_pipe, trace_pipe_raw, stats, buffer_size_kb
//!  ├─ options/             one 0/1 file per trace option
//!  └─ instances/NAME/      the same tree again (no instances/ inside), independent state
//! ```
//!
//! A path is resolved to a `Node` each time it is used; nodes hold the instance or event
//! they name, so a file opened before its instance was removed keeps working on the old one.
//! Errors are the kernel's errno for the same mistake.

pub mod files;
pub mod fnprof;
pub mod pipe;

use std::sync::Arc;

use ustrace_ctl::vfs::{DirEntry, Errno, FileKind, FileSystem, OpenFile, OpenFlags, Stat};
use ustrace_ringbuf::clock::Clock;

use crate::event::registry::registry;
use crate::event_file::EventFile;
use crate::options::OPTIONS;
use crate::trace::{try_tracing, Instance, Tracing};
use files::{parse_bool, parse_ulong, text_arg, TextFile, WriteFn};
use pipe::TracePipe;

/// The tracefs of this process.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceFs;

/// The process's tracefs.
pub fn tracefs() -> TraceFs {
    TraceFs
}

/// Files every instance has, with their modes: the kernel's (group may read, others nothing;
/// `trace_marker` group-writable, `free_buffer` owner-only).
const INSTANCE_FILES: &[(&str, u32)] = &[
    ("available_tracers", 0o440),
    ("set_event_notrace_pid", 0o640),
    ("set_event_pid", 0o640),
    ("buffer_size_kb", 0o640),
    ("buffer_total_size_kb", 0o440),
    ("current_tracer", 0o640),
    ("error_log", 0o640),
    ("free_buffer", 0o200),
    ("set_event", 0o640),
    ("snapshot", 0o640),
    ("trace", 0o640),
    ("trace_clock", 0o640),
    ("trace_marker", 0o220),
    ("trace_options", 0o640),
    ("trace_pipe", 0o440),
    ("tracing_on", 0o640),
    ("tracing_cpumask", 0o640),
    ("set_ftrace_filter", 0o640),
    ("set_ftrace_notrace", 0o640),
    ("set_ftrace_pid", 0o640),
    ("set_ftrace_notrace_pid", 0o640),
    ("unpatchable_functions", 0o440),
];

/// Files only the top-level directory has.
const TOP_FILES: &[(&str, u32)] = &[
    ("README", 0o440),
    ("available_events", 0o440),
    ("available_filter_functions", 0o440),
    ("available_filter_functions_addrs", 0o440),
    ("dynamic_events", 0o640),
    ("enabled_functions", 0o440),
    ("printk_formats", 0o440),
    ("function_profile_enabled", fnprof::ENABLED_MODE),
    ("saved_cmdlines", 0o440),
    ("saved_cmdlines_size", 0o640),
    ("saved_tgids", 0o440),
    ("synthetic_events", 0o640),
    ("set_graph_function", 0o640),
    ("set_graph_notrace", 0o640),
    ("max_graph_depth", 0o640),
    ("tracing_thresh", 0o640),
];

const CPU_FILES: &[(&str, u32)] = &[
    ("buffer_size_kb", 0o640),
    ("stats", 0o440),
    ("trace", 0o640),
    ("trace_pipe", 0o440),
    ("trace_pipe_raw", 0o440),
];

/// The longest name of one path component (the kernel's `NAME_MAX`).
const NAME_MAX: usize = 255;

/// What a path names.
enum Node {
    Dir(Dir),
    File(File),
}

#[derive(Clone)]
enum Dir {
    Root(Arc<Instance>),
    Events(Arc<Instance>),
    System(Arc<Instance>, String),
    Event(Arc<EventFile>),
    Instances,
    PerCpu(Arc<Instance>),
    Cpu,
    Options,
    TraceStat(Arc<Instance>),
}

enum File {
    Instance(Arc<Instance>, &'static str),
    EventsEnable(Arc<Instance>),
    HeaderPage,
    HeaderEvent,
    SystemEnable(Arc<Instance>, String),
    SystemFilter(Arc<Instance>, String),
    EventEnable(Arc<EventFile>),
    EventFilter(Arc<Instance>, Arc<EventFile>),
    EventTrigger(Arc<Instance>, Arc<EventFile>),
    EventHist(Arc<EventFile>),
    EventFormat(Arc<EventFile>),
    EventId(Arc<EventFile>),
    Cpu(Arc<Instance>, usize, &'static str),
    Option(Arc<Instance>, &'static str),
    TraceStat(usize),
}

fn components(path: &str) -> Result<Vec<&str>, Errno> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(Errno::EINVAL);
    }
    // The VFS refuses a longer name in any component before tracefs sees it.
    if parts.iter().any(|p| p.len() > NAME_MAX) {
        return Err(Errno(libc::ENAMETOOLONG));
    }
    Ok(parts)
}

fn find_name(table: &'static [(&'static str, u32)], name: &str) -> Option<&'static str> {
    table.iter().find(|(n, _)| *n == name).map(|(n, _)| *n)
}

/// The tracing state, or `ENOMEM` when its top-level buffer cannot be allocated (the
/// kernel's answer when a buffer cannot be had), rather than a panic in the caller.
fn tracing() -> Result<&'static Tracing, Errno> {
    try_tracing().map_err(|_| Errno::ENOMEM)
}

fn resolve(path: &str) -> Result<Node, Errno> {
    let parts = components(path)?;
    let tracing = tracing()?;
    let (instance, rest, top) = match parts.as_slice() {
        ["instances"] => return Ok(Node::Dir(Dir::Instances)),
        ["instances", name, rest @ ..] => (
            tracing.instance(name).ok_or(Errno::ENOENT)?,
            rest.to_vec(),
            false,
        ),
        _ => (tracing.top().clone(), parts.clone(), true),
    };
    resolve_in(instance, &rest, top)
}

fn resolve_in(instance: Arc<Instance>, parts: &[&str], top: bool) -> Result<Node, Errno> {
    let node = match parts {
        [] => Node::Dir(Dir::Root(instance)),
        ["events"] => Node::Dir(Dir::Events(instance)),
        ["events", "enable"] => Node::File(File::EventsEnable(instance)),
        ["events", "header_page"] => Node::File(File::HeaderPage),
        ["events", "header_event"] => Node::File(File::HeaderEvent),
        ["events", system, rest @ ..] => {
            if instance.files_of(Some(system)).is_empty() && *system != "ftrace" {
                return Err(Errno::ENOENT);
            }
            let event = |name: &str| {
                instance
                    .files()
                    .into_iter()
                    .find(|f| f.event.system() == *system && f.event.name() == name)
                    .ok_or(Errno::ENOENT)
            };
            match rest {
                [] => Node::Dir(Dir::System(instance.clone(), system.to_string())),
                ["enable"] if *system != "ftrace" => {
                    Node::File(File::SystemEnable(instance.clone(), system.to_string()))
                }
                ["filter"] if *system != "ftrace" => {
                    Node::File(File::SystemFilter(instance.clone(), system.to_string()))
                }
                [name] => Node::Dir(Dir::Event(event(name)?)),
                [name, "enable"] if *system != "ftrace" => {
                    Node::File(File::EventEnable(event(name)?))
                }
                [name, "filter"] if *system != "ftrace" => {
                    Node::File(File::EventFilter(instance.clone(), event(name)?))
                }
                [name, "trigger"] => {
                    let file = event(name)?;
                    // Of the ftrace events only `print` takes triggers (trace_marker writes).
                    if *system == "ftrace" && file.event.name() != "print" {
                        return Err(Errno::ENOENT);
                    }
                    Node::File(File::EventTrigger(instance.clone(), file))
                }
                [name, "hist"] => {
                    let file = event(name)?;
                    if *system == "ftrace" && file.event.name() != "print" {
                        return Err(Errno::ENOENT);
                    }
                    Node::File(File::EventHist(file))
                }
                [name, "format"] => Node::File(File::EventFormat(event(name)?)),
                [name, "id"] => Node::File(File::EventId(event(name)?)),
                _ => return Err(Errno::ENOENT),
            }
        }
        ["per_cpu"] => Node::Dir(Dir::PerCpu(instance)),
        ["per_cpu", cpu, rest @ ..] => {
            let cpu = cpu
                .strip_prefix("cpu")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n < instance.buffer().nr_cpus())
                .ok_or(Errno::ENOENT)?;
            match rest {
                [] => Node::Dir(Dir::Cpu),
                [name] => Node::File(File::Cpu(
                    instance,
                    cpu,
                    find_name(CPU_FILES, name).ok_or(Errno::ENOENT)?,
                )),
                _ => return Err(Errno::ENOENT),
            }
        }
        ["options"] => Node::Dir(Dir::Options),
        ["trace_stat"] if top => Node::Dir(Dir::TraceStat(instance)),
        ["trace_stat", name] if top => Node::File(File::TraceStat(
            fnprof::stat_cpu(&instance, name).ok_or(Errno::ENOENT)?,
        )),
        ["options", name] => {
            let name = OPTIONS
                .iter()
                .find(|(n, _)| n == name)
                .ok_or(Errno::ENOENT)?
                .0;
            Node::File(File::Option(instance, name))
        }
        [name] => {
            let found = find_name(INSTANCE_FILES, name)
                .or_else(|| {
                    if top {
                        find_name(TOP_FILES, name)
                    } else {
                        None
                    }
                })
                .ok_or(Errno::ENOENT)?;
            Node::File(File::Instance(instance, found))
        }
        _ => return Err(Errno::ENOENT),
    };
    Ok(node)
}

fn mode_of(file: &File) -> u32 {
    match file {
        File::Instance(_, name) => INSTANCE_FILES
            .iter()
            .chain(TOP_FILES)
            .find(|(n, _)| n == name)
            .map_or(0o440, |(_, m)| *m),
        File::Cpu(_, _, name) => CPU_FILES
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0o440, |(_, m)| *m),
        File::HeaderPage
        | File::HeaderEvent
        | File::EventFormat(_)
        | File::EventId(_)
        | File::TraceStat(_) => 0o440,
        _ => 0o640,
    }
}

/// The kernel's directory modes: the top directory is its mount's default 0700, the event
/// tree (eventfs) 0755, every other directory 0750.
fn dir_mode(dir: &Dir) -> u32 {
    match dir {
        Dir::Root(instance) if instance.name.is_empty() => 0o700,
        Dir::Events(_) | Dir::System(..) | Dir::Event(_) => 0o755,
        Dir::Root(_)
        | Dir::Instances
        | Dir::PerCpu(_)
        | Dir::Cpu
        | Dir::Options
        | Dir::TraceStat(_) => 0o750,
    }
}

impl FileSystem for TraceFs {
    fn stat(&self, path: &str) -> Result<Stat, Errno> {
        Ok(match resolve(path)? {
            Node::Dir(dir) => Stat {
                kind: FileKind::Dir,
                mode: dir_mode(&dir),
            },
            Node::File(file) => Stat {
                kind: FileKind::File,
                mode: mode_of(&file),
            },
        })
    }

    fn readdir(&self, path: &str) -> Result<Vec<DirEntry>, Errno> {
        let Node::Dir(dir) = resolve(path)? else {
            return Err(Errno::ENOTDIR);
        };
        let file = |name: &str| DirEntry {
            name: name.to_string(),
            kind: FileKind::File,
        };
        let dir_entry = |name: &str| DirEntry {
            name: name.to_string(),
            kind: FileKind::Dir,
        };
        let mut entries = Vec::new();
        match dir {
            Dir::Root(instance) => {
                let top = instance.name.is_empty();
                for (name, _) in INSTANCE_FILES
                    .iter()
                    .chain(if top { TOP_FILES } else { &[] })
                {
                    entries.push(file(name));
                }
                for name in ["events", "options", "per_cpu"] {
                    entries.push(dir_entry(name));
                }
                if top {
                    entries.push(dir_entry("instances"));
                    entries.push(dir_entry("trace_stat"));
                }
            }
            Dir::Events(instance) => {
                entries.extend(["enable", "header_event", "header_page"].map(file));
                let mut systems: Vec<String> = instance
                    .files()
                    .iter()
                    .map(|f| f.event.system().to_string())
                    .collect();
                systems.sort();
                systems.dedup();
                entries.extend(systems.iter().map(|s| dir_entry(s)));
            }
            Dir::System(instance, system) => {
                if system != "ftrace" {
                    entries.push(file("enable"));
                    entries.push(file("filter"));
                }
                for f in instance
                    .files()
                    .iter()
                    .filter(|f| f.event.system() == system)
                {
                    entries.push(dir_entry(f.event.name()));
                }
            }
            Dir::Event(event_file) => {
                let ftrace = event_file.event.system() == "ftrace";
                if !ftrace {
                    entries.extend(["enable", "filter"].map(file));
                }
                entries.extend(["format", "id"].map(file));
                if !ftrace || event_file.event.name() == "print" {
                    entries.push(file("trigger"));
                    entries.push(file("hist"));
                }
            }
            Dir::Instances => {
                entries.extend(tracing()?.instance_names().iter().map(|n| dir_entry(n)));
            }
            Dir::PerCpu(instance) => {
                for cpu in 0..instance.buffer().nr_cpus() {
                    entries.push(dir_entry(&format!("cpu{cpu}")));
                }
            }
            Dir::Cpu => entries.extend(CPU_FILES.iter().map(|(n, _)| file(n))),
            Dir::Options => entries.extend(OPTIONS.iter().map(|(n, _)| file(n))),
            Dir::TraceStat(top) => entries.extend(fnprof::stat_names(&top).iter().map(|n| file(n))),
        }
        Ok(entries)
    }

    fn open(&self, path: &str, flags: OpenFlags) -> Result<Box<dyn OpenFile>, Errno> {
        // O_TRUNC acts only on an open for writing: the kernel's files check FMODE_WRITE
        // before they clear anything (an O_RDONLY|O_TRUNC open of `trace` keeps it, on 6.18).
        let flags = OpenFlags {
            truncate: flags.truncate && flags.write,
            ..flags
        };
        match resolve(path)? {
            Node::Dir(_) => Err(Errno::EISDIR),
            Node::File(file) => open_file(file, flags),
        }
    }

    fn mkdir(&self, path: &str) -> Result<(), Errno> {
        match components(path)?.as_slice() {
            ["instances", name] => tracing()?.create_instance(name).map(|_| ()),
            parts => match resolve(&parts.join("/")) {
                Ok(_) => Err(Errno::EEXIST),
                Err(_) => Err(Errno::EPERM),
            },
        }
    }

    fn rmdir(&self, path: &str) -> Result<(), Errno> {
        match components(path)?.as_slice() {
            ["instances", name] => tracing()?.remove_instance(name),
            parts => match resolve(&parts.join("/"))? {
                Node::Dir(_) => Err(Errno::EPERM),
                Node::File(_) => Err(Errno::ENOTDIR),
            },
        }
    }
}

fn text(content: impl Into<Vec<u8>>) -> Result<Box<dyn OpenFile>, Errno> {
    Ok(Box::new(TextFile::new(content, None)))
}

fn rw(content: impl Into<Vec<u8>>, writer: WriteFn) -> Result<Box<dyn OpenFile>, Errno> {
    Ok(Box::new(TextFile::new(content, Some(writer))))
}

/// The text of an `enable` file that covers several events.
fn enable_summary(files: &[Arc<EventFile>]) -> &'static str {
    let enabled = files.iter().filter(|f| f.is_enabled()).count();
    match (files.len(), enabled) {
        (0, _) => "?\n",
        (_, 0) => "0\n",
        (n, e) if n == e => "1\n",
        _ => "X\n",
    }
}

fn set_all(files: Vec<Arc<EventFile>>, on: bool) -> Result<(), Errno> {
    for file in files {
        file.set_enabled(on)?;
    }
    Ok(())
}

fn open_file(file: File, flags: OpenFlags) -> Result<Box<dyn OpenFile>, Errno> {
    match file {
        File::Instance(instance, name) => open_instance_file(instance, name, flags),
        File::EventsEnable(instance) => {
            let content = if flags.read {
                enable_summary(&instance.files_of(None))
            } else {
                ""
            };
            rw(
                content,
                Box::new(move |data| {
                    set_all(instance.files_of(None), parse_bool(data)?)?;
                    Ok(data.len())
                }),
            )
        }
        File::SystemEnable(instance, system) => {
            let content = enable_summary(&instance.files_of(Some(&system)));
            rw(
                content,
                Box::new(move |data| {
                    set_all(instance.files_of(Some(&system)), parse_bool(data)?)?;
                    Ok(data.len())
                }),
            )
        }
        File::EventEnable(event_file) => rw(
            event_file.enable_text(),
            Box::new(move |data| {
                event_file.set_enabled(parse_bool(data)?)?;
                Ok(data.len())
            }),
        ),
        File::SystemFilter(instance, system) => rw(
            crate::filter::system_text(&instance, &system),
            Box::new(move |data| {
                let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
                crate::filter::write_system(&instance, &system, text)?;
                Ok(data.len())
            }),
        ),
        File::EventFilter(instance, event_file) => rw(
            crate::filter::text(&event_file),
            Box::new(move |data| {
                let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
                crate::filter::write_event(&instance, &event_file, text)?;
                Ok(data.len())
            }),
        ),
        File::EventTrigger(instance, event_file) => rw(
            {
                // A truncating open drops the hist and enable_hist/disable_hist triggers
                // (the only commands with the kernel's `unreg_all`); the others stay.
                if flags.truncate {
                    crate::trigger::serialized(|| crate::hist::unregister_all(&event_file));
                }
                crate::trigger::listing(&event_file)
            },
            Box::new(move |data| {
                let text = std::str::from_utf8(data).map_err(|_| Errno::EINVAL)?;
                crate::trigger::write(&instance, &event_file, text)?;
                Ok(data.len())
            }),
        ),
        File::EventHist(event_file) => text(crate::hist::show(&event_file)),
        File::EventFormat(event_file) => text(event_file.event.format_file()),
        File::EventId(event_file) => text(format!("{}\n", event_file.event.id().0)),
        File::HeaderPage => text(header_page()),
        File::HeaderEvent => text(HEADER_EVENT),
        File::Option(instance, name) => rw(
            if instance.options.get(name) {
                "1\n"
            } else {
                "0\n"
            },
            Box::new(move |data| {
                set_option(&instance, name, parse_bool(data)?);
                Ok(data.len())
            }),
        ),
        File::Cpu(instance, cpu, name) => open_cpu_file(instance, cpu, name, flags),
        File::TraceStat(cpu) => fnprof::open_stat(cpu),
    }
}

/// Sets an option and hands it to what acts on it. Options read when the trace is printed
/// or when `trace` is opened (`pause-on-trace`) need nothing more.
fn set_option(instance: &Instance, name: &str, on: bool) {
    instance.options.set(name, on);
    match name {
        "overwrite" => instance.buffer().set_overwrite(on),
        "record-cmd" => instance
            .shared
            .record_cmd
            .store(on, std::sync::atomic::Ordering::Relaxed),
        "stacktrace" | "userstacktrace" => instance.apply_stack_options(),
        "record-tgid" if on => crate::options::keep_tgids(),
        "func_stack_trace" => crate::ftrace::option_changed(instance, name, on),
        _ => {}
    }
}

/// Opens `trace` (or `per_cpu/cpuN/trace`). A reader opened with `pause-on-trace` set
/// stops recording until it closes, as the kernel's `trace` file once always did.
fn open_trace(
    instance: Arc<Instance>,
    cpu: Option<usize>,
    flags: OpenFlags,
) -> Result<Box<dyn OpenFile>, Errno> {
    if !flags.read {
        return rw("", Box::new(|data| Ok(data.len())));
    }
    let pause = instance.options.get("pause-on-trace");
    if pause {
        instance.shared.pause();
    }
    let content = crate::output::format_trace(&instance, instance.buffer(), cpu);
    let file = TextFile::new(content, Some(Box::new(|data| Ok(data.len()))));
    if !pause {
        return Ok(Box::new(file));
    }
    Ok(Box::new(
        file.on_release(Box::new(move || instance.shared.resume())),
    ))
}

fn open_instance_file(
    instance: Arc<Instance>,
    name: &'static str,
    flags: OpenFlags,
) -> Result<Box<dyn OpenFile>, Errno> {
    if let Some(file) = crate::ftrace::files::open(instance.clone(), name, flags) {
        return file;
    }
    match name {
        "README" => text(README),
        "available_events" => text(registry().available_events()),
        "available_filter_functions" => {
            text(ustrace_inspect::symbols::inventory().available_filter_functions())
        }
        "available_filter_functions_addrs" => {
            text(ustrace_inspect::symbols::inventory().available_filter_functions_addrs())
        }
        "enabled_functions" => text(ustrace_fprobe::enabled_functions()),
        "function_profile_enabled" => fnprof::open_enabled(instance),
        "dynamic_events" => crate::dynevent::open(flags),
        "synthetic_events" => crate::synth::open(flags),
        "saved_cmdlines" => text(crate::thread::saved_cmdlines()),
        name if crate::ftrace::filter::SetKind::from_file_name(name).is_some() => {
            let kind = crate::ftrace::filter::SetKind::from_file_name(name).expect("checked");
            Ok(crate::ftrace::filter::open(instance, kind, flags))
        }
        "saved_tgids" => text(crate::options::saved_tgids()),
        // The kernel lists the formats `bprint` records point at (trace_printk); ustrace has
        // no `bprint`, so none. trace-cmd record saves this file into trace.dat.
        "printk_formats" => text(""),
        "saved_cmdlines_size" => rw(
            format!("{}\n", crate::thread::saved_cmdlines_size()),
            Box::new(|data| {
                crate::thread::set_saved_cmdlines_size(parse_ulong(data)?)?;
                Ok(data.len())
            }),
        ),
        "tracing_on" => rw(
            if instance.shared.tracing_on() {
                "1\n"
            } else {
                "0\n"
            },
            Box::new(move |data| {
                instance.shared.set_tracing_on(parse_ulong(data)? != 0);
                Ok(data.len())
            }),
        ),
        "trace" => {
            if flags.truncate {
                instance.reset_buffer();
            }
            open_trace(instance, None, flags)
        }
        "tracing_cpumask" => rw(
            instance.shared.cpumask.text(),
            Box::new(move |data| {
                instance.write_cpumask(data)?;
                Ok(data.len())
            }),
        ),
        "trace_pipe" => Ok(Box::new(TracePipe::new(
            instance,
            None,
            false,
            flags.nonblock,
        ))),
        "trace_marker" => Ok(Box::new(crate::marker::MarkerFile::new(instance))),
        "trace_clock" => rw(
            clock_listing(instance.buffer().clock()),
            Box::new(move |data| {
                let clock = Clock::from_name(text_arg(data)?.trim()).ok_or(Errno::EINVAL)?;
                if clock != instance.buffer().clock() {
                    instance.buffer().set_clock(clock);
                    instance.reset_buffer();
                }
                Ok(data.len())
            }),
        ),
        "buffer_size_kb" => rw(
            buffer_size_text(instance.buffer()),
            Box::new(move |data| {
                let bytes = buffer_bytes(data)?;
                instance.buffer().resize(bytes).map_err(|_| Errno::ENOMEM)?;
                Ok(data.len())
            }),
        ),
        "buffer_total_size_kb" => text(format!(
            "{}\n",
            (0..instance.buffer().nr_cpus())
                .map(|cpu| instance.buffer().size_of_cpu(cpu) / 1024)
                .sum::<usize>()
        )),
        "free_buffer" => {
            let on_close = instance.clone();
            Ok(Box::new(
                TextFile::new("", Some(Box::new(|data| Ok(data.len())))).on_release(Box::new(
                    move || {
                        if on_close.options.get("disable_on_free") {
                            on_close.shared.set_tracing_on(false);
                        }
                        let _ = on_close.buffer().resize(1);
                    },
                )),
            ))
        }
        "error_log" => {
            if flags.truncate {
                instance.clear_error_log();
            }
            let content = if flags.read {
                instance.error_log_text()
            } else {
                String::new()
            };
            rw(content, Box::new(|data| Ok(data.len())))
        }
        "trace_options" => rw(
            instance.options.listing(),
            Box::new(move |data| {
                let name = text_arg(data)?.trim();
                let (option, on) = match name.strip_prefix("no") {
                    Some(rest) if crate::options::bit(rest).is_some() => (rest, false),
                    _ => (name, true),
                };
                if crate::options::bit(option).is_none() {
                    return Err(Errno::EINVAL);
                }
                set_option(&instance, option, on);
                Ok(data.len())
            }),
        ),
        "set_event" => {
            if flags.truncate && !flags.append {
                set_all(instance.files_of(None), false)?;
            }
            let listing: String = instance
                .files_of(None)
                .iter()
                .filter(|f| f.is_enabled())
                .map(|f| format!("{}:{}\n", f.event.system(), f.event.name()))
                .collect();
            rw(
                listing,
                Box::new(move |data| {
                    crate::set_event::write(&instance, data)?;
                    Ok(data.len())
                }),
            )
        }
        "snapshot" => crate::snapshot::open(instance, flags),
        "set_event_pid" | "set_event_notrace_pid" => {
            let notrace = name == "set_event_notrace_pid";
            if flags.truncate && !flags.append {
                instance.update_pids(|lists| {
                    if notrace {
                        lists.notrace.clear()
                    } else {
                        lists.trace.clear()
                    }
                });
            }
            let lists = instance.pids();
            let shown = crate::filter::pids_text(if notrace {
                &lists.notrace
            } else {
                &lists.trace
            });
            rw(
                shown,
                Box::new(move |data| {
                    crate::filter::write_pids(&instance, notrace, data)?;
                    Ok(data.len())
                }),
            )
        }
        _ => Err(Errno::ENOENT),
    }
}

fn open_cpu_file(
    instance: Arc<Instance>,
    cpu: usize,
    name: &'static str,
    flags: OpenFlags,
) -> Result<Box<dyn OpenFile>, Errno> {
    match name {
        "trace" => {
            if flags.truncate {
                instance.buffer().reset_cpu(cpu);
            }
            open_trace(instance, Some(cpu), flags)
        }
        "trace_pipe" => Ok(Box::new(TracePipe::new(
            instance,
            Some(cpu),
            false,
            flags.nonblock,
        ))),
        "trace_pipe_raw" => Ok(Box::new(TracePipe::new(
            instance,
            Some(cpu),
            true,
            flags.nonblock,
        ))),
        "stats" => text(cpu_stats(&instance, cpu)),
        "buffer_size_kb" => rw(
            format!("{}\n", instance.buffer().size_of_cpu(cpu) / 1024),
            Box::new(move |data| {
                let bytes = buffer_bytes(data)?;
                instance
                    .buffer()
                    .resize_cpu(cpu, bytes)
                    .map_err(|_| Errno::ENOMEM)?;
                Ok(data.len())
            }),
        ),
        _ => Err(Errno::ENOENT),
    }
}

/// The bytes a `buffer_size_kb` write asks for per CPU. `0` is `EINVAL` and a number past
/// `u64` `ERANGE`, as on the kernel. A number of KiB whose bytes do not fit is `ENOMEM`,
/// as every size above the ceiling (`ustrace_ringbuf::MAX_SIZE_PER_CPU`) is: the kernel
/// shifts it into bytes unchecked, so that from 2^54 KiB on it wraps and 18014398509481984
/// gives the smallest buffer; a size that large cannot be backed, and we say so.
fn buffer_bytes(data: &[u8]) -> Result<usize, Errno> {
    let kb = parse_ulong(data)?;
    if kb == 0 {
        return Err(Errno::EINVAL);
    }
    kb.checked_mul(1024)
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or(Errno::ENOMEM)
}

/// `buffer_size_kb`: the size every CPU has, or `X` when they differ, as the kernel shows.
fn buffer_size_text(buffer: &ustrace_ringbuf::RingBuffer) -> String {
    let first = buffer.size_of_cpu(0);
    if (1..buffer.nr_cpus()).all(|cpu| buffer.size_of_cpu(cpu) == first) {
        format!("{}\n", first / 1024)
    } else {
        "X\n".to_string()
    }
}

fn cpu_stats(instance: &Instance, cpu: usize) -> String {
    let s = instance.buffer().stats(cpu);
    format!(
        "entries: {}\noverrun: {}\ncommit overrun: {}\nbytes: {}\noldest event ts: {}\nnow ts: {}\ndropped events: {}\nread events: {}\n",
        s.entries,
        s.overrun,
        s.commit_overrun,
        s.bytes,
        crate::output::Seconds(s.oldest_event_ts),
        crate::output::Seconds(s.now_ts),
        s.dropped_events,
        s.read_events
    )
}

fn clock_listing(current: Clock) -> String {
    let names: Vec<String> = Clock::ALL
        .iter()
        .map(|c| {
            if *c == current {
                format!("[{}]", c.name())
            } else {
                c.name().to_string()
            }
        })
        .collect();
    format!("{}\n", names.join(" "))
}

/// `events/header_page`: the page header layout, as the kernel describes its own.
fn header_page() -> String {
    let data = ustrace_ringbuf::page::PAGE_SIZE - ustrace_ringbuf::page::PAGE_HEADER_SIZE;
    format!(
        "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\
         \tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\
         \tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\
         \tfield: char data;\toffset:16;\tsize:{data};\tsigned:0;\n"
    )
}

/// `events/header_event`: the event header layout (compressed entry header).
const HEADER_EVENT: &str = "# compressed entry header\n\
\ttype_len    :    5 bits\n\
\ttime_delta  :   27 bits\n\
\tarray       :   32 bits\n\
\n\
\tpadding     : type == 29\n\
\ttime_extend : type == 30\n\
\ttime_stamp : type == 31\n\
\tdata max type_len  == 28\n";

/// The `README` file. Tools (the kernel's ftrace selftests among them) decide what a
/// tracefs supports by looking for syntax lines in it, so every `Format:`, `fetcharg`,
/// `type` and trigger line below is spelled exactly as the kernel spells it, and a line is
/// here only when this build accepts that syntax (`tests/readme.rs` checks both ways).
/// There is no kprobe or uprobe line: neither exists here.
const README: &str = "\
ustrace tracefs: the kernel's event tracing, served by this process.

# echo 0 > tracing_on : stop recording
# echo 1 > tracing_on : record again

 Important files:
  trace\t\t\t- the buffer as text; a truncating write (echo > trace) clears it
  trace_pipe\t\t- the buffer as text, consumed as read; blocks for new events
  error_log\t- the last errors of command writes, with a caret at the fault
  buffer_size_kb\t- ring buffer size per CPU, in KiB
  buffer_total_size_kb  - ring buffer size of all CPUs, in KiB
  free_buffer\t\t- shrinks the buffer when closed

  trace_clock\t\t- the clocks; the one in brackets stamps events

  trace_marker\t\t- a write becomes an ftrace:print (tracing_mark_write) event
  tracing_cpumask\t- hex mask of the CPUs whose events are recorded
  instances\t\t- mkdir makes an independent trace instance, rmdir removes it
  trace_options\t\t- the options; write NAME to set one, noNAME to clear it
\t\t\t  (also options/NAME)
  saved_cmdlines_size\t- how many thread names saved_cmdlines keeps (1-32768)
  saved_cmdlines\t- thread ids and names seen in the trace
  snapshot\t\t- 1 takes a snapshot, 0 frees it, 2 clears it; read shows it
  per_cpu/cpuN/\t\t- trace, trace_pipe, trace_pipe_raw, stats, buffer_size_kb per CPU

  available_events\t- events that can be enabled
  available_filter_functions - functions an fprobe can be put on
  available_filter_functions_addrs - the same, each with its address
  enabled_functions\t- functions with an fprobe on them
  dynamic_events\t\t- lists the dynamic events; a line written defines one,
\t\t\t  a '-:' line removes one, a truncating write removes all.
\t  accepts: event-definitions (one definition per line)
\t   Format: f[:[<group>/][<event>]] <func-name>[%return] [<args>]
\t           t[:[<group>/][<event>]] <tracepoint> [<args>]
\t           e[:[<group>/][<event>]] <attached-group>.<attached-event> [<args>] [if <filter>]
\t           s:[synthetic/]<event> <field> [<field>]
\t           -:[<group>/][<event>]
\t     args: <name>=fetcharg[:type]
\t fetcharg: $<efield>, @<address>, @<symbol>[+|-<offset>],
\t           $stack<index>, $stack, $retval, $comm, $arg<N>,
\t           <argname>[->field[->field|.field...]],
\t           +|-[u]<offset>(<fetcharg>), \\imm-value, \\\"imm-string\"
\t     kernel return probes support: $retval, $arg<N>, $comm
\t     type: s8/16/32/64, u8/16/32/64, x8/16/32/64, char, string, symbol,
\t           b<bit-width>@<bit-offset>/<container-size>, ustring,
\t           symstr, <type>\\[<array-size>\\]
\t    efield: in an 'e' probe, a field of <attached-group>/<attached-event>.
\t    field: <stype> <name>;
\t    stype: u8/u16/u32/u64, s8/s16/s32/s64, pid_t,
\t           [unsigned] char/int/long
  events/synthetic_events\t- Create/append/remove/show synthetic events
\t  Write into this file to define/undefine new synthetic events.
\t     example: echo 'myevent u64 lat; char name[]; long[] stack' >> synthetic_events
  set_event\t\t- enabled events; write SYS:EVENT, SYS:*, EVENT, !EVENT
\t\t\t  Can enable module events via: :mod:<module>
\t\t\t  (a module is the crate that declares the events)
  set_event_pid\t\t- only events of these thread ids are recorded
  set_event_notrace_pid\t- events of these thread ids are not recorded
  events/\t\t- one directory per system:
      enable\t\t- 1 turns every event on, 0 off
  events/<system>/\t- one directory per event of <system>:
      enable\t\t- 1 turns the system's events on, 0 off
      filter\t\t- a filter for each event of the system that has its fields
  events/<system>/<event>/\t- the event's own files:
      enable\t\t- 1 records the event, 0 stops
      filter\t\t- only records that pass the filter are kept
      format\t\t- the record layout and print format
      trigger\t\t- commands run when the event is hit
\t    Format: <trigger>[:count][if <filter>]
\t   trigger: traceon, traceoff
\t            enable_event:<system>:<event>
\t            disable_event:<system>:<event>
\t            enable_hist:<system>:<event>
\t            disable_hist:<system>:<event>
\t\t    stacktrace
\t\t    snapshot
\t\t    hist (see below)
\t   example: echo traceoff > events/kv/get/trigger
\t            echo traceoff:3 > events/kv/get/trigger
\t            echo 'enable_event:net:respond:3 if latency_ns > 1000' > \\
\t                  events/kv/get/trigger
\t   A count runs the trigger that many times; it is counted only when
\t    the trigger changed something.
\t   Remove a trigger by writing it again after a '!' (with ':0' for one
\t    that had a count); its filter need not be repeated.

      hist trigger\t- aggregates the event's hits into a table, shown in 'hist'
\t    Format: hist:keys=<field1[,field2,...]>
\t            [:<var1>=<field|var_ref|numeric_literal>[,<var2>=...]]
\t            [:values=<field1[,field2,...]>]
\t            [:sort=<field1[,field2,...]>]
\t            [:size=#entries]
\t            [:pause][:continue][:clear]
\t            [:name=histname1]
\t            [:nohitcount]
\t            [:<handler>.<action>]
\t            [if <filter>]

\t    Special fields: common_timestamp (the record's time; .usecs for
\t            microseconds), common_cpu, common_stacktrace, common_comm.
\t    Keys (up to 3) index the table; values (up to 2 besides hitcount)
\t    are summed per key; sort takes up to 2 fields, each .ascending or
\t    .descending; size is rounded up to a power of two, 128 to 131072
\t    entries, and a full table counts Dropped. Field modifiers:
\t            .hex .sym .sym-offset .execname .syscall .log2
\t            .buckets=<size> .usecs .percent .graph .stacktrace
\t    A variable is a field, a $variable, a number, or an expression of
\t    those with + - * /. name= shares one table among compatible triggers.
\t    :pause stops adding to a trigger, :continue resumes, :clear empties
\t    it; write them with '>>' to the trigger already there ('>' removes
\t    the hist triggers first). enable_hist and disable_hist continue and
\t    pause every hist trigger of another event.

\t    A $variable of another event is read from that event's entry with
\t    the same key (qualify it as <system>.<event>.$var when two events
\t    define it); inside an expression reading it unsets it. A handler
\t    runs its action when an entry is updated:
\t        onmatch(matching.event)  - every update whose variables resolved
\t        onmax(var)               - var exceeds the entry's maximum
\t        onchange(var)            - var differs from the entry's last value
\t    The actions:
\t        trace(<synthetic_event>,param list)  - generate a synthetic event
\t        <synthetic_event>(param list)        - the same
\t        save(field,...)                      - keep fields in the entry
\t        snapshot()                           - take a snapshot
\t    A param is a $variable or a field of either event (a field of the
\t    matching event as <system>.<event>.<field>).
";
