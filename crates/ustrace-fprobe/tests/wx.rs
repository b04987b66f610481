//! No mapping of the process is writable and executable at once after fprobes are attached
//! (issue 21 #11): stubs are mapped read-execute and written through /proc/self/mem.

use std::hint::black_box;

use ustrace_fprobe::{EntryAction, Fprobe};

#[no_mangle]
#[inline(never)]
pub extern "C" fn wx_target(x: u64) -> u64 {
    black_box(x).rotate_left(9) ^ 0x1234
}

fn wx_mappings() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .filter(|l| {
            let perms = l.split_whitespace().nth(1).unwrap_or("");
            perms.contains('w') && perms.contains('x')
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn no_writable_and_executable_mapping_after_attaching() {
    let before = wx_mappings();
    assert!(before.is_empty(), "W+X before any fprobe: {before:?}");
    let fp = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .exit_handler(|_, _, _, _, _| {})
        .register_syms(&["wx_target"])
        .expect("register");
    assert_eq!(wx_target(1), 1u64.rotate_left(9) ^ 0x1234);
    assert!(
        ustrace_fprobe::stats().code_bytes > 0,
        "no stub memory was used"
    );
    let after = wx_mappings();
    assert!(after.is_empty(), "W+X mappings after attaching: {after:?}");
    fp.unregister().unwrap();
}
