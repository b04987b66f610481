//! Fuzz the kernel-format page decoder: pages come from shared memory that
//! another process (a crashed or hostile writer) may have left in any state,
//! and from `trace_pipe_raw` consumers' files. Any bytes must decode or stop
//! cleanly — no panic, no read outside the page, bounded time — through
//! every entry point the readers use.
//!
//! `RUSTC_BOOTSTRAP=1 cargo fuzz run page_decode -- -max_total_time=600`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace_ringbuf::page::{PageDecoder, PAGE_SIZE};

fuzz_target!(|data: &[u8]| {
    // The whole input as a page, as trace_pipe_raw readers see one.
    if let Ok(dec) = PageDecoder::new(data) {
        for ev in dec.take(PAGE_SIZE) {
            std::hint::black_box(ev.data.len());
        }
    }
    // A page-sized buffer with a reader's limit, base and resume point taken
    // from the first bytes, as the in-process readers decode shm pages.
    if data.len() < 6 {
        return;
    }
    let limit = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let offset = usize::from(u16::from_le_bytes([data[2], data[3]]));
    let mut page = [0u8; PAGE_SIZE];
    let body = &data[4..];
    page[..body.len().min(PAGE_SIZE)].copy_from_slice(&body[..body.len().min(PAGE_SIZE)]);
    let mut dec = PageDecoder::with_limit(&page, limit, 1);
    for _ in 0..PAGE_SIZE {
        if dec.next_record().is_none() {
            break;
        }
    }
    let mut dec = PageDecoder::resume(&page, limit, offset, 7);
    for _ in 0..PAGE_SIZE {
        if dec.next_record().is_none() {
            break;
        }
    }
});
