//! The filter stage: a compiled filter program that decides, on one built record and its
//! layout, whether the record is kept.
//!
//! It knows the record's bytes and the event's fields, and nothing of event files or
//! instances: binding a program to an event file, subsystem filters and error logging are
//! the `filter` files' business ([`crate::filter`]). A write compiles once into a flat
//! program (`ustrace_filter`) that runs on the record without a lock or an allocation.

use ustrace_filter::{CompileEnv, Context, Field, Program};

use crate::event::field::FieldDesc;

/// Resolves a function name to its address range, for `.function` filters.
fn function_range(name: &str) -> Option<std::ops::Range<u64>> {
    let inventory = ustrace_inspect::symbols::inventory();
    let symbol = inventory.find(name).into_iter().next()?;
    Some(symbol.addr as u64..(symbol.addr + symbol.size) as u64)
}

fn function_containing(addr: u64) -> Option<std::ops::Range<u64>> {
    let inventory = ustrace_inspect::symbols::inventory();
    let (symbol, _) = inventory.lookup(addr as usize)?;
    Some(symbol.addr as u64..(symbol.addr + symbol.size) as u64)
}

/// Compiles `text` against an event's fields (`layout`, the common fields included).
pub fn compile(layout: &[FieldDesc], text: &str) -> Result<Program, ustrace_filter::FilterError> {
    let fields: Vec<Field<'_>> = layout
        .iter()
        .map(|f| Field {
            name: &f.name,
            c_type: &f.c_type,
            offset: f.offset,
            size: f.size,
            signed: f.signed,
        })
        .collect();
    let env = CompileEnv {
        resolve_function: Some(&function_range),
        resolve_address: Some(&function_containing),
        ..CompileEnv::default()
    };
    ustrace_filter::compile(text, &fields, &env)
}

fn read_user_string(addr: u64, buf: &mut [u8]) -> Option<usize> {
    ustrace_inspect::uaccess::read_str(addr as usize, buf).ok()
}

/// Whether `record` passes `program`, with this thread's CPU and name as context.
/// A compiled filter and what it needs from outside the record, decided once.
pub struct Compiled {
    program: Program,
    needs_comm: bool,
    needs_cpu: bool,
    /// An integer-only program that reads no common field: it decides on a record whose
    /// header is not written yet.
    headerless: bool,
}

impl Compiled {
    /// Wraps a compiled program, noting once whether it reads `comm` or `cpu`.
    pub fn new(program: Program) -> Compiled {
        Compiled {
            needs_comm: program.needs_comm(),
            needs_cpu: program.needs_cpu(),
            headerless: program.reads_from() >= crate::event::field::COMMON_SIZE,
            program,
        }
    }

    /// The filter as written, as the `filter` file shows it.
    pub fn text(&self) -> &str {
        self.program.text()
    }

    /// The lowest record offset the filter reads (see `Program::reads_from`): a record
    /// checked by a filter that reads no common field needs no header until it is kept.
    #[inline]
    pub fn reads_from(&self) -> usize {
        self.program.reads_from()
    }

    /// [`Compiled::matches`] for a record whose common header is not written yet, when the
    /// program can decide without it (integer fields only, none of them common, and the
    /// record long enough for every load): no context, no call. `None` otherwise.
    #[inline(always)]
    pub fn matches_headerless(&self, record: &[u8]) -> Option<bool> {
        if !self.headerless {
            return None;
        }
        self.program.matches_fields_only(record)
    }

    /// Whether `record` passes, with this thread's CPU and name as context; those are
    /// looked up only when the program names them.
    #[inline]
    pub fn matches(&self, record: &[u8]) -> bool {
        // An integer-only filter needs neither the CPU nor the comm.
        match self.program.matches_fields_only(record) {
            Some(m) => m,
            None => self.matches_in_context(record),
        }
    }

    #[inline(never)]
    fn matches_in_context(&self, record: &[u8]) -> bool {
        let comm = if self.needs_comm {
            crate::thread::current_comm_bytes()
        } else {
            [0; 16]
        };
        let cpu = if self.needs_cpu {
            ustrace_ringbuf::cpu::current_cpu() as u32
        } else {
            0
        };
        let ctx = Context {
            cpu,
            comm: &comm,
            read_str: Some(&read_user_string),
        };
        // `matches` has already tried the integer-only walk.
        self.program.matches_steps(record, &ctx)
    }
}
