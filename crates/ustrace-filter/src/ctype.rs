//! Byte classes exactly as the kernel's `lib/ctype.c` defines them.
//!
//! The kernel parses filter and trigger text with its own `isspace`, `isalnum`
//! and `isdigit`, whose table also classifies Latin-1 bytes (0xA0 is a space,
//! 0xC0..=0xFF letters except 0xD7 and 0xF7). Field names, whitespace skipping
//! and error positions all depend on these classes, so the parsers use this
//! module instead of Rust's ASCII helpers to land on the same byte offsets.

/// Kernel `isspace`: space, `\t`, `\n`, `\v`, `\f`, `\r` and Latin-1 NBSP.
#[inline]
pub fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0xa0)
}

/// Kernel `isdigit`: ASCII digits only.
#[inline]
pub fn is_digit(c: u8) -> bool {
    c.is_ascii_digit()
}

/// Kernel `isalnum`: ASCII letters and digits plus the Latin-1 letters.
#[inline]
pub fn is_alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric() || (c >= 0xc0 && c != 0xd7 && c != 0xf7)
}

/// Kernel `strstrip` trailing half: drop trailing kernel-whitespace.
pub fn strip_trailing(s: &[u8]) -> &[u8] {
    let mut end = s.len();
    while end > 0 && is_space(s[end - 1]) {
        end -= 1;
    }
    &s[..end]
}

/// Kernel `skip_spaces`.
pub fn skip_leading(s: &[u8]) -> &[u8] {
    let mut start = 0;
    while start < s.len() && is_space(s[start]) {
        start += 1;
    }
    &s[start..]
}

/// The string as C code would see it: everything before the first NUL.
pub fn c_str(s: &[u8]) -> &[u8] {
    match s.iter().position(|&b| b == 0) {
        Some(n) => &s[..n],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin1_classes_follow_the_kernel_table() {
        assert!(is_space(0xa0));
        assert!(!is_space(0x85));
        assert!(is_alnum(0xc3));
        assert!(!is_alnum(0xd7));
        assert!(!is_alnum(0xf7));
        assert!(!is_alnum(0xa9));
        assert!(is_alnum(b'Z') && is_alnum(b'0') && !is_alnum(b'_'));
    }

    #[test]
    fn strip_and_skip() {
        assert_eq!(strip_trailing(b" a \n\t"), b" a");
        assert_eq!(skip_leading(b" \ta "), b"a ");
        assert_eq!(c_str(b"ab\0cd"), b"ab");
    }
}
