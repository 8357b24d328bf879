//! Reading request headers strictly, in one place: a header that may appear once is refused when
//! repeated (two values are two different answers to one question, and a backend may read the
//! other one), and a value that is not visible ASCII is refused rather than guessed at.

use http::{HeaderMap, HeaderName};

// Header names are built once, not parsed from a string on every lookup.

/// The entry token's header.
pub const TOKEN_HEADER: HeaderName = HeaderName::from_static("x-entry-token");

/// The user id a trusted front sets (`identity.source = "header"`), and the one the gateway
/// sets on requests it forwards to the backend.
pub const USER_HEADER: HeaderName = HeaderName::from_static("x-user-id");

/// Where a client sends back the queue ticket of its last waiting answer (`token::TicketPayload`).
pub const TICKET_HEADER: HeaderName = HeaderName::from_static("x-queue-ticket");

/// Headers that ask some frameworks to treat a POST as another method; never allowed on a gated
/// path, since the backend might honour one the gateway did not check.
pub const METHOD_OVERRIDE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-method-override"),
    HeaderName::from_static("x-http-method"),
];

/// Why a single-valued header cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadHeader {
    /// Present more than once.
    Repeated,
    /// Not visible ASCII.
    NotAscii,
}

/// The value of a header that may appear at most once: `Ok(None)` when absent.
pub fn single(
    headers: &HeaderMap,
    name: impl http::header::AsHeaderName,
) -> Result<Option<&str>, BadHeader> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => v.to_str().map(Some).map_err(|_| BadHeader::NotAscii),
        _ => Err(BadHeader::Repeated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_twice_and_binary() {
        let mut h = HeaderMap::new();
        assert_eq!(single(&h, "x-a"), Ok(None));
        h.append("x-a", "1".parse().unwrap());
        assert_eq!(single(&h, "x-a"), Ok(Some("1")));
        assert_eq!(single(&h, "X-A"), Ok(Some("1")));
        h.append("x-a", "1".parse().unwrap());
        assert_eq!(single(&h, "x-a"), Err(BadHeader::Repeated));
        h.insert("x-b", http::HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(single(&h, "x-b"), Err(BadHeader::NotAscii));
    }
}
