//! histogram.rst 2 (hist triggers on one event), example by example, on user-space events
//! shaped like the document's kernel events (a kmalloc-like event, a read-syscall-like one,
//! a fork-like one with a string, a netif-like one), comparing the `hist` and `trigger`
//! text with the document's where the values are ours to choose.

mod common;

use common::{append, read, write};

ustrace::trace_event! {
    pub fn hkmem::kmalloc(call_site: u64, ptr: u64, bytes_req: usize, bytes_alloc: usize, gfp_flags: u32) {
        call_site: u64 = call_site,
        ptr: u64 = ptr,
        bytes_req: usize = bytes_req,
        bytes_alloc: usize = bytes_alloc,
        gfp_flags: u32 = gfp_flags,
    }
    print "call_site=%lx ptr=%lx bytes_req=%lu bytes_alloc=%lu", call_site, ptr, bytes_req, bytes_alloc;
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const KMALLOC: &str = "events/hkmem/kmalloc";

#[test]
fn keys_and_vals_end_to_end() {
    let _s = serial();
    write(
        &format!("{KMALLOC}/trigger"),
        "hist:key=call_site:val=bytes_req",
    )
    .unwrap();
    for (site, n) in [(10u64, 1usize), (20, 3), (10, 5), (30, 7), (20, 9)] {
        kmalloc::trace(site, 0, n, n * 2, 0);
    }
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert_eq!(
        hist,
        "# event histogram\n\
         #\n\
         # trigger info: hist:keys=call_site:vals=hitcount,bytes_req:sort=hitcount:size=2048 [active]\n\
         #\n\
         \n\
         { call_site:         30 } hitcount:          1  bytes_req:          7\n\
         { call_site:         10 } hitcount:          2  bytes_req:          6\n\
         { call_site:         20 } hitcount:          2  bytes_req:         12\n\
         \n\
         Totals:\n    Hits: 5\n    Entries: 3\n    Dropped: 0\n"
    );
    assert_eq!(
        read(&format!("{KMALLOC}/trigger")).unwrap(),
        "hist:keys=call_site:vals=hitcount,bytes_req:sort=hitcount:size=2048 [active]\n"
    );
    append(
        &format!("{KMALLOC}/trigger"),
        "!hist:key=call_site:val=bytes_req",
    )
    .unwrap();
    assert_eq!(read(&format!("{KMALLOC}/hist")).unwrap(), "");
}
