//! The `record_drain_mb_s` figure: how fast `ustrace record`'s drain moves full pages from
//! a ring buffer's shared memory into a trace.dat, against a plain `memcpy` of the same
//! bytes in the same run (the bound: the drain is a page copy plus the file write).
//!
//! A buffer in this process is filled with 64-byte events until it refuses more
//! (producer/consumer mode, so nothing is overwritten); then, per repetition, a
//! `ShmReader` over its files (mapped once, rewound) copies every page out (`read_page`, as
//! the recorder does) into a `ustrace_tracedat::Writer` whose file is completed (`finish`)
//! in the temporary directory (`TMPDIR`).

use std::time::Instant;

use ustrace::FileSystem;
use ustrace_ringbuf::clock::Clock;
use ustrace_ringbuf::page::PAGE_SIZE;
use ustrace_ringbuf::{Config, RingBuffer, ShmReader};

use crate::bench_measure::median;

/// Bytes of event data per CPU in the drained buffer.
const SIZE: usize = 64 << 20;

fn read_tracefs(path: &str) -> std::io::Result<Vec<u8>> {
    ustrace::tracefs()
        .read_to_string(path)
        .map(String::into_bytes)
        .map_err(|e| std::io::Error::from_raw_os_error(e.0))
}

/// Nanoseconds per page drained and per page `memcpy`d (medians of `reps`), and the
/// number of pages.
pub fn record_drain(reps: usize) -> Result<(f64, f64, u64), String> {
    let rb = RingBuffer::new(Config {
        nr_cpus: 1,
        size_per_cpu: SIZE,
        overwrite: false,
        clock: Clock::Local,
        name: "bench-drain".into(),
    })
    .map_err(|e| format!("record_drain_mb_s: buffer: {e}"))?;
    let event = [0x5au8; 64];
    while rb.write(&event) {}
    let meta = ustrace_tracedat::TraceMeta::from_tracefs(&mut read_tracefs, Some(&[]))
        .map_err(|e| format!("record_drain_mb_s: tracefs: {e}"))?;
    let dir = std::env::temp_dir().join(format!("ustrace-bench-drain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let out = dir.join("drain.dat");
    let mut page = Box::new([0u8; PAGE_SIZE]);
    let mut drain_ns = Vec::new();
    let mut pages = 0u64;
    // One reader for all repetitions, as the recorder maps the buffers once; the first
    // repetition (its page faults) is not counted.
    let mut reader = ShmReader::open(rb.shm_path()).map_err(|e| e.to_string())?;
    for rep in 0..=reps {
        reader.rewind();
        let mut writer =
            ustrace_tracedat::Writer::create(&out, &meta).map_err(|e| e.to_string())?;
        let start = Instant::now();
        let mut n = 0u64;
        for cpu in 0..reader.nr_cpus() {
            while reader.read_page(cpu, &mut page, false).is_some() {
                writer.push_page(0, &page[..]).map_err(|e| e.to_string())?;
                n += 1;
            }
        }
        writer.finish().map_err(|e| e.to_string())?;
        if rep > 0 {
            drain_ns.push(start.elapsed().as_nanos() as f64 / n.max(1) as f64);
        }
        pages = n;
    }
    let _ = std::fs::remove_dir_all(&dir);
    if pages < 1000 {
        return Err(format!("record_drain_mb_s: only {pages} pages to drain"));
    }
    // The same bytes, copied page by page from one buffer into another.
    let src = vec![0x5au8; pages as usize * PAGE_SIZE];
    let mut dst = vec![0u8; src.len()];
    let mut copy_ns = Vec::new();
    for rep in 0..=reps {
        let start = Instant::now();
        for (d, s) in dst
            .chunks_exact_mut(PAGE_SIZE)
            .zip(src.chunks_exact(PAGE_SIZE))
        {
            d.copy_from_slice(std::hint::black_box(s));
        }
        std::hint::black_box(&dst);
        if rep > 0 {
            copy_ns.push(start.elapsed().as_nanos() as f64 / pages as f64);
        }
    }
    Ok((median(drain_ns), median(copy_ns), pages))
}
