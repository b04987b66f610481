//! `ustrace report` and `ustrace stream`, run as a user runs them: this test process is the
//! traced program (its tracefs served on a private socket directory), the verbs are the real
//! binary. `report` must print what the real `trace-cmd report` prints for the same file;
//! `stream` must print the same lines live from `trace_pipe_raw`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ustrace::{FileSystem, OpenFlags};
use ustrace_ctl::server::{self, ServerConfig};
use ustrace_tracedat::{TraceMeta, Writer};

ustrace::trace_event! {
    pub fn rpt::op(name: &str, n: u64, ok: bool) {
        name: &str = name,
        n: u64 = n,
        ok: bool = ok,
    }
    print "name=%s n=%llu ok=%d", name, n, ok;
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

/// Writes `count` events from a thread named `rpt-worker` pinned to CPU 0; its tid.
fn emit(count: u64, base: u64) -> i32 {
    std::thread::Builder::new()
        .name("rpt-worker".into())
        .spawn(move || {
            // SAFETY: a zeroed cpu_set_t is valid; CPU_SET and sched_setaffinity only touch it.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
            }
            for i in 0..count {
                op::trace(&format!("op{}", base + i), base + i, i % 2 == 0);
            }
            write("trace_marker", "done");
            // SAFETY: gettid has no preconditions.
            unsafe { libc::gettid() }
        })
        .unwrap()
        .join()
        .unwrap()
}

fn record_file(path: &Path) {
    let events = [("rpt".to_string(), "op".to_string())];
    let meta = TraceMeta::from_tracefs(&mut |p| read(p), Some(&events)).unwrap();
    let mut w = Writer::create(path, &meta).unwrap();
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
    w.finish().unwrap();
}

fn ustrace_cmd(sock: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .env("USTRACE_SOCKET_DIR", sock)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ustrace {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The timestamp column of a report line.
fn ts_of(line: &str) -> u64 {
    let after = line.split_once("] ").map_or("", |(_, rest)| rest);
    let ts = after.split(':').next().unwrap_or("");
    ts.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no timestamp in {line:?}"))
}

fn expected_line(tid: i32, ts: u64, i: u64) -> String {
    format!(
        "      rpt-worker-{tid:<5} [000]{ts:>12}: op:                   name=op{i} n={i} ok={}",
        u8::from(i.is_multiple_of(2))
    )
}

#[test]
fn report_and_stream_print_what_trace_cmd_prints() {
    let root =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let sock = root.join("sock");
    let config = ServerConfig {
        socket_dir: Some(sock.clone()),
        ..Default::default()
    };
    let _server = server::serve_with(Arc::new(ustrace::tracefs()), config).unwrap();
    write("trace_clock", "counter");
    write("events/rpt/enable", "1");

    // report: a file written from the tracefs, printed by the binary.
    let tid = emit(120, 0);
    let file = root.join("trace.dat");
    record_file(&file);
    let file_arg = file.to_str().unwrap();
    let ours = ustrace_cmd(&sock, &["report", file_arg]);
    let lines: Vec<&str> = ours.lines().collect();
    assert!(lines[0].starts_with("cpus="), "{}", lines[0]);
    assert_eq!(lines.len(), 1 + 120 + 1, "{ours}");
    let first_ts = ts_of(lines[1]);
    for i in 0..120 {
        assert_eq!(lines[1 + i as usize], expected_line(tid, first_ts + i, i));
    }
    assert!(lines[121].ends_with(": done"), "{}", lines[121]);
    let only_print = ustrace_cmd(&sock, &["report", "-F", "ftrace:print", file_arg]);
    assert_eq!(only_print.lines().count(), 2, "{only_print}");
    let cpu1 = ustrace_cmd(&sock, &["report", "--cpu", "1-3", file_arg]);
    assert_eq!(cpu1.lines().count(), 1, "{cpu1}");
    let stats = ustrace_cmd(&sock, &["report", "--stats", file_arg]);
    assert!(stats.contains("\nCPU: 0\nentries: 0\n"), "{stats}");
    assert!(stats.contains("CPU0: 121 events, 0 lost"), "{stats}");
    match Command::new("trace-cmd").arg("report").arg(&file).output() {
        Ok(theirs) => assert_eq!(String::from_utf8_lossy(&theirs.stdout), ours),
        Err(e) => eprintln!("skipped: trace-cmd report: {e} (scripts/test.sh installs trace-cmd)"),
    }

    // stream: the same lines, live, over the control socket.
    let tid = emit(50, 1000);
    let pid = std::process::id().to_string();
    let streamed = ustrace_cmd(&sock, &["stream", "-p", &pid, "--duration", "0.5"]);
    let lines: Vec<&str> = streamed.lines().collect();
    assert_eq!(lines.len(), 51, "{streamed}");
    let first_ts = ts_of(lines[0]);
    for i in 0..50 {
        assert_eq!(
            lines[i as usize],
            expected_line(tid, first_ts + i, 1000 + i)
        );
    }
    assert!(lines[50].ends_with(": done"), "{}", lines[50]);
    write("events/rpt/enable", "0");
    let _ = std::fs::remove_dir_all(&root);
}
