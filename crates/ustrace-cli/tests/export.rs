//! `ustrace export` and `ustrace flamegraph` on a trace.dat recorded here: events, fprobe
//! entry/exit pairs on two functions of this test, and stack traces are recorded with the
//! in-process tracer, written with `ustrace_tracedat::Writer` from the tracefs's own
//! `trace_pipe_raw` pages, exported by the real binary, and read back by readers we did not
//! write: the Perfetto output with the types generated from Perfetto's .proto files
//! (`perfetto_protos`), the Chrome JSON with serde_json, the SVG as inferno drew it.

use protobuf::Message;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use ustrace::{FileSystem, OpenFlags};

ustrace::trace_event! {
    /// A GET finished.
    pub fn export_kv::get(key: &str, latency_ns: u64) {
        key: &str = key,
        latency_ns: u64 = latency_ns,
    }
    print "key=%s latency_ns=%llu", key, latency_ns;
}

ustrace::trace_event! {
    /// A PUT finished (recorded with its stack).
    pub fn export_kv::put(key: &str) {
        key: &str = key,
    }
    print "key=%s", key;
}

/// The outer probed function: its slice holds `export_inner`'s and a `get` instant.
#[no_mangle]
#[inline(never)]
pub extern "C" fn export_outer(n: u64) -> u64 {
    let r = export_inner(std::hint::black_box(n) + 1);
    get::trace("alpha", 100 * n);
    std::hint::black_box(r)
}

/// The inner probed function.
#[no_mangle]
#[inline(never)]
pub extern "C" fn export_inner(n: u64) -> u64 {
    std::hint::black_box(n * 2)
}

fn tmpdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ustrace-export-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tracefs file's bytes, errors as the `io::Error` of their errno.
fn read_raw(path: &str) -> std::io::Result<Vec<u8>> {
    let fs = ustrace::tracefs();
    let io = |e: ustrace::Errno| std::io::Error::from_raw_os_error(e.0);
    let flags = OpenFlags {
        nonblock: true,
        ..OpenFlags::READ
    };
    let mut f = fs.open(path, flags).map_err(io)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        match f.read(&mut buf, None) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(ustrace::Errno::EAGAIN) => return Ok(out),
            Err(e) => return Err(io(e)),
        }
    }
}

/// A worker thread of the recording.
struct Worker {
    tid: i32,
    /// Its process as the trace.dat tells it: this test's pid when the file keeps thread
    /// groups, else (trace.dat has no saved_tgids section) the thread's own id.
    pid: i32,
}

/// Records the workload into DIR/trace.dat and returns its path and the worker threads.
fn record(dir: &Path) -> (PathBuf, Vec<Worker>) {
    let fs = ustrace::tracefs();
    fs.write_file("buffer_size_kb", "1024").unwrap();
    // saved_tgids, which groups the threads into their process.
    fs.write_file("options/record-tgid", "1").unwrap();
    fs.append_file(
        "dynamic_events",
        "f:fprobes/export_outer__entry export_outer n=$arg1\n",
    )
    .unwrap();
    fs.append_file(
        "dynamic_events",
        "f:fprobes/export_outer__exit export_outer%return ret=$retval\n",
    )
    .unwrap();
    // User-named, paired by the function's address, not by name.
    fs.append_file("dynamic_events", "f:fprobes/in export_inner\n")
        .unwrap();
    fs.append_file("dynamic_events", "f:fprobes/in_ret export_inner%return\n")
        .unwrap();
    // On `put`, outside the probed functions (a stack recorded inside one is tested in
    // ustrace's `stack_in_probed`).
    fs.write_file("events/export_kv/put/trigger", "stacktrace")
        .unwrap();
    fs.write_file("events/export_kv/enable", "1").unwrap();
    fs.write_file("events/fprobes/enable", "1").unwrap();

    let workers: Vec<i32> = (0..2)
        .map(|w| {
            std::thread::Builder::new()
                .name(format!("worker{w}"))
                .spawn(move || {
                    for n in 0..3 {
                        export_outer(n + 10 * w);
                        put::trace("beta");
                    }
                    // SAFETY: gettid has no arguments and cannot fail.
                    unsafe { libc::gettid() }
                })
                .unwrap()
                .join()
                .unwrap()
        })
        .collect();
    fs.write_file("events/fprobes/enable", "0").unwrap();
    fs.write_file("events/export_kv/enable", "0").unwrap();

    let events: Vec<(String, String)> =
        ["export_outer__entry", "export_outer__exit", "in", "in_ret"]
            .iter()
            .map(|e| ("fprobes".to_string(), e.to_string()))
            .chain(["get", "put"].map(|e| ("export_kv".to_string(), e.to_string())))
            .collect();
    let mut meta = ustrace_tracedat::TraceMeta::from_tracefs(&mut read_raw, Some(&events)).unwrap();
    // A ustrace tracefs has no kallsyms: give the file this process's functions, as a
    // recorder that knows its target can, so the stacks' frames get names.
    meta.kallsyms = ustrace_inspect::symbols::inventory()
        .functions()
        .iter()
        .map(|f| format!("{:x} T {}\n", f.addr, f.name))
        .collect::<String>()
        .into_bytes();
    let path = dir.join("trace.dat");
    let mut writer = ustrace_tracedat::Writer::create(&path, &meta).unwrap();
    for cpu in 0..meta.cpus {
        let mut pipe = fs
            .open(&format!("per_cpu/cpu{cpu}/trace_pipe_raw"), OpenFlags::READ)
            .unwrap();
        let mut page = vec![0u8; meta.page_size as usize];
        while let Ok(n) = pipe.read(&mut page, Some(Duration::from_millis(50))) {
            if n == 0 {
                break;
            }
            writer.push_page(cpu, &page[..n]).unwrap();
        }
    }
    writer.finish().unwrap();
    let reader = ustrace_tracedat::Reader::open(&path).unwrap();
    let workers = workers
        .into_iter()
        .map(|tid| {
            let ev = reader
                .events()
                .map(Result::unwrap)
                .find(|e| e.pid == tid)
                .expect("the worker's events");
            Worker {
                tid,
                pid: ev.tgid.unwrap_or(tid),
            }
        })
        .collect();
    (path, workers)
}

fn ustrace(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ustrace"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a reader sees on one thread's track, the same whatever the format.
#[derive(Debug, Default, PartialEq)]
struct Track {
    /// Every event in order: `I name`, `B name`, `E`.
    marks: Vec<String>,
    /// Each `get` instant's args, by name.
    gets: Vec<BTreeMap<String, String>>,
    /// Each `export_outer` slice's begin args.
    outer_args: Vec<BTreeMap<String, String>>,
}

/// The marks each worker's track must hold: three outer slices, each around an inner
/// slice and the `get` instant, each followed by a `put` (its stack entry comes first, as
/// the kernel's triggers without a filter write theirs before the event).
fn expected_marks() -> Vec<String> {
    let one = [
        "B export_outer",
        "B in",
        "E",
        "I get",
        "E",
        "I kernel_stack",
        "I put",
    ];
    (0..3)
        .flat_map(|_| one.iter().map(|s| s.to_string()))
        .collect()
}

fn check_tracks(tracks: &HashMap<i32, Track>, workers: &[Worker]) {
    for (w, worker) in workers.iter().enumerate() {
        let t = &tracks[&worker.tid];
        assert_eq!(t.marks, expected_marks(), "worker{w}");
        let latencies: Vec<&str> = t.gets.iter().map(|a| a["latency_ns"].as_str()).collect();
        let want: Vec<String> = (0..3).map(|n| (100 * (n + 10 * w)).to_string()).collect();
        assert_eq!(latencies, want, "worker{w}");
        assert!(t.gets.iter().all(|a| a["key"] == "alpha"), "{:?}", t.gets);
        let ns: Vec<&str> = t.outer_args.iter().map(|a| a["n"].as_str()).collect();
        let want: Vec<String> = (0..3).map(|n| (n + 10 * w).to_string()).collect();
        assert_eq!(ns, want, "worker{w}: the entry's fetched argument");
    }
}

fn perfetto(path: &Path, workers: &[Worker]) {
    use perfetto_protos::debug_annotation::debug_annotation::Value;
    use perfetto_protos::track_event::track_event::Type;
    let trace = perfetto_protos::trace::Trace::parse_from_bytes(&std::fs::read(path).unwrap())
        .expect("a Trace message");
    let mut threads: HashMap<u64, (i32, i32, String)> = HashMap::new();
    let mut processes: HashMap<u64, (i32, String)> = HashMap::new();
    let mut counters: HashMap<u64, (String, u64)> = HashMap::new();
    let mut tracks: HashMap<i32, Track> = HashMap::new();
    let mut counter_values: Vec<i64> = Vec::new();
    let mut last_ts = 0;
    // The interned names (event names, categories, annotation names) as the trace
    // processor keeps them: by id, valid on the sequence once a packet has defined them.
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut categories: HashMap<u64, String> = HashMap::new();
    let mut ann_names: HashMap<u64, String> = HashMap::new();
    for (i, p) in trace.packet.iter().enumerate() {
        // Every field we wrote is one Perfetto knows, at the number and type it expects.
        assert_eq!(p.special_fields.unknown_fields().iter().count(), 0, "{p:?}");
        assert_eq!(p.trusted_packet_sequence_id(), 1);
        if i == 0 {
            assert_eq!(
                p.sequence_flags(),
                1,
                "the first packet clears the sequence's state"
            );
        }
        if let Some(data) = p.interned_data.as_ref() {
            for (table, entries) in [
                (
                    &mut names,
                    data.event_names
                        .iter()
                        .map(|e| (e.iid(), e.name()))
                        .collect::<Vec<_>>(),
                ),
                (
                    &mut categories,
                    data.event_categories
                        .iter()
                        .map(|e| (e.iid(), e.name()))
                        .collect(),
                ),
                (
                    &mut ann_names,
                    data.debug_annotation_names
                        .iter()
                        .map(|e| (e.iid(), e.name()))
                        .collect(),
                ),
            ] {
                for (iid, name) in entries {
                    assert!(
                        iid != 0 && table.insert(iid, name.to_owned()).is_none(),
                        "iid {iid} defined twice"
                    );
                }
            }
        }
        if p.has_track_descriptor() {
            let td = p.track_descriptor();
            if let Some(t) = td.thread.as_ref() {
                threads.insert(td.uuid(), (t.pid(), t.tid(), t.thread_name().to_owned()));
                assert_eq!(processes[&td.parent_uuid()].0, t.pid());
            } else if let Some(pr) = td.process.as_ref() {
                processes.insert(td.uuid(), (pr.pid(), pr.process_name().to_owned()));
            } else {
                assert!(td.counter.is_some(), "{td:?}");
                counters.insert(td.uuid(), (td.name().to_owned(), td.parent_uuid()));
            }
            continue;
        }
        assert!(p.has_track_event(), "{p:?}");
        assert!(p.timestamp() >= last_ts, "packets in timestamp order");
        last_ts = p.timestamp();
        let te = p.track_event();
        assert_eq!(te.special_fields.unknown_fields().iter().count(), 0);
        assert_eq!(p.sequence_flags(), 2, "events depend on the interned names");
        if te.type_() == Type::TYPE_COUNTER {
            assert!(counters.contains_key(&te.track_uuid()));
            counter_values.push(te.counter_value());
            continue;
        }
        let (_, tid, _) = threads[&te.track_uuid()];
        let args: BTreeMap<String, String> = te
            .debug_annotations
            .iter()
            .map(|a| {
                let v = match a.value.as_ref() {
                    Some(Value::UintValue(u)) => u.to_string(),
                    Some(Value::IntValue(i)) => i.to_string(),
                    Some(Value::StringValue(s)) => s.clone(),
                    // An array field (a stack's callers).
                    None => format!(
                        "{:?}",
                        a.array_values
                            .iter()
                            .map(|v| v.uint_value())
                            .collect::<Vec<_>>()
                    ),
                    other => format!("{other:?}"),
                };
                (ann_names[&a.name_iid()].clone(), v)
            })
            .collect();
        let name = names.get(&te.name_iid()).map(String::as_str).unwrap_or("");
        let track = tracks.entry(tid).or_default();
        match te.type_() {
            Type::TYPE_INSTANT => {
                assert_eq!(te.category_iids.len(), 1);
                track.marks.push(format!("I {name}"));
                if name == "get" {
                    assert_eq!(categories[&te.category_iids[0]], "export_kv");
                    track.gets.push(args);
                }
            }
            Type::TYPE_SLICE_BEGIN => {
                track.marks.push(format!("B {name}"));
                if name == "export_outer" {
                    track.outer_args.push(args);
                }
            }
            Type::TYPE_SLICE_END => track.marks.push("E".into()),
            t => panic!("{t:?}"),
        }
    }
    for (w, worker) in workers.iter().enumerate() {
        let (tpid, ttid, name) = threads.values().find(|t| t.1 == worker.tid).unwrap();
        assert_eq!(
            (*tpid, *ttid, name.as_str()),
            (worker.pid, worker.tid, format!("worker{w}").as_str())
        );
        assert!(processes.values().any(|p| p.0 == worker.pid));
    }
    check_tracks(&tracks, workers);
    let pids: BTreeSet<i32> = workers.iter().map(|w| w.pid).collect();
    assert_eq!(counters.len(), pids.len(), "a counter track per process");
    for (name, parent) in counters.values() {
        assert_eq!(name, "export_kv:get:latency_ns");
        assert!(pids.contains(&processes[parent].0));
    }
    let mut got = counter_values.clone();
    got.sort();
    assert_eq!(got, vec![0, 100, 200, 1000, 1100, 1200]);
}

fn chrome(path: &Path, workers: &[Worker]) {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("valid JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let pids: BTreeSet<i64> = workers.iter().map(|w| i64::from(w.pid)).collect();
    let mut tracks: HashMap<i32, Track> = HashMap::new();
    let mut counter_values = Vec::new();
    let mut names = HashMap::new();
    let mut last_ts = 0.0;
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        if ph == "M" {
            if e["name"] == "thread_name" {
                names.insert(e["tid"].as_i64().unwrap(), e["args"]["name"].clone());
            }
            continue;
        }
        let ts = e["ts"].as_f64().unwrap();
        assert!(ts >= last_ts, "events in timestamp order");
        last_ts = ts;
        assert!(pids.contains(&e["pid"].as_i64().unwrap()), "{e}");
        if ph == "C" {
            assert_eq!(e["name"], "export_kv:get:latency_ns");
            counter_values.push(e["args"]["latency_ns"].as_i64().unwrap());
            continue;
        }
        let args: BTreeMap<String, String> = e["args"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_str().map(str::to_owned).unwrap_or(v.to_string()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let track = tracks.entry(e["tid"].as_i64().unwrap() as i32).or_default();
        let name = e["name"].as_str().unwrap();
        match ph {
            "i" => {
                assert_eq!(e["s"], "t");
                track.marks.push(format!("I {name}"));
                if name == "get" {
                    assert_eq!(e["cat"], "export_kv");
                    track.gets.push(args);
                }
            }
            "B" => {
                track.marks.push(format!("B {name}"));
                if name == "export_outer" {
                    track.outer_args.push(args);
                }
            }
            "E" => track.marks.push("E".into()),
            other => panic!("{other}"),
        }
    }
    for (w, worker) in workers.iter().enumerate() {
        assert_eq!(names[&i64::from(worker.tid)], format!("worker{w}"));
    }
    check_tracks(&tracks, workers);
    counter_values.sort();
    assert_eq!(counter_values, vec![0, 100, 200, 1000, 1100, 1200]);
}

#[test]
fn export_perfetto_chrome_folded_and_flamegraph_are_read_back() {
    let dir = tmpdir("all");
    let (dat, workers) = record(&dir);
    let pf = dir.join("t.pftrace");
    let js = dir.join("t.json");
    let fo = dir.join("t.folded");
    let out = ustrace(&[
        "export",
        "--perfetto",
        pf.to_str().unwrap(),
        "--chrome",
        js.to_str().unwrap(),
        "--folded",
        fo.to_str().unwrap(),
        "--counter",
        "export_kv:get:latency_ns",
        dat.to_str().unwrap(),
    ]);
    ok(&out);
    perfetto(&pf, &workers);
    chrome(&js, &workers);

    // One stack per `put`: each rooted at its worker, named from the file's symbols.
    let folded = std::fs::read_to_string(&fo).unwrap();
    let mut per_worker = BTreeMap::new();
    for line in folded.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        let root = stack.split(';').next().unwrap();
        assert!(stack.split(';').count() > 2, "{line}");
        assert!(
            stack.contains(";export::record::{{closure}}"),
            "frames are named: {line}"
        );
        *per_worker.entry(root.to_owned()).or_insert(0) += count.parse::<u64>().unwrap();
    }
    assert_eq!(
        per_worker,
        BTreeMap::from([("worker0".to_owned(), 3), ("worker1".to_owned(), 3)]),
        "{folded}"
    );

    // The flame graph of the trace.dat and of its folded stacks are the same drawing.
    let svg1 = dir.join("a.svg");
    let svg2 = dir.join("b.svg");
    ok(&ustrace(&[
        "flamegraph",
        "-o",
        svg1.to_str().unwrap(),
        "--title",
        "t",
        dat.to_str().unwrap(),
    ]));
    ok(&ustrace(&[
        "flamegraph",
        "-o",
        svg2.to_str().unwrap(),
        "--title",
        "t",
        fo.to_str().unwrap(),
    ]));
    let svg = std::fs::read_to_string(&svg1).unwrap();
    assert_eq!(svg, std::fs::read_to_string(&svg2).unwrap());
    assert!(svg.contains("<svg") && svg.contains(">worker0<"), "{svg}");
    assert!(svg.contains("6 stacks"), "{svg}");

    // A counter on a string field is refused, and no output file is left behind.
    let bad = dir.join("bad.json");
    let out = ustrace(&[
        "export",
        "--chrome",
        bad.to_str().unwrap(),
        "--counter",
        "export_kv:get:key",
        dat.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("export_kv:get:key: the field is not a number"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!bad.exists());
    for (counter, says) in [
        ("export_kv:nope:x", "has no `export_kv:nope` event"),
        (
            "export_kv:get:nope",
            "has no field `nope` (its fields: key, latency_ns)",
        ),
    ] {
        let out = ustrace(&[
            "export",
            "--chrome",
            bad.to_str().unwrap(),
            "--counter",
            counter,
            dat.to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{err}");
        assert!(!bad.exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_refused_with_the_file_named_and_nothing_written() {
    let dir = tmpdir("bad");
    let junk = dir.join("junk.dat");
    std::fs::write(&junk, b"\x17\x08\x44tracing6\0garbage").unwrap();
    let out_path = dir.join("out.pftrace");
    let out = ustrace(&[
        "export",
        "--perfetto",
        out_path.to_str().unwrap(),
        junk.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot read {}", junk.display())),
        "{err}"
    );
    assert!(!out_path.exists());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "no temporary file left"
    );

    let out = ustrace(&["export", junk.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "no output asked for is a usage error"
    );
    let out = ustrace(&[
        "export",
        "--chrome",
        "-",
        "--counter",
        "nofield",
        junk.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("SYSTEM:EVENT:FIELD"));

    let empty = dir.join("empty.folded");
    std::fs::write(&empty, "").unwrap();
    let out = ustrace(&["flamegraph", empty.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no stacks to draw"));
    let _ = std::fs::remove_dir_all(&dir);
}
