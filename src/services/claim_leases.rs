//! The lease service of the single-use claims in flight through this replica.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::app::AppState;

/// Renews the leases of the claims whose purchases are in flight through this replica (every
/// third of `gate::CLAIM_LEASE`), so a claim lapses only when its replica is gone.
pub struct ClaimLeases {
    pub state: Arc<AppState>,
}

#[async_trait]
impl BackgroundService for ClaimLeases {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(crate::gateway::gate::CLAIM_LEASE / 3);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = ticker.tick() => self.renew().await,
            }
        }
    }
}

impl ClaimLeases {
    async fn renew(&self) {
        let store = &self.state.store;
        for (target, id, owner) in self.state.claims.leases() {
            let now = crate::clock::now();
            // The lease's length is all renewing uses of the terms.
            let terms = crate::gateway::gate::claim_terms(&self.state, 0, 0);
            let renew =
                store
                    .inner()
                    .settle(target, &id, &owner, crate::store::Settle::Renew, terms, now);
            if let Ok(false) = store.background("claim_lease", renew).await {
                // Settled meanwhile, or the lease lapsed (this replica could not renew it in
                // time) and the claim may be another attempt's now.
                tracing::debug!(%target, "a claim's lease was not renewed: settled or lapsed");
            }
        }
    }
}
