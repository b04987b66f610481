//! ustrace-inspect: what ustrace knows about the process it lives in.
//!
//! The kernel's tracer can name any kernel function (kallsyms), read any
//! address without crashing (`copy_from_kernel_nofault` and the exception
//! table) and walk the kernel stack. ustrace runs inside an ordinary process,
//! so this crate gives it the same three powers over that process:
//!
//! ```text
//!   fprobes / set_ftrace_filter ──► symbols   (names ⇄ addresses of every loaded object)
//!   filters (.function, .ustring)
//!   fetch args (+0($arg1):ustring)──► uaccess (fault-safe loads, no syscall per read)
//!   stacktrace trigger           ──► stack   (return addresses + kernel-style printing)
//!   BTF-style fetch args         ──► debuginfo (parameter names/types from DWARF)
//! ```
//!
//! Everything on a probe-hit path (`uaccess::read*`, `stack::capture`,
//! `Inventory::lookup` on an already built inventory) takes no lock, makes no
//! allocation and no syscall. Building an [`symbols::Inventory`] parses ELF
//! files and is done once, off the hot path, and again only when objects are
//! loaded or unloaded.

pub mod debuginfo;
pub mod stack;
pub mod symbols;
pub mod uaccess;
