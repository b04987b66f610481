//! Shared by the integration tests: the sys_enter field table, the corpus
//! loader and proptest strategies for filter text.
#![allow(dead_code)]

use proptest::prelude::*;
use ustrace_filter::Field;

/// `raw_syscalls/sys_enter` as its `format` file describes it.
pub const SYS_ENTER: [Field<'static>; 6] = [
    Field {
        name: "common_type",
        c_type: "unsigned short",
        offset: 0,
        size: 2,
        signed: false,
    },
    Field {
        name: "common_flags",
        c_type: "unsigned char",
        offset: 2,
        size: 1,
        signed: false,
    },
    Field {
        name: "common_preempt_count",
        c_type: "unsigned char",
        offset: 3,
        size: 1,
        signed: false,
    },
    Field {
        name: "common_pid",
        c_type: "int",
        offset: 4,
        size: 4,
        signed: true,
    },
    Field {
        name: "id",
        c_type: "long",
        offset: 8,
        size: 8,
        signed: true,
    },
    Field {
        name: "args",
        c_type: "unsigned long[6]",
        offset: 16,
        size: 48,
        signed: false,
    },
];

/// Undo the corpus escapes: `\t`, `\n`, `\\`, `\xNN`.
pub fn unescape(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some('x') => {
                let hex: String = chars.by_ref().take(2).collect();
                let b = u8::from_str_radix(&hex, 16).expect("corpus \\x escape");
                out.push(char::from(b));
            }
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Load a corpus file from tests/corpus.
pub fn corpus(name: &str) -> Vec<String> {
    let path = format!("{}/tests/corpus/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .lines()
        .filter(|l| !l.starts_with("## "))
        .map(unescape)
        .collect()
}

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("id".to_string()),
        2 => Just("common_pid".to_string()),
        1 => Just("common_type".to_string()),
        1 => Just("common_flags".to_string()),
        1 => Just("common_preempt_count".to_string()),
        1 => Just("args".to_string()),
        1 => Just("CPU".to_string()),
        1 => Just("comm".to_string()),
        1 => Just("COMM".to_string()),
        1 => "[a-z_]{1,6}",
    ]
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (0u64..300).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| format!("0x{n:x}")),
        (0u64..64).prop_map(|n| format!("0{n:o}")),
        "-?[0-9a-fx]{1,25}",
    ]
}

fn string_lit() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z*?\\[\\]!]{0,8}".prop_map(|s| format!("\"{s}\"")),
        "[a-z*]{0,8}".prop_map(|s| format!("'{s}'")),
        "[a-z]{1,6}",
    ]
}

fn op() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "==", "!=", "<", "<=", ">", ">=", "&", "~", "=", "!~", "=>",
    ])
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => number(),
        3 => string_lit(),
        1 => "CPUS\\{[0-3N,\\- ]{0,5}\\}",
        1 => "[a-z_]{1,8}",
    ]
}

/// One predicate, sometimes with a suffix or odd spacing.
pub fn predicate() -> impl Strategy<Value = String> {
    (
        field_name(),
        prop::sample::select(vec!["", "", "", "", ".function", ".ustring"]),
        prop::sample::select(vec!["", " ", "  "]),
        op(),
        prop::sample::select(vec!["", " "]),
        value(),
    )
        .prop_map(|(f, sfx, s1, op, s2, v)| format!("{f}{sfx}{s1}{op}{s2}{v}"))
}

/// A whole expression: predicates joined with `&&`/`||`, under `!` and parens.
pub fn expression() -> impl Strategy<Value = String> {
    let leaf = predicate().boxed();
    leaf.prop_recursive(4, 12, 3, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec![" && ", " || ", "&&", "||"]),
                inner.clone()
            )
                .prop_map(|(a, o, b)| format!("{a}{o}{b}")),
            inner.clone().prop_map(|a| format!("({a})")),
            inner.prop_map(|a| format!("!{a}")),
        ]
    })
}

/// An expression, sometimes damaged: a byte dropped, or a stray token added.
pub fn maybe_broken_expression() -> impl Strategy<Value = String> {
    (
        expression(),
        0usize..6,
        any::<prop::sample::Index>(),
        prop::sample::select(vec!["(", ")", "\"", "'", "&", "|", "!", " x", "{", "}"]),
    )
        .prop_map(|(e, mode, idx, tok)| {
            if e.is_empty() {
                return e;
            }
            let at = idx.index(e.len());
            if !e.is_char_boundary(at) {
                return e;
            }
            match mode {
                0 => {
                    let mut s = e.clone();
                    s.remove(at);
                    s
                }
                1 => {
                    let mut s = e.clone();
                    s.insert_str(at, tok);
                    s
                }
                _ => e,
            }
        })
}

/// A trigger write.
pub fn trigger_text() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["", "", "", "!"]),
        prop::sample::select(vec![
            "traceon",
            "traceoff",
            "stacktrace",
            "snapshot",
            "enable_event:sched:sched_switch",
            "disable_event:sched:sched_waking",
            "enable_event:sched",
            "enable_event:x:y",
            "bogus",
        ]),
        prop::sample::select(vec![
            "", ":", ":1", ":0", ":7:9", ":x", " 3", ":-1", ":0x1f",
        ]),
        prop_oneof![
            Just(String::new()),
            predicate().prop_map(|p| format!(" if {p}")),
            Just(" if".to_string()),
            Just(" junk".to_string())
        ],
    )
        .prop_map(|(bang, cmd, count, filter)| format!("{bang}{cmd}{count}{filter}"))
}

/// Corpus lines with a few random edits from an alphabet of the language's
/// special characters: reaches parser states the grammar above does not.
pub fn mutated(corpus: Vec<String>) -> impl Strategy<Value = String> {
    let alphabet: Vec<char> = "()!&|=<>~\"' {}*?[]-,.xX0189afidCPUS_\t".chars().collect();
    (
        prop::sample::select(corpus),
        prop::collection::vec(
            (
                0u8..3,
                any::<prop::sample::Index>(),
                prop::sample::select(alphabet),
            ),
            1..4,
        ),
    )
        .prop_map(|(line, edits)| {
            let mut chars: Vec<char> = line.chars().collect();
            for (kind, at, c) in edits {
                let i = if chars.is_empty() {
                    0
                } else {
                    at.index(chars.len() + 1)
                };
                match kind {
                    0 => chars.insert(i, c),
                    1 if i < chars.len() => {
                        chars.remove(i);
                    }
                    _ if i < chars.len() => chars[i] = c,
                    _ => chars.push(c),
                }
            }
            chars.into_iter().collect()
        })
}

/// Why a filter the live kernel took may be refused by ours: it ends in an operator without
/// its operand (`a == 1 &&`, `a == 1 || !`). Kernels with the fix that the ftrace selftest
/// `filter/event-filter-incomplete.tc` checks (Debian's 6.12.117 has it) refuse it as
/// "Meaningless filter expression", as ours does; older ones, such as this machine's, take
/// it. `None` when ours refuses `filter` for another reason, or takes it.
pub fn incomplete_expression(filter: &str) -> Option<&'static str> {
    let env = ustrace_filter::CompileEnv::default();
    let e = ustrace_filter::compile(filter, &SYS_ENTER, &env).err()?;
    (e.kind() == Some(ustrace_filter::ErrorKind::InvalidFilter)).then_some(
        "an operator without its operand at the end: refused by kernels with the fix \
         (6.12.117), taken by this one",
    )
}
