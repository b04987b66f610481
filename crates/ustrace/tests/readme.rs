//! The `README` file as tools read it: the kernel's ftrace selftests look for syntax lines
//! (`# requires: ... "PATTERN":README`, a fixed-string grep) to decide whether a feature
//! exists. Every pattern they use for something this build supports must be there, and
//! none for what it does not; each syntax the README lists must really be accepted.

mod common;

use common::{append, read, write};

ustrace::trace_event! {
    pub fn readme_sys::readme_tp(a: u64) {
        a: u64 = a,
    }
    print "a=%llu", a;
}

/// What the fprobe lines below probe.
#[no_mangle]
#[inline(never)]
pub extern "C" fn readme_probe_target(first: u64, text: *const u8) -> u64 {
    std::hint::black_box(first) + std::hint::black_box(text as u64 & 1)
}

/// Patterns of the selftests' `requires:` lines (and of the README greps inside their
/// scripts) for things this build has.
const SUPPORTED: &[&str] = &[
    // dynevent/add_remove_fprobe.tc, fprobe_syntax_errors.tc, add_remove_fprobe_repeat.tc
    "f[:[<group>/][<event>]] <func-name>[%return] [<args>]",
    // dynevent/add_remove_tprobe.tc, tprobe_syntax_errors.tc, enable_disable_tprobe.tc
    "t[:[<group>/][<event>]] <tracepoint> [<args>]",
    // dynevent/test_duplicates.tc and older add_remove_eprobe.tc
    "e[:[<group>/][<event>]] <attached-group>.<attached-event> [<args>]",
    // dynevent/eprobes_syntax_errors.tc, newer add_remove_eprobe.tc
    "<attached-group>.<attached-event> [<args>]",
    // dynevent/add_remove_synth.tc, trigger-synthetic_event_syntax_errors.tc,
    // trigger-synthetic-event-syntax.tc (the kernel's README since 6.4 reads
    // "char name[]; long[] stack'", which the older dynstring test's pattern misses)
    "s:[synthetic/]",
    "' >> synthetic_events",
    "long[]",
    // eprobes_syntax_errors.tc greps this to test `if` filters
    "[if <filter>]",
    // event/event-mod.tc
    "Can enable module events via: :mod:",
    // fetch-argument features that kprobe/fprobe scripts grep for
    "$arg<N>",
    "<argname>",
    "kernel return probes support: $retval, $arg<N>, $comm",
    "imm-value",
    "imm-string",
    "symstr",
    "ustring",
    "b<bit-width>@<bit-offset>/<container-size>",
    "<type>\\[<array-size>\\]",
    // trigger syntax
    "<trigger>[:count][if <filter>]",
    "enable_event:<system>:<event>",
    "disable_event:<system>:<event>",
    // trigger/trigger-hist*.tc and the hist lines of the kernel's README
    "hist trigger",
    "enable_hist:<system>:<event>",
    "disable_hist:<system>:<event>",
    "<var1>=<field|var_ref|numeric_literal>",
    "[:nohitcount]",
    // inter-event handlers and actions (trigger/inter-event/*)
    "onmatch(",
    "onmax(",
    "onchange(var)",
    "snapshot()",
    "trace(<synthetic_event>",
];

/// Patterns for things this build does not have: listing them would make the selftests
/// run tests that must fail.
const UNSUPPORTED: &[&str] = &[
    // kprobes (dynevent/add_remove_kprobe.tc, kprobe/*)
    "p[:[<group>/][<event>]] <place> [<args>]",
    "place: [<module>:]<symbol>",
    "place (kretprobe): [<module>:]<symbol>",
    // uprobes
    "place (uprobe): <path>:<offset>[%return][(ref_ctr_offset)]",
    // fetch forms and types the parser refuses
    "%pd/%pD",
    "this_cpu_read(<fetcharg>)",
    "[(structname[,field])]<argname>",
    "<func-name>[:entry|:exit]",
    "%<register>",
];

#[test]
fn readme_lists_what_the_selftests_look_for_and_nothing_we_lack() {
    let readme = read("README").unwrap();
    let missing: Vec<_> = SUPPORTED.iter().filter(|p| !readme.contains(*p)).collect();
    assert!(missing.is_empty(), "README lacks {missing:?}");
    let extra: Vec<_> = UNSUPPORTED.iter().filter(|p| readme.contains(*p)).collect();
    assert!(extra.is_empty(), "README claims {extra:?}");
}

/// Each fetch-argument form and type the README lists, in a definition that must be taken.
#[test]
fn every_syntax_the_readme_lists_is_accepted() {
    let readme = read("README").unwrap();
    // (what the README must list, a definition using it)
    let cases: &[(&str, &str)] = &[
        ("f[:[<group>/][<event>]]", "f:readme/f1 readme_probe_target"),
        (
            "<func-name>[%return]",
            "f:readme/f2 readme_probe_target%return r=$retval a=$arg1",
        ),
        ("$arg<N>", "f:readme/f3 readme_probe_target x=$arg1:u64"),
        ("<argname>", "f:readme/f4 readme_probe_target first"),
        ("$stack<index>", "f:readme/f5 readme_probe_target s=$stack0"),
        ("$stack,", "f:readme/f6 readme_probe_target s=$stack"),
        ("$comm", "f:readme/f7 readme_probe_target c=$comm"),
        (
            "@<symbol>[+|-<offset>]",
            "f:readme/f8 readme_probe_target v=@readme_probe_target+1:u8",
        ),
        (
            "+|-[u]<offset>(<fetcharg>)",
            "f:readme/f9 readme_probe_target v=+0($arg2):u8",
        ),
        ("\\imm-value", "f:readme/f10 readme_probe_target v=\\1234"),
        ("\\\"imm-string\"", "f:readme/f11 readme_probe_target v=\\\"hi\""),
        (
            "x8/16/32/64, char, string, symbol",
            "f:readme/f12 readme_probe_target a=$arg1:x16 b=$arg1:s8 c=$arg1:char d=+0($arg2):string e=$arg1:symbol",
        ),
        (
            "b<bit-width>@<bit-offset>/<container-size>",
            "f:readme/f13 readme_probe_target v=$arg1:b4@2/32",
        ),
        ("ustring", "f:readme/f14 readme_probe_target v=+0($arg2):ustring"),
        ("symstr", "f:readme/f15 readme_probe_target v=$arg1:symstr"),
        (
            "<type>\\[<array-size>\\]",
            "f:readme/f16 readme_probe_target v=+0($arg2):u8[4]",
        ),
        (
            "t[:[<group>/][<event>]] <tracepoint>",
            "t:readme/t1 readme_tp v=$arg1",
        ),
        (
            "[if <filter>]",
            "e:readme/e1 readme_sys.readme_tp v=$a:u64 if a > 1",
        ),
        (
            "s:[synthetic/]<event> <field> [<field>]",
            "s:readme_lat u64 lat; pid_t pid; char name[]; long[] stack",
        ),
    ];
    let _ = write("dynamic_events", "");
    let mut refused = Vec::new();
    for (listed, definition) in cases {
        assert!(readme.contains(listed), "README does not list {listed:?}");
        if let Err(e) = append("dynamic_events", &format!("{definition}\n")) {
            refused.push(format!("{definition}: {e:?}"));
        }
    }
    let listed = read("dynamic_events").unwrap();
    let _ = write("dynamic_events", "");
    assert!(refused.is_empty(), "refused: {refused:#?}");
    assert_eq!(listed.lines().count(), cases.len(), "{listed}");
    readme_probe_target(1, std::ptr::null());
    readme_tp::trace(1);
}
