//! Strict canonicalisation of request paths, the first half of deciding
//! whether a request targets a gated purchase route.
//!
//! This is a security boundary: the gateway and the backend must never
//! disagree about which route a path names. So every spelling whose meaning
//! differs between servers (encoded slashes, backslashes, matrix parameters,
//! dot segments, double encoding, non-ASCII) is rejected outright, and the
//! harmless variations (escaped unreserved characters, hex case, repeated or
//! trailing slashes) are folded into one form. Route matching is done
//! elsewhere on the result; this module does no I/O.

use std::borrow::Cow;

/// Longer paths are rejected before scanning; no legitimate route is close.
pub const MAX_PATH_LEN: usize = 8192;

/// A canonical path: `/` and its segments joined by `/` (`/` when there are none). Segments are
/// non-empty; escapes of unreserved characters are decoded, any other escape stays as `%XX` with
/// upper-case hex, and case is preserved. A request path that is already canonical (the common
/// case) is borrowed, not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPath<'a> {
    path: Cow<'a, str>,
    /// The number of segments.
    len: usize,
}

impl CanonicalPath<'_> {
    /// The path: "/" + segments joined by "/" ("/" when there are none).
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// The segments in order (none for "/"). None is empty, and none contains '/'.
    pub fn segments(&self) -> Segments<'_> {
        Segments {
            rest: if self.len == 0 { "" } else { &self.path },
        }
    }

    /// The number of segments.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the path is "/" (no segments).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The path as an owned string.
    pub fn to_path(&self) -> String {
        self.path.clone().into_owned()
    }
}

/// The segments of a canonical path, in order.
#[derive(Debug, Clone)]
pub struct Segments<'p> {
    /// What is left: empty, or "/" and at least one more segment.
    rest: &'p str,
}

impl<'p> Iterator for Segments<'p> {
    type Item = &'p str;

    fn next(&mut self) -> Option<&'p str> {
        let body = self.rest.get(1..)?;
        // Segments are short: a plain scan beats a search call per segment.
        let end = body.bytes().position(|b| b == b'/').unwrap_or(body.len());
        let (segment, rest) = body.split_at(end);
        self.rest = rest;
        Some(segment)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path does not start with '/'")]
    NotAbsolute,
    #[error("path contains an encoded '/'")]
    EncodedSlash,
    #[error("path contains a backslash")]
    Backslash,
    #[error("path contains a control character")]
    ControlChar,
    #[error("path contains ';'")]
    Semicolon,
    #[error("path contains a '.' or '..' segment")]
    DotSegment,
    #[error("path contains a malformed percent-escape")]
    BadEscape,
    #[error("path contains an encoded '%'")]
    DoubleEncoding,
    #[error("path contains a non-ASCII byte")]
    NonAscii,
    #[error("path is longer than {MAX_PATH_LEN} bytes")]
    TooLong,
}

impl PathError {
    /// Bounded metric label.
    pub fn reason(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "not_absolute",
            PathError::EncodedSlash => "encoded_slash",
            PathError::Backslash => "backslash",
            PathError::ControlChar => "control_char",
            PathError::Semicolon => "semicolon",
            PathError::DotSegment => "dot_segment",
            PathError::BadEscape => "bad_escape",
            PathError::DoubleEncoding => "double_encoding",
            PathError::NonAscii => "non_ascii",
            PathError::TooLong => "too_long",
        }
    }
}

/// `raw` is the path part of the request target only (no query string, no scheme/authority), as
/// raw bytes.
pub fn canonicalize(raw: &[u8]) -> Result<CanonicalPath<'_>, PathError> {
    match already_canonical(raw) {
        Some((path, len)) => Ok(CanonicalPath {
            path: Cow::Borrowed(path),
            len,
        }),
        None => full_pass(raw),
    }
}

/// Canonicalises any path into a new string, or names the first fault in it.
fn full_pass(raw: &[u8]) -> Result<CanonicalPath<'static>, PathError> {
    if raw.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong);
    }
    if raw.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut path = String::with_capacity(raw.len());
    let mut len = 0;
    for raw_segment in raw.split(|&b| b == b'/') {
        let start = path.len();
        path.push('/');
        canonical_segment(raw_segment, &mut path)?;
        let segment = &path[start + 1..];
        if segment.is_empty() {
            // Folds "//" and the trailing "/": servers disagree on them, and
            // no gated route depends on them.
            path.truncate(start);
            continue;
        }
        if segment == "." || segment == ".." {
            return Err(PathError::DotSegment);
        }
        len += 1;
    }
    if path.is_empty() {
        path.push('/');
    }
    Ok(CanonicalPath {
        path: Cow::Owned(path),
        len,
    })
}

/// `raw` itself when it is canonical already: within the length limit, absolute, without escapes,
/// empty segments (but the root), dot segments or refused bytes. Anything else, refused or not,
/// is left to the full pass, so the answer and the error are always the full pass's.
/// Returns the path and its number of segments.
fn already_canonical(raw: &[u8]) -> Option<(&str, usize)> {
    if raw.len() > MAX_PATH_LEN || raw.first() != Some(&b'/') {
        return None;
    }
    let Some(body) = raw.get(1..).filter(|b| !b.is_empty()) else {
        return Some(("/", 0));
    };
    let mut len = 0;
    for segment in body.split(|&b| b == b'/') {
        if matches!(segment, b"" | b"." | b"..")
            || segment.iter().any(|&b| NOT_PLAIN[usize::from(b)])
        {
            return None;
        }
        len += 1;
    }
    Some((std::str::from_utf8(raw).ok()?, len))
}

/// The bytes [`already_canonical`] leaves to the full pass: the escape character and every byte
/// the full pass refuses in a segment.
const NOT_PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = matches!(b as u8, b'%' | b'\\' | b';' | 0x00..=0x1f | 0x7f..=0xff);
        b += 1;
    }
    t
};

/// Appends the canonical spelling of one raw segment to `out`.
fn canonical_segment(raw: &[u8], out: &mut String) -> Result<(), PathError> {
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        if b == b'%' {
            let value = match (raw.get(i + 1), raw.get(i + 2)) {
                (Some(&hi), Some(&lo)) => hex_pair(hi, lo).ok_or(PathError::BadEscape)?,
                _ => return Err(PathError::BadEscape),
            };
            check_byte(value, true)?;
            if is_unreserved(value) {
                out.push(char::from(value));
            } else {
                out.push('%');
                out.push(char::from(HEX_UPPER[usize::from(value >> 4)]));
                out.push(char::from(HEX_UPPER[usize::from(value & 0x0f)]));
            }
            i += 3;
        } else {
            check_byte(b, false)?;
            out.push(char::from(b));
            i += 1;
        }
    }
    Ok(())
}

/// Rejections shared by raw and decoded bytes; `decoded` adds those that are
/// only dangerous once a server decodes them ('/' and '%').
fn check_byte(b: u8, decoded: bool) -> Result<(), PathError> {
    match b {
        b'/' if decoded => Err(PathError::EncodedSlash),
        // A decoded '%' would let a second decoding pass (backend, proxy or
        // framework) see an escape we never inspected.
        b'%' if decoded => Err(PathError::DoubleEncoding),
        b'\\' => Err(PathError::Backslash),
        // Matrix parameters: servlet containers strip ";..." before routing,
        // so "/orders;x" would reach the handler for "/orders".
        b';' => Err(PathError::Semicolon),
        0x00..=0x1f | 0x7f => Err(PathError::ControlChar),
        0x80..=0xff => Err(PathError::NonAscii),
        _ => Ok(()),
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

fn hex_pair(hi: u8, lo: u8) -> Option<u8> {
    Some((hex_digit(hi)? << 4) | hex_digit(lo)?)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 unreserved: escaping these never changes meaning, so decoding
/// them is the one normalisation every server agrees on.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn segs(raw: &[u8]) -> Vec<String> {
        let c = canonicalize(raw).unwrap();
        assert_eq!(c, full_pass(raw).unwrap());
        assert_eq!(c.len(), c.segments().count());
        assert_eq!(c.is_empty(), c.segments().next().is_none());
        c.segments().map(String::from).collect()
    }

    #[test]
    fn accepted_inputs() {
        let table: &[(&[u8], &[&str])] = &[
            (
                b"/limited-drops/42/orders",
                &["limited-drops", "42", "orders"],
            ),
            (
                b"//limited-drops//42/orders/",
                &["limited-drops", "42", "orders"],
            ),
            (
                b"/limited-drops/%34%32/orders",
                &["limited-drops", "42", "orders"],
            ),
            (
                b"/%6Cimited-drops/42/%6f%72ders",
                &["limited-drops", "42", "orders"],
            ),
            (
                b"/Limited-Drops/42/ORDERS",
                &["Limited-Drops", "42", "ORDERS"],
            ),
            (b"/a%7eb", &["a~b"]),
            (b"/a%2db%5Fc%2E", &["a-b_c."]),
            (b"/a%20b", &["a%20b"]),
            (b"/a%3fb", &["a%3Fb"]),
            (b"/a%3Fb", &["a%3Fb"]),
            (b"/a%23b%40c", &["a%23b%40c"]),
            (b"/a:b@c!$&'()*+,=", &["a:b@c!$&'()*+,="]),
            (b"/...", &["..."]),
            (b"/.a/a./..b", &[".a", "a.", "..b"]),
            (b"/", &[]),
            (b"//", &[]),
            (b"///", &[]),
        ];
        for (raw, expected) in table {
            assert_eq!(segs(raw), *expected, "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn canonical_request_paths_are_borrowed() {
        for raw in [&b"/"[..], b"/limited-drops/42/orders", b"/a.b/~c/..d"] {
            let c = canonicalize(raw).unwrap();
            assert!(matches!(c.path, Cow::Borrowed(_)), "{c:?}");
            assert_eq!(c, full_pass(raw).unwrap());
        }
        for raw in [&b"//"[..], b"/a/", b"/a//b", b"/%61"] {
            assert!(matches!(canonicalize(raw).unwrap().path, Cow::Owned(_)));
        }
    }

    #[test]
    fn to_path_joins_segments() {
        assert_eq!(canonicalize(b"/").unwrap().to_path(), "/");
        assert_eq!(
            canonicalize(b"//limited-drops//%34%32/orders/")
                .unwrap()
                .to_path(),
            "/limited-drops/42/orders"
        );
        assert_eq!(canonicalize(b"/a%3fb/").unwrap().to_path(), "/a%3Fb");
    }

    #[test]
    fn rejected_inputs() {
        use PathError::*;
        let long = {
            let mut p = b"/".to_vec();
            p.extend(std::iter::repeat_n(b'a', 8999));
            p
        };
        assert_eq!(long.len(), 9000);
        let table: &[(&[u8], PathError)] = &[
            (b"/a%2Fb", EncodedSlash),
            (b"/a%2fb", EncodedSlash),
            (b"/a\\b", Backslash),
            (b"/a%5cb", Backslash),
            (b"/a%5Cb", Backslash),
            (b"/a/../b", DotSegment),
            (b"/a/./b", DotSegment),
            (b"/a/..", DotSegment),
            (b"/..", DotSegment),
            (b"/a/%2e%2e/b", DotSegment),
            (b"/a/.%2E/b", DotSegment),
            (b"/a/%2E./b", DotSegment),
            (b"/a/%2e/b", DotSegment),
            (b"/a;x/b", Semicolon),
            (b"/a/b;jsessionid=1", Semicolon),
            (b"/a%3bb", Semicolon),
            (b"/a%3Bb", Semicolon),
            (b"/a%2531", DoubleEncoding),
            (b"/a%zz", BadEscape),
            (b"/a%4", BadEscape),
            (b"/a%", BadEscape),
            (b"/a%%41", BadEscape),
            (b"/a%4g", BadEscape),
            (b"/a%00", ControlChar),
            (b"/a%1f", ControlChar),
            (b"/a%7F", ControlChar),
            (b"/a\x01", ControlChar),
            (b"/a\x00b", ControlChar),
            (b"/a\tb", ControlChar),
            (b"/a\x7f", ControlChar),
            (b"/a%C3%A9", NonAscii),
            (b"/a%80", NonAscii),
            (b"/a%ff", NonAscii),
            (b"/a\xc3\xa9", NonAscii),
            (b"/\x80", NonAscii),
            (b"/\xff", NonAscii),
            (b"", NotAbsolute),
            (b"a/b", NotAbsolute),
            (b"%2Fa", NotAbsolute),
            (b"\\a", NotAbsolute),
            (&long, TooLong),
        ];
        for (raw, expected) in table {
            assert_eq!(
                canonicalize(raw),
                Err(*expected),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn max_len_is_inclusive() {
        let mut p = b"/".to_vec();
        p.extend(std::iter::repeat_n(b'a', MAX_PATH_LEN - 1));
        assert!(canonicalize(&p).is_ok());
        p.push(b'a');
        assert_eq!(canonicalize(&p), Err(PathError::TooLong));
    }

    #[test]
    fn reasons_are_distinct_snake_case_labels() {
        use PathError::*;
        let all = [
            NotAbsolute,
            EncodedSlash,
            Backslash,
            ControlChar,
            Semicolon,
            DotSegment,
            BadEscape,
            DoubleEncoding,
            NonAscii,
            TooLong,
        ];
        let mut labels: Vec<_> = all.iter().map(|e| e.reason()).collect();
        assert!(labels
            .iter()
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), all.len());
    }

    fn assert_clean(c: &CanonicalPath) {
        for s in c.segments() {
            assert!(!s.is_empty());
            assert!(s != "." && s != "..", "{s:?}");
            let b = s.as_bytes();
            assert!(
                b.iter()
                    .all(|&x| x.is_ascii() && !x.is_ascii_control() && !b"/\\;".contains(&x)),
                "{s:?}"
            );
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' {
                    let esc = &s[i..i + 3];
                    assert!(esc != "%2F" && esc != "%25", "{s:?}");
                    let v = u8::from_str_radix(&esc[1..], 16).unwrap();
                    assert_eq!(esc[1..].to_ascii_uppercase(), esc[1..]);
                    assert!(!is_unreserved(v) && check_byte(v, true).is_ok(), "{s:?}");
                    i += 3;
                } else {
                    i += 1;
                }
            }
        }
    }

    /// Paths made mostly of pieces the canonicaliser accepts, with a few
    /// hostile ones mixed in so both branches are exercised.
    fn pathish() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            8 => "[A-Za-z0-9._~!$&'()*+,=:@-]{1,4}".prop_map(String::into_bytes),
            4 => Just(b"/".to_vec()),
            3 => "%[2-7][0-9a-fA-F]".prop_map(String::into_bytes),
            1 => "%[0-9a-fA-F]{2}".prop_map(String::into_bytes),
            1 => Just(b".".to_vec()),
            1 => prop_oneof![
                "[;\\\\%\x00\x7f]".prop_map(String::into_bytes),
                any::<u8>().prop_map(|b| vec![b]),
            ],
        ];
        proptest::collection::vec(piece, 0..16).prop_map(|pieces| {
            let mut p = b"/".to_vec();
            pieces.into_iter().for_each(|x| p.extend(x));
            p
        })
    }

    /// Re-spells unreserved characters as escapes (mixed hex case) where
    /// `mask` says so, leaving existing `%XX` escapes untouched.
    fn percent_encode_unreserved(path: &str, mask: &[bool]) -> String {
        let b = path.as_bytes();
        let mut out = String::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                out.push_str(&path[i..i + 3]);
                i += 3;
                continue;
            }
            if is_unreserved(b[i]) && mask.get(i).copied().unwrap_or(false) {
                if i % 2 == 0 {
                    out.push_str(&format!("%{:02X}", b[i]));
                } else {
                    out.push_str(&format!("%{:02x}", b[i]));
                }
            } else {
                out.push(char::from(b[i]));
            }
            i += 1;
        }
        out
    }

    /// Guards the property tests below: they only mean something if the
    /// generator often produces paths that are accepted.
    #[test]
    fn pathish_is_often_accepted() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let accepted = (0..1000)
            .filter(|_| {
                let raw = pathish().new_tree(&mut runner).unwrap().current();
                canonicalize(&raw).is_ok()
            })
            .count();
        assert!(accepted > 250, "{accepted}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn never_panics_on_arbitrary_bytes(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = canonicalize(&raw);
        }

        #[test]
        fn never_panics_on_slash_prefixed_bytes(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut p = b"/".to_vec();
            p.extend(raw);
            let _ = canonicalize(&p);
        }

        #[test]
        fn the_shortcut_agrees_with_the_full_pass(raw in pathish()) {
            prop_assert_eq!(canonicalize(&raw), full_pass(&raw));
        }

        #[test]
        fn the_shortcut_agrees_with_the_full_pass_on_any_bytes(
            raw in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut p = b"/".to_vec();
            p.extend(raw);
            prop_assert_eq!(canonicalize(&p), full_pass(&p));
        }

        #[test]
        fn accepted_output_is_clean_and_idempotent(raw in pathish()) {
            if let Ok(c) = canonicalize(&raw) {
                assert_clean(&c);
                let text = c.to_path();
                prop_assert_eq!(canonicalize(text.as_bytes()), Ok(c.clone()));
            }
        }

        #[test]
        fn escaping_unreserved_chars_does_not_change_the_result(
            raw in pathish(),
            mask in proptest::collection::vec(any::<bool>(), 0..200),
        ) {
            if let Ok(c) = canonicalize(&raw) {
                let spelled = percent_encode_unreserved(&c.to_path(), &mask);
                prop_assert_eq!(canonicalize(spelled.as_bytes()), Ok(c));
            }
        }
    }
}
