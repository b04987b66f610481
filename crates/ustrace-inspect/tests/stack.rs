//! Stack capture through a known call chain, and kernel-style printing.

use std::hint::black_box;

use ustrace_inspect::stack;
use ustrace_inspect::symbols::{self, SymFlags};

#[inline(never)]
fn chain_outer(skip: usize, out: &mut [usize], fp: bool) -> usize {
    black_box(chain_middle(skip, out, fp)) + black_box(0)
}

#[inline(never)]
fn chain_middle(skip: usize, out: &mut [usize], fp: bool) -> usize {
    black_box(chain_inner(skip, out, fp)) + black_box(0)
}

#[inline(never)]
fn chain_inner(skip: usize, out: &mut [usize], fp: bool) -> usize {
    let n = if black_box(fp) {
        stack::capture_frame_pointers(skip, out)
    } else {
        stack::capture(skip, out)
    };
    black_box(n) + black_box(0)
}

fn names(addrs: &[usize]) -> Vec<String> {
    let inv = symbols::inventory();
    addrs
        .iter()
        .map(|&a| {
            inv.lookup(a)
                .map_or_else(|| format!("{a:#x}"), |(s, _)| s.name.clone())
        })
        .collect()
}

#[test]
fn capture_yields_the_call_chain_innermost_first() {
    let mut out = [0usize; 64];
    let n = chain_root(&mut out);
    let got = names(&out[..n]);
    assert!(n >= 4, "{got:?}");
    assert_eq!(got[0], "stack::chain_inner");
    assert_eq!(got[1], "stack::chain_middle");
    assert_eq!(got[2], "stack::chain_outer");
    assert_eq!(got[3], "stack::chain_root");
}

#[inline(never)]
fn chain_root(out: &mut [usize]) -> usize {
    black_box(chain_outer(0, out, false)) + black_box(0)
}

#[test]
fn skip_drops_innermost_frames_and_short_buffers_truncate() {
    let mut out = [0usize; 2];
    let n = chain_outer(1, &mut out, false);
    assert_eq!(n, 2);
    assert_eq!(names(&out), ["stack::chain_middle", "stack::chain_outer"]);
    assert_eq!(stack::capture(0, &mut []), 0);
}

#[test]
fn frame_pointer_walk_is_safe_and_finds_frames_when_present() {
    let mut out = [0usize; 64];
    let n = chain_outer(0, &mut out, true);
    let got = names(&out[..n]);
    eprintln!("frame-pointer walk: {got:?}");
    // Every entry it reports must be a real return address into known code.
    let inv = symbols::inventory();
    assert!(out[..n].iter().all(|&a| inv.lookup(a).is_some()), "{got:?}");
    if n >= 3 && got[0] == "stack::chain_inner" {
        assert_eq!(got[1], "stack::chain_middle");
        assert_eq!(got[2], "stack::chain_outer");
    }
}

#[test]
fn format_matches_kernel_stack_entry_layout() {
    let mut out = [0usize; 8];
    let n = chain_outer(0, &mut out, false);
    let inv = symbols::inventory();
    let text = stack::format_kernel_style(&inv, &out[..n]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), n);
    assert!(text.ends_with('\n'));
    let (sym, off) = inv.lookup(out[0]).unwrap();
    assert_eq!(
        lines[0],
        format!(" => stack::chain_inner+{off:#x}/{:#x}", sym.size)
    );
    for l in &lines {
        assert!(l.starts_with(" => "), "{l}");
        let body = &l[4..];
        let (name, rest) = body.split_once('+').unwrap_or((body, ""));
        assert!(!name.is_empty());
        if !rest.is_empty() {
            let (o, s) = rest.split(' ').next().unwrap().split_once('/').unwrap();
            assert!(o.starts_with("0x") && s.starts_with("0x"), "{l}");
        }
    }
    // The kernel's default (nosym-offset) prints bare names.
    let plain = stack::format_with_flags(&inv, &out[..2], SymFlags::default());
    assert_eq!(plain, " => stack::chain_inner\n => stack::chain_middle\n");
    // Unknown addresses print as hex; 0 prints as "0"; ULONG_MAX ends the list.
    let odd = stack::format_kernel_style(&inv, &[0x10, 0, usize::MAX, 0x20]);
    assert_eq!(odd, " => 0x00000010\n => 0\n");
}

#[test]
fn capture_cost() {
    let mut out = [0usize; 32];
    let n = chain_outer(0, &mut out, false);
    let iters = 20_000;
    let t = std::time::Instant::now();
    for _ in 0..iters {
        black_box(chain_outer(0, &mut out, false));
    }
    let per = t.elapsed().as_nanos() as f64 / iters as f64;
    eprintln!("stack::capture of {n} frames: {per:.0} ns");
    // Printed, not asserted: speed is a benchmark's business. The walk must still see the
    // chain it runs in.
    assert!(n >= 3, "{n} frames");
}

#[test]
fn user_stack_format_matches_trace_user_stack_print() {
    let mut out = [0usize; 4];
    let n = chain_outer(0, &mut out, false);
    let a = out[0];
    // Default options: no object, so the address in angle brackets.
    let plain = stack::format_user_stack(&out[..1], false, false);
    assert_eq!(plain, format!(" =>  <{a:016x}>\n"));
    // sym-userobj: the mapped file and the offset into that mapping.
    let maps = stack::file_mappings().unwrap();
    let m = maps
        .iter()
        .find(|m| m.start <= a && a < m.end)
        .expect("text is file-backed");
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    assert_eq!(std::path::Path::new(&m.path), exe);
    let obj = stack::format_user_stack(&out[..1], true, false);
    assert_eq!(obj, format!(" => {}[+{:#x}]\n", m.path, a - m.start));
    let both = stack::format_user_stack(&out[..1], true, true);
    assert_eq!(
        both,
        format!(" => {}[+{:#x}] <{a:016x}>\n", m.path, a - m.start)
    );
    // A zero entry ends the trace.
    let cut = stack::format_user_stack(&[a, 0, a], false, false);
    assert_eq!(cut.lines().count(), 1);
    assert!(n >= 1);
}
