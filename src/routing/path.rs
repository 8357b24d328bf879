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
mod tests;
