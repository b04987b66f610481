//! `tracing_cpumask`: the CPUs whose events an instance records (ftrace.rst).
//!
//! As on the kernel, a CPU left out of the mask keeps its buffer but records nothing:
//! triggers and filters still run on its events, the record is just not kept (the kernel
//! disables recording on that CPU's buffer). On the data path this is one flag bit of
//! the event file, tested with the others, so a full mask costs nothing; while some CPU
//! is masked, the record path reads the current CPU (from rseq) and one mask word with a
//! relaxed load. A thread that migrates between that check and the reservation can still
//! write to the CPU it lands on: the kernel avoids that with preemption off, which user
//! space cannot do.
//!
//! Text is the kernel's bitmap format (`%*pb`): 32-bit hex chunks, most significant
//! first, separated by commas, the first one only as wide as its bits need.

use std::sync::atomic::{AtomicU64, Ordering};

use ustrace_ctl::vfs::Errno;

/// One instance's mask: bit N set means CPU N records.
pub struct CpuMask {
    words: Box<[AtomicU64]>,
    nbits: usize,
}

impl CpuMask {
    /// Every one of `nbits` CPUs set.
    pub fn full(nbits: usize) -> CpuMask {
        let words = (0..nbits.div_ceil(64))
            .map(|i| AtomicU64::new(word_of_full(nbits, i)))
            .collect();
        CpuMask { words, nbits }
    }

    /// Whether events on the calling thread's CPU are recorded.
    #[inline]
    pub fn allows_current(&self) -> bool {
        self.allows(ustrace_ringbuf::cpu::current_cpu())
    }

    /// Whether events recorded on `cpu` are kept.
    #[inline]
    pub fn allows(&self, cpu: usize) -> bool {
        match self.words.get(cpu / 64) {
            Some(word) => word.load(Ordering::Relaxed) & (1 << (cpu % 64)) != 0,
            // A CPU beyond the mask's width has no buffer of its own; its writers use
            // another CPU's, so keep its events rather than lose them.
            None => true,
        }
    }

    /// Whether every CPU is set (then the data path does not look at the mask).
    pub fn is_full(&self) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, w)| w.load(Ordering::Relaxed) == word_of_full(self.nbits, i))
    }

    /// Parses a write and installs the mask; nothing changes when it fails.
    pub fn write(&self, data: &[u8]) -> Result<(), Errno> {
        let words = parse(data, self.nbits)?;
        for (word, value) in self.words.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The file's text.
    pub fn text(&self) -> String {
        let chunks = self.nbits.div_ceil(32).max(1);
        let mut out = String::new();
        for chunk in (0..chunks).rev() {
            let word = self
                .words
                .get(chunk / 2)
                .map_or(0, |w| w.load(Ordering::Relaxed));
            let value = (word >> ((chunk % 2) * 32)) & 0xffff_ffff;
            let bits = (self.nbits - chunk * 32).min(32);
            let width = if chunk == chunks - 1 {
                bits.div_ceil(4).max(1)
            } else {
                8
            };
            if chunk != chunks - 1 {
                out.push(',');
            }
            out.push_str(&format!("{value:0width$x}"));
        }
        out.push('\n');
        out
    }
}

fn word_of_full(nbits: usize, index: usize) -> u64 {
    let bits = nbits.saturating_sub(index * 64).min(64);
    if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Parses a hex bitmap as the kernel's `bitmap_parse` does: up to the first newline or
/// NUL; comma-separated chunks of at most 8 hex digits, read from the right, each 32
/// bits; commas and white space between chunks ignored. A non-hex character is `EINVAL`;
/// a chunk of more than 8 digits, more chunks than `nbits` needs, or a bit at or past
/// `nbits` is `EOVERFLOW`. An empty write is `EINVAL` (a lone newline clears the mask).
pub fn parse(data: &[u8], nbits: usize) -> Result<Vec<u64>, Errno> {
    if data.is_empty() {
        return Err(Errno::EINVAL);
    }
    let end = data
        .iter()
        .position(|&b| b == b'\n' || b == 0)
        .unwrap_or(data.len());
    let text = &data[..end];
    let separator = |b: u8| b == b',' || b.is_ascii_whitespace();
    let overflow = Errno(libc::EOVERFLOW);
    let mut words = vec![0u64; nbits.div_ceil(64)];
    let max_chunks = nbits.div_ceil(32);
    let mut chunk = 0usize;
    let mut pos = text.len();
    loop {
        while pos > 0 && separator(text[pos - 1]) {
            pos -= 1;
        }
        if pos == 0 {
            break;
        }
        if chunk == max_chunks {
            return Err(overflow);
        }
        let mut value = 0u64;
        for digit in 0..8 {
            let nibble = (text[pos - 1] as char).to_digit(16).ok_or(Errno::EINVAL)?;
            value |= u64::from(nibble) << (4 * digit);
            pos -= 1;
            if pos == 0 || separator(text[pos - 1]) {
                break;
            }
            if digit == 7 && text[pos - 1].is_ascii_hexdigit() {
                return Err(overflow);
            }
        }
        words[chunk / 2] |= value << ((chunk % 2) * 32);
        chunk += 1;
    }
    for (i, word) in words.iter().enumerate() {
        if word & !word_of_full(nbits, i) != 0 {
            return Err(overflow);
        }
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);

    // Each case as the 6.18 kernel answered it with 2 CPUs.
    #[test]
    fn parses_like_bitmap_parse_with_two_cpus() {
        let ok = |s: &str, v: u64| assert_eq!(parse(s.as_bytes(), 2), Ok(vec![v]), "{s:?}");
        ok("1", 1);
        ok("2\n", 2);
        ok("0", 0);
        ok("3", 3);
        ok("\n", 0);
        ok(" 1", 1);
        ok("1 ", 1);
        ok("1\n\n", 1);
        ok(",1", 1);
        ok("1,", 1);
        ok("3\0junk", 3);
        let err = |s: &str, e: Errno| assert_eq!(parse(s.as_bytes(), 2), Err(e), "{s:?}");
        for s in ["f", "ff", "100", "1,0", "00000000,00000001", "0,1"] {
            err(s, EOVERFLOW);
        }
        err("11111111111111111111111111", EOVERFLOW);
        for s in ["0x1", "g", "", "+1", "-1"] {
            err(s, Errno::EINVAL);
        }
    }

    #[test]
    fn wide_masks_use_32_bit_chunks() {
        assert_eq!(
            parse(b"1,00000002", 40),
            Ok(vec![(1 << 32) | 2]),
            "chunk order"
        );
        assert_eq!(parse(b"100,00000000", 40), Err(EOVERFLOW), "bit 40");
        let mask = CpuMask::full(40);
        assert_eq!(mask.text(), "ff,ffffffff\n");
        mask.write(b"1,2").unwrap();
        assert_eq!(mask.text(), "01,00000002\n");
        assert!(mask.allows(1) && mask.allows(32) && !mask.allows(0));
        let two = CpuMask::full(2);
        assert_eq!(two.text(), "3\n");
        assert!(two.is_full());
        two.write(b"2").unwrap();
        assert_eq!(two.text(), "2\n");
        assert!(!two.is_full() && !two.allows(0) && two.allows(1));
        let many = CpuMask::full(128);
        assert_eq!(many.text(), "ffffffff,ffffffff,ffffffff,ffffffff\n");
    }
}
