//! Records events with the in-process tracer, writes a trace.dat from the process's own
//! tracefs, and reads it back with our reader.

use std::path::PathBuf;

use ustrace::{FileSystem, OpenFlags};
use ustrace_tracedat::{Reader, TraceMeta, Value, Writer};

ustrace::trace_event! {
    pub fn tdat::kv(key: &str, hit: bool, lat: u64, ids: [u32; 4]) {
        key: &str = key,
        hit: bool = hit,
        lat: u64 = lat,
        ids: [u32; 4] = ids,
    }
    print "key=%s hit=%d lat=%llu ids=%u,%u,%u,%u", key, hit, lat, ids[0], ids[1], ids[2], ids[3];
}

fn write(path: &str, text: &str) {
    let mut f = ustrace::tracefs().open(path, OpenFlags::TRUNCATE).unwrap();
    f.write(text.as_bytes()).unwrap();
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

/// Drains every CPU's pages of the top instance into the writer.
fn drain(w: &mut Writer, cpus: usize) {
    for cpu in 0..cpus {
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
}

#[test]
fn events_written_come_back() {
    write("trace_clock", "counter");
    write("events/tdat/enable", "1");
    for i in 0..300u32 {
        kv::trace(
            &format!("key{i}"),
            i % 2 == 0,
            u64::from(i) * 7,
            [i, 1, 2, 3],
        );
    }
    write("trace_marker", "hello marker");
    let events = vec![("tdat".to_string(), "kv".to_string())];
    let meta = TraceMeta::from_tracefs(&mut |p| read(p), Some(&events)).unwrap();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("roundtrip.dat");
    let mut w = Writer::create(&path, &meta).unwrap();
    drain(&mut w, meta.cpus);
    let summary = w.finish().unwrap();
    assert_eq!(summary.events.iter().sum::<u64>(), 301);
    let r = Reader::open(&path).unwrap();
    let evs: Vec<_> = r.events().map(Result::unwrap).collect();
    assert_eq!(evs.len(), 301);
    let kv: Vec<_> = evs.iter().filter(|e| e.name == "kv").collect();
    assert_eq!(kv.len(), 300);
    for (i, e) in kv.iter().enumerate() {
        assert_eq!(e.fields[0], ("key".into(), Value::Str(format!("key{i}"))));
        assert_eq!(e.fields[3].1, Value::Array(vec![i as u64, 1, 2, 3]));
    }
    assert!(evs.windows(2).all(|w| w[0].ts <= w[1].ts));
    let print = evs.iter().find(|e| e.name == "print").unwrap();
    assert_eq!(print.fields[1].1, Value::Str("hello marker\n".into()));
}

/// Headers bigger than the reader's first look (1 MiB of symbols) are read whole.
#[test]
fn big_headers_are_read_whole() {
    let mut meta = TraceMeta::from_tracefs(&mut |p| read(p), Some(&[])).unwrap();
    let mut syms = String::new();
    for i in 0..60_000u64 {
        syms.push_str(&format!("{:016x} T symbol_number_{i}\n", 0x1000 + i * 16));
    }
    assert!(syms.len() > 2 << 20);
    meta.kallsyms = syms.clone().into_bytes();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("big_headers.dat");
    let mut w = Writer::create(&path, &meta).unwrap();
    let mut page = vec![0u8; 4096];
    page[8] = 0; // an empty page
    w.push_page(0, &page).unwrap();
    w.finish().unwrap();
    let r = Reader::open(&path).unwrap();
    assert_eq!(r.meta().kallsyms, syms.into_bytes());
    assert_eq!(r.events().count(), 0);
}

/// Thread names that grow past the room left for the headers move the pages written
/// straight into the file; nothing is lost, for the direct CPU or the others.
#[test]
fn headers_that_outgrow_their_room_move_the_pages() {
    use ustrace_ringbuf::page::PageWriter;
    let meta = TraceMeta::from_tracefs(&mut |p| read(p), Some(&[])).unwrap();
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("outgrown.dat");
    let mut w = Writer::create(&path, &meta).unwrap();
    let mut ts = 10;
    for i in 0..300u32 {
        let mut pw = PageWriter::new(ts);
        for _ in 0..20 {
            ts += 1;
            let mut rec = vec![0u8; 16];
            rec[4..8].copy_from_slice(&(i as i32).to_le_bytes());
            assert!(pw.push(ts, &rec));
        }
        w.push_page((i % 3) as usize, &pw.finish(None)).unwrap();
    }
    let mut later = meta.clone();
    let mut names = String::new();
    for pid in 0..150_000 {
        names.push_str(&format!("{pid} thread-name-{pid}\n"));
    }
    assert!(names.len() > 2 << 20);
    later.saved_cmdlines = names.into_bytes();
    w.update_meta(&later);
    let summary = w.finish().unwrap();
    assert_eq!(summary.events.iter().sum::<u64>(), 6000);
    let r = Reader::open(&path).unwrap();
    let evs: Vec<_> = r.events().map(Result::unwrap).collect();
    assert_eq!(evs.len(), 6000);
    assert!(evs.windows(2).all(|w| w[0].ts < w[1].ts));
    for (k, e) in evs.iter().enumerate() {
        assert_eq!(e.pid, (k / 20) as i32);
        assert_eq!(e.cpu, (k / 20 % 3) as u32);
    }
    assert_eq!(evs[20 * 7].comm, "thread-name-7");
}
