//! `ustrace hist`: the hist-file parser against histogram.rst's example outputs (stored
//! dedented under `tests/golden/hist/input/`), the charts, folded stacks and SVG flame graphs
//! against golden files (`tests/golden/hist/*.out`, rewritten with `USTRACE_BLESS=1` — review
//! the diff), the errors, and property tests of the parser.

mod common;

use common::DefaultSignals;
use proptest::prelude::*;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

// The parser and the pictures are modules of the binary; the tests compile the same files
// (as top-level modules, so their `super::parse` is this crate's `parse`).
#[allow(dead_code)]
#[path = "../src/hist/chart.rs"]
mod chart;
#[allow(dead_code)]
#[path = "../src/hist/flame.rs"]
mod flame;
#[allow(dead_code)]
#[path = "../src/hist/parse.rs"]
mod parse;

use parse::{Entry, HistFile, KeyField, KeyValue, Section, Totals, Val, ValField};

const BIN: &str = env!("CARGO_BIN_EXE_ustrace");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/hist")
}

fn input(name: &str) -> PathBuf {
    golden_dir().join("input").join(format!("{name}.hist"))
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(input(name)).unwrap()
}

fn ustrace(args: &[&str], columns: usize) -> Output {
    Command::new(BIN)
        .args(args)
        .env("COLUMNS", columns.to_string())
        .output()
        .unwrap()
}

/// Compares `got` with the golden file `name`, or writes it under `USTRACE_BLESS=1`.
fn check_golden(name: &str, got: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("USTRACE_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (USTRACE_BLESS=1 writes it)", path.display()));
    if want != got {
        let first = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "{name} differs from its golden file at line {}:\n--- want\n{}\n--- got\n{}\n\
             (USTRACE_BLESS=1 rewrites the golden files)",
            first + 1,
            want.lines().nth(first).unwrap_or("<end>"),
            got.lines().nth(first).unwrap_or("<end>")
        );
    }
}

/// Every fixture: the sections, the entries (each `{` line of the document is one), the
/// totals the document prints.
#[test]
fn every_example_of_histogram_rst_parses() {
    // (fixture, sections, Hits of the first section)
    let cases: &[(&str, usize, u64)] = &[
        ("kmalloc_call_site", 1, 4610),
        ("kmalloc_hex", 1, 4775),
        ("kmalloc_sym", 1, 109928),
        ("kmalloc_sym_offset", 1, 26098),
        ("kmalloc_two_vals", 1, 66598),
        ("kmalloc_stacktrace", 1, 6085872),
        ("read_execname", 1, 2116),
        ("sys_enter_syscall", 1, 67612),
        ("syscall_execname", 1, 31536),
        ("recvfrom_pid_size", 1, 2016),
        ("fork_child_comm", 1, 89),
        ("netif_receive_skb_stack", 1, 1232),
        ("netif_cleared", 1, 0),
        ("netif_five", 5, 1428),
        ("named_foo_two", 2, 81),
        ("named_bar_stack", 1, 489),
        ("wakeup_latency_log2", 1, 2122),
        ("wakeup_latency_buckets", 1, 2112),
        ("block_lat_stack", 1, 10),
        ("onmax_save", 1, 12970),
        ("onmax_snapshot", 1, 3508),
        ("onchange_snapshot", 1, 414),
        ("cyclictest_latency", 1, 67625),
    ];
    for &(name, sections, hits) in cases {
        let text = fixture(name);
        let file = parse::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(file.sections.len(), sections, "{name}");
        let opened = text
            .lines()
            .filter(|l| l.trim_start().starts_with('{'))
            .count();
        let entries: usize = file.sections.iter().map(|s| s.entries.len()).sum();
        assert_eq!(entries, opened, "{name}: one entry per `{{` line");
        assert_eq!(
            file.sections[0].totals.as_ref().and_then(|t| t.hits),
            Some(hits),
            "{name}"
        );
        for s in &file.sections {
            for e in &s.entries {
                assert!(!e.keys.is_empty(), "{name}: {e:?}");
                assert!(e.vals.iter().any(|v| v.name == "hitcount"), "{name}: {e:?}");
            }
        }
        // What was read prints back to text that reads the same.
        let again = parse::parse(&file.to_string()).unwrap();
        assert_eq!(again, file, "{name}: print and read again");
    }
}

#[test]
fn keys_are_read_by_their_modifiers() {
    let key = |name: &str, section: usize, entry: usize, field: usize| {
        parse::parse(&fixture(name)).unwrap().sections[section].entries[entry].keys[field].clone()
    };
    assert_eq!(
        key("kmalloc_sym", 0, 2, 0).value,
        KeyValue::Sym {
            addr: 0xffffffffa00bf6fe,
            name: "hidraw_send_report [hid]".into(),
            offset: false
        }
    );
    assert_eq!(
        key("kmalloc_sym_offset", 0, 0, 0).value,
        KeyValue::Sym {
            addr: 0xffffffffa046041c,
            name: "i915_gem_execbuffer2+0x6c/0x2c0 [i915]".into(),
            offset: true
        }
    );
    assert_eq!(
        key("kmalloc_hex", 0, 0, 0).value,
        KeyValue::Hex(0xffffffffa026b291)
    );
    assert_eq!(
        key("read_execname", 0, 0, 0).value,
        KeyValue::Execname {
            comm: "gnome-terminal".into(),
            pid: 3196
        }
    );
    let k = key("syscall_execname", 0, 0, 0);
    assert_eq!(
        k.value,
        KeyValue::Syscall {
            name: "sys_read".into(),
            nr: 0
        }
    );
    assert_eq!(
        key("fork_child_comm", 0, 0, 0).value,
        KeyValue::Str("dconf worker".into())
    );
    assert_eq!(key("wakeup_latency_log2", 0, 0, 2).value, KeyValue::Log2(2));
    assert_eq!(
        key("wakeup_latency_buckets", 0, 14, 2).value,
        KeyValue::Bucket { lo: 10, hi: 19 }
    );
    let stack = key("kmalloc_stacktrace", 0, 2, 0);
    assert_eq!(stack.name, "common_stacktrace");
    let KeyValue::Stack(frames) = stack.value else {
        panic!("{stack:?}")
    };
    assert_eq!(frames.len(), 7);
    assert_eq!(frames[0], "kmem_cache_alloc_trace+0xeb/0x150");
    assert_eq!(frames[6], "system_call_fastpath+0x12/0x6a");
    // A synthetic event's stack field: `stack.stacktrace`, its first frame on the key line.
    let e = &parse::parse(&fixture("block_lat_stack")).unwrap().sections[0].entries[5];
    assert_eq!(e.keys[0].value, KeyValue::Bucket { lo: 100, hi: 199 });
    assert_eq!(e.keys[1].name, "stack.stacktrace");
    let KeyValue::Stack(frames) = &e.keys[1].value else {
        panic!("{e:?}")
    };
    assert_eq!(frames.len(), 15);
    assert_eq!(frames[0], "__schedule+0xa19/0x1520");
}

#[test]
fn action_lines_and_snapshot_details_are_kept() {
    let file = parse::parse(&fixture("onmax_save")).unwrap();
    let e = &file.sections[0].entries[0];
    assert!(
        e.extra.iter().any(|l| l.trim_start().starts_with("max:")),
        "{e:?}"
    );
    let file = parse::parse(&fixture("onchange_snapshot")).unwrap();
    let s = &file.sections[0];
    assert!(
        s.other.iter().any(|l| l.starts_with("Snapshot taken")),
        "{s:?}"
    );
    assert!(s.entries[1].extra[0].trim_start().starts_with("changed:"));
    assert_eq!(s.entries.len(), 4);
}

/// The charts, as golden files: (golden name, fixture, extra args, COLUMNS).
const CHARTS: &[(&str, &str, &[&str], usize)] = &[
    ("kmalloc_sym.out", "kmalloc_sym", &[], 80),
    (
        "kmalloc_two_vals_bytes_alloc.out",
        "kmalloc_two_vals",
        &["--value", "bytes_alloc"],
        80,
    ),
    ("syscall_execname_60.out", "syscall_execname", &[], 60),
    ("sys_enter_syscall.out", "sys_enter_syscall", &[], 80),
    ("kmalloc_sym_offset_50.out", "kmalloc_sym_offset", &[], 50),
    ("fork_child_comm.out", "fork_child_comm", &[], 80),
    ("netif_five.out", "netif_five", &[], 80),
    ("wakeup_latency_log2.out", "wakeup_latency_log2", &[], 80),
    (
        "wakeup_latency_log2_merged.out",
        "wakeup_latency_log2",
        &["--merge"],
        80,
    ),
    (
        "wakeup_latency_buckets_merged.out",
        "wakeup_latency_buckets",
        &["--merge"],
        72,
    ),
    ("kmalloc_stacktrace_100.out", "kmalloc_stacktrace", &[], 100),
    ("block_lat_stack.out", "block_lat_stack", &[], 80),
    ("onchange_snapshot.out", "onchange_snapshot", &[], 80),
    (
        "percent_graph.out",
        "percent_graph",
        &["--value", "len"],
        80,
    ),
    (
        "percent_graph_count.out",
        "percent_graph",
        &["--value", "count"],
        60,
    ),
];

#[test]
fn charts_match_their_golden_files() {
    for &(golden, name, args, columns) in CHARTS {
        let file = input(name);
        let title = format!("doc:{name}");
        let mut all = vec!["hist", "--file", file.to_str().unwrap()];
        all.extend_from_slice(args);
        all.push(&title);
        let out = ustrace(&all, columns);
        assert!(
            out.status.success(),
            "{golden}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        for line in text.lines() {
            assert!(
                line.chars().count() <= columns
                    || line.contains("  hist:")
                    || line.starts_with(' ')
                    || line.starts_with("Snapshot"),
                "{golden}: wider than {columns}: {line}"
            );
        }
        check_golden(golden, &text);
    }
}

#[test]
fn a_distribution_shows_empty_buckets_in_order() {
    let file = input("wakeup_latency_log2");
    let out = ustrace(&["hist", "--file", file.to_str().unwrap(), "--merge"], 80);
    let text = String::from_utf8(out.stdout).unwrap();
    let labels: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("lat.log2"))
        .skip(1)
        .take_while(|l| !l.starts_with("Hits:"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    // 2^2..2^7 of the kernel's log2 (v goes to log2(roundup_pow_of_two(v))), 2^5 and 2^6 empty.
    assert_eq!(labels, ["3-4", "5-8", "9-16", "17-32", "33-64", "65-128"]);
    let row = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{label} ")))
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    // Summed over every pid and prio.
    assert_eq!(row("3-4"), 1844);
    assert_eq!(row("17-32"), 0);
    assert_eq!(row("65-128"), 2);
}

#[test]
fn stacks_fold_and_draw_a_flame_graph() {
    let dir = std::env::temp_dir().join(format!("ustrace-hist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["kmalloc_stacktrace", "named_bar_stack", "block_lat_stack"] {
        let folded = dir.join(format!("{name}.folded"));
        let svg = dir.join(format!("{name}.svg"));
        let file = input(name);
        let out = ustrace(
            &[
                "hist",
                "--file",
                file.to_str().unwrap(),
                "--folded",
                folded.to_str().unwrap(),
                "--svg",
                svg.to_str().unwrap(),
                &format!("doc:{name}"),
            ],
            80,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let folded_text = std::fs::read_to_string(&folded).unwrap();
        check_golden(&format!("{name}.folded"), &folded_text);
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        check_golden(&format!("{name}.svg"), &svg_text);
        assert!(svg_text.starts_with("<?xml") && svg_text.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg_text.matches("<g>").count(),
            svg_text.matches("</g>").count()
        );
    }
    // Weights are the hitcounts (or --value), summed over equal stacks.
    let text = std::fs::read_to_string(dir.join("named_bar_stack.folded")).unwrap();
    let total: u64 = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 489);
    assert!(text
        .lines()
        .any(|l| l == "ret_from_fork;kthreadd;kernel_thread;kernel_clone 1"));
    // The bucket key comes first, so the graph splits by latency.
    let text = std::fs::read_to_string(dir.join("block_lat_stack.folded")).unwrap();
    assert!(text
        .lines()
        .all(|l| l.starts_with("delta: 0-99;") || l.starts_with("delta: 100-199;")));
    let _ = std::fs::remove_dir_all(&dir);
}

fn failure(args: &[&str]) -> String {
    let out = ustrace(args, 80);
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("ustrace-hist-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage");
    std::fs::write(&garbage, "\n# tracer: nop\nnot a histogram\n").unwrap();
    let err = failure(&["hist", "--file", garbage.to_str().unwrap()]);
    assert!(err.contains("line 3: not a hist file"), "{err}");
    let empty = dir.join("empty");
    std::fs::write(&empty, "").unwrap();
    let err = failure(&["hist", "--file", empty.to_str().unwrap()]);
    assert!(err.contains("no hist trigger"), "{err}");
    let open = dir.join("open");
    std::fs::write(&open, "{ common_stacktrace:\n         f+0x1/0x2\n").unwrap();
    let err = failure(&["hist", "--file", open.to_str().unwrap()]);
    assert!(
        err.contains("line 1: this entry's `{` is never closed"),
        "{err}"
    );

    let sym = input("kmalloc_sym");
    let sym = sym.to_str().unwrap();
    let err = failure(&["hist", "--file", sym, "--value", "bytes"]);
    assert!(err.contains("no value named `bytes`"), "{err}");
    assert!(err.contains("hitcount, bytes_req"), "{err}");
    let err = failure(&["hist", "--file", sym, "--svg", "/dev/null"]);
    assert!(err.contains("no section is keyed by a stack"), "{err}");
    let err = failure(&["hist", "--file", sym, "--section", "2"]);
    assert!(err.contains("no section 2: the hist has 1"), "{err}");
    let err = failure(&["hist", "--tracefs", dir.to_str().unwrap(), "kmem"]);
    assert!(err.contains("SYSTEM:EVENT or SYSTEM/EVENT"), "{err}");
    let err = failure(&["hist", "kmem:kmalloc"]);
    assert!(err.contains("--pid") || err.contains("required"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tracefs_directory_is_read_like_the_kernels() {
    let dir = std::env::temp_dir().join(format!("ustrace-hist-tfs-{}", std::process::id()));
    let ev = dir.join("events/kmem/kmalloc");
    let inst = dir.join("instances/foo/events/sched/sched_process_fork");
    std::fs::create_dir_all(&ev).unwrap();
    std::fs::create_dir_all(&inst).unwrap();
    std::fs::copy(input("kmalloc_sym"), ev.join("hist")).unwrap();
    std::fs::copy(input("fork_child_comm"), inst.join("hist")).unwrap();
    let d = dir.to_str().unwrap();
    for event in ["kmem:kmalloc", "kmem/kmalloc"] {
        let out = ustrace(&["hist", "--tracefs", d, event], 80);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.starts_with(&format!("{event}  hist:keys=call_site.sym")),
            "{text}"
        );
        assert!(text.contains("ext4_htree_store_dirent"), "{text}");
    }
    let out = ustrace(
        &[
            "hist",
            "--tracefs",
            d,
            "-i",
            "foo",
            "sched:sched_process_fork",
        ],
        80,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("glib-pacrunner"));
    let err = failure(&["hist", "--tracefs", d, "kmem:kfree"]);
    assert!(err.contains("kmem/kfree/hist"), "{err}");
    assert!(err.contains("no event kmem:kfree there"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_kernels_tracefs_says_why_it_has_no_hist() {
    let root = Path::new("/sys/kernel/tracing");
    if !root.join("events/sched/sched_switch").is_dir() {
        eprintln!("skipped: no kernel tracefs at /sys/kernel/tracing");
        return;
    }
    let out = ustrace(
        &[
            "hist",
            "--tracefs",
            "/sys/kernel/tracing",
            "sched:sched_switch",
        ],
        80,
    );
    if root.join("events/sched/sched_switch/hist").exists() {
        // A kernel with hist triggers: an event without one has an empty hist file.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || err.contains("no hist trigger"),
            "{err}"
        );
    } else {
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("CONFIG_HIST_TRIGGERS"), "{err}");
    }
}

// ---- against a live process ----

/// A `ustrace demo --serve` on a private socket directory, killed and cleaned up on drop.
struct Demo {
    child: Child,
    dir: PathBuf,
}

impl Demo {
    fn start() -> Demo {
        let dir = std::env::temp_dir().join(format!("ustrace-hist-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(BIN)
            .args(["demo", "--serve", "--workers", "2", "--rate", "2000"])
            .env("USTRACE_SOCKET_DIR", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .default_signals()
            .spawn()
            .unwrap();
        let socket = dir.join(format!("{}.sock", child.id()));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("demo exited {st} before serving: {err}");
            }
            assert!(Instant::now() < deadline, "the demo never served");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Drain its stderr so that it never blocks on a full pipe.
        let mut err = child.stderr.take().unwrap();
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        Demo { child, dir }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .env("USTRACE_SOCKET_DIR", &self.dir)
            .env("COLUMNS", "80")
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "ustrace {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The hist file the process serves, once its triggers are paused (so that `cat` and
/// `hist` see the same numbers).
fn paused_hist(demo: &Demo, pid: &str, event: &str, trigger: &str) -> parse::HistFile {
    let path = format!("events/{event}/trigger");
    demo.ok(&["write", "-p", pid, &path, trigger]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = demo.ok(&["cat", "-p", pid, &format!("events/{event}/hist")]);
        let file = parse::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let hits = file.sections[0].totals.as_ref().and_then(|t| t.hits);
        if hits.is_some_and(|h| h >= 20) {
            break;
        }
        assert!(Instant::now() < deadline, "no hits on {event}:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    demo.ok(&[
        "write",
        "-p",
        pid,
        "--append",
        &path,
        &format!("{trigger}:pause"),
    ]);
    let text = demo.ok(&["cat", "-p", pid, &format!("events/{event}/hist")]);
    assert!(text.contains("[paused]"), "{text}");
    let file = parse::parse(&text).unwrap();
    // The reader understands ustrace's hist file to the byte.
    assert_eq!(file.to_string(), text);
    file
}

#[test]
fn the_hist_of_a_running_process_is_drawn() {
    let demo = Demo::start();
    let pid = demo.child.id().to_string();
    let p = pid.as_str();

    // A latency distribution: every hit lands in one bucket row.
    let file = paused_hist(&demo, p, "kv/get", "hist:keys=latency_ns.log2");
    let hits = file.sections[0].totals.as_ref().unwrap().hits.unwrap();
    let chart = demo.ok(&["hist", "-p", p, "kv:get"]);
    assert!(
        chart.starts_with("kv:get  hist:keys=latency_ns.log2:vals=hitcount"),
        "{chart}"
    );
    let rows: Vec<(String, u64)> = chart
        .lines()
        .skip_while(|l| !l.starts_with("latency_ns.log2"))
        .skip(1)
        .take_while(|l| !l.starts_with("Hits:"))
        .filter(|l| !l.starts_with('⋮'))
        .map(|l| {
            let mut w = l.split_whitespace();
            (
                w.next().unwrap().to_owned(),
                w.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert!(!rows.is_empty(), "{chart}");
    assert_eq!(rows.iter().map(|r| r.1).sum::<u64>(), hits, "{chart}");
    assert!(chart.contains(&format!("Hits: {hits}  ")), "{chart}");
    // The rows are the buckets in order, each one the next power of two.
    let upper = |label: &str| -> u64 { label.rsplit('-').next().unwrap().parse().unwrap() };
    for pair in rows.windows(2) {
        assert!(upper(&pair[1].0) > upper(&pair[0].0), "{chart}");
    }

    // A flame graph of the stacks that reach kv:put.
    let file = paused_hist(&demo, p, "kv/put", "hist:keys=common_stacktrace");
    let hits = file.sections[0].totals.as_ref().unwrap().hits.unwrap();
    let dir = demo.dir.clone();
    let (svg, folded) = (dir.join("put.svg"), dir.join("put.folded"));
    let chart = demo.ok(&[
        "hist",
        "-p",
        p,
        "--svg",
        svg.to_str().unwrap(),
        "--folded",
        folded.to_str().unwrap(),
        "kv/put",
    ]);
    assert!(chart.contains("common_stacktrace"), "{chart}");
    let folded = std::fs::read_to_string(&folded).unwrap();
    let weight: u64 = folded
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(weight, hits, "{folded}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains(&format!("all ({hits} hitcount")));

    // And an event without a hist trigger says so.
    let out = demo.run(&["hist", "-p", p, "kv:delete"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no hist trigger"), "{err}");
}

// ---- property tests ----

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_./-]{0,20}".prop_filter("no trailing separator", |s| !s.ends_with(' '))
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Num,
    Hex,
    Log2,
    Bucket(u64),
    Sym,
    SymOffset,
    Exec,
    Syscall,
    Str,
    Stack(bool),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Num),
        Just(Kind::Hex),
        Just(Kind::Log2),
        (1u64..1000).prop_map(Kind::Bucket),
        Just(Kind::Sym),
        Just(Kind::SymOffset),
        Just(Kind::Exec),
        Just(Kind::Syscall),
        Just(Kind::Str),
        any::<bool>().prop_map(Kind::Stack),
    ]
}

fn spec(i: usize, k: Kind) -> (String, String) {
    // (name as printed in an entry, as declared in the trigger)
    let n = format!("k{i}");
    match k {
        Kind::Num | Kind::Str => (n.clone(), n),
        Kind::Hex => (n.clone(), format!("{n}.hex")),
        Kind::Log2 => (n.clone(), format!("{n}.log2")),
        Kind::Bucket(b) => (n.clone(), format!("{n}.buckets={b}")),
        Kind::Sym => (n.clone(), format!("{n}.sym")),
        Kind::SymOffset => (n.clone(), format!("{n}.sym-offset")),
        Kind::Exec => (n.clone(), format!("{n}.execname")),
        Kind::Syscall => (n.clone(), format!("{n}.syscall")),
        Kind::Stack(true) => ("common_stacktrace".into(), "common_stacktrace".into()),
        Kind::Stack(false) => (format!("{n}.stacktrace"), format!("{n}.stacktrace")),
    }
}

fn key_value(k: Kind) -> BoxedStrategy<KeyValue> {
    match k {
        Kind::Num => any::<u64>().prop_map(KeyValue::Num).boxed(),
        Kind::Hex => any::<u64>().prop_map(KeyValue::Hex).boxed(),
        Kind::Log2 => (0u32..64).prop_map(KeyValue::Log2).boxed(),
        Kind::Bucket(b) => (0u64..1_000_000)
            .prop_map(move |i| KeyValue::Bucket {
                lo: i * b,
                hi: i * b + b - 1,
            })
            .boxed(),
        Kind::Sym | Kind::SymOffset => {
            let offset = matches!(k, Kind::SymOffset);
            (
                any::<u64>(),
                "[a-z_][a-z0-9_]{0,30}",
                "(\\+0x[0-9a-f]{1,4}/0x[0-9a-f]{1,4})?",
                "( \\[[a-z0-9_]{1,8}\\])?",
            )
                .prop_map(move |(addr, f, off, module)| KeyValue::Sym {
                    addr,
                    name: format!("{f}{off}{module}"),
                    offset,
                })
                .boxed()
        }
        Kind::Exec => ("[a-z]([a-z0-9 ._-]{0,13}[a-z0-9])?", any::<u32>())
            .prop_map(|(comm, pid)| KeyValue::Execname {
                comm,
                pid: u64::from(pid),
            })
            .boxed(),
        Kind::Syscall => ("sys_[a-z_]{1,20}", 0u64..1000)
            .prop_map(|(name, nr)| KeyValue::Syscall { name, nr })
            .boxed(),
        Kind::Str => name()
            .prop_filter("not a number", |s| !s.bytes().all(|b| b.is_ascii_digit()))
            .prop_map(KeyValue::Str)
            .boxed(),
        Kind::Stack(_) => prop::collection::vec(
            "[a-z_]{1,20}\\+0x[0-9a-f]{1,4}/0x[0-9a-f]{1,4}( \\[[a-z]{1,6}\\])?",
            1..6,
        )
        .prop_map(KeyValue::Stack)
        .boxed(),
    }
}

#[derive(Debug, Clone, Copy)]
enum VKind {
    Num,
    Hex,
    Percent,
    Graph,
}

fn val(k: VKind) -> BoxedStrategy<Val> {
    match k {
        VKind::Num => any::<u64>().prop_map(Val::Num).boxed(),
        VKind::Hex => any::<u64>().prop_map(Val::Hex).boxed(),
        VKind::Percent => {
            prop_oneof![(0u32..=10000).prop_map(Val::Percent), Just(Val::Error)].boxed()
        }
        VKind::Graph => (0u32..=20).prop_map(Val::Graph).boxed(),
    }
}

fn section() -> impl Strategy<Value = Section> {
    let schema = (
        prop::collection::vec(kind(), 1..4).prop_filter("one stack at most", |ks| {
            ks.iter().filter(|k| matches!(k, Kind::Stack(_))).count() <= 1
        }),
        prop::collection::vec(
            prop_oneof![
                Just(VKind::Num),
                Just(VKind::Hex),
                Just(VKind::Percent),
                Just(VKind::Graph)
            ],
            0..3,
        ),
    );
    schema.prop_flat_map(|(kinds, vkinds)| {
        let specs: Vec<(String, String)> =
            kinds.iter().enumerate().map(|(i, k)| spec(i, *k)).collect();
        let vnames: Vec<String> = (0..vkinds.len()).map(|i| format!("v{i}")).collect();
        let vspecs: Vec<String> = vkinds
            .iter()
            .zip(&vnames)
            .map(|(k, n)| match k {
                VKind::Num => n.clone(),
                VKind::Hex => format!("{n}.hex"),
                VKind::Percent => format!("{n}.percent"),
                VKind::Graph => format!("{n}.graph"),
            })
            .collect();
        let trigger = format!(
            "hist:keys={}:vals={}:sort=hitcount:size=2048 [active]",
            specs
                .iter()
                .map(|s| s.1.clone())
                .collect::<Vec<_>>()
                .join(","),
            std::iter::once("hitcount".to_owned())
                .chain(vspecs)
                .collect::<Vec<_>>()
                .join(",")
        );
        let key_names: Vec<String> = specs.iter().map(|s| s.0.clone()).collect();
        let entry = (
            kinds.iter().map(|k| key_value(*k)).collect::<Vec<_>>(),
            any::<u64>(),
            vkinds.iter().map(|k| val(*k)).collect::<Vec<_>>(),
            prop::collection::vec("\t[a-z]{1,8}: +[0-9]{1,6}", 0..2),
        )
            .prop_map(move |(keys, hits, vals, extra)| Entry {
                keys: keys
                    .into_iter()
                    .zip(&key_names)
                    .map(|(value, name)| KeyField {
                        name: name.clone(),
                        value,
                    })
                    .collect(),
                vals: std::iter::once(ValField {
                    name: "hitcount".into(),
                    value: Val::Num(hits),
                })
                .chain(vals.into_iter().zip(&vnames).map(|(value, n)| ValField {
                    name: n.clone(),
                    value,
                }))
                .collect(),
                extra,
                trailing: None,
            });
        (
            prop::collection::vec(entry, 0..6),
            prop::option::of((any::<u64>(), any::<u64>(), any::<u64>())),
            prop::collection::vec("[A-Z][a-z ]{0,20}[a-z]", 0..2),
        )
            .prop_map(move |(entries, totals, other)| Section {
                trigger: Some(trigger.clone()),
                entries,
                totals: totals.map(|(h, e, d)| Totals {
                    hits: Some(h),
                    entries: Some(e),
                    dropped: Some(d),
                    other: Vec::new(),
                }),
                other,
            })
    })
}

fn line_soup() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("# event histogram".to_owned()),
        Just("# trigger info: hist:keys=a.log2,b.buckets=0,c.sym:vals=hitcount".to_owned()),
        Just("{ common_stacktrace:".to_owned()),
        Just("{ a: ~ 2^".to_owned()),
        Just("} hitcount: ".to_owned()),
        Just("Totals:".to_owned()),
        Just("    Hits: 1".to_owned()),
        Just("{ b: ~ 5-3, c: [zz] f }  x (%): 1.2345 y: ####".to_owned()),
        "\\PC{0,40}",
    ];
    prop::collection::vec(piece, 0..20).prop_map(|v| v.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// What the kernel prints, the parser reads back exactly, and prints byte for byte.
    #[test]
    fn kernel_layout_round_trips(sections in prop::collection::vec(section(), 1..4)) {
        let file = HistFile { sections };
        let text = file.to_string();
        let back = parse::parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&back, &file, "{}", text);
        prop_assert_eq!(back.to_string(), text);
    }

    /// Any text: an answer or an error, never a panic; and the pictures of whatever was
    /// read draw without panicking either.
    #[test]
    fn any_text_parses_or_fails_cleanly(text in prop_oneof!["\\PC*", line_soup()]) {
        if let Ok(file) = parse::parse(&text) {
            for s in &file.sections {
                let opts = chart::Options { width: 40, value: None, merge: false };
                let _ = chart::draw(s, &opts);
                let stacks = flame::folded(s, "hitcount");
                let _ = flame::svg(&stacks, "t", "hitcount");
            }
            let again = parse::parse(&file.to_string());
            prop_assert!(again.is_ok(), "{:?}", again);
        }
    }
}
