//! Every function `available_filter_functions` lists for the dynamic loader and for libc is
//! probed, one after the other, while other threads keep creating threads and running libc
//! code. Each one must either attach and run correctly or be refused with a reason; nothing
//! may crash (issue 15: `memcpy` of ld.so was listed, probing it killed the process, because
//! `mempcpy` jumps into `memcpy+3`).
//!
//! The probing runs in a child process (this test binary re-run with an environment
//! variable), so a crash is reported with the function that caused it instead of taking the
//! test harness down.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::io::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ustrace_fprobe::{EntryAction, Error, Fprobe};

const CHILD: &str = "USTRACE_FPROBE_EVERY_FUNCTION_CHILD";

/// What each worker does in a loop: create a thread (pthread_create, TLS set-up in ld.so) that
/// runs a little of everything common in libc, and join it.
fn churn(stop: &AtomicBool, rounds: &AtomicU64) {
    while !stop.load(Ordering::Relaxed) {
        let h = std::thread::spawn(|| {
            let mut v: Vec<String> = (0..8)
                .map(|i| format!("item {i:>4} {:.3}", i as f64 / 7.0))
                .collect();
            v.sort();
            let joined = v.join(",");
            let c = std::ffi::CString::new(joined.clone()).unwrap();
            // SAFETY: valid NUL-terminated string (strlen of libc is what runs through probes).
            #[allow(clippy::strlen_on_c_strings)]
            let n = unsafe { libc::strlen(c.as_ptr()) };
            assert_eq!(n, joined.len());
            let mut buf = vec![0u8; 256];
            // SAFETY: buffers of the stated sizes.
            unsafe {
                libc::memcpy(buf.as_mut_ptr().cast(), c.as_ptr().cast(), n.min(255));
                libc::memmove(buf.as_mut_ptr().add(1).cast(), buf.as_ptr().cast(), 100);
                libc::memset(buf.as_mut_ptr().add(200).cast(), 7, 50);
            }
            let _ = std::fs::read_to_string("/proc/self/stat");
            // SAFETY: plain syscalls.
            unsafe {
                libc::getpid();
                let mut ts = std::mem::zeroed();
                libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
            }
            black_box(buf);
        });
        h.join().expect("worker thread panicked");
        rounds.fetch_add(1, Ordering::Relaxed);
    }
}

fn is_target_object(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.starts_with("ld-linux") || base.starts_with("libc.so")
}

fn child() {
    let inv = ustrace_inspect::symbols::inventory();
    let listed = inv.available_filter_functions();
    let mut targets: Vec<(usize, String, String)> = Vec::new();
    for s in inv.functions() {
        if !is_target_object(&s.object) || targets.iter().any(|t| t.0 == s.addr) {
            continue;
        }
        let line = format!("{} [{}]", s.name, s.object_name());
        assert!(listed.lines().any(|l| l == line), "{line} is not listed");
        targets.push((s.addr, s.name.clone(), s.object_name().to_string()));
    }
    targets.dedup_by_key(|t| t.0);
    assert!(
        targets.iter().any(|t| t.2.starts_with("ld-linux"))
            && targets.iter().any(|t| t.2.starts_with("libc.so")),
        "no functions of ld.so or libc listed"
    );
    // The case of issue 15: ld.so's mempcpy jumps to memcpy+3.
    if let Some(m) = inv
        .functions()
        .iter()
        .find(|s| s.name == "memcpy" && s.object_name().starts_with("ld-linux"))
    {
        let why = ustrace_fprobe::check_patchable(m.addr).unwrap_or_default();
        assert!(
            why.contains("enters the patched bytes"),
            "ld.so memcpy: {why:?}"
        );
    }
    // USTRACE_FPROBE_FROM=name starts the walk at that function (to chase one failure).
    if let Ok(from) = std::env::var("USTRACE_FPROBE_FROM") {
        if let Some(i) = targets.iter().position(|t| t.1 == from) {
            targets.drain(..i);
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (s, r) = (stop.clone(), rounds.clone());
            std::thread::spawn(move || churn(&s, &r))
        })
        .collect();

    let hits = Arc::new(AtomicU64::new(0));
    let (mut attached, mut refused) = (0usize, BTreeMap::<String, usize>::new());
    let started = Instant::now();
    let stderr = std::io::stderr();
    for (addr, name, object) in &targets {
        // The parent names the culprit from the last line printed before a crash.
        let _ = writeln!(
            stderr.lock(),
            "probing {name} [{object}] at {addr:#x} ({:.1} s, {} thread rounds)",
            started.elapsed().as_secs_f64(),
            rounds.load(Ordering::Relaxed)
        );
        let (h1, h2) = (hits.clone(), hits.clone());
        let res = Fprobe::builder()
            .entry_data_size(8)
            .entry_handler(move |_, _, _, _, data| {
                data.copy_from_slice(&1u64.to_le_bytes());
                h1.fetch_add(1, Ordering::Relaxed);
                EntryAction::Continue
            })
            .exit_handler(move |_, _, _, _, data| {
                assert_eq!(data, &1u64.to_le_bytes());
                h2.fetch_add(1, Ordering::Relaxed);
            })
            .register_ips(&[*addr]);
        match res {
            Ok(fp) => {
                attached += 1;
                // Let the workers run through the patched function for a moment.
                std::thread::sleep(Duration::from_micros(300));
                fp.unregister().expect("unregister");
            }
            Err(Error::Refused(why)) => {
                assert!(!why.trim().is_empty(), "{name}: refusal without a reason");
                let key = why
                    .split(':')
                    .nth(1)
                    .unwrap_or(&why)
                    .trim()
                    .chars()
                    .take(40)
                    .collect();
                *refused.entry(key).or_default() += 1;
            }
            Err(e) => panic!("{name} [{object}]: unexpected error {e}"),
        }
    }
    let _ = writeln!(stderr.lock(), "probing done; joining the workers");
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("worker");
    }
    println!(
        "every-function: {} functions, {attached} attached, {} refused, {} hits, {} thread rounds, {:.1} s",
        targets.len(),
        targets.len() - attached,
        hits.load(Ordering::Relaxed),
        rounds.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    for (why, n) in &refused {
        println!("  refused {n:>5}: {why}");
    }
    assert!(
        attached > targets.len() / 2,
        "most functions should be probeable"
    );
    assert!(rounds.load(Ordering::Relaxed) > 0);
}

#[test]
fn every_ldso_and_libc_function_is_safe_to_probe_or_refused() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "every_ldso_and_libc_function_is_safe_to_probe_or_refused",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    let last = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("probing "))
        .unwrap_or("(none)");
    assert!(
        out.status.success(),
        "child failed ({:?}); last function: {last}\n{}",
        out.status,
        stderr
            .lines()
            .filter(|l| !l.starts_with("probing "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
