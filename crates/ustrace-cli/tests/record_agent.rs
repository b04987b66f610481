//! The preload agent leaves its target's behaviour alone: a C daemon that inspects its
//! signals, fds and environment, forks, execs, handles signals, double-forks into the
//! background, closes every fd and `chdir`s to `/` prints the same script with and without
//! the agent (and under `ustrace record`); and a program that links ustrace and is also
//! preloaded has one ustrace.

mod record_common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use record_common::*;

const DAEMON: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t handled, on_main;

static void on_usr1(int sig) {
    (void)sig;
    handled++;
    if (syscall(SYS_gettid) == getpid()) on_main++;
}

__attribute__((noinline)) int step(int i) { return i + 1; }

static void disposition(FILE *out, int sig, const char *name) {
    struct sigaction sa;
    sigaction(sig, NULL, &sa);
    fprintf(out, "%s: %s\n", name,
            sa.sa_handler == SIG_DFL ? "default" : sa.sa_handler == SIG_IGN ? "ignored" : "handled");
}

static void low_fds(FILE *out) {
    /* The fds a program counts as its own: the agent's sit far above. */
    DIR *d = opendir("/proc/self/fd");
    int own = dirfd(d), n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] != '.' && fd != own && fd < 100) n++;
    }
    closedir(d);
    fprintf(out, "fds below 100: %d\n", n);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("start\n");
    disposition(stdout, SIGINT, "SIGINT");
    disposition(stdout, SIGTERM, "SIGTERM");
    disposition(stdout, SIGHUP, "SIGHUP");
    disposition(stdout, SIGUSR1, "SIGUSR1");
    sigset_t mask;
    sigprocmask(SIG_BLOCK, NULL, &mask);
    printf("blocked at start: %d\n", sigismember(&mask, SIGUSR1) + sigismember(&mask, SIGTERM));
    low_fds(stdout);
    int fd = open("/dev/null", O_RDONLY);
    printf("first free fd: %d\n", fd);
    close(fd);
    printf("LD_PRELOAD: %s\n", getenv("LD_PRELOAD") ? "set" : "unset");
    printf("USTRACE_SETUP: %s\n", getenv("USTRACE_SETUP") ? "set" : "unset");

    signal(SIGUSR1, on_usr1);
    for (int i = 0; i < 200; i++) {
        kill(getpid(), SIGUSR1);
        step(i);
    }
    printf("usr1 handled %d times, on the main thread %d times\n", handled, on_main);

    pid_t c = fork();
    if (c == 0) {
        printf("child: step %d\n", step(41));
        _exit(7);
    }
    int st;
    waitpid(c, &st, 0);
    printf("child exited %d\n", WEXITSTATUS(st));

    c = fork();
    if (c == 0) {
        execl("/bin/sh", "sh", "-c", "echo exec: preload=${LD_PRELOAD:-none} setup=${USTRACE_SETUP:-none}", (char *)0);
        _exit(127);
    }
    waitpid(c, &st, 0);
    printf("exec exited %d\n", WEXITSTATUS(st));

    /* Into the background, as daemons do. */
    c = fork();
    if (c > 0) {
        waitpid(c, &st, 0);
        printf("parent done\n");
        return 0;
    }
    setsid();
    if (fork() > 0) _exit(0);
    if (chdir("/") != 0) _exit(1);
    for (int f = 3; f < 4096; f++) close(f);
    int out_fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FILE *out = fdopen(out_fd, "w");
    setvbuf(out, NULL, _IONBF, 0);
    fprintf(out, "daemon fd: %d\n", out_fd);
    low_fds(out);
    int sum = 0;
    for (int i = 0; i < 1000; i++) sum += step(i);
    fprintf(out, "daemon sum: %d\n", sum);
    handled = on_main = 0;
    for (int i = 0; i < 50; i++) kill(getpid(), SIGUSR1);
    fprintf(out, "daemon usr1 %d/%d\n", handled, on_main);
    char cwd[64];
    fprintf(out, "daemon cwd: %s\n", getcwd(cwd, sizeof cwd));
    fprintf(out, "daemon done\n");
    return 0;
}
"#;

const EXPECTED_MAIN: &str = "\
start
SIGINT: default
SIGTERM: default
SIGHUP: default
SIGUSR1: default
blocked at start: 0
fds below 100: 3
first free fd: 3
LD_PRELOAD: unset
USTRACE_SETUP: unset
usr1 handled 200 times, on the main thread 200 times
child: step 42
child exited 7
exec: preload=none setup=none
exec exited 0
parent done
";

const EXPECTED_DAEMON: &str = "\
daemon fd: 3
fds below 100: 4
daemon sum: 500500
daemon usr1 50/50
daemon cwd: /
daemon done
";

/// Runs the daemon; its stdout and what its background part wrote.
fn run(mut cmd: Command, daemon_out: &Path) -> (String, String, String) {
    use std::os::unix::process::CommandExt;
    let _ = std::fs::remove_file(daemon_out);
    // SAFETY: close_range is async-signal-safe. The daemon counts its fds: only 0, 1 and
    // 2 are given, whatever the test runner left open without close-on-exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let start = Instant::now();
    let written = loop {
        let text = std::fs::read_to_string(daemon_out).unwrap_or_default();
        if text.ends_with("daemon done\n") {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the daemon did not finish: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        written,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_daemon_behaves_the_same_with_and_without_the_agent() {
    let Some(env) = Env::new("daemon") else {
        return;
    };
    let prog = env.cc("daemon", DAEMON);
    let daemon_out = env.dir.join("daemon.out");

    let mut plain = Command::new(&prog);
    plain.arg(&daemon_out).env_remove("LD_PRELOAD");
    let without = run(plain, &daemon_out);
    assert_eq!(
        without.0, EXPECTED_MAIN,
        "the script itself, without the agent"
    );
    assert_eq!(without.1, EXPECTED_DAEMON);

    let mut preloaded = Command::new(&prog);
    preloaded.arg(&daemon_out).env("LD_PRELOAD", &env.agent);
    let with = run(preloaded, &daemon_out);
    assert_eq!(with, without, "preloaded: (stdout, daemon file, stderr)");

    let mut recorded = env.record();
    recorded
        .args(["-q", "-F", "step", "-o"])
        .arg(env.dir.join("daemon.dat"))
        .arg("--")
        .arg(&prog)
        .arg(&daemon_out);
    let under_record = run(recorded, &daemon_out);
    assert_eq!(under_record, without, "under ustrace record");
    // And the probes did fire in the recorded process before it went into the background.
    let reader = ustrace_tracedat::Reader::open(&env.dir.join("daemon.dat")).unwrap();
    let steps = reader
        .events()
        .filter(|e| e.as_ref().unwrap().name == "step__entry")
        .count();
    assert!(steps >= 200, "{steps} step() entries recorded");
}

/// The ustrace roots a process has open.
fn roots(pid: u32) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        // Only shared-memory files: reading a pipe or socket of the process would block.
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        let t = target.to_string_lossy();
        if !(t.starts_with("/dev/shm/") || t.starts_with("/memfd:")) {
            continue;
        }
        let mut magic = [0u8; 8];
        let ok = std::fs::File::open(e.path())
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok();
        if ok && &magic == b"USTRROOT" {
            n += 1;
        }
    }
    n
}

fn serving_fixture(preload: Option<&Path>) -> (std::process::Child, u32) {
    let fixture = env!("CARGO_BIN_EXE_ustrace-ftrace-fixture");
    let mut cmd = Command::new(fixture);
    cmd.stderr(std::process::Stdio::null());
    match preload {
        Some(agent) => cmd.env("LD_PRELOAD", agent),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let start = Instant::now();
    while ustrace_ctl_socket(pid).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the fixture never served"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let it trace a little, so every buffer it will make exists.
    std::thread::sleep(Duration::from_millis(300));
    (child, pid)
}

fn ustrace_ctl_socket(pid: u32) -> Option<String> {
    let out = Command::new(ustrace())
        .args(["ps", "--sockets"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
        .map(str::to_string)
}

#[test]
fn a_program_that_links_ustrace_and_is_preloaded_has_one_ustrace() {
    let Some(env) = Env::new("one") else { return };
    let (mut alone, pid) = serving_fixture(None);
    let roots_alone = roots(pid);
    let _ = alone.kill();
    let _ = alone.wait();

    let (mut both, pid) = serving_fixture(Some(&env.agent));
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("libustrace_agent.so"), "the agent is loaded");
    // The program's own copy serves (its events are there) and the agent's made nothing.
    let events = Command::new(ustrace())
        .args(["cat", "-p", &pid.to_string(), "available_events"])
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&events.stdout);
    let roots_both = roots(pid);
    let alive = both.try_wait().unwrap().is_none();
    let _ = both.kill();
    let _ = both.wait();
    assert!(
        alive,
        "the fixture (whose serve() fails if the socket is taken) kept running"
    );
    assert!(events.contains("sched:sched_switch"), "{events}");
    assert!(roots_alone >= 1);
    assert_eq!(roots_both, roots_alone, "one set of buffers, not two");
}
