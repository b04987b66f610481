//! The recorder's data path: the target's ring buffers, mapped read-only out of its
//! `/proc/PID/fd`, drained page by page into the output file.
//!
//! The target does nothing for the recording: its writers fill their shared pages as
//! always, and this process copies each page once it is complete (`ShmReader::read_page`,
//! a copy and two checks, no decoding). The mappings keep the files alive, so when the
//! target dies — exit, signal, SIGKILL, crash — the pages it left are still here: the last
//! drain also takes the partly filled page of each CPU, up to what was committed. Events
//! lost to overwriting (a drain that fell behind) are counted in the page flags, as
//! `trace_pipe_raw` marks them, and in the summary.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ustrace_ctl::client::Client;
use ustrace_ringbuf::page::PAGE_SIZE;
use ustrace_ringbuf::ShmReader;

use super::sink::Sink;

/// How a recording reports.
pub struct Options {
    pub output: PathBuf,
    pub progress: bool,
    pub summary: bool,
}

/// When a recording ends.
pub enum Until<'a> {
    /// When our child exits (its status is returned).
    Child(&'a mut std::process::Child),
    /// When the process is gone, or on Ctrl-C.
    Gone,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_ctrl_c(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM end the recording (cleanly: the file is finished).
pub fn stop_on_ctrl_c() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installing a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_ctrl_c as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// One recording.
pub struct Session {
    pid: u32,
    client: Option<Client>,
    reader: ShmReader,
    sink: Sink,
    opts: OptionsCopy,
    started: Instant,
    pages: u64,
    bytes: u64,
    lost: u64,
    page: Box<[u8; PAGE_SIZE]>,
}

struct OptionsCopy {
    output: PathBuf,
    progress: bool,
    summary: bool,
}

/// The root file of the process's top-level buffer: the first (lowest fd) of its open
/// files that is a ustrace root (`docs/ring-buffer-shm.md`). The tracer makes the
/// top-level buffer before any other (the agent asks for it first thing).
pub fn find_root(pid: u32) -> Result<PathBuf, String> {
    let dir = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
    let mut fds: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    for fd in fds {
        let path = PathBuf::from(format!("{dir}/{fd}"));
        let Ok(target) = std::fs::read_link(&path) else {
            continue;
        };
        let t = target.to_string_lossy();
        if !(t.starts_with("/dev/shm/") || t.starts_with("/memfd:")) {
            continue;
        }
        let mut magic = [0u8; 8];
        let ok = std::fs::File::open(&path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok();
        if ok && u64::from_le_bytes(magic) == ustrace_ringbuf::shm::ROOT_MAGIC {
            return Ok(path);
        }
    }
    Err(format!(
        "process {pid} has no ustrace buffers open (nothing traced yet, or not a ustrace \
         process)"
    ))
}

impl Session {
    /// Maps the process's buffers and opens the output; the process must be alive.
    pub fn attach(pid: u32, mut client: Client, opts: &Options) -> Result<Session, String> {
        let root = find_root(pid)?;
        let reader =
            ShmReader::open(&root).map_err(|e| format!("cannot map {}: {e}", root.display()))?;
        let sink = Sink::create(&opts.output, &mut client, pid)?;
        Ok(Session {
            pid,
            client: Some(client),
            reader,
            sink,
            opts: OptionsCopy {
                output: opts.output.clone(),
                progress: opts.progress,
                summary: opts.summary,
            },
            started: Instant::now(),
            pages: 0,
            bytes: 0,
            lost: 0,
            page: Box::new([0u8; PAGE_SIZE]),
        })
    }

    /// Copies every page ready now (`last`: the partly filled ones too) to the file.
    fn drain(&mut self, last: bool) -> Result<u64, String> {
        let mut n = 0;
        for cpu in 0..self.reader.nr_cpus() {
            while let Some((_, lost)) = self.reader.read_page(cpu, &mut self.page, last) {
                self.sink
                    .push_page(cpu, &self.page[..])
                    .map_err(|e| format!("{}: {e}", self.opts.output.display()))?;
                self.lost += lost;
                self.pages += 1;
                self.bytes += PAGE_SIZE as u64;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Events the target wrote so far, and those it counted lost (refused or
    /// overwritten in its own buffers).
    fn counters(&self) -> (u64, u64) {
        let mut events = 0;
        for cpu in 0..self.reader.nr_cpus() {
            let (committed, ..) = self.reader.cpu_counters(cpu);
            events += committed;
        }
        (events, self.lost)
    }

    fn progress(&self) {
        let (events, lost) = self.counters();
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[Kustrace record: {events} events, {lost} lost, {} written, {}/s",
            human(self.bytes),
            human((self.bytes as f64 / secs) as u64)
        );
        let _ = err.flush();
    }

    /// Drains until the end `until` names; returns the child's status if there is one.
    pub fn run(&mut self, until: Until<'_>) -> Result<Option<std::process::ExitStatus>, String> {
        let mut last_progress = Instant::now();
        let mut last_meta = Instant::now();
        let mut child = match until {
            Until::Child(c) => Some(c),
            Until::Gone => None,
        };
        let status = loop {
            let n = self.drain(false)?;
            let ended = match child.as_deref_mut() {
                Some(c) => match c.try_wait() {
                    Ok(Some(s)) => Some(Some(s)),
                    Ok(None) => None,
                    Err(e) => return Err(format!("waiting for {}: {e}", self.pid)),
                },
                None => (!ustrace_ctl::discover::pid_alive(self.pid)).then_some(None),
            };
            if let Some(status) = ended {
                break status;
            }
            if STOP.load(Ordering::SeqCst) {
                break None;
            }
            if last_meta.elapsed() > Duration::from_millis(250) {
                // Buffers resized meanwhile have new region files; cmdlines grow.
                let _ = self.reader.refresh();
                if let Some(c) = self.client.as_mut() {
                    self.sink.refresh_meta(c);
                }
                last_meta = Instant::now();
            }
            if self.opts.progress && last_progress.elapsed() > Duration::from_millis(250) {
                self.progress();
                last_progress = Instant::now();
            }
            if n == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        // The target is gone (or we stop): what is left, partly filled pages included.
        self.drain(true)?;
        if status.is_none() {
            if let Some(c) = self.client.as_mut() {
                self.sink.refresh_meta(c);
            }
        }
        Ok(status)
    }

    /// Writes the counters and closes the file; prints the summary.
    pub fn finish(mut self, status: Option<String>) -> Result<(), String> {
        for cpu in 0..self.reader.nr_cpus() {
            let (committed, overrun, commit_overrun, dropped, read) = self.reader.cpu_counters(cpu);
            // The kernel's per_cpu/cpuN/stats lines that mean something here.
            let stats = format!(
                "entries: {}\noverrun: {overrun}\ncommit overrun: {commit_overrun}\n\
                 bytes: 0\noldest event ts: 0.000000\nnow ts: 0.000000\n\
                 dropped events: {dropped}\nread events: {read}\n",
                committed.saturating_sub(read)
            );
            self.sink.set_cpu_stats(cpu, stats);
        }
        let (events, lost) = self.counters();
        let events_in_file = self
            .sink
            .finish()
            .map_err(|e| format!("{}: {e}", self.opts.output.display()))?;
        if self.opts.progress {
            eprint!("\r\x1b[K");
        }
        if self.opts.summary {
            let secs = self.started.elapsed().as_secs_f64();
            eprintln!(
                "ustrace record: {} events in {} ({} pages, {}) from {} events written, \
                 {lost} lost, in {secs:.2} s{}",
                events_in_file.map_or("?".into(), |n| n.to_string()),
                self.opts.output.display(),
                self.pages,
                human(self.bytes),
                events,
                status
                    .map(|s| format!("; the target {s}"))
                    .unwrap_or_default()
            );
        }
        Ok(())
    }
}

fn human(bytes: u64) -> String {
    const K: f64 = 1024.0;
    let b = bytes as f64;
    if b >= K * K * K {
        format!("{:.1} GiB", b / (K * K * K))
    } else if b >= K * K {
        format!("{:.1} MiB", b / (K * K))
    } else if b >= K {
        format!("{:.1} KiB", b / K)
    } else {
        format!("{bytes} B")
    }
}
