//! Where the namespace's keys are — one address, the primary that Sentinel names, or the Redis
//! Cluster node serving the namespace's hash slot — and following it when a failover or a slot
//! migration moves it.
//!
//! Our own small follower rather than the redis crate's `sentinel` and `cluster-async`: those
//! hand out a connection to the node of the moment (the Sentinel client does not follow a
//! failover), and the cluster client brings its own retries and timeouts, where every call here
//! has a budget and a failure has a meaning (`health`). The namespace is one hash slot, so one
//! connection to one node is all that is ever needed.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ConnectionAddr, ConnectionInfo, ErrorKind, ServerErrorKind};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// How long one question to a sentinel or a cluster node may take while finding the node.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);
/// At most one search for the node this often: failing calls keep asking while a failover runs.
const SEARCH_PAUSE: Duration = Duration::from_millis(100);
/// Searches finding nothing for this long are logged: longer than a failover takes.
const UNFOUND_WARN: Duration = Duration::from_secs(10);

/// How the node holding the namespace is found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Topology {
    /// The URL's one address (a primary, or a name that follows failovers by itself).
    Fixed,
    /// The primary that these sentinels (`host:port`) name `master`.
    Sentinel {
        sentinels: Vec<(String, u16)>,
        master: String,
    },
    /// The primary of the namespace's hash slot, as these nodes (or the last one used) see it.
    Cluster { seeds: Vec<(String, u16)> },
}

/// A Redis URL as the gateway reads it: the topology, and the URL of one data node whose user,
/// password, database and TLS every node is dialled with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Parsed {
    pub(crate) topology: Topology,
    pub(crate) node_url: String,
}

/// Reads `redis://` and `rediss://` as they are, `redis+sentinel://[[user]:password@]host:port[,
/// host:port…]/master[/db]` and `redis+cluster://[[user]:password@]host:port[,host:port…]` (with
/// `rediss+…` for TLS). Errors never repeat the URL: it may hold a password.
pub(crate) fn parse(url: &str) -> Result<Parsed, &'static str> {
    let (scheme, rest) = url.split_once("://").ok_or("no scheme (redis://…)")?;
    let (base, kind) = match scheme {
        "redis" | "rediss" | "valkey" | "valkeys" | "unix" | "redis+unix" | "valkey+unix" => {
            return Ok(Parsed {
                topology: Topology::Fixed,
                node_url: url.to_owned(),
            });
        }
        "redis+sentinel" | "valkey+sentinel" => ("redis", "sentinel"),
        "rediss+sentinel" | "valkeys+sentinel" => ("rediss", "sentinel"),
        "redis+cluster" | "valkey+cluster" => ("redis", "cluster"),
        "rediss+cluster" | "valkeys+cluster" => ("rediss", "cluster"),
        _ => return Err("an unknown scheme (redis, rediss, redis+sentinel, redis+cluster)"),
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let mut nodes = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = h.rsplit_once(':').ok_or("each host needs its port (host:port)")?;
        let port: u16 = port.parse().map_err(|_| "a port that is not a number")?;
        if host.is_empty() {
            return Err("an empty host");
        }
        nodes.push((host.trim_matches(['[', ']']).to_owned(), port));
    }
    let mut path = path.split('/').filter(|p| !p.is_empty());
    let (topology, db) = if kind == "sentinel" {
        let master = path
            .next()
            .ok_or("no master name (redis+sentinel://hosts/master)")?;
        let topology = Topology::Sentinel {
            sentinels: nodes.clone(),
            master: master.to_owned(),
        };
        (topology, path.next())
    } else {
        let db = path.next();
        if db.is_some_and(|d| d != "0") {
            return Err("Redis Cluster has database 0 only");
        }
        (Topology::Cluster { seeds: nodes.clone() }, None)
    };
    if path.next().is_some() {
        return Err("a path with more parts than master and database");
    }
    // A data node's URL with the credentials and database: the redis crate reads (and
    // percent-decodes) them; the address is replaced by the node found.
    let (host, port) = &nodes[0];
    let node_url = format!(
        "{base}://{}{host}:{port}/{}",
        userinfo.map_or(String::new(), |u| format!("{u}@")),
        db.unwrap_or("0")
    );
    Ok(Parsed { topology, node_url })
}

/// The node in use: its address for the logs, a client for subscriptions and its connection.
pub(super) struct Node {
    pub(super) name: String,
    pub(super) client: Client,
    pub(super) conn: ConnectionManager,
}

/// Finds the node holding the namespace and keeps a connection to it, replaced when it moves.
pub(super) struct Nodes {
    topology: Topology,
    /// The data nodes' settings (user, password, database, TLS) at the URL's first address.
    template: ConnectionInfo,
    tls: Option<redis::TlsCertificates>,
    /// The sentinels' clients: the data nodes' TLS, and the sentinels' own password if any.
    sentinels: Vec<Client>,
    manager: OnceLock<ConnectionManagerConfig>,
    current: watch::Sender<Option<Arc<Node>>>,
    /// Woken when the node may have moved: a call failed, or Sentinel announced a new primary.
    search: Notify,
    /// A key of the namespace, whose slot the Cluster nodes are asked for.
    key: String,
    slot: OnceLock<u16>,
}

impl Nodes {
    /// `sentinel_password`: the sentinels' own (`requirepass` in sentinel.conf), if they ask.
    pub(super) fn new(
        topology: Topology,
        template: ConnectionInfo,
        tls: Option<redis::TlsCertificates>,
        sentinel_password: Option<String>,
        key: String,
    ) -> Result<Nodes, redis::RedisError> {
        let settings = match sentinel_password {
            Some(p) => redis::RedisConnectionInfo::default().set_password(p),
            None => redis::RedisConnectionInfo::default(),
        };
        let sentinels = match &topology {
            Topology::Sentinel { sentinels, .. } => sentinels
                .iter()
                .map(|(host, port)| {
                    let info = template.clone().set_redis_settings(settings.clone());
                    dial(&info, tls.as_ref(), host, *port)
                })
                .collect::<Result<_, _>>()?,
            _ => Vec::new(),
        };
        let nodes = Nodes {
            topology,
            template,
            tls,
            sentinels,
            manager: OnceLock::new(),
            current: watch::Sender::new(None),
            search: Notify::new(),
            key,
            slot: OnceLock::new(),
        };
        // Checked now, so that a bad TLS setting is a config error rather than a silent outage.
        let (host, port) = nodes.first_address();
        nodes.client(&host, port)?;
        Ok(nodes)
    }

    /// Starts with the URL's address (a fixed one), or asks where the namespace is.
    pub(super) fn start(&self, manager: ConnectionManagerConfig) {
        let _ = self.manager.set(manager);
        if self.topology == Topology::Fixed {
            let (host, port) = self.first_address();
            self.switch(&host, port, "start");
        } else {
            self.search.notify_one();
        }
    }

    fn first_address(&self) -> (String, u16) {
        match self.template.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                (host.clone(), *port)
            }
            ConnectionAddr::Unix(path) => (path.display().to_string(), 0),
            other => (other.to_string(), 0),
        }
    }

    /// The node in use (`None` until one is found).
    pub(super) fn current(&self) -> Option<Arc<Node>> {
        self.current.borrow().clone()
    }

    /// Changes each time another node is used, for the subscriber.
    pub(super) fn watch(&self) -> watch::Receiver<Option<Arc<Node>>> {
        self.current.subscribe()
    }

    /// The topology can move (Sentinel, Cluster).
    pub(super) fn follows(&self) -> bool {
        self.topology != Topology::Fixed
    }

    pub(super) fn is_sentinel(&self) -> bool {
        matches!(self.topology, Topology::Sentinel { .. })
    }

    /// A failure that may mean the node moved: look for it again (soon, once for many calls).
    pub(super) fn suspect(&self, e: &redis::RedisError) {
        if self.follows() && moved_away(e) {
            self.search.notify_one();
        }
    }

    /// Sentinel announced a failover.
    pub(super) fn announce(&self) {
        self.search.notify_one();
    }

    /// A client for a data node at `host:port`, with the URL's credentials and TLS.
    fn client(&self, host: &str, port: u16) -> Result<Client, redis::RedisError> {
        dial(&self.template, self.tls.as_ref(), host, port)
    }

    /// Uses the node at `host:port` from now on, if it is not the one in use; true if it moved
    /// there from another (not at the first find).
    pub(super) fn switch(&self, host: &str, port: u16, why: &'static str) -> bool {
        let name = format!("{host}:{port}");
        if self.current.borrow().as_ref().is_some_and(|n| n.name == name) {
            return false;
        }
        let made = self.client(host, port).and_then(|client| {
            let config = self.manager.get().cloned().unwrap_or_default();
            let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
            Ok(Node {
                name: name.clone(),
                client,
                conn,
            })
        });
        match made {
            Ok(node) => {
                let previous = self.current.send_replace(Some(Arc::new(node)));
                match previous {
                    Some(p) => {
                        tracing::warn!(from = %p.name, to = %name, why, "shared limits follow the namespace to another Redis node");
                        true
                    }
                    None => {
                        tracing::info!(node = %name, why, "shared limits use this Redis node");
                        false
                    }
                }
            }
            Err(e) => {
                tracing::warn!(node = %name, error = ?e.kind(), "cannot set up a connection to a Redis node");
                false
            }
        }
    }

    /// Runs until dropped: each time a call suspects the node moved, asks where it is now (at
    /// most every [`SEARCH_PAUSE`]); `moved` is told how each move was found, to count it.
    pub(super) async fn follow(&self, moved: impl Fn(&'static str)) {
        // Since when searches have found nothing, and when that was last said.
        let mut unfound: Option<tokio::time::Instant> = None;
        let mut warned: Option<tokio::time::Instant> = None;
        loop {
            self.search.notified().await;
            let (found, why) = match &self.topology {
                Topology::Fixed => (None, ""),
                Topology::Sentinel { master, .. } => (self.ask_sentinels(master).await, "sentinel"),
                Topology::Cluster { seeds } => (self.ask_cluster(seeds).await, "cluster"),
            };
            match found {
                Some((host, port)) => {
                    unfound = None;
                    if self.switch(&host, port, why) {
                        moved(why);
                    }
                }
                None => {
                    let now = tokio::time::Instant::now();
                    let since = *unfound.get_or_insert(now);
                    // A failover takes seconds; longer, and the setting may be wrong: said once
                    // a minute.
                    if now.duration_since(since) >= UNFOUND_WARN
                        && warned.is_none_or(|w| now.duration_since(w) >= Duration::from_secs(60))
                    {
                        warned = Some(now);
                        tracing::warn!(
                            found_by = why,
                            for_ = ?now.duration_since(since),
                            "no Redis node found for the namespace: no sentinel named a primary that answers as one, or no cluster node named the slot's (check the URL's addresses and master name, the passwords, TLS)"
                        );
                    }
                }
            }
            tokio::time::sleep(SEARCH_PAUSE).await;
        }
    }

    /// The primary named by the first sentinel that answers, once it says it is a primary
    /// (during a failover a sentinel may still name the old one): the order of Redis's
    /// "Guidelines for Redis clients with support for Redis Sentinel".
    async fn ask_sentinels(&self, master: &str) -> Option<(String, u16)> {
        for sentinel in &self.sentinels {
            let asked = async {
                let mut c = sentinel.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(master)
                    .query_async::<Option<(String, u16)>>(&mut c)
                    .await
                    .ok()?
            };
            let Ok(Some((host, port))) = tokio::time::timeout(ASK_TIMEOUT, asked).await else {
                continue;
            };
            if self.is_primary(&host, port).await {
                return Some((host, port));
            }
        }
        None
    }

    async fn is_primary(&self, host: &str, port: u16) -> bool {
        let asked = async {
            let mut c = self
                .client(host, port)
                .ok()?
                .get_multiplexed_async_connection()
                .await
                .ok()?;
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut c).await.ok()?;
            match role.first() {
                Some(redis::Value::BulkString(r)) => Some(r.as_slice() == b"master"),
                Some(redis::Value::SimpleString(r)) => Some(r == "master"),
                _ => Some(false),
            }
        };
        matches!(tokio::time::timeout(ASK_TIMEOUT, asked).await, Ok(Some(true)))
    }

    /// The primary of the namespace's slot, asked of the node in use and then the seeds.
    async fn ask_cluster(&self, seeds: &[(String, u16)]) -> Option<(String, u16)> {
        let mut asked: Vec<(String, u16)> = Vec::new();
        if let Some(n) = self.current()
            && let Some((h, p)) = split_addr(&n.name)
        {
            asked.push((h.to_owned(), p));
        }
        asked.extend(seeds.iter().cloned());
        for (host, port) in asked {
            let question = async {
                let mut c = self
                    .client(&host, port)
                    .ok()?
                    .get_multiplexed_async_connection()
                    .await
                    .ok()?;
                let slot = match self.slot.get() {
                    Some(s) => *s,
                    None => {
                        let s: u16 = redis::cmd("CLUSTER")
                            .arg("KEYSLOT")
                            .arg(&self.key)
                            .query_async(&mut c)
                            .await
                            .ok()?;
                        *self.slot.get_or_init(|| s)
                    }
                };
                let slots: redis::Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut c)
                    .await
                    .ok()?;
                slot_owner(&slots, slot, &host)
            };
            if let Ok(Some(found)) = tokio::time::timeout(ASK_TIMEOUT, question).await {
                return Some(found);
            }
        }
        None
    }

    /// Runs `call` once on the node an ASK named, as Redis Cluster asks during a slot's
    /// migration: the script loaded first, so that ASKING is followed by the script itself.
    pub(super) async fn asking<T: redis::FromRedisValue>(
        &self,
        addr: &str,
        call: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        let (host, port) = split_addr(addr).ok_or_else(|| {
            redis::RedisError::from((ErrorKind::Client, "an ASK redirection without an address"))
        })?;
        let mut c = self
            .client(host, port)?
            .get_multiplexed_async_connection()
            .await?;
        call.load_async(&mut c).await?;
        redis::cmd("ASKING").exec_async(&mut c).await?;
        call.invoke_async(&mut c).await
    }

    /// Listens for Sentinel's `+switch-master` on one sentinel at a time, and looks for the
    /// primary at each; runs until dropped.
    pub(super) async fn hear_sentinels(&self) {
        use futures::StreamExt;
        for sentinel in self.sentinels.iter().cycle() {
            if let Ok(Ok(mut pubsub)) = tokio::time::timeout(ASK_TIMEOUT, sentinel.get_async_pubsub()).await
                && pubsub.subscribe("+switch-master").await.is_ok()
            {
                let mut messages = pubsub.on_message();
                while messages.next().await.is_some() {
                    self.announce();
                }
            }
            tokio::time::sleep(super::PROBE).await;
        }
    }
}

/// The nodes holding the namespace: the URL (`redis://`, `rediss://`, `redis+sentinel://…` or
/// `redis+cluster://…`, see [`parse`]), the password from the environment, and for TLS
/// the CA and client certificate of `redis.tls`. Errors name the part that is wrong, never the
/// URL or the password.
pub(super) fn from_config(
    url: &str,
    password: Option<String>,
    sentinel_password: Option<String>,
    tls: Option<&crate::config::RedisTls>,
    prefix: &str,
) -> Result<Nodes, crate::config::ConfigError> {
    use redis::IntoConnectionInfo;
    let bad_url = |e: redis::RedisError| {
        crate::config::err("redis.url_env", format!("not a Redis URL ({:?})", e.kind()))
    };
    let parsed =
        parse(url).map_err(|why| crate::config::err("redis.url_env", format!("not a Redis URL: {why}")))?;
    let mut info = parsed.node_url.as_str().into_connection_info().map_err(bad_url)?;
    if let Some(p) = password {
        let settings = info.redis_settings().clone().set_password(p);
        info = info.set_redis_settings(settings);
    }
    let certificates = match tls {
        None => None,
        Some(tls) => {
            if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
                return Err(crate::config::err(
                    "redis.tls",
                    "is for a rediss:// URL; this one is not TLS",
                ));
            }
            let read = |field: &str, path: &std::path::Path| {
                std::fs::read(path)
                    .map_err(|e| crate::config::err(field, format!("cannot read {}: {e}", path.display())))
            };
            let root_cert = match &tls.ca_file {
                Some(p) => Some(read("redis.tls.ca_file", p)?),
                None => None,
            };
            let client_tls = match (&tls.cert_file, &tls.key_file) {
                (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                    client_cert: read("redis.tls.cert_file", cert)?,
                    client_key: read("redis.tls.key_file", key)?,
                }),
                _ => None,
            };
            Some(redis::TlsCertificates {
                client_tls,
                root_cert,
            })
        }
    };
    let has_tls = certificates.is_some();
    Nodes::new(
        parsed.topology,
        info,
        certificates,
        sentinel_password,
        prefix.to_owned(),
    )
    .map_err(|e| {
        if has_tls {
            crate::config::err(
                "redis.tls",
                format!("the certificates are not usable ({:?})", e.kind()),
            )
        } else {
            bad_url(e)
        }
    })
}

/// A client for `host:port` with `info`'s settings (user, password, database) and kind of
/// address (TLS or not; a socket path stays as it is), and the certificates of `redis.tls`.
fn dial(
    info: &ConnectionInfo,
    tls: Option<&redis::TlsCertificates>,
    host: &str,
    port: u16,
) -> Result<Client, redis::RedisError> {
    let addr = match info.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: None,
        },
        ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host.to_owned(), port),
        // A socket path (or a kind this version does not know): the URL's own address.
        other => other.clone(),
    };
    let info = info.clone().set_addr(addr);
    match tls {
        Some(t) => Client::build_with_tls(info, t.clone()),
        None => Client::open(info),
    }
}

/// An error that may mean the keys are no longer served by the node in use: it is gone, or no
/// longer a primary, or no longer owns the slot.
fn moved_away(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Io
            | ErrorKind::Server(
                ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::Moved
            )
    ) || e.is_connection_dropped()
        || e.is_connection_refusal()
}

/// `host:port` (the host may be an IPv6 address) into its parts.
pub(super) fn split_addr(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.trim_matches(['[', ']']), port.parse().ok()?))
}

/// The primary serving `slot` in a `CLUSTER SLOTS` answer; an empty address means the node
/// asked (`asked_host`).
fn slot_owner(slots: &redis::Value, slot: u16, asked_host: &str) -> Option<(String, u16)> {
    use redis::Value;
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(ranges) = slots else { return None };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let (Some(start), Some(end)) = (parts.first().and_then(int), parts.get(1).and_then(int)) else {
            continue;
        };
        if !(start..=end).contains(&i64::from(slot)) {
            continue;
        }
        let Some(Value::Array(primary)) = parts.get(2) else {
            return None;
        };
        let host = primary.first().and_then(text)?;
        let port = u16::try_from(primary.get(1).and_then(int)?).ok()?;
        let host = if host.is_empty() || host == "?" {
            asked_host.to_owned()
        } else {
            host
        };
        return Some((host, port));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn urls_name_their_topology_and_keep_credentials_for_the_data_nodes() {
        let p = parse("redis://:pw@h:6379/2").unwrap();
        assert_eq!(p.topology, Topology::Fixed);
        assert_eq!(p.node_url, "redis://:pw@h:6379/2");
        let p = parse("redis+sentinel://u:p%40w@s1:26379,s2:26380,[::1]:26381/mymaster/3").unwrap();
        assert_eq!(
            p.topology,
            Topology::Sentinel {
                sentinels: vec![("s1".into(), 26379), ("s2".into(), 26380), ("::1".into(), 26381)],
                master: "mymaster".into()
            }
        );
        assert_eq!(p.node_url, "redis://u:p%40w@s1:26379/3");
        let p = parse("rediss+cluster://n1:7000,n2:7001").unwrap();
        assert_eq!(
            p.topology,
            Topology::Cluster {
                seeds: vec![("n1".into(), 7000), ("n2".into(), 7001)]
            }
        );
        assert_eq!(p.node_url, "rediss://n1:7000/0");
    }

    #[test]
    fn bad_urls_are_refused_without_repeating_them() {
        for (url, why) in [
            ("redis+sentinel://:secret@s1:26379", "no master name"),
            ("redis+sentinel://:secret@s1/m", "port"),
            ("redis+sentinel://:secret@s1:x/m", "not a number"),
            ("redis+cluster://:secret@n1:7000/1", "database 0"),
            ("redis+sentinel://:secret@s1:1/m/0/x", "more parts"),
            ("memcached://:secret@h:1", "unknown scheme"),
            ("secret", "no scheme"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(!e.contains("secret"));
        }
    }

    #[test]
    fn errors_that_mean_the_node_moved_start_a_search_and_others_do_not() {
        let server = |kind: ServerErrorKind| redis::RedisError::from((ErrorKind::Server(kind), "x"));
        for kind in [
            ServerErrorKind::ReadOnly,
            ServerErrorKind::MasterDown,
            ServerErrorKind::ClusterDown,
            ServerErrorKind::Moved,
        ] {
            assert!(moved_away(&server(kind)), "{kind:?}");
        }
        let refused = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(moved_away(&refused), "a refused connection");
        for kind in [
            ServerErrorKind::ResponseError,
            ServerErrorKind::NoScript,
            ServerErrorKind::TryAgain,
        ] {
            assert!(
                !moved_away(&server(kind)),
                "{kind:?}: the node still serves the keys"
            );
        }
    }

    #[test]
    fn the_slots_primary_is_read_from_cluster_slots() {
        let node = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let answer = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node("", 7001)]),
        ]);
        assert_eq!(slot_owner(&answer, 5460, "seed"), Some(("10.0.0.1".into(), 7000)));
        assert_eq!(
            slot_owner(&answer, 5461, "seed"),
            Some(("seed".into(), 7001)),
            "an empty address is the node asked"
        );
        assert_eq!(slot_owner(&answer, 16000, "seed"), None, "an unserved slot");
    }
}
