//! RCU in a forked child (a pre-forking server that does not exec). Only the forking thread
//! exists in the child: the sections and the writer of the parent's other threads must not
//! hold up the child's grace periods, while the forking thread's own section, open across
//! the fork, must still be waited for. One test in its own binary, so that no other test's
//! threads are forked along.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use ustrace::rcu;

/// The child's part; its exit status says what went wrong.
fn child(inherited: rcu::ReadGuard) -> i32 {
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let done = done.clone();
        std::thread::spawn(move || {
            rcu::synchronize();
            done.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    if done.load(Ordering::SeqCst) {
        return 2; // the grace period ended inside the forking thread's section
    }
    drop(inherited);
    if writer.join().is_err() || !done.load(Ordering::SeqCst) {
        return 3;
    }
    // The parent's other threads are gone, sections and writer alike.
    rcu::synchronize();
    0
}

#[test]
fn a_forked_child_waits_for_its_own_section_and_not_for_the_parents_threads() {
    // A parent thread parked inside a section for the whole test.
    let (parked, wait_parked) = mpsc::channel();
    let (release, wait_release) = mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let section = rcu::read_lock();
        parked.send(()).unwrap();
        wait_release.recv().unwrap();
        drop(section);
    });
    wait_parked.recv().unwrap();
    // A parent thread inside `synchronize`, waiting for that section: it holds the writers'
    // lock when the fork happens.
    let synchronized = Arc::new(AtomicBool::new(false));
    let writer = {
        let synchronized = synchronized.clone();
        std::thread::spawn(move || {
            rcu::synchronize();
            synchronized.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!synchronized.load(Ordering::SeqCst));

    // The forking thread is inside a section too.
    let section = rcu::read_lock();
    // SAFETY: the child runs only `child` (threads, RCU, sleeps) and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: alarm and _exit take plain integers; a hung child dies of SIGALRM.
        unsafe { libc::alarm(20) };
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| child(section)))
            .unwrap_or(101);
        // SAFETY: leaves the child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    drop(section);
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    release.send(()).unwrap();
    reader.join().unwrap();
    writer.join().unwrap();
    assert!(synchronized.load(Ordering::SeqCst));
    assert!(
        libc::WIFEXITED(status),
        "the child was killed by signal {} (14: it hung)",
        libc::WTERMSIG(status)
    );
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "2: the child's grace period ignored the inherited section; 3: the child's writer failed"
    );
}
