//! `OpenFlags`: what a truncating open does depends on `write`, as on the kernel.

use ustrace::{FileSystem, OpenFlags};

#[test]
fn truncate_without_write_clears_nothing_and_truncate_with_write_clears() {
    let fs = ustrace::tracefs();
    fs.mkdir("instances/open_flags").unwrap();
    let marker = "instances/open_flags/trace_marker";
    let trace = "instances/open_flags/trace";
    fs.write_file(marker, "kept\n").unwrap();

    // O_RDONLY|O_TRUNC: the kernel's `trace` keeps its content (checked on 6.18).
    let read_truncate = OpenFlags {
        truncate: true,
        ..OpenFlags::READ
    };
    drop(fs.open(trace, read_truncate).unwrap());
    assert!(
        fs.read_to_string(trace).unwrap().contains("kept"),
        "a read-only open with truncate cleared the buffer"
    );

    // O_WRONLY|O_TRUNC (OpenFlags::TRUNCATE, the shell's `>`): cleared.
    const { assert!(OpenFlags::TRUNCATE.write) };
    drop(fs.open(trace, OpenFlags::TRUNCATE).unwrap());
    assert!(!fs.read_to_string(trace).unwrap().contains("kept"));

    fs.rmdir("instances/open_flags").unwrap();
}
