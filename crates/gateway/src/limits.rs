//! Limits shared by every gateway of a deployment, kept in Redis (`redis:` in the config).
//!
//! Each class's slots (C) and queue places (Q), and each team's `max_parallel`, are sorted sets of
//! leases that expire unless renewed; `rpm` and `tpm` are one-second buckets over the last minute.
//! Admission is one Lua script (quota, then slot or queue place) and the end of a request another
//! (slot back, tokens settled, the slot handed on): two round trips on the path of an admitted
//! request. A gateway renews all the leases it holds in one call every `lease_ttl / 3`, so a
//! stream of ten minutes keeps its slot and a gateway that dies frees its slots within `lease_ttl`.
//!
//! Queued requests wait in their gateway. A freed slot is granted inside the script that frees it
//! to the next waiter in the class's order, and only that waiter's gateway is told, on its own
//! channel ([`handoff`]): a waiter wakes once, with its slot or when its time is up.
//!
//! A call slower than `redis.timeout` is late, not failed; a request waits for Redis at most its
//! queue budget and is then served on this gateway's share. Only when Redis has not answered (or
//! calls failed) for `redis.down_after` does the gateway turn to its share of every limit (limit ÷
//! `gateways`, at least 1) — never unlimited, never an error for the request — and it shares again
//! once Redis has answered for as long ([`health`]); then the leases of requests admitted
//! meanwhile are put back, so the shared count includes them.
//!
//! Every key of a deployment carries the hash tag `{namespace}`: a quota and a class's slots are
//! checked in one atomic script, which Redis Cluster allows only within one slot. So one node
//! holds a namespace — a primary, the primary Sentinel names, or the Cluster node serving the
//! slot — and [`node`] finds it and follows it when it moves; [`call`] runs each script there.
//! [`leases`] keeps the leases held here alive across outages and moves, and sends again the
//! releases Redis did not take; [`metrics`] holds the series.

mod call;
mod handoff;
mod health;
mod leases;
mod metrics;
pub(crate) mod node;

use crate::config::{Priority, RedisConfig};
use crate::error::GatewayError;
use admission::quota::{QuotaExceeded, QuotaKind, QuotaLimits, RateHeaders};
use admission::{Admission, Limits, Permit, Rejection};
use prometheus::Registry;
use redis::aio::ConnectionManagerConfig;
use redis::{Script, ScriptInvocation};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// How often a gateway that fell back to its share looks for Redis again.
const PROBE: Duration = Duration::from_millis(500);
/// How often a gateway that found Redis again checks whether every gateway has.
const REJOIN_POLL: Duration = Duration::from_millis(20);
/// At most this many releases wait for Redis to answer again (see `Unreleased`).
const MAX_UNRELEASED: usize = 10_000;
const LANE_CRITICAL: u8 = 0;
const LANE_STANDARD: u8 = 1;
const LANE_SHEDDABLE: u8 = 2;

/// A Redis call that did not answer in time or failed: the caller enforces its local share.
#[derive(Debug)]
pub(crate) struct Unavailable;

struct Scripts {
    acquire: Script,
    release: Script,
    poll: Script,
    renew: Script,
}

/// The scripts that touch a class's slots and queue start with its handoff (class.lua).
fn class_script(body: &str) -> Script {
    Script::new(&format!("{}\n{body}", include_str!("limits/class.lua")))
}

/// The connection to Redis and what this gateway holds there.
pub(crate) struct SharedLimits {
    /// The node holding the namespace, followed through failovers and slot moves.
    nodes: node::Nodes,
    config: RedisConfig,
    /// `spillway:{namespace}`: the prefix, and hash tag, of every key.
    prefix: String,
    /// The live gateways' set.
    live: String,
    /// `…:to:`: the prefix of each gateway's own channel, where it is told of its waiters' grants.
    to: String,
    /// This process's name in lease members, unique per start.
    gateway: String,
    next: AtomicU64,
    shared: AtomicBool,
    /// Redis answers again but limits are not shared yet: requests admitted on the share are
    /// put in Redis at once, so that the shared count includes them when sharing resumes.
    rejoining: AtomicBool,
    /// The mode, for requests waiting on this gateway's share that should ask Redis once it is
    /// shared again, and for requests waiting in Redis's queue when it is not.
    mode_tx: tokio::sync::watch::Sender<bool>,
    health: health::Health,
    /// When "Redis is slow" was last logged (ms since `health`'s start; 0: never).
    slow_logged: AtomicU64,
    waiters: handoff::Waiters,
    /// Each class seen, by slots key: what a release needs to hand its slot on.
    classes: Mutex<HashMap<String, Arc<Class>>>,
    /// The leases to renew: set key → members.
    held: Mutex<HashMap<String, HashSet<String>>>,
    /// The node of the last renewal (`host:port`).
    renewed_on: Mutex<Option<String>>,
    /// The releases of the last `lease_ttl`, sent again to a node the namespace moved to: the
    /// old primary may have taken them after the new one stopped replicating it (a failover),
    /// and their slots would stay taken there until their leases expire.
    recent: Mutex<std::collections::VecDeque<(Instant, Unreleased)>>,
    /// Releases that failed, sent again once Redis answers.
    unreleased: Mutex<Vec<Unreleased>>,
    scripts: Scripts,
    metrics: metrics::RedisMetrics,
}

impl std::fmt::Debug for SharedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimits")
            .field("prefix", &self.prefix)
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}

/// What one request asks of the shared limits.
pub(crate) struct Ask<'a> {
    /// The status of an overload refusal (the route's `overflow_status`).
    pub(crate) status: axum::http::StatusCode,
    pub(crate) route: &'a str,
    pub(crate) class: &'a str,
    pub(crate) limits: Limits,
    pub(crate) priority: Priority,
    pub(crate) deadline: Instant,
    pub(crate) team: &'a str,
    pub(crate) quota: QuotaLimits,
    pub(crate) tokens: u64,
    /// The team and what it is charged in attained service, for fair share.
    pub(crate) claim: admission::Claim,
    pub(crate) fairness: admission::Fairness,
    /// This gateway's gate of the class: its hold times predict waits, and it counts the request.
    pub(crate) admission: &'a Arc<Admission>,
}

/// A request admitted by the shared limits: its slot, as counted here and in Redis, and its
/// team's headers.
pub(crate) struct Admitted {
    pub(crate) permit: Permit,
    pub(crate) lease: Lease,
    pub(crate) headers: Option<RateHeaders>,
}

/// A request's place in Redis: a slot or queue place, a team slot and a token reservation, all
/// given back (and the tokens settled) when it is dropped.
pub(crate) struct Lease {
    shared: Arc<SharedLimits>,
    member: String,
    class: Arc<Class>,
    team_keys: TeamKeys,
    second: i64,
    charged: u64,
    used: Option<u64>,
    /// The slot is granted (and renewed); a queued lease holds only its queue place.
    granted: bool,
    /// Its team's attained service under fair share: what the grant charged, what it cost.
    team: Option<Arc<str>>,
    service_charged: u64,
    service_used: Option<u64>,
    /// When the slot was granted: the charge has decayed since, as the team's service has.
    granted_at: Instant,
    team_slot: bool,
    /// Redis may hold something of it: its drop sends the release.
    armed: bool,
    /// When Redis handed it a freed slot (ms since the epoch, Redis's clock), until its first
    /// attempt upstream is counted.
    granted_ms: Option<u64>,
}

/// A class as the scripts see it: its keys, C, Wq and order (see class.lua's KEYS and ARGV).
#[derive(Debug, Clone, PartialEq)]
struct Class {
    slots: String,
    queue: String,
    service: String,
    pushed_out: String,
    deadlines: String,
    team_queues: String,
    concurrency: u32,
    queue_wait_ms: u64,
    fair: bool,
}

/// A release to send again: one Redis did not take (the request's slot, queue place or team
/// slot would stay taken — a queue place until its deadline, and a slot granted to it meanwhile
/// for a lease ttl), sent when Redis answers; or one it took, sent to the node the namespace
/// moved to (see `recent`). Sent again, it frees places only: the tokens and attained service
/// it would have settled may have been settled by a first call whose answer was lost.
struct Unreleased {
    class: Arc<Class>,
    parallel: String,
    tokens: String,
    member: String,
}

struct TeamKeys {
    parallel: String,
    requests: String,
    tokens: String,
}

impl Lease {
    /// The request's first attempt upstream starts: a slot handed over by a release is counted
    /// from that release to now, the latency the handoff adds to a waiter.
    pub(crate) fn upstream_started(&mut self) {
        if let Some(at) = self.granted_ms.take() {
            self.shared
                .metrics
                .grant_to_upstream_seconds
                .observe(handoff::since_redis_ms(at));
        }
    }

    /// The tokens the request really cost, known when it ends.
    pub(crate) fn settle(&mut self, tokens: u64) {
        self.used = Some(tokens);
    }

    /// Its weighted tokens (see `admission::fair`), which settle its team's attained service.
    pub(crate) fn settle_service(&mut self, service: u64) {
        self.service_used = Some(service);
    }
}

/// How a wait in the shared queue ended without a slot.
enum NoSlot {
    /// Wq or the request's deadline came first, after this long.
    TimedOut(Duration),
    /// A team holding less of the full queue took its place.
    PushedOut,
}

/// The half-life of attained service, for the scripts.
fn half_life_ms() -> u64 {
    admission::fair::HALF_LIFE.as_millis() as u64
}

impl Drop for Lease {
    fn drop(&mut self) {
        {
            let mut held = self.shared.held();
            for key in [&self.class.slots, &self.team_keys.parallel] {
                if let Some(set) = held.get_mut(key) {
                    set.remove(&self.member);
                    if set.is_empty() {
                        held.remove(key);
                    }
                }
            }
        }
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.shared.clone();
        let class = self.class.clone();
        let (parallel, tokens) = (
            std::mem::take(&mut self.team_keys.parallel),
            std::mem::take(&mut self.team_keys.tokens),
        );
        let member = std::mem::take(&mut self.member);
        let (second, charged) = (self.second, self.charged);
        let used = self.used.map_or(-1, |u| u as i64);
        let granted = self.granted;
        let team = self.team.take();
        let service_charged = self.service_charged;
        let service_used = match (&team, self.service_used) {
            (Some(_), Some(u)) => u as i64,
            _ => -1,
        };
        let held_ms = self.granted_at.elapsed().as_millis() as u64;
        runtime.spawn(async move {
            let mut call = shared.invoke(&shared.scripts.release, &class);
            call.key(&parallel)
                .key(&tokens)
                .arg(&member)
                .arg(second)
                .arg(charged)
                .arg(used)
                .arg(team.as_deref().unwrap_or(""))
                .arg(service_charged)
                .arg(service_used)
                .arg(held_ms);
            let op = if granted { "release" } else { "dequeue" };
            let ok = shared
                .call::<i64>(op, &call, shared.background_budget())
                .await
                .is_ok();
            let r = Unreleased {
                class,
                parallel,
                tokens,
                member,
            };
            if ok {
                shared.released(r);
            } else {
                shared.unreleased(r);
            }
        });
    }
}

impl SharedLimits {
    /// Reads the URL and registers the metrics; the connection opens in [`SharedLimits::start`].
    pub(crate) fn new(
        config: &RedisConfig,
        url: &str,
        password: Option<String>,
        sentinel_password: Option<String>,
        registry: &Registry,
    ) -> Result<Arc<SharedLimits>, crate::config::ConfigError> {
        let prefix = format!("spillway:{{{}}}", config.namespace);
        let nodes = node::from_config(url, password, sentinel_password, config.tls.as_ref(), &prefix)?;
        let shared = SharedLimits {
            nodes,
            config: config.clone(),
            live: format!("{prefix}:gateways"),
            to: format!("{prefix}:to:"),
            prefix,
            gateway: format!("{:016x}", rand::random::<u64>()),
            next: AtomicU64::new(0),
            shared: AtomicBool::new(false),
            rejoining: AtomicBool::new(false),
            mode_tx: tokio::sync::watch::Sender::new(false),
            health: health::Health::new(),
            slow_logged: AtomicU64::new(0),
            waiters: handoff::Waiters::default(),
            classes: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            unreleased: Mutex::new(Vec::new()),
            renewed_on: Mutex::new(None),
            recent: Mutex::new(std::collections::VecDeque::new()),
            scripts: Scripts {
                acquire: class_script(include_str!("limits/acquire.lua")),
                release: class_script(include_str!("limits/release.lua")),
                poll: class_script(include_str!("limits/poll.lua")),
                renew: Script::new(include_str!("limits/renew.lua")),
            },
            metrics: metrics::RedisMetrics::register(registry),
        };
        shared.set_mode(false);
        Ok(Arc::new(shared))
    }

    /// Opens the connection and starts the background work: renewals, the probe that finds Redis
    /// again, the subscriber that wakes this gateway's waiters and their backstop poll, and
    /// under Sentinel or Cluster the search for the node that moved; the caller ends them.
    pub(crate) fn start(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        // The client's own response timeout only unsticks a connection that hangs (then it
        // reconnects): each call has its budget (see `call`), and a slow answer is an answer.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.config.down_after))
            .set_response_timeout(Some(self.background_budget()))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        self.nodes.start(config);
        let mut tasks = vec![
            tokio::spawn(self.clone().keep_leases()),
            tokio::spawn(self.clone().listen()),
            tokio::spawn(self.clone().backstop()),
        ];
        if self.nodes.follows() {
            let me = self.clone();
            tasks.push(tokio::spawn(async move {
                me.nodes
                    .follow(|found_by| me.metrics.node_changes.with_label_values(&[found_by]).inc())
                    .await;
            }));
        }
        if self.nodes.is_sentinel() {
            let me = self.clone();
            tasks.push(tokio::spawn(async move { me.nodes.hear_sentinels().await }));
        }
        tasks
    }

    /// Limits are shared right now.
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.load(Ordering::Acquire)
    }

    /// Resolves when limits are shared (again).
    pub(crate) async fn sharing(&self) {
        let mut rx = self.mode_tx.subscribe();
        let _ = rx.wait_for(|shared| *shared).await;
    }

    /// Resolves when limits are no longer shared.
    async fn not_sharing(&self) {
        let mut rx = self.mode_tx.subscribe();
        let _ = rx.wait_for(|shared| !*shared).await;
    }

    /// Redis answers, so a request admitted on this gateway's share should be put in it now:
    /// limits are shared, or about to be again.
    pub(crate) fn reachable(&self) -> bool {
        self.is_shared() || self.rejoining.load(Ordering::Acquire)
    }

    fn set_mode(&self, shared: bool) {
        self.shared.store(shared, Ordering::Release);
        self.mode_tx.send_replace(shared);
        self.metrics
            .mode
            .with_label_values(&["shared"])
            .set(i64::from(shared));
        self.metrics
            .mode
            .with_label_values(&["local"])
            .set(i64::from(!shared));
    }

    /// Redis is down: from now on this gateway enforces its share, and says so once.
    fn fall_back(&self, why: &str) {
        if self.shared.swap(false, Ordering::AcqRel) {
            self.set_mode(false);
            self.metrics.changes.with_label_values(&["local"]).inc();
            tracing::warn!(
                why,
                down_after = ?self.config.down_after,
                gateways = self.config.gateways.get(),
                "Redis is unreachable: each gateway enforces its share of every limit (limit ÷ gateways) until it is back"
            );
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, HashSet<String>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a call off the request path (a release, a renewal) may take: past `down_after`
    /// its silence has already decided the mode.
    fn background_budget(&self) -> Duration {
        self.config.down_after * 2
    }

    /// The class as the scripts see it, kept for the releases and the backstop poll.
    fn class(&self, route: &str, class: &str, limits: Limits, fair: bool) -> Arc<Class> {
        let mut made = self.class_keys(route, class);
        made.concurrency = limits.concurrency;
        made.queue_wait_ms = limits.queue_wait.as_millis() as u64;
        made.fair = fair;
        let mut classes = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        match classes.get(&made.slots) {
            Some(c) if **c == made => c.clone(),
            _ => {
                let made = Arc::new(made);
                classes.insert(made.slots.clone(), made.clone());
                made
            }
        }
    }

    /// The class's keys; C, Wq and order as last seen (C 0: none seen, a release hands nothing
    /// on and the next call that sees the slot free does).
    fn class_keys(&self, route: &str, class: &str) -> Class {
        let p = &self.prefix;
        let slots = format!("{p}:slots:{route}:{class}");
        if let Some(c) = self.classes.lock().unwrap_or_else(|e| e.into_inner()).get(&slots) {
            return Class::clone(c);
        }
        Class {
            slots,
            queue: format!("{p}:queue:{route}:{class}"),
            service: format!("{p}:service:{route}:{class}"),
            pushed_out: format!("{p}:pushed:{route}:{class}"),
            deadlines: format!("{p}:until:{route}:{class}"),
            team_queues: format!("{p}:tq:{route}:{class}"),
            concurrency: 0,
            queue_wait_ms: 0,
            fair: false,
        }
    }

    fn team_keys(&self, team: &str) -> TeamKeys {
        let p = &self.prefix;
        TeamKeys {
            parallel: format!("{p}:team:{team}:parallel"),
            requests: format!("{p}:team:{team}:requests"),
            tokens: format!("{p}:team:{team}:tokens"),
        }
    }

    /// A call of a script that starts with class.lua, its first keys and arguments given.
    fn invoke<'a>(&self, script: &'a Script, class: &Class) -> ScriptInvocation<'a> {
        let mut call = script.prepare_invoke();
        call.key(&class.slots)
            .key(&class.queue)
            .key(&self.live)
            .key(&class.service)
            .key(&class.pushed_out)
            .key(&class.deadlines)
            .arg(class.concurrency)
            .arg(self.config.lease_ttl.as_millis() as u64)
            .arg(class.queue_wait_ms)
            .arg(u8::from(class.fair))
            .arg(half_life_ms())
            .arg(&class.team_queues)
            .arg(&self.to);
        call
    }

    /// Stages 5 and 6 against the shared limits: the team's quota, then a slot (waiting for one
    /// in the shared queue if need be). `Err(Unavailable)`: Redis did not answer; the caller
    /// enforces this gateway's share instead.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        ask: Ask<'_>,
    ) -> Result<Result<Admitted, GatewayError>, Unavailable> {
        let start = Instant::now();
        let fair = ask.fairness == admission::Fairness::Teams;
        let class = self.class(ask.route, ask.class, ask.limits, fair);
        // The scripts read a waiter's cost and team from its name (see class.lua).
        let member = format!(
            "{}:{}:{}:{}",
            self.gateway,
            self.next.fetch_add(1, Ordering::Relaxed),
            ask.claim.cost,
            ask.team
        );
        let lane = match ask.priority {
            Priority::Critical => LANE_CRITICAL,
            Priority::Standard => LANE_STANDARD,
            Priority::Sheddable => LANE_SHEDDABLE,
        };
        let budget = ask
            .limits
            .queue_wait
            .min(ask.deadline.saturating_duration_since(start));
        let most_ahead = ask
            .admission
            .most_ahead(ask.limits.concurrency, budget)
            .map_or(String::new(), |n| n.to_string());
        let q = ask.quota;
        let team_keys = self.team_keys(ask.team);
        let mut call = self.invoke(&self.scripts.acquire, &class);
        call.key(&team_keys.parallel)
            .key(&team_keys.requests)
            .key(&team_keys.tokens)
            .arg(&member)
            .arg(ask.limits.queue)
            .arg(lane)
            .arg(most_ahead)
            .arg(q.max_parallel.map_or(0, |m| m.get()))
            .arg(q.rpm.map_or(0, |m| m.get()))
            .arg(q.tpm.map_or(0, |m| m.get()))
            .arg(ask.tokens)
            .arg(ask.team)
            .arg(ask.claim.weight)
            .arg(ask.claim.cost)
            .arg(
                ask.claim
                    .objective
                    .map_or(ask.limits.queue_wait, |o| o.min(ask.limits.queue_wait))
                    .as_millis() as u64,
            )
            .arg(budget.as_millis() as u64);
        // Listening before the call: a grant may be told before the call's own answer arrives.
        let waiter = self.waiters.enlist(&member, &class);
        // Armed before the call: if it times out (or this future is dropped) after Redis ran the
        // script, the drop gives back whatever it took instead of leaving it for the lease ttl.
        let mut lease = Lease {
            shared: self.clone(),
            member,
            class,
            team_keys,
            second: 0,
            charged: 0,
            used: None,
            granted: false,
            team: fair.then(|| ask.claim.team.clone()),
            service_charged: ask.claim.cost,
            service_used: None,
            granted_at: start,
            team_slot: q.max_parallel.is_some(),
            armed: true,
            granted_ms: None,
        };
        // A slow Redis is a slower queue: the request waits for it as it would in the queue,
        // at least `redis.timeout`.
        let waits = budget.max(self.config.timeout);
        let r: Vec<i64> = self.call("acquire", &call, waits).await?;
        let [outcome, n, rpm_used, tpm_used, rpm_reset, tpm_reset, second] = r[..] else {
            self.fall_back("acquire: an answer of the wrong shape");
            return Err(Unavailable);
        };
        let ms = |v: i64| Duration::from_millis(v.max(0) as u64);
        let headers = (q.rpm.is_some() || q.tpm.is_some()).then(|| {
            RateHeaders::from_counts(
                q.rpm.map(|l| (l.get(), rpm_used.max(0) as u64, ms(rpm_reset))),
                q.tpm.map(|l| (l.get(), tpm_used.max(0) as u64, ms(tpm_reset))),
            )
        });
        if !matches!(outcome, 1 | 2) {
            // Refused: the script wrote nothing, so there is nothing to give back.
            lease.armed = false;
        }
        let over = |kind: QuotaKind, limit: u64, retry_after: Duration| {
            Ok(Err(GatewayError::from(QuotaExceeded {
                team: ask.team.to_owned(),
                kind,
                limit,
                retry_after: retry_after.max(Duration::from_secs(1)),
            })))
        };
        let rejection = match outcome {
            1 | 2 => None,
            10 => return over(QuotaKind::Parallel, n as u64, Duration::from_secs(1)),
            11 => {
                return over(
                    QuotaKind::Requests,
                    q.rpm.map_or(0, |l| u64::from(l.get())),
                    ms(n),
                );
            }
            12 => {
                let wait = if n < 0 { Duration::from_secs(60) } else { ms(n) };
                return over(QuotaKind::Tokens, q.tpm.map_or(0, |l| l.get()), wait);
            }
            3 => Some(Rejection::QueueFull {
                retry_after: ask.admission.retry_after_shared(n as u32, ask.limits),
            }),
            4 => Some(Rejection::Shed {
                retry_after: ask.admission.retry_after_shared(0, ask.limits),
            }),
            5 => {
                let retry_after = ask.admission.retry_after_shared(n as u32, ask.limits);
                Some(Rejection::PredictedWait {
                    predicted: retry_after,
                    retry_after,
                })
            }
            _ => {
                self.fall_back("acquire: an unknown answer");
                return Err(Unavailable);
            }
        };
        if let Some(rejection) = rejection {
            return Ok(Err(ask.overloaded(rejection)));
        }
        lease.second = second;
        lease.charged = if q.tpm.is_some() { ask.tokens } else { 0 };
        if outcome == 2 {
            let refused = match self.wait(waiter, &ask, start + budget).await? {
                Ok(at) => {
                    lease.granted_ms = at;
                    None
                }
                Err(NoSlot::TimedOut(waited)) => Some(Rejection::QueueTimeout {
                    waited,
                    retry_after: ask.admission.retry_after_shared(0, ask.limits),
                }),
                Err(NoSlot::PushedOut) => Some(Rejection::QueueFull {
                    retry_after: ask.admission.retry_after_shared(ask.limits.queue, ask.limits),
                }),
            };
            if let Some(rejection) = refused {
                // Refused after all: its reserved tokens go back.
                lease.settle(0);
                return Ok(Err(ask.overloaded(rejection)));
            }
        }
        self.hold(&mut lease);
        let mut permit = ask.admission.admit_counted(start.elapsed(), &ask.claim);
        permit.ahead = (outcome == 2).then_some(n.max(0) as u32);
        Ok(Ok(Admitted {
            permit,
            lease,
            headers,
        }))
    }

    /// Waits in the shared queue until this request's gateway is told that the slot is its
    /// own (or that its place is gone), or `until`; `Err(Unavailable)` if limits stop being
    /// shared meanwhile or Redis lost its place. No call to Redis: the grant comes with the
    /// release that freed it.
    async fn wait(
        &self,
        waiter: handoff::Waiter<'_>,
        ask: &Ask<'_>,
        until: Instant,
    ) -> Result<Result<Option<u64>, NoSlot>, Unavailable> {
        let start = Instant::now();
        let _counted = ask.admission.shared_waiter(&ask.claim);
        tokio::select! {
            told = waiter.told() => match told.0 {
                handoff::Told::Granted => Ok(Ok(told.1)),
                handoff::Told::PushedOut => Ok(Err(NoSlot::PushedOut)),
                // The place expired (this gateway was cut off for longer than Wq) ...
                handoff::Told::Gone if Instant::now() >= until => {
                    Ok(Err(NoSlot::TimedOut(start.elapsed())))
                }
                // ... or Redis lost it with time left (a failover to a replica that lacked it,
                // a restart): served on this gateway's share, as when Redis does not answer.
                handoff::Told::Gone => Err(Unavailable),
            },
            () = tokio::time::sleep_until(until) => Ok(Err(NoSlot::TimedOut(start.elapsed()))),
            () = self.not_sharing() => Err(Unavailable),
        }
    }

    /// A lease for a request this gateway admitted on its own share while Redis was out: Redis
    /// learns of it when it is back, so the shared count includes it.
    pub(crate) fn local_lease(
        self: &Arc<Self>,
        route: &str,
        class: &str,
        team: &str,
        team_slot: bool,
    ) -> Lease {
        let mut lease = Lease {
            shared: self.clone(),
            member: self.member(),
            class: Arc::new(self.class_keys(route, class)),
            team_keys: self.team_keys(team),
            second: 0,
            charged: 0,
            used: None,
            granted: false,
            team: None,
            service_charged: 0,
            service_used: None,
            granted_at: Instant::now(),
            team_slot,
            armed: true,
            granted_ms: None,
        };
        self.hold(&mut lease);
        lease
    }

    fn member(&self) -> String {
        format!("{}:{}", self.gateway, self.next.fetch_add(1, Ordering::Relaxed))
    }
}

impl Ask<'_> {
    fn overloaded(&self, rejection: Rejection) -> GatewayError {
        GatewayError::Overloaded {
            status: self.status,
            route: self.route.to_owned(),
            class: self.class.to_owned(),
            limits: self.limits,
            rejection,
        }
    }
}
