//! This gateway's waiters in the shared queue, and how each learns that a slot is its own: a
//! message on the gateway's own channel, or its backstop poll.

use super::{Class, SharedLimits};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// How often a gateway with waiters asks Redis, in one call per class, to hand off slots no call
/// saw free (expired leases) and, after its subscription broke, where its waiters stand.
pub(super) const BACKSTOP: Duration = Duration::from_millis(500);

/// What a waiter is told.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Told {
    /// The slot is its own (its lease is in Redis, renewed from now on).
    Granted,
    /// A team holding less of the full queue took its place.
    PushedOut,
    /// Its place is gone (it expired, or Redis lost it).
    Gone,
}

impl Told {
    fn from_code(code: i64) -> Option<Told> {
        match code {
            1 => Some(Told::Granted),
            -2 => Some(Told::PushedOut),
            -1 => Some(Told::Gone),
            _ => None,
        }
    }
}

struct Entry {
    /// What it is told, and when Redis granted it (ms since the epoch, Redis's clock) if known.
    tx: oneshot::Sender<(Told, Option<u64>)>,
    class: Arc<Class>,
}

/// The waiters of this gateway by member, each with the one-shot that tells it: a message that
/// comes before its waiter looks is kept, so none is lost between a check and a wait.
#[derive(Default)]
pub(super) struct Waiters {
    by_member: Mutex<HashMap<String, Entry>>,
    /// The subscription to this gateway's channel is up.
    subscribed: AtomicBool,
    /// Counts the subscriptions made: one made since a poll means messages may have been lost.
    subscriptions: AtomicU64,
}

/// A request listening for its grant; it stops listening when dropped.
pub(super) struct Waiter<'a> {
    waiters: &'a Waiters,
    member: String,
    rx: oneshot::Receiver<(Told, Option<u64>)>,
}

impl Waiter<'_> {
    /// Resolves once, when the waiter is told; with the grant's time in Redis when the message
    /// said it (not when the backstop poll found it).
    pub(super) async fn told(mut self) -> (Told, Option<u64>) {
        // The sender lives in the map until it is used or this waiter is dropped.
        (&mut self.rx).await.unwrap_or((Told::Gone, None))
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.waiters.lock().remove(&self.member);
    }
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.by_member.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Listens for `member`'s grant, from before the call that may queue it.
    pub(super) fn enlist(&self, member: &str, class: &Arc<Class>) -> Waiter<'_> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(
            member.to_owned(),
            Entry {
                tx,
                class: class.clone(),
            },
        );
        Waiter {
            waiters: self,
            member: member.to_owned(),
            rx,
        }
    }

    /// Tells a waiter, if it still waits; true if it did.
    fn tell(&self, member: &str, told: Told, at: Option<u64>) -> bool {
        let entry = self.lock().remove(member);
        entry.is_some_and(|e| e.tx.send((told, at)).is_ok())
    }

    /// The classes with waiters here, each with its waiters.
    fn by_class(&self) -> Vec<(Arc<Class>, Vec<String>)> {
        let mut out: HashMap<&str, (Arc<Class>, Vec<String>)> = HashMap::new();
        let map = self.lock();
        for (member, e) in map.iter() {
            out.entry(e.class.slots.as_str())
                .or_insert_with(|| (e.class.clone(), Vec::new()))
                .1
                .push(member.clone());
        }
        out.into_values().collect()
    }
}

/// Seconds from `at_ms` (ms since the epoch, as Redis's TIME gives it) to this host's now; 0 if
/// the clocks put it in the future.
pub(super) fn since_redis_ms(at_ms: u64) -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    now.saturating_sub(at_ms) as f64 / 1000.0
}

/// A message on a gateway's channel: `code ms member` (see class.lua's `tell`); the member
/// last, as a team's name may hold spaces.
fn parse(payload: &[u8]) -> Option<(Told, &str, u64)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.splitn(3, ' ');
    let told = Told::from_code(parts.next()?.parse().ok()?)?;
    let at = parts.next()?.parse().ok()?;
    let member = parts.next().filter(|m| !m.is_empty())?;
    Some((told, member, at))
}

impl SharedLimits {
    /// Subscribes to this gateway's own channel and tells each waiter named there; reconnects
    /// after a pause when the subscription breaks.
    pub(super) async fn listen(self: Arc<Self>) {
        let channel = format!("{}{}", self.to, self.gateway);
        let mut node_changed = self.nodes.watch();
        loop {
            node_changed.borrow_and_update();
            let Some(node) = self.nodes.current() else {
                let _ = tokio::time::timeout(super::PROBE, node_changed.changed()).await;
                continue;
            };
            if let Ok(Ok(mut pubsub)) =
                tokio::time::timeout(self.config.down_after, node.client.get_async_pubsub()).await
                && pubsub.subscribe(&channel).await.is_ok()
            {
                self.waiters.subscribed.store(true, Ordering::Release);
                self.waiters.subscriptions.fetch_add(1, Ordering::AcqRel);
                let mut messages = pubsub.on_message();
                loop {
                    tokio::select! {
                        msg = messages.next() => {
                            let Some(msg) = msg else { break };
                            let Some((told, member, at)) = parse(msg.get_payload_bytes()) else {
                                continue;
                            };
                            if self.waiters.tell(member, told, Some(at)) && told == Told::Granted {
                                self.grant_latency(at);
                            }
                        }
                        // The namespace moved (a failover): listen where grants are published.
                        _ = node_changed.changed() => break,
                    }
                }
                self.waiters.subscribed.store(false, Ordering::Release);
                if node_changed.has_changed().unwrap_or(false) {
                    continue;
                }
            }
            let _ = tokio::time::timeout(super::PROBE, node_changed.changed()).await;
        }
    }

    /// From Redis's clock at the grant to this host's now (one host or synchronised clocks).
    fn grant_latency(&self, at_ms: u64) {
        self.metrics.grant_seconds.observe(since_redis_ms(at_ms));
    }

    /// The backstop: every [`BACKSTOP`], one call per class with waiters here hands off the
    /// slots no call saw free; after the subscription broke (or while it is down) the same call
    /// says where each waiter stands, and those granted or gone are told.
    pub(super) async fn backstop(self: Arc<Self>) {
        let mut seen = 0;
        loop {
            tokio::time::sleep(BACKSTOP).await;
            if !self.is_shared() {
                continue;
            }
            let subscriptions = self.waiters.subscriptions.load(Ordering::Acquire);
            let look_up = !self.waiters.subscribed.load(Ordering::Acquire) || subscriptions != seen;
            let mut all_answered = true;
            for (class, members) in self.waiters.by_class() {
                let mut call = self.invoke(&self.scripts.poll, &class);
                if look_up {
                    for m in &members {
                        call.arg(m);
                    }
                }
                let Ok(codes) = self
                    .call::<Vec<i64>>("poll", &call, self.background_budget())
                    .await
                else {
                    all_answered = false;
                    continue;
                };
                for (m, code) in members.iter().zip(codes) {
                    if let Some(told) = Told::from_code(code) {
                        self.waiters.tell(m, told, None);
                    }
                }
            }
            if look_up && all_answered {
                seen = subscriptions;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class() -> Arc<Class> {
        Arc::new(Class {
            slots: "s".into(),
            queue: "q".into(),
            service: "v".into(),
            pushed_out: "p".into(),
            deadlines: "d".into(),
            team_queues: "t".into(),
            concurrency: 1,
            queue_wait_ms: 1000,
            fair: false,
        })
    }

    #[tokio::test]
    async fn a_grant_told_before_the_waiter_looks_is_kept() {
        let waiters = Waiters::default();
        let w = waiters.enlist("g:1:0:a", &class());
        assert!(waiters.tell("g:1:0:a", Told::Granted, Some(7)));
        assert_eq!(w.told().await, (Told::Granted, Some(7)));
        assert!(waiters.lock().is_empty(), "told once, then gone");
        assert!(
            !waiters.tell("g:1:0:a", Told::Granted, None),
            "a second message finds nobody"
        );
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_stops_listening() {
        let waiters = Waiters::default();
        drop(waiters.enlist("g:2:0:a", &class()));
        assert!(!waiters.tell("g:2:0:a", Told::Granted, None));
        assert!(waiters.by_class().is_empty());
    }

    #[test]
    fn messages_are_read_or_ignored_never_misread() {
        assert_eq!(
            parse(b"1 1700000000123 ab12:7:40:team a"),
            Some((Told::Granted, "ab12:7:40:team a", 1_700_000_000_123)),
            "a team's name may hold spaces"
        );
        assert_eq!(
            parse(b"-2 5 ab12:7:40:search"),
            Some((Told::PushedOut, "ab12:7:40:search", 5))
        );
        assert_eq!(parse(b"0 5 m"), None, "0 is not a message");
        assert_eq!(parse(b"1 5 "), None);
        assert_eq!(parse(b"1 x m"), None);
        assert_eq!(parse(b"garbage"), None);
    }
}
