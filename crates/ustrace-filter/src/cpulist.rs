//! CPU lists for `CPUS{...}`: the kernel's `cpulist_parse` grammar
//! (`0-3,8`, `all`, `N` = last CPU, strided groups `0-15:2/4`) into a bitmap
//! of `nr_cpus` bits. A CPU at or past `nr_cpus` makes the list invalid, so the
//! same text is valid on one machine and not on another — as in the kernel.

/// A set of CPUs, `nr_cpus` bits wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuMask {
    words: Box<[u64]>,
    nr_cpus: u32,
}

impl CpuMask {
    /// An empty mask for `nr_cpus` CPUs.
    pub fn new(nr_cpus: u32) -> CpuMask {
        CpuMask {
            words: vec![0; (nr_cpus as usize).div_ceil(64)].into_boxed_slice(),
            nr_cpus,
        }
    }

    /// Number of CPUs the mask covers.
    pub fn nr_cpus(&self) -> u32 {
        self.nr_cpus
    }

    /// Add `cpu`, which must be below `nr_cpus`.
    pub fn set(&mut self, cpu: u32) {
        self.words[(cpu / 64) as usize] |= 1 << (cpu % 64);
    }

    /// Whether `cpu` is in the set (false past `nr_cpus`).
    #[inline]
    pub fn test(&self, cpu: u32) -> bool {
        cpu < self.nr_cpus && self.words[(cpu / 64) as usize] & (1 << (cpu % 64)) != 0
    }

    /// How many CPUs are in the set.
    pub fn weight(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// The lowest CPU in the set.
    pub fn first(&self) -> Option<u32> {
        (0..self.nr_cpus).find(|&c| self.test(c))
    }

    /// Bit `cpu` of a little-endian bitmap stored in a record (missing bytes read 0).
    #[inline]
    pub fn bitmap_test(bytes: &[u8], cpu: u32) -> bool {
        bytes
            .get((cpu / 8) as usize)
            .is_some_and(|b| b & (1 << (cpu % 8)) != 0)
    }

    /// Byte `i` of this set as a little-endian bitmap.
    #[inline]
    fn byte(&self, i: usize) -> u8 {
        (self.words[i / 8] >> (8 * (i % 8))) as u8
    }

    /// Byte `i` of a record bitmap, limited to the first `nr_cpus` bits.
    #[inline]
    fn record_byte(bytes: &[u8], i: usize, nr_cpus: u32) -> u8 {
        let b = bytes.get(i).copied().unwrap_or(0);
        let bits_left = nr_cpus as usize - 8 * i;
        if bits_left >= 8 {
            b
        } else {
            b & ((1u8 << bits_left) - 1)
        }
    }

    /// Whether the record bitmap equals this set over `nr_cpus` bits.
    pub fn equals_bitmap(&self, bytes: &[u8]) -> bool {
        (0..(self.nr_cpus as usize).div_ceil(8))
            .all(|i| Self::record_byte(bytes, i, self.nr_cpus) == self.byte(i))
    }

    /// Whether the record bitmap shares a CPU with this set.
    pub fn intersects_bitmap(&self, bytes: &[u8]) -> bool {
        (0..(self.nr_cpus as usize).div_ceil(8))
            .any(|i| Self::record_byte(bytes, i, self.nr_cpus) & self.byte(i) != 0)
    }

    /// Whether a record bitmap (over `nr_cpus` bits) holds `cpu` and no other CPU.
    pub fn bitmap_is_only(bytes: &[u8], cpu: u32, nr_cpus: u32) -> bool {
        let own = (cpu / 8) as usize;
        (0..(nr_cpus as usize).div_ceil(8)).all(|i| {
            let b = Self::record_byte(bytes, i, nr_cpus);
            if i == own {
                b == 1 << (cpu % 8)
            } else {
                b == 0
            }
        })
    }

    /// Parse a cpulist; `None` where the kernel's `cpulist_parse` fails.
    pub fn parse(list: &[u8], nr_cpus: u32) -> Option<CpuMask> {
        let mut mask = CpuMask::new(nr_cpus);
        let last = nr_cpus.wrapping_sub(1);
        let at = |i: usize| list.get(i).copied().unwrap_or(0);
        let end_of_str = |c: u8| c == 0 || c == b'\n';
        let end_of_region = |c: u8| crate::ctype::is_space(c) || c == b',' || end_of_str(c);
        let getnum = |i: usize| -> Option<(u32, usize)> {
            if at(i) == b'N' {
                return Some((last, i + 1));
            }
            let mut j = i;
            let mut n: u64 = 0;
            while at(j).is_ascii_digit() {
                n = n.checked_mul(10)?.checked_add(u64::from(at(j) - b'0'))?;
                j += 1;
            }
            if j == i || n > u64::from(u32::MAX) {
                return None;
            }
            Some((n as u32, j))
        };
        let mut i = 0usize;
        loop {
            while crate::ctype::is_space(at(i)) || at(i) == b',' {
                i += 1;
            }
            if end_of_str(at(i)) {
                return Some(mask);
            }
            let (start, end, off, group);
            let mut cur;
            let three = [at(i), at(i + 1), at(i + 2)];
            let mut has_pattern_check = false;
            if three.eq_ignore_ascii_case(b"all") {
                start = 0u32;
                let e = last;
                cur = i + 3;
                if end_of_region(at(cur)) {
                    end = e;
                    off = e.wrapping_add(1);
                    group = e.wrapping_add(1);
                } else {
                    has_pattern_check = true;
                    end = e;
                    off = 0;
                    group = 0;
                }
            } else {
                let (s, c) = getnum(i)?;
                start = s;
                cur = c;
                if end_of_region(at(cur)) {
                    end = s;
                    off = s.wrapping_add(1);
                    group = s.wrapping_add(1);
                } else {
                    if at(cur) != b'-' {
                        return None;
                    }
                    let (e, c) = getnum(cur + 1)?;
                    cur = c;
                    end = e;
                    if end_of_region(at(cur)) {
                        off = e.wrapping_add(1);
                        group = e.wrapping_add(1);
                    } else {
                        has_pattern_check = true;
                        off = 0;
                        group = 0;
                    }
                }
            }
            let (off, group) = if has_pattern_check {
                if at(cur) != b':' {
                    return None;
                }
                let (o, c) = getnum(cur + 1)?;
                if at(c) != b'/' {
                    return None;
                }
                let (g, c) = getnum(c + 1)?;
                cur = c;
                (o, g)
            } else {
                (off, group)
            };
            if start > end || group == 0 || off > group {
                return None;
            }
            if end >= nr_cpus {
                return None;
            }
            let mut s = start;
            while s <= end {
                let n = (end - s + 1).min(off);
                for c in s..s + n {
                    mask.set(c);
                }
                match s.checked_add(group) {
                    Some(next) => s = next,
                    None => break,
                }
            }
            i = cur;
            if end_of_str(at(i)) {
                return Some(mask);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(list: &str, nr: u32) -> Option<Vec<u32>> {
        CpuMask::parse(list.as_bytes(), nr).map(|m| (0..nr).filter(|&c| m.test(c)).collect())
    }

    #[test]
    fn grammar() {
        assert_eq!(cpus("1", 4), Some(vec![1]));
        assert_eq!(cpus("0-2,3", 4), Some(vec![0, 1, 2, 3]));
        assert_eq!(cpus("all", 3), Some(vec![0, 1, 2]));
        assert_eq!(cpus("ALL", 3), Some(vec![0, 1, 2]));
        assert_eq!(cpus("N", 3), Some(vec![2]));
        assert_eq!(cpus("0-N:1/2", 6), Some(vec![0, 2, 4]));
        assert_eq!(cpus("0-1:0/2", 2), Some(vec![]));
        assert_eq!(cpus(" 1", 2), Some(vec![1]));
        assert_eq!(cpus("1,", 2), Some(vec![1]));
        assert_eq!(cpus("1 0", 2), Some(vec![0, 1]));
        assert_eq!(cpus("17-42", 64).map(|v| v.len()), Some(26));
    }

    #[test]
    fn record_bitmaps() {
        let m = CpuMask::parse(b"1,9", 12).unwrap();
        assert!(m.equals_bitmap(&[0b10, 0b10]));
        // Bits past nr_cpus are not compared.
        assert!(m.equals_bitmap(&[0b10, 0b1111_0010]));
        assert!(!m.equals_bitmap(&[0b10]));
        assert!(m.intersects_bitmap(&[0, 0b10]));
        assert!(!m.intersects_bitmap(&[0b100, 0b1_0000]));
        assert!(CpuMask::bitmap_is_only(&[0, 0b10], 9, 12));
        assert!(!CpuMask::bitmap_is_only(&[1, 0b10], 9, 12));
        assert!(CpuMask::bitmap_is_only(&[0, 0b1111_0010], 9, 12));
    }

    #[test]
    fn rejects_what_the_kernel_rejects() {
        assert_eq!(cpus("0-3", 2), None);
        assert_eq!(cpus("1-0", 2), None);
        assert_eq!(cpus("x", 2), None);
        assert_eq!(cpus("1)", 2), None);
        assert_eq!(cpus("0-1:3/2", 4), None);
        assert_eq!(cpus("0-1:1/0", 4), None);
        assert_eq!(cpus("99999999999", 4), None);
    }
}
