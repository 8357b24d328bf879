//! `vq-sim record-backend`: a stand-in for the protected backend in a rehearsal. It answers
//! the two default purchase routes (`POST /limited-drops/{id}/orders`, `POST
//! /events/{id}/seats/select`), records each purchase with its arrival time, sale and user, and
//! refuses a second purchase by the same user for the same sale (409): behind the gate, which
//! strips the entry token, that is what a reused token or a skipped line looks like. `GET
//! /_record` returns what it saw; every other request is answered 200 and counted.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

/// One purchase that reached the backend.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Purchase {
    pub at_ms: u64,
    /// `limited-drop:42` or `ticketing-event:7`.
    pub sale: String,
    pub user: u64,
}

/// What `GET /_record` answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub purchases: Vec<Purchase>,
    /// Second purchases by a user who had bought already (answered 409).
    pub duplicates: Vec<Purchase>,
    /// Purchases without a usable `X-User-Id` (answered 400).
    pub unidentified: u64,
    /// Requests to any other route (answered 200).
    pub other: u64,
}

#[derive(Default)]
struct State {
    record: Record,
    bought: HashSet<(String, u64)>,
}

/// The sale a purchase route names, or `None` for any other request.
fn purchase_sale(method: &Method, path: &str) -> Option<String> {
    if method != Method::POST {
        return None;
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (kind, id) = match parts.as_slice() {
        ["limited-drops", id, "orders"] => ("limited-drop", *id),
        ["events", id, "seats", "select"] => ("ticketing-event", *id),
        _ => return None,
    };
    // A positive decimal id without leading zeros, as the gateway's routes take it.
    let valid = !id.is_empty()
        && id.len() <= 20
        && !id.starts_with('0')
        && id.bytes().all(|b| b.is_ascii_digit());
    valid.then(|| format!("{kind}:{id}"))
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn handle(state: &Mutex<State>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if req.method() == Method::GET && path == "/_record" {
        let body = serde_json::to_string(&state.lock().record).unwrap_or_default();
        return reply(StatusCode::OK, body);
    }
    let Some(sale) = purchase_sale(req.method(), path) else {
        state.lock().record.other += 1;
        return reply(StatusCode::OK, r#"{"ok":true}"#.into());
    };
    let user = req
        .headers()
        .get("x-user-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|u| *u > 0);
    let mut s = state.lock();
    let Some(user) = user else {
        s.record.unidentified += 1;
        return reply(
            StatusCode::BAD_REQUEST,
            r#"{"code":"BAD_REQUEST","detail":"no user id"}"#.into(),
        );
    };
    let purchase = Purchase {
        at_ms: crate::epoch_ms(),
        sale: sale.clone(),
        user,
    };
    if s.bought.insert((sale, user)) {
        s.record.purchases.push(purchase);
        reply(StatusCode::OK, r#"{"ok":true}"#.into())
    } else {
        s.record.duplicates.push(purchase);
        reply(
            StatusCode::CONFLICT,
            r#"{"code":"DUPLICATE_PURCHASE","detail":"this user has bought already"}"#.into(),
        )
    }
}

/// Serves until the process ends. Prints `record-backend listening on ADDR` once bound.
pub async fn serve(listen: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    println!("record-backend listening on {}", listener.local_addr()?);
    let state = Arc::new(Mutex::new(State::default()));
    loop {
        let (conn, _) = match listener.accept().await {
            Ok(c) => c,
            // Out of file descriptors and the like: go on accepting after a pause.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = conn.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let state = state.clone();
                async move {
                    let resp = handle(&state, &req);
                    // Read the body to its end so the connection stays usable.
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(resp)
                }
            });
            let io = hyper_util::rt::TokioIo::new(conn);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purchase_routes_name_their_sale() {
        let post = Method::POST;
        assert_eq!(
            purchase_sale(&post, "/limited-drops/42/orders").as_deref(),
            Some("limited-drop:42")
        );
        assert_eq!(
            purchase_sale(&post, "/events/7/seats/select").as_deref(),
            Some("ticketing-event:7")
        );
        assert_eq!(
            purchase_sale(&Method::GET, "/limited-drops/42/orders"),
            None
        );
        assert_eq!(purchase_sale(&post, "/limited-drops/x/orders"), None);
        assert_eq!(purchase_sale(&post, "/limited-drops//orders"), None);
        assert_eq!(purchase_sale(&post, "/limited-drops/007/orders"), None);
        assert_eq!(purchase_sale(&post, "/limited-drops/42/orders/1"), None);
    }
}
