//! Architectures without a back end: nothing can be patched; registration reports
//! [`Error::Unsupported`](crate::Error::Unsupported) and static keys fall back to a flag.

use std::sync::{Mutex, MutexGuard};

use crate::static_key::JumpEntry;
use crate::Error;

static TEXT_MUTEX: Mutex<()> = Mutex::new(());

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
