//! The hot path allocates nothing: a counting global allocator watches tracepoint calls,
//! event writes (plain, filtered, with triggers) after the first call of each thread.

use ustrace::{FileSystem, OpenFlags};

#[global_allocator]
static GLOBAL: ustrace_testalloc::CountingAllocator = ustrace_testalloc::CountingAllocator;

ustrace::trace_event! {
    pub fn noalloc::ev(a: u64, s: &str, bytes: &[u8]) {
        a: u64 = a,
        s: &str = s,
        bytes: &[u8] = bytes,
    }
    print "a=%llu s=%s bytes=%s", a, s, bytes;
}

ustrace::trace_event! {
    pub fn noalloc::ev2(key: u64) {
        key: u64 = key,
    }
    print "key=%llu", key;
}

fn set(path: &str, text: &str) {
    let mut f = ustrace::tracefs().open(path, OpenFlags::TRUNCATE).unwrap();
    f.write(text.as_bytes()).unwrap();
}

fn count(mut body: impl FnMut()) -> usize {
    body(); // first call per thread: thread id, name, RCU slot
    ustrace_testalloc::count_in_process(|| {
        for _ in 0..10_000 {
            body();
        }
    })
}

#[test]
fn tracepoints_and_event_writes_do_not_allocate() {
    let fs = ustrace::tracefs();
    fs.mkdir("instances/noalloc").unwrap();
    assert_eq!(count(|| ev::trace(1, "off", b"x")), 0, "tracepoint off");
    set("instances/noalloc/events/noalloc/ev/enable", "1\n");
    assert_eq!(
        count(|| ev::trace(2, "recorded", b"bytes")),
        0,
        "event written"
    );
    set(
        "instances/noalloc/events/noalloc/ev/filter",
        "a == 3 && s ~ \"rec*\"\n",
    );
    assert_eq!(
        count(|| ev::trace(2, "rejected", b"bytes")),
        0,
        "filter rejects"
    );
    assert_eq!(
        count(|| ev::trace(3, "recorded", b"bytes")),
        0,
        "filter keeps"
    );
    set(
        "instances/noalloc/events/noalloc/ev/trigger",
        "traceon if a == 4\n",
    );
    assert_eq!(
        count(|| ev::trace(4, "recorded", b"bytes")),
        0,
        "conditional trigger"
    );
    set("instances/noalloc/events/noalloc/ev/enable", "0\n");
    assert_eq!(
        count(|| ev::trace(4, "soft", b"bytes")),
        0,
        "soft-disabled with a trigger"
    );
    // A hist update: a u64 key with a value, then a compound key with a string, a log2
    // bucket and a variable; new keys are claimed in the preallocated table.
    set(
        "instances/noalloc/events/noalloc/ev/trigger",
        "hist:keys=a:vals=a\n",
    );
    let mut a = 0u64;
    assert_eq!(
        count(|| {
            a = (a + 1) % 1000;
            ev::trace(a, "hist", b"bytes")
        }),
        0,
        "hist update, one u64 key"
    );
    let mut hist = String::new();
    let mut f = ustrace::tracefs()
        .open("instances/noalloc/events/noalloc/ev/hist", OpenFlags::READ)
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let n = f.read(&mut buf, None).unwrap();
    hist.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    assert!(hist.contains("    Hits: 10001\n"), "{hist}");
    set(
        "instances/noalloc/events/noalloc/ev/trigger",
        "hist:keys=s,a.log2:vals=a:t=common_timestamp.usecs,d=a*2+1\n",
    );
    assert_eq!(
        count(|| {
            a = (a + 7) % 5000;
            ev::trace(a, "hist", b"bytes")
        }),
        0,
        "hist update, compound key with a string and variables"
    );
    // Inter-event: a variable read across events with this record's key, a synthetic
    // event generated and recorded, a maximum and a field saved per entry.
    let mut f = ustrace::tracefs()
        .open("synthetic_events", OpenFlags::APPEND)
        .unwrap();
    f.write(b"noalloc_lat u64 key; u64 lat\n").unwrap();
    set(
        "instances/noalloc/events/noalloc/ev/trigger",
        "hist:keys=a:t0=common_timestamp\n",
    );
    set(
        "instances/noalloc/events/noalloc/ev2/trigger",
        "hist:keys=key:lat=common_timestamp-$t0:onmatch(noalloc.ev).noalloc_lat(key,$lat):onmax($lat).save(key)\n",
    );
    set(
        "instances/noalloc/events/synthetic/noalloc_lat/enable",
        "1\n",
    );
    assert_eq!(
        count(|| {
            a = (a + 7) % 1000;
            ev::trace(a, "hist", b"bytes");
            ev2::trace(a);
        }),
        0,
        "hist inter-event pair: reference, onmatch synthetic event, onmax save"
    );
    let mut text = String::new();
    let mut file = ustrace::tracefs()
        .open("instances/noalloc/events/noalloc/ev2/hist", OpenFlags::READ)
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let n = file.read(&mut buf, None).unwrap();
    text.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    assert!(text.contains("    Hits: 10001\n"), "{text}");
    assert!(text.contains("\n\tmax: "), "{text}");
}
