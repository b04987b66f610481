//! Untrusted files: every truncation of a valid trace.dat and a sweep of corrupted bytes
//! must give events or a clear error — never a panic, never a hang — through the same
//! calls `ustrace report` makes. (The `tracedat_read` fuzz target explores further.)

use ustrace_ringbuf::page::PageWriter;
use ustrace_tracedat::{Printer, Reader, TraceMeta, Writer};

const HEADER_PAGE: &str = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";

const FORMAT: &str = "name: op\nID: 300\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:__data_loc char[] name;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:u32 ids[2];\toffset:12;\tsize:8;\tsigned:0;\n\n\
print fmt: \"name=%s ids=%u,%u\", __get_str(name), REC->ids[0], REC->ids[1]\n";

fn record(i: u32) -> Vec<u8> {
    let name = format!("op{i}\0");
    let mut r = Vec::new();
    r.extend_from_slice(&300u16.to_le_bytes());
    r.extend_from_slice(&[0, 0]);
    r.extend_from_slice(&(100 + i as i32).to_le_bytes());
    let loc = (20u32) | ((name.len() as u32) << 16);
    r.extend_from_slice(&loc.to_le_bytes());
    r.extend_from_slice(&i.to_le_bytes());
    r.extend_from_slice(&(i * 2).to_le_bytes());
    r.extend_from_slice(name.as_bytes());
    r
}

fn valid_file() -> Vec<u8> {
    let meta = TraceMeta {
        header_page: HEADER_PAGE.as_bytes().to_vec(),
        header_event: b"# compressed entry header\n".to_vec(),
        event_formats: vec![("t".into(), vec![FORMAT.as_bytes().to_vec()])],
        saved_cmdlines: b"100 worker\n".to_vec(),
        trace_clock: "local".into(),
        cpus: 2,
        page_size: 4096,
        ..TraceMeta::default()
    };
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bad-files-{}-{seq}.dat", std::process::id()));
    let mut w = Writer::create(&path, &meta).unwrap();
    for cpu in 0..2 {
        let mut pw = PageWriter::new(1000);
        for i in 0..40 {
            assert!(pw.push(1000 + u64::from(i) * 10 + cpu as u64, &record(i)));
        }
        w.push_page(cpu, &pw.finish(Some(3))).unwrap();
        w.set_cpu_stats(cpu, "entries: 0\noverrun: 3\n".into());
    }
    w.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

/// What `ustrace report` does with a file; the number of events it printed.
fn report(bytes: Vec<u8>) -> Result<usize, String> {
    let r = Reader::from_bytes(bytes).map_err(|e| e.to_string())?;
    let printer = Printer::for_reader(&r);
    let mut n = 0;
    for ev in r.events() {
        let Ok(ev) = ev else { continue };
        printer.line(&ev, false);
        printer.line(&ev, true);
        n += 1;
    }
    Ok(n)
}

#[test]
fn the_valid_file_reads_whole() {
    let bytes = valid_file();
    assert_eq!(report(bytes.clone()), Ok(80));
    let r = Reader::from_bytes(bytes).unwrap();
    let printer = Printer::for_reader(&r);
    let first = r.events().next().unwrap().unwrap();
    assert_eq!(first.missed_events, 3);
    assert_eq!(
        printer.line(&first, false),
        "CPU:0 [3 EVENTS DROPPED]\n          worker-100   [000]     0.000001: op:                   name=op0 ids=0,0"
    );
    assert_eq!(
        r.cpu_stats()[1],
        (1, "entries: 0\noverrun: 3\n".to_string())
    );
}

#[test]
fn every_truncation_errors_or_reads_a_prefix() {
    let bytes = valid_file();
    for len in 0..bytes.len() {
        if let Ok(n) = report(bytes[..len].to_vec()) {
            assert!(n <= 80);
        }
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    let bytes = valid_file();
    // Every byte of the headers (up to the padding before the first page), and a stride
    // through the pages, set to values that break sizes, counts and record types.
    let pages = bytes.len() - 2 * 4096;
    let head_end = bytes[..pages].iter().rposition(|&b| b != 0).unwrap_or(0) + 1;
    let positions = (0..head_end).chain((pages..bytes.len()).step_by(13));
    for at in positions {
        for value in [0x00u8, 0xff, 0x1d, 0x1f] {
            let mut b = bytes.clone();
            b[at] = value;
            let _ = report(b);
        }
    }
}

/// The same sweeps over trace-cmd's version 7 of the file (sections found by offsets).
#[test]
fn a_version_7_file_survives_the_same_sweeps() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let v6 = dir.join(format!("bad-files-v6-{}.dat", std::process::id()));
    let v7 = dir.join(format!("bad-files-v7-{}.dat", std::process::id()));
    std::fs::write(&v6, valid_file()).unwrap();
    let out = std::process::Command::new("trace-cmd")
        .args([
            "convert",
            "--file-version",
            "7",
            "--compression",
            "none",
            "-i",
        ])
        .arg(&v6)
        .arg("-o")
        .arg(&v7)
        .output();
    let _ = std::fs::remove_file(&v6);
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("trace-cmd convert: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("skipped: trace-cmd convert: {e} (scripts/test.sh installs trace-cmd)");
            return;
        }
    }
    let bytes = std::fs::read(&v7).unwrap();
    let _ = std::fs::remove_file(&v7);
    assert_eq!(report(bytes.clone()), Ok(80));
    for len in (0..bytes.len()).step_by(3) {
        let _ = report(bytes[..len].to_vec());
    }
    // Bytes outside the pages: the headers and sections, wherever they are.
    let r = Reader::from_bytes(bytes.clone()).unwrap();
    let pages: Vec<_> = r
        .cpu_data()
        .iter()
        .filter(|(_, s)| *s > 0)
        .copied()
        .collect();
    for at in 0..bytes.len() as u64 {
        if pages.iter().any(|(o, s)| at >= *o && at < o + s) {
            continue;
        }
        for value in [0x00u8, 0xff, 0x07] {
            let mut b = bytes.clone();
            b[at as usize] = value;
            let _ = report(b);
        }
    }
}
