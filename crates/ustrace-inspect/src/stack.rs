//! User stack traces for the `stacktrace` trigger and the `stacktrace` option.
//!
//! [`capture`] records the return addresses of the calling thread's stack,
//! innermost first, the way the kernel's stack-trace entry stores its
//! `caller[]` array; [`format_kernel_style`] prints them like
//! `trace_stack_print` does:
//!
//! ```text
//!  => do_work+0x1d/0x60
//!  => main_loop+0x4a/0x120
//!  => start+0x12/0x30 [libc.so.6]
//! ```
//!
//! [`format_user_stack`] prints the same addresses the way the kernel prints
//! a *user* stack (`userstacktrace` option): raw addresses, or object path
//! and offset with `sym-userobj`.
//!
//! Capturing uses the DWARF unwinder of libgcc_s (`_Unwind_Backtrace`), which
//! follows `.eh_frame` CFI and so works without frame pointers. On glibc 2.35+
//! with libgcc 12+ it finds CFI through `_dl_find_object`: no lock, no
//! allocation. What it can miss:
//!
//! - inlined functions (they have no frame of their own);
//! - a caller replaced by a tail call (the frame is gone before we look);
//! - code without CFI (hand-written assembly without `.cfi_*`, JIT code), at
//!   which point the walk stops;
//! - with an older libgcc the first unwind through an object takes the
//!   loader lock and may allocate while registering its FDEs.
//!
//! [`capture_frame_pointers`] is the fallback that follows saved `rbp` links
//! with fault-safe reads: it needs code built with frame pointers and skips
//! (or stops at) functions without them.

use std::ffi::c_void;

use crate::symbols::{Inventory, SymFlags};

#[repr(C)]
struct UnwindContext {
    _opaque: [u8; 0],
}

const URC_NO_REASON: i32 = 0;
const URC_NORMAL_STOP: i32 = 4;

#[link(name = "gcc_s")]
extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(*mut UnwindContext, *mut c_void) -> i32,
        arg: *mut c_void,
    ) -> i32;
    fn _Unwind_GetIP(ctx: *mut UnwindContext) -> usize;
}

struct Collector<'a> {
    skip: usize,
    out: &'a mut [usize],
    n: usize,
}

extern "C" fn collect(ctx: *mut UnwindContext, arg: *mut c_void) -> i32 {
    // SAFETY: arg is the Collector passed by `capture`, alive for the walk;
    // ctx is the unwinder's valid context for this frame.
    let c = unsafe { &mut *(arg as *mut Collector<'_>) };
    // SAFETY: see above.
    let ip = unsafe { _Unwind_GetIP(ctx) };
    if ip == 0 {
        return URC_NORMAL_STOP;
    }
    if c.skip > 0 {
        c.skip -= 1;
        return URC_NO_REASON;
    }
    if c.n == c.out.len() {
        return URC_NORMAL_STOP;
    }
    c.out[c.n] = ip;
    c.n += 1;
    URC_NO_REASON
}

/// What a walk guard keeps between its two calls (opaque to this module).
pub type WalkToken = [u64; 6];

/// A pair of functions run around every stack walk of this module, for code that hides
/// return addresses from unwinders: `ustrace-fprobe` replaces the return slot of each call
/// whose exit it hooks with its return trampoline, through which no unwinder can step.
/// `begin` puts the real return addresses back for the length of the walk (recording which in
/// the token), `end` hooks them again. Both must be as cheap and as free of locks and
/// allocation as the walk itself.
#[derive(Clone, Copy, Debug)]
pub struct WalkGuard {
    /// Run before the walk, with a zeroed token.
    pub begin: fn(&mut WalkToken),
    /// Run after the walk, with the token `begin` filled.
    pub end: fn(&WalkToken),
}

static WALK_GUARD: std::sync::OnceLock<WalkGuard> = std::sync::OnceLock::new();

/// Installs the guard run around every later walk; the first one installed stays.
pub fn set_walk_guard(guard: WalkGuard) {
    let _ = WALK_GUARD.set(guard);
}

/// Runs the guard's first half, when a guard is installed. The walk itself must be called
/// by the capturing function directly (not from a closure): an extra frame would shift what
/// `skip` counts in builds that do not inline.
#[inline(always)]
fn guard_begin(token: &mut WalkToken) -> Option<&'static WalkGuard> {
    let guard = WALK_GUARD.get();
    if let Some(g) = guard {
        (g.begin)(token);
    }
    guard
}

/// Fills `out` with the return addresses of the current thread's stack,
/// innermost first, after skipping `skip` frames above the caller of
/// `capture` (with `skip == 0` the first entry is a return address inside the
/// function that called `capture`). Returns how many entries were written.
/// No allocation, no lock, no syscall (see the module notes for limits).
#[inline(never)]
pub fn capture(skip: usize, out: &mut [usize]) -> usize {
    if out.is_empty() {
        return 0;
    }
    let mut c = Collector {
        // The first frame the unwinder reports is `capture` itself.
        skip: skip + 1,
        out,
        n: 0,
    };
    let mut token = [0u64; 6];
    let guard = guard_begin(&mut token);
    // SAFETY: the callback only uses the collector for the duration of the call.
    unsafe { _Unwind_Backtrace(collect, &mut c as *mut Collector<'_> as *mut c_void) };
    if let Some(g) = guard {
        (g.end)(&token);
    }
    c.n
}

/// Like [`capture`], but follows the saved frame-pointer chain with
/// fault-safe reads instead of CFI. Only frames built with frame pointers
/// appear; the walk stops at the first link that is not a plausible frame.
#[inline(never)]
pub fn capture_frame_pointers(skip: usize, out: &mut [usize]) -> usize {
    let mut fp: usize;
    // SAFETY: reading rbp has no side effects.
    unsafe {
        std::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags))
    };
    let mut token = [0u64; 6];
    let guard = guard_begin(&mut token);
    let n = walk_frame_pointers(fp, skip, out);
    if let Some(g) = guard {
        (g.end)(&token);
    }
    n
}

fn walk_frame_pointers(mut fp: usize, skip: usize, out: &mut [usize]) -> usize {
    let mut skip = skip;
    let mut n = 0;
    while n < out.len() && fp != 0 && fp.is_multiple_of(8) {
        let (Ok(next), Ok(ret)) = (
            crate::uaccess::read_usize(fp),
            crate::uaccess::read_usize(fp + 8),
        ) else {
            break;
        };
        if ret == 0 {
            break;
        }
        if skip > 0 {
            skip -= 1;
        } else {
            out[n] = ret;
            n += 1;
        }
        // Stacks grow down: the caller's frame must be above ours.
        if next <= fp {
            break;
        }
        fp = next;
    }
    n
}

/// Formats `addrs` as the kernel's stack-trace entry does with the
/// `sym-offset` option set: one ` => name+0xoff/0xsize` line per address
/// (` [object]` appended outside the main executable, `0x...` when unknown).
/// The `<stack trace>` header belongs to the event line and is not included.
pub fn format_kernel_style(inv: &Inventory, addrs: &[usize]) -> String {
    format_with_flags(
        inv,
        addrs,
        SymFlags {
            offset: true,
            addr: false,
        },
    )
}

/// Formats `addrs` as `trace_stack_print` does for the given trace options:
/// with neither option (the kernel default) lines are ` => name`.
pub fn format_with_flags(inv: &Inventory, addrs: &[usize], flags: SymFlags) -> String {
    let mut s = String::with_capacity(addrs.len() * 40);
    for &a in addrs {
        if a == usize::MAX {
            break;
        }
        s.push_str(" => ");
        inv.write_ip_sym(&mut s, a, flags);
        s.push('\n');
    }
    s
}

/// A file-backed mapping from `/proc/self/maps`: `[start, end)` and its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address of the mapping (the kernel's `vm_start`).
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// Path of the mapped file.
    pub path: String,
}

/// The process's file-backed mappings (anonymous and special ones omitted).
pub fn file_mappings() -> std::io::Result<Vec<Mapping>> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    let mut out = Vec::new();
    for line in text.lines() {
        // start-end perms offset dev inode path
        let mut fields = line.splitn(6, ' ');
        let range = fields.next().unwrap_or("");
        let path = fields.nth(4).map(str::trim_start).unwrap_or("");
        if !path.starts_with('/') {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
        else {
            continue;
        };
        out.push(Mapping {
            start,
            end,
            path: path.to_string(),
        });
    }
    Ok(out)
}

/// Formats `addrs` as the kernel's *user* stack-trace entry
/// (`trace_user_stack_print`): each line is ` => ` followed by, with the
/// `sym-userobj` option, `/path/of/object[+0xoffset-in-mapping]`, and then
/// ` <%016lx>` when `sym-addr` is set or no file maps the address (so by
/// default a line reads ` =>  <00007f0123456789>`). A 0 entry ends the list.
pub fn format_user_stack(addrs: &[usize], userobj: bool, sym_addr: bool) -> String {
    let maps = if userobj {
        file_mappings().unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut s = String::with_capacity(addrs.len() * 48);
    for &ip in addrs {
        if ip == 0 {
            break;
        }
        s.push_str(" => ");
        let file = maps.iter().find(|m| m.start <= ip && ip < m.end);
        if let Some(m) = file {
            let _ = std::fmt::Write::write_fmt(
                &mut s,
                format_args!("{}[+{:#x}]", m.path, ip - m.start),
            );
        }
        if sym_addr || file.is_none() {
            let _ = std::fmt::Write::write_fmt(&mut s, format_args!(" <{ip:016x}>"));
        }
        s.push('\n');
    }
    s
}
