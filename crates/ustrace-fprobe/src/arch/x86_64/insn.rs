//! Prologue analysis and relocation with iced-x86.
//!
//! A probe replaces the first 5 bytes at the patch address with `jmp rel32`. The instructions
//! that overlap those bytes are copied (re-encoded for their new address) into the site's
//! "original-code stub", which ends with a jump back to the first untouched instruction:
//!
//! ```text
//!   func:      f3 0f 1e fa        endbr64           <- kept: indirect-branch landing pad
//!   patch_at:  55                 push rbp          \
//!              48 89 e5           mov rbp, rsp       } relocated (5+ bytes)
//!              48 8b 05 xx..      mov rax,[rip+X]   /   (rip-relative operand re-encoded)
//!   resume:    ...                                  <- orig stub jumps back here
//! ```
//!
//! A function is refused, never patched wrongly, when: the bytes cannot be decoded; the
//! relocated range contains control flow (branch, call, ret, syscall, int3, ...); the function
//! (when its size is known) is shorter than the patch; or any direct branch of the function lands
//! strictly inside the patched bytes (such a branch would execute half of the `jmp`). Indirect
//! branches (jump tables) cannot be checked; compilers do not target a prologue with them.

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, Mnemonic,
};

/// Bytes a probe overwrites.
pub(crate) const PATCH_LEN: usize = 5;
/// Upper bound on the relocated copy (several long instructions, each possibly grown).
pub(crate) const MAX_RELOCATED: usize = 96;

/// The decoded prologue of one function.
pub(crate) struct Prologue {
    /// First byte overwritten (after `endbr64` when present).
    pub patch_at: usize,
    /// Length of the relocated instructions (>= PATCH_LEN).
    pub len: usize,
    /// Original bytes of the relocated range.
    pub original: Vec<u8>,
    instructions: Vec<Instruction>,
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Bytes read at the start of every function for its prologue.
const HEAD: usize = 64;

/// Current code of many functions, read with one `/proc/self/mem` read per run of neighbouring
/// functions instead of two per function (thousands are analysed when a tracer is switched on
/// for all of them). Runs are joined as `text_poke` joins its spans: only ranges that start on
/// the page where the run ends or on the next one, so a run covers no page that holds none of
/// the functions.
#[derive(Default)]
pub(crate) struct CodeCache {
    /// Sorted, disjoint `(start, bytes)`.
    runs: Vec<(usize, Vec<u8>)>,
}

impl CodeCache {
    /// Reads what [`analyze`] will read of each `(func, size)`.
    pub(crate) fn read(funcs: &[(usize, Option<usize>)]) -> CodeCache {
        let mut ranges: Vec<(usize, usize)> = funcs
            .iter()
            .map(|&(func, size)| (func, func + HEAD.max(scan_len(size))))
            .collect();
        ranges.sort_unstable();
        let mut cache = CodeCache::default();
        cache.fill(&ranges);
        cache.runs.sort_unstable_by_key(|r| r.0);
        cache
    }

    /// Reads the runs of `ranges` (sorted); a run that cannot be read whole (one of its
    /// functions ends near the end of its mapping, say) is split in two and retried, down to
    /// single functions, which [`read`] then reads itself.
    fn fill(&mut self, ranges: &[(usize, usize)]) {
        const PAGE: usize = 4096;
        let mut i = 0;
        while i < ranges.len() {
            let (start, mut end) = ranges[i];
            let mut j = i + 1;
            while j < ranges.len() && ranges[j].0 / PAGE <= (end - 1) / PAGE + 1 {
                end = end.max(ranges[j].1);
                j += 1;
            }
            let mut buf = vec![0u8; end - start];
            if super::read_text(start, &mut buf).is_ok() {
                self.runs.push((start, buf));
            } else if j - i > 1 {
                let mid = i + (j - i) / 2;
                self.fill(&ranges[i..mid]);
                self.fill(&ranges[mid..j]);
            }
            i = j;
        }
    }

    fn get(&self, addr: usize, len: usize) -> Option<&[u8]> {
        let k = self.runs.partition_point(|r| r.0 <= addr).checked_sub(1)?;
        let (start, bytes) = &self.runs[k];
        bytes.get(addr - start..addr - start + len)
    }
}

/// How much of the function the branch check decodes: all of it when its size is known,
/// else a window (branches from other functions into this one's interior would be just as
/// wrong, so over-scanning only adds safety).
fn scan_len(size: Option<usize>) -> usize {
    size.unwrap_or(4096).min(1 << 20)
}

fn read(code: &CodeCache, addr: usize, len: usize) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    if let Some(b) = code.get(addr, len) {
        return Ok(std::borrow::Cow::Borrowed(b));
    }
    let mut buf = vec![0u8; len];
    // Shrink the read when the function sits at the very end of its mapping.
    let mut n = len;
    while n > 0 {
        match super::read_text(addr, &mut buf[..n]) {
            Ok(()) => {
                buf.truncate(n);
                return Ok(std::borrow::Cow::Owned(buf));
            }
            Err(_) => n /= 2,
        }
    }
    Err(format!("code at {addr:#x} is not readable"))
}

/// Decides whether the function at `func` (of `size` bytes when known) can be probed.
/// `code` holds the bytes when they were read beforehand (else they are read here).
pub(crate) fn analyze(
    func: usize,
    size: Option<usize>,
    code: &CodeCache,
) -> Result<Prologue, String> {
    let head = read(code, func, HEAD)?;
    let patch_at = if head.starts_with(&ENDBR64) {
        func + 4
    } else {
        func
    };
    let skip = patch_at - func;
    let end = size.map(|s| func + s);
    if let Some(end) = end {
        if patch_at + PATCH_LEN > end {
            return Err(format!(
                "too short: {} bytes, the patch needs {PATCH_LEN} after any endbr64",
                end - func
            ));
        }
    }
    let mut decoder = Decoder::with_ip(64, &head[skip..], patch_at as u64, DecoderOptions::NONE);
    let mut instructions = Vec::new();
    let mut len = 0;
    while len < PATCH_LEN {
        if !decoder.can_decode() {
            return Err("prologue runs past readable code".into());
        }
        let ins = decoder.decode();
        if ins.is_invalid() {
            return Err(format!("undecodable instruction at +{:#x}", len + skip));
        }
        if ins.flow_control() == FlowControl::Return {
            return Err(format!(
                "too short: the function returns after {} bytes, the patch needs {PATCH_LEN}",
                ins.ip() as usize - func
            ));
        }
        if ins.flow_control() != FlowControl::Next
            || matches!(
                ins.mnemonic(),
                Mnemonic::Syscall | Mnemonic::Sysenter | Mnemonic::Endbr64
            )
        {
            return Err(format!(
                "control flow in the prologue: `{:?}` at +{:#x}",
                ins.mnemonic(),
                ins.ip() as usize - func
            ));
        }
        len += ins.len();
        instructions.push(ins);
    }
    if let Some(end) = end {
        if patch_at + len > end {
            return Err(format!(
                "too short: the {len}-byte prologue runs past the {}-byte function",
                end - func
            ));
        }
    }
    check_branch_targets(code, func, end, patch_at, len)?;
    Ok(Prologue {
        patch_at,
        len,
        original: head[skip..skip + len].to_vec(),
        instructions,
    })
}

/// Refuses the function when one of its direct branches targets `patch_at+1 .. patch_at+len`.
fn check_branch_targets(
    code: &CodeCache,
    func: usize,
    end: Option<usize>,
    patch_at: usize,
    len: usize,
) -> Result<(), String> {
    let code = read(code, func, scan_len(end.map(|e| e - func)))?;
    let interior = (patch_at + 1) as u64..(patch_at + len) as u64;
    // Most functions hold no byte that could even be the opcode of a branch into these few
    // bytes: they need no decoding (a decode of every function's whole body was most of the
    // time spent analysing thousands of them).
    let mut maybe = false;
    branch_candidates(&code, func, false, |_, t| {
        maybe |= interior.contains(&t);
    });
    // An 8-bit displacement reaches back 128 bytes from its instruction's end: only the
    // bytes up to 126 past the patched ones (and the displacement after) can hold one.
    let near = code.len().min(patch_at - func + len + 127);
    branch_candidates(&code[..near], func, true, |_, t| {
        maybe |= interior.contains(&t);
    });
    if !maybe {
        return Ok(());
    }
    let mut decoder = Decoder::with_ip(64, &code, func as u64, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut ins);
        if ins.is_invalid() {
            if end.is_none() {
                break; // ran into data or padding past the function
            }
            continue;
        }
        match ins.flow_control() {
            FlowControl::ConditionalBranch
            | FlowControl::UnconditionalBranch
            | FlowControl::Call => {
                let t = ins.near_branch_target();
                if t != 0 && interior.contains(&t) {
                    return Err(format!(
                        "branch target inside the patched bytes: `{:?}` at +{:#x} jumps to +{:#x}",
                        ins.mnemonic(),
                        ins.ip() as usize - func,
                        t as usize - func
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Calls `f(position, target)` for every byte position of `code` (loaded at `base`) that,
/// were it the opcode of a direct near branch, would branch to `target`: jcc/jmp/call with a
/// 32-bit displacement (`0f 8x`, `e9`, `e8`), xbegin with a 32- or (under an operand-size
/// prefix) 16-bit one, and, when `short`, jcc/jmp/loop/jrcxz with an 8-bit one (`7x`, `eb`,
/// `e0`-`e3`). Prefixes change neither the opcode's position nor the target, so every real
/// direct branch of the code is among these, with its target; most of them are not
/// instructions at all, which only a decoder can tell.
pub(crate) fn branch_candidates(
    code: &[u8],
    base: usize,
    short: bool,
    mut f: impl FnMut(usize, u64),
) {
    let disp32 = |at: usize| {
        code.get(at..at + 4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
    };
    let mut hit = |q: usize, next: usize, d: Option<i64>| {
        if let Some(d) = d {
            f(q, ((base + next) as i64).wrapping_add(d) as u64);
        }
    };
    let mut at = |q: usize| match code[q] {
        0xe8 | 0xe9 => hit(q, q + 5, disp32(q + 1)),
        0x0f if code.get(q + 1).is_some_and(|b| b & 0xf0 == 0x80) => hit(q, q + 6, disp32(q + 2)),
        0xc7 if code.get(q + 1) == Some(&0xf8) => {
            hit(q, q + 6, disp32(q + 2));
            let d16 = code
                .get(q + 2..q + 4)
                .map(|b| i16::from_le_bytes([b[0], b[1]]) as i64);
            hit(q, q + 4, d16);
        }
        0x70..=0x7f | 0xeb | 0xe0..=0xe3 if short => {
            hit(q, q + 2, code.get(q + 1).map(|&d| d as i8 as i64))
        }
        _ => {}
    };
    // Sixteen bytes at a time, the opcode bytes found by comparison and only they looked at:
    // this runs over whole segments (megabytes), where a byte-by-byte match mispredicted
    // its way to a few nanoseconds a byte.
    let mut q0 = 0;
    // The byte after each is loaded too (17 bytes), so two-byte opcodes (`0f 8x`, `c7 f8`)
    // are matched whole: `0f` alone starts most of the instruction set's longer opcodes.
    while q0 + 17 <= code.len() {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of the x86_64 baseline; the loads read the 16 bytes at q0 and
        // at q0 + 1, inside `code`.
        let mask = unsafe {
            let v = _mm_loadu_si128(code.as_ptr().add(q0).cast::<__m128i>());
            let next = _mm_loadu_si128(code.as_ptr().add(q0 + 1).cast::<__m128i>());
            let is = |v: __m128i, mask: u8, byte: u8| {
                _mm_cmpeq_epi8(
                    _mm_and_si128(v, _mm_set1_epi8(mask as i8)),
                    _mm_set1_epi8(byte as i8),
                )
            };
            let jcc32 = _mm_and_si128(is(v, 0xff, 0x0f), is(next, 0xf0, 0x80));
            let xbegin = _mm_and_si128(is(v, 0xff, 0xc7), is(next, 0xff, 0xf8));
            let mut m = _mm_or_si128(is(v, 0xfe, 0xe8), _mm_or_si128(jcc32, xbegin));
            if short {
                m = _mm_or_si128(
                    m,
                    _mm_or_si128(
                        is(v, 0xf0, 0x70),
                        _mm_or_si128(is(v, 0xfc, 0xe0), is(v, 0xff, 0xeb)),
                    ),
                );
            }
            _mm_movemask_epi8(m) as u32
        };
        let mut bits = mask;
        while bits != 0 {
            at(q0 + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
        q0 += 16;
    }
    for q in q0..code.len() {
        at(q);
    }
}

/// The prologue re-encoded to run at `at`, followed by an absolute jump back to the first
/// untouched instruction. Returns the bytes and, for every instruction boundary strictly inside
/// the patched bytes, the (original address, relocated address) pair.
#[allow(clippy::type_complexity)]
pub(crate) fn relocate(p: &Prologue, at: usize) -> Result<(Vec<u8>, Vec<(usize, usize)>), String> {
    let block = InstructionBlock::new(&p.instructions, at as u64);
    let res = BlockEncoder::encode(
        64,
        block,
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(|e| format!("cannot relocate the prologue: {e}"))?;
    let mut code = res.code_buffer;
    let mut interior = Vec::new();
    for (ins, off) in p.instructions.iter().zip(&res.new_instruction_offsets) {
        let old = ins.ip() as usize;
        if old > p.patch_at && old < p.patch_at + PATCH_LEN {
            if *off == u32::MAX {
                return Err(format!(
                    "instruction at {old:#x} has no relocated counterpart"
                ));
            }
            interior.push((old, at + *off as usize));
        }
    }
    let back = p.patch_at + p.len;
    let from = at + code.len();
    match i32::try_from(back as i64 - (from as i64 + 5)) {
        Ok(rel) => {
            code.push(0xe9);
            code.extend_from_slice(&rel.to_le_bytes());
        }
        Err(_) => code.extend_from_slice(&abs_jmp(back)),
    }
    if code.len() > MAX_RELOCATED + 14 {
        return Err(format!(
            "relocated prologue is {} bytes, more than the stub holds",
            code.len()
        ));
    }
    Ok((code, interior))
}

/// `jmp qword ptr [rip+0]` followed by the 8-byte destination: reaches anywhere, clobbers nothing.
pub(crate) fn abs_jmp(to: usize) -> [u8; 14] {
    let mut b = [0u8; 14];
    b[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    b[6..].copy_from_slice(&(to as u64).to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn analyze_bytes(code: &'static [u8]) -> Result<Prologue, String> {
        analyze(
            code.as_ptr() as usize,
            Some(code.len()),
            &CodeCache::default(),
        )
    }

    #[test]
    fn push_mov_prologue_is_accepted_with_interior_boundaries() {
        static CODE: [u8; 8] = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3, 0xcc, 0xcc];
        let p = analyze_bytes(&CODE).unwrap();
        assert_eq!(p.len, 5);
        let (code, interior) = relocate(&p, 0x1000_0000).unwrap();
        assert_eq!(&code[..5], &CODE[..5]);
        let base = CODE.as_ptr() as usize;
        assert_eq!(
            interior,
            vec![(base + 1, 0x1000_0001), (base + 4, 0x1000_0004)]
        );
    }

    #[test]
    fn endbr64_is_skipped() {
        static CODE: [u8; 12] = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x18, 0x90, 0x90, 0xc3, 0xcc,
        ];
        let p = analyze_bytes(&CODE).unwrap();
        assert_eq!(p.patch_at, CODE.as_ptr() as usize + 4);
        assert_eq!(p.len, 5);
    }

    #[test]
    fn short_function_is_refused() {
        static CODE: [u8; 3] = [0x31, 0xc0, 0xc3];
        let e = analyze_bytes(&CODE).err().unwrap();
        assert!(e.contains("too short"), "{e}");
    }

    #[test]
    fn control_flow_in_prologue_is_refused() {
        static CODE: [u8; 8] = [0x85, 0xff, 0x74, 0x02, 0x90, 0x90, 0xc3, 0xcc];
        let e = analyze_bytes(&CODE).err().unwrap();
        assert!(e.contains("control flow"), "{e}");
    }

    #[test]
    fn branch_into_patched_bytes_is_refused() {
        // 0: push rbp; 1: xor eax,eax; 3: inc eax; 5: cmp eax,9; 8: jl 3; a: pop rbp; b: ret
        static CODE: [u8; 12] = [
            0x55, 0x31, 0xc0, 0xff, 0xc0, 0x83, 0xf8, 0x09, 0x7c, 0xf9, 0x5d, 0xc3,
        ];
        let e = analyze_bytes(&CODE).err().unwrap();
        assert!(e.contains("branch target inside"), "{e}");
    }

    #[test]
    fn rip_relative_operand_is_rewritten() {
        // mov rax, [rip+0x10]; ret
        static CODE: [u8; 8] = [0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00, 0xc3];
        let p = analyze_bytes(&CODE).unwrap();
        let at = CODE.as_ptr() as usize + 0x1000;
        let (code, _) = relocate(&p, at).unwrap();
        let target = CODE.as_ptr() as usize + 7 + 0x10;
        let disp = i32::from_le_bytes(code[3..7].try_into().unwrap()) as i64;
        assert_eq!((at as i64 + 7 + disp) as usize, target);
    }

    proptest::proptest! {
        /// The byte-scan prefilter of the branch check lets through every function a full
        /// decode refuses: with it skipped, the check answers the same.
        #[test]
        fn branch_candidates_hold_every_real_branch(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 1..300),
        ) {
            let base = 0x7000_0000usize;
            let mut d = Decoder::with_ip(64, &bytes, base as u64, DecoderOptions::NONE);
            let mut cands = std::collections::HashSet::new();
            branch_candidates(&bytes, base, true, |_, t| { cands.insert(t); });
            let mut ins = Instruction::default();
            while d.can_decode() {
                d.decode_out(&mut ins);
                if !ins.is_invalid() && matches!(
                    ins.flow_control(),
                    FlowControl::ConditionalBranch
                        | FlowControl::UnconditionalBranch
                        | FlowControl::Call
                        | FlowControl::XbeginXabortXend
                ) && ins.near_branch_target() != 0 {
                    proptest::prop_assert!(
                        cands.contains(&ins.near_branch_target()),
                        "{:?} at {:#x}", ins.mnemonic(), ins.ip()
                    );
                }
            }
        }

        /// Any byte string either is refused or relocates to code that decodes, instruction
        /// by instruction, to the same operations, and ends with a jump back past the patch.
        #[test]
        fn analysis_never_misrelocates(bytes in proptest::collection::vec(proptest::num::u8::ANY, 5..40)) {
            let code: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            let func = code.as_ptr() as usize;
            if let Ok(p) = analyze(func, Some(code.len()), &CodeCache::default()) {
                proptest::prop_assert!(p.len >= PATCH_LEN && p.patch_at + p.len <= func + code.len());
                let at = func + 0x10_0000;
                let (out, interior) = relocate(&p, at).unwrap();
                let mut d = Decoder::with_ip(64, &out, at as u64, DecoderOptions::NONE);
                for orig in &p.instructions {
                    let new = d.decode();
                    proptest::prop_assert_eq!(new.mnemonic(), orig.mnemonic());
                    proptest::prop_assert_eq!(new.memory_displacement64(), orig.memory_displacement64());
                }
                let jmp = d.decode();
                proptest::prop_assert_eq!(jmp.flow_control(), FlowControl::UnconditionalBranch);
                for (old, new) in interior {
                    proptest::prop_assert!(old > p.patch_at && old < p.patch_at + PATCH_LEN);
                    proptest::prop_assert!(new > at && new < at + out.len());
                }
            }
        }
    }
}
