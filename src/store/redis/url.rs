//! `store.redis_url`: which kind of Redis deployment it names, checked before anything connects.
//!
//! | kind | URL |
//! |---|---|
//! | single primary | `redis://[[user]:password@]host[:port][/db]` |
//! | Sentinel | `redis-sentinel://[[user]:password@]sentinel[:port][/db]?sentinelServiceName=NAME[&node=host:port]...[&sentinelUsername=U][&sentinelPassword=P]` |
//! | Cluster | `redis-cluster://[[user]:password@]seed[:port][?node=host:port...]` |
//!
//! The user and password are the data nodes' (the primary's, every cluster node's); Sentinel's
//! own credentials are `sentinelUsername` / `sentinelPassword`. Each kind has a TLS form
//! (`rediss://`, `rediss-sentinel://`, `rediss-cluster://`): rustls, the server's certificate
//! checked against the system's roots (or the PEM file in `SSL_CERT_FILE`) and the host name in
//! the URL.

use fred::types::config::{Config, ServerConfig};

/// How the gateway reaches Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployment {
    /// One primary (`redis://`).
    Single,
    /// A primary found through Sentinel, followed across failovers (`redis-sentinel://`).
    Sentinel { service: String },
    /// Redis Cluster: targets sharded over the primaries by their `{TYPE:ID}` hash tag
    /// (`redis-cluster://`).
    Cluster,
}

/// A checked `store.redis_url`.
#[derive(Debug, Clone)]
pub struct RedisUrl {
    pub deployment: Deployment,
    pub config: Config,
}

impl RedisUrl {
    pub fn parse(url: &str) -> Result<RedisUrl, String> {
        let scheme = url.split("://").next().unwrap_or_default();
        if !matches!(
            scheme,
            "redis"
                | "redis-sentinel"
                | "redis-cluster"
                | "rediss"
                | "rediss-sentinel"
                | "rediss-cluster"
        ) {
            return Err(
                "must start with redis://, redis-sentinel:// or redis-cluster:// (rediss… for TLS)"
                    .into(),
            );
        }
        let config = Config::from_url(url).map_err(|e| e.details().to_string())?;
        let deployment = match &config.server {
            ServerConfig::Centralized { .. } => Deployment::Single,
            ServerConfig::Sentinel { service_name, .. } => Deployment::Sentinel {
                service: service_name.clone(),
            },
            ServerConfig::Clustered { .. } => {
                if has_database(url) {
                    return Err("Redis Cluster has database 0 only: drop the /db path".into());
                }
                Deployment::Cluster
            }
        };
        if scheme.starts_with("rediss") && config.tls.is_none() {
            return Err("TLS was asked for but could not be set up".into());
        }
        Ok(RedisUrl { deployment, config })
    }

    /// Whether the connections use TLS (`rediss…`).
    pub fn tls(&self) -> bool {
        self.config.tls.is_some()
    }

    /// The kind and the addresses, no secret: `sentinel (service mymaster) 10.0.0.1:26379, ...`.
    pub fn describe(&self) -> String {
        let mut hosts: Vec<String> = self
            .config
            .server
            .hosts()
            .iter()
            .map(|s| format!("{}:{}", s.host, s.port))
            .collect();
        hosts.sort();
        let kind = match &self.deployment {
            Deployment::Single => "single".to_string(),
            Deployment::Sentinel { service } => format!("sentinel (service {service})"),
            Deployment::Cluster => "cluster (seed nodes; the rest discovered)".to_string(),
        };
        let mut out = format!("{kind} {}", hosts.join(", "));
        if self.tls() {
            out.push_str(" tls");
        }
        if let Some(db) = self.config.database.filter(|db| *db != 0) {
            out.push_str(&format!(" db {db}"));
        }
        match (&self.config.username, &self.config.password) {
            (Some(user), Some(_)) => out.push_str(&format!(" user {user} password ***")),
            (None, Some(_)) => out.push_str(" password ***"),
            _ => {}
        }
        if let ServerConfig::Sentinel {
            username, password, ..
        } = &self.config.server
        {
            match (username, password) {
                (Some(user), Some(_)) => {
                    out.push_str(&format!(" sentinel user {user} sentinel password ***"))
                }
                (None, Some(_)) => out.push_str(" sentinel password ***"),
                _ => {}
            }
        }
        out
    }
}

/// Whether the URL has a non-empty path after the host part (a database number).
fn has_database(url: &str) -> bool {
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let rest = rest.split('?').next().unwrap_or_default();
    rest.split_once('/')
        .is_some_and(|(_, path)| !path.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_parses_and_prints_without_secrets() {
        let single = RedisUrl::parse("redis://app:s3cret@10.0.0.5:6380/2").unwrap();
        assert_eq!(single.deployment, Deployment::Single);
        assert_eq!(
            single.describe(),
            "single 10.0.0.5:6380 db 2 user app password ***"
        );

        let sentinel = RedisUrl::parse(
            "redis-sentinel://:pw@10.0.0.1:26379?sentinelServiceName=mymaster&node=10.0.0.2:26380&sentinelPassword=spw",
        )
        .unwrap();
        assert_eq!(
            sentinel.deployment,
            Deployment::Sentinel {
                service: "mymaster".into()
            }
        );
        let d = sentinel.describe();
        assert_eq!(
            d,
            "sentinel (service mymaster) 10.0.0.1:26379, 10.0.0.2:26380 password *** sentinel password ***"
        );
        assert!(!d.contains("spw") && !d.contains(":pw"));

        let cluster =
            RedisUrl::parse("redis-cluster://10.0.0.1:7000?node=10.0.0.2:7001&node=10.0.0.3:7002")
                .unwrap();
        assert_eq!(cluster.deployment, Deployment::Cluster);
        assert_eq!(
            cluster.describe(),
            "cluster (seed nodes; the rest discovered) 10.0.0.1:7000, 10.0.0.2:7001, 10.0.0.3:7002"
        );
    }

    #[test]
    fn tls_forms_are_accepted_and_shown() {
        for (url, shown) in [
            ("rediss://h:6380", "single h:6380 tls"),
            (
                "rediss-cluster://h:7000?node=i:7001",
                "cluster (seed nodes; the rest discovered) h:7000, i:7001 tls",
            ),
            (
                "rediss-sentinel://h:26379?sentinelServiceName=m",
                "sentinel (service m) h:26379 tls",
            ),
        ] {
            let u = RedisUrl::parse(url).unwrap();
            assert!(u.tls(), "{url}");
            assert_eq!(u.describe(), shown);
        }
        assert!(!RedisUrl::parse("redis://h:6379").unwrap().tls());
    }

    #[test]
    fn bad_urls_are_refused_with_a_reason() {
        for (url, why) in [
            ("http://h:6379", "must start with"),
            ("h:6379", "must start with"),
            ("redis-sentinel://h:26379", "service name"),
            ("redis-cluster://h:7000/3", "database 0 only"),
            ("redis://h:6379/x", "nvalid"),
        ] {
            let err = RedisUrl::parse(url).unwrap_err();
            assert!(err.contains(why), "{url}: {err}");
        }
    }
}
