//! Helpers for the unit tests of several modules (compiled only for tests).

use http::HeaderMap;

/// A header map from (name, value) pairs, repeated names appended in order.
pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut m = HeaderMap::new();
    for (k, v) in pairs {
        let name = http::HeaderName::from_bytes(k.as_bytes()).expect("a valid header name");
        m.append(name, v.parse().expect("a valid header value"));
    }
    m
}
