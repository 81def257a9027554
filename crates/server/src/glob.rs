//! Redis's glob patterns (KEYS, SCAN MATCH, CONFIG GET) over bytes: `*`, `?`, `[abc]`, `[^a]`,
//! `[a-z]`, and `\` escaping the next byte — the rules of Redis's `stringmatchlen`.

/// Whether `s` matches `pat`.
pub fn matches(pat: &[u8], s: &[u8]) -> bool {
    // Iterative with one backtrack point for the last `*`: linear in practice, no recursion.
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    loop {
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    while p < pat.len() && pat[p] == b'*' {
                        p += 1;
                    }
                    star = Some((p, i));
                    continue;
                }
                _ if i < s.len() => {
                    if let Some(next) = match_one(pat, p, s[i]) {
                        p = next;
                        i += 1;
                        continue;
                    }
                }
                _ => {}
            }
        } else if i == s.len() {
            return true;
        }
        // Mismatch: let the last `*` swallow one more byte, or fail.
        match star {
            Some((sp, si)) if si < s.len() => {
                star = Some((sp, si + 1));
                p = sp;
                i = si + 1;
            }
            _ => return false,
        }
    }
}

/// Matches one pattern element at `p` (not `*`) against byte `c`: the index after the element,
/// or `None` on mismatch.
fn match_one(pat: &[u8], p: usize, c: u8) -> Option<usize> {
    match pat[p] {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pat.len() => (pat[p + 1] == c).then_some(p + 2),
        b'[' => {
            let mut q = p + 1;
            let not = pat.get(q) == Some(&b'^');
            if not {
                q += 1;
            }
            let mut hit = false;
            while q < pat.len() && pat[q] != b']' {
                if pat[q] == b'\\' && q + 1 < pat.len() {
                    hit |= pat[q + 1] == c;
                    q += 2;
                } else if q + 2 < pat.len() && pat[q + 1] == b'-' && pat[q + 2] != b']' {
                    let (a, b) = (pat[q].min(pat[q + 2]), pat[q].max(pat[q + 2]));
                    hit |= (a..=b).contains(&c);
                    q += 3;
                } else {
                    hit |= pat[q] == c;
                    q += 1;
                }
            }
            // An unterminated class ends at the end of the pattern, as in Redis.
            let next = (q + 1).min(pat.len());
            (hit != not).then_some(next)
        }
        lit => (lit == c).then_some(p + 1),
    }
}

/// The bytes every match must start with: the pattern up to its first special character
/// (escapes resolved). Lets KEYS/SCAN read only the keys under that prefix.
pub fn literal_prefix(pat: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut p = 0;
    while p < pat.len() {
        match pat[p] {
            b'*' | b'?' | b'[' => break,
            b'\\' if p + 1 < pat.len() => {
                out.push(pat[p + 1]);
                p += 2;
            }
            b'\\' => break,
            c => {
                out.push(c);
                p += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_cases() {
        let yes: &[(&str, &str)] = &[
            ("*", ""),
            ("*", "abc"),
            ("user:*", "user:1"),
            ("h?llo", "hello"),
            ("h*llo", "heeeello"),
            ("h[ae]llo", "hallo"),
            ("h[^e]llo", "hallo"),
            ("h[a-b]llo", "hbllo"),
            ("a\\*b", "a*b"),
            ("*a*b*", "xxaxxbxx"),
            ("save", "save"),
        ];
        for (p, s) in yes {
            assert!(matches(p.as_bytes(), s.as_bytes()), "{p} ~ {s}");
        }
        let no: &[(&str, &str)] = &[
            ("user:*", "use"),
            ("h?llo", "hllo"),
            ("h[ae]llo", "hillo"),
            ("h[^e]llo", "hello"),
            ("a\\*b", "axb"),
            ("abc", "abcd"),
            ("*a", "ab"),
        ];
        for (p, s) in no {
            assert!(!matches(p.as_bytes(), s.as_bytes()), "{p} !~ {s}");
        }
    }

    #[test]
    fn prefixes() {
        assert_eq!(literal_prefix(b"user:*"), b"user:");
        assert_eq!(literal_prefix(b"a\\*b*"), b"a*b");
        assert_eq!(literal_prefix(b"*"), b"");
        assert_eq!(literal_prefix(b"k?"), b"k");
    }
}
