//! x86_64 back end: code patching, prologue relocation, trampolines and the register frame.

mod text_poke;

pub(crate) use text_poke::{gettid, text_lock};
#[allow(unused_imports)]
pub(crate) use text_poke::{
    membarrier_all, membarrier_init, moved_threads, read_text, write_text as write_code,
};

use std::sync::MutexGuard;

use ustrace_inspect::symbols::Symbol;

use crate::static_key::JumpEntry;
use crate::Error;

/// The jump table of this link unit, located through weak references to the linker-made
/// `__start_`/`__stop_` symbols (null when no site was linked in).
pub(crate) fn jump_table() -> &'static [JumpEntry] {
    let (start, stop): (usize, usize);
    // SAFETY: two loads from the GOT; weak undefined symbols resolve to 0.
    unsafe {
        std::arch::asm!(
            ".weak __start_ustrace_jump_table",
            ".weak __stop_ustrace_jump_table",
            "mov {0}, qword ptr [rip + __start_ustrace_jump_table@GOTPCREL]",
            "mov {1}, qword ptr [rip + __stop_ustrace_jump_table@GOTPCREL]",
            out(reg) start,
            out(reg) stop,
            options(nostack, readonly, preserves_flags),
        );
    }
    if start == 0 || stop <= start {
        return &[];
    }
    let n = (stop - start) / std::mem::size_of::<JumpEntry>();
    // SAFETY: the linker brackets the section exactly; entries are 24-byte, 8-aligned records.
    unsafe { std::slice::from_raw_parts(start as *const JumpEntry, n) }
}

const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

fn jmp_rel32(from: usize, to: usize) -> Result<[u8; 5], Error> {
    let rel = (to as i64).wrapping_sub(from as i64 + 5);
    let rel = i32::try_from(rel)
        .map_err(|_| Error::Patch(format!("jump from {from:#x} to {to:#x} exceeds rel32")))?;
    let b = rel.to_le_bytes();
    Ok([0xe9, b[0], b[1], b[2], b[3]])
}

/// Rewrites every given jump-label site to `jmp target` (on) or the 5-byte NOP (off).
pub(crate) fn patch_jump_labels(
    sites: &[JumpEntry],
    on: bool,
    guard: &MutexGuard<'static, ()>,
) -> Result<(), Error> {
    let mut pokes = Vec::with_capacity(sites.len());
    for e in sites {
        let jmp = jmp_rel32(e.site, e.target)?;
        let mut cur = [0u8; 5];
        read_text(e.site, &mut cur)?;
        let (want_old, new) = if on { (NOP5, jmp) } else { (jmp, NOP5) };
        if cur == new {
            continue;
        }
        if cur != want_old {
            return Err(Error::Patch(format!(
                "jump label site {:#x} holds {cur:02x?}, expected {want_old:02x?}",
                e.site
            )));
        }
        // A thread trapping on the int3 emulates the new instruction.
        let resume = if on { e.target } else { e.site + 5 };
        pokes.push(text_poke::Poke {
            addr: e.site,
            new: new.to_vec(),
            trap_resume: resume,
            final_resume: resume,
            interior: Vec::new(),
            restores: Vec::new(),
        });
    }
    text_poke::poke_batch(&pokes, guard)
}

mod entries;
mod insn;
mod regs;
mod trampoline;

pub use regs::PtRegs;
pub(crate) use trampoline::{return_trampoline, SiteCode};

/// One function to prepare: its address, its size when known, and the address of the
/// dispatcher `Site` its entry stub passes on.
pub(crate) struct SiteRequest {
    pub func: usize,
    pub size: Option<usize>,
    pub site: usize,
}

/// Analyses and prepares (but does not patch) every requested function. `symbols` is every
/// known function sorted by address (other entry points). The code of all of them is read
/// up front, in runs of neighbouring functions.
pub(crate) fn build_sites(
    reqs: &[SiteRequest],
    symbols: &[Symbol],
) -> Vec<Result<SiteCode, String>> {
    let funcs: Vec<(usize, Option<usize>)> = reqs.iter().map(|r| (r.func, r.size)).collect();
    let code = insn::CodeCache::read(&funcs);
    reqs.iter()
        .map(|r| {
            let prologue = insn::analyze(r.func, r.size, &code)?;
            entries::check(r.func, prologue.patch_at, prologue.len, symbols)?;
            trampoline::build_site(prologue, r.site, trampoline::entry_trampoline())
        })
        .collect()
}

/// Points every given site's first bytes at its entry stub.
pub(crate) fn patch_sites(
    sites: &[&SiteCode],
    guard: &MutexGuard<'static, ()>,
) -> Result<(), Error> {
    // The stubs the new jumps lead to are in memory before the first jump is.
    trampoline::flush_code()?;
    let pokes: Result<Vec<_>, Error> = sites
        .iter()
        .map(|s| {
            Ok(text_poke::Poke {
                addr: s.patch_at,
                new: jmp_rel32(s.patch_at, s.entry_stub)?.to_vec(),
                trap_resume: s.prologue_at,
                final_resume: s.entry_stub,
                interior: s.interior.clone(),
                restores: Vec::new(),
            })
        })
        .collect();
    text_poke::poke_batch(&pokes?, guard)
}

/// Restores the original first bytes of every given site.
pub(crate) fn unpatch_sites(
    sites: &[&SiteCode],
    guard: &MutexGuard<'static, ()>,
) -> Result<(), Error> {
    let pokes: Vec<_> = sites
        .iter()
        .map(|s| text_poke::Poke {
            addr: s.patch_at,
            new: s.original[..insn::PATCH_LEN].to_vec(),
            trap_resume: s.prologue_at,
            final_resume: s.prologue_at,
            interior: Vec::new(),
            restores: s.interior.iter().map(|m| m.0).collect(),
        })
        .collect();
    text_poke::poke_batch(&pokes, guard)
}

/// Patches `func` (of `size` bytes when known) for good to enter a floor trampoline of
/// [`crate::bench`]: the entry trampoline with an empty function for a dispatcher, or with
/// `hook_return` one that only hooks the return into the return trampoline with an empty
/// exit dispatcher; reached and left through a site built as every probed function's is.
/// Returns the patched address.
/// Only for functions of the probe machinery itself (`notrace` by name), which no fprobe can
/// patch: nothing else ever owns that site.
pub(crate) fn attach_floor(
    func: usize,
    size: Option<usize>,
    hook_return: bool,
) -> Result<usize, Error> {
    let inventory = ustrace_inspect::symbols::inventory();
    let symbols = inventory.functions();
    let prologue =
        insn::analyze(func, size, &insn::CodeCache::default()).map_err(Error::Refused)?;
    entries::check(func, prologue.patch_at, prologue.len, symbols).map_err(Error::Refused)?;
    // Immortal, as every site is: a thread may run the stub at any time after the patch.
    let site: &'static crate::dispatch::Site = Box::leak(Box::new(crate::dispatch::Site {
        orig_stub: Default::default(),
        func,
        probes: Default::default(),
        no_return_hook: Default::default(),
    }));
    let code = trampoline::build_site(
        prologue,
        site as *const crate::dispatch::Site as usize,
        if hook_return {
            trampoline::floor_hook_trampoline()
        } else {
            trampoline::floor_trampoline()
        },
    )
    .map_err(Error::Refused)?;
    site.orig_stub
        .store(code.orig_stub, std::sync::atomic::Ordering::Release);
    let guard = text_lock();
    patch_sites(&[&code], &guard)?;
    Ok(code.patch_at)
}

/// Bytes of trampoline memory in use (stats).
pub(crate) fn code_bytes() -> usize {
    trampoline::CODE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether this thread runs with a hardware shadow stack (CET), which forbids rewriting return
/// addresses.
pub(crate) fn hardware_shadow_stack() -> bool {
    std::fs::read_to_string("/proc/thread-self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("x86_Thread_features:") && l.contains("shstk"))
        })
        .unwrap_or(false)
}

/// Runs the patchability analysis without building anything.
pub(crate) fn analyze_only(
    func: usize,
    size: Option<usize>,
    symbols: &[Symbol],
) -> Result<(), String> {
    let prologue = insn::analyze(func, size, &insn::CodeCache::default())?;
    entries::check(func, prologue.patch_at, prologue.len, symbols)
}

/// Whether fprobes can be registered on this architecture.
pub(crate) const SUPPORTED: bool = true;
