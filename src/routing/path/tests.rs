//! The unit tests of `path.rs`.

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
