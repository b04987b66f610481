//! Issue 21 item 12: a program (or a runtime it loads) that installs its own SIGSEGV
//! handler after ustrace's must not turn a probe's faulting fetch into a crash. Enabling a
//! dynamic event checks the handler and puts ustrace's back in front. Its own test binary:
//! it replaces the process's SIGSEGV handler, which no other test may see.

mod common;

use common::{append, read, write};
use ustrace::FileSystem;

/// A function whose argument the probe dereferences.
#[no_mangle]
#[inline(never)]
pub extern "C" fn sigsegv_deref_target(p: *const u64, n: u64) -> u64 {
    std::hint::black_box(p);
    n
}

/// The newcomer: it does not chain, and ends the process with 3 on any fault it sees.
extern "C" fn runtime_handler(_sig: libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(3) };
}

#[test]
fn a_fetch_after_another_handler_took_sigsegv_still_faults_safely() {
    ustrace::tracefs().mkdir("instances/segv").unwrap();
    append(
        "dynamic_events",
        "f:segv/rd sigsegv_deref_target val=+0($arg1):u64 s=+0($arg1):string n=$arg2\n",
    )
    .unwrap();
    // ustrace's handler is in place (the first fault-safe read installs it)...
    let x = 7u64;
    assert_eq!(
        ustrace_inspect::uaccess::read_u64(&x as *const u64 as usize),
        Ok(7)
    );
    // ...then another runtime takes SIGSEGV for itself.
    // SAFETY: installing a plain handler for SIGSEGV.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = runtime_handler as *const () as usize;
        libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
    }
    write("instances/segv/events/segv/rd/enable", "1\n").unwrap();
    // A bad pointer: the fetch faults; the record says so and the process lives on.
    std::hint::black_box(sigsegv_deref_target(0x10 as *const u64, 5));
    write("instances/segv/events/segv/rd/enable", "0\n").unwrap();
    let trace = read("instances/segv/trace").unwrap();
    let lines = common::body_lines(&trace);
    assert_eq!(lines.len(), 1, "{trace}");
    assert!(lines[0].ends_with(" val=0 s=(fault) n=0x5"), "{}", lines[0]);
    // ustrace's handler is in front again; it passes the newcomer every fault that is not
    // its own (ustrace-inspect's uaccess_chain tests check the chaining).
    // SAFETY: reading the installed action into a local.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid signal number and out-pointer.
    unsafe { libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut cur) };
    assert_ne!(cur.sa_sigaction, runtime_handler as *const () as usize);
    write("dynamic_events", "").unwrap();
    ustrace::tracefs().rmdir("instances/segv").unwrap();
}
