//! Every file and directory of the tree has the mode the kernel's tracefs gives it: checked
//! against the live `/sys/kernel/tracing` for each path both trees have, in the top directory
//! and in an instance of each.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use ustrace::FileSystem;
use ustrace_ctl::vfs::FileKind;

ustrace::trace_event! {
    pub fn tmodes::probe_event(value: i32) {
        value: i32 = value,
    }
    print "value=%d", value;
}

const KERNEL: &str = "/sys/kernel/tracing";

/// Compares the modes of `ours` (a directory of our tree) and everything below it with the
/// kernel's `theirs`, for the names both have; returns how many paths were compared.
fn compare(fs: &ustrace::TraceFs, ours: &str, theirs: &Path, diffs: &mut Vec<String>) -> usize {
    let mut compared = 0;
    let st = fs.stat(ours).unwrap();
    if let Ok(meta) = std::fs::symlink_metadata(theirs) {
        compared += 1;
        let kernel = meta.mode() & 0o7777;
        if st.mode != kernel {
            diffs.push(format!("{ours:?}: {:04o}, kernel {kernel:04o}", st.mode));
        }
    } else {
        return 0;
    }
    if st.kind != FileKind::Dir {
        return compared;
    }
    for entry in fs.readdir(ours).unwrap() {
        // The event tree is large and uniform: one system and one event of it suffice, plus
        // the files at its top.
        if ours.ends_with("events") && entry.kind == FileKind::Dir && entry.name != "ftrace" {
            continue;
        }
        if ours.ends_with("events/ftrace") && entry.kind == FileKind::Dir && entry.name != "print" {
            continue;
        }
        if ours.ends_with("instances") {
            continue;
        }
        let child = if ours.is_empty() {
            entry.name.clone()
        } else {
            format!("{ours}/{}", entry.name)
        };
        compared += compare(fs, &child, &theirs.join(&entry.name), diffs);
    }
    compared
}

#[test]
fn modes_match_the_kernel_tracefs() {
    probe_event::trace(1);
    if std::fs::read_dir(KERNEL).is_err() {
        eprintln!("skipped: {KERNEL} is not readable here");
        return;
    }
    let fs = ustrace::tracefs();
    let mut diffs = Vec::new();
    let mut compared = compare(&fs, "", Path::new(KERNEL), &mut diffs);
    // An event directory of a system the kernel does not have: compare with sched_switch.
    compared += compare(
        &fs,
        "events/tmodes/probe_event",
        Path::new(&format!("{KERNEL}/events/sched/sched_switch")),
        &mut diffs,
    );
    compared += compare(
        &fs,
        "events/tmodes",
        Path::new(&format!("{KERNEL}/events/sched")),
        &mut diffs,
    );

    let name = format!("ustrace-modes-{}", std::process::id());
    let kernel_instance = Path::new(KERNEL).join("instances").join(&name);
    if std::fs::create_dir(&kernel_instance).is_ok() {
        let ours = format!("instances/{name}");
        fs.mkdir(&ours).unwrap();
        compared += compare(
            &fs,
            "instances",
            &Path::new(KERNEL).join("instances"),
            &mut diffs,
        );
        compared += compare(&fs, &ours, &kernel_instance, &mut diffs);
        fs.rmdir(&ours).unwrap();
        std::fs::remove_dir(&kernel_instance).unwrap();
    } else {
        eprintln!("skipped (part): cannot make a kernel instance to compare with");
    }
    assert!(compared > 40, "only {compared} paths compared");
    assert!(
        diffs.is_empty(),
        "modes differ from the kernel's:\n{}",
        diffs.join("\n")
    );
}
