//! What the parser needs to know about the world outside the command text:
//! function signatures (the debug-info arguments), the fields of the event an
//! eprobe attaches to, data-symbol addresses (`@SYM`) and which tracepoints
//! exist. [`ProbeEnv`] is implemented by the tracefs (which knows its events)
//! on top of [`InspectEnv`] (which knows this process's symbols and DWARF).

use std::sync::Arc;

use ustrace_inspect::debuginfo::{self, FunctionInfo};
use ustrace_inspect::symbols::Inventory;

/// How a source-event field is laid out (the eprobe `$FIELD` operand);
/// mirrors the core crate's `FieldDesc` kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// A plain integer of `size` bytes.
    Int,
    /// A fixed array of integers.
    IntArray {
        /// Bytes per element.
        elem_size: usize,
        /// Number of elements.
        len: usize,
    },
    /// A fixed `char[N]`, NUL-padded.
    CharArray,
    /// A `__data_loc char[]` string (u32 = len << 16 | offset from record start).
    DynString,
    /// A `__data_loc` byte array.
    DynBytes,
    /// A string running to the end of the record.
    TailString,
    /// A `char *` stored as a pointer value.
    StringPtr,
}

/// One field of a record: for source events (what `$FIELD` reads) and for
/// the records this crate lays out ([`crate::Program::fields`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSpec {
    /// Field name.
    pub name: String,
    /// C type as the format file prints it.
    pub c_type: String,
    /// Byte offset from the start of the record (common header included).
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
    /// Whether the format file says `signed:1`.
    pub signed: bool,
    /// Layout class.
    pub kind: FieldKind,
}

/// Knowledge the parser draws on. Every method has a "know nothing" default.
pub trait ProbeEnv {
    /// Signature of the function (or tracepoint) `name`, from debug info.
    /// `None` makes named arguments fail as the kernel does without BTF.
    fn function_info(&self, name: &str) -> Option<FunctionInfo> {
        let _ = name;
        None
    }

    /// Signature of the tracepoint `name` (`t` probes). Defaults to
    /// [`ProbeEnv::function_info`]; an environment whose tracepoints are
    /// not functions of the same name answers it separately.
    fn tracepoint_info(&self, name: &str) -> Option<FunctionInfo> {
        self.function_info(name)
    }

    /// Whether a tracepoint called `name` exists (`t` probes).
    fn has_tracepoint(&self, name: &str) -> bool {
        let _ = name;
        true
    }

    /// Fields of the event `system.event` (eprobes); `None` if no such event.
    fn event_fields(&self, system: &str, event: &str) -> Option<Vec<FieldSpec>> {
        let _ = (system, event);
        None
    }

    /// Whether fprobes/tprobes accept `%REG` operands. The kernel refuses
    /// them there (`BAD_VAR`: fprobes see only function arguments); a caller
    /// whose probe hits capture the full register set may opt in, and then
    /// answers [`crate::FetchContext::register`].
    fn fprobe_registers(&self) -> bool {
        false
    }

    /// Address of the data or function symbol `name` (`@SYM`).
    fn resolve_symbol(&self, name: &str) -> Option<u64> {
        let _ = name;
        None
    }
}

/// The environment that knows nothing: pure syntax checking.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEnv;

impl ProbeEnv for NoEnv {}

/// The environment backed by this process: symbols from the inventory (and
/// `dlsym` for data symbols), signatures from DWARF.
#[derive(Debug, Clone)]
pub struct InspectEnv {
    /// The symbol inventory used for lookups.
    pub inventory: Arc<Inventory>,
}

impl InspectEnv {
    /// An environment over the process-wide inventory.
    pub fn new() -> InspectEnv {
        InspectEnv {
            inventory: ustrace_inspect::symbols::inventory(),
        }
    }
}

impl Default for InspectEnv {
    fn default() -> Self {
        InspectEnv::new()
    }
}

impl ProbeEnv for InspectEnv {
    fn function_info(&self, name: &str) -> Option<FunctionInfo> {
        debuginfo::function_info_by_name(&self.inventory, name).ok()
    }

    fn resolve_symbol(&self, name: &str) -> Option<u64> {
        if let Some(sym) = self.inventory.find(name).into_iter().next() {
            return Some(sym.addr as u64);
        }
        let cname = std::ffi::CString::new(name).ok()?;
        // SAFETY: dlsym with RTLD_DEFAULT and a valid NUL-terminated name only
        // reads the loader's tables.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, cname.as_ptr()) };
        (!p.is_null()).then_some(p as u64)
    }
}
