//! The gated route table: route templates (`gate.routes`) compiled once, and the match of a
//! canonical path against them.
//!
//! Matching works on the canonical path only (`path.rs` has already rejected ambiguous
//! spellings): literals compare without case, and any segment in the `{id}` slot makes the request
//! gated, so an id the backend might still parse (`+42`, ` 42`, `042`) cannot slip past as "not a
//! route". The id must then be canonical, as the queue API reads it (`queue::positive_id`: digits,
//! no leading zero): any other spelling is gated without a target and refused, so the gate and the
//! queue never read one id as two sales. The canonical path is what the backend receives. Pure:
//! no I/O.

use std::borrow::Cow;
use std::sync::Arc;

use http::Method;

use super::path::CanonicalPath;
use super::API_PREFIX;
use crate::queue::{positive_id, QueueTarget, TargetType};

/// A gated route after validation: the path split into literal segments and one `{id}` slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateRoute {
    pub method: Method,
    /// Lower-case literal segments; `None` marks the `{id}` slot.
    pub segments: Vec<Option<String>>,
    pub target_type: TargetType,
    /// The template as configured, used as a bounded metric label.
    pub template: String,
}

/// Why a `gate.routes` entry cannot be used: the entry's field at fault and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteError {
    pub field: &'static str,
    pub reason: String,
}

impl GateRoute {
    /// Compiles one configured route: an HTTP method, and a path of plain-word literal segments
    /// with exactly one `{id}`, outside the queue API.
    pub fn compile(
        method: &str,
        path: &str,
        target_type: TargetType,
    ) -> Result<GateRoute, RouteError> {
        let parsed =
            Method::from_bytes(method.to_ascii_uppercase().as_bytes()).map_err(|_| RouteError {
                field: "method",
                reason: format!("`{}` is not an HTTP method", method),
            })?;
        let bad_path = |why: &str| RouteError {
            field: "path",
            reason: format!("`{}` {why}", path),
        };
        let rest = path
            .strip_prefix('/')
            .ok_or_else(|| bad_path("must start with /"))?;
        let mut segments = Vec::new();
        for seg in rest.split('/') {
            if seg == "{id}" {
                segments.push(None);
            } else if !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                segments.push(Some(seg.to_ascii_lowercase()));
            } else {
                return Err(bad_path("has a segment that is not a plain word or {id}"));
            }
        }
        if segments.iter().filter(|s| s.is_none()).count() != 1 {
            return Err(bad_path("must contain exactly one {id}"));
        }
        if segments
            .first()
            .is_some_and(|s| s.as_deref() == Some(API_PREFIX))
        {
            return Err(bad_path("may not be under /virtual-queues"));
        }
        Ok(GateRoute {
            method: parsed,
            segments,
            target_type,
            template: path.to_string(),
        })
    }
}

/// A request whose path has the shape of a gated route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatedPath<'p> {
    /// The route whose shape the path has.
    pub route: &'p GateRoute,
    /// The target, when the id slot holds plain digits naming a positive 64-bit id.
    pub target: Option<QueueTarget>,
    /// The path the backend receives: the template with the canonical id (the canonical path
    /// itself, borrowed, when it is spelled that way already).
    pub canonical: Cow<'p, str>,
}

/// Finds the gated route whose shape `path` has, whatever the method.
pub fn match_route<'p>(
    routes: &'p [Arc<GateRoute>],
    path: &'p CanonicalPath<'_>,
) -> Option<GatedPath<'p>> {
    let len = path.len();
    routes.iter().find_map(|r| {
        if r.segments.len() != len {
            return None;
        }
        let mut id_segment = None;
        // Whether the path is spelled as the backend receives it: literals in the template's case.
        let mut as_sent = true;
        for (want, got) in r.segments.iter().zip(path.segments()) {
            match want {
                Some(lit) if lit == got => {}
                Some(lit) if lit.eq_ignore_ascii_case(got) => as_sent = false,
                Some(_) => return None,
                None => id_segment = Some(got),
            }
        }
        let id_segment = id_segment.unwrap_or_default();
        let id = positive_id(id_segment.as_bytes());
        let canonical = if as_sent {
            Cow::Borrowed(path.as_str())
        } else {
            Cow::Owned(respell(r, id_segment))
        };
        Some(GatedPath {
            route: r,
            target: id.map(|id| QueueTarget::new(r.target_type, id)),
            canonical,
        })
    })
}

/// The template with the path's id segment in its slot.
fn respell(route: &GateRoute, id_segment: &str) -> String {
    let mut canonical = String::with_capacity(64);
    for s in &route.segments {
        canonical.push('/');
        canonical.push_str(s.as_deref().unwrap_or(id_segment));
    }
    canonical
}

/// Whether `path` is a gated route's shape with a suffix glued to one of its literal segments
/// (`orders.json`, `orders.`, `orders%20`, `select;x` is already refused by the canonicaliser):
/// backends with suffix-pattern matching or segment trimming route these to the gated handler.
pub fn lookalike(routes: &[Arc<GateRoute>], path: &CanonicalPath) -> bool {
    let len = path.len();
    routes.iter().any(|r| {
        if r.segments.len() != len {
            return false;
        }
        let mut suffixed = false;
        for (want, got) in r.segments.iter().zip(path.segments()) {
            let Some(lit) = want else { continue };
            if lit.eq_ignore_ascii_case(got) {
                continue;
            }
            // Encoded blanks around a segment are trimmed by some frameworks.
            let core = trim_blanks(got);
            let glued = core.eq_ignore_ascii_case(lit)
                || (core.len() > lit.len()
                    && core.is_char_boundary(lit.len())
                    && core[..lit.len()].eq_ignore_ascii_case(lit)
                    && core[lit.len()..]
                        .bytes()
                        .next()
                        .is_some_and(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b'-')));
            if !glued {
                return false;
            }
            suffixed = true;
        }
        suffixed
    })
}

/// A segment without encoded spaces at either end (an encoded tab or other control character is
/// refused by the canonicaliser already).
fn trim_blanks(s: &str) -> &str {
    let mut s = s;
    loop {
        let before = s.len();
        s = s.strip_prefix("%20").unwrap_or(s);
        s = s.strip_suffix("%20").unwrap_or(s);
        if s.len() == before {
            return s;
        }
    }
}

impl GateRoute {
    /// Whether `method` is the one the route gates.
    pub fn gates(&self, method: &Method) -> bool {
        self.method == *method
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, GateSection};
    use crate::routing::path::canonicalize;

    fn routes() -> Vec<Arc<GateRoute>> {
        GateSection::default()
            .routes
            .iter()
            .map(|r| Arc::new(GateRoute::compile(&r.method, &r.path, r.target_type).unwrap()))
            .collect()
    }

    fn compile(method: &str, path: &str) -> Result<GateRoute, RouteError> {
        GateRoute::compile(method, path, TargetType::TicketingEvent)
    }

    #[test]
    fn templates_compile_or_name_the_field() {
        let r = compile("put", "/Shop/{id}/Buy").unwrap();
        assert_eq!(r.method, Method::PUT);
        assert_eq!(
            r.segments,
            vec![Some("shop".to_string()), None, Some("buy".to_string())]
        );
        for (m, p, field) in [
            ("POST", "/a/b", "path"),
            ("POST", "a/{id}", "path"),
            ("POST", "/a/{id}/{id}", "path"),
            ("POST", "/a/{id}.json", "path"),
            ("POST", "/virtual-queues/{id}", "path"),
            ("PO ST", "/a/{id}", "method"),
        ] {
            assert_eq!(compile(m, p).unwrap_err().field, field, "{m} {p}");
        }
        assert_eq!(Config::from_toml("").unwrap().gate.routes, routes());
    }

    /// The route's template, the target and the path the backend receives, if `p` is gated.
    fn m(p: &str) -> Option<(String, Option<QueueTarget>, String)> {
        let routes = routes();
        let c = canonicalize(p.as_bytes()).unwrap();
        let g = match_route(&routes, &c)?;
        let respelled = matches!(g.canonical, Cow::Owned(_));
        assert_eq!(respelled, c.as_str() != g.canonical, "{p}");
        Some((g.route.template.clone(), g.target, g.canonical.into_owned()))
    }

    #[test]
    fn default_routes_match_their_spellings() {
        let drop42 = Some(QueueTarget::new(TargetType::LimitedDrop, 42));
        for p in [
            "/limited-drops/42/orders",
            "/limited-drops/42/orders/",
            "//limited-drops//42//orders",
            "/LIMITED-DROPS/42/Orders",
            "/limited-drops/%34%32/orders",
            "/limited%2Ddrops/42/%6frders",
        ] {
            let (_, target, canonical) = m(p).unwrap_or_else(|| panic!("{p} not gated"));
            assert_eq!(target, drop42, "{p}");
            assert_eq!(canonical, "/limited-drops/42/orders", "{p}");
        }
        let (template, target, _) = m("/events/7/seats/select").unwrap();
        assert_eq!(template, "/events/{id}/seats/select");
        assert_eq!(
            target,
            Some(QueueTarget::new(TargetType::TicketingEvent, 7))
        );
        let (_, _, canonical) = m("/limited-drops/abc/orders").unwrap();
        assert_eq!(canonical, "/limited-drops/abc/orders");
        let (_, _, canonical) = m("/Limited-Drops/0abc/orders").unwrap();
        assert_eq!(canonical, "/limited-drops/0abc/orders");
    }

    #[test]
    fn odd_ids_are_gated_without_a_target() {
        for p in [
            "/limited-drops/+42/orders",
            "/limited-drops/abc/orders",
            "/limited-drops/0/orders",
            "/limited-drops/4%202/orders",
            "/limited-drops/042/orders",
            "/limited-drops/00042/orders",
        ] {
            let (_, target, _) = m(p).unwrap_or_else(|| panic!("{p} not gated"));
            assert_eq!(target, None, "{p}");
        }
    }

    #[test]
    fn other_paths_are_not_gated() {
        for p in [
            "/events/7/seats/purchase",
            "/limited-drops/42",
            "/limited-drops/42/orders/extra",
            "/limited-drops/42/orders%20",
            "/x/limited-drops/42/orders",
        ] {
            assert_eq!(m(p), None, "{p}");
        }
    }

    #[test]
    fn lookalikes_of_gated_routes() {
        let l = |p: &str| lookalike(&routes(), &canonicalize(p.as_bytes()).unwrap());
        for p in [
            "/limited-drops/42/orders.json",
            "/limited-drops/42/orders.",
            "/limited-drops/42/orders%2e",
            "/limited-drops/42/orders%20",
            "/limited-drops/42/ORDERS.xml",
            "/limited-drops.json/42/orders",
            "/events/7/seats/select.json",
            "/events/7/seats~/select",
            "/limited-drops/42/%20orders",
            "/limited-drops/42/%20orders%20",
        ] {
            assert!(l(p), "{p}");
        }
        for p in [
            "/limited-drops/42/orders",
            "/limited-drops/42/orders-history",
            "/limited-drops/42/ordersx",
            "/limited-drops/42/orders/x",
            "/events/7/seats/selection",
        ] {
            assert!(!l(p), "{p}");
        }
    }
}
