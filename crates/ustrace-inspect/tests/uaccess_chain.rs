//! Faults that are not ours must still reach whoever handled them before us.
//! Each case runs in a forked child so the crash is contained; this file is
//! its own test binary so no handler is installed in the parent beforehand.

use ustrace_inspect::uaccess;

fn in_child(body: fn() -> i32) -> libc::c_int {
    // SAFETY: the child only calls async-signal-tolerant code and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = body();
        // SAFETY: leave the child without running the parent's test harness.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

extern "C" fn earlier_handler(
    _sig: libc::c_int,
    info: *mut libc::siginfo_t,
    _ctx: *mut libc::c_void,
) {
    // SAFETY: valid siginfo from the kernel; _exit is async-signal-safe.
    unsafe {
        let code = if (*info).si_addr() as usize == 0x18 {
            42
        } else {
            43
        };
        libc::_exit(code);
    }
}

fn crash_at_0x18() {
    // SAFETY: deliberately not safe: this is the program's own crash.
    unsafe { std::ptr::read_volatile(0x18 as *const u64) };
}

#[test]
fn foreign_segfault_reaches_the_earlier_handler() {
    let status = in_child(|| {
        // SAFETY: installing a plain SA_SIGINFO handler in the child.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = earlier_handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
        uaccess::install().unwrap();
        uaccess::install().unwrap(); // idempotent: must not chain to itself
        if uaccess::read_u64(0x10).is_ok() {
            return 1;
        }
        crash_at_0x18();
        2
    });
    assert!(libc::WIFEXITED(status), "status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 42);
}

#[test]
fn foreign_segfault_with_default_action_still_kills() {
    let status = in_child(|| {
        // SAFETY: restoring the default action in the child.
        unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
        // Silence the core dump so the test leaves nothing behind.
        let lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain setrlimit.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &lim) };
        if uaccess::read_u64(0).is_ok() {
            return 1;
        }
        crash_at_0x18();
        2
    });
    assert!(libc::WIFSIGNALED(status), "status {status:#x}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
}

#[test]
fn handler_installed_later_is_displaced_by_reinstall() {
    let status = in_child(|| {
        uaccess::install().unwrap();
        // The program replaces our handler with its own...
        // SAFETY: installing a handler in the child.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = earlier_handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
        // ...and install() puts ours back in front, chaining to it.
        uaccess::install().unwrap();
        if uaccess::read_u64(0).is_ok() {
            return 1;
        }
        crash_at_0x18();
        2
    });
    assert!(libc::WIFEXITED(status), "status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 42);
}

/// A runtime's handler that keeps the handler it replaced and passes it every fault.
static SAVED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn chaining_handler(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    let prev = SAVED.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: SAVED holds the SA_SIGINFO handler this one replaced (ours).
    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
        unsafe { std::mem::transmute(prev) };
    f(sig, info, ctx);
}

#[test]
fn reinstalled_in_front_of_a_chaining_runtime_does_not_loop() {
    let status = in_child(|| {
        // SAFETY: installing handlers in the child.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = earlier_handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
        if uaccess::install().unwrap() != 0 {
            return 3;
        }
        // A runtime starts later, saves ours and chains to it...
        // SAFETY: installing a handler in the child, after saving the current one.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old);
            SAVED.store(old.sa_sigaction, std::sync::atomic::Ordering::Relaxed);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = chaining_handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
        }
        // ...our next check finds it and goes back in front.
        if uaccess::install().unwrap() != 1 {
            return 4;
        }
        if uaccess::read_u64(0x10).is_ok() {
            return 1;
        }
        // The program's own crash goes ours -> runtime -> ours again -> the handler that
        // was there first; not round and round.
        crash_at_0x18();
        2
    });
    assert!(libc::WIFEXITED(status), "status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 42);
}
