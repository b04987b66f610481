//! A thread stopped (here by ptrace) between two instructions of a prologue while that
//! prologue is patched (issue 21 #9). The patch does not wait for it (a stopped thread cannot
//! answer the rendezvous); when the thread resumes, the kernel first runs the pending
//! rendezvous handler, which must still move it to the relocated copy of the prologue.
//!
//! The test process (tracer) runs this binary again as a child (tracee). The child spins
//! calling `stopped_target`; the tracer stops that thread, single-steps it until its rip is
//! the second instruction of `stopped_target`, lets the child patch the function, then
//! detaches. Before the fix the rendezvous plan was unpublished at the end of the round, the
//! late handler did nothing, and the thread ran into the middle of the new `jmp`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ustrace_fprobe::{EntryAction, Fprobe};

const CHILD: &str = "USTRACE_FPROBE_STOPPED_THREAD_CHILD";

// mov eax, edi (2 bytes) | add eax, 1 (3 bytes): the 5-byte patch covers both, so +2 is an
// instruction boundary strictly inside the patched bytes.
std::arch::global_asm!(
    ".globl stopped_target",
    ".type stopped_target,@function",
    "stopped_target:",
    "mov eax, edi",
    "add eax, 1",
    "add eax, 2",
    "ret",
    ".size stopped_target, . - stopped_target",
);

extern "C" {
    fn stopped_target(x: u32) -> u32;
}

static CALLS: AtomicU64 = AtomicU64::new(0);
static HITS: AtomicU64 = AtomicU64::new(0);

/// One line to the tracer, written straight to fd 1 (no test-harness capture, no buffering).
fn say(line: &str) {
    let l = format!("{line}\n");
    // SAFETY: writing a valid buffer to stdout.
    unsafe { libc::write(1, l.as_ptr().cast(), l.len()) };
}

fn child() {
    let spinner = std::thread::spawn(|| {
        // SAFETY: gettid has no arguments.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        say(&format!(
            "tid {tid} {:#x}",
            stopped_target as *const () as usize
        ));
        let mut x = 0u32;
        loop {
            x = x.wrapping_add(1) & 0xffff;
            // SAFETY: a plain function taking and returning u32.
            let r = unsafe { stopped_target(x) };
            assert_eq!(r, x + 3, "stopped_target({x})");
            CALLS.fetch_add(1, Ordering::Relaxed);
        }
    });
    let stdin = std::io::stdin();
    let mut line = String::new();
    stdin.lock().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "patch");
    let fp = Fprobe::builder()
        .entry_handler(|_, _, _, _, _| {
            HITS.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .register_syms(&["stopped_target"])
        .expect("register while a thread is stopped inside the prologue");
    say("patched");
    line.clear();
    stdin.lock().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "resumed");
    let calls = CALLS.load(Ordering::Relaxed);
    let t = Instant::now();
    while (CALLS.load(Ordering::Relaxed) < calls + 1000 || HITS.load(Ordering::Relaxed) == 0)
        && t.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!spinner.is_finished(), "the spinner died");
    assert!(HITS.load(Ordering::Relaxed) > 0, "no hit after resuming");
    assert!(
        ustrace_fprobe::stats().moved_threads >= 1,
        "the stopped thread was not moved"
    );
    drop(fp);
    say("ok");
    std::process::exit(0);
}

fn ptrace(req: libc::c_uint, tid: i32, data: usize) -> libc::c_long {
    // SAFETY: requests on a thread of our own child; `data` is a value or a valid pointer.
    unsafe { libc::ptrace(req, tid, 0usize, data) }
}

fn wait_stop(tid: i32) {
    let mut status = 0;
    // SAFETY: waiting for a traced thread of our child.
    let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
    assert_eq!(r, tid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(libc::WIFSTOPPED(status), "tracee not stopped: {status:#x}");
}

#[test]
fn thread_stopped_inside_a_prologue_being_patched_is_moved_when_it_resumes() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let mut proc = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "thread_stopped_inside_a_prologue_being_patched_is_moved_when_it_resumes",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let mut to_child = proc.stdin.take().unwrap();
    let mut from_child = BufReader::new(proc.stdout.take().unwrap());
    let mut next_line = |want: &str| -> String {
        loop {
            let mut l = String::new();
            if from_child.read_line(&mut l).unwrap() == 0 {
                return String::new();
            }
            // libtest prints "test NAME ... " without a newline before the child speaks.
            if let Some(i) = l.find(want) {
                return l[i..].trim().to_string();
            }
        }
    };
    // The child is another process: its own load address, as it reports it.
    let line = next_line("tid ");
    let mut words = line.split_whitespace().skip(1);
    let tid: i32 = words.next().unwrap().parse().unwrap();
    let target = usize::from_str_radix(words.next().unwrap().trim_start_matches("0x"), 16).unwrap();

    if ptrace(libc::PTRACE_SEIZE, tid, 0) != 0 {
        println!("skipped: ptrace: {}", std::io::Error::last_os_error());
        let _ = proc.kill();
        let _ = proc.wait();
        return;
    }
    assert_eq!(ptrace(libc::PTRACE_INTERRUPT, tid, 0), 0);
    wait_stop(tid);
    // Single-step until the thread stands at the second instruction of the prologue.
    let mut regs: libc::user_regs_struct =
        // SAFETY: plain integers.
        unsafe { std::mem::zeroed() };
    let mut steps = 0;
    loop {
        assert_eq!(
            ptrace(libc::PTRACE_GETREGS, tid, &mut regs as *mut _ as usize),
            0
        );
        if regs.rip as usize == target + 2 {
            break;
        }
        steps += 1;
        assert!(steps < 1_000_000, "never reached stopped_target+2");
        assert_eq!(ptrace(libc::PTRACE_SINGLESTEP, tid, 0), 0);
        wait_stop(tid);
    }
    writeln!(to_child, "patch").unwrap();
    let patched = next_line("patched");
    assert_eq!(patched, "patched", "the child could not patch");
    // The thread is still stopped at stopped_target+2, which now holds part of the jmp.
    assert_eq!(ptrace(libc::PTRACE_DETACH, tid, 0), 0);
    writeln!(to_child, "resumed").unwrap();
    let ok = next_line("ok");
    let status = proc.wait().unwrap();
    assert!(
        status.success() && ok == "ok",
        "the child failed after the stopped thread resumed: {status:?}"
    );
}
