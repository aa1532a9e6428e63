//! The leases this gateway holds in Redis, kept alive: renewed while Redis answers, put back when
//! it answers again after an outage or from a node the namespace moved to, and the releases that
//! Redis did not take (or that a failover may have lost) sent again.

use super::{Lease, MAX_UNRELEASED, PROBE, REJOIN_POLL, SharedLimits, Unavailable, Unreleased};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

impl SharedLimits {
    /// The lease's slot is granted: renew it (and its team slot) from now on.
    pub(super) fn hold(&self, lease: &mut Lease) {
        lease.granted = true;
        lease.granted_at = Instant::now();
        let mut held = self.held();
        held.entry(lease.class.slots.clone())
            .or_default()
            .insert(lease.member.clone());
        if lease.team_slot {
            held.entry(lease.team_keys.parallel.clone())
                .or_default()
                .insert(lease.member.clone());
        }
    }

    /// Renews the leases held here every `lease_ttl / 3` (at most every second), and while
    /// Redis is out, probes for it every [`PROBE`]. When it answers again, this gateway puts all
    /// its leases back (those of requests admitted on its share included), and limits are shared
    /// again once every one of `gateways` has renewed since then — so has put its own back or
    /// never stopped sharing — or a `lease_ttl` later, should some gateway not come back.
    pub(super) async fn keep_leases(self: Arc<Self>) {
        let every = (self.config.lease_ttl / 3).min(Duration::from_secs(1));
        let mut rejoining: Option<(Instant, u64)> = None;
        loop {
            if self.is_shared() {
                tokio::time::sleep(every).await;
                if self.renew_with(false, 0).await.is_ok() {
                    self.release_again().await;
                }
                continue;
            }
            let since = rejoining.map_or(0, |(_, since)| since);
            match self.renew_with(true, since).await {
                Ok((live, now)) => {
                    self.release_again().await;
                    let (started, _) = *rejoining.get_or_insert((Instant::now(), now));
                    self.rejoining.store(true, Ordering::Release);
                    let all_back = since > 0 && live >= self.config.gateways.get();
                    // Hysteresis: Redis must have answered for `down_after` before limits are
                    // shared again, as it must have been silent that long for them to stop.
                    let steady = started.elapsed() >= self.config.down_after;
                    if steady && (all_back || started.elapsed() >= self.config.lease_ttl) {
                        rejoining = None;
                        self.set_mode(true);
                        self.metrics.changes.with_label_values(&["shared"]).inc();
                        self.rejoining.store(false, Ordering::Release);
                        tracing::info!(live, "Redis answers: limits are shared by every gateway");
                        continue;
                    }
                }
                Err(Unavailable) => {
                    rejoining = None;
                    self.rejoining.store(false, Ordering::Release);
                }
            }
            // Rejoining, gateways check often: one that shares while another still admits on its
            // own share alone can let the total pass C.
            tokio::time::sleep(if rejoining.is_some() { REJOIN_POLL } else { PROBE }).await;
        }
    }

    /// Keeps a release Redis did not take, to send again when it answers.
    pub(super) fn unreleased(&self, r: Unreleased) {
        let mut list = self.unreleased.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() < MAX_UNRELEASED {
            list.push(r);
        }
    }

    /// Remembers a release Redis took, for a move to another node within `lease_ttl`.
    pub(super) fn released(&self, r: Unreleased) {
        if !self.nodes.follows() {
            return;
        }
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while recent
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > self.config.lease_ttl)
            || recent.len() >= MAX_UNRELEASED
        {
            recent.pop_front();
        }
        recent.push_back((now, r));
    }

    /// Sends again the releases Redis did not take; those failing again are kept.
    pub(super) async fn release_again(&self) {
        let list = std::mem::take(&mut *self.unreleased.lock().unwrap_or_else(|e| e.into_inner()));
        for r in list {
            let mut call = self.invoke(&self.scripts.release, &r.class);
            // Tokens and service unknown (-1): only the places are freed (see `Unreleased`).
            call.key(&r.parallel)
                .key(&r.tokens)
                .arg(&r.member)
                .arg(0)
                .arg(0)
                .arg(-1)
                .arg("")
                .arg(0)
                .arg(-1)
                .arg(0);
            if self
                .call::<i64>("release_again", &call, self.background_budget())
                .await
                .is_err()
            {
                self.unreleased(r);
            }
        }
    }

    /// One call that renews every lease this gateway holds, or puts them all back (`add`, or
    /// where Redis lost them; see `renew.lua`); returns how many gateways have renewed since
    /// `since` (Redis ms; 0: how many are live) and Redis's time.
    pub(super) async fn renew_with(&self, add: bool, since: u64) -> Result<(u32, u64), Unavailable> {
        // On a node first renewed on since a move, leases are put back too: a promoted replica
        // may lack the last writes of the primary it replaces.
        let node = self.nodes.current().map(|n| n.name.clone());
        let moved = *self.renewed_on.lock().unwrap_or_else(|e| e.into_inner()) != node;
        let held: Vec<(String, Vec<String>)> = self
            .held()
            .iter()
            .map(|(k, v)| (k.clone(), v.iter().cloned().collect()))
            .collect();
        let mut call = self.scripts.renew.prepare_invoke();
        call.key(&self.live)
            .arg(self.config.lease_ttl.as_millis() as u64)
            .arg(&self.gateway)
            .arg(if add || moved { "add" } else { "" })
            .arg(since);
        for (key, members) in &held {
            call.key(key).arg(members.len());
            for m in members {
                call.arg(m);
            }
        }
        let (_, live, now): (i64, u32, u64) = self.call("renew", &call, self.background_budget()).await?;
        let before = std::mem::replace(
            &mut *self.renewed_on.lock().unwrap_or_else(|e| e.into_inner()),
            node,
        );
        if moved && before.is_some() {
            // A move: the recent releases go to the new node too (see `recent`).
            let recent = std::mem::take(&mut *self.recent.lock().unwrap_or_else(|e| e.into_inner()));
            let mut list = self.unreleased.lock().unwrap_or_else(|e| e.into_inner());
            list.extend(recent.into_iter().map(|(_, r)| r));
            list.truncate(MAX_UNRELEASED);
        }
        Ok((live, now))
    }

    /// Puts this gateway's leases in Redis now (a renewal that adds the missing ones).
    pub(crate) async fn register(&self) {
        let _ = self.renew_with(true, 0).await;
    }
}
