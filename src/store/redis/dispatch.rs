//! How a script call reaches Redis (the call routing, apart from the store's operations in
//! `mod.rs`): the deployment's dispatch (pipelined connections to one server, to the primary the
//! sentinels name, or to the cluster node of the call's slot), the `NOSCRIPT` reload, and the
//! mapping of failures to `StoreError`s.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::prelude::*;

use super::cluster::{ClusterError, ClusterPipes};
use super::pipe::{PipeError, Pipes};
use super::sentinel::SentinelWatch;
use crate::store::scripts::Script;
use crate::store::StoreError;

/// Where script calls go: pipelined connections per proxy thread (`pipe.rs`), to the one
/// server, to the primary fred follows through Sentinel, or to every cluster primary. fred keeps
/// the rest: start-up, script loading, operator commands, and finding the Sentinel's primary.
pub(super) enum Dispatch {
    Direct(Pipes),
    Primary(Pipes),
    Cluster(Box<ClusterPipes>),
}

/// Write attempts per call in a cluster: the first try and up to two MOVED/ASK redirections.
pub(super) const CLUSTER_ATTEMPTS: u32 = 3;

/// Script calls: where they go and how they get there.
pub(super) struct Caller {
    pub(super) client: Client,
    /// Where script calls go.
    pub(super) dispatch: Dispatch,
    /// Sentinel: asks the sentinels which server is the primary.
    pub(super) watch: Option<Arc<SentinelWatch>>,
    /// The watch's version the pipelined connections point at.
    pub(super) followed: std::sync::atomic::AtomicU64,
    /// Sentinel: the primary the pipelined connections point at, as fred last reported it.
    pub(super) primary: Mutex<Option<fred::types::config::Server>>,
    pub(super) command_timeout: Duration,
}

impl Caller {
    /// Runs `script` on the server that holds its keys (its first key's slot in a cluster).
    pub(super) async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        argv: &[Value],
    ) -> Result<Value, StoreError> {
        match &self.dispatch {
            Dispatch::Direct(pipes) => self.eval_piped(pipes, script, keys, argv).await,
            Dispatch::Primary(pipes) => {
                self.follow_primary(pipes)?;
                self.eval_piped(pipes, script, keys, argv).await
            }
            Dispatch::Cluster(cluster) => self.eval_cluster(cluster, script, keys, argv).await,
        }
    }

    /// `eval` on this thread's pipelined connection, within the command timeout.
    async fn eval_piped(
        &self,
        pipes: &Pipes,
        script: &Script,
        keys: &[String],
        argv: &[Value],
    ) -> Result<Value, StoreError> {
        let argv: Vec<std::borrow::Cow<'_, [u8]>> = argv.iter().map(arg_bytes).collect();
        let nkeys = keys.len().to_string();
        let args = evalsha_args(script, &nkeys, keys, &argv);
        let piped_err = |e: Option<PipeError>| match e {
            None => StoreError::Timeout,
            Some(PipeError::Redis(e) | PipeError::Unavailable(e)) => failure(e),
        };
        match self.call_piped(pipes, &args).await {
            Err(Some(PipeError::Redis(e))) if e.starts_with("NOSCRIPT") => {
                let load: [&[u8]; 3] = [b"SCRIPT", b"LOAD", script.source.as_bytes()];
                self.call_piped(pipes, &load).await.map_err(piped_err)?;
                self.call_piped(pipes, &args).await.map_err(piped_err)
            }
            other => other.map_err(piped_err),
        }
    }

    /// Points the pipelined connections at the primary the sentinels name (`sentinel.rs`: asked
    /// every 100 ms), or, until they answered, at the server fred is connected to.
    fn follow_primary(&self, pipes: &Pipes) -> Result<(), StoreError> {
        if let Some(watch) = &self.watch {
            watch.check_soon();
            let version = watch.version();
            if version != 0 {
                if self.followed.load(std::sync::atomic::Ordering::Acquire) != version {
                    if let Some(addr) = watch.primary() {
                        pipes.retarget(&addr);
                    }
                    self.followed
                        .store(version, std::sync::atomic::Ordering::Release);
                }
                return Ok(());
            }
        }
        // The sentinels were not reached yet: where fred is connected.
        let Some(server) = self.client.active_connections().into_iter().next() else {
            return Err(StoreError::Unavailable(
                "no connection to a primary (asking the sentinels)".into(),
            ));
        };
        let mut known = self.primary.lock();
        if known.as_ref() != Some(&server) {
            pipes.retarget(&format!("{}:{}", server.host, server.port));
            *known = Some(server);
        }
        Ok(())
    }

    /// `eval` on the cluster node serving the call's slot, within the command timeout.
    async fn eval_cluster(
        &self,
        cluster: &ClusterPipes,
        script: &Script,
        keys: &[String],
        argv: &[Value],
    ) -> Result<Value, StoreError> {
        let Some(first) = keys.first() else {
            return Err(StoreError::Protocol(format!(
                "{}: a script call without keys has no slot",
                script.name
            )));
        };
        let argv: Vec<std::borrow::Cow<'_, [u8]>> = argv.iter().map(arg_bytes).collect();
        let nkeys = keys.len().to_string();
        let mut args = evalsha_args(script, &nkeys, keys, &argv);
        let deadline = Instant::now() + self.command_timeout;
        let cluster_err = |e: ClusterError| match e {
            ClusterError::Timeout => StoreError::Timeout,
            ClusterError::Redis(e) | ClusterError::Unavailable(e) => failure(e),
        };
        match cluster.call(first.as_bytes(), &args, deadline).await {
            Err(ClusterError::Redis(e)) if e.starts_with("NOSCRIPT") => {
                // A restarted or flushed node: EVAL runs the script there and caches it.
                args[0] = b"EVAL";
                args[1] = script.source.as_bytes();
                cluster
                    .call(first.as_bytes(), &args, deadline)
                    .await
                    .map_err(cluster_err)
            }
            other => other.map_err(cluster_err),
        }
    }

    /// One pipelined command within the command timeout (`Err(None)`: timed out).
    async fn call_piped(&self, pipes: &Pipes, args: &[&[u8]]) -> Result<Value, Option<PipeError>> {
        match tokio::time::timeout(self.command_timeout, pipes.call(args)).await {
            Err(_) => Err(None),
            Ok(r) => r.map_err(Some),
        }
    }
}

/// `EVALSHA sha numkeys key... arg...` as the bytes sent.
fn evalsha_args<'a>(
    script: &'a Script,
    nkeys: &'a str,
    keys: &'a [String],
    argv: &'a [std::borrow::Cow<'a, [u8]>],
) -> Vec<&'a [u8]> {
    let mut args: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + argv.len());
    args.push(b"EVALSHA");
    args.push(script.sha.as_bytes());
    args.push(nkeys.as_bytes());
    args.extend(keys.iter().map(|k| k.as_bytes()));
    args.extend(argv.iter().map(|a| a.as_ref()));
    args
}

/// A script argument as the bytes sent.
fn arg_bytes(v: &Value) -> std::borrow::Cow<'_, [u8]> {
    match v {
        Value::String(s) => std::borrow::Cow::Borrowed(s.as_bytes()),
        Value::Bytes(b) => std::borrow::Cow::Borrowed(b.as_ref()),
        Value::Integer(i) => std::borrow::Cow::Owned(i.to_string().into_bytes()),
        other => std::borrow::Cow::Owned(
            other
                .as_str()
                .map(|s| s.into_owned())
                .unwrap_or_default()
                .into_bytes(),
        ),
    }
}

/// A fred error as the guard needs to see it: silence, a refusal for memory, or unreachable.
pub(super) fn store_err(e: Error) -> StoreError {
    if *e.kind() == ErrorKind::Timeout {
        StoreError::Timeout
    } else {
        failure(e.details().to_string())
    }
}

/// A failure that was not a timeout, on either path (fred or pipelined): a refusal for memory
/// (`OOM ...`), or the store is unavailable.
pub(super) fn failure(details: String) -> StoreError {
    if details.starts_with("OOM") {
        StoreError::OutOfMemory
    } else {
        StoreError::Unavailable(details)
    }
}
