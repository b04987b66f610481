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
