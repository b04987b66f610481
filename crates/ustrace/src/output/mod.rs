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
//! The options `context-info`, `irq-info`, `raw`, `hex` and `bin` change the layout as they
//! do on the kernel; lost events print as `CPU:N [LOST M EVENTS]` before the first event
//! that follows them.

pub mod print_fmt;

use std::fmt::Write;

use ustrace_ringbuf::Event as RawEvent;

use crate::event::field::read_int;
use crate::event::registry::{registry, EventId, MARKER_ID, STACK_ID};
use crate::trace::Instance;

/// A nanosecond timestamp as the kernel prints it: `SECS.USECS`, seconds right-aligned
/// in five columns.
pub struct Seconds(pub u64);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>5}.{:06}",
            self.0 / 1_000_000_000,
            (self.0 % 1_000_000_000) / 1000
        )
    }
}

/// Symbolizes addresses for `%pS`/`%ps` with the process's symbol table.
pub struct ProcessSymbols;

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
}

/// The header `trace` starts with.
pub fn trace_header(instance: &Instance) -> String {
    header_for(instance, instance.buffer())
}

/// The header for `buffer` (the live one, or a snapshot) with `instance`'s options.
pub fn header_for(instance: &Instance, buffer: &ustrace_ringbuf::RingBuffer) -> String {
    let mut out = String::from("# tracer: nop\n#\n");
    if !instance.options.get("context-info") {
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
    if instance.options.get("irq-info") {
        out.push_str(
            "#                                _-----=> irqs-off/BH-disabled\n\
             #                               / _----=> need-resched\n\
             #                              | / _---=> hardirq/softirq\n\
             #                              || / _--=> preempt-depth\n\
             #                              ||| / _-=> migrate-disable\n\
             #                              |||| /     delay\n\
             #           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION\n\
             #              | |         |   |||||     |         |\n",
        );
    } else {
        out.push_str(
            "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n\
             #              | |         |         |         |\n",
        );
    }
    out
}

/// The number of CPUs the kernel would print as `#P:`.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Appends the text of one event (and a lost-events line before it, if any) to `out`.
pub fn format_event(instance: &Instance, event: &RawEvent, out: &mut String) {
    if event.lost_before > 0 {
        let _ = writeln!(out, "CPU:{} [LOST {} EVENTS]", event.cpu, event.lost_before);
    }
    let record = &event.data[..];
    let id = EventId(read_int(record, 0, 2, false) as u16);
    let pid = read_int(record, 4, 4, true) as i32;
    let options = &instance.options;
    if options.get("bin") {
        // The binary layout is the kernel's: pid, cpu, timestamp as native integers.
        let mut raw = Vec::new();
        raw.extend_from_slice(&pid.to_ne_bytes());
        raw.extend_from_slice(&(event.cpu as i32).to_ne_bytes());
        raw.extend_from_slice(&event.ts.to_ne_bytes());
        out.push_str(&String::from_utf8_lossy(&raw));
        return;
    }
    if options.get("hex") {
        let _ = write!(
            out,
            "{pid:08x} {:08x} {:016x} type: {}\n\n",
            event.cpu, event.ts, id.0
        );
        return;
    }
    let registered = registry().by_id(id);
    if options.get("raw") {
        let _ = write!(out, "{pid} {} {} ", event.cpu, event.ts);
        match registered {
            Some(ev) if id == MARKER_ID => {
                let ip = read_int(record, 8, 8, false);
                let text = record.get(16..).unwrap_or_default();
                let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
                let _ = write!(out, "# {ip:x} {}", String::from_utf8_lossy(&text[..end]));
                let _ = ev;
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
            _ => {
                let _ = writeln!(out, "type: {}", id.0);
            }
        }
        return;
    }
    if options.get("context-info") {
        let comm = if pid == 0 {
            "<idle>".to_string()
        } else {
            crate::thread::comm_of(pid).unwrap_or_else(|| "<...>".to_string())
        };
        let _ = write!(out, "{comm:>16}-{pid:<7} [{:03}] ", event.cpu);
        if options.get("irq-info") {
            out.push_str(".....");
        }
        let _ = write!(out, " {}: ", Seconds(event.ts));
    }
    if id == STACK_ID {
        render_stack(instance, record, out);
        return;
    }
    match registered {
        Some(ev) if ev.class.render_line(record, out) => {
            if !out.ends_with('\n') {
                out.push('\n');
            }
        }
        Some(ev) => {
            out.push_str(ev.class.output_name());
            out.push_str(": ");
            let start = out.len();
            ev.display.render(record, &ProcessSymbols, out);
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
