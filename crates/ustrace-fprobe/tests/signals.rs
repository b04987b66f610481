//! Signals around patching: a SIGTRAP that is not one of our int3 traps must get the
//! previous handler or the default action (issue 21 #10). Each case runs in a child process
//! (this test binary re-run with an environment variable) because the expected outcome may be
//! the death of the process.

use std::hint::black_box;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

use ustrace_fprobe::{EntryAction, Fprobe};

const CHILD: &str = "USTRACE_FPROBE_SIGNALS_CHILD";

#[no_mangle]
#[inline(never)]
pub extern "C" fn sig_target(x: u64) -> u64 {
    black_box(x).wrapping_mul(7) ^ 0x55
}

/// Registers an fprobe (which installs the SIGTRAP handler) and checks it works.
fn attach() -> Fprobe {
    let fp = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| EntryAction::Continue)
        .register_syms(&["sig_target"])
        .expect("register");
    assert_eq!(sig_target(3), (3 * 7) ^ 0x55);
    fp
}

/// Runs `case` in a child and returns how it ended.
fn run_child(test: &str, case: &str) -> (ExitStatus, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .output()
        .expect("run the child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

fn child_case() -> Option<String> {
    std::env::var(CHILD).ok()
}

#[test]
fn sigtrap_sent_by_kill_takes_the_default_action() {
    if child_case().is_some() {
        let _fp = attach();
        // SAFETY: sending ourselves a signal.
        unsafe { libc::kill(libc::getpid(), libc::SIGTRAP) };
        std::thread::sleep(std::time::Duration::from_millis(500));
        println!("survived a SIGTRAP whose default action is to terminate");
        std::process::exit(0);
    }
    let (status, text) = run_child("sigtrap_sent_by_kill_takes_the_default_action", "kill");
    assert_eq!(
        status.signal(),
        Some(libc::SIGTRAP),
        "the child must die of SIGTRAP: {status:?}\n{text}"
    );
}

static SEEN_CODE: AtomicI32 = AtomicI32::new(i32::MIN);

extern "C" fn own_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    SEEN_CODE.store(unsafe { (*info).si_code }, Ordering::SeqCst);
}

#[test]
fn sigtrap_sent_by_tgkill_reaches_the_previous_handler() {
    if child_case().is_some() {
        // SAFETY: installing a plain SA_SIGINFO handler before any fprobe exists.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = own_handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut()), 0);
        }
        let _fp = attach();
        // SAFETY: a signal to this very thread.
        unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                libc::syscall(libc::SYS_gettid),
                libc::SIGTRAP,
            )
        };
        let code = SEEN_CODE.load(Ordering::SeqCst);
        assert_eq!(code, libc::SI_TKILL, "previous handler saw si_code {code}");
        // The probe still works after the foreign trap.
        assert_eq!(sig_target(5), (5 * 7) ^ 0x55);
        std::process::exit(0);
    }
    let (status, text) = run_child(
        "sigtrap_sent_by_tgkill_reaches_the_previous_handler",
        "handler",
    );
    assert!(status.success(), "{status:?}\n{text}");
}
