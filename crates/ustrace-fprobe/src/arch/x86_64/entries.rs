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
//!        │ read once per segment; its "far" candidates listed once: every byte position
//!        │ that, were it the opcode of a call/jmp/jcc rel32 or xbegin, would branch inside
//!        │ the segment, as sorted (target, position)
//!        ▼
//!   candidates into patch_at+1 .. patch_at+len: far ones from the list, short (rel8) ones
//!   from the 256 bytes around ──► none: no branch enters (the common case)
//!        │ some
//!        ▼
//!   decode the regions that hold them as one linear sweep of the segment would, restarting
//!   at every symbol start (padding or data cannot hide an instruction boundary for long):
//!   any real direct jmp/jcc/call/loop/xbegin into the bytes?
//! ```
//!
//! Every real branch has its opcode at a position the byte scan considers, with the same
//! target, so the candidates hold every real entry, and decoding only their regions answers
//! as a sweep of the whole segment would (a test holds the two against each other), at a
//! fraction of the cost: the whole of a large program's text took tens of milliseconds to
//! decode, the byte scan takes a few. The index is kept for the life of the process. Calls
//! from other objects go through the PLT or GOT, so they reach symbol starts, which the first
//! check covers. Indirect branches (jump tables, computed gotos) stay unchecked, as the crate
//! docs say.

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

static CACHE: Mutex<Vec<(Segment, Arc<Index>)>> = Mutex::new(Vec::new());

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
    // Sorted by address: the first symbol at or after the interior's start is the only one
    // that needs looking at (a scan to the end made this check linear in the inventory).
    if let Some(s) = symbols.get(first).filter(|s| s.addr < interior.end) {
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
    if let Some((target, from)) = index.first_entry(interior) {
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

fn index_of(seg: &Segment, symbols: &[Symbol]) -> Result<Arc<Index>, String> {
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, idx)) = cache.iter().find(|(s, _)| s == seg) {
        return Ok(Arc::clone(idx));
    }
    let code = segment_bytes(seg)?;
    let idx = Arc::new(Index::new(seg.start, code, symbols));
    // A segment that was unmapped and replaced keeps its old index only while the range,
    // file and offset all match, which then means the same code.
    cache.retain(|(s, _)| s.end <= seg.start || s.start >= seg.end);
    cache.push((seg.clone(), Arc::clone(&idx)));
    Ok(idx)
}

/// What one executable segment tells about branches into it.
struct Index {
    base: usize,
    /// The segment's original bytes.
    code: Vec<u8>,
    /// Where the sweep (re)starts: the segment's start and every symbol start in it, sorted,
    /// then the segment's end.
    starts: Vec<usize>,
    /// Far candidates: `(target - base) << 32 | (opcode position - base)`, sorted.
    far: Vec<u64>,
}

impl Index {
    fn new(base: usize, code: Vec<u8>, symbols: &[Symbol]) -> Index {
        let end = base + code.len();
        let lo = symbols.partition_point(|s| s.addr < base);
        let hi = symbols.partition_point(|s| s.addr < end);
        let mut starts: Vec<usize> = std::iter::once(base)
            .chain(symbols[lo..hi].iter().map(|s| s.addr))
            .collect();
        starts.dedup();
        starts.push(end);
        // Calls alone are about one in twenty bytes of compiled code.
        let mut far = Vec::with_capacity(code.len() / 16);
        super::insn::branch_candidates(&code, base, false, |q, t| {
            if t >= base as u64 && t < end as u64 {
                far.push((t - base as u64) << 32 | q as u64);
            }
        });
        far.sort_unstable();
        Index {
            base,
            code,
            starts,
            far,
        }
    }

    /// The direct branch into `interior` with the lowest target (then the lowest source
    /// address), as `(target, source instruction)`.
    fn first_entry(&self, interior: std::ops::Range<usize>) -> Option<(usize, usize)> {
        let base = self.base;
        let end = base + self.code.len();
        if interior.start < base || interior.end > end || interior.is_empty() {
            return None;
        }
        let (ts, te) = ((interior.start - base) as u64, (interior.end - base) as u64);
        let mut cands: Vec<usize> = Vec::new();
        let i = self.far.partition_point(|&c| c >> 32 < ts);
        cands.extend(
            self.far[i..]
                .iter()
                .take_while(|&&c| c >> 32 < te)
                .map(|&c| base + (c & 0xffff_ffff) as usize),
        );
        // A short branch reaches 128 bytes back and 127 forward of its end (opcode + 2); its
        // displacement byte may lie one past the window.
        let lo = interior.start.saturating_sub(129).max(base);
        let hi = (interior.end + 126).min(end);
        let with_disp = (hi + 1).min(end);
        super::insn::branch_candidates(
            &self.code[lo - base..with_disp - base],
            lo,
            true,
            |q, t| {
                // Far forms found here are in `far` too; a duplicate is decoded once.
                if q < hi - lo && interior.contains(&(t as usize)) {
                    cands.push(lo + q);
                }
            },
        );
        if cands.is_empty() {
            return None;
        }
        // Decode every region that holds a candidate, each once.
        let mut regions: Vec<usize> = cands
            .iter()
            .map(|&q| self.starts.partition_point(|&s| s <= q) - 1)
            .collect();
        regions.sort_unstable();
        regions.dedup();
        let mut best: Option<(usize, usize)> = None;
        let mut ins = Instruction::default();
        for r in regions {
            let (from, to) = (self.starts[r], self.starts[r + 1]);
            let mut d = Decoder::with_ip(
                64,
                &self.code[from - base..to - base],
                from as u64,
                DecoderOptions::NONE,
            );
            while d.can_decode() {
                d.decode_out(&mut ins);
                if let Some(t) = branch_target(&ins) {
                    if interior.contains(&t) {
                        let hit = (t, ins.ip() as usize);
                        best = Some(best.map_or(hit, |b| b.min(hit)));
                    }
                }
            }
        }
        best
    }
}

/// The target of a direct near branch (`None` for anything else, or an invalid encoding).
fn branch_target(ins: &Instruction) -> Option<usize> {
    if ins.is_invalid() {
        return None;
    }
    matches!(
        ins.flow_control(),
        FlowControl::ConditionalBranch
            | FlowControl::UnconditionalBranch
            | FlowControl::Call
            | FlowControl::XbeginXabortXend
    )
    .then(|| ins.near_branch_target() as usize)
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

/// Every direct branch of `code` (loaded at `base`) into it, as `(target, source)` sorted
/// and one per target: the linear sweep, restarted at every symbol start, that
/// [`Index::first_entry`] must agree with.
#[cfg(test)]
fn sweep(base: usize, code: &[u8], symbols: &[Symbol]) -> Vec<(usize, usize)> {
    let end = base + code.len();
    let idx = Index::new(base, code.to_vec(), symbols);
    let mut out = Vec::new();
    let mut ins = Instruction::default();
    for w in idx.starts.windows(2) {
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
            if let Some(t) = branch_target(&ins) {
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

/// The program's file, read once: a process keeps its executable until it execs another,
/// and this runs for every function analysed.
fn exe_path() -> Option<String> {
    static EXE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        std::fs::read_link("/proc/self/exe")
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    })
    .clone()
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
                    exe_path()
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

#[cfg(test)]
mod tests {
    use super::*;
    use ustrace_inspect::symbols::Binding;

    const BASE: usize = 0x40_0000;

    fn sym(addr: usize) -> Symbol {
        Symbol {
            name: format!("f{addr:x}"),
            mangled: format!("f{addr:x}"),
            addr,
            size: 0,
            object: "test".into(),
            binding: Binding::Global,
            ifunc: false,
        }
    }

    /// What the index answered before it learnt to decode only around candidates.
    fn by_sweep(
        list: &[(usize, usize)],
        interior: std::ops::Range<usize>,
    ) -> Option<(usize, usize)> {
        let i = list.partition_point(|&(t, _)| t < interior.start);
        list.get(i).copied().filter(|(t, _)| interior.contains(t))
    }

    /// One piece of generated code: a random byte, or a branch (with optional prefix) whose
    /// displacement aims at a chosen offset of the buffer.
    #[derive(Clone, Debug)]
    enum Piece {
        Byte(u8),
        Branch { form: u8, prefix: bool, to: u16 },
    }

    fn assemble(pieces: &[Piece]) -> Vec<u8> {
        let mut code = Vec::new();
        for p in pieces {
            match *p {
                Piece::Byte(b) => code.push(b),
                Piece::Branch { form, prefix, to } => {
                    if prefix {
                        code.push(if form % 2 == 0 { 0x66 } else { 0x3e });
                    }
                    let at = code.len() as i64;
                    let to = to as i64;
                    match form % 6 {
                        0 => {
                            code.push(0xe8 | (form / 6) & 1);
                            code.extend_from_slice(&((to - at - 5) as i32).to_le_bytes());
                        }
                        1 => {
                            code.extend_from_slice(&[0x0f, 0x80 | form >> 4]);
                            code.extend_from_slice(&((to - at - 6) as i32).to_le_bytes());
                        }
                        2 => {
                            code.extend_from_slice(&[0xc7, 0xf8]);
                            code.extend_from_slice(&((to - at - 6) as i32).to_le_bytes());
                        }
                        3 => {
                            code.extend_from_slice(&[0xc7, 0xf8]);
                            code.extend_from_slice(&((to - at - 4) as i16).to_le_bytes());
                        }
                        4 => code.extend_from_slice(&[0x70 | form >> 4, (to - at - 2) as i8 as u8]),
                        _ => {
                            let op = if form >> 6 == 3 {
                                0xeb
                            } else {
                                0xe0 | (form >> 4) & 3
                            };
                            code.extend_from_slice(&[op, (to - at - 2) as i8 as u8]);
                        }
                    }
                }
            }
        }
        code
    }

    fn piece() -> impl proptest::strategy::Strategy<Value = Piece> {
        use proptest::prelude::*;
        prop_oneof![
            3 => any::<u8>().prop_map(Piece::Byte),
            1 => (any::<u8>(), any::<bool>(), 0u16..600).prop_map(|(form, prefix, to)| Piece::Branch { form, prefix, to }),
        ]
    }

    proptest::proptest! {
        /// On any bytes, branches and symbol starts, decoding only around candidates finds
        /// the same first entry into any range as a sweep of the whole segment.
        #[test]
        fn candidates_agree_with_a_full_sweep(
            pieces in proptest::collection::vec(piece(), 50..400),
            starts in proptest::collection::vec(0usize..600, 0..12),
            probes in proptest::collection::vec((0usize..620, 1usize..20), 1..40),
        ) {
            let code = assemble(&pieces);
            let mut syms: Vec<Symbol> = starts.iter().filter(|&&s| s < code.len()).map(|&s| sym(BASE + s)).collect();
            syms.sort_by_key(|s| s.addr);
            let list = sweep(BASE, &code, &syms);
            let idx = Index::new(BASE, code.clone(), &syms);
            for (at, len) in probes {
                let r = BASE + at..BASE + (at + len).min(code.len());
                proptest::prop_assert_eq!(idx.first_entry(r.clone()), by_sweep(&list, r.clone()), "{:x?}", r);
            }
        }
    }

    #[test]
    fn candidates_agree_with_a_full_sweep_on_the_c_library() {
        let inv = ustrace_inspect::symbols::inventory();
        let Some(libc) = inv
            .functions()
            .iter()
            .find(|s| s.object.contains("libc.so") && s.name == "malloc")
        else {
            eprintln!("skipped: no libc malloc in the inventory");
            return;
        };
        let seg = segment_of(libc.addr).expect("libc's text is a loaded segment");
        let code = segment_bytes(&seg).expect("libc's text is readable");
        let syms = inv.functions();
        let list = sweep(seg.start, &code, syms);
        let idx = Index::new(seg.start, code, syms);
        let mut entered = 0;
        for s in syms
            .iter()
            .filter(|s| s.addr >= seg.start && s.addr < seg.end)
        {
            for r in [s.addr + 1..s.addr + 5, s.addr + 5..s.addr + 9] {
                let r = r.start..r.end.min(seg.end);
                let want = by_sweep(&list, r.clone());
                entered += want.is_some() as usize;
                assert_eq!(idx.first_entry(r.clone()), want, "{} {r:x?}", s.name);
            }
        }
        eprintln!("{entered} prologue ranges of libc are entered by a branch");
    }
}
