//! The child of `tests/setup.rs`: a program that links ustrace and declares a few events.
//! Whatever `USTRACE_SETUP`/`USTRACE_EVENTS` set up before `main` is what it reports: it
//! fires each event once, writes a marker, then prints the tracefs state on stdout.

use ustrace::{FileSystem, OpenFlags};

ustrace::trace_event! {
    pub fn setupkv::get(key: &str, latency_ns: u64) {
        key: &str = key,
        latency_ns: u64 = latency_ns,
    }
    print "key=%s latency_ns=%llu", key, latency_ns;
}

ustrace::trace_event! {
    pub fn setupkv::put(key: &str) {
        key: &str = key,
    }
    print "key=%s", key;
}

ustrace::trace_event! {
    pub fn setupnet::respond(status: u32) {
        status: u32 = status,
    }
    print "status=%u", status;
}

fn cat(path: &str) -> String {
    let mut out = Vec::new();
    match ustrace::tracefs().open(path, OpenFlags::READ) {
        Ok(mut f) => {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = f.read(&mut buf, None) {
                out.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&out).into_owned()
        }
        Err(e) => format!("<{e}>\n"),
    }
}

fn main() {
    get::trace("alpha", 10);
    get::trace("beta", 5000);
    put::trace("gamma");
    respond::trace(404);
    for path in std::env::args().skip(1) {
        print!("== {path}\n{}", cat(&path));
    }
}
