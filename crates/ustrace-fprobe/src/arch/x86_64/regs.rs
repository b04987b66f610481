//! The register frame handlers see: the kernel's `struct pt_regs` layout, plus the SSE argument
//! registers that the x86_64 SysV ABI passes floating-point arguments in.

/// General-purpose registers in the kernel's `pt_regs` order, then `xmm0`-`xmm7`.
///
/// At entry `sp` points at the return address (the caller's `rsp` just after its `call`), and
/// argument N (0-based) of an integer/pointer signature is [`PtRegs::arg`]. At exit `ax` (and
/// `dx`, `xmm0`/`xmm1`) hold the return value, `ip` is the return address and `sp` the slot it
/// was read from; every register holds what the function returned with (`orig_ax`, `cs`,
/// `flags` and `ss` are not captured there).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PtRegs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub bp: u64,
    pub bx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub ax: u64,
    pub cx: u64,
    pub dx: u64,
    pub si: u64,
    pub di: u64,
    pub orig_ax: u64,
    pub ip: u64,
    pub cs: u64,
    /// Not captured (0): flags carry no value across a call boundary.
    pub flags: u64,
    pub sp: u64,
    pub ss: u64,
    /// `xmm0`-`xmm7`, the SysV float/vector argument registers.
    pub xmm: [[u64; 2]; 8],
}

/// Byte size of [`PtRegs`]; the trampolines reserve it, with room for xmm8-15 and more, on
/// the stack.
pub(crate) const PT_REGS_SIZE: usize = 21 * 8 + 8 * 16;
const _: () = assert!(std::mem::size_of::<PtRegs>() == PT_REGS_SIZE);
// The trampolines place the frame at 8 mod 16 so that its xmm slots are 16-byte aligned.
const _: () = assert!(PT_REGS_SIZE % 16 == 8);

impl PtRegs {
    /// Integer/pointer argument `n` (0-based) by SysV position: rdi, rsi, rdx, rcx, r8, r9, then
    /// the stack. Stack arguments are read with a fault-safe load and give `None` when unreadable.
    #[inline]
    pub fn arg(&self, n: usize) -> Option<u64> {
        Some(match n {
            0 => self.di,
            1 => self.si,
            2 => self.dx,
            3 => self.cx,
            4 => self.r8,
            5 => self.r9,
            _ => {
                let addr = self.sp as usize + 8 * (n - 5);
                return ustrace_inspect::uaccess::read_usize(addr)
                    .ok()
                    .map(|v| v as u64);
            }
        })
    }

    /// Floating-point argument `n` (0..8) as an `f64` (the low lane of `xmmN`).
    pub fn float_arg(&self, n: usize) -> Option<f64> {
        self.xmm.get(n).map(|x| f64::from_bits(x[0]))
    }

    /// Integer return value (`rax`), meaningful in the exit handler.
    pub fn return_value(&self) -> u64 {
        self.ax
    }

    /// Stack pointer: at entry the address of the return address slot.
    pub fn stack_pointer(&self) -> u64 {
        self.sp
    }

    /// Instruction pointer: the patched address at entry, the return address at exit.
    pub fn instruction_pointer(&self) -> u64 {
        self.ip
    }
}
