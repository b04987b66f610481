//! When the top-level buffer cannot be allocated, the tracefs answers `ENOMEM` and
//! `try_tracing` an error, instead of panicking the thread that asked; once it can be
//! allocated, everything works. A file of its own: it must be the first to touch the
//! process's tracing state, and it lowers the process's file limit meanwhile.

use ustrace::{Errno, FileSystem, OpenFlags};

fn nofile() -> libc::rlimit {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-parameter.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
    rl
}

fn set_nofile(rl: &libc::rlimit) {
    // SAFETY: a valid rlimit; lowering and raising the soft limit within the hard one.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, rl) }, 0);
}

#[test]
fn no_buffer_is_an_error_not_a_panic() {
    let saved = nofile();
    // Every descriptor number up to the highest open one is taken or at least allowed:
    // a limit of the current count leaves no room for a buffer's files.
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    set_nofile(&libc::rlimit {
        rlim_cur: open.saturating_sub(1),
        rlim_max: saved.rlim_max,
    });
    let tracing = ustrace::trace::try_tracing().map(|_| ());
    let opened = ustrace::tracefs()
        .open("buffer_size_kb", OpenFlags::READ)
        .map(|_| ());
    let mkdir = ustrace::tracefs().mkdir("instances/nobuf");
    set_nofile(&saved);

    assert!(tracing.is_err(), "try_tracing succeeded without files");
    assert_eq!(opened, Err(Errno::ENOMEM));
    assert_eq!(mkdir, Err(Errno::ENOMEM));
    // Later, with files to spare, the same calls work.
    ustrace::trace::try_tracing().expect("tracing once files are there");
    assert!(ustrace::tracefs()
        .open("buffer_size_kb", OpenFlags::READ)
        .is_ok());
}
