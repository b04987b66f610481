//! Differential test of event probes against the running kernel, which has
//! eprobes: each definition is written to `dynamic_events` and removed again
//! at once (events are never enabled). The source events' fields come from
//! their `format` files. Compares acceptance, errno, the `error_log` message
//! and caret, the read-back line, and the new event's fields and print fmt.
//! Kernels built without event probes make it skip (the development
//! machine's 6.18 kernel is one, so these expectations are the kernel
//! sources' behaviour, not yet checked against a live kernel).

use std::fs::{self, OpenOptions};

mod common;

use common::{Outcome, TRACEFS};
use ustrace_probe::*;
const GROUP: &str = "ustrace_probe_ediff";

/// Source-event fields from the kernel's format files (common fields
/// excluded, as eprobes cannot name them).
struct FormatEnv;

impl ProbeEnv for FormatEnv {
    fn event_fields(&self, system: &str, event: &str) -> Option<Vec<FieldSpec>> {
        if system.contains("..") || event.contains("..") {
            return None;
        }
        let text = fs::read_to_string(format!("{TRACEFS}/events/{system}/{event}/format")).ok()?;
        let mut fields = Vec::new();
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("field:"))
        {
            let parts: Vec<&str> = line.trim().split(';').map(str::trim).collect();
            let decl = parts[0].strip_prefix("field:")?;
            let num = |p: &str, k: &str| p.strip_prefix(k).and_then(|v| v.parse::<usize>().ok());
            let offset = num(parts[1], "offset:")?;
            let size = num(parts[2], "size:")?;
            let signed = num(parts[3], "signed:")? == 1;
            let (c_type, name) = decl.rsplit_once(' ')?;
            let name = name.split('[').next()?.to_owned();
            if name.starts_with("common_") {
                continue;
            }
            let kind = if c_type.starts_with("__data_loc") {
                FieldKind::DynString
            } else if decl.contains('[') && c_type == "char" {
                FieldKind::CharArray
            } else {
                FieldKind::Int
            };
            fields.push(FieldSpec {
                name,
                c_type: c_type.to_owned(),
                offset,
                size,
                signed,
                kind,
            });
        }
        Some(fields)
    }
}

fn cases() -> Vec<String> {
    let g = GROUP;
    let mut v: Vec<String> = [
        "e:{G}/ev sched.sched_switch",
        "e:{G}/ev sched/sched_switch",
        "e:{G}/ev sched.sched_switch $prev_pid $next_pid:s32 $prev_comm:string",
        "e:{G}/ev sched.sched_switch pid=$prev_pid:u32 st=$prev_state:s64 c=$comm x=$comm:u32",
        "e:{G}/ev sched.sched_switch p=+0($prev_state):u8 q=+8($prev_comm):x32 n=$next_comm:ustring",
        "e:{G}/ev sched.sched_switch a=$prev_pid:x8[2] b=$prev_pid:b3@1/32 k=\\1 s=\\\"x\"",
        "e:{G}/ev sched.sched_switch if prev_pid > 0",
        "e:{G}/ev sched.sched_switch pid=$prev_pid if next_pid == 1",
        "e:{G}/ev syscalls.sys_enter_openat f=+0($filename):ustring d=$dfd:s32",
        "e:{G}/ev sched.sched_process_exec fn=$filename:string pid=$pid",
        "e:{G}/ev sched.sched_switch @0x1000 +0(@4096):u16",
        "e:{G}/ev sched.sched_switch $prev_pid:symstr $prev_pid:symbol $prev_comm:char",
        "e:{G}/ev sched.sched_switch $nofield",
        "e:{G}/ev sched.sched_switch x=$common_pid",
        "e:{G}/ev sched.sched_switch %ax",
        "e:{G}/ev sched.sched_switch $arg1",
        "e:{G}/ev sched.sched_switch $retval",
        "e:{G}/ev sched.sched_switch $stack",
        "e:{G}/ev sched.sched_switch prev_pid",
        "e:{G}/ev sched.sched_switch $prev_pid:u32[",
        "e:{G}/ev sched.sched_switch $prev_pid:string[2]",
        "e:{G}/ev sched.sched_switch $prev_pid:xx",
        "e:{G}/ev sched.sched_switch +0($comm)",
        "e:{G}/ev sched.sched_switch a=$prev_pid a=$next_pid",
        "e:{G}/ev sched.sched_switch 1",
        "e:{G}/ev sched.sched_switch +0($prev_pid",
        "e:{G}/ev sched_switch",
        "e:{G}/ev sched.",
        "e:{G}/ev .sched_switch",
        "e:{G}/ev sched.no_such_event_xyz",
        "e:{G}/ev no_such_system_xyz.ev",
        "e:{G}/ev sched.sched_switch if",
        "e:/ev sched.sched_switch",
        "e:{G}/1ev sched.sched_switch",
        "e:{G}/e.v sched.sched_switch",
        "e:{G}/ sched.sched_switch",
        "e:{G}.ev sched.sched_switch $prev_pid",
        "e:{G}/eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee sched.sched_switch",
    ]
    .iter()
    .map(|s| s.replace("{G}", g))
    .collect();
    let many: Vec<String> = (0..129).map(|i| format!("a{i}=$prev_pid")).collect();
    v.push(format!("e:{g}/ev sched.sched_switch {}", many.join(" ")));
    v
}

/// Disagreements we understand: (text in the line, why).
const EXPLAINED: &[(&str, &str)] = &[];

#[test]
fn eprobes_agree_with_the_kernel() {
    let _lock = common::KernelLock::take();
    let path = format!("{TRACEFS}/dynamic_events");
    let readme = fs::read_to_string(format!("{TRACEFS}/README")).unwrap_or_default();
    if OpenOptions::new().append(true).open(&path).is_err()
        || !readme.contains("e[:[<group>/][<event>]]")
    {
        eprintln!("skipped: no writable dynamic_events with eprobe support");
        return;
    }
    // The README lists the eprobe syntax even when the kernel is built
    // without CONFIG_EPROBE_EVENTS; then every `e` line is refused with a
    // bare EINVAL and no error_log entry.
    if let Outcome::Rejected { caret: None, .. } = common::kernel_outcome(
        "dynamic_events",
        &format!("e:{GROUP}/probe sched.sched_switch"),
    ) {
        eprintln!("skipped: this kernel has no event probes (CONFIG_EPROBE_EVENTS)");
        return;
    }
    let before = fs::read_to_string(&path).unwrap_or_default();
    let all = cases();
    let common::Agreement {
        agree,
        explained,
        logged,
        bad,
    } = common::compare(&all, "dynamic_events", &FormatEnv, EXPLAINED);
    assert_eq!(
        before,
        fs::read_to_string(&path).unwrap_or_default(),
        "dynamic_events left as found"
    );
    eprintln!(
        "eprobe agreement: {agree}/{} ({:.1}%), {explained} explained; {logged} rejections compared with error_log",
        all.len(),
        100.0 * agree as f64 / all.len() as f64
    );
    assert!(
        bad.is_empty(),
        "unexplained disagreements:\n{}",
        bad.join("\n")
    );
}
