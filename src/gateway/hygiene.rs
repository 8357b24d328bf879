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
//!   be to the backend).
//!
//! Pure: no I/O.

use http::{HeaderMap, Method};

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

fn refuse(reason: &'static str, detail: &'static str) -> Result<(), Refusal> {
    Err(Refusal { reason, detail })
}

/// The comma-separated tokens of every `Connection` header, lower-cased.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| {
            v.to_str()
                .unwrap_or("\u{0}invalid")
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
}

/// Checks every request, whatever its path.
pub fn check_headers(headers: &HeaderMap) -> Result<(), Refusal> {
    for token in connection_tokens(headers) {
        if PROTECTED_HEADERS.contains(&token.as_str()) || token.starts_with('\u{0}') {
            return refuse(
                "connection_header",
                "the Connection header may not name this header",
            );
        }
    }
    let mut lengths = headers.get_all(http::header::CONTENT_LENGTH).iter();
    if let Some(first) = lengths.next() {
        if lengths.next().is_some() {
            return refuse("content_length", "exactly one Content-Length is allowed");
        }
        let ok = first.to_str().ok().is_some_and(|s| {
            !s.is_empty()
                && s.len() <= 13
                && s.bytes().all(|b| b.is_ascii_digit())
                && s.parse::<u64>().is_ok_and(|n| n <= MAX_CONTENT_LENGTH)
        });
        if !ok {
            return refuse(
                "content_length",
                "Content-Length must be one decimal number in range",
            );
        }
        if headers.contains_key(http::header::TRANSFER_ENCODING) {
            return refuse(
                "content_length",
                "Content-Length and Transfer-Encoding may not both be sent",
            );
        }
    }
    Ok(())
}

/// Whether the request line and headers stay within `max_bytes` and `max_headers` fields.
pub fn within_limits(
    req: &pingora::http::RequestHeader,
    max_bytes: usize,
    max_headers: usize,
) -> bool {
    if req.headers.len() > max_headers {
        return false;
    }
    let line = req.method.as_str().len() + req.raw_path().len() + 12;
    let fields: usize = req
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    line + fields <= max_bytes
}

/// Whether the request asks to switch protocols.
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(http::header::UPGRADE)
        || connection_tokens(headers).any(|t| t == "upgrade")
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

/// Whether `segments` (canonical) lie under one of the configured upgrade prefixes.
pub fn under_prefix(prefixes: &[Vec<String>], segments: &[String]) -> bool {
    prefixes.iter().any(|p| {
        p.len() <= segments.len()
            && p.iter()
                .zip(segments)
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
    !matches!(
        method.as_str().to_ascii_uppercase().as_str(),
        "GET" | "HEAD" | "OPTIONS" | "TRACE"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_util::headers as h;

    #[test]
    fn connection_may_not_name_protected_headers() {
        assert!(check_headers(&h(&[("connection", "keep-alive")])).is_ok());
        assert!(check_headers(&h(&[("connection", "Upgrade")])).is_ok());
        for bad in [
            "X-User-Id",
            "keep-alive, x-user-id",
            "X-Entry-Token",
            "authorization",
        ] {
            let r = check_headers(&h(&[("connection", bad)]));
            assert_eq!(r.unwrap_err().reason, "connection_header", "{bad}");
        }
        let two = h(&[("connection", "close"), ("connection", "Cookie")]);
        assert!(check_headers(&two).is_err());
    }

    #[test]
    fn content_length_is_one_plain_number() {
        assert!(check_headers(&h(&[("content-length", "84")])).is_ok());
        assert!(check_headers(&h(&[("content-length", "0")])).is_ok());
        for bad in [
            "84, 84",
            "+84",
            " 84",
            "0x54",
            "9223372036854775808",
            "",
            "1e3",
        ] {
            let m = h(&[("content-length", bad)]);
            assert_eq!(
                check_headers(&m).unwrap_err().reason,
                "content_length",
                "{bad:?}"
            );
        }
        let dup = h(&[("content-length", "84"), ("content-length", "84")]);
        assert!(check_headers(&dup).is_err());
        let both = h(&[("content-length", "5"), ("transfer-encoding", "chunked")]);
        assert!(check_headers(&both).is_err());
    }

    #[test]
    fn upgrades() {
        assert!(!wants_upgrade(&h(&[])));
        assert!(wants_upgrade(&h(&[("upgrade", "websocket")])));
        assert!(wants_upgrade(&h(&[("connection", "keep-alive, Upgrade")])));
        assert!(websocket_only(&h(&[("upgrade", "WebSocket")])));
        assert!(!websocket_only(&h(&[("upgrade", "h2c")])));
        assert!(!websocket_only(&h(&[("upgrade", "websocket, h2c")])));
        assert!(!websocket_only(&h(&[])));
        let prefixes = vec![vec!["ws".to_string()]];
        let seg = |p: &str| p.split('/').map(String::from).collect::<Vec<_>>();
        assert!(under_prefix(&prefixes, &seg("ws/chat")));
        assert!(under_prefix(&prefixes, &seg("WS/chat")));
        assert!(!under_prefix(&prefixes, &seg("wsx/chat")));
        assert!(!under_prefix(&[], &seg("ws/chat")));
    }

    #[test]
    fn methods() {
        assert!(upper_case_method(&Method::POST));
        assert!(!upper_case_method(&Method::from_bytes(b"post").unwrap()));
        assert!(!upper_case_method(&Method::from_bytes(b"Post").unwrap()));
        assert!(unsafe_method(&Method::POST));
        assert!(unsafe_method(&Method::from_bytes(b"post").unwrap()));
        assert!(!unsafe_method(&Method::GET));
    }
}
