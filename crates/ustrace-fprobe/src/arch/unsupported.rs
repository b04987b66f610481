//! Architectures without a back end: nothing can be patched, so registration reports
//! [`Error::Unsupported`](crate::Error::Unsupported) (from `build_site`), and static keys fall
//! back to their flag (the portable `static_branch_unlikely!` is an atomic load).

use std::sync::{Mutex, MutexGuard};

use crate::static_key::JumpEntry;
use crate::Error;

static TEXT_MUTEX: Mutex<()> = Mutex::new(());

/// Register frame placeholder: no handler can run on this architecture.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PtRegs {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
}

impl PtRegs {
    /// Always `None`: no registers are captured here.
    pub fn arg(&self, _n: usize) -> Option<u64> {
        None
    }
    /// Always `None`.
    pub fn float_arg(&self, _n: usize) -> Option<f64> {
        None
    }
    /// Always 0.
    pub fn return_value(&self) -> u64 {
        0
    }
    /// Stack pointer.
    pub fn stack_pointer(&self) -> u64 {
        self.sp
    }
    /// Instruction pointer.
    pub fn instruction_pointer(&self) -> u64 {
        self.ip
    }
}

pub(crate) struct SiteCode {
    pub entry_stub: usize,
    pub orig_stub: usize,
}

pub(crate) fn text_lock() -> MutexGuard<'static, ()> {
    TEXT_MUTEX.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn jump_table() -> &'static [JumpEntry] {
    &[]
}

pub(crate) fn patch_jump_labels(
    _sites: &[JumpEntry],
    _on: bool,
    _guard: &MutexGuard<'static, ()>,
) -> Result<(), Error> {
    Ok(())
}

const WHY: &str = "fprobes are implemented for x86_64 only";

pub(crate) struct SiteRequest {
    pub func: usize,
    pub size: Option<usize>,
    pub site: usize,
}

pub(crate) fn build_sites(
    reqs: &[SiteRequest],
    _symbols: &[ustrace_inspect::symbols::Symbol],
) -> Vec<Result<SiteCode, String>> {
    reqs.iter().map(|_| Err(WHY.into())).collect()
}

pub(crate) fn analyze_only(
    _func: usize,
    _size: Option<usize>,
    _symbols: &[ustrace_inspect::symbols::Symbol],
) -> Result<(), String> {
    Err(WHY.into())
}

pub(crate) fn patch_sites(_s: &[&SiteCode], _g: &MutexGuard<'static, ()>) -> Result<(), Error> {
    Err(Error::Unsupported(WHY.into()))
}

pub(crate) fn unpatch_sites(_s: &[&SiteCode], _g: &MutexGuard<'static, ()>) -> Result<(), Error> {
    Ok(())
}

pub(crate) fn return_trampoline() -> usize {
    0
}

pub(crate) fn membarrier_all() {}

pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

pub(crate) fn code_bytes() -> usize {
    0
}

pub(crate) fn attach_floor(
    _func: usize,
    _size: Option<usize>,
    _hook_return: bool,
) -> Result<usize, Error> {
    Err(Error::Unsupported(WHY.into()))
}

pub(crate) fn moved_threads() -> u32 {
    0
}

pub(crate) fn hardware_shadow_stack() -> bool {
    false
}

/// Whether fprobes can be registered on this architecture.
pub(crate) const SUPPORTED: bool = false;
