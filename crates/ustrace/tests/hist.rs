//! histogram.rst 2 (hist triggers on one event), example by example, on user-space events
//! shaped like the document's kernel events (kmalloc, raw sys_enter, sys_enter_read and
//! recvfrom, sched_process_fork/exec/exit, netif_receive_skb and netif_rx), comparing the
//! `hist` and `trigger` text with the document's layout where the values are ours.
//!
//! Where the document and the kernel's source disagree the source wins: the info line
//! always lists `hitcount` among the values, and hist triggers are listed (and shown in
//! `hist`) in the order they were added (`list_add_tail_rcu`).

mod common;

use common::{append, read, write};
use ustrace::FixedStr;

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

ustrace::trace_event! {
    pub fn hraw::sys_enter(id: isize) {
        id: isize = id,
    }
    print "NR %ld", id;
}

ustrace::trace_event! {
    pub fn hsyscalls::sys_enter_read(fd: u32, count: usize) {
        fd: u32 = fd,
        count: usize = count,
    }
    print "fd=%u count=%lu", fd, count;
}

ustrace::trace_event! {
    pub fn hsyscalls::sys_enter_recvfrom(fd: u32, size: usize) {
        fd: u32 = fd,
        size: usize = size,
    }
    print "fd=%u size=%lu", fd, size;
}

ustrace::trace_event! {
    pub fn hsched::sched_process_fork(child_comm: &str, child_pid: i32) {
        child_comm: FixedStr<16> = FixedStr::new(child_comm),
        child_pid: i32 = child_pid,
    }
    print "comm=%s pid=%d", child_comm, child_pid;
}

ustrace::trace_event! {
    pub fn hsched::sched_process_exec(filename: &str) {
        filename: &str = filename,
    }
    print "filename=%s", filename;
}

ustrace::trace_event! {
    pub fn hsched::sched_process_exit(comm: &str) {
        comm: FixedStr<16> = FixedStr::new(comm),
    }
    print "comm=%s", comm;
}

ustrace::trace_event! {
    pub fn hnet::netif_receive_skb(skbaddr: u64, len: u32) {
        skbaddr: u64 = skbaddr,
        len: u32 = len,
    }
    print "skbaddr=%lx len=%u", skbaddr, len;
}

ustrace::trace_event! {
    pub fn hnet::netif_rx(skbaddr: u64, len: u32) {
        skbaddr: u64 = skbaddr,
        len: u32 = len,
    }
    print "skbaddr=%lx len=%u", skbaddr, len;
}

/// Call sites the `.sym` examples resolve.
#[no_mangle]
#[inline(never)]
pub extern "C" fn hist_site_alpha(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3).wrapping_add(1)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn hist_site_beta(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(5).wrapping_add(2)
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One test at a time, and no trigger left from the one before (a truncating write of
/// `trigger` drops the hist triggers first, as on the kernel).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const KMALLOC: &str = "events/hkmem/kmalloc";

fn tid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// The entry lines of a `hist` section (what sits between the header and the totals).
fn entries(hist: &str) -> Vec<&str> {
    hist.lines().filter(|l| l.starts_with("{ ")).collect()
}

fn totals(hist: &str) -> (u64, u64, u64) {
    let get = |what: &str| -> u64 {
        hist.lines()
            .find_map(|l| l.trim().strip_prefix(what))
            .map(|v| v.trim().parse().unwrap())
            .unwrap()
    };
    (get("Hits:"), get("Entries:"), get("Dropped:"))
}

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
    assert!(read(&format!("{KMALLOC}/trigger"))
        .unwrap()
        .starts_with("# Available triggers:"));
}

#[test]
fn hex_sym_and_sym_offset_keys() {
    let _s = serial();
    let alpha = hist_site_alpha as *const () as usize as u64;
    let beta = hist_site_beta as *const () as usize as u64;
    let trig = format!("{KMALLOC}/trigger");
    write(&trig, "hist:key=call_site.hex:val=bytes_req").unwrap();
    kmalloc::trace(0xffff_8800_baee_5e00, 0, 130, 192, 0);
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains("# trigger info: hist:keys=call_site.hex:vals=hitcount,bytes_req:sort=hitcount:size=2048 [active]\n"));
    assert_eq!(
        entries(&hist),
        ["{ call_site: ffff8800baee5e00 } hitcount:          1  bytes_req:        130"]
    );

    write(
        &trig,
        "hist:key=call_site.sym:val=bytes_req:sort=bytes_req.descending",
    )
    .unwrap();
    kmalloc::trace(alpha, 0, 8, 8, 0);
    kmalloc::trace(beta, 0, 100, 128, 0);
    kmalloc::trace(alpha, 0, 16, 16, 0);
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains("hist:keys=call_site.sym:vals=hitcount,bytes_req:sort=bytes_req.descending:size=2048 [active]"));
    assert_eq!(
        entries(&hist),
        [
            format!(
                "{{ call_site: [{beta:x}] {:<45} }} hitcount:          1  bytes_req:        100",
                "hist_site_beta"
            ),
            format!(
                "{{ call_site: [{alpha:x}] {:<45} }} hitcount:          2  bytes_req:         24",
                "hist_site_alpha"
            ),
        ]
    );

    write(
        &trig,
        "hist:key=call_site.sym-offset:val=bytes_req:sort=bytes_req.descending",
    )
    .unwrap();
    kmalloc::trace(alpha + 4, 0, 8, 8, 0);
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains("hist:keys=call_site.sym-offset:vals=hitcount,bytes_req:sort=bytes_req.descending:size=2048 [active]"));
    let line = entries(&hist)[0].to_string();
    let prefix = format!("{{ call_site: [{:x}] hist_site_alpha+0x4/0x", alpha + 4);
    assert!(line.starts_with(&prefix), "{line}");
    // The symbol is padded to 55 columns.
    let sym_start = line.find("hist_site_alpha").unwrap();
    assert_eq!(&line[sym_start + 55..sym_start + 57], " }", "{line}");
    write(&trig, "").unwrap();
}

#[test]
fn several_values_sorted_descending() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(
        &trig,
        "hist:keys=call_site:values=bytes_req,bytes_alloc:sort=bytes_alloc.descending",
    )
    .unwrap();
    for (site, req, alloc) in [
        (1u64, 7usize, 8usize),
        (2, 100, 128),
        (3, 40, 64),
        (2, 20, 32),
    ] {
        kmalloc::trace(site, 0, req, alloc, 0);
    }
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains("# trigger info: hist:keys=call_site:vals=hitcount,bytes_req,bytes_alloc:sort=bytes_alloc.descending:size=2048 [active]\n"));
    assert_eq!(
        entries(&hist),
        [
            "{ call_site:          2 } hitcount:          2  bytes_req:        120  bytes_alloc:        160",
            "{ call_site:          3 } hitcount:          1  bytes_req:         40  bytes_alloc:         64",
            "{ call_site:          1 } hitcount:          1  bytes_req:          7  bytes_alloc:          8",
        ]
    );
    assert_eq!(totals(&hist), (4, 3, 0));
    write(&trig, "").unwrap();
}

#[inline(never)]
fn kmalloc_from_a() {
    kmalloc::trace(1, 0, 32, 32, 0);
}

#[inline(never)]
fn kmalloc_from_b() {
    kmalloc::trace(2, 0, 64, 64, 0);
}

#[test]
fn common_stacktrace_key() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(
        &trig,
        "hist:keys=common_stacktrace:values=bytes_req,bytes_alloc:sort=bytes_alloc",
    )
    .unwrap();
    for _ in 0..3 {
        kmalloc_from_a();
    }
    kmalloc_from_b();
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains("# trigger info: hist:keys=common_stacktrace:vals=hitcount,bytes_req,bytes_alloc:sort=bytes_alloc:size=2048 [active]\n"));
    // Each entry: the key's name, one frame per line indented by 9 columns, then the
    // closing brace with the values.
    let blocks: Vec<&str> = hist.split("{ common_stacktrace:\n").skip(1).collect();
    assert_eq!(blocks.len(), 2, "{hist}");
    for block in &blocks {
        let lines: Vec<&str> = block.lines().collect();
        let close = lines
            .iter()
            .position(|l| l.starts_with("} hitcount:"))
            .unwrap();
        assert!((1..=16).contains(&close), "{block}");
        for frame in &lines[..close] {
            assert!(
                frame.starts_with("         ") && !frame.starts_with("          "),
                "{frame:?}"
            );
        }
    }
    // Sorted by bytes_alloc, ascending.
    assert!(blocks[0]
        .contains("} hitcount:          1  bytes_req:         64  bytes_alloc:         64"));
    assert!(blocks[1]
        .contains("} hitcount:          3  bytes_req:         96  bytes_alloc:         96"));
    // The first frame is the function that hit the tracepoint, as the kernel's first frame
    // is the traced function (its own tracing frames are skipped).
    assert!(
        blocks[0].starts_with("         hist::kmalloc_from_b+0x"),
        "{}",
        blocks[0]
    );
    assert!(
        blocks[1].starts_with("         hist::kmalloc_from_a+0x"),
        "{}",
        blocks[1]
    );
    write(&trig, "").unwrap();
}

#[test]
fn execname_keys_name_each_thread() {
    let _s = serial();
    let trig = "events/hsyscalls/sys_enter_read/trigger";
    write(
        trig,
        "hist:key=common_pid.execname:val=count:sort=count.descending",
    )
    .unwrap();
    let mut tids = Vec::new();
    for (name, count, times) in [
        ("gnome-terminal", 1000usize, 3),
        ("Xorg", 500, 2),
        ("bash", 10, 1),
    ] {
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for _ in 0..times {
                    sys_enter_read::trace(0, count);
                }
                tid()
            })
            .unwrap();
        tids.push((name, t.join().unwrap()));
    }
    let hist = read("events/hsyscalls/sys_enter_read/hist").unwrap();
    assert!(hist.contains("# trigger info: hist:keys=common_pid.execname:vals=hitcount,count:sort=count.descending:size=2048 [active]\n"));
    let expect: Vec<String> = [(0, 3, 3000), (1, 2, 1000), (2, 1, 10)]
        .iter()
        .map(|&(i, hits, count)| {
            let (name, tid) = tids[i];
            format!(
                "{{ common_pid: {name:<16}[{tid:>10}] }} hitcount: {hits:>10}  count: {count:>10}"
            )
        })
        .collect();
    assert_eq!(entries(&hist), expect);
    write(trig, "").unwrap();
}

#[test]
fn syscall_keys_and_compound_keys() {
    let _s = serial();
    let trig = "events/hraw/sys_enter/trigger";
    write(trig, "hist:key=id.syscall:val=hitcount").unwrap();
    for id in [0isize, 16, 16, 1, 999, 0, 16] {
        sys_enter::trace(id);
    }
    let hist = read("events/hraw/sys_enter/hist").unwrap();
    assert!(hist.contains(
        "# trigger info: hist:keys=id.syscall:vals=hitcount:sort=hitcount:size=2048 [active]\n"
    ));
    assert_eq!(
        entries(&hist),
        [
            "{ id: sys_write                     [  1] } hitcount:          1",
            "{ id: unknown_syscall               [999] } hitcount:          1",
            "{ id: sys_read                      [  0] } hitcount:          2",
            "{ id: sys_ioctl                     [ 16] } hitcount:          3",
        ]
    );

    write(
        trig,
        "hist:key=id.syscall,common_pid.execname:val=hitcount:sort=id,hitcount if id == 16",
    )
    .unwrap();
    let me = tid();
    let comm = ustrace::thread::current_comm();
    let comm: String = comm.chars().take(15).collect();
    for id in [16isize, 0, 16] {
        sys_enter::trace(id);
    }
    let hist = read("events/hraw/sys_enter/hist").unwrap();
    assert!(hist.contains("# trigger info: hist:keys=id.syscall,common_pid.execname:vals=hitcount:sort=id.syscall,hitcount:size=2048 if id == 16 [active]\n"), "{hist}");
    assert_eq!(
        entries(&hist),
        [format!("{{ id: sys_ioctl                     [ 16], common_pid: {comm:<16}[{me:>10}] }} hitcount:          2")]
    );
    write(trig, "").unwrap();

    // Two keys as the sort: pid first, size second.
    let trig = "events/hsyscalls/sys_enter_recvfrom/trigger";
    write(
        trig,
        "hist:key=common_pid.execname,size:val=hitcount:sort=common_pid,size",
    )
    .unwrap();
    for size in [4096usize, 4, 4096, 28] {
        sys_enter_recvfrom::trace(3, size);
    }
    let hist = read("events/hsyscalls/sys_enter_recvfrom/hist").unwrap();
    assert!(hist.contains("hist:keys=common_pid.execname,size:vals=hitcount:sort=common_pid.execname,size:size=2048 [active]"));
    let got: Vec<String> = entries(&hist)
        .iter()
        .map(|l| l[l.find("size:").unwrap()..].to_string())
        .collect();
    assert_eq!(
        got,
        [
            "size:          4 } hitcount:          1",
            "size:         28 } hitcount:          1",
            "size:       4096 } hitcount:          2",
        ]
    );
    write(trig, "").unwrap();
}

#[test]
fn string_keys_pause_and_continue() {
    let _s = serial();
    let trig = "events/hsched/sched_process_fork/trigger";
    let hist_path = "events/hsched/sched_process_fork/hist";
    write(trig, "hist:key=child_comm:val=hitcount:size=256").unwrap();
    for comm in ["bash", "dconf worker", "bash", "evolution-sourc"] {
        sched_process_fork::trace(comm, 1);
    }
    let hist = read(hist_path).unwrap();
    assert!(hist.contains(
        "# trigger info: hist:keys=child_comm:vals=hitcount:sort=hitcount:size=256 [active]\n"
    ));
    assert_eq!(
        entries(&hist),
        [
            format!(
                "{{ child_comm: {:<50} }} hitcount:          1",
                "dconf worker"
            ),
            format!(
                "{{ child_comm: {:<50} }} hitcount:          1",
                "evolution-sourc"
            ),
            format!("{{ child_comm: {:<50} }} hitcount:          2", "bash"),
        ]
    );
    append(trig, "hist:key=child_comm:val=hitcount:size=256:pause").unwrap();
    sched_process_fork::trace("bash", 1);
    let hist = read(hist_path).unwrap();
    assert!(hist.contains("hist:keys=child_comm:vals=hitcount:sort=hitcount:size=256 [paused]"));
    assert_eq!(totals(&hist), (4, 3, 0));
    append(trig, "hist:key=child_comm:val=hitcount:size=256:cont").unwrap();
    sched_process_fork::trace("bash", 1);
    let hist = read(hist_path).unwrap();
    assert!(hist.contains("hist:keys=child_comm:vals=hitcount:sort=hitcount:size=256 [active]"));
    assert_eq!(totals(&hist), (5, 3, 0));
    // :clear empties it and keeps its state.
    append(trig, "hist:key=child_comm:val=hitcount:size=256:clear").unwrap();
    let hist = read(hist_path).unwrap();
    assert!(
        hist.ends_with("[active]\n#\n\n\nTotals:\n    Hits: 0\n    Entries: 0\n    Dropped: 0\n"),
        "{hist}"
    );
    write(trig, "").unwrap();
}

#[test]
fn enable_hist_and_disable_hist() {
    let _s = serial();
    let skb = "events/hnet/netif_receive_skb";
    write(
        &format!("{skb}/trigger"),
        "hist:key=common_stacktrace:vals=len:pause",
    )
    .unwrap();
    write(
        "events/hsched/sched_process_exec/trigger",
        "enable_hist:hnet:netif_receive_skb if filename==\"/usr/bin/wget\"",
    )
    .unwrap();
    write(
        "events/hsched/sched_process_exit/trigger",
        "disable_hist:hnet:netif_receive_skb if comm==\"wget\"",
    )
    .unwrap();
    assert_eq!(
        read("events/hsched/sched_process_exec/trigger").unwrap(),
        "enable_hist:hnet:netif_receive_skb:unlimited if filename==\"/usr/bin/wget\"\n"
    );
    netif_receive_skb::trace(1, 100);
    sched_process_exec::trace("/usr/bin/ls");
    netif_receive_skb::trace(1, 100);
    sched_process_exec::trace("/usr/bin/wget");
    netif_receive_skb::trace(1, 100);
    netif_receive_skb::trace(1, 100);
    let hist = read(&format!("{skb}/hist")).unwrap();
    assert!(hist.contains(
        "hist:keys=common_stacktrace:vals=hitcount,len:sort=hitcount:size=2048 [active]"
    ));
    sched_process_exit::trace("bash");
    netif_receive_skb::trace(1, 100);
    sched_process_exit::trace("wget");
    netif_receive_skb::trace(1, 100);
    let hist = read(&format!("{skb}/hist")).unwrap();
    assert!(hist.contains(
        "hist:keys=common_stacktrace:vals=hitcount,len:sort=hitcount:size=2048 [paused]"
    ));
    assert_eq!(totals(&hist).0, 3);
    // A truncating write drops enable_hist/disable_hist as it drops hist triggers.
    write("events/hsched/sched_process_exec/trigger", "").unwrap();
    write("events/hsched/sched_process_exit/trigger", "").unwrap();
    assert!(read("events/hsched/sched_process_exec/trigger")
        .unwrap()
        .starts_with("# Available"));
    write(&format!("{skb}/trigger"), "").unwrap();
}

#[test]
fn several_hist_triggers_on_one_event() {
    let _s = serial();
    let skb = "events/hnet/netif_receive_skb";
    let trig = format!("{skb}/trigger");
    write(&trig, "hist:keys=skbaddr.hex:vals=len if len < 0").unwrap();
    append(&trig, "hist:keys=skbaddr.hex:vals=len if len > 4096").unwrap();
    append(&trig, "hist:keys=skbaddr.hex:vals=len if len == 256").unwrap();
    append(&trig, "hist:keys=skbaddr.hex:vals=len").unwrap();
    append(&trig, "hist:keys=len:vals=common_preempt_count").unwrap();
    assert_eq!(
        append(&trig, "hist:keys=skbaddr.hex:vals=len if len > 4096"),
        Err(ustrace::Errno(libc::EEXIST))
    );
    for (addr, len) in [
        (0xffff_8800_d2bc_dc00u64, 7212u32),
        (0xffff_8800_d2bc_dc00, 256),
        (0xffff_8800_baee_5e00, 130),
    ] {
        netif_receive_skb::trace(addr, len);
    }
    let hist = read(&format!("{skb}/hist")).unwrap();
    let sections: Vec<&str> = hist.split("\n\n\n# event histogram").collect();
    assert_eq!(sections.len(), 5, "{hist}");
    assert!(hist.starts_with("# event histogram\n#\n# trigger info: hist:keys=skbaddr.hex:vals=hitcount,len:sort=hitcount:size=2048 if len < 0 [active]\n#\n\n\nTotals:\n    Hits: 0\n    Entries: 0\n    Dropped: 0\n"));
    assert!(sections[1].contains("if len > 4096 [active]\n#\n\n{ skbaddr: ffff8800d2bcdc00 } hitcount:          1  len:       7212\n\nTotals:\n    Hits: 1\n"));
    assert!(sections[2].contains("if len == 256 [active]\n#\n\n{ skbaddr: ffff8800d2bcdc00 } hitcount:          1  len:        256\n"));
    assert!(sections[3].contains("{ skbaddr: ffff8800baee5e00 } hitcount:          1  len:        130\n{ skbaddr: ffff8800d2bcdc00 } hitcount:          2  len:       7468\n"));
    assert!(sections[4].contains(
        "hist:keys=len:vals=hitcount,common_preempt_count:sort=hitcount:size=2048 [active]"
    ));
    assert!(sections[4]
        .contains("{ len:        130 } hitcount:          1  common_preempt_count:          0\n"));
    // Other triggers are listed first, hist triggers after, in the order they came.
    append(&trig, "traceoff:5").unwrap();
    let listing = read(&trig).unwrap();
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines[0], "traceoff:count=5");
    assert!(lines[1].ends_with("if len < 0 [active]"));
    assert!(lines[5].starts_with("hist:keys=len:"));
    append(&trig, "!traceoff").unwrap();
    append(&trig, "!hist:keys=skbaddr.hex:vals=len if len == 256").unwrap();
    assert_eq!(
        read(&format!("{skb}/hist"))
            .unwrap()
            .matches("# event histogram")
            .count(),
        4
    );
    write(&trig, "").unwrap();
    assert_eq!(read(&format!("{skb}/hist")).unwrap(), "");
}

#[test]
fn named_triggers_share_one_table() {
    let _s = serial();
    write(
        "events/hnet/netif_receive_skb/trigger",
        "hist:name=foo:keys=skbaddr.hex:vals=len",
    )
    .unwrap();
    write(
        "events/hnet/netif_rx/trigger",
        "hist:name=foo:keys=skbaddr.hex:vals=len",
    )
    .unwrap();
    netif_receive_skb::trace(0xffff_8800_0ad5_3500, 46);
    netif_rx::trace(0xffff_8800_0ad5_3500, 30);
    netif_rx::trace(0xffff_8800_af5a_1500, 76);
    let a = read("events/hnet/netif_receive_skb/hist").unwrap();
    let b = read("events/hnet/netif_rx/hist").unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a,
        "# event histogram\n#\n# trigger info: hist:name=foo:keys=skbaddr.hex:vals=hitcount,len:sort=hitcount:size=2048 [active]\n#\n\n\
         { skbaddr: ffff8800af5a1500 } hitcount:          1  len:         76\n\
         { skbaddr: ffff88000ad53500 } hitcount:          2  len:         76\n\
         \nTotals:\n    Hits: 3\n    Entries: 2\n    Dropped: 0\n"
    );
    // A trigger of the same name must have the same fields.
    let _ = write("error_log", "");
    assert_eq!(
        write(
            "events/hkmem/kmalloc/trigger",
            "hist:name=foo:keys=call_site:vals=bytes_req"
        ),
        Err(ustrace::Errno(libc::EINVAL))
    );
    let log = read("error_log").unwrap();
    assert!(log.ends_with(
        "hist:hkmem:kmalloc: error: Named hist trigger doesn't match existing named trigger (includes variables)\n  Command: hist:name=foo:keys=call_site:vals=bytes_req\n                ^\n"
    ), "{log}");
    // Any two events share common_stacktrace and hitcount.
    write(
        "events/hsched/sched_process_fork/trigger",
        "hist:name=bar:key=common_stacktrace:val=hitcount",
    )
    .unwrap();
    write(
        "events/hnet/netif_rx/trigger",
        "hist:name=bar:key=common_stacktrace:val=hitcount",
    )
    .unwrap();
    sched_process_fork::trace("kthreadd", 2);
    netif_rx::trace(1, 1);
    let fork = read("events/hsched/sched_process_fork/hist").unwrap();
    assert!(fork.contains("# trigger info: hist:name=bar:keys=common_stacktrace:vals=hitcount:sort=hitcount:size=2048 [active]\n"));
    assert_eq!(fork, read("events/hnet/netif_rx/hist").unwrap());
    assert_eq!(totals(&fork).0, 2);
    for t in [
        "events/hnet/netif_receive_skb/trigger",
        "events/hnet/netif_rx/trigger",
        "events/hsched/sched_process_fork/trigger",
    ] {
        write(t, "").unwrap();
    }
}

#[test]
fn log2_and_bucket_keys() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(
        &trig,
        "hist:keys=bytes_req.log2:vals=bytes_alloc:sort=bytes_req",
    )
    .unwrap();
    for n in [1usize, 3, 4, 5, 100, 128, 129] {
        kmalloc::trace(0, 0, n, n, 0);
    }
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains(
        "hist:keys=bytes_req.log2:vals=hitcount,bytes_alloc:sort=bytes_req.log2:size=2048 [active]"
    ));
    assert_eq!(
        entries(&hist),
        [
            "{ bytes_req: ~ 2^0  } hitcount:          1  bytes_alloc:          1",
            "{ bytes_req: ~ 2^2  } hitcount:          2  bytes_alloc:          7",
            "{ bytes_req: ~ 2^3  } hitcount:          1  bytes_alloc:          5",
            "{ bytes_req: ~ 2^7  } hitcount:          2  bytes_alloc:        228",
            "{ bytes_req: ~ 2^8  } hitcount:          1  bytes_alloc:        129",
        ]
    );
    write(&trig, "hist:keys=bytes_req.buckets=32:sort=bytes_req").unwrap();
    for n in [1usize, 31, 32, 70] {
        kmalloc::trace(0, 0, n, n, 0);
    }
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains(
        "hist:keys=bytes_req.buckets=32:vals=hitcount:sort=bytes_req.buckets=32:size=2048 [active]"
    ));
    assert_eq!(
        entries(&hist),
        [
            "{ bytes_req: ~ 0-31 } hitcount:          2",
            "{ bytes_req: ~ 32-63 } hitcount:          1",
            "{ bytes_req: ~ 64-95 } hitcount:          1",
        ]
    );
    write(&trig, "").unwrap();
}

#[test]
fn size_rounds_up_and_a_full_table_drops() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(&trig, "hist:keys=call_site:size=100").unwrap();
    for site in 0..200u64 {
        kmalloc::trace(site, 0, 1, 1, 0);
    }
    kmalloc::trace(0, 0, 1, 1, 0);
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains("hist:keys=call_site:vals=hitcount:sort=hitcount:size=128 [active]"));
    assert_eq!(totals(&hist), (129, 128, 72));
    assert_eq!(
        write(&trig, "hist:keys=call_site:size=200000"),
        Err(ustrace::Errno(libc::EINVAL))
    );
    write(&trig, "").unwrap();
}

#[test]
fn errors_are_logged_with_a_caret() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(&trig, "").unwrap();
    // The kernel's trigger-hist-syntax-errors.tc and trigger-hist-expressions.tc cases.
    let cases: &[(&str, &str)] = &[
        ("hist:keys=common_pid:vals=bytes_req:sort=common_pid,^junk", "Sort field must be a key or a val"),
        ("hist:keys=common_pid:vals=bytes_req:^sort=", "Empty assignment"),
        ("hist:keys=common_pid:vals=bytes_req:^sort=common_pid,", "Empty sort field"),
        ("hist:keys=common_pid:vals=bytes_req:sort=common_pid.^junk", "Invalid sort modifier"),
        ("hist:keys=common_pid:vals=bytes_req,bytes_alloc:^sort=common_pid,bytes_req,bytes_alloc", "Too many sort fields (Max = 2)"),
        ("hist:keys=common_pid:x=32+^10*3/20-4", "Too many subexpressions (3 max)"),
        ("hist:keys=common_pid:x=^1+2+3+4+5", "Too many subexpressions (3 max)"),
        ("hist:keys=common_pid:x=-(^1)+2", "Unary minus not supported in sub-expressions"),
        ("hist:keys=common_pid:x=3/^0", "Division by zero"),
        ("hist:keys=^nosuch", "Couldn't find field"),
        ("hist:keys=call_site.^bogus", "Invalid field modifier"),
    ];
    for (with_caret, message) in cases {
        let pos = with_caret.find('^').unwrap();
        let command = with_caret.replace('^', "");
        write("error_log", "").unwrap();
        assert!(write(&trig, &command).is_err(), "{command}");
        let log = read("error_log").unwrap();
        let expect = format!(
            "hist:hkmem:kmalloc: error: {message}\n  Command: {command}\n{}^\n",
            " ".repeat(pos + 11)
        );
        assert!(log.ends_with(&expect), "{log}\nwanted\n{expect}");
        assert!(log.starts_with('['), "{log}");
    }
    // Expressions evaluate left to right with * and / first (trigger-hist-expressions.tc).
    for (expr, value) in [
        ("123", 123),
        ("16-8-4-2", 2),
        ("64/8/4/2", 1),
        ("16-8+4+2", 14),
        ("4*3/2*2", 12),
        ("4+3*2-2", 8),
        ("4+6/2-2", 5),
    ] {
        write(&trig, &format!("hist:keys=common_pid:x={expr}")).unwrap();
        let listing = read(&trig).unwrap();
        assert!(
            listing.contains(&format!(":x={value}:")),
            "{expr}: {listing}"
        );
    }
    write(&trig, "hist:keys=call_site").unwrap();
    assert_eq!(
        append(&trig, "hist:keys=call_site"),
        Err(ustrace::Errno(libc::EEXIST))
    );
    assert!(read("error_log").unwrap().ends_with("hist:hkmem:kmalloc: error: Hist trigger already exists\n  Command: hist:keys=call_site\n           ^\n"));
    assert_eq!(
        append(&trig, "hist:keys=bytes_req:cont"),
        Err(ustrace::Errno(libc::ENOENT))
    );
    assert!(read("error_log")
        .unwrap()
        .contains("error: Can't clear or continue a nonexistent hist trigger\n"));
    assert_eq!(
        append(&trig, "hist:keys=call_site:nohitcount"),
        Err(ustrace::Errno(libc::ENOENT))
    );
    // Removing what is not there succeeds.
    append(&trig, "!hist:keys=bytes_req").unwrap();
    write(&trig, "").unwrap();
}

#[test]
fn nohitcount_percent_and_graph() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(
        &trig,
        "hist:keys=call_site:vals=bytes_req.percent,bytes_req.graph:sort=call_site:NOHC",
    )
    .unwrap();
    for (site, n) in [(1u64, 10usize), (2, 30), (3, 60)] {
        kmalloc::trace(site, 0, n, n, 0);
    }
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert!(hist.contains("# trigger info: hist:keys=call_site:vals=bytes_req.percent,bytes_req.graph:sort=call_site:size=2048:nohitcount [active]\n"), "{hist}");
    assert_eq!(
        entries(&hist),
        [
            "{ call_site:          1 }  bytes_req (%):  10.00  bytes_req: ###                 ",
            "{ call_site:          2 }  bytes_req (%):  30.00  bytes_req: ##########          ",
            "{ call_site:          3 }  bytes_req (%):  60.00  bytes_req: ####################",
        ]
    );
    write(&trig, "").unwrap();
}

#[test]
fn hist_on_trace_marker_writes() {
    let _s = serial();
    let trig = "events/ftrace/print/trigger";
    write(trig, "hist:keys=common_pid if buf == \"start\"").unwrap();
    for text in ["start", "end", "start", "other", "start\n"] {
        write("trace_marker", text).unwrap();
    }
    let hist = read("events/ftrace/print/hist").unwrap();
    assert!(hist.contains("# trigger info: hist:keys=common_pid:vals=hitcount:sort=hitcount:size=2048 if buf == \"start\" [active]\n"), "{hist}");
    assert_eq!(
        entries(&hist),
        [format!(
            "{{ common_pid: {:>10} }} hitcount:          2",
            tid()
        )]
    );
    write(trig, "").unwrap();
}

/// Every event written is counted once, from more threads than there are CPUs.
#[test]
fn totals_equal_events_written_under_concurrency() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(&trig, "hist:keys=call_site:vals=bytes_req").unwrap();
    let threads = 2 * std::thread::available_parallelism().map_or(2, |n| n.get()) + 2;
    let secs: f64 = std::env::var("USTRACE_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut n = 0u64;
                while std::time::Instant::now() < deadline {
                    for _ in 0..64 {
                        // Few keys, so threads race on the same elements and on new claims.
                        kmalloc::trace((n + t as u64) % 37, 0, 2, 2, 0);
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let written: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert_eq!(totals(&hist), (written, 37, 0));
    let bytes: u64 = entries(&hist)
        .iter()
        .map(|l| l.rsplit(':').next().unwrap().trim().parse::<u64>().unwrap())
        .sum();
    assert_eq!(bytes, 2 * written);
    write(&trig, "").unwrap();
}

/// `:clear` while writers run: updates stop and the ones in flight finish before the table
/// is reset, so no entry keeps half an update (every event adds 1 hit and 2 bytes), and the
/// table counts on afterwards.
#[test]
fn clear_under_concurrent_writers_leaves_whole_entries() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(&trig, "hist:keys=call_site:vals=bytes_req").unwrap();
    let threads = 2 * std::thread::available_parallelism().map_or(2, |n| n.get()) + 2;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    kmalloc::trace((n + t as u64) % 37, 0, 2, 2, 0);
                    n += 1;
                }
            })
        })
        .collect();
    for _ in 0..200 {
        append(&trig, "hist:keys=call_site:vals=bytes_req:clear").unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    for entry in entries(&hist) {
        let number = |name: &str| -> u64 {
            let at = entry.find(name).unwrap() + name.len();
            entry[at..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        assert_eq!(number("bytes_req:"), 2 * number("hitcount:"), "{entry}");
    }
    let (hits, _, dropped) = totals(&hist);
    assert_eq!(dropped, 0);
    // Counting goes on after the last clear.
    append(&trig, "hist:keys=call_site:vals=bytes_req:clear").unwrap();
    for n in 0..10 {
        kmalloc::trace(n % 3, 0, 2, 2, 0);
    }
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    assert_eq!(totals(&hist), (10, 3, 0), "{hits} hits before");
    write(&trig, "").unwrap();
}

/// A trigger that uses timestamps sets its instance's clock (`global` unless `clock=` says
/// otherwise), and an unknown clock is refused with the kernel's error.
#[test]
fn timestamps_set_the_trace_clock() {
    let _s = serial();
    let _ = ustrace::tracefs().rmdir("instances/histclk");
    use ustrace::FileSystem;
    ustrace::tracefs().mkdir("instances/histclk").unwrap();
    let dir = "instances/histclk";
    let trig = format!("{dir}/{KMALLOC}/trigger");
    write(&format!("{dir}/trace_clock"), "local").unwrap();
    assert!(read(&format!("{dir}/trace_clock"))
        .unwrap()
        .contains("[local]"));
    write(&trig, "hist:keys=common_pid:ts0=common_timestamp.usecs").unwrap();
    assert!(read(&format!("{dir}/trace_clock"))
        .unwrap()
        .contains("[global]"));
    assert_eq!(
        read(&trig).unwrap(),
        "hist:keys=common_pid:vals=hitcount:ts0=common_timestamp.usecs:sort=hitcount:size=2048:clock=global [active]\n"
    );
    write(&trig, "hist:keys=common_pid:t=common_timestamp:clock=mono").unwrap();
    assert!(read(&format!("{dir}/trace_clock"))
        .unwrap()
        .contains("[mono]"));
    write(&format!("{dir}/error_log"), "").unwrap();
    assert_eq!(
        write(&trig, "hist:keys=call_site:t=common_timestamp:clock=nosuch"),
        Err(ustrace::Errno(libc::EINVAL))
    );
    let command = "hist:keys=call_site:t=common_timestamp:clock=nosuch";
    let log = read(&format!("{dir}/error_log")).unwrap();
    let caret = format!("{}^\n", " ".repeat(11 + command.find("nosuch").unwrap()));
    assert!(
        log.ends_with(&format!(
            "hist:hkmem:kmalloc: error: Couldn't set trace_clock\n  Command: {command}\n{caret}"
        )),
        "{log}"
    );
    write(&trig, "").unwrap();
    ustrace::tracefs().rmdir(dir).unwrap();
}

/// A `__data_loc` string key holds the string (up to 255 bytes), as the kernel's.
#[test]
fn dynamic_string_keys() {
    let _s = serial();
    let trig = "events/hsched/sched_process_exec/trigger";
    write(trig, "hist:keys=filename:sort=filename").unwrap();
    let long = "x".repeat(300);
    for f in ["/usr/bin/wget", "/bin/sh", "/usr/bin/wget", long.as_str()] {
        sched_process_exec::trace(f);
    }
    let hist = read("events/hsched/sched_process_exec/hist").unwrap();
    assert_eq!(
        entries(&hist),
        [
            format!("{{ filename: {:<50} }} hitcount:          1", "/bin/sh"),
            format!(
                "{{ filename: {:<50} }} hitcount:          2",
                "/usr/bin/wget"
            ),
            format!("{{ filename: {} }} hitcount:          1", "x".repeat(255)),
        ]
    );
    write(trig, "").unwrap();
}

/// The whole `hist` file of an event with three triggers, byte for byte (sections after the
/// first start with two blank lines; an empty table still prints its totals).
#[test]
fn hist_file_layout_matches_the_golden_file() {
    let _s = serial();
    let trig = "events/hnet/netif_receive_skb/trigger";
    write(trig, "hist:keys=skbaddr.hex:vals=len if len > 4096").unwrap();
    append(trig, "hist:keys=skbaddr.hex:vals=len if len < 0").unwrap();
    append(
        trig,
        "hist:keys=len,skbaddr.hex:sort=len.descending,hitcount:size=100",
    )
    .unwrap();
    for (addr, len) in [
        (0xffff_8800_9fd2_c300u64, 7212u32),
        (0xffff_8800_d2bc_da00, 21492),
        (0xffff_8800_9fd2_c300, 7212),
        (0xffff_8800_baee_5e00, 130),
    ] {
        netif_receive_skb::trace(addr, len);
    }
    append(
        trig,
        "hist:keys=len,skbaddr.hex:sort=len.descending,hitcount:size=128:pause",
    )
    .unwrap();
    netif_receive_skb::trace(1, 1);
    assert_eq!(
        read("events/hnet/netif_receive_skb/hist").unwrap(),
        include_str!("golden/hist_netif.hist")
    );
    write(trig, "").unwrap();
}

/// Handlers are inter-event support's (tests/hist_inter.rs): a trigger with one registers
/// and lists it.
#[test]
fn handlers_register_with_inter_event_support() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(&trig, "").unwrap();
    write(
        &trig,
        "hist:keys=call_site:m=bytes_req:onmax($m).save(bytes_alloc)",
    )
    .unwrap();
    assert!(
        read(&trig)
            .unwrap()
            .contains(":onmax($m).save(bytes_alloc) [active]"),
        "{}",
        read(&trig).unwrap()
    );
    write(&trig, "").unwrap();
}

/// The selftests' `reset_trigger`: each listed line, cut before its `[`, written back after
/// a `!`, removes that trigger (named ones, filtered ones, with modifiers and clocks).
#[test]
fn listed_lines_remove_their_triggers() {
    let _s = serial();
    let trig = format!("{KMALLOC}/trigger");
    write(
        &trig,
        "hist:keys=call_site.sym-offset:vals=bytes_req if bytes_req > 10",
    )
    .unwrap();
    append(&trig, "hist:name=test_hist:keys=common_pid.execname").unwrap();
    append(
        &trig,
        "hist:keys=common_cpu,gfp_flags.hex:t=common_timestamp.usecs:size=200",
    )
    .unwrap();
    append(&trig, "hist:keys=cpu:vals=bytes_alloc:NOHC").unwrap();
    append(&trig, "stacktrace:3").unwrap();
    kmalloc::trace(1, 0, 20, 32, 0x10);
    let listing = read(&trig).unwrap();
    assert_eq!(listing.lines().count(), 5, "{listing}");
    // `cpu` is the generic field when the event has none of that name.
    assert!(
        listing.contains(
            "hist:keys=common_cpu:vals=bytes_alloc:sort=hitcount:size=2048:nohitcount [active]\n"
        ),
        "{listing}"
    );
    let hist = read(&format!("{KMALLOC}/hist")).unwrap();
    // The CPU the event ran on (the thread may have moved since: any CPU of ours).
    let line = hist
        .lines()
        .find(|l| l.starts_with("{ common_cpu:"))
        .unwrap();
    let cpu: usize = line["{ common_cpu:".len()..line.find(',').unwrap()]
        .trim()
        .parse()
        .unwrap();
    assert!(cpu < ustrace_ringbuf::cpu::possible_cpus(), "{line}");
    assert_eq!(
        line,
        format!("{{ common_cpu: {cpu:>10}, gfp_flags: 10 }} hitcount:          1")
    );
    for line in listing.lines() {
        let cut = line.split('[').next().unwrap();
        append(&trig, &format!("!{cut}")).unwrap();
    }
    assert!(read(&trig).unwrap().starts_with("# Available triggers:"));
    assert_eq!(read(&format!("{KMALLOC}/hist")).unwrap(), "");
}
