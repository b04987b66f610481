//! What the `record*` tests share: the agent built, C programs compiled, a scratch dir.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `ustrace` binary under test.
pub fn ustrace() -> &'static str {
    env!("CARGO_BIN_EXE_ustrace")
}

/// `libustrace_agent.so`, built by cargo in the same profile as `ustrace` (it is a cdylib,
/// which cargo does not build for a test on its own).
pub fn agent() -> Option<PathBuf> {
    static AGENT: OnceLock<Option<PathBuf>> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            let dir = Path::new(ustrace()).parent()?.to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-q", "-p", "ustrace-agent"]);
            if dir.ends_with("release") {
                cmd.arg("--release");
            }
            let status = cmd.current_dir(env!("CARGO_MANIFEST_DIR")).status().ok()?;
            assert!(status.success(), "cargo build -p ustrace-agent failed");
            let so = dir.join("libustrace_agent.so");
            so.is_file().then_some(so)
        })
        .clone()
}

/// A test's scratch directory and tools.
pub struct Env {
    pub dir: PathBuf,
    pub agent: PathBuf,
}

impl Env {
    /// `None` (after printing why) when the machine cannot run the test.
    pub fn new(name: &str) -> Option<Env> {
        if Command::new("cc").arg("--version").output().is_err() {
            println!("skipped: no C compiler (cc)");
            return None;
        }
        let Some(agent) = agent() else {
            println!("skipped: libustrace_agent.so could not be built");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("ustrace-rec-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Some(Env { dir, agent })
    }

    /// Compiles `source` into the scratch dir.
    pub fn cc(&self, name: &str, source: &str) -> PathBuf {
        let src = self.dir.join(format!("{name}.c"));
        let exe = self.dir.join(name);
        std::fs::write(&src, source).unwrap();
        let out = Command::new("cc")
            // -O0: every function has a prologue long enough to patch.
            .args(["-O0", "-g", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cc {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    }

    /// `ustrace record --agent AGENT`, to be given the rest.
    pub fn record(&self) -> Command {
        let mut c = Command::new(ustrace());
        c.arg("record").arg("--agent").arg(&self.agent);
        c
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
