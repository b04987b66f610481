//! Resizing replaces a CPU's region with a new one. Once the old region's
//! events are read it is retired, and its pages and file descriptor go back
//! to the system then, not when the buffer is dropped: a buffer resized a
//! hundred times costs about what its current size costs.
//!
//! A file of its own, so that nothing else in the process maps shared memory
//! while it measures.

use ustrace_ringbuf::page::DATA_SIZE;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

/// Shared memory this process has mapped and touched, in KiB.
fn rss_shmem_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssShmem:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssShmem in /proc/self/status")
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

const PAGES: usize = 256;

/// Writes enough 64-byte events to go round the whole buffer, then reads
/// them all, so every page has been touched and the region is drained.
fn fill_and_drain(rb: &RingBuffer, seq: &mut u64) {
    let per_page = DATA_SIZE / 68;
    for _ in 0..(PAGES + 8) * per_page {
        let mut event = [0u8; 64];
        event[..8].copy_from_slice(&seq.to_le_bytes());
        *seq += 1;
        assert!(rb.write(&event));
    }
    while rb.consume(0).is_some() {}
}

#[test]
fn resizing_gives_back_the_memory_of_drained_regions() {
    let rb = RingBuffer::new(Config {
        nr_cpus: 1,
        size_per_cpu: PAGES * DATA_SIZE,
        overwrite: true,
        clock: Clock::Local,
        name: "resize-memory".into(),
    })
    .unwrap();
    let mut seq = 0;
    fill_and_drain(&rb, &mut seq);
    let (rss_before, fds_before) = (rss_shmem_kib(), open_fds());

    const RESIZES: usize = 100;
    for k in 0..RESIZES {
        // Alternate between two sizes so that each resize makes a new region.
        rb.resize((PAGES + k % 2) * DATA_SIZE).unwrap();
        fill_and_drain(&rb, &mut seq);
    }
    let (rss_after, fds_after) = (rss_shmem_kib(), open_fds());
    eprintln!(
        "{RESIZES} resizes: RssShmem {rss_before} -> {rss_after} KiB, fds {fds_before} -> {fds_after}"
    );

    // Each region is about 1 MiB; holding on to all of them would add
    // about 100 MiB. What is left per retired region is its header page,
    // page words and slot map (12 KiB here).
    let grown = rss_after.saturating_sub(rss_before);
    assert!(
        grown < 4 * 1024,
        "RssShmem grew by {grown} KiB over {RESIZES} resizes ({rss_before} -> {rss_after} KiB)"
    );
    assert!(
        fds_after <= fds_before + 1,
        "open file descriptors went from {fds_before} to {fds_after} over {RESIZES} resizes"
    );

    // The retired regions' counters still count.
    let st = rb.stats(0);
    assert_eq!(st.written, seq, "{st:?}");
    assert_eq!(
        st.written,
        st.entries + st.overrun + st.read_events,
        "{st:?}"
    );
    assert_eq!(st.entries, 0, "{st:?}");
}
