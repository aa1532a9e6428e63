//! Shared limits on the Redis deployments operators run for availability, all real Debian
//! servers on loopback: a primary, a replica and three sentinels whose primary is killed under
//! load; a three-node Redis Cluster whose slot moves.

use crate::shared::{Gw, Statuses, closed_loop, metrics, one};
use crate::support::{engine, tiny};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// `redis-server` is there; else `None` with the reason printed (scripts/test.sh installs it, and
/// `redis-sentinel`, which is the same program: `redis-server --sentinel` stands in for it).
fn installed() -> bool {
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "redis-server is missing on CI: scripts/test.sh installs it"
    );
    eprintln!("skipped: redis-server is not installed (scripts/test.sh installs it)");
    false
}

async fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One server process on its own port, killed when dropped.
struct Server {
    port: u16,
    child: Child,
    /// Its `requirepass`, for the test's own queries.
    password: Option<String>,
}

impl Server {
    /// A data node (`extra`: its replication or cluster settings) in `dir`.
    async fn redis(dir: &std::path::Path, extra: &[&str]) -> Server {
        let port = free_port().await;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--dir", &dir.display().to_string()])
            // A replica's first sync at once, not 5 s later.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server starts");
        let s = Server {
            port,
            child,
            password: None,
        };
        s.answers().await;
        s
    }

    /// A sentinel watching `primary` as `m` (quorum 2), quick to judge it down (1 s); with a
    /// `password`, asking it of clients and of the other sentinels.
    async fn sentinel(dir: &std::path::Path, primary: u16, password: Option<&str>) -> Server {
        let port = free_port().await;
        let conf = dir.join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor m 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds m 1000\n\
                 sentinel failover-timeout m 4000\nsentinel parallel-syncs m 1\n{}",
                dir.display(),
                password.map_or(String::new(), |p| format!(
                    "requirepass {p}\nsentinel sentinel-pass {p}\n"
                ))
            ),
        )
        .unwrap();
        let has_sentinel = std::process::Command::new("redis-sentinel")
            .arg("--version")
            .output()
            .is_ok();
        let mut cmd = Command::new(if has_sentinel {
            "redis-sentinel"
        } else {
            "redis-server"
        });
        cmd.arg(&conf);
        if !has_sentinel {
            cmd.arg("--sentinel");
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-sentinel starts");
        let s = Server {
            port,
            child,
            password: password.map(str::to_owned),
        };
        s.answers().await;
        s
    }

    async fn conn(&self) -> Option<redis::aio::MultiplexedConnection> {
        let auth = self.password.as_ref().map_or(String::new(), |p| format!(":{p}@"));
        redis::Client::open(format!("redis://{auth}127.0.0.1:{}/", self.port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .ok()
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        cmd.query_async(&mut self.conn().await?).await.ok()
    }

    async fn answers(&self) {
        for _ in 0..400 {
            if self.query::<String>(&redis::cmd("PING")).await.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the server on port {} did not answer", self.port);
    }

    async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// Three gateways on `yaml`, the URL and `env` in their environment.
async fn gateways(yaml: &str, url: &str, env: &[(&str, &str)], engine: &engine::RunningEngine) -> Vec<Gw> {
    let mut out = Vec::new();
    for _ in 0..3 {
        let mut vars = vec![("SPILLWAY_REDIS_URL".to_owned(), url.to_owned())];
        vars.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let options = testkit::GatewayOptions {
            replicas: vec![engine.url()],
            env: vars,
            ..testkit::GatewayOptions::default()
        };
        out.push(testkit::Gateway::start_with(yaml, options).await);
    }
    for g in &out {
        assert!(
            crate::support::eventually(Duration::from_secs(10), || g.gateway.limits_shared()
                == Some(true))
            .await,
            "each gateway finds the primary and shares limits"
        );
    }
    out
}

/// The value of a counter or gauge line of `g`'s metrics (0 if absent).
async fn metric(g: &Gw, line_start: &str) -> u64 {
    metrics(g)
        .await
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// C = 6 over three gateways (a share of 2 each); Q and the wait large enough that the load
/// below (24 closed-loop clients) is never refused, in shared mode or on the shares: every
/// request must be served.
const HA: &str = r#"
listen: 127.0.0.1:0
redis: { gateways: 3, lease_ttl: 3s, namespace: NS }
routes:
  - model: chat
    upstream_model: sim
    replicas: [{E0}]
    timeouts: { connect: 1s, first_token: 30s, stream_idle: 10s, total: 60s }
    classes:
      - name: interactive
        concurrency: 6
        queue: 96
        queue_wait: 20s
"#;

/// The engine's running count, peaked per phase (`phase` set by the test) every 0.5 ms.
fn watch_peaks(
    engine: &engine::RunningEngine,
    phase: &Arc<AtomicUsize>,
) -> (Arc<std::sync::Mutex<[usize; 6]>>, tokio::task::JoinHandle<()>) {
    let peaks = Arc::new(std::sync::Mutex::new([0usize; 6]));
    let (phase, p, e) = (phase.clone(), peaks.clone(), engine.engine.clone());
    let task = tokio::spawn(async move {
        loop {
            let running = e.snapshot().running;
            let i = phase.load(Ordering::Relaxed);
            {
                let mut k = p.lock().unwrap();
                k[i] = k[i].max(running);
            }
            // The sampling interval of the peak, not a wait.
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    });
    (peaks, task)
}

/// Every request was answered in full: none lost to the move.
fn all_served(statuses: &Statuses) -> usize {
    let statuses = statuses.lock().unwrap();
    for (status, body) in statuses.iter() {
        assert_eq!(*status, 200, "a request lost to the move: {status} {body}");
        assert!(body.contains("[DONE]"), "a stream cut short: {body}");
    }
    statuses.len()
}

/// A primary, its replica and three sentinels (asking for `password`, if any), all ready for a
/// failover, and the URL that names them (the directory holds their files).
async fn sentinel_deployment(
    password: Option<&str>,
) -> (tempfile::TempDir, Server, Server, Vec<Server>, String) {
    let dir = tempfile::tempdir().unwrap();
    let primary = Server::redis(dir.path(), &[]).await;
    let replica = Server::redis(
        dir.path(),
        &["--replicaof", "127.0.0.1", &primary.port.to_string()],
    )
    .await;
    let mut sentinels = Vec::new();
    for _ in 0..3 {
        sentinels.push(Server::sentinel(dir.path(), primary.port, password).await);
    }
    // A failover needs the replica in sync, and each sentinel to know the replica and the two
    // other sentinels (they meet through the primary every 2 s).
    let ready = testkit::poll(
        Duration::from_secs(30),
        || async {
            let mut ok = replica
                .query::<redis::InfoDict>(redis::cmd("INFO").arg("replication"))
                .await
                .and_then(|i| i.get::<String>("master_link_status"))
                .is_some_and(|s| s == "up");
            for s in &sentinels {
                let others: Vec<redis::Value> = s
                    .query(redis::cmd("SENTINEL").arg("sentinels").arg("m"))
                    .await
                    .unwrap_or_default();
                let replicas: Vec<redis::Value> = s
                    .query(redis::cmd("SENTINEL").arg("replicas").arg("m"))
                    .await
                    .unwrap_or_default();
                ok &= others.len() == 2 && replicas.len() == 1;
            }
            ok
        },
        |ok| *ok,
    )
    .await;
    assert!(ready, "the sentinels know each other and the replica");
    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let url = format!("redis+sentinel://{}/m", hosts.join(","));
    (dir, primary, replica, sentinels, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_under_load_and_c_holds_within_the_switchs_bound() {
    if !installed() {
        return;
    }
    let (_dir, mut primary, replica, sentinels, url) = sentinel_deployment(None).await;
    let engine = engine(tiny()).await;
    let gws = gateways(&HA.replace("NS", "failover"), &url, &[], &engine).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let statuses: Statuses = Arc::default();
    let load = closed_loop(&gws, &stop, &statuses);
    let phase = Arc::new(AtomicUsize::new(0));
    let (peaks, watcher) = watch_peaks(&engine, &phase);
    assert!(
        crate::support::eventually(Duration::from_secs(10), || statuses.lock().unwrap().len() >= 24).await,
        "the load runs"
    );
    // Phase 1: from the kill until every gateway shares again on the new primary.
    phase.store(1, Ordering::Relaxed);
    let served_before = statuses.lock().unwrap().len();
    primary.kill().await;
    let killed = Instant::now();
    let mut went_local = 0;
    let deadline = killed + Duration::from_secs(30);
    let followed = loop {
        let mut moved = 0;
        for g in &gws {
            moved += metric(g, "spillway_redis_node_changes_total{found_by=\"sentinel\"}").await;
        }
        let shared = gws.iter().all(|g| g.gateway.limits_shared() == Some(true));
        if gws.iter().any(|g| g.gateway.limits_shared() == Some(false)) {
            went_local = went_local.max(
                gws.iter()
                    .filter(|g| g.gateway.limits_shared() == Some(false))
                    .count(),
            );
        }
        if moved == 3 && shared {
            break killed.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "the gateways follow the failover within 30 s (moved: {moved} of 3)"
        );
        // The interval of the check, not a wait for an event.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Phase 2: the first 300 ms shared again; phase 3: a second shared on the new primary.
    phase.store(2, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    phase.store(3, Ordering::Relaxed);
    let served_switch = statuses.lock().unwrap().len() - served_before;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    watcher.abort();
    let peaks = *peaks.lock().unwrap();
    let total = all_served(&statuses);
    eprintln!(
        "failover followed {followed:?} after the kill ({went_local} of 3 gateways on their \
         shares meanwhile); {total} requests, all served ({served_switch} during the switch); \
         engine running, peaks: before {}, switch {}, first 300 ms after {}, after {}",
        peaks[0], peaks[1], peaks[2], peaks[3]
    );
    // The new primary is the old replica, and holds the three gateways and their leases.
    let live: u64 = replica
        .query(redis::cmd("ZCARD").arg("spillway:{failover}:gateways"))
        .await
        .unwrap();
    assert_eq!(live, 3, "every gateway renews on the new primary");
    let role: Vec<redis::Value> = replica.query(&redis::cmd("ROLE")).await.unwrap();
    assert_eq!(role[0], redis::Value::BulkString(b"master".to_vec()));
    // C = 6 while shared; at the switch the documented bound C + (gateways − 1) × share: a
    // gateway over its share when Redis went admits nobody until it is under it, while the
    // others fill theirs (docs/scaling.md).
    assert!(peaks[0] <= 6, "before: {} at once, C is 6", peaks[0]);
    assert!(peaks[1] <= 6 + 2 * 2, "at the switch: {} at once", peaks[1]);
    assert!(peaks[2] <= 6 + 2, "sharing again: {} at once", peaks[2]);
    assert!(peaks[3] <= 6, "after: {} at once, C is 6", peaks[3]);
    // The places of requests that gave up waiting while Redis was away are freed on the new
    // primary (their releases are sent again): the whole C serves again.
    assert!(peaks[3] >= 5, "after: only {} at once; places leaked", peaks[3]);
    assert_eq!(one(gws[0].url.clone(), 4).await.0, 200);
    drop(sentinels);
}

/// `CLUSTER NODES` says that `s` itself serves `slot`.
async fn serves(s: &Server, slot: u16) -> bool {
    let nodes: String = s.query(redis::cmd("CLUSTER").arg("NODES")).await.unwrap();
    let Some(me) = nodes.lines().find(|l| l.contains("myself")) else {
        return false;
    };
    me.split_whitespace().skip(8).any(|range| {
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
    })
}

/// A node's id in its cluster.
async fn node_id(s: &Server) -> String {
    s.query(redis::cmd("CLUSTER").arg("MYID")).await.unwrap()
}

/// Moves `slot` from `from` to `to` as `redis-cli --cluster reshard` does (MIGRATING /
/// IMPORTING, MIGRATE, then SETSLOT NODE everywhere), one key at a time and 20 ms apart, so
/// that the gateways, writing to it meanwhile, find its keys split between the two nodes.
async fn migrate(slot: u16, from: &Server, to: &Server, all: &[Server]) {
    let (from_id, to_id) = (node_id(from).await, node_id(to).await);
    let setslot = |state: &str, id: &str| {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(id)
            .clone()
    };
    let _: () = to.query(&setslot("IMPORTING", &from_id)).await.unwrap();
    let _: () = from.query(&setslot("MIGRATING", &to_id)).await.unwrap();
    let mut moved = 0;
    loop {
        let keys: Vec<String> = from
            .query(redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(1))
            .await
            .unwrap();
        if keys.is_empty() {
            break;
        }
        moved += keys.len();
        let r: Option<String> = from
            .query(
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to.port)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("REPLACE")
                    .arg("KEYS")
                    .arg(&keys),
            )
            .await;
        assert!(r.is_some(), "MIGRATE of {keys:?}");
        // The pace of the migration, not a wait for an event.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for s in std::iter::once(to).chain(std::iter::once(from)).chain(all) {
        let _: () = s.query(&setslot("NODE", &to_id)).await.unwrap();
    }
    eprintln!("migrated {moved} keys of slot {slot}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_is_followed_through_a_slot_migration_and_a_failover_under_load() {
    if !installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let conf = format!("nodes-{i}.conf");
        nodes.push(
            Server::redis(
                dir.path(),
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "1000",
                ],
            )
            .await,
        );
    }
    let addrs: Vec<String> = nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .await
        .expect("redis-cli runs");
    assert!(
        out.status.success(),
        "redis-cli --cluster create: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let ok = testkit::poll(
        Duration::from_secs(20),
        || async {
            let mut ok = true;
            for n in &nodes {
                let info: String = n
                    .query(redis::cmd("CLUSTER").arg("INFO"))
                    .await
                    .unwrap_or_default();
                ok &= info.contains("cluster_state:ok");
            }
            ok
        },
        |ok| *ok,
    )
    .await;
    assert!(ok, "the cluster forms");
    let slot: u16 = nodes[0]
        .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg("spillway:{cluster}"))
        .await
        .unwrap();
    let mut owner = None;
    for (i, n) in nodes.iter().enumerate() {
        if serves(n, slot).await {
            owner = Some(i);
        }
    }
    let owner = owner.expect("a node serves the namespace's slot");
    // The slot will move to `target`, which a fourth node replicates, to take over when it dies.
    let target = (owner + 1) % 3;
    let replica = Server::redis(
        dir.path(),
        &[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes-3.conf",
            "--cluster-node-timeout",
            "1000",
        ],
    )
    .await;
    let target_id = node_id(&nodes[target]).await;
    let _: () = replica
        .query(
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(nodes[target].port),
        )
        .await
        .unwrap();
    // Refused until the node is known through the cluster's gossip; asked once it is accepted
    // (asking again would restart the sync).
    let accepted = testkit::poll(
        Duration::from_secs(20),
        || async {
            replica
                .query::<()>(redis::cmd("CLUSTER").arg("REPLICATE").arg(&target_id))
                .await
                .is_some()
        },
        |ok| *ok,
    )
    .await;
    assert!(accepted, "CLUSTER REPLICATE is accepted");
    let replicating = testkit::poll(
        Duration::from_secs(20),
        || async {
            replica
                .query::<redis::InfoDict>(redis::cmd("INFO").arg("replication"))
                .await
                .and_then(|i| i.get::<String>("master_link_status"))
                .is_some_and(|s| s == "up")
        },
        |ok| *ok,
    )
    .await;
    assert!(replicating, "the fourth node replicates the slot's next owner");
    // The gateways are given the two other nodes only: the first call is redirected (MOVED).
    let seeds: Vec<&String> = addrs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != owner)
        .map(|(_, a)| a)
        .collect();
    let url = format!("redis+cluster://{},{}", seeds[0], seeds[1]);
    let engine = engine(tiny()).await;
    let gws = gateways(&HA.replace("NS", "cluster"), &url, &[], &engine).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let statuses: Statuses = Arc::default();
    let load = closed_loop(&gws, &stop, &statuses);
    let phase = Arc::new(AtomicUsize::new(0));
    let (peaks, watcher) = watch_peaks(&engine, &phase);
    assert!(
        crate::support::eventually(Duration::from_secs(10), || statuses.lock().unwrap().len() >= 24).await,
        "the load runs"
    );
    let keys: i64 = nodes[owner]
        .query(redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot))
        .await
        .unwrap();
    assert!(keys > 0, "the namespace's keys are on the slot's owner");
    // Phase 1: the slot moves to the next node under load.
    phase.store(1, Ordering::Relaxed);
    let started = Instant::now();
    migrate(slot, &nodes[owner], &nodes[target], &nodes).await;
    let took = started.elapsed();
    // Phase 2: a second and a half on the new owner.
    phase.store(2, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (followed, failed, redirected) = cluster_counts(&gws).await;
    let migrated_peaks = *peaks.lock().unwrap();
    eprintln!(
        "slot {slot} moved from node {owner} to {target} in {took:?}; {failed} failed calls; \
         gateways followed {followed} times; redirections (moved, ask, tryagain) {redirected:?}; \
         engine running, peaks: before {}, migrating {}, after {}",
        migrated_peaks[0], migrated_peaks[1], migrated_peaks[2]
    );
    for g in &gws {
        assert_eq!(
            g.gateway.limits_shared(),
            Some(true),
            "no gateway left shared mode"
        );
    }
    assert!(followed >= 3, "each gateway followed the slot to its new owner");
    assert_eq!(failed, 0, "no call failed: each redirection was followed");
    assert!(redirected[0] >= 3, "MOVED answers followed: {redirected:?}");
    assert!(
        redirected[1] + redirected[2] > 0,
        "the slot's keys were met split between two nodes (ASK, TRYAGAIN): {redirected:?}"
    );
    let live: u64 = nodes[target]
        .query(redis::cmd("ZCARD").arg("spillway:{cluster}:gateways"))
        .await
        .unwrap();
    assert_eq!(live, 3, "the gateways renew on the new owner");

    // Phase 3: the new owner dies; its replica takes the slot over (cluster-node-timeout 1 s).
    phase.store(3, Ordering::Relaxed);
    nodes[target].kill().await;
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(30);
    let after_kill = loop {
        let (now_followed, _, _) = cluster_counts(&gws).await;
        let shared = gws.iter().all(|g| g.gateway.limits_shared() == Some(true));
        if now_followed >= followed + 3 && shared {
            break killed.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "the gateways follow the cluster's failover within 30 s"
        );
        // The interval of the check, not a wait for an event.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Phase 4: the first 300 ms shared again; phase 5: a second after.
    phase.store(4, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    phase.store(5, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    watcher.abort();
    let peaks = *peaks.lock().unwrap();
    let total = all_served(&statuses);
    eprintln!(
        "cluster failover followed {after_kill:?} after the kill; {total} requests in all, all \
         served; engine running, peaks: failover {}, first 300 ms after {}, after {}",
        peaks[3], peaks[4], peaks[5]
    );
    assert!(serves(&replica, slot).await, "the replica took the slot over");
    let live: u64 = replica
        .query(redis::cmd("ZCARD").arg("spillway:{cluster}:gateways"))
        .await
        .unwrap();
    assert_eq!(live, 3, "the gateways renew on the promoted replica");
    assert!(peaks[0] <= 6, "before: {} at once, C is 6", peaks[0]);
    // A call that a redirection could not complete in time serves its request on the
    // gateway's share: at most C + gateways × share while the slot moves.
    assert!(peaks[1] <= 6 + 3 * 2, "migrating: {} at once", peaks[1]);
    assert!(peaks[2] <= 6, "after the migration: {} at once, C is 6", peaks[2]);
    assert!(peaks[2] >= 5, "after the migration: only {} at once", peaks[2]);
    // The failover is an outage of down_after and more: the bound of the switch.
    assert!(peaks[3] <= 6 + 2 * 2, "failover: {} at once", peaks[3]);
    assert!(peaks[4] <= 6 + 2, "sharing again: {} at once", peaks[4]);
    assert!(peaks[5] <= 6, "after the failover: {} at once, C is 6", peaks[5]);
    assert!(peaks[5] >= 5, "after the failover: only {} at once", peaks[5]);
}

/// Over the gateways: how often they moved to another node, their failed calls and the
/// redirections (moved, ask, tryagain) they followed.
async fn cluster_counts(gws: &[Gw]) -> (u64, u64, [u64; 3]) {
    let (mut followed, mut failed, mut redirected) = (0, 0, [0; 3]);
    for g in gws {
        followed += metric(g, "spillway_redis_node_changes_total{found_by=\"moved\"}").await
            + metric(g, "spillway_redis_node_changes_total{found_by=\"cluster\"}").await;
        for (i, answer) in ["moved", "ask", "tryagain"].iter().enumerate() {
            redirected[i] += metric(
                g,
                &format!("spillway_redis_redirections_total{{answer=\"{answer}\"}}"),
            )
            .await;
        }
        for op in ["acquire", "release", "renew"] {
            failed += metric(
                g,
                &format!("spillway_redis_calls_total{{op=\"{op}\",outcome=\"error\"}}"),
            )
            .await;
        }
    }
    (followed, failed, redirected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_switchover_with_the_old_primary_alive_is_followed_and_its_late_releases_replayed() {
    if !installed() {
        return;
    }
    // The sentinels ask for a password of their own, read from the environment.
    let (_dir, primary, replica, sentinels, url) = sentinel_deployment(Some("sentinel-s3cret")).await;
    let engine = engine(tiny()).await;
    let yaml = HA.replace(
        "namespace: NS",
        "namespace: switchover, sentinel_password_env: SENTINEL_PASSWORD",
    );
    let gws = gateways(&yaml, &url, &[("SENTINEL_PASSWORD", "sentinel-s3cret")], &engine).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let statuses: Statuses = Arc::default();
    let load = closed_loop(&gws, &stop, &statuses);
    let phase = Arc::new(AtomicUsize::new(0));
    let (peaks, watcher) = watch_peaks(&engine, &phase);
    assert!(
        crate::support::eventually(Duration::from_secs(10), || statuses.lock().unwrap().len() >= 24).await,
        "the load runs"
    );
    // Phase 1: a planned failover; the old primary stays up and becomes a replica.
    phase.store(1, Ordering::Relaxed);
    let _: () = sentinels[0]
        .query(redis::cmd("SENTINEL").arg("FAILOVER").arg("m"))
        .await
        .expect("SENTINEL FAILOVER is accepted");
    let asked = Instant::now();
    let mut went_local = 0;
    let followed = loop {
        let mut moved = 0;
        for g in &gws {
            moved += metric(g, "spillway_redis_node_changes_total{found_by=\"sentinel\"}").await;
        }
        went_local = went_local.max(
            gws.iter()
                .filter(|g| g.gateway.limits_shared() == Some(false))
                .count(),
        );
        if moved == 3 && gws.iter().all(|g| g.gateway.limits_shared() == Some(true)) {
            break asked.elapsed();
        }
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "the gateways follow the switchover within 30 s (moved: {moved} of 3)"
        );
        // The interval of the check, not a wait for an event.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Phase 2: the first 300 ms after; phase 3: a second on the new primary.
    phase.store(2, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    phase.store(3, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    watcher.abort();
    let peaks = *peaks.lock().unwrap();
    let total = all_served(&statuses);
    let (mut failed, mut replayed) = (0, 0);
    for g in &gws {
        for op in ["acquire", "release", "dequeue", "renew"] {
            failed += metric(
                g,
                &format!("spillway_redis_calls_total{{op=\"{op}\",outcome=\"error\"}}"),
            )
            .await;
        }
        replayed += metric(
            g,
            "spillway_redis_calls_total{op=\"release_again\",outcome=\"ok\"}",
        )
        .await;
    }
    eprintln!(
        "switchover followed {followed:?} after SENTINEL FAILOVER ({went_local} of 3 gateways on \
         their shares meanwhile, {failed} failed calls, {replayed} releases sent again to the \
         new primary); {total} requests, all served; engine \
         running, peaks: before {}, switch {}, first 300 ms after {}, after {}",
        peaks[0], peaks[1], peaks[2], peaks[3]
    );
    // The sentinels turn the old primary into a replica when they next look at it.
    let demoted = testkit::poll(
        Duration::from_secs(20),
        || async {
            let role: Vec<redis::Value> = primary.query(&redis::cmd("ROLE")).await.unwrap_or_default();
            role.first() == Some(&redis::Value::BulkString(b"slave".to_vec()))
        },
        |demoted| *demoted,
    )
    .await;
    assert!(demoted, "the old primary, alive, is a replica now");
    let live: u64 = replica
        .query(redis::cmd("ZCARD").arg("spillway:{switchover}:gateways"))
        .await
        .unwrap();
    assert_eq!(live, 3, "every gateway renews on the new primary");
    // Releases the old primary took after the promotion are lost on the new one: the recent
    // ones are sent again there, or their slots would stay taken for a lease ttl.
    assert!(replayed > 0, "the recent releases are sent to the new primary");
    assert!(peaks[0] <= 6, "before: {} at once, C is 6", peaks[0]);
    assert!(peaks[1] <= 6 + 2 * 2, "at the switch: {} at once", peaks[1]);
    assert!(peaks[2] <= 6 + 2, "sharing again: {} at once", peaks[2]);
    assert!(peaks[3] <= 6, "after: {} at once, C is 6", peaks[3]);
    assert!(peaks[3] >= 5, "after: only {} at once; places leaked", peaks[3]);
}
