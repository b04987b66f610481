//! What every CLI test that starts a child shares.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Gives a child the default action for every signal and an empty signal mask, whatever the
/// test process inherited: under `nohup` (SIGHUP ignored) or from a shell that ignores
/// SIGINT, a child would otherwise ignore the very signal a test stops it with, and the test
/// would wait for it to its deadline.
pub trait DefaultSignals {
    fn default_signals(&mut self) -> &mut Self;
}

impl DefaultSignals for Command {
    fn default_signals(&mut self) -> &mut Self {
        // SAFETY: the hook runs in the forked child before exec and makes only
        // async-signal-safe calls (signal, sigemptyset, sigprocmask) on stack data.
        unsafe {
            self.pre_exec(|| {
                for sig in 1..32 {
                    if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                        libc::signal(sig, libc::SIG_DFL);
                    }
                }
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
                Ok(())
            })
        }
    }
}

/// All a child wrote to its piped stderr (empty when it was not piped or was taken).
#[allow(dead_code)]
pub fn stderr_text(child: &mut std::process::Child) -> String {
    use std::io::Read;
    let mut err = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut err);
    }
    err
}
