//! CPU affinity for the tests that need events on a given CPU (kept out of `common`, which
//! a test that forbids `unsafe` includes).
#![allow(dead_code)]

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
