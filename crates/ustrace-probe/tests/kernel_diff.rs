//! Differential test against the running kernel's uprobe events, which share
//! the fetch-argument parser with fprobes and eprobes.
//!
//! Each case becomes `p:ustrace_probe_diff/evN /bin/true:0x1000 ARGS` (or a
//! variation of the head), written to `/sys/kernel/tracing/uprobe_events`.
//! Accepted events are removed again at once with `-:`; nothing else in the
//! tracing state is touched (the kernel appends to the global `error_log`,
//! which is how it reports the error we compare). For every case the test
//! compares acceptance, errno, the error message and the caret column, and
//! for accepted ones the line `uprobe_events` shows against our
//! `canonical()`. Known, explained disagreements are listed in `EXPLAINED`.

use std::fs::{self, OpenOptions};

mod common;

use common::TRACEFS;
use ustrace_probe::NoEnv;
const GROUP: &str = "ustrace_probe_diff";

/// Argument lists (after the probe point) and whole-line variations.
fn cases() -> Vec<String> {
    let args: &[&str] = &[
        // accepted forms
        "%di", "%ax %bx %cx %dx %si %di %bp %sp %ip %flags %r8 %r15 %orig_ax %cs %ss",
        "$stack", "$stack0", "$stack12", "$comm", "$COMM", "$comm:string", "@0x1000",
        "@4096:u32", "@+0x10", "@+16:string", "+0(%di)", "-8(%si):s32", "+u8(%di):u16",
        "+0(+8(%di)):x8", "+0(+0(+0(+0(%di))))", "+0(%di):string", "+0(%di):ustring",
        "+u0(%di):string", "\\1", "\\0x10:u8", "\\-1:s8", "\\+5", "\\\"abc\"", "\\\"x\":string",
        "a=%di b=%si", "x=+0(%di):u8[4]", "y=+0(%di):string[2]", "+0(%di):b3@2/32",
        "+0(%di):b8@0/8", "+0(%di):char", "+0(%di):x64[64]", "_n=%di", "%di:s64 %si:u8",
        "\\1:x16", "+0x10(%sp):u64", "-0x10(%sp)", "+0(%di)trailing", "+8(%di)xyz:u16",
        "n0123456789012345678901234567890=%di", "+010(%di)", "@010",
        // errors
        "$foo", "$", "$stack-1", "$stackx", "$stack1x", "$retval", "$arg1", "x=$arg1",
        "$arg*", "$arg0", "$argx", "%xx", "%eax", "%ds", "%", "@", "@1x", "@0xzz",
        "@+x", "@+", "@sym", "@sym+8", "\\", "\\x", "\\1x", "\\-", "\\\"abc", "\\\"",
        "+(%di)", "+x(%di)", "+0%di", "+0(%di", "+0(+0(%di)", "+0($comm)",
        "+0(\\\"x\")", "+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(%di)))))))))))))))",
        "+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(%di))))))))))))))",
        "+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(%di)))))))))))))",
        "+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(%di))))))))))))):u8[2]",
        "#x", "1", "foo", "_x", "&x", "%di:u32[", "%di:u32[4", "+0(%di):u32[4]x",
        "+0(%di):u32[0]", "+0(%di):u32[x]", "+0(%di):u32[65]", "+0(%di):u32[64]",
        "%di:u32[2]", "%di:xx", "%di:", "%di:u128", "%di:symbol", "%di:symstr",
        "%di:string", "\\1:string", "$comm:u32", "$comm:string[2]", "\\\"a\":x8",
        "%di:b0@0/32", "%di:b3@/32", "%di:b3@2", "%di:b3@30/32", "%di:b3@2/31",
        "%di:bx", "%di:%pd", "abcdefghijabcdefghijabcdefghijabc=%di", "=%di", "1a=%di",
        "a-b=%di", "a=", "a=%di a=%si", "__probe_ip=%di", "common_pid=%di",
        "+0(%di):x64[64] +0(%di):x64[64] +0(%di):x64[64] +0(%di):x64[64] +0(%di):x64[64] +0(%di):x64[64] +0(%di):x64[64]",
        "+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(%di))))))))))))))xyzxyzxyzxyzxyzxyzxyz",
        "+0(%di):string:x", "+u0(%di):x8", "-u8(%di)", "+0u(%di)", "%di=x",
        "+0(%di):symstr", "$comm:ustring", "+0(@0x10):string",
        "+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(@1))))))))))))):u8[2]",
        "+0(%di):string[65]",
        "+0(%di):u8[01]",
        "+0(%di):u8[0x2]",
        "x:u32=%di",
        "%di:b1@63/64",
        "%di:b64@0/64",
        "%di:b65@0/64",
        "%di:b0x3@0x2/0x20",
        "%di:b3@2/0x20x",
        "\\\"a:b\"",
        "+0x(%di)",
        "+0(%di))",
        "+0((%di))",
        "$stack18446744073709551616",
        "$stack4294967296",
        "@18446744073709551615",
        "@18446744073709551616",
        "\\18446744073709551616",
        "\\-9223372036854775808:s64",
        "\\-9223372036854775809",
        "$comm:string[1]",
        "abcdefghijabcdefghijabcdefghijab=%di",
        "x=+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(%di)))))))))))))):u8",
        "x=+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(%di)))))))))))))):u16",
        "+0(%di):x8:x8",
        "%di::u8",
        "+0(%di)):u8",
        "%di[1]",
        "+0(%di):u8[1]x[2]",
        "%di:u8[2][3]",
        "\\1:u8[2]",
        "$comm:ustring[2]",
        "@+0x10:s8[3]",
        "@-1",
        "@+-1",
        "+-1(%di)",
        "--1(%di)",
        "-+1(%di)",
        "+u+1(%di)",
        "+uu1(%di)",
        "+1u(%di)",
        "\\0x",
        "\\0b1",
        "\\010:u8",
        "\\+0x10:u8",
    ];
    let mut out: Vec<String> = args
        .iter()
        .map(|a| format!("p:{GROUP}/ev /bin/true:0x1000 {a}"))
        .collect();
    // Heads.
    for h in [
        "p:{G}/ev /bin/true:0x1000%return",
        "r:{G}/ev /bin/true:0x1000 $retval",
        "p:{G}/ev /bin/true:0x1000%ret",
        "p:{G}/ev /bin/true:0x10zz",
        "p:{G}/ev /nonexistent/bin/x:0x1000",
        "p:{G}/ev /bin:0x1000",
        "p:/ev /bin/true:0x1000",
        "p:{G}/ /bin/true:0x1000",
        "p:{G}/1ev /bin/true:0x1000",
        "p:{G}/e-v /bin/true:0x1000",
        "p:{G}/evevevevevevevevevevevevevevevevevevevevevevevevevevevevevevevev /bin/true:0x1000",
        "p:gr-p/ev /bin/true:0x1000",
        "p:-gr/ev /bin/true:0x1000",
        "p:1gr/ev /bin/true:0x1000",
        "p:g.r/ev /bin/true:0x1000",
        "p:ggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggg/ev /bin/true:0x1000",
        "p: /bin/true:0x1000",
        "x:{G}/ev /bin/true:0x1000",
        "p:{G}/ev",
        "p:{G}.ev /bin/true:0x1000 %di",
        "p /bin/true:0x1000 %di",
        "r /bin/true:0x1000 $retval",
    ] {
        out.push(h.replace("{G}", GROUP));
    }
    let many: Vec<String> = (0..129).map(|i| format!("a{i}=%di")).collect();
    out.push(format!("p:{GROUP}/ev /bin/true:0x1000 {}", many.join(" ")));
    out
}

/// Disagreements we understand, by the argument text that triggers them.
const EXPLAINED: &[(&str, &str)] = &[];

fn usable() -> bool {
    let path = format!("{TRACEFS}/uprobe_events");
    OpenOptions::new().append(true).open(&path).is_ok() && fs::metadata("/bin/true").is_ok()
}

#[test]
fn uprobe_events_agree_with_the_kernel() {
    let _lock = common::KernelLock::take();
    if !usable() {
        eprintln!("skipped: {TRACEFS}/uprobe_events is not writable (needs root and tracefs)");
        return;
    }
    let before = fs::read_to_string(format!("{TRACEFS}/uprobe_events")).unwrap_or_default();
    assert!(
        !before.contains(GROUP),
        "left-over {GROUP} events from an earlier run"
    );
    let all = cases();
    let common::Agreement {
        agree,
        explained,
        logged: with_log,
        bad: unexplained,
    } = common::compare(&all, "uprobe_events", &NoEnv, EXPLAINED);
    let after = fs::read_to_string(format!("{TRACEFS}/uprobe_events")).unwrap_or_default();
    assert_eq!(before, after, "uprobe_events must be left as found");
    eprintln!(
        "kernel agreement: {agree}/{} ({:.1}%), {explained} explained disagreements; \
         {with_log} rejections compared with their error_log entry",
        all.len(),
        100.0 * agree as f64 / all.len() as f64
    );
    assert!(
        unexplained.is_empty(),
        "unexplained disagreements:\n{}",
        unexplained.join("\n")
    );
}
