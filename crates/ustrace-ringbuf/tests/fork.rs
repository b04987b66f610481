//! A process that forks while tracing (a pre-forking server that does not exec): the child
//! inherits the buffers, which are shared mappings, and keeps calling the write path while
//! the parent writes, reads and resizes. Parent and child are two processes, so neither can
//! fence the other's restartable sequences with `membarrier`; the child therefore writes
//! nothing into inherited buffers, and every event it tried counts as dropped where the
//! parent sees it. The accounting stays exact and every event read is intact.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use ustrace_ringbuf::page::DATA_SIZE;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

const LEN: usize = 32;

fn event(tag: u32, seq: u64) -> [u8; LEN] {
    let mut e = [0u8; LEN];
    e[0..4].copy_from_slice(&tag.to_le_bytes());
    e[8..16].copy_from_slice(&seq.to_le_bytes());
    let sum = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(tag);
    e[16..24].copy_from_slice(&sum.to_le_bytes());
    e
}

fn check(data: &[u8]) -> u32 {
    assert_eq!(data.len(), LEN, "event of {} bytes", data.len());
    let tag = u32::from_le_bytes(data[0..4].try_into().unwrap());
    let seq = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let sum = u64::from_le_bytes(data[16..24].try_into().unwrap());
    assert_eq!(
        sum,
        seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(tag),
        "corrupt event {data:?}"
    );
    assert!(tag == 1 || tag == 2, "unknown tag in {data:?}");
    tag
}

/// (successful writes, attempts)
fn writes_for(rb: &RingBuffer, tag: u32, until: Instant) -> (u64, u64) {
    let mut ok = 0;
    let mut seq = 0;
    loop {
        for _ in 0..256 {
            if rb.write(&event(tag, seq)) {
                ok += 1;
            }
            seq += 1;
        }
        if Instant::now() >= until {
            return (ok, seq);
        }
    }
}

#[test]
fn parent_and_forked_child_write_while_the_parent_resizes() {
    let nr_cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let pages = 32;
    let rb = RingBuffer::new(Config {
        nr_cpus,
        size_per_cpu: pages * DATA_SIZE,
        overwrite: true,
        clock: Clock::Local,
        name: "fork".into(),
    })
    .unwrap();
    let secs = std::env::var("USTRACE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(2.0)
        .min(10.0);
    let until = Instant::now() + Duration::from_secs_f64(secs);

    let mut fds = [0; 2];
    // SAFETY: a two-int array for pipe(2).
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only writes events, writes to a pipe and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let (ok, tried) = writes_for(&rb, 2, until);
        let report = [ok, tried];
        // SAFETY: writing 16 bytes from a local to the pipe, then leaving without unwinding
        // into the test harness.
        unsafe {
            libc::write(fds[1], report.as_ptr().cast(), 16);
            libc::_exit(0);
        }
    }
    // SAFETY: the write end belongs to the child now.
    unsafe { libc::close(fds[1]) };

    let stop = AtomicBool::new(false);
    let parent_ok = AtomicU64::new(0);
    let mut read_parent = 0u64;
    let mut read_child = 0u64;
    let mut resizes = 0;
    std::thread::scope(|s| {
        s.spawn(|| parent_ok.store(writes_for(&rb, 1, until).0, Ordering::SeqCst));
        s.spawn(|| {
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                rb.resize((pages + k % 2) * DATA_SIZE).unwrap();
                k += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            resizes = k;
        });
        while Instant::now() < until {
            match rb.consume_any() {
                Some(e) => match check(&e.data) {
                    1 => read_parent += 1,
                    _ => read_child += 1,
                },
                None => std::thread::yield_now(),
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let mut status = 0;
    // SAFETY: our child; status is a valid out-parameter.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    let mut report = [0u64; 2];
    // SAFETY: reading 16 bytes into a local from the pipe's read end.
    let n = unsafe { libc::read(fds[0], report.as_mut_ptr().cast(), 16) };
    assert_eq!(n, 16, "no counts from the child");
    let [child_ok, child_tried] = report;
    // SAFETY: our fd.
    unsafe { libc::close(fds[0]) };
    while let Some(e) = rb.consume_any() {
        match check(&e.data) {
            1 => read_parent += 1,
            _ => read_child += 1,
        }
    }

    let parent_ok = parent_ok.load(Ordering::SeqCst);
    let (mut written, mut overrun, mut entries, mut read, mut dropped) = (0, 0, 0, 0, 0);
    for cpu in 0..nr_cpus {
        let st = rb.stats(cpu);
        written += st.written;
        overrun += st.overrun;
        entries += st.entries;
        read += st.read_events;
        dropped += st.dropped_events;
    }
    eprintln!(
        "fork: {secs:.1}s, {resizes} resizes: parent wrote {parent_ok}, child tried \
         {child_tried}; read {read_parent}, overrun {overrun}, written {written}, \
         dropped {dropped}"
    );
    assert!(child_tried > 0, "the child never wrote");
    assert_eq!(
        (child_ok, read_child),
        (0, 0),
        "the child wrote into an inherited buffer"
    );
    assert_eq!(
        dropped, child_tried,
        "the child's events are counted as dropped"
    );
    assert_eq!(read, read_parent);
    assert_eq!(entries, 0);
    assert_eq!(written, parent_ok, "written against successful writes");
    assert_eq!(written, read + overrun, "written against read + overrun");
}

/// The forking thread wrote before `fork`, so it had already looked up (and cached) its
/// rseq area as an owner writer: its copy in the child must still write nothing into the
/// inherited buffer, and count each try as dropped.
#[test]
fn a_child_of_a_thread_that_wrote_writes_nothing() {
    let nr_cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rb = RingBuffer::new(Config {
        nr_cpus,
        size_per_cpu: 4 * DATA_SIZE,
        overwrite: true,
        clock: Clock::Local,
        name: "fork-cached".into(),
    })
    .unwrap();
    assert!(rb.write(&event(1, 0)));
    // SAFETY: the child only writes events and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = (0..100).filter(|&i| rb.write(&event(2, i))).count();
        // SAFETY: leaving without unwinding into the test harness.
        unsafe { libc::_exit(ok.min(100) as i32) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(libc::WEXITSTATUS(status), 0, "events the child wrote");
    let (mut written, mut dropped) = (0, 0);
    for cpu in 0..nr_cpus {
        let st = rb.stats(cpu);
        written += st.written;
        dropped += st.dropped_events;
    }
    assert_eq!((written, dropped), (1, 100));
}
