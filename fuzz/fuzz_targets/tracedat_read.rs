//! Fuzz the trace.dat reader: `ustrace report` opens files from anywhere, so any bytes
//! must parse or fail with an error — no panic, no allocation the file cannot back, no
//! read outside it — through the headers, the formats and every page of every CPU.
//!
//! `RUSTC_BOOTSTRAP=1 cargo fuzz run tracedat_read -- -max_total_time=600`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ustrace_tracedat::{Printer, Reader};

fuzz_target!(|data: &[u8]| {
    let Ok(reader) = Reader::from_bytes(data.to_vec()) else {
        return;
    };
    let printer = Printer::for_reader(&reader);
    std::hint::black_box(reader.cpu_stats().len());
    // Bounded: a file can claim many pages, each read is checked and small.
    for ev in reader.events().take(100_000) {
        if let Ok(ev) = ev {
            std::hint::black_box(printer.line(&ev, false).len());
            std::hint::black_box(printer.line(&ev, true).len());
        }
    }
});
