//! Other ways into a prologue: refuses a patch when code may be entered strictly inside the
//! bytes the `jmp` replaces from anywhere but the patch address itself.
//!
//! `insn::analyze` already checks the branches of the probed function. That is not enough:
//! hand-written code shares tails between entry points. In glibc's `ld.so`, `mempcpy` is
//! `mov rax, rdi; add rax, rdx; jmp memcpy+3`, so a thread calling `mempcpy` while `memcpy`
//! was patched landed in the middle of the `jmp` (issue 15). Two more kinds of entry exist:
//! another symbol that starts inside the patched bytes (reached through a PLT, `dlsym` or a
//! function pointer, so no branch in the object shows it), and direct branches from any other
//! function of the object. Before the analysis accepts a function, this module checks both:
//!
//! ```text
//!   inventory (sorted by address) ──► any other symbol starting in patch_at+1 .. patch_at+len?
//!   the object's executable segment, from its file on disk (pristine: no patches of ours)
//!        │ decoded once per segment, restarting at every symbol start so padding or data
//!        │ cannot hide an instruction boundary for long
//!        ▼
//!   sorted (target, source) of every direct jmp/jcc/call/loop/xbegin ──► any target inside?
//! ```
//!
//! The index is built once per executable segment (tens of milliseconds for libc in a release
//! build) and kept for the life of the process. Calls from other objects go through the PLT or
//! GOT, so they reach symbol starts, which the first check covers. Indirect branches (jump
//! tables, computed gotos) stay unchecked, as the crate docs say.

use std::ffi::CStr;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};
use ustrace_inspect::symbols::Symbol;

/// One executable `PT_LOAD` segment of a loaded object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Segment {
    /// Runtime range.
    start: usize,
    end: usize,
    /// File the object was loaded from (`None` for the vDSO / anything without a file).
    path: Option<String>,
    /// File offset of `start`, and how many bytes of the segment the file holds.
    offset: u64,
    file_len: usize,
}

/// Direct branch targets of one segment: `(target, source instruction)`, sorted by target.
type Index = Arc<Vec<(usize, usize)>>;

static CACHE: Mutex<Vec<(Segment, Index)>> = Mutex::new(Vec::new());

/// Checks that nothing but the patch address enters `patch_at+1 .. patch_at+len`. `symbols`
/// is every function the inventory knows, sorted by address (as `Inventory::functions`).
pub(crate) fn check(
    func: usize,
    patch_at: usize,
    len: usize,
    symbols: &[Symbol],
) -> Result<(), String> {
    let interior = patch_at + 1..patch_at + len;
    let first = symbols.partition_point(|s| s.addr < interior.start);
    if let Some(s) = symbols[first..].iter().find(|s| interior.contains(&s.addr)) {
        return Err(format!(
            "another function, {}, starts inside the patched bytes (+{:#x})",
            s.name,
            s.addr - func
        ));
    }
    let Some(seg) = segment_of(func) else {
        // Not in any loaded object (generated code): only the function's own branches,
        // which insn::analyze checked, can be known.
        return Ok(());
    };
    let index = index_of(&seg, symbols)?;
    let i = index.partition_point(|&(t, _)| t < interior.start);
    if let Some(&(target, from)) = index.get(i).filter(|(t, _)| interior.contains(t)) {
        let who = match symbols[..symbols.partition_point(|s| s.addr <= from)].last() {
            Some(s) if s.contains(from) => format!("{}+{:#x}", s.name, from - s.addr),
            _ => format!("{from:#x}"),
        };
        return Err(format!(
            "a branch at {who} enters the patched bytes at +{:#x}",
            target - func
        ));
    }
    Ok(())
}

fn index_of(seg: &Segment, symbols: &[Symbol]) -> Result<Index, String> {
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, idx)) = cache.iter().find(|(s, _)| s == seg) {
        return Ok(Arc::clone(idx));
    }
    let code = segment_bytes(seg)?;
    let idx = Arc::new(scan(seg.start, &code, symbols));
    // A segment that was unmapped and replaced keeps its old index only while the range,
    // file and offset all match, which then means the same code.
    cache.retain(|(s, _)| s.end <= seg.start || s.start >= seg.end);
    cache.push((seg.clone(), Arc::clone(&idx)));
    Ok(idx)
}

/// The segment's original bytes: from the file when it holds them all (our own patches are
/// not in it), else from memory.
fn segment_bytes(seg: &Segment) -> Result<Vec<u8>, String> {
    let len = seg.end - seg.start;
    if let Some(path) = &seg.path {
        if seg.file_len >= len {
            let mut buf = vec![0u8; len];
            if let Ok(f) = std::fs::File::open(path) {
                if f.read_exact_at(&mut buf, seg.offset).is_ok() {
                    return Ok(buf);
                }
            }
        }
    }
    let mut buf = vec![0u8; len];
    super::read_text(seg.start, &mut buf)
        .map_err(|e| format!("cannot read the code around the function: {e}"))?;
    Ok(buf)
}

/// Linear sweep of `code` (loaded at `base`), restarted at every symbol start.
fn scan(base: usize, code: &[u8], symbols: &[Symbol]) -> Vec<(usize, usize)> {
    let end = base + code.len();
    let lo = symbols.partition_point(|s| s.addr < base);
    let hi = symbols.partition_point(|s| s.addr < end);
    let mut starts: Vec<usize> = std::iter::once(base)
        .chain(symbols[lo..hi].iter().map(|s| s.addr))
        .collect();
    starts.dedup();
    starts.push(end);
    let mut out = Vec::new();
    let mut ins = Instruction::default();
    for w in starts.windows(2) {
        let (from, to) = (w[0], w[1]);
        if to <= from {
            continue;
        }
        let mut d = Decoder::with_ip(
            64,
            &code[from - base..to - base],
            from as u64,
            DecoderOptions::NONE,
        );
        while d.can_decode() {
            d.decode_out(&mut ins);
            if ins.is_invalid() {
                continue;
            }
            if matches!(
                ins.flow_control(),
                FlowControl::ConditionalBranch
                    | FlowControl::UnconditionalBranch
                    | FlowControl::Call
                    | FlowControl::XbeginXabortXend
            ) {
                let t = ins.near_branch_target() as usize;
                if t >= base && t < end {
                    out.push((t, ins.ip() as usize));
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup_by_key(|e| e.0);
    out
}

/// The executable segment of a loaded object that contains `addr`.
fn segment_of(addr: usize) -> Option<Segment> {
    struct Search {
        addr: usize,
        found: Option<Segment>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info record and our own `data`.
        let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: the loader's program header table of this object, dlpi_phnum entries.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let bias = info.dlpi_addr as usize;
        for ph in phdrs {
            if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_X == 0 {
                continue;
            }
            let start = bias.wrapping_add(ph.p_vaddr as usize);
            let end = start + ph.p_memsz as usize;
            if (start..end).contains(&search.addr) {
                let name = if info.dlpi_name.is_null() {
                    String::new()
                } else {
                    // SAFETY: the loader's NUL-terminated object name.
                    unsafe { CStr::from_ptr(info.dlpi_name) }
                        .to_string_lossy()
                        .into_owned()
                };
                let path = if name.is_empty() {
                    std::fs::read_link("/proc/self/exe")
                        .ok()
                        .map(|p| p.to_string_lossy().into_owned())
                } else if name.starts_with('/') {
                    Some(name)
                } else {
                    None // linux-vdso.so.1: no file
                };
                search.found = Some(Segment {
                    start,
                    end,
                    path,
                    offset: ph.p_offset,
                    file_len: ph.p_filesz as usize,
                });
                return 1;
            }
        }
        0
    }
    let mut search = Search { addr, found: None };
    // SAFETY: the callback only reads the records it is given and writes `search`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut search as *mut Search).cast()) };
    search.found
}
