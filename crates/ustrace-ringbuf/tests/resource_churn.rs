//! Resizing with nobody reading, and taking and freeing snapshots, over and
//! over, holds no more memory, mappings or files after a few hundred rounds
//! than after the first few: a shrink gives the old contents' memory back
//! (keeping what fits the new size), and the regions a resize or a freed
//! snapshot retires are started over when a CPU needs one of their size
//! again instead of piling up.
//!
//! A file of its own, so that nothing else in the process maps shared
//! memory or opens files while it counts them.

use ustrace_ringbuf::page::DATA_SIZE;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

fn rss_shmem_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssShmem:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssShmem in /proc/self/status")
}

fn mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .count()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// The tests measure the whole process: one at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

const SMALL: usize = 64;
const BIG: usize = 256;

/// Enough 64-byte events to go round `pages` pages, never read.
fn fill(rb: &RingBuffer, pages: usize, seq: &mut u64) {
    for _ in 0..(pages + 4) * (DATA_SIZE / 68) {
        let mut event = [0u8; 64];
        event[..8].copy_from_slice(&seq.to_le_bytes());
        *seq += 1;
        rb.write(&event);
    }
}

/// What `echo BIG > buffer_size_kb; echo SMALL > buffer_size_kb;
/// echo 1 > snapshot; echo 0 > snapshot` does, with events in between.
fn round(rb: &RingBuffer, seq: &mut u64) {
    fill(rb, SMALL, seq);
    rb.resize(BIG * DATA_SIZE).unwrap();
    fill(rb, BIG, seq);
    rb.resize(SMALL * DATA_SIZE).unwrap();
    fill(rb, SMALL, seq);
    let snapshot = rb.new_like("churn-snap").unwrap();
    rb.swap(&snapshot).unwrap();
    assert!(
        snapshot.iter().next().is_some(),
        "the snapshot has the events"
    );
    drop(snapshot);
}

#[test]
fn resize_and_snapshot_churn_stays_bounded() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let rb = RingBuffer::new(Config {
        nr_cpus: 2,
        size_per_cpu: SMALL * DATA_SIZE,
        overwrite: true,
        clock: Clock::Local,
        name: "churn".into(),
    })
    .unwrap();
    let mut seq = 0;
    // Until each CPU has had each size and its spares (the regions a
    // later resize or snapshot starts over) are there.
    for _ in 0..50 {
        round(&rb, &mut seq);
    }
    let before = (rss_shmem_kib(), mappings(), open_fds());
    const ROUNDS: usize = 300;
    for _ in 0..ROUNDS {
        round(&rb, &mut seq);
    }
    let after = (rss_shmem_kib(), mappings(), open_fds());
    eprintln!(
        "{ROUNDS} rounds: RssShmem {} -> {} KiB, mappings {} -> {}, fds {} -> {}",
        before.0, after.0, before.1, after.1, before.2, after.2
    );
    // One round's new regions are 1-4 MiB; a leak of any of them would
    // show as hundreds of MiB, mappings and files. A little slack for
    // which CPU the writes landed on (a CPU that first gets events late
    // makes its spares late).
    assert!(
        after.0 <= before.0 + 1024,
        "RssShmem grew from {} to {} KiB",
        before.0,
        after.0
    );
    assert!(
        after.1 <= before.1 + 4,
        "mappings went from {} to {}",
        before.1,
        after.1
    );
    assert!(
        after.2 <= before.2 + 2,
        "fds went from {} to {}",
        before.2,
        after.2
    );

    // Everything written is accounted for: what was dropped by shrinking
    // or overwriting counts as overrun.
    for cpu in 0..2 {
        let st = rb.stats(cpu);
        assert_eq!(
            st.written,
            st.entries + st.overrun + st.read_events,
            "cpu {cpu}: {st:?}"
        );
    }
}

#[test]
fn a_shrink_gives_back_the_memory_of_unread_contents() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let rb = RingBuffer::new(Config {
        nr_cpus: 1,
        size_per_cpu: 4096 * DATA_SIZE,
        overwrite: true,
        clock: Clock::Local,
        name: "shrink".into(),
    })
    .unwrap();
    let mut seq = 0;
    fill(&rb, 4096, &mut seq);
    let full = rss_shmem_kib();
    rb.resize(2 * DATA_SIZE).unwrap();
    let shrunk = rss_shmem_kib();
    eprintln!("shrink 16 MiB -> 8 KiB unread: RssShmem {full} -> {shrunk} KiB");
    assert!(
        full.saturating_sub(shrunk) >= 15 * 1024,
        "shrinking a full 16 MiB buffer to 2 pages gave back only {} KiB",
        full.saturating_sub(shrunk)
    );
    // The newest events that fit the new size are still there, the rest
    // count as overrun.
    let st = rb.stats(0);
    assert_eq!(st.written, seq, "{st:?}");
    assert_eq!(st.written, st.entries + st.overrun, "{st:?}");
    let kept: Vec<u64> = rb
        .iter()
        .map(|e| u64::from_le_bytes(e.data[..8].try_into().unwrap()))
        .collect();
    assert!(
        !kept.is_empty() && kept.len() <= 2 * (DATA_SIZE / 68),
        "{}",
        kept.len()
    );
    assert_eq!(*kept.last().unwrap(), seq - 1, "the newest event is kept");
    assert_eq!(kept.len() as u64, st.entries);
}

#[test]
fn resizing_to_ever_new_sizes_keeps_a_header_page_per_size() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    // Regions of 2048 pages and more: their slot maps alone are 16 KiB, all
    // touched when the region is made.
    let base = 2048;
    let rb = RingBuffer::new(Config {
        nr_cpus: 1,
        size_per_cpu: base * DATA_SIZE,
        overwrite: true,
        clock: Clock::Local,
        name: "sizes".into(),
    })
    .unwrap();
    let mut seq = 0;
    let mut step = |k: usize| {
        fill(&rb, 8, &mut seq);
        rb.resize((base + k) * DATA_SIZE).unwrap();
    };
    for k in 1..=10 {
        step(k);
    }
    let before = (rss_shmem_kib(), mappings(), open_fds());
    const SIZES: usize = 100;
    for k in 11..11 + SIZES {
        step(k);
    }
    let after = (rss_shmem_kib(), mappings(), open_fds());
    eprintln!(
        "{SIZES} new sizes: RssShmem {} -> {} KiB, mappings {} -> {}, fds {} -> {}",
        before.0, after.0, before.1, after.1, before.2, after.2
    );
    // Each retired region past the spares keeps its header page and its
    // mapping (see ARCHITECTURE.md), nothing else: no file, no words.
    assert!(
        after.2 <= before.2,
        "fds went from {} to {}",
        before.2,
        after.2
    );
    assert!(
        after.0 <= before.0 + 8 * SIZES as u64,
        "RssShmem grew from {} to {} KiB over {SIZES} sizes",
        before.0,
        after.0
    );
    assert!(
        after.1 <= before.1 + SIZES + 4,
        "mappings went from {} to {}",
        before.1,
        after.1
    );
    let st = rb.stats(0);
    assert_eq!(st.written, seq, "{st:?}");
    assert_eq!(st.written, st.entries + st.overrun, "{st:?}");
}
