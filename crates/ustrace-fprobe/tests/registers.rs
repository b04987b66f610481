//! A probed function's callers find every register as the function itself leaves it.
//!
//! GCC's interprocedural register allocation (`-fipa-ra`, on at `-O2` unless `-pg` is given)
//! lets a caller keep values in call-clobbered registers across a call to a function whose
//! code it knows does not touch them: glibc's `ld.so` keeps a pointer in `r11` across its
//! calls to `dfs_traversal`, which every program runs at exit. So the ABI's call-clobbered
//! registers are not free for the tracer: neither the entry path (which needs a scratch
//! register for the site) nor the exit path (which runs handlers between the function's
//! `ret` and the caller) may change any register the function itself does not.
//!
//! `ipara_caller` (assembly, as GCC would emit it) loads known values into every register a
//! handler could clobber, calls `ipara_callee` (which touches only `rax`), and returns a mask
//! of the registers that came back changed. Handlers that clobber all of them must leave the
//! mask empty.

use std::sync::atomic::{AtomicU64, Ordering};

use ustrace_fprobe::{EntryAction, Fprobe};

std::arch::global_asm!(
    ".globl ipara_callee",
    ".type ipara_callee,@function",
    "ipara_callee:",
    "mov rax, rdi",
    "add rax, 1",
    "add rax, 2",
    "ret",
    ".size ipara_callee, . - ipara_callee",
    // Returns the mask of clobbered registers: bit 0 rcx, 1 rsi, 2 r8, 3 r9, 4 r10, 5 r11,
    // 6 rdx, 8.. xmm2-xmm15 (bit 8 + n - 2), and 1<<30 when the return value is wrong.
    ".globl ipara_caller",
    ".type ipara_caller,@function",
    "ipara_caller:",
    "push rbx",
    "push r12",
    "sub rsp, 8",
    "mov rcx, 0x1111111111111101",
    "mov rsi, 0x1111111111111102",
    "mov r8, 0x1111111111111103",
    "mov r9, 0x1111111111111104",
    "mov r10, 0x1111111111111105",
    "mov r11, 0x1111111111111106",
    "mov rdx, 0x1111111111111107",
    // xmmN = N in both lanes (N = 2..15).
    ".irp n, 2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "mov rax, \\n",
    "movq xmm\\n, rax",
    "punpcklqdq xmm\\n, xmm\\n",
    ".endr",
    "mov rdi, 40",
    "call ipara_callee",
    "xor ebx, ebx",
    "cmp rax, 43",
    "je 1f",
    "or ebx, 0x40000000",
    "1:",
    "mov r12, 0x1111111111111101",
    "cmp rcx, r12",
    "je 1f",
    "or ebx, 1",
    "1:",
    "mov r12, 0x1111111111111102",
    "cmp rsi, r12",
    "je 1f",
    "or ebx, 2",
    "1:",
    "mov r12, 0x1111111111111103",
    "cmp r8, r12",
    "je 1f",
    "or ebx, 4",
    "1:",
    "mov r12, 0x1111111111111104",
    "cmp r9, r12",
    "je 1f",
    "or ebx, 8",
    "1:",
    "mov r12, 0x1111111111111105",
    "cmp r10, r12",
    "je 1f",
    "or ebx, 16",
    "1:",
    "mov r12, 0x1111111111111106",
    "cmp r11, r12",
    "je 1f",
    "or ebx, 32",
    "1:",
    "mov r12, 0x1111111111111107",
    "cmp rdx, r12",
    "je 1f",
    "or ebx, 64",
    "1:",
    ".irp n, 2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "mov r12, \\n",
    "movq rax, xmm\\n",
    "cmp rax, r12",
    "jne 2f",
    "pshufd xmm\\n, xmm\\n, 0x4e",
    "movq rax, xmm\\n",
    "cmp rax, r12",
    "je 3f",
    "2:",
    "bts ebx, (8 + \\n - 2)",
    "3:",
    ".endr",
    "mov eax, ebx",
    "add rsp, 8",
    "pop r12",
    "pop rbx",
    "ret",
    ".size ipara_caller, . - ipara_caller",
);

extern "C" {
    fn ipara_callee(x: u64) -> u64;
    fn ipara_caller() -> u32;
}

/// What handler code may do to the call-clobbered registers (the Rust compiler and the C
/// library's `memcpy` use them freely): every one of them overwritten.
#[inline(always)]
fn clobber_everything() {
    // SAFETY: only writes registers declared clobbered.
    unsafe {
        std::arch::asm!(
            "mov rcx, -1", "mov rsi, -1", "mov rdi, -1", "mov rdx, -1",
            "mov r8, -1", "mov r9, -1", "mov r10, -1", "mov r11, -1",
            "pcmpeqd xmm0, xmm0", "pcmpeqd xmm1, xmm1", "pcmpeqd xmm2, xmm2",
            "pcmpeqd xmm3, xmm3", "pcmpeqd xmm4, xmm4", "pcmpeqd xmm5, xmm5",
            "pcmpeqd xmm6, xmm6", "pcmpeqd xmm7, xmm7", "pcmpeqd xmm8, xmm8",
            "pcmpeqd xmm9, xmm9", "pcmpeqd xmm10, xmm10", "pcmpeqd xmm11, xmm11",
            "pcmpeqd xmm12, xmm12", "pcmpeqd xmm13, xmm13", "pcmpeqd xmm14, xmm14",
            "pcmpeqd xmm15, xmm15",
            out("rcx") _, out("rsi") _, out("rdi") _, out("rdx") _,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
            options(nostack, nomem),
        );
    }
}

fn names(mask: u32) -> Vec<String> {
    let gp = ["rcx", "rsi", "r8", "r9", "r10", "r11", "rdx"];
    let mut out: Vec<String> = (0..7)
        .filter(|b| mask & (1 << b) != 0)
        .map(|b| gp[b].to_string())
        .collect();
    out.extend(
        (2..16)
            .filter(|n| mask & (1 << (8 + n - 2)) != 0)
            .map(|n| format!("xmm{n}")),
    );
    if mask & (1 << 30) != 0 {
        out.push("the return value".into());
    }
    out
}

#[test]
fn callers_keep_every_register_the_probed_function_does_not_touch() {
    // SAFETY: the assembly above follows the SysV ABI at its boundaries.
    assert_eq!(unsafe { ipara_caller() }, 0, "unprobed");
    let target = ipara_callee as unsafe extern "C" fn(u64) -> u64 as usize;
    for with_exit in [false, true] {
        let hits = std::sync::Arc::new(AtomicU64::new(0));
        let (h1, h2) = (hits.clone(), hits.clone());
        let mut builder = Fprobe::builder().entry_handler(move |_, _, _, _, _| {
            h1.fetch_add(1, Ordering::Relaxed);
            clobber_everything();
            EntryAction::Continue
        });
        if with_exit {
            builder = builder.exit_handler(move |_, _, _, regs, _| {
                assert_eq!(regs.return_value(), 43);
                h2.fetch_add(1, Ordering::Relaxed);
                clobber_everything();
            });
        }
        let fp = builder
            .register_ips(&[target])
            .expect("ipara_callee patches");
        // SAFETY: as above.
        let mask = unsafe { ipara_caller() };
        let want = if with_exit { 2 } else { 1 };
        assert_eq!(hits.load(Ordering::Relaxed), want, "the probe ran");
        assert_eq!(
            mask,
            0,
            "registers changed across the probed call (exit handler: {with_exit}): {:?}",
            names(mask)
        );
        fp.unregister().unwrap();
    }
}
