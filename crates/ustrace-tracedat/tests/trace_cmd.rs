//! The real check: a trace.dat written from the in-process tracefs is read by the real
//! `trace-cmd report`, and its lines equal ours (`Printer` over our `Reader`) one for one,
//! and equal a golden file.
//!
//! Determinism: the trace clock is `counter`, so timestamps are event counts; the events
//! are written by one named thread pinned to CPU 0. What still varies between runs is
//! scrubbed in the golden comparison only (never between trace-cmd and us): the thread id,
//! code addresses (ASLR) and the machine's CPU count on the `cpus=` line.
//!
//! `UPDATE_GOLDEN=1` rewrites the golden file.

use std::path::{Path, PathBuf};
use std::process::Command;

use ustrace::{FileSystem, OpenFlags};
use ustrace_tracedat::{Printer, Reader, TraceMeta, Writer};

ustrace::trace_event! {
    pub fn tdat::kv(key: &str, hit: bool, lat: u64, delta: i32, ids: [u32; 4]) {
        key: &str = key,
        hit: bool = hit,
        lat: u64 = lat,
        delta: i32 = delta,
        ids: [u32; 4] = ids,
    }
    print "key=%s hit=%d lat=%llu delta=%d ids=%u,%u,%u,%u", key, hit, lat, delta, ids[0], ids[1], ids[2], ids[3];
}

ustrace::trace_event! {
    pub fn tdat::blob(name: &str, size: u32) {
        name: &str = name,
        size: u32 = size,
    }
    print "name=%s size=0x%x", name, size;
}

/// The fprobe's target.
#[no_mangle]
#[inline(never)]
pub extern "C" fn tdat_probe_target(a: u64, b: i32) -> u64 {
    std::hint::black_box(a.wrapping_mul(3).wrapping_add(b as u64))
}

fn write(path: &str, text: &str) {
    let mut f = ustrace::tracefs().open(path, OpenFlags::APPEND).unwrap();
    f.write(text.as_bytes())
        .unwrap_or_else(|e| panic!("{path}: {e}"));
}

fn read(path: &str) -> std::io::Result<Vec<u8>> {
    let mut f = ustrace::tracefs().open(path, OpenFlags::READ)?;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = f.read(&mut buf, None)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn record(path: &Path) -> i32 {
    write("trace_clock", "counter");
    write(
        "dynamic_events",
        "f:tdatp/target tdat_probe_target a=$arg1:u64 b=$arg2:s32\n",
    );
    write("events/tdat/enable", "1");
    write("events/tdatp/enable", "1");
    let worker = std::thread::Builder::new()
        .name("tdat-worker".into())
        .spawn(|| {
            // SAFETY: a zeroed cpu_set_t is valid; CPU_SET and sched_setaffinity only touch it.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
            }
            for i in 0..200u32 {
                kv::trace(
                    &format!("key-{i}"),
                    i % 3 == 0,
                    u64::from(i) * 1000 + 7,
                    i as i32 - 100,
                    [i, i * 2, 0xffff_ffff, 42],
                );
                if i % 50 == 0 {
                    blob::trace(&"x".repeat(i as usize + 1), i);
                    tdat_probe_target(u64::from(i) << 33, -(i as i32));
                    write("trace_marker", &format!("marker {i}"));
                }
            }
            // SAFETY: gettid has no preconditions.
            unsafe { libc::gettid() }
        })
        .unwrap();
    let tid = worker.join().unwrap();
    write("events/tdat/enable", "0");
    write("events/tdatp/enable", "0");
    let events = [
        ("tdat".to_string(), "kv".to_string()),
        ("tdat".to_string(), "blob".to_string()),
        ("tdatp".to_string(), "target".to_string()),
    ];
    let meta = TraceMeta::from_tracefs(&mut |p| read(p), Some(&events)).unwrap();
    let mut pages = Vec::new();
    let mut stats = Vec::new();
    for cpu in 0..meta.cpus {
        let flags = OpenFlags {
            nonblock: true,
            ..OpenFlags::READ
        };
        let mut f = ustrace::tracefs()
            .open(&format!("per_cpu/cpu{cpu}/trace_pipe_raw"), flags)
            .unwrap();
        let mut page = vec![0u8; 4096];
        while let Ok(n) = f.read(&mut page, None) {
            if n == 0 {
                break;
            }
            pages.push((cpu, page[..n].to_vec()));
        }
        let text = read(&format!("per_cpu/cpu{cpu}/stats")).unwrap();
        stats.push((cpu, String::from_utf8_lossy(&text).into_owned()));
    }
    let later = TraceMeta::from_tracefs(&mut |p| read(p), Some(&events)).unwrap();
    let write_file = |path: &Path, pages: &[(usize, Vec<u8>)]| {
        let mut w = Writer::create(path, &meta).unwrap();
        for (cpu, page) in pages {
            w.push_page(*cpu, page).unwrap();
        }
        for (cpu, text) in &stats {
            w.set_cpu_stats(*cpu, text.clone());
        }
        w.update_meta(&later);
        w.finish().unwrap()
    };
    let summary = write_file(path, &pages);
    assert_eq!(summary.events.iter().sum::<u64>(), 200 + 4 * 3);
    // The same pages with losses marked as the kernel marks them: the second page says
    // 12345 events were lost before it (count stored after its data), the third says
    // some were, count unknown.
    assert!(pages.len() >= 3, "{} pages", pages.len());
    let mut lossy = pages.clone();
    for (i, stored) in [(1, true), (2, false)] {
        let page = &mut lossy[i].1;
        page.resize(4096, 0);
        let mut commit = u64::from_le_bytes(page[8..16].try_into().unwrap());
        let len = commit as usize & 0xfff;
        commit |= 1 << 31;
        if stored {
            assert!(len + 8 <= 4080);
            commit |= 1 << 30;
            page[16 + len..24 + len].copy_from_slice(&12345u64.to_le_bytes());
        }
        page[8..16].copy_from_slice(&commit.to_le_bytes());
    }
    write_file(&path.with_extension("lossy.dat"), &lossy);
    tid
}

fn ours(path: &Path) -> Vec<String> {
    report(path, false)
}

/// Our lines for `path`: print formats, or (`raw`) fields as `trace-cmd report -R`.
fn report(path: &Path, raw: bool) -> Vec<String> {
    let r = Reader::open(path).unwrap();
    let printer = Printer::for_reader(&r);
    let mut lines = vec![format!("cpus={}", r.meta().cpus)];
    for ev in r.events() {
        lines.extend(printer.line(&ev.unwrap(), raw).lines().map(String::from));
    }
    lines
}

/// Replaces what differs between runs: the thread id, code addresses (the fprobe's
/// `(ip)`, `%ps` of the marker's caller), the CPU count.
fn scrub(lines: &[String], tid: i32) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            if l.starts_with("cpus=") {
                return "cpus=N".to_string();
            }
            let probe = format!("({:x})", tdat_probe_target as *const () as usize);
            let l = l
                .replace(&format!("-{tid:<5}"), "-TID  ")
                .replace(&probe, "(ADDR)");
            let mut out = String::new();
            let mut rest = l.as_str();
            while let Some(i) = rest.find("0x") {
                out.push_str(&rest[..i]);
                let hex: String = rest[i + 2..]
                    .chars()
                    .take_while(char::is_ascii_hexdigit)
                    .collect();
                // Addresses are long; field values in the golden are short.
                if hex.len() >= 9 {
                    out.push_str("0xADDR");
                } else {
                    out.push_str("0x");
                    out.push_str(&hex);
                }
                rest = &rest[i + 2 + hex.len()..];
            }
            out.push_str(rest);
            out
        })
        .collect()
}

#[test]
fn real_trace_cmd_report_agrees_with_ours_and_the_golden() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trace_cmd_report.dat");
    let tid = record(&path);
    let mine = ours(&path);
    let golden_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/trace_cmd_report.txt");
    let scrubbed = scrub(&mine, tid);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden_path, scrubbed.join("\n") + "\n").unwrap();
    }
    let golden = std::fs::read_to_string(&golden_path).unwrap();
    let golden: Vec<&str> = golden.lines().collect();
    assert_eq!(scrubbed, golden, "our report differs from the golden file");

    let lossy = path.with_extension("lossy.dat");
    let lossy_ours = ours(&lossy);
    assert_eq!(
        lossy_ours
            .iter()
            .filter(|l| l.starts_with("CPU:0 [") && l.ends_with("EVENTS DROPPED]"))
            .cloned()
            .collect::<Vec<_>>(),
        ["CPU:0 [12345 EVENTS DROPPED]", "CPU:0 [EVENTS DROPPED]"]
    );

    let Some(theirs) = trace_cmd_report(&path) else {
        return;
    };
    let version = Command::new("trace-cmd")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    eprintln!("checked against: {version}");
    assert_same(&theirs, &mine);
    assert_same(&trace_cmd_report(&lossy).unwrap(), &lossy_ours);
    // Fields raw: libtraceevent's field printer (each number with its own conversion from
    // the print format, strings as text, arrays as bytes).
    assert_same(
        &trace_cmd(&["report", "-R"], &path).unwrap(),
        &report(&path, true),
    );

    // trace-cmd's own version 7 (its default) of the same file, uncompressed: our reader
    // prints the same lines from it; a compressed one is refused with a way out.
    let v7 = path.with_extension("v7.dat");
    convert(&path, &v7, "none");
    assert_same(&ours(&v7), &mine);
    let zipped = path.with_extension("v7z.dat");
    convert(&path, &zipped, "any");
    let err = Reader::open(&zipped).unwrap_err().to_string();
    assert!(err.contains("--compression none"), "{err}");
}

/// `trace-cmd convert` to file version 7 with `compression`.
fn convert(from: &Path, to: &Path, compression: &str) {
    let out = Command::new("trace-cmd")
        .args([
            "convert",
            "--file-version",
            "7",
            "--compression",
            compression,
            "-i",
        ])
        .arg(from)
        .arg("-o")
        .arg(to)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The real `trace-cmd report FILE` lines, or `None` (said loudly) without trace-cmd.
/// Anything it says on stderr (an unknown option, a bad section) fails the test.
fn trace_cmd_report(path: &Path) -> Option<Vec<String>> {
    trace_cmd(&["report"], path)
}

fn trace_cmd(args: &[&str], path: &Path) -> Option<Vec<String>> {
    match Command::new("trace-cmd").args(args).arg(path).output() {
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stderr.trim().is_empty(),
                "trace-cmd: {stderr}"
            );
            Some(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(String::from)
                    .collect(),
            )
        }
        Err(e) => {
            eprintln!("skipped: trace-cmd report: {e} (scripts/test.sh installs trace-cmd)");
            None
        }
    }
}

fn assert_same(theirs: &[String], ours: &[String]) {
    for (i, (a, b)) in theirs.iter().zip(ours).enumerate() {
        assert_eq!(
            a,
            b,
            "line {} differs (left: trace-cmd, right: ours)",
            i + 1
        );
    }
    assert_eq!(theirs.len(), ours.len(), "line counts differ");
}
