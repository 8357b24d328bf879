//! The JWT key watcher.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::app::AppState;

/// How often the identity key file is checked for changes.
const KEY_RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Reloads the JWT verification keys when their file changes (`identity.rs`).
pub struct KeyWatcher {
    pub state: Arc<AppState>,
}

#[async_trait]
impl BackgroundService for KeyWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(KEY_RELOAD_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = ticker.tick() => {
                    self.state.identity.reload_if_changed();
                }
            }
        }
    }
}
