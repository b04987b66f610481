//! Flight recorder: another process maps the buffers read-only and drains
//! them without the writer's help — while the writer lives, and again after
//! the writer was killed with SIGKILL.
//!
//! Three processes, all this test binary (the role comes from an env var):
//!
//! ```text
//!   test ──spawns──> writer ──spawns──> reader (the writer's child)
//!                      writes batch 1, starts the reader, waits for it to
//!                      read batch 1, writes batch 2, says "ready"
//!   test: SIGKILL writer
//!                                        reader: notices its parent died,
//!                                        reads everything again, reports
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use ustrace_ringbuf::page::DATA_SIZE;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer, ShmReader};

const ROLE: &str = "USTRACE_FLIGHT_ROLE";
const SHM: &str = "USTRACE_FLIGHT_SHM";
const OUT: &str = "USTRACE_FLIGHT_OUT";
const BATCH1: u32 = 500;
const BATCH2: u32 = 300;

fn payload(i: u32) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.extend((0..(i % 60)).map(|k| (i + k) as u8));
    v
}

fn self_cmd(role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "flight_recorder_survives_sigkill",
        "--nocapture",
        "--test-threads=1",
    ]);
    c.env(ROLE, role);
    c
}

fn append(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

fn wait_for(path: &Path, what: &str) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.contains(what) {
                return s;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what} in {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads every event, checks they are intact, and returns their ids sorted
/// (one writer thread; events of one CPU buffer come in write order).
fn read_ids(r: &mut ShmReader) -> Vec<u32> {
    r.rewind();
    let mut ids = Vec::new();
    let mut per_cpu_last = std::collections::HashMap::new();
    for e in r.read_all() {
        let id = u32::from_le_bytes(e.data[..4].try_into().unwrap());
        let want = payload(id);
        assert_eq!(&e.data[..want.len()], &want[..], "event {id} corrupted");
        if let Some(&last) = per_cpu_last.get(&e.cpu) {
            assert!(id > last, "cpu {}: event {id} after {last}", e.cpu);
        }
        per_cpu_last.insert(e.cpu, id);
        ids.push(id);
    }
    ids.sort_unstable();
    ids
}

// The reader outlives this process by design (it is killed), so it is never waited for.
#[allow(clippy::zombie_processes)]
fn writer() {
    let out = PathBuf::from(std::env::var(OUT).unwrap());
    let rb = RingBuffer::new(Config {
        nr_cpus: ustrace_ringbuf::cpu::possible_cpus(),
        size_per_cpu: 64 * DATA_SIZE,
        overwrite: true,
        clock: Clock::Mono,
        name: "flight".into(),
    })
    .unwrap();
    rb.set_persistent(true).unwrap();
    for i in 0..BATCH1 {
        assert!(rb.write(&payload(i)));
    }
    let _reader = self_cmd("reader")
        .env(SHM, rb.shm_path())
        .env(OUT, &out)
        .spawn()
        .unwrap();
    wait_for(&out, "phase1");
    for i in BATCH1..BATCH1 + BATCH2 {
        assert!(rb.write(&payload(i)));
    }
    // The test harness may capture stdout: report through the file.
    append(&out, &format!("ready {}", rb.shm_path().display()));
    // Wait to be killed; never drop the buffer.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn reader() {
    let out = PathBuf::from(std::env::var(OUT).unwrap());
    let shm = PathBuf::from(std::env::var(SHM).unwrap());
    // SAFETY: no preconditions.
    let parent = unsafe { libc::getppid() };
    let mut r = ShmReader::open(&shm).unwrap();
    assert_eq!(r.writer_pid() as i32, parent);
    let ids = read_ids(&mut r);
    assert_eq!(ids, (0..BATCH1).collect::<Vec<_>>());
    append(&out, &format!("phase1 {}", ids.len()));
    // SAFETY: no preconditions; getppid changes once the parent is gone.
    while unsafe { libc::getppid() } == parent {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Dead means gone or a zombie nobody reaped yet.
    let stat = std::fs::read_to_string(format!("/proc/{parent}/stat")).unwrap_or_default();
    let alive = stat
        .rsplit(')')
        .next()
        .is_some_and(|rest| !rest.trim_start().starts_with(['Z', 'X']))
        && !stat.is_empty();
    r.refresh().unwrap();
    let ids = read_ids(&mut r);
    let complete = ids == (0..BATCH1 + BATCH2).collect::<Vec<_>>();
    append(
        &out,
        &format!(
            "phase2 {} parent_alive={alive} complete={complete}",
            ids.len()
        ),
    );
}

#[test]
fn flight_recorder_survives_sigkill() {
    match std::env::var(ROLE).as_deref() {
        Ok("writer") => return writer(),
        Ok("reader") => return reader(),
        _ => {}
    }
    let out = std::env::temp_dir().join(format!("ustrace-flight-{}", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let mut w = self_cmd("writer")
        .env(OUT, &out)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let report = wait_for(&out, "ready ");
    let shm = PathBuf::from(
        report
            .lines()
            .find_map(|l| l.strip_prefix("ready "))
            .unwrap(),
    );
    // SAFETY: killing the child we spawned.
    unsafe { libc::kill(w.id() as i32, libc::SIGKILL) };
    let status = w.wait().unwrap();
    assert!(!status.success());
    let report = wait_for(&out, "phase2");
    eprintln!("{report}");
    let all = BATCH1 + BATCH2;
    assert!(report.contains(&format!("phase1 {BATCH1}\n")), "{report}");
    assert!(
        report.contains(&format!("phase2 {all} parent_alive=false complete=true")),
        "{report}"
    );
    // The files outlived the writer; the test process can read them too, then remove them.
    let mut r = ShmReader::open(&shm).unwrap();
    assert_eq!(read_ids(&mut r), (0..all).collect::<Vec<_>>());
    ShmReader::remove(&shm).unwrap();
    assert!(!shm.exists());
    let _ = std::fs::remove_file(&out);
}
