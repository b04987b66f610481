//! Events lost to an overwritten buffer are in the file: a small buffer is overrun, the
//! per-CPU stats taken at the end go into the trace.dat, and both our reader and the real
//! `trace-cmd report --stat` show the overrun.

use std::path::PathBuf;
use std::process::Command;

use ustrace::{FileSystem, OpenFlags};
use ustrace_tracedat::{Reader, TraceMeta, Writer};

ustrace::trace_event! {
    pub fn lossy::tick(n: u64) {
        n: u64 = n,
    }
    print "n=%llu", n;
}

fn write(path: &str, text: &str) {
    let mut f = ustrace::tracefs().open(path, OpenFlags::TRUNCATE).unwrap();
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

fn overrun_of(stats: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix("overrun: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no overrun line in {stats:?}"))
}

#[test]
fn an_overrun_buffer_s_losses_are_in_the_file() {
    write("buffer_size_kb", "8");
    write("events/lossy/enable", "1");
    std::thread::spawn(|| {
        // SAFETY: a zeroed cpu_set_t is valid; CPU_SET and sched_setaffinity only touch it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
        }
        for n in 0..20_000 {
            tick::trace(n);
        }
    })
    .join()
    .unwrap();
    write("events/lossy/enable", "0");
    let events = [("lossy".to_string(), "tick".to_string())];
    let meta = TraceMeta::from_tracefs(&mut |p| read(p), Some(&events)).unwrap();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("overrun.dat");
    let mut w = Writer::create(&path, &meta).unwrap();
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
            w.push_page(cpu, &page[..n]).unwrap();
        }
        let stats = read(&format!("per_cpu/cpu{cpu}/stats")).unwrap();
        w.set_cpu_stats(cpu, String::from_utf8_lossy(&stats).into_owned());
    }
    let summary = w.finish().unwrap();
    let kept = summary.events[0];
    let r = Reader::open(&path).unwrap();
    let (_, stats0) = r.cpu_stats().iter().find(|(c, _)| *c == 0).unwrap();
    let lost = overrun_of(stats0);
    assert!(lost > 0, "no overrun in {stats0}");
    assert_eq!(kept + lost, 20_000, "kept {kept} + overrun {lost}");
    assert_eq!(r.events().count() as u64, kept);
    match Command::new("trace-cmd")
        .args(["report", "--stat"])
        .arg(&path)
        .output()
    {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains(&format!("CPU: 0\nentries: 0\noverrun: {lost}\n")),
                "{text}"
            );
        }
        Err(e) => {
            eprintln!("skipped: trace-cmd report --stat: {e} (scripts/test.sh installs trace-cmd)")
        }
    }
}
