//! Static keys (jump labels): a branch that costs one 5-byte NOP while its key is off.
//!
//! Tracepoints test "is anybody listening?" on every call. [`static_branch_unlikely!`](crate::static_branch_unlikely) compiles
//! that test to a NOP that sits in the instruction stream with a record in the linker section
//! `ustrace_jump_table`:
//!
//! ```text
//!   code (key disabled)                    ustrace_jump_table (one 24-byte entry per site)
//!   ---------------------------------      ------------------------------------------------
//!   site:   0f 1f 44 00 00  nopl 0(rax)     { site, target, &KEY }
//!           ...fast path (not taken)...     { site', target', &KEY }   <- every copy after inlining
//!   target: ...slow path: call probes...    { site'', target'', &OTHER_KEY }
//!
//!   code (key enabled)
//!   site:   e9 xx xx xx xx  jmp target      (written by the same int3 protocol as fprobes)
//! ```
//!
//! `enable()` walks the table between `__start_ustrace_jump_table` and `__stop_ustrace_jump_table`
//! (the linker defines them for any section whose name is a C identifier; the section is marked
//! `SHF_GNU_RETAIN` so `--gc-sections` keeps it) and patches every site of that key in one batch.
//! The table covered is the one of the link unit (executable or shared object) that contains this
//! crate; sites compiled into a different shared object are not seen.
//!
//! Use: `static KEY: StaticKey = StaticKey::new();` then `if static_branch_unlikely!(KEY) { .. }`.
//! The macro takes a *path* to a `static` (the address goes into the table at link time).

use std::sync::atomic::{AtomicBool, Ordering};

/// A process-wide on/off switch whose test sites are patched in place.
#[derive(Debug)]
pub struct StaticKey {
    enabled: AtomicBool,
}

impl Default for StaticKey {
    fn default() -> Self {
        Self::new()
    }
}

/// One record of the jump table, as emitted by [`static_branch_unlikely!`](crate::static_branch_unlikely).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct JumpEntry {
    /// Address of the 5-byte NOP.
    pub site: usize,
    /// Address of the code run when the key is enabled.
    pub target: usize,
    /// Address of the `StaticKey`.
    pub key: usize,
}

/// The jump-table entries of this link unit (empty when no site exists).
pub fn jump_entries() -> &'static [JumpEntry] {
    crate::arch::jump_table()
}

impl StaticKey {
    /// A disabled key.
    pub const fn new() -> Self {
        Self {
            enabled: AtomicBool::new(false),
        }
    }

    /// Whether the key is on (a plain load; sites do not need it).
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Turns every site of this key into a jump to its slow path. Returns after all threads
    /// take the jump (the patch protocol serialises every core).
    pub fn enable(&self) {
        self.set(true)
    }

    /// Turns every site back into a NOP.
    pub fn disable(&self) {
        self.set(false)
    }

    fn set(&self, on: bool) {
        let guard = crate::arch::text_lock();
        if self.enabled.load(Ordering::Acquire) == on {
            return;
        }
        let me = self as *const Self as usize;
        let sites: Vec<JumpEntry> = jump_entries()
            .iter()
            .filter(|e| e.key == me && e.site != 0)
            .copied()
            .collect();
        if on {
            // Flag first: code that reaches the slow path must see the key as enabled.
            self.enabled.store(true, Ordering::Release);
        }
        if let Err(e) = crate::arch::patch_jump_labels(&sites, on, &guard) {
            // Only reachable if the process forbids text writes entirely; the sites are unchanged.
            panic!("static key: cannot patch {} sites: {e}", sites.len());
        }
        if !on {
            self.enabled.store(false, Ordering::Release);
        }
    }
}

/// Evaluates to `true` when the static key at the given path is enabled; while disabled the
/// test is a single 5-byte NOP. `$key` must be a path to a `static StaticKey`.
#[cfg(target_arch = "x86_64")]
#[macro_export]
macro_rules! static_branch_unlikely {
    ($key:path) => {
        'ustrace_static_branch: {
            // SAFETY: the asm is a 5-byte NOP plus a record in a data section; control either
            // falls through or (once patched by StaticKey::enable) jumps to the label block.
            unsafe {
                ::core::arch::asm!(
                    "2:",
                    ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
                    ".pushsection ustrace_jump_table,\"awR\",@progbits",
                    ".balign 8",
                    ".quad 2b",
                    ".quad {target}",
                    ".quad {key}",
                    ".popsection",
                    key = sym $key,
                    target = label { break 'ustrace_static_branch true; },
                    options(nostack, preserves_flags),
                );
            }
            false
        }
    };
}

/// Portable fallback: an atomic load.
#[cfg(not(target_arch = "x86_64"))]
#[macro_export]
macro_rules! static_branch_unlikely {
    ($key:path) => {
        $crate::static_key::StaticKey::is_enabled(&$key)
    };
}
