//! Which replica made each stored response. vLLM keeps a response in its API server's memory
//! (`VLLM_ENABLE_RESPONSES_API_STORE`), so `previous_response_id`, `GET /v1/responses/{id}` and
//! its `cancel` work only on that replica: the gateway learns the ids from the answers (a whole
//! response's `id`, a stream's `response.created`) and sends those requests back there.
//!
//! Bounded and expiring: at most [`CAPACITY`] ids, each for [`TTL`]; the oldest go first. An id
//! the gateway does not know (never seen, expired, or seen by another gateway of the fleet) is
//! answered as vLLM answers an unknown one, never sent to a replica that cannot hold it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Ids remembered at most: about 200 bytes each.
pub(crate) const CAPACITY: usize = 100_000;

/// How long an id is remembered after its response.
pub(crate) const TTL: Duration = Duration::from_secs(6 * 3600);

/// Where a response was made, and for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Made {
    /// The route (its public model) that served it.
    pub(crate) route: Arc<str>,
    /// The replica's URL: its index may change with a reload, its URL does not.
    pub(crate) replica: Arc<str>,
    /// Only the team that made it may read it or build on it.
    pub(crate) team: Arc<str>,
}

pub(crate) struct Sessions {
    inner: Mutex<Inner>,
    capacity: usize,
    ttl: Duration,
}

#[derive(Default)]
struct Inner {
    made: HashMap<Box<str>, (Made, Instant)>,
    /// Ids in the order they were learned, for eviction and expiry.
    order: VecDeque<(Instant, Box<str>)>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::new(CAPACITY, TTL)
    }
}

impl Sessions {
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Sessions {
        Sessions {
            inner: Mutex::new(Inner::default()),
            capacity,
            ttl,
        }
    }

    /// Response `id` was made by `made.replica`, at `now`.
    pub(crate) fn remember(&self, id: &str, made: Made, now: Instant) {
        if id.is_empty() || id.len() > 256 {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.expire(now, self.ttl);
        while inner.made.len() >= self.capacity {
            let Some((at, old)) = inner.order.pop_front() else {
                break;
            };
            inner.forget(&old, at);
        }
        let id: Box<str> = id.into();
        inner.order.push_back((now, id.clone()));
        inner.made.insert(id, (made, now));
    }

    /// Where response `id` was made, if it is remembered.
    pub(crate) fn find(&self, id: &str, now: Instant) -> Option<Made> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.expire(now, self.ttl);
        inner.made.get(id).map(|(m, _)| m.clone())
    }
}

impl Inner {
    fn expire(&mut self, now: Instant, ttl: Duration) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < ttl {
                break;
            }
            if let Some((at, id)) = self.order.pop_front() {
                self.forget(&id, at);
            }
        }
    }

    /// Forgets `id` if it is still the one learned at `at` (not learned again since).
    fn forget(&mut self, id: &str, at: Instant) {
        if self.made.get(id).is_some_and(|(_, t)| *t == at) {
            self.made.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(replica: &str) -> Made {
        Made {
            route: "m".into(),
            replica: replica.into(),
            team: "t".into(),
        }
    }

    #[test]
    fn ids_are_kept_within_the_bound_and_expire() {
        let t0 = Instant::now();
        let s = Sessions::new(2, Duration::from_secs(10));
        s.remember("a", made("r1"), t0);
        s.remember("b", made("r2"), t0);
        s.remember("c", made("r1"), t0 + Duration::from_secs(1));
        assert_eq!(s.find("a", t0), None, "the oldest goes first");
        assert_eq!(s.find("b", t0).unwrap().replica.as_ref(), "r2");
        assert_eq!(
            s.find("c", t0 + Duration::from_secs(10))
                .unwrap()
                .replica
                .as_ref(),
            "r1"
        );
        assert_eq!(s.find("c", t0 + Duration::from_secs(11)), None, "expired");
        assert_eq!(s.inner.lock().unwrap().order.len(), 0);
    }

    #[test]
    fn an_id_learned_again_keeps_its_newer_replica() {
        let t0 = Instant::now();
        let s = Sessions::new(10, Duration::from_secs(10));
        s.remember("a", made("r1"), t0);
        s.remember("a", made("r2"), t0 + Duration::from_secs(5));
        // The first learning expires; the second stands.
        assert_eq!(
            s.find("a", t0 + Duration::from_secs(12))
                .unwrap()
                .replica
                .as_ref(),
            "r2"
        );
    }
}
