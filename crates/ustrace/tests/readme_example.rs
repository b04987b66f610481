//! The README's Rust program, built as a user would build it: copied verbatim from README.md
//! into a fresh crate that depends on ustrace by path (the README's own `Cargo.toml` line,
//! pointed at this checkout), built offline, run, and its output checked for the event it
//! records. If the README's example stops compiling or stops printing its trace, this fails.
//!
//! The crate builds in `target/readme-example` (a target dir of its own: the one `cargo test`
//! holds is locked while tests run), so only the first run compiles ustrace's dependencies.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The body of the first fenced block with `lang` after `heading`.
fn fenced_block(readme: &str, heading: &str, lang: &str) -> String {
    let section = &readme[readme
        .find(heading)
        .unwrap_or_else(|| panic!("README.md has no `{heading}`"))..];
    let fence = format!("```{lang}\n");
    let start = section
        .find(&fence)
        .unwrap_or_else(|| panic!("no ```{lang} block after `{heading}` in README.md"))
        + fence.len();
    let len = section[start..]
        .find("```\n")
        .expect("unterminated code block in README.md");
    section[start..start + len].to_string()
}

/// The README's dependency line with its path replaced by this checkout's `crates/ustrace`.
fn dependency_line(toml: &str, crate_dir: &Path) -> String {
    let line = toml
        .lines()
        .find(|l| l.trim_start().starts_with("ustrace ="))
        .expect("the README's Cargo.toml block has no `ustrace = ...` line");
    let start = line
        .find("path = \"")
        .expect("the README's dependency is not a path dependency")
        + "path = \"".len();
    let end = start + line[start..].find('"').expect("unterminated path");
    format!("{}{}{}", &line[..start], crate_dir.display(), &line[end..])
}

/// Waits for `child` at most `limit`, killing it after. Its pipes are drained on threads of
/// their own, so a chatty child cannot fill one and stall.
fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    }
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

#[test]
fn readme_rust_example_builds_runs_and_reads_its_event() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let heading = "## Use it in a Rust program";
    let program = fenced_block(&readme, heading, "rust");
    let toml = fenced_block(&readme, heading, "toml");
    let crate_dir = root.join("crates/ustrace").canonicalize().unwrap();

    let target = root.join("target/readme-example");
    let project = target.join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::write(
        project.join("Cargo.toml"),
        format!(
            "[package]\nname = \"readme-example\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
             publish = false\n\n[dependencies]\n{}\n\n[workspace]\n",
            dependency_line(&toml, &crate_dir)
        ),
    )
    .unwrap();
    std::fs::write(project.join("src/main.rs"), &program).unwrap();
    // The workspace's lock file, so the offline build picks the versions already in the
    // local registry cache; cargo drops the entries this crate does not use.
    std::fs::copy(root.join("Cargo.lock"), project.join("Cargo.lock")).unwrap();

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let build = Command::new(&cargo)
        .args(["build", "--offline", "--quiet", "--manifest-path"])
        .arg(project.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target.join("build"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cargo");
    let built = wait_bounded(
        build,
        Duration::from_secs(900),
        "cargo build of the README example",
    );
    assert!(
        built.status.success(),
        "the README's Rust example does not build:\n{}\n--- program ---\n{program}",
        String::from_utf8_lossy(&built.stderr)
    );

    let run = Command::new(target.join("build/debug/readme-example"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the README example");
    let ran = wait_bounded(run, Duration::from_secs(60), "the README example");
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "the README example failed ({}):\n{stdout}\n{}",
        ran.status,
        String::from_utf8_lossy(&ran.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with(": get: key=alpha hit=1 latency_ns=1200")),
        "the README example's output lacks its `kv:get` event for alpha:\n{stdout}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with(": get: key=beta hit=0 latency_ns=1200")),
        "the README example's output lacks its `kv:get` event for beta:\n{stdout}"
    );
    println!("the README example printed:\n{stdout}");
}
