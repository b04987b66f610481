//! `ustrace demo`: a small key-value store serving generated requests, traced.
//!
//! Worker threads (`kv-worker-N`) serve GET, PUT and DELETE requests from a generator over
//! a sharded in-memory map; a `net-acceptor` thread "accepts connections". The code carries
//! events in two systems, `kv` and `net`. The demo drives the tracefs API — the same files a
//! shell user writes — to enable them, filter one, put a trigger on another, and add a
//! dynamic fprobe event on a function that has no tracepoint, and measure request latency
//! with a synthetic event that an `onmatch` hist trigger generates from each `kv:request` /
//! `net:respond` pair of a worker thread; then it runs the workload and prints the trace and
//! the latency histogram.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ustrace::{FileSystem, OpenFlags};

ustrace::trace_event! {
    /// A request arrived at a worker.
    pub fn kv::request(op: &str, key: &str, worker: u32) {
        op: &str = op,
        key: &str = key,
        worker: u32 = worker,
    }
    print "op=%s key=%s worker=%u", op, key, worker;
}

ustrace::trace_event! {
    /// A GET finished.
    pub fn kv::get(key: &str, hit: bool, value_len: usize, latency_ns: u64) {
        key: &str = key,
        hit: bool = hit,
        value_len: usize = value_len,
        latency_ns: u64 = latency_ns,
    }
    print "key=%s hit=%d len=%lu latency_ns=%llu", key, hit, value_len, latency_ns;
}

ustrace::trace_event! {
    /// A PUT stored a value.
    pub fn kv::put(key: &str, value_len: usize, replaced: bool, shard: u32) {
        key: &str = key,
        value_len: usize = value_len,
        replaced: bool = replaced,
        shard: u32 = shard,
    }
    print "key=%s len=%lu replaced=%d shard=%u", key, value_len, replaced, shard;
}

ustrace::trace_event! {
    /// A DELETE removed (or missed) a key.
    pub fn kv::delete(key: &str, found: bool) {
        key: &str = key,
        found: bool = found,
    }
    print "key=%s found=%d", key, found;
}

ustrace::trace_event! {
    /// A shard grew past its budget and dropped its oldest keys.
    pub fn kv::evict(shard: u32, evicted: u32, remaining: u64) {
        shard: u32 = shard,
        evicted: u32 = evicted,
        remaining: u64 = remaining,
    }
    print "shard=%u evicted=%u remaining=%llu", shard, evicted, remaining;
}

ustrace::trace_event! {
    /// A client connection was accepted.
    pub fn net::accept(conn: u64, port: u16) {
        conn: u64 = conn,
        port: u16 = port,
    }
    print "conn=%llu port=%u", conn, port;
}

ustrace::trace_event! {
    /// A response went back to a client.
    pub fn net::respond(conn: u64, status: u16, bytes: u32) {
        conn: u64 = conn,
        status: u16 = status,
        bytes: u32 = bytes,
    }
    print "conn=%llu status=%u bytes=%u", conn, status, bytes;
}

#[derive(clap::Args)]
pub struct DemoArgs {
    /// How long the workload runs, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Worker threads serving requests.
    #[arg(long, default_value_t = 4)]
    pub workers: u32,
    /// Requests per second per worker (0: as fast as possible).
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Trace lines to print (0: all of them).
    #[arg(long, default_value_t = 40)]
    pub max_lines: usize,
    /// Keep serving requests (and the tracefs) until interrupted.
    #[arg(long)]
    pub serve: bool,
    /// Only the last part: record a C program that never heard of ustrace (compiled here
    /// with `cc`), report it and export it, in three `ustrace` commands.
    #[arg(long)]
    pub any_program: bool,
}

/// The C program `--any-program` records: two plain functions, called from `main`.
const ANY_PROGRAM: &str = r#"#include <stdio.h>
#include <string.h>
__attribute__((noinline)) int parse(const char *s) { return (int)strlen(s); }
__attribute__((noinline)) unsigned checksum(const char *s, int n) {
    unsigned h = 5381;
    for (int i = 0; i < n; i++) h = h * 33 + (unsigned char)s[i];
    return h;
}
int main(void) {
    const char *lines[] = {"GET /a", "PUT /b", "GET /c"};
    unsigned sum = 0;
    for (int i = 0; i < 3; i++) sum += checksum(lines[i], parse(lines[i]));
    printf("sum %u\n", sum);
    return 0;
}
"#;

/// Records [`ANY_PROGRAM`] with fprobes on its two functions, then reports and exports
/// the trace.dat, printing each command and what it said. `Ok(false)`, after saying why,
/// when this machine cannot (no `cc`, no agent).
fn record_any_program() -> Result<bool, String> {
    outln!("\n# Any program, recorded: a C program that never heard of ustrace, fprobes on two of its functions");
    let me = std::env::current_exe().map_err(|e| format!("cannot find ustrace itself: {e}"))?;
    let agent = me.with_file_name("libustrace_agent.so");
    if !agent.is_file() {
        outln!(
            "#   skipped: no {} (build it: cargo build --release -p ustrace-agent)",
            agent.display()
        );
        return Ok(false);
    }
    let dir = std::env::temp_dir().join(format!("ustrace-demo-any-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = (|| {
        let src = dir.join("prog.c");
        let prog = dir.join("prog");
        std::fs::write(&src, ANY_PROGRAM).map_err(|e| format!("{}: {e}", src.display()))?;
        match std::process::Command::new("cc")
            .args(["-O0", "-g", "-o"])
            .arg(&prog)
            .arg(&src)
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                outln!(
                    "#   skipped: cc failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                return Ok(false);
            }
            Err(e) => {
                outln!("#   skipped: no C compiler (cc): {e}");
                return Ok(false);
            }
        }
        let dat = dir.join("trace.dat");
        let json = dir.join("out.json");
        let steps: [(&str, Vec<std::ffi::OsString>); 3] = [
            (
                "ustrace record -F parse -F checksum -- ./prog",
                vec![
                    "record".into(),
                    "-F".into(),
                    "parse".into(),
                    "-F".into(),
                    "checksum".into(),
                    "-o".into(),
                    dat.clone().into(),
                    "--".into(),
                    prog.into(),
                ],
            ),
            (
                "ustrace report trace.dat",
                vec!["report".into(), dat.clone().into()],
            ),
            (
                "ustrace export --chrome out.json trace.dat   (open it in ui.perfetto.dev)",
                vec!["export".into(), "--chrome".into(), json.into(), dat.into()],
            ),
        ];
        for (shown, args) in steps {
            outln!("$ {shown}");
            let out = std::process::Command::new(&me)
                .args(&args)
                .current_dir(&dir)
                .output()
                .map_err(|e| format!("{shown}: {e}"))?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            for line in text.lines().take(12) {
                outln!("{line}");
            }
            if !out.status.success() {
                return Err(format!("{shown}: failed ({})", out.status));
            }
        }
        Ok(true)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

const SHARDS: usize = 8;
const SHARD_BUDGET: usize = 512;

/// The store: a few shards, each a map with insertion order for eviction.
struct Store {
    shards: Vec<Mutex<Shard>>,
}

#[derive(Default)]
struct Shard {
    map: HashMap<String, Vec<u8>>,
    order: Vec<String>,
}

impl Store {
    fn new() -> Self {
        Store {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard_of(key: &str) -> usize {
        key.bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize))
            % SHARDS
    }

    // Kept out of line so that the GET path is a function of its own in every build: the
    // function tracers draw it as `Store::get` calling `demo_shard_lookup`, and a release
    // build would otherwise inline it into the request loop, leaving nothing to name.
    #[inline(never)]
    fn get(&self, key: &str) -> Option<usize> {
        let index = Self::shard_of(key);
        let shard = self.shards[index].lock().unwrap();
        let found = shard.map.get(key).map(|v| v.len());
        demo_shard_lookup(index as u32, key.len(), found.is_some());
        found
    }

    fn put(&self, key: &str, value: Vec<u8>) -> bool {
        let index = Self::shard_of(key);
        let mut shard = self.shards[index].lock().unwrap();
        let len = value.len();
        let replaced = shard.map.insert(key.to_string(), value).is_some();
        if !replaced {
            shard.order.push(key.to_string());
        }
        put::trace(key, len, replaced, index as u32);
        if shard.map.len() > SHARD_BUDGET {
            let excess = shard.map.len() - SHARD_BUDGET / 2;
            let victims: Vec<String> = shard.order.drain(..excess).collect();
            for victim in &victims {
                shard.map.remove(victim);
            }
            evict::trace(index as u32, victims.len() as u32, shard.map.len() as u64);
        }
        replaced
    }

    fn delete(&self, key: &str) -> bool {
        let mut shard = self.shards[Self::shard_of(key)].lock().unwrap();
        let found = shard.map.remove(key).is_some();
        if found {
            shard.order.retain(|k| k != key);
        }
        found
    }
}

/// Called on every lookup and traced only through a dynamic fprobe event: no tracepoint.
#[no_mangle]
#[inline(never)]
pub extern "C" fn demo_shard_lookup(shard: u32, key_len: usize, hit: bool) -> i32 {
    std::hint::black_box((shard, key_len));
    i32::from(hit)
}

/// A tiny deterministic generator (xorshift), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn worker(id: u32, store: Arc<Store>, stop: Arc<AtomicBool>, rate: u64, served: Arc<AtomicU64>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((u64::from(id) + 1) * 0x1234_5678));
    let pause = Duration::from_nanos(1_000_000_000u64.checked_div(rate).unwrap_or(0));
    while !stop.load(Ordering::Relaxed) {
        let key = format!("user:{:04}", rng.next() % 2000);
        let conn = rng.next() % 64;
        let started = Instant::now();
        let (status, bytes) = match rng.next() % 10 {
            0..=5 => {
                request::trace("GET", &key, id);
                let found = store.get(&key);
                let latency = started.elapsed().as_nanos() as u64;
                get::trace(&key, found.is_some(), found.unwrap_or(0), latency);
                (
                    if found.is_some() { 200 } else { 404 },
                    found.unwrap_or(0) as u32,
                )
            }
            6..=8 => {
                request::trace("PUT", &key, id);
                let value = vec![b'v'; 16 + (rng.next() % 200) as usize];
                let replaced = store.put(&key, value);
                (if replaced { 200 } else { 201 }, 0)
            }
            _ => {
                request::trace("DELETE", &key, id);
                let found = store.delete(&key);
                delete::trace(&key, found);
                (if found { 204 } else { 404 }, 0)
            }
        };
        respond::trace(conn, status, bytes);
        served.fetch_add(1, Ordering::Relaxed);
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
}

fn acceptor(stop: Arc<AtomicBool>) {
    let mut conn = 0u64;
    while !stop.load(Ordering::Relaxed) {
        conn += 1;
        accept::trace(conn, 40000 + (conn % 1000) as u16);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts the workload; returns the stop flag, the served-request counter and the threads.
pub fn start_workload(
    workers: u32,
    rate: u64,
) -> (
    Arc<AtomicBool>,
    Arc<AtomicU64>,
    Vec<std::thread::JoinHandle<()>>,
) {
    let store = Arc::new(Store::new());
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for id in 0..workers {
        let (store, stop, served) = (store.clone(), stop.clone(), served.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("kv-worker-{id}"))
                .spawn(move || worker(id, store, stop, rate, served))
                .expect("spawn worker"),
        );
    }
    let acceptor_stop = stop.clone();
    threads.push(
        std::thread::Builder::new()
            .name("net-acceptor".into())
            .spawn(move || acceptor(acceptor_stop))
            .expect("spawn acceptor"),
    );
    (stop, served, threads)
}

fn write(path: &str, text: &str, append: bool) -> Result<(), String> {
    let flags = if append {
        OpenFlags::APPEND
    } else {
        OpenFlags::TRUNCATE
    };
    let mut file = ustrace::tracefs()
        .open(path, flags)
        .map_err(|e| format!("open {path}: {e}"))?;
    file.write(text.as_bytes())
        .map_err(|e| format!("write {path}: {e}"))?;
    Ok(())
}

fn read(path: &str) -> Result<String, String> {
    let mut file = ustrace::tracefs()
        .open(path, OpenFlags::READ)
        .map_err(|e| format!("open {path}: {e}"))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file
            .read(&mut buf, None)
            .map_err(|e| format!("read {path}: {e}"))?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// What the demo writes before the workload starts, as a shell user would write it.
const SETUP: &[(&str, &str, bool)] = &[
    ("events/kv/enable", "1", false),
    ("set_event", "net:*", true),
    ("events/net/respond/filter", "status >= 400", false),
    ("events/kv/evict/trigger", "stacktrace:1", false),
    (
        "dynamic_events",
        "f:demo/shard_lookup demo_shard_lookup shard=$arg1:u32 key_len=$arg2:u64",
        true,
    ),
    (
        "dynamic_events",
        "f:demo/shard_lookup_ret demo_shard_lookup%return hit=$retval:s32",
        true,
    ),
    ("events/demo/enable", "1", false),
    // Request latency (histogram.rst 2.2): the request's time stamp is kept per thread,
    // the response computes the latency and generates a synthetic event with it and the
    // request's op, whose own hist trigger groups the latencies by op in powers of two.
    (
        "synthetic_events",
        "request_latency u64 lat_us; char op[]; u16 status",
        true,
    ),
    (
        "events/kv/request/trigger",
        "hist:keys=common_pid:ts0=common_timestamp.usecs",
        false,
    ),
    (
        "events/net/respond/trigger",
        "hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:onmatch(kv.request).request_latency($lat,kv.request.op,status)",
        false,
    ),
    (
        "events/synthetic/request_latency/trigger",
        "hist:keys=op,lat_us.log2:sort=op,lat_us",
        false,
    ),
];

/// The histogram the demo prints last.
const LATENCY_HIST: &str = "events/synthetic/request_latency/hist";

pub fn run(args: DemoArgs) -> Result<(), String> {
    if args.any_program {
        return record_any_program().map(|_| ());
    }
    outln!("# ustrace demo: the tracefs writes, as a shell would do them:");
    for (path, text, append) in SETUP {
        let arrow = if *append { ">>" } else { ">" };
        match write(path, &format!("{text}\n"), *append) {
            Ok(()) => outln!("#   echo '{text}' {arrow} {path}"),
            // The fprobe events need a patchable x86_64 process; the rest of the demo does not.
            Err(e) => {
                outln!("#   echo '{text}' {arrow} {path}   (failed: {e}; going on without it)");
                let log = read("error_log").unwrap_or_default();
                for line in log
                    .lines()
                    .rev()
                    .take(3)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                {
                    outln!("#     {line}");
                }
            }
        }
    }
    write("trace_marker", "ustrace demo: workload starting\n", false)?;
    let (stop, served, threads) = start_workload(args.workers, args.rate);
    if args.serve {
        let socket = ustrace::serve().map_err(|e| format!("cannot serve the tracefs: {e}"))?;
        let pid = std::process::id();
        eprintln!(
            "ustrace demo: pid {pid} serves its tracefs at {}",
            socket.display()
        );
        eprintln!("  ustrace cat -p {pid} trace          read the trace");
        eprintln!("  ustrace pipe -p {pid}               stream trace_pipe");
        eprintln!("  mkdir -p /tmp/t && ustrace mount -p {pid} /tmp/t   then echo/cat in /tmp/t");
        eprintln!("interrupt (Ctrl-C) to stop");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    std::thread::sleep(Duration::from_secs_f64(args.seconds.max(0.0)));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    write("trace_marker", "ustrace demo: workload done\n", false)?;
    write("tracing_on", "0\n", false)?;

    outln!("# events/kv/get/format:");
    out!("{}", read("events/kv/get/format")?);
    outln!();
    let trace = read("trace")?;
    let (header, body): (Vec<&str>, Vec<&str>) = trace.lines().partition(|l| l.starts_with('#'));
    for line in &header {
        outln!("{line}");
    }
    let shown = if args.max_lines == 0 {
        body.len()
    } else {
        args.max_lines.min(body.len())
    };
    for line in &body[..shown] {
        outln!("{line}");
    }
    if shown < body.len() {
        outln!(
            "... {} more lines (--max-lines 0 prints all)",
            body.len() - shown
        );
    }
    if let Ok(hist) = read(LATENCY_HIST) {
        outln!(
            "\n# cat {LATENCY_HIST}   (request latency in us by op, from the synthetic event onmatch(kv.request) generates on each net:respond)"
        );
        out!("{hist}");
    }
    // The process exits after this line, so its per_cpu/cpuN/stats are summed here.
    let total = |key: &str| -> u64 {
        (0..)
            .map_while(|cpu| read(&format!("per_cpu/cpu{cpu}/stats")).ok())
            .flat_map(|stats| {
                let prefix = format!("{key}: ");
                stats
                    .lines()
                    .filter_map(|l| l.strip_prefix(&prefix)?.trim().parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    };
    // Before the summary, which stays the last line (tests read it there). A failure
    // here is the recorder's, not the workload's: said, and the demo goes on.
    if let Err(e) = record_any_program() {
        outln!("#   failed: {e}");
    }
    outln!(
        "\n# {} requests served by {} workers in {:.1} s; the buffer holds {} events, {} were overwritten and {} dropped (per_cpu/cpuN/stats, summed)",
        served.load(Ordering::Relaxed),
        args.workers,
        args.seconds,
        total("entries"),
        total("overrun"),
        total("dropped events")
    );
    Ok(())
}
