//! Our decoder reads the real kernel's pages: in a private tracefs
//! instance we write markers to `trace_marker`, read the binary pages from
//! `per_cpu/cpuN/trace_pipe_raw`, and decode them with `PageDecoder`.
//! Skips (loudly) when tracefs instances are not available.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use ustrace_ringbuf::page::{PageDecoder, PAGE_SIZE};

struct Instance(std::path::PathBuf);

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("tracing_on"), "0");
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn decodes_kernel_trace_pipe_raw_pages() {
    let base = Path::new("/sys/kernel/tracing/instances");
    let dir = base.join(format!("ustrace-ringbuf-test-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&dir) {
        eprintln!(
            "skipped: cannot create a tracefs instance at {}: {e}",
            dir.display()
        );
        return;
    }
    let inst = Instance(dir);
    let print_id: u16 = std::fs::read_to_string("/sys/kernel/tracing/events/ftrace/print/format")
        .ok()
        .and_then(|f| {
            f.lines()
                .find_map(|l| l.strip_prefix("ID: ").map(|v| v.trim().parse().unwrap()))
        })
        .expect("ftrace/print format");
    let n = 300;
    {
        let mut marker = std::fs::OpenOptions::new()
            .write(true)
            .open(inst.0.join("trace_marker"))
            .unwrap();
        for i in 0..n {
            use std::io::Write;
            marker
                .write_all(format!("ustrace-marker {i:05}").as_bytes())
                .unwrap();
        }
    }
    let mut found = Vec::new();
    let nr_cpus = ustrace_ringbuf::cpu::possible_cpus();
    for cpu in 0..nr_cpus {
        let path = inst.0.join(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
        let Ok(mut f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        let mut last_ts = 0;
        loop {
            let mut page = vec![0u8; PAGE_SIZE];
            match f.read(&mut page) {
                Ok(0) | Err(_) => break,
                Ok(k) => assert_eq!(k, PAGE_SIZE, "trace_pipe_raw returns whole pages"),
            }
            let dec = PageDecoder::new(&page).expect("kernel page");
            for e in dec {
                assert!(e.ts >= last_ts, "kernel timestamps go forward on a cpu");
                last_ts = e.ts;
                let ty = u16::from_ne_bytes([e.data[0], e.data[1]]);
                if ty != print_id {
                    continue;
                }
                let text = &e.data[16..];
                let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
                let s = String::from_utf8_lossy(&text[..end]).into_owned();
                if let Some(v) = s.strip_prefix("ustrace-marker ") {
                    found.push((e.ts, v.trim().parse::<u32>().unwrap()));
                }
            }
        }
    }
    found.sort();
    let ids: Vec<u32> = found.iter().map(|&(_, i)| i).collect();
    assert_eq!(
        ids,
        (0..n).collect::<Vec<_>>(),
        "every marker decoded, in time order"
    );
    eprintln!(
        "decoded {} kernel print events from trace_pipe_raw",
        ids.len()
    );
}
