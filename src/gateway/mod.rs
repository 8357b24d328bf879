//! The public listener: a Pingora `ProxyHttp` that answers the queue API itself and proxies every
//! other request to the backend unchanged.
//!
//! Phases, one job each:
//! - `early_request_filter`: bound the idle keep-alive of the downstream connection.
//! - `request_filter`: a script of named steps, each a method below it: the header checks
//!   (`hygiene::scan`), the path canonicalised once (`routing::path`), the queue API answered
//!   (`route.rs`, `api.rs`), the route checks (`routing::gated`, `hygiene::check_route`), the
//!   user (`identity`), the entry token on gated routes (`gate.rs`), the path the backend
//!   receives. A step that answers the request itself says why (`Stop`); everything else
//!   continues to the backend.
//! - `upstream_request_filter`: forward the canonical path of a gated route (origin-form), never
//!   the entry token.
//! - `upstream_response_filter`: a 2xx or 3xx answer spends the single-use claim, a 4xx or 5xx
//!   gives it back; a request that reached the backend and got no final answer keeps it.
//! - `upstream_peer`: the backend, resolved once at start, with connect/read/write timeouts.
//! - `fail_to_proxy`: a backend that is down or slow becomes a JSON 502/504, never a hang.
//! - `logging`: one structured line and the request metrics.

pub mod api;
pub mod conn;
pub mod gate;
pub mod hygiene;
pub mod route;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::modules::http::HttpModules;
use pingora::prelude::{HttpPeer, ProxyHttp, Session};
use pingora::proxy::FailToProxy;
use pingora::{Error, ErrorSource, ErrorType, Result};

use crate::error::ApiError;
use crate::identity::IdentityError;
use crate::routing::{gated, path};
use crate::store::{QueueStore, Settle};
use api::Reply;
use conn::ClientStream;
use route::RouteClass;

use crate::app::AppState;

/// Per-request context.
pub struct RequestCtx {
    class: RouteClass,
    started: Instant,
    /// The path the backend receives instead of the client's spelling (gated shapes, absolute form).
    forward_path: Option<String>,
    /// A single-use claim taken for this request, pending until the backend's answer settles it.
    claim: Option<gate::Claim>,
    /// Whether the request header was handed to the backend (a claim given back before then
    /// does not count as an attempt; one never answered after then is spent).
    sent_upstream: bool,
    /// Whether this request may switch protocols (a configured websocket path).
    upgrade: bool,
    /// Which headers the backend never receives the request carries
    /// (`hygiene::NEVER_FORWARDED`).
    never_forwarded: [bool; 2],
    /// The request carries a protected header spelled with underscores (dropped before
    /// forwarding).
    underscored: bool,
    /// With `identity.mode = "jwt"`: the verified user, the only `X-User-Id` the backend sees.
    verified_user: Option<u64>,
}

pub struct Gateway {
    state: Arc<AppState>,
}

impl Gateway {
    pub fn new(state: Arc<AppState>) -> Gateway {
        Gateway { state }
    }

    /// Answers a request a step of `request_filter` stopped (see `Stop`).
    async fn stop(&self, session: &mut Session, ctx: &mut RequestCtx, stop: Stop) -> Result<bool> {
        ctx.class = RouteClass::Rejected;
        let reply = match stop {
            Stop::HeadersTooLarge => {
                self.count_refusal("any", "headers_too_large");
                // The body of such a request is not worth reading: answer and close.
                session.set_keepalive(None);
                Box::pin(write_reply(
                    session,
                    &Reply::error(&ApiError::HeadersTooLarge),
                ))
                .await?;
                return Ok(true);
            }
            Stop::Refused { route, refusal } => {
                self.count_refusal(&route, refusal.reason);
                tracing::info!(route = %route, reason = refusal.reason, "request refused");
                Reply::error(&ApiError::BadRequest(refusal.detail))
            }
            Stop::Answer(reply) => reply,
        };
        answer_locally(session, &reply).await
    }

    /// A bypass attempt, labelled with the gated route it concerned (`any` when none).
    fn count_refusal(&self, route: &str, reason: &str) {
        self.state
            .metrics
            .bypass
            .with_label_values(&[route, reason])
            .inc();
    }

    /// Step 1: the header limits and spellings (`hygiene::scan`). Notes what the forwarding
    /// phases need and, for a request with no body to wait for (`no_body`, or one held back for
    /// `100 Continue`), tells the connection so.
    fn check_headers<'s>(
        &self,
        session: &'s Session,
        ctx: &mut RequestCtx,
        no_body: bool,
    ) -> std::result::Result<hygiene::HeaderFacts<'s>, Stop> {
        let limits = &self.state.config.server;
        let facts = hygiene::scan(
            session.req_header(),
            limits.max_header_bytes,
            limits.max_headers,
        )
        .map_err(|e| match e {
            hygiene::ScanError::TooLarge => Stop::HeadersTooLarge,
            hygiene::ScanError::Refused(refusal) => Stop::Refused {
                route: "any".into(),
                refusal,
            },
        })?;
        ctx.never_forwarded = facts.never_forwarded;
        ctx.underscored = facts.underscored;
        // No body, or one held back for `100 Continue` (it waits on the backend, not on the
        // client: its reads are left to Pingora's own read timeout): a read that waits from now
        // on is no wait on the client.
        if facts.expects_continue || no_body {
            if let Some(s) = ClientStream::of(session) {
                s.body_done();
            }
        }
        Ok(facts)
    }

    /// Step 3: the queue API's answer.
    async fn queue_api(
        &self,
        ctx: &mut RequestCtx,
        req: &pingora::http::RequestHeader,
        canonical: &path::CanonicalPath<'_>,
    ) -> Reply {
        match route::parse_api(canonical, &req.method) {
            Ok(call) => {
                ctx.class = call.op.class();
                api::handle(&self.state, call, &req.headers).await
            }
            Err(e) => {
                ctx.class = RouteClass::QueueError;
                Reply::error(&e)
            }
        }
    }

    /// Step 4: the route checks of a proxied request (`hygiene::check_route`). Returns the gated
    /// route whose shape the path has, if any; an upgrade that passed makes the connection a
    /// tunnel.
    fn check_route<'p>(
        &'p self,
        session: &Session,
        ctx: &mut RequestCtx,
        canonical: &'p path::CanonicalPath<'_>,
        facts: &hygiene::HeaderFacts<'_>,
    ) -> std::result::Result<Option<gated::GatedPath<'p>>, Stop> {
        let gate = &self.state.config.gate;
        let gated = gated::match_route(&gate.routes, canonical);
        let route = hygiene::Route {
            gated: gated.is_some(),
            lookalike: gated.is_none() && gated::lookalike(&gate.routes, canonical),
            path: canonical,
            upgrade_prefixes: &gate.upgrade_prefixes,
        };
        if let Err(refusal) = hygiene::check_route(&route, session.req_header(), facts) {
            let route = gated.map_or("any".into(), |g| g.route.template.clone().into());
            return Err(Stop::Refused { route, refusal });
        }
        if facts.upgrade {
            ctx.upgrade = true;
            // A tunnel from now on: its reads are not a request body the client owes.
            if let Some(s) = ClientStream::of(session) {
                s.body_done();
            }
        }
        Ok(gated)
    }

    /// Step 5: the user. Resolved where the gate needs it or, with JWT identity, for every
    /// request: only a verified id reaches the backend, and a request without a valid token
    /// goes on without any (the backend sees the Authorization header and decides).
    fn identify(
        &self,
        ctx: &mut RequestCtx,
        headers: &http::HeaderMap,
        gated: bool,
    ) -> std::result::Result<u64, IdentityError> {
        let jwt = self.state.identity.is_jwt();
        let identity = if jwt || gated {
            self.state.identity.user(headers)
        } else {
            Err(IdentityError::Missing)
        };
        if jwt {
            ctx.verified_user = identity.as_ref().ok().copied();
        }
        identity
    }

    /// Runs the gate on a request whose path has a gated route's shape. `Some(reply)` refuses it.
    async fn gate(
        &self,
        session: &Session,
        ctx: &mut RequestCtx,
        g: &gated::GatedPath<'_>,
        facts: &hygiene::HeaderFacts<'_>,
        identity: Result<u64, IdentityError>,
    ) -> Option<Reply> {
        let method = &session.req_header().method;
        let now = crate::clock::now();
        let decision = gate::decide(&self.state, g, method, facts, identity, now).await;
        match decision {
            gate::GateDecision::NotGated => None,
            gate::GateDecision::Pass { claim } => {
                ctx.class = RouteClass::Gated;
                ctx.claim = claim;
                None
            }
            gate::GateDecision::Refuse(d) => {
                ctx.class = RouteClass::Gated;
                Some(Reply::error(&d.error))
            }
        }
    }

    /// Settles the request's claim, if it still holds one: spent (`Settle::Spend`), given back
    /// (`GiveBack`), or given back without counting the attempt (`Undo`: it never reached the
    /// backend).
    async fn settle_claim(&self, ctx: &mut RequestCtx, how: Settle) {
        let Some(claim) = ctx.claim.take() else {
            return;
        };
        let now = crate::clock::now();
        let now_s = now.epoch_ms / 1000;
        let claims = &self.state.claims;
        match claim {
            gate::Claim::Stored {
                target,
                id,
                owner,
                until,
            } => {
                let terms = gate::claim_terms(&self.state, until, now_s);
                // Awaited before the answer goes on: a client that sees its purchase succeed
                // finds the token spent everywhere.
                let settled = self
                    .state
                    .store
                    .settle(target, &id, &owner, how, terms, now)
                    .await;
                match how {
                    Settle::Spend => claims.spent(target, &id, until, settled.is_err(), now_s),
                    // A failure is counted by the guard; the pending claim then lapses with its
                    // lease.
                    Settle::GiveBack | Settle::Undo => {
                        claims.release(target, &id, how == Settle::Undo)
                    }
                    Settle::Renew => {}
                }
            }
            gate::Claim::Local { target, id, until } => match how {
                Settle::Spend => claims.spent(target, &id, until, false, now_s),
                Settle::GiveBack | Settle::Undo => claims.release(target, &id, how == Settle::Undo),
                Settle::Renew => {}
            },
        }
    }
}

/// Writes a complete local response: always with Content-Length so the connection stays alive.
pub async fn write_reply(session: &mut Session, reply: &Reply) -> Result<()> {
    let mut header = ResponseHeader::build(reply.status, Some(4))?;
    header.insert_header(http::header::CONTENT_LENGTH, reply.body.len().to_string())?;
    if !reply.body.is_empty() {
        header.insert_header(http::header::CONTENT_TYPE, "application/json")?;
    }
    header.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    if reply.status == 401 {
        header.insert_header(http::header::WWW_AUTHENTICATE, "Bearer")?;
    }
    if let Some(secs) = reply.retry_after {
        header.insert_header(http::header::RETRY_AFTER, secs.to_string())?;
    }
    session
        .write_response_header(Box::new(header), reply.body.is_empty())
        .await?;
    if !reply.body.is_empty() {
        session
            .write_response_body(Some(Bytes::copy_from_slice(&reply.body)), true)
            .await?;
    }
    Ok(())
}

/// A boxed future: what a request hook awaits in place is part of that hook's future, which
/// Pingora boxes (copies) for every request.
type Local<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The largest declared request body a local answer reads and discards to keep the connection.
const DRAIN_MAX_BYTES: u64 = 64 * 1024;
/// How long a local answer waits for that body in all.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Answers locally. A small request body that arrives promptly is read and discarded first, so a
/// locally answered POST leaves the connection reusable; a body declared larger than
/// `DRAIN_MAX_BYTES`, one not complete within `DRAIN_TIMEOUT`, or one the client holds back for
/// a `100 Continue` is not waited for: the answer goes out and the connection closes. (Otherwise
/// a refused request announcing a huge body and trickling it would hold a connection slot for as
/// long as it liked: while a request is in progress no idle bound applies.)
/// Boxed: writing a response through Pingora is a ~1 KB future, which inline would grow
/// `request_filter`'s future (and its copy) for every request, answered locally or not.
fn answer_locally<'a>(session: &'a mut Session, reply: &'a Reply) -> Local<'a, bool> {
    Box::pin(async move {
        if !session.is_body_done() {
            let headers = &session.req_header().headers;
            let expects_continue = headers
                .get(http::header::EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
            // One plain Content-Length or none (chunked): `hygiene::scan` refused anything else.
            let declared = headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            let drained = !expects_continue && declared.is_none_or(|n| n <= DRAIN_MAX_BYTES) && {
                session.set_total_drain_timeout(Some(DRAIN_TIMEOUT));
                session.drain_request_body().await.is_ok()
            };
            if !drained {
                session.set_keepalive(None);
            }
        }
        write_reply(session, reply).await?;
        Ok(true)
    })
}

/// Why a step of `request_filter` answered the request itself.
enum Stop {
    /// Past the header limits: 431, and the connection closes.
    HeadersTooLarge,
    /// Refused by the hygiene checks (400), counted as a bypass attempt on `route` (a gated
    /// route's template, or `any`).
    Refused {
        route: std::borrow::Cow<'static, str>,
        refusal: hygiene::Refusal,
    },
    /// Any other local answer.
    Answer(Reply),
}

/// Step 7: the path the backend receives, when it is not the request target as it came. A
/// gated route gets its canonical path (a target that is exactly that path goes as it came,
/// without a rebuilt URI); a request in absolute form gets its origin-form path.
fn forward_path(
    raw: &[u8],
    canonical: &path::CanonicalPath<'_>,
    gated: Option<gated::GatedPath<'_>>,
) -> Option<String> {
    match gated {
        Some(g) if raw != g.canonical.as_bytes() => Some(g.canonical.into_owned()),
        Some(_) => None,
        None if is_absolute_form(raw) => Some(canonical.to_path()),
        None => None,
    }
}

fn is_absolute_form(raw: &[u8]) -> bool {
    // Origin-form, by far the most common, starts with '/'.
    raw.first().is_some_and(|&b| b != b'/')
        && [&b"http://"[..], b"https://"].iter().any(|scheme| {
            raw.len() >= scheme.len() && raw[..scheme.len()].eq_ignore_ascii_case(scheme)
        })
}

/// The path part of the request target: origin-form as is; absolute-form without scheme and
/// authority; the query string cut off.
fn target_path(raw: &[u8]) -> &[u8] {
    let mut p = raw;
    if is_absolute_form(raw) {
        let authority = raw
            .windows(3)
            .position(|w| w == b"://")
            .map_or(raw, |i| &raw[i + 3..]);
        p = authority
            .iter()
            .position(|&b| b == b'/')
            .map_or(&b"/"[..], |i| &authority[i..]);
    }
    match p.iter().position(|&b| b == b'?' || b == b'#') {
        Some(i) => &p[..i],
        None => p,
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    /// No downstream modules: the gateway never compresses or decompresses a response. (Pingora's
    /// default adds a response compression module, disabled, whose per-request context and
    /// header hooks cost four allocations per request and change nothing.)
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    /// Pingora calls this once the request header has been read, so `started` times the request
    /// itself, not the keep-alive wait before it.
    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            class: RouteClass::Proxy,
            started: Instant::now(),
            forward_path: None,
            claim: None,
            sent_upstream: false,
            upgrade: false,
            never_forwarded: [false; 2],
            underscored: false,
            verified_user: None,
        }
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        // Bound the idle time of a connection Pingora keeps alive; never turn keep-alive back on
        // for one it closes (HTTP/1.0, `Connection: close`, ambiguous framing).
        let bounded = match ClientStream::of(session) {
            Some(s) => {
                s.busy();
                true
            }
            None => false,
        };
        if self
            .state
            .draining
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            // Shutting down: answer, then close, so the load balancer stops reusing this
            // connection before the process drops it.
            session.set_keepalive(None);
        } else if session.get_keepalive().is_some() {
            // The connection's own bound (one timer per connection) when it has one, else
            // Pingora's (one timer per request).
            let idle_s = if bounded {
                0
            } else {
                self.state.config.server.keepalive_idle.as_secs()
            };
            session.set_keepalive(Some(idle_s));
        }
        Ok(())
    }

    /// The end of a proxied request's body: a read that waits from now on is the connection's
    /// watch for a client that goes away, not a wait on the client (`conn::ClientStream`).
    async fn request_body_filter(
        &self,
        session: &mut Session,
        _body: &mut Option<Bytes>,
        end_of_stream: bool,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        if end_of_stream {
            if let Some(s) = ClientStream::of(session) {
                s.body_done();
            }
        }
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        // 1. Header limits (431) and spellings the backend might read differently (400).
        let no_body = session.is_body_done();
        let facts = match self.check_headers(session, ctx, no_body) {
            Ok(facts) => facts,
            Err(stop) => return self.stop(session, ctx, stop).await,
        };
        // 2. The path, canonicalised once: every later step reads this one.
        let req = session.req_header();
        let Ok(canonical) = path::canonicalize(target_path(req.raw_path())) else {
            let stop = Stop::Answer(Reply::error(&ApiError::BadRequest(
                "the request path is malformed or ambiguous",
            )));
            return self.stop(session, ctx, stop).await;
        };
        // 3. The queue API is answered here, never proxied.
        if route::is_api_path(&canonical) {
            let reply = self.queue_api(ctx, req, &canonical).await;
            return answer_locally(session, &reply).await;
        }
        // 4. A proxied request: the checks that depend on its route.
        ctx.class = RouteClass::Proxy;
        let gated = match self.check_route(session, ctx, &canonical, &facts) {
            Ok(gated) => gated,
            Err(stop) => return self.stop(session, ctx, stop).await,
        };
        // 5. The user, resolved once (a JWT is verified once per request).
        let identity = self.identify(ctx, &req.headers, gated.is_some());
        // 6. The gate, on a gated route's shape.
        if let Some(g) = &gated {
            if let Some(reply) = self.gate(session, ctx, g, &facts, identity).await {
                return answer_locally(session, &reply).await;
            }
        }
        // 7. What the backend receives as the path.
        ctx.forward_path = forward_path(req.raw_path(), &canonical, gated);
        Ok(false)
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut pingora::http::RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        for (name, present) in hygiene::NEVER_FORWARDED.iter().zip(ctx.never_forwarded) {
            if present {
                upstream.remove_header(name);
            }
        }
        if ctx.underscored {
            let spelled: Vec<http::HeaderName> = upstream
                .headers
                .keys()
                .filter(|n| hygiene::underscore_spelling(n).is_some())
                .cloned()
                .collect();
            for name in spelled {
                upstream.remove_header(&name);
            }
        }
        if self.state.identity.is_jwt() {
            upstream.remove_header(&api::USER_HEADER);
            if let Some(user) = ctx.verified_user {
                upstream.insert_header(api::USER_HEADER, user.to_string())?;
            }
        }
        ctx.sent_upstream = true;
        if let Some(path) = &ctx.forward_path {
            let target = match session.req_header().uri.query() {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            let uri = http::Uri::try_from(target).map_err(|e| {
                Error::because(ErrorType::InternalError, "canonical path is not a URI", e)
            })?;
            upstream.set_uri(uri);
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let status = upstream.status.as_u16();
        if status == 101 && !ctx.upgrade {
            // The backend switched protocols on a request that did not ask to: what follows on
            // this connection would reach it without passing the gate.
            return Err(Error::explain(
                ErrorType::InvalidHTTPHeader,
                "backend switched protocols without an allowed upgrade",
            ));
        }
        // A 2xx or 3xx answer (or an allowed upgrade) is a purchase: the token is spent. Any 4xx
        // or 5xx gives it back for another try (up to `token.max_attempts`); other 1xx are not
        // answers yet.
        match status {
            101 | 200..=399 => self.settle_claim(ctx, Settle::Spend).await,
            400..=599 => self.settle_claim(ctx, Settle::GiveBack).await,
            _ => {}
        }
        Ok(())
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let upstream = &self.state.config.upstream;
        let mut peer = HttpPeer::new(self.state.upstream, false, String::new());
        peer.options.connection_timeout = Some(upstream.connect_timeout);
        peer.options.total_connection_timeout = Some(upstream.connect_timeout);
        peer.options.read_timeout = Some(upstream.read_timeout);
        peer.options.write_timeout = Some(upstream.write_timeout);
        Ok(Box::new(peer))
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let error = match (e.esource(), e.etype()) {
            (_, ErrorType::HTTPStatus(code)) => {
                let code = *code;
                let _ = session.respond_error(code).await;
                return FailToProxy {
                    error_code: code,
                    can_reuse_downstream: false,
                };
            }
            (
                ErrorSource::Downstream,
                ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed,
            ) => {
                return FailToProxy {
                    error_code: 0,
                    can_reuse_downstream: false,
                };
            }
            (ErrorSource::Downstream, _) => ApiError::BadRequest("the request could not be read"),
            (_, ErrorType::ReadTimedout | ErrorType::WriteTimedout) => ApiError::UpstreamTimeout,
            _ => ApiError::UpstreamUnavailable,
        };
        let reply = Reply::error(&error);
        if let Err(write_err) = write_reply(session, &reply).await {
            tracing::debug!(error = %write_err, "could not write the error response");
        }
        FailToProxy {
            error_code: reply.status,
            can_reuse_downstream: false,
        }
    }

    /// A backend outage would otherwise add Pingora's own error line to every request's access
    /// line; the access line already carries the error type.
    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, error: &Error) -> bool {
        error.esource() == &ErrorSource::Upstream
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        // A claim still pending: the request never reached the backend (unreachable, refused
        // locally: given back, and the attempt does not count), or it did and no answer was
        // read (the client hung up, the backend's connection failed): the backend may have
        // acted on it, so the token is spent.
        let how = if ctx.sent_upstream {
            Settle::Spend
        } else {
            Settle::Undo
        };
        self.settle_claim(ctx, how).await;
        let now = Instant::now();
        if let Some(stream) = ClientStream::of(session) {
            stream.idle_from(now);
        }
        let elapsed = now.saturating_duration_since(ctx.started);
        let class = ctx.class.as_str();
        let metrics = &self.state.metrics;
        metrics.count_request(class, status_label(status), elapsed.as_secs_f64());
        let req = session.req_header();
        tracing::info!(
            target: "access",
            method = %req.method,
            route_class = class,
            status,
            duration_us = elapsed.as_micros() as u64,
            error = e.map(|e| e.etype().as_str()),
            "request"
        );
    }
}

/// Status codes as bounded label values.
fn status_label(status: u16) -> &'static str {
    const EXACT: [(u16, &str); 10] = [
        (200, "200"),
        (204, "204"),
        (400, "400"),
        (403, "403"),
        (404, "404"),
        (405, "405"),
        (429, "429"),
        (502, "502"),
        (503, "503"),
        (504, "504"),
    ];
    if let Some((_, label)) = EXACT.iter().find(|(code, _)| *code == status) {
        return label;
    }
    match status {
        0 => "none",
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_path_strips_authority_and_query() {
        assert_eq!(target_path(b"/a/b?x=1"), b"/a/b");
        assert_eq!(target_path(b"http://h:1/a/b?x"), b"/a/b");
        assert_eq!(target_path(b"HTTP://h/a"), b"/a");
        assert_eq!(target_path(b"https://h"), b"/");
        assert_eq!(target_path(b"/a#f"), b"/a");
    }
}
