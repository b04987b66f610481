//! The glob matcher behind `set_ftrace_filter` patterns.
//!
//! ftrace sorts a filter word into "exact", "front*", "*end", "*middle*" or a
//! full glob; every one of those is a special case of a full glob, so one
//! matcher serves them all. Matching is byte-wise, like the kernel's:
//!
//! - `*` matches any run of bytes (also none), `?` exactly one byte;
//! - `[abc]`, `[a-z]`, `[!a-z]` match one byte in (or, with `!`, not in) the
//!   set; a `]` right after `[` or `[!` is a member; a reversed range `[z-a]`
//!   means the same as `[a-z]`; a `[` with no closing `]` is a literal `[`;
//! - `\x` matches `x` literally.
//!
//! The algorithm is the classic one-star backtrack: remember where the last
//! `*` was and which text byte it was tried against; on a mismatch let that
//! star swallow one more byte. Later stars supersede earlier ones, so the
//! worst case is O(pattern × text) without recursion.

/// Whether `text` matches the ftrace glob `pattern`.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p + 1, t));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((hit, next)) = class_match(pattern, p, text[t]) {
                        if hit {
                            p = next;
                            t += 1;
                            continue;
                        }
                    } else if text[t] == b'[' {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == text[t] {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if c == text[t] {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class opening at `pattern[open] == '['`.
/// Returns `(matched, index after ']')`, or `None` if the class is unterminated.
fn class_match(pattern: &[u8], open: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = pattern.get(i) == Some(&b'!');
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let lo = *pattern.get(i)?;
        if lo == b']' && !first {
            return Some((hit != negate, i + 1));
        }
        first = false;
        if pattern.get(i + 1) == Some(&b'-') && pattern.get(i + 2).is_some_and(|&h| h != b']') {
            let hi = pattern[i + 2];
            let (a, b) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            hit |= a <= c && c <= b;
            i += 3;
        } else {
            hit |= lo == c;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;
    use proptest::prelude::*;

    fn m(p: &str, t: &str) -> bool {
        glob_match(p.as_bytes(), t.as_bytes())
    }

    #[test]
    fn ftrace_shapes() {
        assert!(m("sys_nanosleep", "sys_nanosleep"));
        assert!(!m("sys_nanosleep", "sys_nanosleep2"));
        assert!(m("hrtimer_*", "hrtimer_interrupt"));
        assert!(!m("hrtimer_*", "xhrtimer_interrupt"));
        assert!(m("*lock", "mutex_lock"));
        assert!(!m("*lock", "mutex_lock_nested"));
        assert!(m("*lock*", "mutex_lock_nested"));
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(!m("a*b*c", "aXXbYY"));
        assert!(m("*::inner", "crate::outer::inner"));
    }

    #[test]
    fn classes_and_escapes() {
        assert!(m("[ab]x", "bx"));
        assert!(!m("[ab]x", "cx"));
        assert!(m("f[0-9]", "f7"));
        assert!(m("f[9-0]", "f7"));
        assert!(!m("f[!0-9]", "f7"));
        assert!(m("f[!0-9]", "fa"));
        assert!(m("[]]", "]"));
        assert!(m("[!]]", "a"));
        assert!(m("a[b", "a[b"));
        assert!(m("a\\*", "a*"));
        assert!(!m("a\\*", "ab"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
    }

    /// Reference: a straightforward recursive matcher for patterns without classes.
    fn reference(p: &[u8], t: &[u8]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some(b'*') => (0..=t.len()).any(|k| reference(&p[1..], &t[k..])),
            Some(b'?') => !t.is_empty() && reference(&p[1..], &t[1..]),
            Some(&c) => t.first() == Some(&c) && reference(&p[1..], &t[1..]),
        }
    }

    proptest! {
        #[test]
        fn agrees_with_reference(p in "[ab*?]{0,8}", t in "[ab]{0,10}") {
            prop_assert_eq!(glob_match(p.as_bytes(), t.as_bytes()), reference(p.as_bytes(), t.as_bytes()));
        }

        #[test]
        fn literal_pattern_matches_itself(t in "[a-z_:0-9]{0,20}") {
            prop_assert!(glob_match(t.as_bytes(), t.as_bytes()));
        }
    }
}
