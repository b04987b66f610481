//! The definition corpus (`tests/corpus/definitions.txt`): every line is
//! parsed with an environment that knows this binary's debug info, two
//! tracepoints and one source event, and must give the stated outcome. The
//! corpus must name every error id the language can produce.

use std::hint::black_box;

use ustrace_probe::*;

#[repr(C)]
pub struct Node {
    pub x: u32,
    pub name: *const u8,
    pub label: [u8; 16],
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn corpus_target(node: *const Node, n: u64, tag: *const u8) -> i32 {
    black_box((node, tag));
    n as i32
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn corpus_void(node: *const Node) {
    black_box(node);
}

struct CorpusEnv(InspectEnv);

impl ProbeEnv for CorpusEnv {
    fn function_info(&self, name: &str) -> Option<ustrace_inspect::debuginfo::FunctionInfo> {
        match name {
            "corpus_target" | "corpus_void" => self.0.function_info(name),
            _ => None,
        }
    }
    fn has_tracepoint(&self, name: &str) -> bool {
        matches!(name, "sched_switch" | "9p_fid")
    }
    fn event_fields(&self, system: &str, event: &str) -> Option<Vec<FieldSpec>> {
        let f = |name: &str, offset, size, signed, kind| FieldSpec {
            name: name.to_owned(),
            c_type: String::new(),
            offset,
            size,
            signed,
            kind,
        };
        (system == "sched" && event == "sched_switch").then(|| {
            vec![
                f("prev_pid", 8, 4, true, FieldKind::Int),
                f("prev_comm", 12, 16, false, FieldKind::CharArray),
                f("msg", 28, 4, false, FieldKind::DynString),
            ]
        })
    }
    fn resolve_symbol(&self, name: &str) -> Option<u64> {
        self.0.resolve_symbol(name)
    }
}

/// Ids that only registration or the caller can raise (the probe point
/// cannot be attached, an event exists, ...), or that the 6.x kernel keeps
/// in its table without using: the corpus cannot reach them by parsing.
const NOT_FROM_PARSING: &[&str] = &[
    "BAD_REFCNT",
    "REFCNT_OPEN_BRACE",
    "BAD_REFCNT_SUFFIX",
    "NON_UNIQ_SYMBOL",
    "BAD_RETPROBE",
    "EVENT_EXIST",
    "BAD_INSN_BNDRY",
    "FAIL_REG_PROBE",
    "DIFF_PROBE_TYPE",
    "DIFF_ARG_TYPE",
    "SAME_PROBE",
    "BAD_ATTACH_ARG",
    "BAD_BTF_TID",
];

#[test]
fn corpus() {
    black_box(corpus_target(std::ptr::null(), 0, std::ptr::null()));
    corpus_void(std::ptr::null());
    let inspect = InspectEnv::new();
    if inspect.function_info("corpus_target").is_none() {
        eprintln!("skipped: no DWARF for this test binary (built without debug info?)");
        return;
    }
    let env = CorpusEnv(inspect);
    let text = include_str!("corpus/definitions.txt");
    let mut seen = std::collections::HashSet::new();
    let mut failures = Vec::new();
    let mut n = 0;
    for raw in text.lines() {
        let line = raw.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        n += 1;
        let (verdict, rest) = line.split_once(' ').expect("verdict");
        let got = parse_command(rest.trim_start(), &env);
        match verdict {
            "OK" => {
                let def = rest.trim_start();
                match got {
                    Ok(DynCommand::Create(d)) => {
                        // The read-back text is itself a definition of the same event.
                        let again = parse_command(&d.canonical(), &env);
                        match again {
                            Ok(DynCommand::Create(d2)) if d2.canonical() == d.canonical() => {}
                            other => failures.push(format!("{def}: canonical re-parse {other:?}")),
                        }
                    }
                    other => failures.push(format!("{def}: expected OK, got {other:?}")),
                }
            }
            "ERR" => {
                let mut parts = rest.trim_start().splitn(3, ' ');
                let id = parts.next().unwrap();
                let caret: usize = parts.next().unwrap().parse().expect("caret");
                let def = parts.next().unwrap();
                seen.insert(id.to_owned());
                let want = ErrorId::from_name(id).unwrap_or_else(|| panic!("unknown id {id}"));
                match parse_command(def, &env) {
                    Err(e) if e.id == Some(want) && e.caret() == caret => {
                        assert!(e.log_text().contains(want.message()));
                    }
                    Err(e) => failures.push(format!(
                        "{def}: expected {id}@{caret}, got {:?}@{} ({})",
                        e.id,
                        e.caret(),
                        e.log_text()
                    )),
                    Ok(c) => failures.push(format!("{def}: expected {id}, accepted {c:?}")),
                }
            }
            v => panic!("bad verdict {v}"),
        }
    }
    let missing: Vec<&str> = ErrorId::ALL
        .iter()
        .map(|i| i.name())
        .filter(|n| !seen.contains(*n) && !NOT_FROM_PARSING.contains(n))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {n} corpus lines failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        missing.is_empty(),
        "error ids with no corpus line: {missing:?}"
    );
}
