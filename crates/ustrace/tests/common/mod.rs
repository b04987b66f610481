//! Shared by the integration tests: reading and writing tracefs files as a shell does.
#![allow(dead_code)]

use ustrace::{Errno, FileSystem, OpenFlags};

/// The whole file, read as `cat` reads it.
pub fn read(path: &str) -> Result<String, Errno> {
    let mut file = ustrace::tracefs().open(path, OpenFlags::READ)?;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = file.read(&mut buf, None)?;
        if n == 0 {
            return Ok(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// `echo TEXT > PATH` (without the newline unless TEXT has one).
pub fn write(path: &str, text: &str) -> Result<(), Errno> {
    let mut file = ustrace::tracefs().open(path, OpenFlags::TRUNCATE)?;
    file.write(text.as_bytes()).map(|_| ())
}

/// `echo TEXT >> PATH`.
pub fn append(path: &str, text: &str) -> Result<(), Errno> {
    let mut file = ustrace::tracefs().open(path, OpenFlags::APPEND)?;
    file.write(text.as_bytes()).map(|_| ())
}

/// The trace lines of `trace` text, headers left out.
pub fn body_lines(trace: &str) -> Vec<String> {
    trace
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// Runs `f` on a new thread bound to `cpu`, and gives back what it returns.
pub fn on_cpu<T: Send + 'static>(cpu: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity only
        // touch it and the calling thread's affinity.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0,
                "pin to cpu {cpu}"
            );
        }
        f()
    })
    .join()
    .unwrap()
}

/// The CPUs this thread may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, which sched_getaffinity fills; pid 0
    // is this thread; CPU_ISSET reads within the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}
