//! Our raw pages are the kernel's: libtraceevent's kbuffer walks the pages
//! `read_page` returns (as `per_cpu/cpuN/trace_pipe_raw` would), and
//! tep parses each event with a kernel-style `format`, giving back every
//! field, every timestamp and the lost-event counts we wrote.
//!
//! Needs `cc` and Debian's `libtraceevent-dev`; skips loudly without them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use ustrace_ringbuf::page::DATA_SIZE;
use ustrace_ringbuf::{clock::Clock, Config, RingBuffer};

const EVENT_ID: u16 = 1234;

const FORMAT: &str = "name: ustrace_test
ID: 1234
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:u64 value;\toffset:8;\tsize:8;\tsigned:0;
\tfield:u32 id;\toffset:16;\tsize:4;\tsigned:0;
\tfield:char comm[16];\toffset:20;\tsize:16;\tsigned:0;
\tfield:__data_loc char[] msg;\toffset:36;\tsize:4;\tsigned:0;

print fmt: \"value=%llu id=%u comm=%s msg=%s\", REC->value, REC->id, REC->comm, __get_str(msg)
";

/// The kernel's `events/header_page` on 64-bit machines.
const HEADER_PAGE: &str = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;
\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;
\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;
\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;
";

const HARNESS: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <traceevent/event-parse.h>
#include <traceevent/kbuffer.h>

static char *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END); *len = ftell(f); fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    if (fread(buf, 1, *len, f) != (size_t)*len) { perror("read"); exit(2); }
    buf[*len] = 0; fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    long flen, hlen, plen;
    char *fmt = slurp(argv[1], &flen), *hdr = slurp(argv[2], &hlen), *pages = slurp(argv[3], &plen);
    struct tep_handle *tep = tep_alloc();
    tep_set_long_size(tep, 8);
    tep_set_page_size(tep, 4096);
    if (tep_parse_header_page(tep, hdr, hlen, 8)) { fprintf(stderr, "header_page rejected\n"); return 3; }
    if (tep_parse_event(tep, fmt, flen, "ustrace")) { fprintf(stderr, "format rejected\n"); return 3; }
    struct kbuffer *kbuf = kbuffer_alloc(KBUFFER_LSIZE_8, KBUFFER_ENDIAN_LITTLE);
    for (long off = 0; off + 4096 <= plen; off += 4096) {
        if (kbuffer_load_subbuffer(kbuf, pages + off)) { fprintf(stderr, "page rejected\n"); return 3; }
        printf("page missed=%d\n", kbuffer_missed_events(kbuf));
        unsigned long long ts;
        void *data;
        for (data = kbuffer_read_event(kbuf, &ts); data; data = kbuffer_next_event(kbuf, NULL)) {
            kbuffer_read_event(kbuf, &ts);
            struct tep_record rec;
            memset(&rec, 0, sizeof rec);
            rec.ts = ts; rec.data = data; rec.size = kbuffer_event_size(kbuf);
            int type = tep_data_type(tep, &rec);
            struct tep_event *ev = tep_find_event(tep, type);
            if (!ev) { printf("event type=%d unknown\n", type); continue; }
            unsigned long long pid, value, id;
            int len;
            tep_get_common_field_val(NULL, ev, "common_pid", &rec, &pid, 1);
            tep_get_field_val(NULL, ev, "value", &rec, &value, 1);
            tep_get_field_val(NULL, ev, "id", &rec, &id, 1);
            char *comm = tep_get_field_raw(NULL, ev, "comm", &rec, &len, 1);
            char *msg = tep_get_field_raw(NULL, ev, "msg", &rec, &len, 1);
            struct trace_seq s;
            trace_seq_init(&s);
            tep_print_event(tep, &s, &rec, "%s", TEP_PRINT_INFO);
            trace_seq_terminate(&s);
            printf("event ts=%llu type=%d pid=%d value=%llu id=%llu comm=%.16s msg=%s | %s\n",
                   ts, type, (int)pid, value, id, comm, msg, s.buffer);
            trace_seq_destroy(&s);
        }
    }
    kbuffer_free(kbuf);
    tep_free(tep);
    return 0;
}
"#;

struct Ev {
    pid: i32,
    value: u64,
    id: u32,
    comm: String,
    msg: String,
}

fn encode(e: &Ev) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&EVENT_ID.to_ne_bytes());
    v.push(0); // flags
    v.push(1); // preempt count
    v.extend_from_slice(&e.pid.to_ne_bytes());
    v.extend_from_slice(&e.value.to_ne_bytes());
    v.extend_from_slice(&e.id.to_ne_bytes());
    let mut comm = [0u8; 16];
    comm[..e.comm.len()].copy_from_slice(e.comm.as_bytes());
    v.extend_from_slice(&comm);
    let msg_len = e.msg.len() as u32 + 1;
    let loc = (msg_len << 16) | 40;
    v.extend_from_slice(&loc.to_ne_bytes());
    v.extend_from_slice(e.msg.as_bytes());
    v.push(0);
    v
}

fn have(path: &str) -> bool {
    Path::new(path).exists()
}

fn compile(dir: &Path) -> Option<PathBuf> {
    if !have("/usr/include/traceevent/event-parse.h") {
        eprintln!("skipped: libtraceevent headers missing (apt-get install -y libtraceevent-dev)");
        return None;
    }
    let src = dir.join("harness.c");
    std::fs::write(&src, HARNESS).unwrap();
    let bin = dir.join("harness");
    let out = match Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .arg("-ltraceevent")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no C compiler (cc): {e}");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "harness did not build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(bin)
}

#[test]
fn libtraceevent_reads_our_pages() {
    let dir = std::env::temp_dir().join(format!("ustrace-tep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(harness) = compile(&dir) else { return };

    let rb = RingBuffer::new(Config {
        nr_cpus: 1,
        size_per_cpu: 4 * DATA_SIZE,
        overwrite: true,
        clock: Clock::Local,
        name: "tep".into(),
    })
    .unwrap();
    let mut written = Vec::new();
    for i in 0..60u32 {
        let e = Ev {
            pid: 1000 + i as i32,
            value: u64::from(i) * 0x1_0000_0001,
            id: i,
            comm: format!("task{i}"),
            // Short and long (type_len 0, > 112 bytes) events.
            msg: if i % 3 == 0 {
                "x".repeat(150 + i as usize)
            } else {
                format!("m{i}")
            },
        };
        assert!(rb.write(&encode(&e)));
        if i % 10 == 5 {
            // A discarded event in the middle, and a gap needing a time extend.
            let r = rb.reserve(64).unwrap();
            r.discard();
            if i == 25 {
                std::thread::sleep(Duration::from_millis(150));
            }
        }
        written.push(e);
    }
    // Timestamps as our own reader sees them.
    let ours: Vec<u64> = rb.iter().map(|e| e.ts).collect();
    assert_eq!(ours.len(), written.len());
    let mut pages = Vec::new();
    while let Some(p) = rb.read_page(0) {
        pages.extend_from_slice(&p);
    }
    // Then overflow the buffer so the next page carries a lost-event count
    // (52-byte events leave room after the data to store it).
    for i in 0..400u32 {
        let e = Ev {
            pid: 1,
            value: 7,
            id: 100_000 + i,
            comm: "flood".into(),
            msg: "flood".into(),
        };
        rb.write(&encode(&e));
    }
    let overrun = rb.stats(0).overrun;
    assert!(overrun > 0);
    let lost_page = rb.read_page(0).unwrap();
    pages.extend_from_slice(&lost_page);

    std::fs::write(dir.join("format"), FORMAT).unwrap();
    std::fs::write(dir.join("header_page"), HEADER_PAGE).unwrap();
    std::fs::write(dir.join("pages"), &pages).unwrap();
    let out = Command::new(&harness)
        .arg(dir.join("format"))
        .arg(dir.join("header_page"))
        .arg(dir.join("pages"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "harness failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let events: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("event "))
        .collect();
    let page_lines: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("page "))
        .collect();
    assert!(
        events.len() > written.len(),
        "got {} events:\n{stdout}",
        events.len()
    );
    for (i, (e, line)) in written.iter().zip(&events).enumerate() {
        let want = format!(
            "event ts={} type={EVENT_ID} pid={} value={} id={} comm={} msg={} | value={} id={} comm={} msg={}",
            ours[i], e.pid, e.value, e.id, e.comm, e.msg, e.value, e.id, e.comm, e.msg
        );
        assert_eq!(*line, want, "event {i}");
    }
    // All pages before the flood had no loss; the flood page reports the overrun.
    let (last, before) = page_lines.split_last().unwrap();
    assert!(
        before.iter().all(|l| *l == "page missed=0"),
        "{page_lines:?}"
    );
    assert_eq!(*last, format!("page missed={overrun}"));
    let flood_first = events[written.len()];
    let first_kept = overrun as u32; // ids 100000.. were written in order, the oldest were overwritten
    assert!(
        flood_first.contains(&format!(" id={} ", 100_000 + first_kept)),
        "{flood_first}"
    );
    eprintln!(
        "libtraceevent parsed {} events from {} pages; lost {overrun}",
        events.len(),
        page_lines.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
