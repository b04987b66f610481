//! The records the function tracers write: `ftrace:function` (id 1), `ftrace:funcgraph_entry`
//! (11) and `ftrace:funcgraph_exit` (10), laid out and numbered as the kernel's (6.18), so
//! `trace_pipe_raw` readers, libtraceevent and `trace-cmd` decode them from the `format`
//! files. They are written by the tracer's fprobe handlers, never enabled as events.

use std::sync::Arc;

use ustrace_ctl::vfs::Errno;

use crate::event::{Attachment, EventClass, EventId, FieldDesc, FieldKind};
use crate::event_file::EventFile;

/// `ftrace:function`, the kernel's `TRACE_FN`.
pub const FUNCTION_ID: EventId = EventId(1);
/// `ftrace:funcgraph_exit`, the kernel's `TRACE_GRAPH_RET`.
pub const GRAPH_EXIT_ID: EventId = EventId(10);
/// `ftrace:funcgraph_entry`, the kernel's `TRACE_GRAPH_ENT`.
pub const GRAPH_ENTRY_ID: EventId = EventId(11);

/// Bytes of a `function` record: header, `ip`, `parent_ip` (`args[]` empty).
pub const FUNCTION_LEN: usize = 24;
/// Bytes of a `funcgraph_entry` record: header, `func`, `depth`, padding (`args[]` empty).
pub const GRAPH_ENTRY_LEN: usize = 24;
/// Bytes of a `funcgraph_exit` record: header, `func`, `depth`, `overrun`, `calltime`,
/// `rettime`.
pub const GRAPH_EXIT_LEN: usize = 40;

fn int(name: &'static str, c_type: &'static str, offset: usize, size: usize) -> FieldDesc {
    FieldDesc {
        name: name.into(),
        c_type: c_type.into(),
        offset,
        size,
        signed: false,
        kind: FieldKind::Int,
    }
}

/// The empty `unsigned long args[]` the kernel's records end with (filled only when
/// function arguments are recorded, which ustrace does not do).
fn args(offset: usize) -> FieldDesc {
    FieldDesc {
        name: "args".into(),
        c_type: "unsigned long[]".into(),
        offset,
        size: 0,
        signed: false,
        kind: FieldKind::IntArray {
            elem_size: 8,
            len: 0,
        },
    }
}

/// Which of the three records.
pub(crate) enum FtraceRecord {
    Function,
    GraphEntry,
    GraphExit,
}

impl EventClass for FtraceRecord {
    fn system(&self) -> &str {
        "ftrace"
    }
    fn name(&self) -> &str {
        match self {
            FtraceRecord::Function => "function",
            FtraceRecord::GraphEntry => "funcgraph_entry",
            FtraceRecord::GraphExit => "funcgraph_exit",
        }
    }
    fn fields(&self) -> Vec<FieldDesc> {
        match self {
            FtraceRecord::Function => vec![
                int("ip", "unsigned long", 8, 8),
                int("parent_ip", "unsigned long", 16, 8),
                args(24),
            ],
            FtraceRecord::GraphEntry => vec![
                int("func", "unsigned long", 8, 8),
                int("depth", "unsigned int", 16, 4),
                args(24),
            ],
            FtraceRecord::GraphExit => vec![
                int("func", "unsigned long", 8, 8),
                int("depth", "unsigned int", 16, 4),
                int("overrun", "unsigned int", 20, 4),
                int("calltime", "unsigned long long", 24, 8),
                int("rettime", "unsigned long long", 32, 8),
            ],
        }
    }
    fn print_fmt(&self, _fields: &[FieldDesc]) -> String {
        match self {
            FtraceRecord::Function => {
                "\" %ps <-- %ps\", (void *)REC->ip, (void *)REC->parent_ip".into()
            }
            FtraceRecord::GraphEntry => "\"--> %ps (%u)\", (void *)REC->func, REC->depth".into(),
            // The kernel's own format prints `depth` where `over:` is (sic).
            FtraceRecord::GraphExit => "\"<-- %ps (%u) (start: %llx  end: %llx) over: %u\", \
                (void *)REC->func, REC->depth, REC->calltime, REC->rettime, REC->depth"
                .into(),
        }
    }
    fn attach(&self, _file: Arc<EventFile>) -> Result<Box<dyn Attachment>, Errno> {
        // Written by the function tracers, not enabled as events (no `enable` file).
        Err(Errno::EPERM)
    }
}
