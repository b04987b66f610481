//! The traced program of `scripts/ftrace-selftests.sh`: it declares events with the names
//! and fields of the kernel events that the kernel's ftrace selftests use (`sched`, `kmem`,
//! `syscalls`), fires them from a thread of its own while it runs, and serves its tracefs.
//!
//! The kernel fires those events on its own all the time, and the selftests count on it
//! (enable `sched_switch`, sleep, expect records). In user space only this process can fire
//! its events, so a thread does work of the same kind — it switches away (sleeps), opens a
//! file, allocates and frees — and records each step as the kernel would. The values are
//! the thread's own (its tid and comm, the address of the code that freed, the path it
//! opened); none is chosen to please a test. Functions the tests probe by their kernel
//! names (`kernel_clone`) are the fixture's own functions that do that work. Runs until
//! killed.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use ustrace::FixedStr;

ustrace::trace_event! {
    /// The worker thread goes to sleep and another task (the idle task) runs.
    pub fn sched::sched_switch(prev: (&str, i32), next: (&str, i32)) {
        prev_comm: FixedStr<16> = FixedStr::new(prev.0),
        prev_pid: i32 = prev.1,
        prev_prio: i32 = 120,
        prev_state: i64 = 1,
        next_comm: FixedStr<16> = FixedStr::new(next.0),
        next_pid: i32 = next.1,
        next_prio: i32 = 120,
    }
    print "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%ld ==> next_comm=%s next_pid=%d next_prio=%d",
        prev_comm, prev_pid, prev_prio, prev_state, next_comm, next_pid, next_prio;
}

ustrace::trace_event! {
    /// The worker thread is woken after its sleep.
    pub fn sched::sched_waking(comm: &str, pid: i32, cpu: i32) {
        comm: FixedStr<16> = FixedStr::new(comm),
        pid: i32 = pid,
        prio: i32 = 120,
        target_cpu: i32 = cpu,
    }
    print "comm=%s pid=%d prio=%d target_cpu=%03d", comm, pid, prio, target_cpu;
}

ustrace::trace_event! {
    /// The woken worker is back on a run queue.
    pub fn sched::sched_wakeup(comm: &str, pid: i32, cpu: i32) {
        comm: FixedStr<16> = FixedStr::new(comm),
        pid: i32 = pid,
        prio: i32 = 120,
        target_cpu: i32 = cpu,
    }
    print "comm=%s pid=%d prio=%d target_cpu=%03d", comm, pid, prio, target_cpu;
}

ustrace::trace_event! {
    /// A process on the machine exited (from the proc connector, as the forks).
    pub fn sched::sched_process_exit(comm: &str, pid: i32) {
        comm: FixedStr<16> = FixedStr::new(comm),
        pid: i32 = pid,
        prio: i32 = 120,
    }
    print "comm=%s pid=%d prio=%d", comm, pid, prio;
}

ustrace::trace_event! {
    /// The worker started a helper thread.
    pub fn sched::sched_process_fork(parent: (&str, i32), child: (&str, i32)) {
        parent_comm: FixedStr<16> = FixedStr::new(parent.0),
        parent_pid: i32 = parent.1,
        child_comm: FixedStr<16> = FixedStr::new(child.0),
        child_pid: i32 = child.1,
    }
    print "comm=%s pid=%d child_comm=%s child_pid=%d", parent_comm, parent_pid, child_comm, child_pid;
}

ustrace::trace_event! {
    /// A buffer was allocated.
    pub fn kmem::kmalloc(call_site: u64, ptr: u64, bytes_req: u64, bytes_alloc: u64) {
        call_site: u64 = call_site,
        ptr: u64 = ptr,
        bytes_req: u64 = bytes_req,
        bytes_alloc: u64 = bytes_alloc,
        gfp_flags: u64 = 0xcc0,
        node: i32 = -1,
    }
    print "call_site=%pS ptr=%p bytes_req=%lu bytes_alloc=%lu gfp_flags=0x%lx node=%d",
        call_site, ptr, bytes_req, bytes_alloc, gfp_flags, node;
}

ustrace::trace_event! {
    /// A buffer was taken from a cache.
    pub fn kmem::kmem_cache_alloc(call_site: u64, ptr: u64, bytes_req: u64, bytes_alloc: u64) {
        call_site: u64 = call_site,
        ptr: u64 = ptr,
        bytes_req: u64 = bytes_req,
        bytes_alloc: u64 = bytes_alloc,
        gfp_flags: u64 = 0xcc0,
        node: i32 = -1,
        accounted: bool = false,
    }
    print "call_site=%pS ptr=%p bytes_req=%lu bytes_alloc=%lu gfp_flags=0x%lx node=%d accounted=%d",
        call_site, ptr, bytes_req, bytes_alloc, gfp_flags, node, accounted;
}

ustrace::trace_event! {
    /// A buffer goes back (the kernel's `kmem:kfree`).
    pub fn kmem::kfree(call_site: u64, ptr: u64) as kfree_event {
        call_site: u64 = call_site,
        ptr: u64 = ptr,
    }
    print "call_site=%pS ptr=%p", call_site, ptr;
}

ustrace::trace_event! {
    /// A buffer was freed.
    pub fn kmem::kmem_cache_free(call_site: u64, ptr: u64, name: &str) {
        call_site: u64 = call_site,
        ptr: u64 = ptr,
        name: &str = name,
    }
    print "call_site=%pS ptr=%p name=%s", call_site, ptr, name;
}

ustrace::trace_event! {
    /// The worker calls openat(2).
    pub fn syscalls::sys_enter_openat(dfd: i64, filename: u64, flags: i64) {
        __syscall_nr: i32 = libc::SYS_openat as i32,
        dfd: i64 = dfd,
        filename: u64 = filename,
        flags: i64 = flags,
        mode: i64 = 0,
    }
    print "dfd: 0x%08lx, filename: 0x%08lx, flags: 0x%08lx, mode: 0x%08lx",
        dfd, filename, flags, mode;
}

ustrace::trace_event! {
    /// The worker calls chdir(2).
    pub fn syscalls::sys_enter_chdir(filename: u64) {
        __syscall_nr: i32 = libc::SYS_chdir as i32,
        filename: u64 = filename,
    }
    print "filename: 0x%08lx", filename;
}

ustrace::trace_event! {
    /// The worker sends itself a signal (SIGURG, ignored by default).
    pub fn signal::signal_generate(sig: i32, comm: &str, pid: i32, result: i32) {
        sig: i32 = sig,
        errno: i32 = 0,
        code: i32 = -6,
        comm: FixedStr<16> = FixedStr::new(comm),
        pid: i32 = pid,
        group: i32 = 0,
        result: i32 = result,
    }
    print "sig=%d errno=%d code=%d comm=%s pid=%d grp=%d res=%d",
        sig, errno, code, comm, pid, group, result;
}

fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

fn cpu() -> i32 {
    // SAFETY: sched_getcpu has no preconditions.
    unsafe { libc::sched_getcpu() }
}

/// Frees a buffer and records where from: the `call_site` is this function, as the
/// kernel's is the function that called `kmem_cache_free`.
#[inline(never)]
fn fixture_release(buf: Vec<u8>) {
    let ptr = buf.as_ptr() as u64;
    let site = fixture_release as fn(Vec<u8>) as usize as u64;
    kfree_event::trace(site, ptr);
    kfree(Box::into_raw(Box::new(buf)));
    kmem_cache_free::trace(site, ptr, "fixture_buf");
}

/// The fixture's free, named as the kernel's, so that `f:` probes on `kfree` in the
/// selftests find it (with its one parameter, as the kernel's `kfree(const void *object)`).
#[no_mangle]
#[inline(never)]
extern "C" fn kfree(object: *mut Vec<u8>) {
    if !object.is_null() {
        // SAFETY: every caller passes a pointer from Box::into_raw, freed only here.
        drop(unsafe { Box::from_raw(object) });
    }
}

/// Where the fixture's allocations are recorded from: a C name, as the kernel's call
/// sites are, so that `.sym` keys print a plain identifier (the selftests grep for
/// `[_a-zA-Z]*`, which a Rust path with `::` is not).
#[no_mangle]
#[inline(never)]
extern "C" fn fixture_kmalloc_site(len: usize) -> usize {
    std::hint::black_box(len)
}

/// Allocates a buffer and records it; the call site is inside [`fixture_kmalloc_site`].
#[inline(never)]
fn fixture_alloc(len: usize) -> Vec<u8> {
    let buf = vec![0u8; fixture_kmalloc_site(len)];
    // An address inside the function, as a return address would be: `.sym-offset` shows +0x1.
    let site = fixture_kmalloc_site as extern "C" fn(usize) -> usize as usize as u64 + 1;
    let (ptr, cap) = (buf.as_ptr() as u64, buf.capacity() as u64);
    kmalloc::trace(site, ptr, len as u64, cap);
    kmem_cache_alloc::trace(site, ptr, len as u64, cap);
    buf
}

/// The fixture's fork, named as the kernel's, so that `f:` probes on `kernel_clone` in the
/// selftests find it: called for each fork the proc connector reports (`reported`, the
/// child's pid, is returned as the kernel returns the new pid), or, without the connector,
/// for a fork of the fixture's own: a thread that only reports its tid, waited for.
#[no_mangle]
#[inline(never)]
pub extern "C" fn kernel_clone(flags: u64, reported: i32) -> i32 {
    std::hint::black_box(flags);
    if reported != 0 {
        return reported;
    }
    let child = std::thread::Builder::new()
        .name("fixture-child".into())
        .spawn(tid)
        .expect("spawn");
    child.join().unwrap_or(0)
}

/// An open file as the fixture's `vfs_read` sees it (shaped like a small kernel `struct
/// file`: the selftests probe `vfs_read` and name its `file` parameter and members).
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct file {
    f_mode: u32,
    f_flags: u32,
    f_fd: i32,
}

/// Opens `path` into `f`: the fixture's open, named as the kernel's, so that `f:` probes on
/// `vfs_open` (entry and return, `$arg1` at both) in the selftests find it. Returns 0 or
/// -errno, as the kernel's does.
#[no_mangle]
#[inline(never)]
extern "C" fn vfs_open(path: *const libc::c_char, f: *mut file) -> i32 {
    // SAFETY: the only caller passes a NUL-terminated path and a live `file`.
    unsafe {
        let fd = libc::openat(libc::AT_FDCWD, path, (*f).f_flags as i32);
        if fd < 0 {
            return -*libc::__errno_location();
        }
        (*f).f_fd = fd;
        0
    }
}

/// Reads from an open file: the fixture's read, named as the kernel's, so that `f:` probes
/// on `vfs_read` (and on its parameters by name) in the selftests find it.
#[no_mangle]
#[inline(never)]
extern "C" fn vfs_read(file: *const file, buf: *mut u8, count: usize, pos: *mut i64) -> isize {
    // SAFETY: the only caller passes a live `file`, a buffer of `count` bytes and a position.
    unsafe {
        let n = libc::pread((*file).f_fd, buf.cast(), count, (*pos) as libc::off_t);
        if n > 0 {
            *pos += n as i64;
        }
        n as isize
    }
}

/// The kernel's `schedule`: the worker switches away (sleeps) and records it. The function
/// tests put commands on it (`schedule:traceoff`, `schedule:enable_event:...`) and expect it
/// to be hit all the time, as the kernel's is.
#[no_mangle]
#[inline(never)]
extern "C" fn schedule(name: *const libc::c_char, me: i32) {
    // SAFETY: the caller passes a NUL-terminated name that outlives the call.
    let name = unsafe { std::ffi::CStr::from_ptr(name) }
        .to_str()
        .unwrap_or("?");
    sched_switch::trace((name, me), ("swapper", 0));
    std::thread::sleep(Duration::from_micros(200));
}

fn work() {
    let name = "fixture-work";
    let c_name = CString::new(name).unwrap_or_default();
    let me = tid();
    let cwd = CString::new(
        std::env::current_dir()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/".into()),
    )
    .unwrap_or_default();
    let stat = CString::new("/proc/self/stat").unwrap();
    // The kernel's events come from every CPU all the time; a test sleeps a millisecond and
    // expects some. The lowest real-time priority keeps this loop's 200 µs rounds going on a
    // busy machine (its rounds are short; best effort without the privilege).
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: plain syscall on this thread with a valid sched_param.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    let mut round: u64 = 0;
    loop {
        round += 1;
        schedule(c_name.as_ptr(), me);
        sched_waking::trace(name, me, cpu());
        sched_wakeup::trace(name, me, cpu());

        let buf = fixture_alloc(64 + (round % 8) as usize * 32);
        fixture_release(buf);

        sys_enter_openat::trace(
            libc::AT_FDCWD as i64,
            stat.as_ptr() as u64,
            libc::O_RDONLY as i64,
        );
        let mut f = file {
            f_mode: 1,
            f_flags: libc::O_RDONLY as u32,
            f_fd: -1,
        };
        if vfs_open(stat.as_ptr(), &mut f) == 0 {
            let fd = f.f_fd;
            let (mut buf, mut pos) = ([0u8; 64], 0i64);
            vfs_read(&f, buf.as_mut_ptr(), buf.len(), &mut pos);
            // SAFETY: fd was just opened by this thread.
            unsafe { libc::close(fd) };
        }
        sys_enter_chdir::trace(cwd.as_ptr() as u64);
        // SAFETY: a NUL-terminated path; changing to the current directory changes nothing.
        unsafe { libc::chdir(cwd.as_ptr()) };

        if signal_generate::enabled() {
            // SAFETY: a signal whose default action is to ignore it, to this thread.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), me, libc::SIGURG) };
            signal_generate::trace(libc::SIGURG, name, me, r as i32);
        }
        // Forks of the machine's processes come from the proc connector thread when it runs.
        // Without it, the fixture forks now and then (for probes on kernel_clone), and every
        // round while sched_process_fork is on. With it, the fixture does not: a fork of its
        // own at any time would change a histogram between two reads of a selftest.
        if !CONNECTOR.load(Ordering::Relaxed)
            && (round.is_multiple_of(64) || sched_process_fork::enabled())
        {
            let child_tid = kernel_clone(libc::SIGCHLD as u64, 0);
            sched_process_fork::trace((name, me), ("fixture-child", child_tid));
        }
    }
}

/// Whether the proc connector reports the machine's forks (then the worker does not).
static CONNECTOR: AtomicBool = AtomicBool::new(false);

fn comm_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default()
}

/// Records `sched_process_fork` (and `sched_process_exit`) for every fork (exit) on the machine as the kernel reports it
/// through the proc connector (netlink, needs CAP_NET_ADMIN): the selftests fork a subshell
/// and read the trigger's effect right after, which only a report of their own fork makes
/// certain. Returns when the connector cannot be had, and the worker's forks stand in.
fn proc_connector() {
    const NETLINK_CONNECTOR: i32 = 11;
    const CN_IDX_PROC: u32 = 1;
    const CN_VAL_PROC: u32 = 1;
    const PROC_CN_MCAST_LISTEN: u32 = 1;
    const PROC_EVENT_FORK: u32 = 1;
    const PROC_EVENT_EXIT: u32 = 0x8000_0000;
    const NLMSG_HDR: usize = 16;
    const CN_MSG: usize = 20;
    // SAFETY: plain socket creation; the fd is owned by this function.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM, NETLINK_CONNECTOR) };
    if fd < 0 {
        return;
    }
    // SAFETY: sockaddr_nl is plain data; zero is a valid start.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = CN_IDX_PROC;
    // SAFETY: addr is a sockaddr_nl of the size given.
    let bound = unsafe {
        libc::bind(
            fd,
            &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    // The listen request: nlmsghdr, cn_msg (idx, val, seq, ack, len, flags), the op.
    let total = NLMSG_HDR + CN_MSG + 4;
    let mut msg = Vec::with_capacity(total);
    msg.extend_from_slice(&(total as u32).to_ne_bytes());
    msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&std::process::id().to_ne_bytes());
    for word in [CN_IDX_PROC, CN_VAL_PROC, 0, 0] {
        msg.extend_from_slice(&word.to_ne_bytes());
    }
    msg.extend_from_slice(&4u16.to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    // SAFETY: msg is an initialised buffer of msg.len() bytes.
    let sent = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) };
    if bound < 0 || sent < 0 {
        // SAFETY: fd is ours and not used after.
        unsafe { libc::close(fd) };
        return;
    }
    CONNECTOR.store(true, Ordering::Relaxed);
    // The kernel records a fork inside fork(2); this thread learns of it after a wakeup. A
    // real-time priority (the lowest) keeps that wakeup ahead of the machine's other work,
    // so the fork is recorded before the shell that forked reads the trace. One above the
    // worker's, so that a worker round in progress does not hold it back. Best effort.
    let param = libc::sched_param { sched_priority: 2 };
    // SAFETY: plain syscall on this thread with a valid sched_param.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: buf is writable for its whole length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        let Some(event) = usize::try_from(n)
            .ok()
            .and_then(|n| buf.get(NLMSG_HDR + CN_MSG..n))
        else {
            continue;
        };
        let word = |i: usize| -> u32 {
            event
                .get(i * 4..i * 4 + 4)
                .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
                .unwrap_or(0)
        };
        // proc_event: what, cpu, timestamp (2 words), then for a fork parent_pid,
        // parent_tgid, child_pid, child_tgid.
        if event.len() < 32 {
            continue;
        }
        // The fixture's own threads are left out: the worker records its own forks already,
        // and a second, later report of them could change a histogram between two reads
        // that the selftests expect to match.
        // A thread's fork names the process's parent as its parent: the child's tgid (word
        // 7) says it is ours. An exit names its own tgid (word 5).
        let me = std::process::id();
        let own = if word(0) == PROC_EVENT_FORK {
            word(7) == me
        } else {
            word(5) == me
        };
        if word(0) == PROC_EVENT_EXIT {
            // exit: process_pid, process_tgid, exit_code, exit_signal, ...
            let pid = word(4) as i32;
            if own {
                continue;
            }
            if sched_process_exit::enabled() {
                sched_process_exit::trace(&comm_of(pid), pid);
            }
            continue;
        }
        // fork: parent_pid, parent_tgid, child_pid, child_tgid.
        if word(0) != PROC_EVENT_FORK || own {
            continue;
        }
        let (parent, child) = (word(4) as i32, word(6) as i32);
        kernel_clone(libc::SIGCHLD as u64, child);
        if sched_process_fork::enabled() {
            let (pc, cc) = (comm_of(parent), comm_of(child));
            sched_process_fork::trace((&pc, parent), (&cc, child));
        }
    }
}

fn main() {
    std::thread::Builder::new()
        .name("fixture-forks".into())
        .spawn(proc_connector)
        .expect("spawn the proc connector thread");
    let socket = ustrace::serve().expect("serve the tracefs");
    eprintln!("ftrace fixture: serving on {}", socket.display());
    std::thread::Builder::new()
        .name("fixture-work".into())
        .spawn(work)
        .expect("spawn the worker");
    loop {
        std::thread::park();
    }
}
