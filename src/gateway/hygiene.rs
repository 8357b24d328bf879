//! Request hygiene: header and method spellings that would let the backend see a different
//! request than the gate checked, refused (400) before any routing.
//!
//! - A header named in `Connection` is hop-by-hop and dropped by the proxy: naming `X-User-Id`
//!   there would let a request pass the gate as user 7 and reach the backend as nobody.
//! - `Content-Length` must be one plain decimal in range, and never beside `Transfer-Encoding`:
//!   `84, 84` or a value past 2^63 means different things to different parsers.
//! - Upgrades turn the connection into a tunnel the gate cannot inspect: only websocket, only on
//!   configured path prefixes (none by default), never on a gated route or the queue API.
//! - Methods on gated paths must be upper-case tokens (`post` is not `POST` to the gate, but may
//!   be to the backend); method-override headers and query parameters (`_method=POST`) are
//!   refused there whatever the method.
//! - CGI-style backends read `X_User_Id` as `X-User-Id` (both become `HTTP_X_USER_ID`): a
//!   protected header spelled with underscores never reaches the backend.
//!
//! Pure: no I/O.

use http::{header, HeaderMap, HeaderName, HeaderValue, Method};

use crate::headers::BadHeader;
use crate::headers::{METHOD_OVERRIDE_HEADERS, TOKEN_HEADER};
use crate::routing::path::CanonicalPath;

/// Headers the gate or the backend relies on; naming one in `Connection` is refused.
pub const PROTECTED_HEADERS: [&str; 8] = [
    "x-user-id",
    "x-entry-token",
    "authorization",
    "cookie",
    "host",
    "content-length",
    "transfer-encoding",
    "x-forwarded-for",
];

/// Largest accepted `Content-Length` (1 TB): past it a value is a probe, not an upload.
pub const MAX_CONTENT_LENGTH: u64 = 1_000_000_000_000;

/// Why a request was refused: a bounded reason (metric label) and the client's detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub detail: &'static str,
}

/// Where a proxied request is going, for `check_route`.
pub struct Route<'a> {
    /// A gated (purchase) route.
    pub gated: bool,
    /// A path too close to a gated route (`gated::lookalike`).
    pub lookalike: bool,
    pub path: &'a CanonicalPath<'a>,
    /// `[[upgrade.paths]]`: where a websocket upgrade may reach the backend.
    pub upgrade_prefixes: &'a [Vec<String>],
}

/// The checks that depend on the route, in order: a gated route's method must be an upper-case
/// token; no method-override query parameters or headers on a gated or look-alike route (whatever
/// the method), nor unsafe methods on a look-alike;
/// a protocol upgrade only as a websocket on a configured path, never on a gated route. `Ok`
/// lets the request on (an upgrade it asked for is then allowed).
pub fn check_route(
    route: &Route<'_>,
    req: &pingora::http::RequestHeader,
    facts: &HeaderFacts<'_>,
) -> Result<(), Refusal> {
    let refuse = |reason, detail| Err(Refusal { reason, detail });
    let method = &req.method;
    if route.gated && !upper_case_method(method) {
        return refuse(
            "method_case",
            "the method on this route must be an upper-case token",
        );
    }
    let override_query = req
        .uri
        .query()
        .is_some_and(|q| method_override_query(q.as_bytes()));
    if (route.gated || route.lookalike) && override_query {
        return refuse(
            "method_override",
            "method-override parameters are not allowed on this route",
        );
    }
    if (route.gated || route.lookalike) && facts.method_override {
        return refuse(
            "method_override",
            "method-override headers are not allowed on this route",
        );
    }
    if route.lookalike && unsafe_method(method) {
        return refuse(
            "lookalike_route",
            "this path is too close to a purchase route",
        );
    }
    if facts.upgrade
        && (route.gated
            || !websocket_only(&req.headers)
            || !under_prefix(route.upgrade_prefixes, route.path))
    {
        return refuse(
            "upgrade",
            "protocol upgrades are only allowed on configured websocket paths",
        );
    }
    Ok(())
}

/// Headers the backend never receives: the entry token (a credential for the gate, not for the
/// backend) and an h2c upgrade's settings (the backend must not
/// switch to HTTP/2 past the gate).
pub const NEVER_FORWARDED: [HeaderName; 2] =
    [TOKEN_HEADER, HeaderName::from_static("http2-settings")];

/// What one pass over a request's header fields found, for the checks that follow it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderFacts<'h> {
    /// `Upgrade` is present or `Connection` names `upgrade`: the request asks to switch protocols.
    pub upgrade: bool,
    /// A method-override header is present (`headers::METHOD_OVERRIDE_HEADERS`).
    pub method_override: bool,
    /// Which of `NEVER_FORWARDED` are present.
    pub never_forwarded: [bool; 2],
    /// A protected header (or a method override) is present spelled with underscores
    /// (`X_User_Id`): such fields are dropped before forwarding (`underscore_spelling`).
    pub underscored: bool,
    /// `Expect: 100-continue`: the body waits for the backend's go-ahead.
    pub expects_continue: bool,
    /// How many `X-Entry-Token` fields there are, and the first one's value.
    entry_tokens: usize,
    entry_token: Option<&'h HeaderValue>,
}

impl<'h> HeaderFacts<'h> {
    /// The entry token, read as `headers::single` reads a header: absent, one visible-ASCII
    /// value, or refused.
    pub fn entry_token(&self) -> Result<Option<&'h str>, BadHeader> {
        match (self.entry_token, self.entry_tokens) {
            (None, _) => Ok(None),
            (Some(v), 1) => v.to_str().map(Some).map_err(|_| BadHeader::NotAscii),
            (Some(_), _) => Err(BadHeader::Repeated),
        }
    }
}

/// Why `scan` refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanError {
    /// Past `max_header_bytes` or `max_headers`: answered 431 without reading further.
    TooLarge,
    /// A header spelling the backend might read differently: answered 400.
    Refused(Refusal),
}

/// Checks every request's header fields, whatever its path, in one pass: their size and count,
/// `Connection` naming a protected header, `Content-Length` and `Transfer-Encoding`; and notes
/// what later checks need (`HeaderFacts`). A request too large is refused as such even when it
/// also has a bad spelling.
pub fn scan(
    req: &pingora::http::RequestHeader,
    max_bytes: usize,
    max_headers: usize,
) -> Result<HeaderFacts<'_>, ScanError> {
    let line = req.method.as_str().len() + req.raw_path().len() + 12;
    scan_fields(&req.headers, line, max_bytes, max_headers)
}

/// `scan` of the header fields after a request line of `line_bytes`.
fn scan_fields(
    headers: &HeaderMap,
    line_bytes: usize,
    max_bytes: usize,
    max_headers: usize,
) -> Result<HeaderFacts<'_>, ScanError> {
    if headers.len() > max_headers {
        return Err(ScanError::TooLarge);
    }
    let mut facts = HeaderFacts::default();
    let mut bytes = line_bytes;
    let mut connection_refused = false;
    let mut lengths = 0;
    let mut length_ok = false;
    let mut transfer_encoding = false;
    for (name, value) in headers {
        bytes += name.as_str().len() + value.len() + 4;
        if name == header::CONNECTION {
            match value.to_str() {
                Ok(v) => {
                    for token in v.split(',').map(str::trim) {
                        facts.upgrade |= token.eq_ignore_ascii_case("upgrade");
                        connection_refused |= PROTECTED_HEADERS
                            .iter()
                            .any(|p| token.eq_ignore_ascii_case(p));
                    }
                }
                Err(_) => connection_refused = true,
            }
        } else if name == header::CONTENT_LENGTH {
            lengths += 1;
            length_ok = plain_length(value.as_bytes());
        } else if name == header::TRANSFER_ENCODING {
            transfer_encoding = true;
        } else if name == header::UPGRADE {
            facts.upgrade = true;
        } else if name == header::EXPECT {
            facts.expects_continue |= value.as_bytes().eq_ignore_ascii_case(b"100-continue");
        } else if METHOD_OVERRIDE_HEADERS.contains(name) {
            facts.method_override = true;
        } else if let Some(i) = NEVER_FORWARDED.iter().position(|n| n == name) {
            facts.never_forwarded[i] = true;
            if name == TOKEN_HEADER {
                facts.entry_tokens += 1;
                facts.entry_token = facts.entry_token.or(Some(value));
            }
        } else if name.as_str().as_bytes().contains(&b'_') {
            match underscore_spelling(name) {
                Some(Spelled::Protected) => facts.underscored = true,
                Some(Spelled::MethodOverride) => {
                    facts.underscored = true;
                    facts.method_override = true;
                }
                None => {}
            }
        }
    }
    if bytes > max_bytes {
        return Err(ScanError::TooLarge);
    }
    let refuse = |reason, detail| Err(ScanError::Refused(Refusal { reason, detail }));
    if connection_refused {
        return refuse(
            "connection_header",
            "the Connection header may not name this header",
        );
    }
    if lengths > 1 {
        return refuse("content_length", "exactly one Content-Length is allowed");
    }
    if lengths == 1 && !length_ok {
        return refuse(
            "content_length",
            "Content-Length must be one decimal number in range",
        );
    }
    if lengths == 1 && transfer_encoding {
        return refuse(
            "content_length",
            "Content-Length and Transfer-Encoding may not both be sent",
        );
    }
    Ok(facts)
}

/// What a header name spelled with underscores stands for, read as CGI does (`_` as `-`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelled {
    /// One of `PROTECTED_HEADERS` (or the entry token).
    Protected,
    /// One of `METHOD_OVERRIDE_HEADERS`.
    MethodOverride,
}

/// `name` read with its underscores as dashes, if that is a header the gate or the backend relies
/// on. (Header names are lower case already.)
pub fn underscore_spelling(name: &HeaderName) -> Option<Spelled> {
    let n = name.as_str();
    if !n.contains('_') || n.len() > 32 {
        return None;
    }
    let dashed: String = n.chars().map(|c| if c == '_' { '-' } else { c }).collect();
    if PROTECTED_HEADERS.contains(&dashed.as_str()) {
        Some(Spelled::Protected)
    } else if METHOD_OVERRIDE_HEADERS.iter().any(|h| h.as_str() == dashed) {
        Some(Spelled::MethodOverride)
    } else {
        None
    }
}

/// Query parameter names that frameworks read as the method to use (Rails, Laravel, Symfony,
/// Spring's `HiddenHttpMethodFilter`, Express's `method-override`), compared after
/// percent-decoding, without case and surrounding blanks.
const METHOD_OVERRIDE_PARAMS: [&str; 4] = [
    "_method",
    "x-http-method-override",
    "x-method-override",
    "x-http-method",
];

/// Whether a query string carries a method-override parameter (`?_method=POST` turns a GET that
/// the gate lets through into a POST at such a backend). Parameters are split on `&` and `;`.
pub fn method_override_query(query: &[u8]) -> bool {
    query.split(|&b| b == b'&' || b == b';').any(|param| {
        let name = param.split(|&b| b == b'=').next().unwrap_or_default();
        if name.is_empty() || name.len() > 64 {
            return false;
        }
        let decoded = decode_query_name(name);
        let trimmed = decoded.trim_matches(|c: char| c.is_ascii_whitespace() || c == '\0');
        METHOD_OVERRIDE_PARAMS
            .iter()
            .any(|p| trimmed.eq_ignore_ascii_case(p))
    })
}

/// A query parameter name as a form decoder reads it: `+` is a space, `%XX` a byte (an invalid
/// escape stays as written).
fn decode_query_name(name: &[u8]) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(name.len());
    let mut i = 0;
    while i < name.len() {
        match name[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < name.len() => match (hex(name[i + 1]), hex(name[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One plain decimal of at most 13 digits, at most `MAX_CONTENT_LENGTH`.
fn plain_length(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= 13
        && v.iter().all(u8::is_ascii_digit)
        && v.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')) <= MAX_CONTENT_LENGTH
}

/// Whether every `Upgrade` value is websocket (h2c would carry HTTP/2 requests past the gate).
pub fn websocket_only(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(http::header::UPGRADE).iter().peekable();
    values.peek().is_some()
        && values.all(|v| {
            v.to_str().is_ok_and(|s| {
                s.split(',')
                    .all(|p| p.trim().eq_ignore_ascii_case("websocket"))
            })
        })
}

/// Whether `path` lies under one of the configured upgrade prefixes (whole segments).
pub fn under_prefix(prefixes: &[Vec<String>], path: &CanonicalPath) -> bool {
    let len = path.len();
    prefixes.iter().any(|p| {
        p.len() <= len
            && p.iter()
                .zip(path.segments())
                .all(|(want, got)| want.eq_ignore_ascii_case(got))
    })
}

/// An upper-case token: what every standard method is, and what the gate compares against.
pub fn upper_case_method(method: &Method) -> bool {
    let m = method.as_str();
    !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase())
}

/// Methods that may create something on a purchase path: everything but the safe methods and
/// DELETE (a backend that maps PUT or PATCH to its order handler must not get them unchecked).
pub fn may_create(method: &Method) -> bool {
    unsafe_method(method) && !method.as_str().eq_ignore_ascii_case("DELETE")
}

/// Methods that change state (where a lookalike path must not reach the backend).
pub fn unsafe_method(method: &Method) -> bool {
    let m = method.as_str();
    !["GET", "HEAD", "OPTIONS", "TRACE"]
        .iter()
        .any(|safe| m.eq_ignore_ascii_case(safe))
}

#[cfg(test)]
mod tests;
