//! The kernel's number parsers (`kstrtoul`, `kstrtol`, `simple_strtoul`).
//!
//! The definition language inherits their exact rules, and the rules decide
//! which definitions are accepted: base 0 means `0x` → hex, a leading `0` →
//! octal, otherwise decimal; a single trailing newline is allowed; anything
//! else after the digits, or overflow, is an error. `simple_strtoul` instead
//! stops at the first non-digit and reports where it stopped.

/// Picks the radix for `base` (0 = auto) and skips a `0x` prefix.
/// Returns (radix, bytes of prefix consumed).
fn fixup_radix(s: &[u8], base: u32) -> (u32, usize) {
    let hex_prefix =
        s.len() >= 3 && s[0] == b'0' && (s[1] | 0x20) == b'x' && s[2].is_ascii_hexdigit();
    match base {
        0 if hex_prefix => (16, 2),
        0 if s.first() == Some(&b'0') => (8, 0),
        0 => (10, 0),
        16 if hex_prefix => (16, 2),
        b => (b, 0),
    }
}

/// Parses digits; returns (value, digits consumed, overflowed).
fn parse_digits(s: &[u8], radix: u32) -> (u64, usize, bool) {
    let mut v: u64 = 0;
    let mut overflow = false;
    let mut n = 0;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => u32::from(c - b'0'),
            b'a'..=b'f' => u32::from(c - b'a') + 10,
            b'A'..=b'F' => u32::from(c - b'A') + 10,
            _ => break,
        };
        if d >= radix {
            break;
        }
        match v
            .checked_mul(u64::from(radix))
            .and_then(|x| x.checked_add(u64::from(d)))
        {
            Some(x) => v = x,
            None => overflow = true,
        }
        n += 1;
    }
    (v, n, overflow)
}

/// Why a `kstrto*` parse failed: bad syntax (`EINVAL`) or overflow
/// (`ERANGE`); the kernel returns the latter as the write's errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumError {
    /// Not a number.
    Invalid,
    /// A number that does not fit.
    Range,
}

/// `kstrtoull(s, base)`: a leading `+` is allowed.
pub fn kstrtoul_checked(s: &str, base: u32) -> Result<u64, NumError> {
    let b = s.as_bytes();
    let b = b.strip_prefix(b"+").unwrap_or(b);
    let (radix, skip) = fixup_radix(b, base);
    let (v, n, overflow) = parse_digits(&b[skip..], radix);
    if n == 0 {
        return Err(NumError::Invalid);
    }
    let rest = &b[skip + n..];
    if !(rest.is_empty() || rest == b"\n") {
        return Err(NumError::Invalid);
    }
    if overflow {
        return Err(NumError::Range);
    }
    Ok(v)
}

/// `kstrtoull(s, base)`, failure reason dropped.
pub fn kstrtoul(s: &str, base: u32) -> Option<u64> {
    kstrtoul_checked(s, base).ok()
}

/// `kstrtouint`: as [`kstrtoul`] but must fit 32 bits.
pub fn kstrtouint(s: &str, base: u32) -> Option<u32> {
    kstrtoul(s, base).and_then(|v| u32::try_from(v).ok())
}

/// `kstrtol(s, base)`: an optional `-` then [`kstrtoul_checked`], within `i64`.
pub fn kstrtol_checked(s: &str, base: u32) -> Result<i64, NumError> {
    if let Some(rest) = s.strip_prefix('-') {
        if rest.starts_with('+') {
            return Err(NumError::Invalid);
        }
        let v = kstrtoul_checked(rest, base)?;
        if v <= 1u64 << 63 {
            Ok((v as i64).wrapping_neg())
        } else {
            Err(NumError::Range)
        }
    } else {
        let v = kstrtoul_checked(s, base)?;
        i64::try_from(v).map_err(|_| NumError::Range)
    }
}

/// `kstrtol(s, base)`, failure reason dropped.
pub fn kstrtol(s: &str, base: u32) -> Option<i64> {
    kstrtol_checked(s, base).ok()
}

/// `simple_strtoul(s, &end, base)`: value and bytes consumed (0 when no digit).
pub fn simple_strtoul(s: &str, base: u32) -> (u64, usize) {
    let b = s.as_bytes();
    let (radix, skip) = fixup_radix(b, base);
    let (v, n, _) = parse_digits(&b[skip..], radix);
    if n == 0 {
        (0, 0)
    } else {
        (v, skip + n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_number_rules() {
        assert_eq!(kstrtoul("0x10", 0), Some(16));
        assert_eq!(kstrtoul("010", 0), Some(8));
        assert_eq!(kstrtoul("0", 0), Some(0));
        assert_eq!(kstrtoul("0x", 0), None);
        assert_eq!(kstrtoul("12\n", 0), Some(12));
        assert_eq!(kstrtoul("12a", 10), None);
        assert_eq!(kstrtoul("+5", 0), Some(5));
        assert_eq!(kstrtoul("", 0), None);
        assert_eq!(kstrtoul("18446744073709551616", 0), None);
        assert_eq!(kstrtol("-8", 0), Some(-8));
        assert_eq!(kstrtol("-0x8", 0), Some(-8));
        assert_eq!(kstrtol("9223372036854775808", 0), None);
        assert_eq!(kstrtol("-9223372036854775808", 0), Some(i64::MIN));
        assert_eq!(kstrtouint("4294967296", 0), None);
        assert_eq!(simple_strtoul("12@3", 0), (12, 2));
        assert_eq!(simple_strtoul("@3", 0), (0, 0));
    }
}
