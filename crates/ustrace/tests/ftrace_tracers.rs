//! The `function` and `function_graph` tracers on a C program: a shared library built here
//! with `cc` and loaded into the test process, whose call structure is known
//! (`tests/fixtures/calltree.c`). The call trees, nesting, durations and filters are checked
//! against that structure, and the graph against `uftrace replay` of the same program.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use ustrace::{Errno, FileSystem};

type Func = extern "C" fn(i64) -> i64;

struct Lib {
    top: Func,
    slow: Func,
    rec: Func,
    jump: Func,
    fork: Func,
    dir: PathBuf,
}

/// Builds and loads the fixture once; `None` (the test prints `skipped:`) without `cc`.
fn lib() -> Option<&'static Lib> {
    static LIB: OnceLock<Option<Lib>> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ustrace-fntrace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/calltree.c");
        let so = dir.join("libcalltree.so");
        // No compiler: skip. A compiler that refuses the fixture: a broken test, not a skip.
        let out = Command::new("cc")
            .args([
                "-O1",
                "-fno-inline",
                "-fno-omit-frame-pointer",
                "-shared",
                "-fPIC",
                "-o",
            ])
            .arg(&so)
            .arg(&src)
            .output()
            .ok()?;
        assert!(
            out.status.success(),
            "cc calltree.c: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = std::ffi::CString::new(so.to_str()?).ok()?;
        // SAFETY: loading a library we just built; its constructors are the C runtime's.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        if handle.is_null() {
            return None;
        }
        let sym = |name: &str| -> Option<Func> {
            let c = std::ffi::CString::new(name).ok()?;
            // SAFETY: `handle` is a live library handle and `c` a NUL-terminated name.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            // SAFETY: the fixture defines these as `long f(long)`.
            (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, Func>(p) })
        };
        Some(Lib {
            top: sym("ct_top")?,
            slow: sym("ct_slow")?,
            rec: sym("ct_rec")?,
            jump: sym("ct_jump")?,
            fork: sym("ct_fork")?,
            dir,
        })
    })
    .as_ref()
}

/// Tests that switch tracers run one at a time: patching is process-wide.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn instance(name: &str) -> String {
    let fs = ustrace::tracefs();
    let _ = fs.write_file(&format!("instances/{name}/current_tracer"), "nop");
    let _ = fs.rmdir(&format!("instances/{name}"));
    fs.mkdir(&format!("instances/{name}")).unwrap();
    format!("instances/{name}")
}

/// Builds the fixture, takes the serial lock and makes instance `name` (its path the third
/// value); `None` after printing `skipped:` without `cc`.
fn fixture(name: &str) -> Option<(&'static Lib, std::sync::MutexGuard<'static, ()>, String)> {
    let Some(lib) = lib() else {
        println!("skipped: cc could not build the fixture");
        return None;
    };
    let serial = serial();
    Some((lib, serial, instance(name)))
}

/// Writes `text` to the instance's `file`.
fn set(dir: &str, file: &str, text: &str) {
    ustrace::tracefs()
        .write_file(&format!("{dir}/{file}"), text)
        .unwrap_or_else(|e| panic!("{dir}/{file} <- {text:?}: {e:?}"));
}

/// The instance's `file`.
fn get(dir: &str, file: &str) -> String {
    ustrace::tracefs()
        .read_to_string(&format!("{dir}/{file}"))
        .unwrap_or_else(|e| panic!("{dir}/{file}: {e:?}"))
}

fn body(trace: &str) -> Vec<String> {
    trace
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The graph lines without the CPU and duration columns: `name() {`, `name();`, `}`.
fn shape(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.split_once('|').map(|(_, rest)| rest[2..].to_string()))
        .collect()
}

const EXPECTED_TOP: &[&str] = &[
    "ct_top() {",
    "  ct_mid() {",
    "    ct_leaf();",
    "    ct_other_leaf();",
    "  }",
    "  ct_leaf();",
    "  ct_rec() {",
    "    ct_rec() {",
    "      ct_rec() {",
    "        ct_leaf();",
    "      }",
    "    }",
    "  }",
    "}",
];

#[test]
fn function_graph_draws_the_known_call_tree() {
    let Some((lib, _serial, dir)) = fixture("fn_graph_tree") else {
        return;
    };
    let fs = ustrace::tracefs();
    set(&dir, "set_ftrace_filter", "ct_*:mod:libcalltree\n");
    assert_eq!(
        get(&dir, "available_tracers"),
        "function_graph function nop\n"
    );
    set(&dir, "current_tracer", "function_graph");
    assert_eq!(get(&dir, "current_tracer"), "function_graph\n");
    let r = std::thread::spawn(move || (lib.top)(3)).join().unwrap();
    assert_eq!(r, 43);
    let trace = get(&dir, "trace");
    set(&dir, "current_tracer", "nop");
    assert!(
        trace.starts_with(
            "# tracer: function_graph\n#\n# CPU  DURATION                  FUNCTION CALLS\n\
             # |     |   |                     |   |   |   |\n"
        ),
        "{trace}"
    );
    let lines = body(&trace);
    assert_eq!(shape(&lines), EXPECTED_TOP, "{trace}");
    // Every line: ` N) ` then a duration column or blanks, then `|  `.
    for l in &lines {
        let (cpu, rest) = l.split_once(") ").expect("cpu column");
        assert!(cpu.trim().parse::<usize>().is_ok(), "{l}");
        assert!(rest.len() > 15 && &rest[14..17] == "|  ", "{l:?}");
        if l.ends_with("{") {
            assert_eq!(&rest[..14], "              ", "{l}");
        } else {
            assert!(rest[..14].trim().ends_with("us"), "{l}");
        }
    }
    fs.rmdir(&dir).unwrap();
}

/// Graph tracers of several instances at once each keep their own per-thread depth (each
/// runs in its own slot, whose number its handlers are built with): every instance draws
/// the same tree, none nested inside another's calls.
#[test]
fn graph_tracers_of_several_instances_keep_their_own_depths() {
    let Some(lib) = lib() else {
        println!("skipped: cc could not build the fixture");
        return;
    };
    let _g = serial();
    let fs = ustrace::tracefs();
    let dirs: Vec<String> = (0..3)
        .map(|i| instance(&format!("fn_graph_many{i}")))
        .collect();
    for dir in &dirs {
        set(dir, "set_ftrace_filter", "ct_*:mod:libcalltree\n");
        set(dir, "current_tracer", "function_graph");
    }
    let r = std::thread::spawn(move || (lib.top)(3)).join().unwrap();
    assert_eq!(r, 43);
    let traces: Vec<String> = dirs.iter().map(|dir| get(dir, "trace")).collect();
    for dir in &dirs {
        set(dir, "current_tracer", "nop");
    }
    for trace in &traces {
        assert_eq!(shape(&body(trace)), EXPECTED_TOP, "{trace}");
    }
    for dir in &dirs {
        fs.rmdir(dir).unwrap();
    }
}

/// Durations in microseconds of each line that has one, with its nesting.
fn durations(lines: &[String]) -> Vec<(usize, f64, String)> {
    lines
        .iter()
        .filter_map(|l| {
            let (_, rest) = l.split_once(") ")?;
            let col = rest
                .get(..14)?
                .trim()
                .trim_start_matches(['+', '!', '#', '*', '@', '$']);
            let us: f64 = col.trim().strip_suffix("us")?.trim().parse().ok()?;
            let text = &rest[17..];
            let depth = (text.len() - text.trim_start().len()) / 2;
            Some((depth, us, text.trim().to_string()))
        })
        .collect()
}

#[test]
fn durations_nest_and_marks_follow_the_kernel_thresholds() {
    let Some((lib, _serial, dir)) = fixture("fn_graph_durations") else {
        return;
    };
    let fs = ustrace::tracefs();
    set(
        &dir,
        "set_ftrace_filter",
        "ct_slow ct_top ct_mid ct_leaf ct_other_leaf ct_rec\n",
    );
    set(&dir, "current_tracer", "function_graph");
    (lib.top)(1);
    (lib.slow)(20_000);
    let trace = get(&dir, "trace");
    set(&dir, "current_tracer", "nop");
    let lines = body(&trace);
    let d = durations(&lines);
    // A parent's time covers its children's.
    let top = d
        .iter()
        .find(|(depth, _, t)| *depth == 0 && t == "}")
        .expect("ct_top closes");
    let children: f64 = d
        .iter()
        .take_while(|x| !(x.0 == 0 && x.2 == "}"))
        .filter(|(depth, _, _)| *depth == 1)
        .map(|x| x.1)
        .sum();
    assert!(top.1 >= children, "{trace}");
    // usleep(20 ms) is a leaf of more than 10 ms: the `*` mark.
    let slow = lines
        .iter()
        .find(|l| l.contains("ct_slow();"))
        .expect("ct_slow leaf");
    assert!(slow.contains(") * ") || slow.contains(") @ "), "{slow}");
    fs.rmdir(&dir).unwrap();
}

#[test]
fn function_tracer_lines_name_the_caller() {
    let Some((lib, _serial, dir)) = fixture("fn_function") else {
        return;
    };
    let fs = ustrace::tracefs();
    set(&dir, "set_ftrace_filter", "ct_*:mod:libcalltree\n");
    set(&dir, "set_ftrace_notrace", "ct_other_leaf\n");
    set(&dir, "current_tracer", "function");
    (lib.top)(3);
    let trace = get(&dir, "trace");
    set(&dir, "current_tracer", "nop");
    assert!(trace.starts_with("# tracer: function\n#\n"), "{trace}");
    let funcs: Vec<&str> = body(&trace)
        .iter()
        .map(|l| l.split_once(": ").expect("context").1)
        .map(|t| t.split(" <-").next().unwrap())
        .map(|s| Box::leak(s.to_string().into_boxed_str()) as &str)
        .collect();
    assert_eq!(
        funcs,
        ["ct_top", "ct_mid", "ct_leaf", "ct_leaf", "ct_rec", "ct_rec", "ct_rec", "ct_leaf"],
        "{trace}"
    );
    let lines = body(&trace);
    assert!(lines[1].ends_with("ct_mid <-ct_top"), "{}", lines[1]);
    assert!(lines[6].ends_with("ct_rec <-ct_rec"), "{}", lines[6]);
    fs.rmdir(&dir).unwrap();
}

/// `func_stack_trace` adds a stack after each `function` record, and only while it is on
/// (the handler learns it from the same word as its other settings).
#[test]
fn func_stack_trace_follows_its_option_while_the_tracer_runs() {
    let Some((lib, _serial, dir)) = fixture("fn_stack") else {
        return;
    };
    let fs = ustrace::tracefs();
    set(&dir, "set_ftrace_filter", "ct_mid\n");
    set(&dir, "current_tracer", "function");
    (lib.top)(1);
    set(&dir, "options/func_stack_trace", "1");
    (lib.top)(1);
    set(&dir, "options/func_stack_trace", "0");
    (lib.top)(1);
    let trace = get(&dir, "trace");
    set(&dir, "current_tracer", "nop");
    let lines = body(&trace);
    let calls: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].ends_with("ct_mid <-ct_top"))
        .collect();
    assert_eq!(calls.len(), 3, "{trace}");
    let stack_after = |i: usize| {
        lines
            .get(i + 1)
            .is_some_and(|l| l.contains("<stack trace>"))
    };
    assert!(!stack_after(calls[0]), "{trace}");
    assert!(stack_after(calls[1]), "{trace}");
    assert!(!stack_after(calls[2]), "{trace}");
    assert!(
        lines[calls[1] + 1..calls[2]]
            .iter()
            .any(|l| l.starts_with(" => ct_top")),
        "{trace}"
    );
    fs.rmdir(&dir).unwrap();
}

#[test]
fn pid_filters_select_exactly_the_threads_they_name() {
    let Some((lib, _serial, dir)) = fixture("fn_pids") else {
        return;
    };
    let fs = ustrace::tracefs();
    assert_eq!(get(&dir, "set_ftrace_pid"), "no pid\n");
    set(&dir, "set_ftrace_filter", "ct_rec\n");
    set(&dir, "current_tracer", "function");
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        go_rx.recv().unwrap();
        (lib.rec)(4);
    });
    let tid = rx.recv().unwrap();
    fs.write_file(&format!("{dir}/set_ftrace_pid"), &format!("{tid}\n"))
        .unwrap();
    assert_eq!(get(&dir, "set_ftrace_pid"), format!("{tid}\n"));
    (lib.rec)(2); // this thread: not listed
    go_tx.send(()).unwrap();
    worker.join().unwrap();
    let trace = get(&dir, "trace");
    let lines = body(&trace);
    assert_eq!(lines.len(), 5, "{trace}");
    assert!(
        lines.iter().all(|l| l.contains(&format!("-{tid} "))),
        "{trace}"
    );
    // The notrace list keeps a thread out.
    set(&dir, "set_ftrace_pid", "");
    set(&dir, "trace", "");
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    fs.write_file(&format!("{dir}/set_ftrace_notrace_pid"), &format!("{me}\n"))
        .unwrap();
    (lib.rec)(2);
    std::thread::spawn(move || (lib.rec)(1)).join().unwrap();
    let lines = body(&get(&dir, "trace"));
    set(&dir, "current_tracer", "nop");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|l| !l.contains(&format!("-{me} "))));
    assert_eq!(
        fs.write_file(&format!("{dir}/set_ftrace_pid"), "abc\n"),
        Err(Errno::EINVAL)
    );
    fs.rmdir(&dir).unwrap();
}

#[test]
fn graph_function_depth_and_threshold_select_what_they_name() {
    let Some((lib, _serial, dir)) = fixture("fn_graph_sel") else {
        return;
    };
    let fs = ustrace::tracefs();
    set(&dir, "set_ftrace_filter", "ct_*:mod:libcalltree\n");
    set(&dir, "current_tracer", "function_graph");
    // set_graph_function: ct_mid and what it calls only.
    fs.write_file("set_graph_function", "ct_mid\n").unwrap();
    (lib.top)(3);
    let trace = get(&dir, "trace");
    assert_eq!(
        shape(&body(&trace)),
        ["ct_mid() {", "  ct_leaf();", "  ct_other_leaf();", "}"],
        "{trace}"
    );
    fs.write_file("set_graph_function", "").unwrap();
    // set_graph_notrace: ct_rec and its callees vanish.
    fs.write_file("set_graph_notrace", "ct_rec\n").unwrap();
    set(&dir, "trace", "");
    (lib.top)(3);
    let shown = shape(&body(&get(&dir, "trace")));
    assert_eq!(
        shown,
        [
            "ct_top() {",
            "  ct_mid() {",
            "    ct_leaf();",
            "    ct_other_leaf();",
            "  }",
            "  ct_leaf();",
            "}"
        ]
    );
    fs.write_file("set_graph_notrace", "").unwrap();
    // max_graph_depth 1: the outermost calls only.
    fs.write_file("max_graph_depth", "1").unwrap();
    set(&dir, "trace", "");
    (lib.top)(3);
    let shown = shape(&body(&get(&dir, "trace")));
    fs.write_file("max_graph_depth", "0").unwrap();
    assert_eq!(shown, ["ct_top();"]);
    // tracing_thresh: only calls longer than it, as `}` lines naming the function.
    fs.write_file("tracing_thresh", "5000").unwrap();
    set(&dir, "trace", "");
    (lib.top)(3);
    (lib.slow)(10_000);
    let lines = body(&get(&dir, "trace"));
    fs.write_file("tracing_thresh", "0").unwrap();
    set(&dir, "current_tracer", "nop");
    assert_eq!(shape(&lines), ["} /* ct_slow */"], "{lines:?}");
    fs.rmdir(&dir).unwrap();
}

#[test]
fn graph_matches_uftrace_replay_of_the_same_program() {
    let Some(lib) = lib() else {
        println!("skipped: cc could not build the fixture");
        return;
    };
    if Command::new("uftrace").arg("--version").output().is_err() {
        println!("skipped: uftrace is not installed");
        return;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/calltree.c");
    let exe = lib.dir.join("calltree-pg");
    let built = Command::new("cc")
        .args(["-O1", "-fno-inline", "-pg", "-DCT_MAIN", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    assert!(built, "cc -pg");
    let data = lib.dir.join("uftrace.data");
    let rec = Command::new("uftrace")
        .args(["record", "--no-libcall", "-d"])
        .arg(&data)
        .arg(&exe)
        .status()
        .expect("uftrace record");
    assert!(rec.code().is_some());
    let out = Command::new("uftrace")
        .args(["replay", "--no-pager", "-f", "none", "-d"])
        .arg(&data)
        .output()
        .expect("uftrace replay");
    let replay = String::from_utf8_lossy(&out.stdout);
    // uftrace: `  ct_top() {` with two spaces per level under main(); keep ct_* lines.
    let theirs: Vec<String> = replay
        .lines()
        .filter(|l| l.contains("ct_") || l.trim() == "}")
        .map(|l| l.trim_end().to_string())
        .collect();
    let start = theirs
        .iter()
        .position(|l| l.contains("ct_top"))
        .expect("ct_top in replay");
    let indent = theirs[start].len() - theirs[start].trim_start().len();
    let theirs: Vec<String> = theirs[start..]
        .iter()
        .map(|l| l.get(indent..).unwrap_or("").trim_end().to_string())
        .take(EXPECTED_TOP.len())
        .collect();

    let _g = serial();
    let fs = ustrace::tracefs();
    let dir = instance("fn_uftrace");
    set(&dir, "set_ftrace_filter", "ct_*:mod:libcalltree\n");
    set(&dir, "current_tracer", "function_graph");
    (lib.top)(3);
    let ours = shape(&body(&get(&dir, "trace")));
    set(&dir, "current_tracer", "nop");
    fs.rmdir(&dir).unwrap();
    // uftrace closes leaves with `;` too and puts `}` alone: the same tree, the same order.
    let normalise = |v: &[String]| -> Vec<String> {
        v.iter()
            .map(|l| l.split(" /*").next().unwrap().trim_end().to_string())
            .collect()
    };
    assert_eq!(normalise(&ours), normalise(&theirs), "replay:\n{replay}");
}

#[test]
fn every_function_of_the_process_can_be_traced_while_threads_run() {
    let Some((lib, _serial, dir)) = fixture("fn_all") else {
        return;
    };
    let fs = ustrace::tracefs();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += (lib.top)(i) as u64;
                    let v: Vec<u64> = (0..64).collect();
                    n += v.iter().sum::<u64>();
                    n += format!("{n}").len() as u64;
                }
                n
            })
        })
        .collect();
    let inst = ustrace::trace::tracing().instance("fn_all").unwrap();
    for kind in ["function", "function_graph"] {
        fs.write_file(&format!("{dir}/current_tracer"), kind)
            .unwrap();
        let patched = ustrace::ftrace::tracer::patched(&inst);
        println!("{kind}: {patched} functions patched");
        assert!(patched > 1000, "{kind}: only {patched} functions patched");
        std::thread::sleep(std::time::Duration::from_millis(200));
        (lib.top)(3);
        set(&dir, "current_tracer", "nop");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    fs.rmdir(&dir).unwrap();
}

#[test]
fn record_formats_are_the_running_kernels() {
    let fs = ustrace::tracefs();
    for event in ["function", "funcgraph_entry", "funcgraph_exit"] {
        let ours = fs
            .read_to_string(&format!("events/ftrace/{event}/format"))
            .unwrap();
        let path = format!("/sys/kernel/tracing/events/ftrace/{event}/format");
        match std::fs::read_to_string(&path) {
            Ok(kernel) => assert_eq!(ours, kernel, "{event}"),
            Err(e) => println!("skipped: {path}: {e}"),
        }
    }
}

#[test]
fn graph_survives_longjmp_tail_calls_and_fork() {
    let Some((lib, _serial, dir)) = fixture("fn_graph_jumps") else {
        return;
    };
    let fs = ustrace::tracefs();
    set(&dir, "set_ftrace_filter", "ct_*:mod:libcalltree\n");
    set(&dir, "current_tracer", "function_graph");
    // longjmp out of two traced frames, then a normal call: the depth is repaired.
    assert_eq!((lib.jump)(5), 5);
    (lib.top)(3);
    // fork: the child calls traced functions and exits; the parent goes on.
    assert_eq!((lib.fork)(2), 0);
    (lib.top)(3);
    let trace = get(&dir, "trace");
    set(&dir, "current_tracer", "nop");
    let shape = shape(&body(&trace));
    // Both ct_top calls after the jumps draw the same, complete tree at depth 0.
    let tops: Vec<usize> = shape
        .iter()
        .enumerate()
        .filter(|(_, l)| l.as_str() == "ct_top() {")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(tops.len(), 2, "{trace}");
    for &t in &tops {
        assert_eq!(&shape[t..t + EXPECTED_TOP.len()], EXPECTED_TOP, "{trace}");
    }
    // The longjmp: ct_jump's `}` closes at depth 0 although the frames it jumped over
    // never returned.
    let jump = shape
        .iter()
        .position(|l| l == "ct_jump() {")
        .expect("ct_jump");
    let close = shape[jump..]
        .iter()
        .position(|l| l == "}")
        .expect("ct_jump closes")
        + jump;
    assert!(close < tops[0], "{trace}");
    // The tail call: ct_tail jumps to ct_leaf, whose return ends both.
    assert!(
        shape.iter().any(|l| l.trim_start() == "ct_tail() {"),
        "{trace}"
    );
    fs.rmdir(&dir).unwrap();
}

#[test]
fn trace_pipe_prints_the_graph_record_by_record() {
    let Some((lib, _serial, dir)) = fixture("fn_graph_pipe") else {
        return;
    };
    let fs = ustrace::tracefs();
    set(&dir, "set_ftrace_filter", "ct_mid ct_leaf ct_other_leaf\n");
    set(&dir, "current_tracer", "function_graph");
    (lib.top)(3);
    let lines: Vec<String> = fs
        .read_lines(
            &format!("{dir}/trace_pipe"),
            Some(std::time::Duration::from_millis(200)),
        )
        .unwrap()
        .map(|l| l.unwrap())
        .collect();
    set(&dir, "current_tracer", "nop");
    let shown: Vec<String> = lines
        .iter()
        .filter_map(|l| l.split_once('|').map(|(_, r)| r[2..].to_string()))
        .collect();
    assert_eq!(
        shown,
        [
            "ct_mid() {",
            "  ct_leaf() {",
            "  }",
            "  ct_other_leaf() {",
            "  }",
            "}",
            "ct_leaf() {",
            "}",
            // ct_rec's (not traced) base case.
            "ct_leaf() {",
            "}",
        ],
        "{lines:?}"
    );
    fs.rmdir(&dir).unwrap();
}

/// One clock read per instant, as the kernel's graph tracer has one per call and one per
/// return: a `funcgraph_exit`'s `calltime` is the time of its `funcgraph_entry` record, and
/// its `rettime` its own record's time, so durations and record times never disagree.
#[test]
fn graph_call_and_return_times_are_their_records_times() {
    let Some((lib, _serial, dir)) = fixture("fn_graph_times") else {
        return;
    };
    let fs = ustrace::tracefs();
    set(&dir, "set_ftrace_filter", "ct_*:mod:libcalltree\n");
    set(&dir, "current_tracer", "function_graph");
    (lib.top)(3);
    let inst = ustrace::trace::tracing()
        .instance("fn_graph_times")
        .expect("instance");
    let events: Vec<_> = inst.buffer().iter().collect();
    set(&dir, "current_tracer", "nop");
    let u64_at = |d: &[u8], at: usize| u64::from_ne_bytes(d[at..at + 8].try_into().unwrap());
    let u32_at = |d: &[u8], at: usize| u32::from_ne_bytes(d[at..at + 4].try_into().unwrap());
    let id = |d: &[u8]| u16::from_ne_bytes([d[0], d[1]]);
    // (tid, func, depth, time) of every funcgraph_entry (id 11).
    let entries: Vec<(u32, u64, u32, u64)> = events
        .iter()
        .filter(|e| id(&e.data) == 11)
        .map(|e| {
            (
                u32_at(&e.data, 4),
                u64_at(&e.data, 8),
                u32_at(&e.data, 16),
                e.ts,
            )
        })
        .collect();
    let mut exits = 0;
    for e in events.iter().filter(|e| id(&e.data) == 10) {
        let d = &e.data;
        let (tid, func, depth) = (u32_at(d, 4), u64_at(d, 8), u32_at(d, 16));
        let (calltime, rettime) = (u64_at(d, 24), u64_at(d, 32));
        assert_eq!(rettime, e.ts, "rettime is the exit record's time");
        assert!(
            entries.contains(&(tid, func, depth, calltime)),
            "calltime {calltime} of {func:#x} (depth {depth}) is no entry record's time: \
             {entries:?}"
        );
        exits += 1;
    }
    // ct_top(3): top, mid, leaf, other_leaf, leaf, rec x3, leaf.
    assert_eq!((entries.len(), exits), (9, 9), "{events:?}");
    fs.rmdir(&dir).unwrap();
}

#[test]
fn a_filter_on_functions_that_cannot_be_patched_still_switches() {
    let _g = serial();
    let fs = ustrace::tracefs();
    let dir = instance("fn_nothing");
    // The tracer's own functions: selected, never patched, listed with the reason.
    set(&dir, "set_ftrace_filter", "ustrace::ftrace::filter::*\n");
    set(&dir, "current_tracer", "function_graph");
    assert_eq!(get(&dir, "current_tracer"), "function_graph\n");
    let inst = ustrace::trace::tracing().instance("fn_nothing").unwrap();
    assert_eq!(ustrace::ftrace::tracer::patched(&inst), 0);
    assert!(!ustrace::ftrace::tracer::refused(&inst).is_empty());
    set(&dir, "current_tracer", "nop");
    // A function too short to patch: selected, refused, and listed with the reason even
    // when it is the only one (nothing at all could be patched).
    // SAFETY: the assembly below returns its argument, as the declaration says.
    assert_eq!(unsafe { ftrace_tiny_fn(std::hint::black_box(5)) }, 5);
    set(&dir, "set_ftrace_filter", "ftrace_tiny_fn\n");
    set(&dir, "current_tracer", "function");
    assert_eq!(ustrace::ftrace::tracer::patched(&inst), 0);
    let refused = ustrace::ftrace::tracer::refused(&inst);
    assert!(
        refused
            .iter()
            .any(|r| r.function == "ftrace_tiny_fn" && r.reason.contains("too short")),
        "{refused:?}"
    );
    assert!(
        get(&dir, "unpatchable_functions").contains("ftrace_tiny_fn"),
        "{}",
        get(&dir, "unpatchable_functions")
    );
    set(&dir, "current_tracer", "nop");
    fs.rmdir(&dir).unwrap();
}

// Three bytes: shorter than the five a patch needs.
std::arch::global_asm!(
    ".globl ftrace_tiny_fn",
    ".type ftrace_tiny_fn,@function",
    "ftrace_tiny_fn:",
    "mov eax, edi",
    "ret",
    ".size ftrace_tiny_fn, . - ftrace_tiny_fn",
);

extern "C" {
    fn ftrace_tiny_fn(x: u32) -> u32;
}
