//! Text output identical to the kernel's `trace` and `trace_pipe`.
//!
//! A line is the context — thread name and id, CPU, the latency flags, the timestamp — then
//! the event's name and the text its print format renders:
//!
//! ```text
//!             bash-9737    [001] .....   455.787791: tracing_mark_write: hi
//! └──── %16s ────┘ └%-7d┘ [%03d] flags  %5lu.%06lu   name                text
//! ```
//!
//! The options change the layout as they do on the kernel: `context-info`, `irq-info`,
//! `record-tgid` (a TGID column), `latency-format` (the latency header and columns, with
//! `verbose` their long form), `fields` (every field by its type instead of the print
//! format), `hash-ptr` (plain `%p` hashed), `annotate` (a line where a CPU's entries start,
//! once overwriting lost some), `raw`, `hex`, `bin`, `sym-offset`, `sym-addr`. Lost
//! events print as `CPU:N [LOST M EVENTS]` before the first event that follows them.

pub use crate::event::print_fmt;

use std::fmt::Write;
use std::sync::OnceLock;

use ustrace_ringbuf::Event as RawEvent;

use crate::event::field::read_int;
use crate::event::registry::{registry, Event, EventId, MARKER_ID, STACK_ID, USER_STACK_ID};
use crate::event::FieldKind;
use crate::trace::Instance;

pub use crate::buffers::Seconds;

/// Symbolizes addresses for `%pS`/`%ps` with the process's symbol table, and prints a plain
/// `%p` hashed (the `hash-ptr` option, on by default) or as is.
pub struct ProcessSymbols {
    /// Whether a plain `%p` prints hashed (the `hash-ptr` option).
    pub hash_ptr: bool,
}

impl print_fmt::Symbolizer for ProcessSymbols {
    fn symbolize(&self, addr: u64, with_offset: bool) -> Option<String> {
        let inventory = ustrace_inspect::symbols::inventory();
        let (symbol, offset) = inventory.lookup(addr as usize)?;
        Some(if with_offset {
            format!("{}+0x{offset:x}/0x{:x}", symbol.name, symbol.size)
        } else {
            symbol.name.clone()
        })
    }

    fn plain_pointer(&self, addr: u64) -> String {
        // As the kernel's `%p`: NULL and error values are not addresses and print as they
        // are; others print as a keyed hash of 32 bits, the same for the same address while
        // the process lives, so equal pointers can still be matched up.
        let error_or_null = addr == 0 || addr >= (-4095i64) as u64;
        if !self.hash_ptr || error_or_null {
            return format!("{addr:016x}");
        }
        format!("{:016x}", pointer_hash(addr))
    }
}

/// The hash `%p` prints: keyed by a random key chosen once per process (the kernel keys
/// its hash once per boot), cut to 32 bits as the kernel does.
fn pointer_hash(addr: u64) -> u64 {
    use std::hash::BuildHasher;
    static KEY: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    KEY.get_or_init(Default::default).hash_one(addr) & 0xffff_ffff
}

/// The header `trace` starts with.
pub fn trace_header(instance: &Instance) -> String {
    header_for(instance, instance.buffer())
}

/// The header for `buffer` (the live one, or a snapshot) with `instance`'s options.
pub fn header_for(instance: &Instance, buffer: &ustrace_ringbuf::RingBuffer) -> String {
    let mut out = format!(
        "# tracer: {}\n#\n",
        crate::ftrace::output::tracer_name(instance)
    );
    let options = &instance.options;
    if !options.get("context-info") {
        return out;
    }
    let verbose = options.get("verbose");
    if options.get("latency-format") {
        // Like the kernel, an empty buffer gets no latency header.
        if buffer.entries() == 0 {
            return out;
        }
        latency_header(buffer, &mut out);
        if !verbose {
            out.push_str(LATENCY_HELP);
        }
        return out;
    }
    if verbose {
        return out;
    }
    let _ = writeln!(
        out,
        "# entries-in-buffer/entries-written: {}/{}   #P:{}",
        buffer.entries(),
        buffer.written(),
        online_cpus()
    );
    out.push_str("#\n");
    let tgid = options.get("record-tgid");
    if options.get("irq-info") {
        // With the TGID column the flag legend moves right by its width.
        let pad = if tgid { "          " } else { "" };
        for legend in [
            "                                _-----=> irqs-off/BH-disabled\n",
            "                               / _----=> need-resched\n",
            "                              | / _---=> hardirq/softirq\n",
            "                              || / _--=> preempt-depth\n",
            "                              ||| / _-=> migrate-disable\n",
            "                              |||| /     delay\n",
        ] {
            out.push('#');
            out.push_str(pad);
            out.push_str(legend);
        }
        out.push_str(if tgid {
            "#           TASK-PID       TGID    CPU#  |||||  TIMESTAMP  FUNCTION\n\
             #              | |           |       |   |||||     |         |\n"
        } else {
            "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION\n\
             #              | |         |   |||||     |         |\n"
        });
    } else {
        out.push_str(if tgid {
            "#           TASK-PID       TGID    CPU#     TIMESTAMP  FUNCTION\n\
             #              | |           |       |         |         |\n"
        } else {
            "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n\
             #              | |         |         |         |\n"
        });
    }
    out
}

/// The column legend under the latency header (left out with `verbose`), as the kernel's.
const LATENCY_HELP: &str = "#                    _------=> CPU#            \n\
#                   / _-----=> irqs-off/BH-disabled\n\
#                  | / _----=> need-resched    \n\
#                  || / _---=> hardirq/softirq \n\
#                  ||| / _--=> preempt-depth   \n\
#                  |||| / _-=> migrate-disable \n\
#                  ||||| /     delay           \n\
#  cmd     pid     |||||| time  |   caller     \n\
#     \\   /        ||||||  \\    |    /       \n\
";

/// The kernel's latency-trace header. The figures a latency tracer would fill in (the
/// worst latency, the task that had it) are those of the `nop` tracer: zero and empty.
fn latency_header(buffer: &ustrace_ringbuf::RingBuffer, out: &mut String) {
    let _ = write!(
        out,
        "# nop latency trace v1.1.5 on {}\n\
         # --------------------------------------------------------------------\n\
         # latency: 0 us, #{}/{}, CPU#0 | (M:{} VP:0, KP:0, SP:0 HP:0 #P:{})\n\
         #    -----------------\n\
         #    | task: -0 (uid:0 nice:0 policy:0 rt_prio:0)\n\
         #    -----------------\n\
         #\n",
        kernel_release(),
        buffer.entries(),
        buffer.written(),
        preemption_model(),
        online_cpus()
    );
}

/// The running kernel's release, which the kernel's latency header names.
fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it or fails.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname NUL-terminates the field.
    let release = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) };
    release.to_string_lossy().into_owned()
}

/// The `M:` of the latency header: the kernel's preemption model as the kernel names it.
/// A kernel built with dynamic preemption prints `PREEMPT(mode)`; the mode is learned from
/// debugfs (the current one, in brackets), else the kernel log's last `Dynamic Preempt:
/// mode` line (printed at boot and at each change; the log is readable by root), else a
/// `preempt=` boot parameter. A kernel without it names its model in its version string
/// (`PREEMPT_RT`, `PREEMPT`). Otherwise `unknown`: user space cannot tell more.
fn preemption_model() -> String {
    static MODEL: OnceLock<String> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            if let Ok(text) = std::fs::read_to_string("/sys/kernel/debug/sched/preempt") {
                if let Some(current) = text
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix('(').and_then(|w| w.strip_suffix(')')))
                {
                    return format!("PREEMPT({current})");
                }
            }
            let boot_param = std::fs::read_to_string("/proc/cmdline")
                .ok()
                .and_then(|line| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix("preempt=").map(str::to_owned))
                });
            // The log's line is the later word when the mode was changed after boot.
            if let Some(mode) = logged_preempt_mode().or(boot_param) {
                return format!("PREEMPT({mode})");
            }
            let version = kernel_version();
            let flags: Vec<&str> = version.split_whitespace().collect();
            if flags.contains(&"PREEMPT_RT") {
                "PREEMPT_RT".into()
            } else if flags.contains(&"PREEMPT") {
                "PREEMPT".into()
            } else {
                "unknown".into()
            }
        })
        .clone()
}

/// The mode of the kernel log's last `Dynamic Preempt: mode` line, if the log (`/dev/kmsg`,
/// root only) still holds one.
fn logged_preempt_mode() -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut log = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .ok()?;
    let mut mode = None;
    // Each read gives one record, `prefix;message`; a buffer too small for it fails.
    let mut record = vec![0u8; 8192];
    loop {
        match log.read(&mut record) {
            Ok(0) => break,
            Ok(n) => {
                let text = String::from_utf8_lossy(&record[..n]);
                let message = text.split_once(';').map_or("", |(_, m)| m);
                if let Some(m) = message
                    .lines()
                    .next()
                    .and_then(|l| l.strip_prefix("Dynamic Preempt: "))
                {
                    mode = Some(m.trim().to_string());
                }
            }
            // Records were overwritten under the reader: it goes on at the oldest kept.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    mode
}

/// The running kernel's version string (`uname -v`), which names its build flags.
fn kernel_version() -> String {
    // SAFETY: utsname is plain data; uname fills it or fails.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::new();
    }
    // SAFETY: uname NUL-terminates the field.
    let version = unsafe { std::ffi::CStr::from_ptr(uts.version.as_ptr()) };
    version.to_string_lossy().into_owned()
}

/// The number of CPUs the kernel would print as `#P:`.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Where a reader is in its walk over the buffer: what the kernel keeps in its trace
/// iterator for the latency columns and the `annotate` lines.
pub struct Cursor {
    /// Index of the next entry printed (the `verbose` latency column).
    idx: u64,
    /// Whether CPU-start annotations are printed: the `annotate` option, on a `trace`
    /// reader of a buffer that lost events to overwriting (the kernel decides at open).
    annotate: bool,
    /// CPUs whose first entry has been printed.
    started: Vec<bool>,
    /// The buffer's `time_start`: latency timestamps count from it.
    time_start: u64,
    /// The text of the entry being printed, reused from one entry to the next.
    scratch: String,
}

impl Cursor {
    /// A cursor for a consuming reader (`trace_pipe`): no annotations.
    pub fn for_pipe(instance: &Instance) -> Cursor {
        Cursor {
            idx: 0,
            annotate: false,
            started: Vec::new(),
            time_start: instance.time_start(),
            scratch: String::new(),
        }
    }

    /// A cursor for the `trace` file over `buffer`.
    pub fn for_trace(instance: &Instance, buffer: &ustrace_ringbuf::RingBuffer) -> Cursor {
        let overruns: u64 = (0..buffer.nr_cpus())
            .map(|cpu| buffer.stats(cpu).overrun)
            .sum();
        Cursor {
            idx: 0,
            annotate: instance.options.get("annotate") && overruns > 0,
            started: vec![false; buffer.nr_cpus()],
            time_start: instance.time_start(),
            scratch: String::new(),
        }
    }
}

/// The whole `trace` file of `buffer` (one CPU's with `cpu`): header, then every entry.
/// Bytes, not text: with `bin` each entry starts with binary fields.
pub fn format_trace(
    instance: &Instance,
    buffer: &ustrace_ringbuf::RingBuffer,
    cpu: Option<usize>,
) -> Vec<u8> {
    if crate::ftrace::output::tracer_name(instance) == "function_graph" {
        return crate::ftrace::output::format_graph_trace(instance, buffer, cpu);
    }
    let mut out = header_for(instance, buffer).into_bytes();
    let mut cursor = Cursor::for_trace(instance, buffer);
    let mut events = match cpu {
        Some(cpu) => buffer.iter_cpu(cpu),
        None => buffer.iter(),
    }
    .peekable();
    while let Some(event) = events.next() {
        let next_ts = events.peek().map(|e| e.ts);
        format_event_at(instance, &mut cursor, &event, next_ts, &mut out);
    }
    out
}

/// Appends one event (and a lost-events line before it, if any) to `out`.
pub fn format_event(instance: &Instance, event: &RawEvent, out: &mut Vec<u8>) {
    format_event_at(instance, &mut Cursor::for_pipe(instance), event, None, out);
}

/// Appends one event, `cursor` saying where the reader is and `next_ts` the timestamp of
/// the entry that follows (the latency format prints the gap to it).
///
/// The output is bytes because `bin` puts the pid, CPU and timestamp in as native
/// integers; every other layout is text, built in the cursor's scratch string (kept
/// between entries, so a long read does not allocate a line at a time) and copied out.
pub fn format_event_at(
    instance: &Instance,
    cursor: &mut Cursor,
    event: &RawEvent,
    next_ts: Option<u64>,
    out: &mut Vec<u8>,
) {
    if crate::ftrace::output::render_graph_event(instance, event, out) {
        return;
    }
    let mut text = std::mem::take(&mut cursor.scratch);
    text.clear();
    format_entry(instance, cursor, event, next_ts, &mut text, out);
    out.extend_from_slice(text.as_bytes());
    cursor.scratch = text;
}

/// One entry: its text goes to `out`, except `bin`'s, which goes straight to `bytes` (after
/// whatever text `out` holds by then).
fn format_entry(
    instance: &Instance,
    cursor: &mut Cursor,
    event: &RawEvent,
    next_ts: Option<u64>,
    out: &mut String,
    bytes: &mut Vec<u8>,
) {
    let idx = cursor.idx;
    cursor.idx += 1;
    if event.lost_before > 0 {
        let _ = writeln!(out, "CPU:{} [LOST {} EVENTS]", event.cpu, event.lost_before);
    }
    let record = &event.data[..];
    let id = EventId(read_int(record, 0, 2, false) as u16);
    let pid = read_int(record, 4, 4, true) as i32;
    let options = &instance.options;
    let context = options.get("context-info");
    let registered = registry().by_id(id);
    // The kernel's `bin`, `hex` and `raw` layouts print `type: N` for an entry whose event
    // has no layout of its own for them (every event here but the marker in `raw`), and
    // differ for an entry of no known event.
    let known = registered.is_some();
    if options.get("bin") {
        // The context as the kernel's: the pid and CPU as 32-bit, the timestamp as 64-bit
        // native integers.
        bytes.extend_from_slice(out.as_bytes());
        out.clear();
        if context {
            bytes.extend_from_slice(&pid.to_ne_bytes());
            bytes.extend_from_slice(&(event.cpu as i32).to_ne_bytes());
            bytes.extend_from_slice(&event.ts.to_ne_bytes());
        }
        if known {
            let _ = writeln!(out, "type: {}", id.0);
        }
        return;
    }
    if options.get("hex") {
        if context {
            // Each field's bytes most significant first, then a space.
            let _ = write!(out, "{pid:08x} {:08x} {:016x} ", event.cpu as i32, event.ts);
        }
        if known {
            let _ = writeln!(out, "type: {}", id.0);
        }
        out.push('\n');
        return;
    }
    if options.get("raw") {
        if context {
            let _ = write!(out, "{pid} {} {} ", event.cpu, event.ts);
        }
        match registered {
            Some(_) if id == MARKER_ID => {
                let ip = read_int(record, 8, 8, false);
                let text = record.get(16..).unwrap_or_default();
                let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
                let _ = write!(out, "# {ip:x} {}", String::from_utf8_lossy(&text[..end]));
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
            Some(_) => {
                let _ = writeln!(out, "type: {}", id.0);
            }
            None => {
                let _ = writeln!(out, "{} ?", id.0);
            }
        }
        return;
    }
    if cursor.annotate && !cursor.started.get(event.cpu).copied().unwrap_or(true) {
        cursor.started[event.cpu] = true;
        // As the kernel's: nothing before the first entries of the trace.
        if idx > 1 {
            let _ = writeln!(out, "##### CPU {} buffer started ####", event.cpu);
        }
    }
    if context {
        let comm = if pid == 0 {
            "<idle>".to_string()
        } else {
            crate::thread::comm_of(pid).unwrap_or_else(|| "<...>".to_string())
        };
        if options.get("latency-format") {
            latency_context(instance, cursor, idx, event, next_ts, &comm, out);
        } else {
            let _ = write!(out, "{comm:>16}-{pid:<7} ");
            if options.get("record-tgid") {
                match crate::options::tgid_of(pid) {
                    Some(tgid) => {
                        let _ = write!(out, "({tgid:>7}) ");
                    }
                    None => out.push_str("(-------) "),
                }
            }
            let _ = write!(out, "[{:03}] ", event.cpu);
            if options.get("irq-info") {
                lat_flags(record, out);
            }
            if instance.buffer().clock().in_nanos() {
                let _ = write!(out, " {}: ", Seconds(event.ts));
            } else {
                // Counters are not times: the kernel prints them as they are.
                let _ = write!(out, " {:>12}: ", event.ts);
            }
        }
    }
    if options.get("fields") {
        format_fields(id, registered.as_deref(), record, out);
        return;
    }
    if crate::ftrace::output::render_function(instance, record, out) {
        return;
    }
    if id == STACK_ID {
        render_stack(instance, record, out);
        return;
    }
    if id == USER_STACK_ID {
        render_user_stack(instance, record, out);
        return;
    }
    match registered {
        Some(ev)
            if ev
                .class
                .render_line_verbose(record, out, options.get("verbose")) =>
        {
            if !out.ends_with('\n') {
                out.push('\n');
            }
        }
        Some(ev) => {
            out.push_str(ev.class.output_name());
            if id == MARKER_ID {
                marker_writer(instance, record, out);
            }
            out.push_str(": ");
            let start = out.len();
            let symbols = ProcessSymbols {
                hash_ptr: options.get("hash-ptr"),
            };
            ev.display.render(record, &symbols, out);
            // The kernel ends every line with exactly one newline: a marker text that
            // brought its own keeps it, others get one.
            if id != MARKER_ID || !out[start..].ends_with('\n') {
                out.push('\n');
            }
        }
        None => {
            let _ = writeln!(out, "Unknown type {}", id.0);
        }
    }
}

/// What `sym-offset` and `sym-addr` add to a marker line's `tracing_mark_write`, as the
/// kernel adds them to the function that wrote the entry (its `ip`): here that is the
/// function that wrote the marker into the buffer, its offset and size from the process's
/// symbols (left out if they have none for it), and its address.
fn marker_writer(instance: &Instance, record: &[u8], out: &mut String) {
    let ip = read_int(record, 8, 8, false);
    if instance.options.get("sym-offset") {
        let inventory = ustrace_inspect::symbols::inventory();
        if let Some((symbol, offset)) = inventory.lookup(ip as usize) {
            let _ = write!(out, "+0x{offset:x}/0x{:x}", symbol.size);
        }
    }
    if instance.options.get("sym-addr") {
        let _ = write!(out, " <{ip:016x}>");
    }
}

/// The five flag columns (irqs-off, need-resched, hard/softirq, preempt depth,
/// migrate-disable) from the record's `common_flags` and `common_preempt_count`, as the
/// kernel prints them. User-space records carry none of these states, so they print as
/// dots; the decoding is the kernel's so the columns mean the same.
fn lat_flags(record: &[u8], out: &mut String) {
    const IRQS_OFF: u8 = 0x01;
    const IRQS_NOSUPPORT: u8 = 0x02;
    const NEED_RESCHED: u8 = 0x04;
    const HARDIRQ: u8 = 0x08;
    const SOFTIRQ: u8 = 0x10;
    const PREEMPT_RESCHED: u8 = 0x20;
    const NMI: u8 = 0x40;
    const BH_OFF: u8 = 0x80;
    let flags = record.get(2).copied().unwrap_or(0);
    let preempt = record.get(3).copied().unwrap_or(0);
    let irqs_off = match (flags & IRQS_OFF != 0, flags & BH_OFF != 0) {
        (true, true) => 'D',
        (true, false) => 'd',
        (false, true) => 'b',
        _ if flags & IRQS_NOSUPPORT != 0 => 'X',
        _ => '.',
    };
    let resched = match (flags & NEED_RESCHED != 0, flags & PREEMPT_RESCHED != 0) {
        (true, true) => 'N',
        (true, false) => 'n',
        (false, true) => 'p',
        _ => '.',
    };
    let (nmi, hard, soft) = (flags & NMI != 0, flags & HARDIRQ != 0, flags & SOFTIRQ != 0);
    let irq = match (nmi, hard, soft) {
        (true, true, _) => 'Z',
        (true, false, _) => 'z',
        (false, true, true) => 'H',
        (false, true, false) => 'h',
        (false, false, true) => 's',
        _ => '.',
    };
    out.push(irqs_off);
    out.push(resched);
    out.push(irq);
    let depth = |v: u8| char::from_digit(u32::from(v), 16).unwrap_or('.');
    out.push(if preempt & 0xf != 0 {
        depth(preempt & 0xf)
    } else {
        '.'
    });
    out.push(if preempt >> 4 != 0 {
        depth(preempt >> 4)
    } else {
        '.'
    });
}

/// The context columns of the latency format (`latency-format`, with `verbose` the long
/// form), as the kernel's: the time is counted from the buffer's start, and the gap to
/// the next entry shows as a mark (or, verbose, as a figure).
fn latency_context(
    instance: &Instance,
    cursor: &Cursor,
    idx: u64,
    event: &RawEvent,
    next_ts: Option<u64>,
    comm: &str,
    out: &mut String,
) {
    let record = &event.data[..];
    let pid = read_int(record, 4, 4, true) as i32;
    let verbose = instance.options.get("verbose");
    if verbose {
        let flags = record.get(2).copied().unwrap_or(0);
        let preempt = record.get(3).copied().unwrap_or(0) & 0xf;
        let _ = write!(
            out,
            "{comm:>16} {pid:>7} {:>3} {flags} {preempt:08x} {idx:08x} ",
            event.cpu
        );
    } else {
        let short: String = comm.chars().take(8).collect();
        let _ = write!(out, "{short:>8}-{pid:<7} {:>3}", event.cpu);
        lat_flags(record, out);
    }
    let in_ns = instance.buffer().clock().in_nanos();
    let next = next_ts.unwrap_or(event.ts);
    let mut abs = event.ts.wrapping_sub(cursor.time_start);
    let mut rel = next.wrapping_sub(event.ts);
    if in_ns {
        abs /= 1000;
        rel /= 1000;
    }
    match (verbose, in_ns) {
        (true, true) => {
            let _ = write!(
                out,
                "[{:08x}] {}.{:03}ms (+{}.{:03}ms): ",
                event.ts / 1000,
                abs / 1000,
                abs % 1000,
                rel / 1000,
                rel % 1000
            );
        }
        (true, false) => {
            let _ = write!(out, "[{:016x}] {abs} (+{rel}): ", event.ts);
        }
        (false, true) => {
            let _ = write!(out, " {abs:>4}us{}: ", delay_mark(rel * 1000));
        }
        (false, false) => {
            let _ = write!(out, " {abs:>4}: ");
        }
    }
}

/// The character the latency format puts after a timestamp for the gap to the next entry.
fn delay_mark(ns: u64) -> char {
    const MARKS: [(u64, char); 6] = [
        (1_000_000_000, '$'),
        (100_000_000, '@'),
        (10_000_000, '*'),
        (1_000_000, '#'),
        (100_000, '!'),
        (10_000, '+'),
    ];
    MARKS
        .iter()
        .find(|(limit, _)| ns > *limit)
        .map_or(' ', |(_, mark)| *mark)
}

/// The `fields` option: the event's name, then each field as ` name=value` by its type,
/// as the kernel's `print_event_fields`. The kernel's own entries (marker, stacks) have no
/// event of their own there and print as `UNKNOWN TYPE N`, and so they do here.
fn format_fields(id: EventId, event: Option<&Event>, record: &[u8], out: &mut String) {
    let Some(event) = event.filter(|_| ![MARKER_ID, STACK_ID, USER_STACK_ID].contains(&id)) else {
        let _ = writeln!(out, "UNKNOWN TYPE {}", id.0);
        return;
    };
    let _ = write!(out, "{}:", event.name());
    if event.fields.is_empty() {
        out.push_str("No fields found\n");
        return;
    }
    for field in &event.fields {
        let _ = write!(out, " {}=", field.name);
        if field.offset + field.size > record.len() {
            out.push_str("<OVERFLOW>");
            continue;
        }
        let at = &record[field.offset..];
        match field.kind {
            FieldKind::CharArray | FieldKind::TailString => {
                out.push_str(&c_str(&at[..field.size]));
            }
            FieldKind::DynString | FieldKind::DynBytes => {
                let loc = read_int(record, field.offset, 4, false) as usize;
                let (offset, len) = (loc & 0xffff, loc >> 16);
                let Some(data) = record.get(offset..offset + len) else {
                    out.push_str("<OVERFLOW>");
                    continue;
                };
                if field.kind == FieldKind::DynString {
                    out.push_str(&c_str(data));
                } else {
                    let bytes: Vec<String> = data.iter().map(|b| format!("{b:02x}")).collect();
                    out.push_str(&bytes.join(","));
                }
            }
            FieldKind::StringPtr => {
                let addr = read_int(record, field.offset, 8, false) as usize;
                let mut buf = [0u8; 256];
                match ustrace_inspect::uaccess::read_str(addr, &mut buf) {
                    Ok(n) => {
                        let text = String::from_utf8_lossy(&buf[..n]);
                        let _ = write!(out, "(0x{addr:016x}:{text})");
                    }
                    Err(_) => {
                        let _ = write!(out, "(0x{addr:016x})");
                    }
                }
            }
            FieldKind::Int | FieldKind::IntArray { .. } => match field.size {
                1 => {
                    let v = at[0];
                    if v.is_ascii_graphic() || v == b' ' {
                        let _ = write!(out, "'{}'", v as char);
                    }
                    let _ = write!(out, "({v})");
                }
                2 => {
                    let v = read_int(record, field.offset, 2, false) as u16;
                    let _ = write!(out, "0x{v:x} ({v})");
                }
                4 => {
                    let v = read_int(record, field.offset, 4, false) as u32;
                    let _ = write!(out, "0x{v:x} ({})", v as i32);
                }
                8 => {
                    let v = read_int(record, field.offset, 8, false);
                    let _ = write!(out, "0x{v:x} ({})", v as i64);
                }
                _ => out.push_str("<INVALID-SIZE>"),
            },
        }
    }
    out.push('\n');
}

/// Bytes up to the first NUL, as `%.*s` prints them.
fn c_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A stack entry prints as the kernel's: `<stack trace>` and one ` => function` line a frame.
fn render_stack(instance: &Instance, record: &[u8], out: &mut String) {
    let count = (read_int(record, 8, 4, true) as i64).clamp(0, 64) as usize;
    let addrs: Vec<usize> = (0..count)
        .map_while(|i| record.get(16 + 8 * i..24 + 8 * i))
        .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")) as usize)
        .collect();
    let flags = ustrace_inspect::symbols::SymFlags {
        offset: instance.options.get("sym-offset"),
        addr: instance.options.get("sym-addr"),
    };
    out.push_str("<stack trace>\n");
    out.push_str(&ustrace_inspect::stack::format_with_flags(
        &ustrace_inspect::symbols::inventory(),
        &addrs,
        flags,
    ));
}

/// A user stack entry prints as the kernel's: `<user stack trace>` and one ` =>  <address>`
/// line a frame, up to the first 0 (the kernel names objects only with `sym-userobj`,
/// which is not offered here).
fn render_user_stack(instance: &Instance, record: &[u8], out: &mut String) {
    let addrs: Vec<usize> = (0..crate::event_file::USER_STACK_ENTRIES)
        .map_while(|i| record.get(16 + 8 * i..24 + 8 * i))
        .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")) as usize)
        .collect();
    out.push_str("<user stack trace>\n");
    out.push_str(&ustrace_inspect::stack::format_user_stack(
        &addrs,
        false,
        instance.options.get("sym-addr"),
    ));
}
