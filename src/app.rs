//! The shared state of a running gateway: the validated configuration, the guarded store, the
//! token keys, the flag, identity and allowed sales, the fail-open pieces and the metrics. Built once
//! by `server::build` and shared by the proxy, the admin listener and the background services,
//! none of which depends on another.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::claims::Claims;
use crate::config::Config;
use crate::failopen::Pacer;
use crate::flag::Flag;
use crate::metrics::Metrics;
use crate::queue::QueueTarget;
use crate::store::{QueueStore, StoreGuard};
use crate::token::TokenKeys;

/// Everything a request may need, shared by all requests and the background services.
pub struct AppState {
    pub config: Config,
    pub upstream: SocketAddr,
    /// The store behind its guard (deadlines, breaker, in-flight limits, health).
    pub store: Arc<StoreGuard>,
    pub keys: TokenKeys,
    pub flag: Flag,
    pub metrics: Metrics,
    /// The paced fail-open budget (`failopen.rs`).
    pub pacer: Arc<Pacer>,
    /// The single-use claims this replica remembers (`claims/`).
    pub claims: Claims,
    /// The entry tokens this replica answered for admissions through the queue (`issued.rs`).
    pub issued: crate::issued::Issued,
    /// Who the user is (`[identity]`).
    pub identity: crate::identity::Identity,
    /// Which targets may have a queue (`queue.targets`).
    pub allowed: crate::allowed::AllowedSales,
    pub stats_cache: crate::queue::stats_cache::StatsCache,
    /// Each sale's parameters as this replica last read them (`sale.rs`).
    pub sales: crate::sale::SaleBook,
    /// Set on SIGTERM for `server.drain_ms`: every answer closes its connection and `/readyz`
    /// answers 503, so a load balancer stops reusing connections before they are dropped.
    pub draining: std::sync::atomic::AtomicBool,
}

impl AppState {
    /// The claims to start with (a journal's, `fail_open.claims_file`).
    pub fn with_claims(mut self, claims: Claims) -> AppState {
        self.claims = claims;
        self
    }

    pub fn new(
        config: Config,
        upstream: SocketAddr,
        store: Arc<dyn QueueStore>,
        keys: TokenKeys,
        flag: Flag,
        metrics: Metrics,
        identity: crate::identity::Identity,
    ) -> AppState {
        let guard = StoreGuard::new(store, config.guard(), metrics.clone());
        let pacer = Pacer::new(config.pacer());
        let allowed = crate::allowed::AllowedSales::new(
            config.queue.targets,
            config.queue.unregistered_gated,
            config.queue.registered.clone(),
        );
        let sales = crate::sale::SaleBook::new(config.sale_defaults());
        AppState {
            config,
            upstream,
            store: Arc::new(guard),
            keys,
            flag,
            metrics,
            pacer: Arc::new(pacer),
            issued: Default::default(),
            claims: Claims::in_memory(),
            identity,
            allowed,
            stats_cache: Default::default(),
            sales,
            draining: Default::default(),
        }
    }

    pub fn count_token(&self, target: QueueTarget, event: &'static str) {
        self.metrics.count_token(target, event);
    }
}
