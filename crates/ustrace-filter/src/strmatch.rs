//! String predicates: the kernel's five ways of comparing a field string with
//! the constant of a `==`, `!=` or `~` predicate.
//!
//! A `~` pattern is classified once, at compile time, into the cheapest test
//! that is equivalent to the glob (the kernel does the same, and its choice is
//! observable, so it is reproduced byte for byte):
//!
//! ```text
//!   "bash"    -> Full    strncmp(field, "bash", len) == 0
//!   "ba*"     -> Front   the field starts with "ba"
//!   "*sh"     -> End     the last 2 bytes before len-1 are "sh"
//!   "*as*"    -> Middle  "as" occurs in the first len bytes
//!   "b?s[a-z]"-> Glob    full glob with `*`, `?`, `[...]`, `\`
//!   "!bash"   -> any of the above, negated
//!   "1*"      -> Full    (a leading digit means "index" to the kernel: literal)
//! ```
//!
//! `len` is what the kernel passes for the field kind: the array size for
//! `char[N]`, `TASK_COMM_LEN` (16) for `comm`, the stored length (with NUL)
//! for `__data_loc` strings and `strlen + 1` for pointers. `End` uses that
//! length as is, so `comm ~ "*sh"` never matches a short comm — a kernel quirk
//! the live kernel shows and this crate keeps.
//! Bytes past the end of the given slice read as NUL, never out of bounds.

/// How a string predicate compares (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchKind {
    Full,
    Front,
    Middle,
    End,
    Glob,
}

/// A compiled string constant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrMatcher {
    pub kind: MatchKind,
    pub pattern: Box<[u8]>,
}

#[inline]
fn at(s: &[u8], i: usize) -> u8 {
    s.get(i).copied().unwrap_or(0)
}

impl StrMatcher {
    /// Classify a `~` pattern. Returns the matcher and whether a leading `!`
    /// asked for negation.
    pub fn glob(raw: &[u8]) -> (StrMatcher, bool) {
        let (negate, buf) = match raw.first() {
            Some(b'!') => (true, &raw[1..]),
            _ => (false, raw),
        };
        if buf.first().is_some_and(|c| c.is_ascii_digit()) {
            return (StrMatcher::full(buf), negate);
        }
        let len = buf.len();
        let mut kind = MatchKind::Full;
        let mut end = len;
        for (i, &c) in buf.iter().enumerate() {
            if c == b'*' {
                if i == 0 {
                    kind = MatchKind::End;
                } else if i == len - 1 {
                    kind = if kind == MatchKind::End {
                        MatchKind::Middle
                    } else {
                        MatchKind::Front
                    };
                    end = i;
                    break;
                } else {
                    return (
                        StrMatcher {
                            kind: MatchKind::Glob,
                            pattern: buf.into(),
                        },
                        negate,
                    );
                }
            } else if matches!(c, b'[' | b'?' | b'\\') {
                return (
                    StrMatcher {
                        kind: MatchKind::Glob,
                        pattern: buf.into(),
                    },
                    negate,
                );
            }
        }
        let start = usize::from(buf.first() == Some(&b'*'));
        let pattern = if start > end {
            &[][..]
        } else {
            &buf[start..end]
        };
        (
            StrMatcher {
                kind,
                pattern: pattern.into(),
            },
            negate,
        )
    }

    /// An `==`/`!=` constant: always compared in full.
    pub fn full(raw: &[u8]) -> StrMatcher {
        StrMatcher {
            kind: MatchKind::Full,
            pattern: raw.into(),
        }
    }

    /// Compare against `s`, whose kernel-visible length is `len` (see module docs).
    pub fn matches(&self, s: &[u8], len: i64) -> bool {
        let p = &self.pattern[..];
        match self.kind {
            MatchKind::Full => strncmp_eq(s, p, len),
            MatchKind::Front => {
                if len < p.len() as i64 {
                    return false;
                }
                strncmp_eq(s, p, p.len() as i64)
            }
            MatchKind::Middle => strnstr(s, p, len),
            MatchKind::End => {
                let slen = len - 1;
                let plen = p.len() as i64;
                if slen < plen {
                    return false;
                }
                let start = (slen - plen) as usize;
                (0..p.len()).all(|k| at(s, start + k) == p[k])
            }
            MatchKind::Glob => {
                let bound = if len < 0 { 0 } else { len as usize };
                glob_match(p, &s[..s.len().min(bound)])
            }
        }
    }
}

impl StrMatcher {
    /// The kernel's match on a field of size 0 (`char buf[]`, as `ftrace:print` has):
    /// its length is unknown, so the string ends at its NUL. `==` is then `strcmp`, a
    /// front match compares the pattern's bytes, a middle match is `strstr`, an end
    /// match never matches (the kernel computes a length of -1), a glob takes the string.
    pub fn matches_nul_terminated(&self, s: &[u8]) -> bool {
        let s = &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())];
        let p = &self.pattern[..];
        match self.kind {
            MatchKind::Full => s == p,
            MatchKind::Front => s.starts_with(p),
            MatchKind::Middle => p.is_empty() || s.windows(p.len()).any(|w| w == p),
            MatchKind::End => false,
            MatchKind::Glob => glob_match(p, s),
        }
    }
}

/// `strncmp(s, p, n) == 0` with `p` NUL-terminated after its bytes.
fn strncmp_eq(s: &[u8], p: &[u8], n: i64) -> bool {
    if n <= 0 {
        return true;
    }
    for i in 0..n as usize {
        let a = at(s, i);
        let b = at(p, i);
        if a != b {
            return false;
        }
        if a == 0 {
            return true;
        }
    }
    true
}

/// The kernel's `strnstr`: looks at the first `len` bytes, NULs included.
fn strnstr(s: &[u8], p: &[u8], len: i64) -> bool {
    let l2 = p.len() as i64;
    if l2 == 0 {
        return true;
    }
    let mut len = len;
    let mut off = 0usize;
    while len >= l2 {
        len -= 1;
        if (0..p.len()).all(|k| at(s, off + k) == p[k]) {
            return true;
        }
        off += 1;
    }
    false
}

/// Glob match with the semantics of the kernel's `lib/glob.c`: `*`, `?`,
/// `[a-z]`, `[!x]` (a leading `]` is literal in a class), `\x` escapes, and a
/// malformed class matching a literal `[`. `s` ends at its first NUL or its end.
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    let mut p = 0usize;
    let mut si = 0usize;
    let mut back: Option<(usize, usize)> = None;
    loop {
        let c = at(s, si);
        si += 1;
        let d = at(pat, p);
        p += 1;
        let mut literal_d = d;
        let mut go_literal = false;
        let mut go_backtrack = false;
        match d {
            b'?' => {
                if c == 0 {
                    return false;
                }
            }
            b'*' => {
                if at(pat, p) == 0 {
                    return true;
                }
                si -= 1;
                back = Some((p, si));
            }
            b'[' => {
                let inverted = at(pat, p) == b'!';
                let mut class = p + usize::from(inverted);
                let mut a = at(pat, class);
                class += 1;
                let mut matched = false;
                let mut malformed = false;
                loop {
                    let mut b = a;
                    if a == 0 {
                        malformed = true;
                        break;
                    }
                    if at(pat, class) == b'-' && at(pat, class + 1) != b']' {
                        b = at(pat, class + 1);
                        if b == 0 {
                            malformed = true;
                            break;
                        }
                        class += 2;
                    }
                    matched |= a <= c && c <= b;
                    a = at(pat, class);
                    class += 1;
                    if a == b']' {
                        break;
                    }
                }
                if malformed {
                    go_literal = true;
                } else if matched == inverted {
                    go_backtrack = true;
                } else {
                    p = class;
                }
            }
            b'\\' => {
                literal_d = at(pat, p);
                p += 1;
                go_literal = true;
            }
            _ => go_literal = true,
        }
        if go_literal {
            if c == literal_d {
                if literal_d == 0 {
                    return true;
                }
                continue;
            }
            go_backtrack = true;
        }
        if go_backtrack {
            match back {
                Some((bp, bs)) if c != 0 => {
                    p = bp;
                    si = bs + 1;
                    back = Some((bp, bs + 1));
                }
                _ => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(pat: &str, s: &str) -> bool {
        let (m, neg) = StrMatcher::glob(pat.as_bytes());
        m.matches(s.as_bytes(), s.len() as i64 + 1) ^ neg
    }

    #[test]
    fn events_rst_globs() {
        assert!(g("*sh", "bash"));
        assert!(g("sh*", "sh"));
        assert!(g("sh*", "shell"));
        assert!(!g("sh*", "bash"));
        assert!(g("*sh*", "ushx"));
        assert!(g("ba*sh", "bazsh"));
        assert!(!g("ba*sh", "bazs"));
        assert!(g("!bash", "zsh"));
        assert!(!g("!bash", "bash"));
    }

    #[test]
    fn classification() {
        assert_eq!(StrMatcher::glob(b"ab").0.kind, MatchKind::Full);
        assert_eq!(StrMatcher::glob(b"ab*").0.kind, MatchKind::Front);
        assert_eq!(StrMatcher::glob(b"*ab").0.kind, MatchKind::End);
        assert_eq!(StrMatcher::glob(b"*ab*").0.kind, MatchKind::Middle);
        assert_eq!(StrMatcher::glob(b"a*b").0.kind, MatchKind::Glob);
        assert_eq!(StrMatcher::glob(b"a?").0.kind, MatchKind::Glob);
        assert_eq!(StrMatcher::glob(b"1*").0, StrMatcher::full(b"1*"));
        assert_eq!(&*StrMatcher::glob(b"**").0.pattern, b"");
        assert_eq!(StrMatcher::glob(b"*").0.kind, MatchKind::End);
    }

    #[test]
    fn glob_classes_and_escapes() {
        assert!(glob_match(b"b[a-c]sh", b"bash"));
        assert!(!glob_match(b"b[!a]sh", b"bash"));
        assert!(glob_match(b"b[!x]sh", b"bash"));
        assert!(glob_match(b"[]]", b"]"));
        assert!(glob_match(b"a\\*", b"a*"));
        assert!(!glob_match(b"a\\*", b"ab"));
        assert!(glob_match(b"[", b"["));
        assert!(glob_match(b"a?c", b"abc"));
        assert!(!glob_match(b"a?c", b"ac"));
        assert!(glob_match(b"*a*b*", b"xxaxxbxx"));
        assert!(!glob_match(b"*a*b", b"xxaxxbxx"));
    }

    #[test]
    fn end_match_uses_the_kernel_length() {
        let (m, _) = StrMatcher::glob(b"*ue");
        // comm passes TASK_COMM_LEN, so a short comm never end-matches.
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"true");
        assert!(!m.matches(&comm, 16));
        assert!(m.matches(b"true", 5));
    }
}
