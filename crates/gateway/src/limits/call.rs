//! One script call to Redis: its budget, its outcome (counted, timed, and what it says of
//! Redis's health) and Redis Cluster's redirections.

use super::{SharedLimits, Unavailable, node};
use redis::{ErrorKind, ScriptInvocation, ServerErrorKind};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// At most one "Redis is slow" warning this often.
const SLOW_LOG: Duration = Duration::from_secs(60);

impl SharedLimits {
    /// One script call, counted and timed by `op`, waiting at most `budget` for the answer. A
    /// late answer (past `redis.timeout`) is still an answer; a call with no answer for
    /// `down_after`, while Redis answered nothing else meanwhile, or failures lasting as long,
    /// turn this gateway to its share.
    pub(super) async fn call<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        invocation: &ScriptInvocation<'_>,
        budget: Duration,
    ) -> Result<T, Unavailable> {
        let start = Instant::now();
        let answer = self.run(invocation);
        tokio::pin!(answer);
        let silent = tokio::time::sleep_until(start + self.config.down_after);
        tokio::pin!(silent);
        let give_up = tokio::time::sleep_until(start + budget);
        tokio::pin!(give_up);
        let mut listened = false;
        let result = loop {
            tokio::select! {
                r = &mut answer => break Some(r),
                () = &mut silent, if !listened => {
                    listened = true;
                    if !self.health.answered_since(start) {
                        self.fall_back(&format!(
                            "{op}: no answer from Redis for {:?}",
                            self.config.down_after
                        ));
                        break None;
                    }
                }
                () = &mut give_up => break None,
            }
        };
        let took = start.elapsed();
        self.metrics
            .seconds
            .with_label_values(&[op])
            .observe(took.as_secs_f64());
        let outcome = match &result {
            Some(Ok(_)) if took > self.config.timeout => "late",
            Some(Ok(_)) => "ok",
            Some(Err(_)) => "error",
            None => "timeout",
        };
        self.metrics.calls.with_label_values(&[op, outcome]).inc();
        match result {
            Some(Ok(v)) => {
                self.health.answered();
                if outcome == "late" {
                    self.slow(op, took);
                }
                Ok(v)
            }
            Some(Err(e)) => {
                self.nodes.suspect(&e);
                if self.health.failed(self.config.down_after) {
                    self.fall_back(&format!("{op}: {e}"));
                }
                Err(Unavailable)
            }
            None => {
                // Silence may be a primary cut off from the rest: look where the namespace is.
                self.nodes.announce();
                if self.health.failed(self.config.down_after) {
                    self.fall_back(&format!("{op}: no answer within {budget:?}"));
                }
                Err(Unavailable)
            }
        }
    }

    /// Runs a script on the node holding the namespace, following Redis Cluster's redirections
    /// (after which the script has not run, so running it again is safe): MOVED to the node
    /// named (a few times at most: two nodes that disagree are not followed forever), ASK once
    /// there, TRYAGAIN after a pause, for as long as the migration lasts. The caller bounds the
    /// time.
    async fn run<T: redis::FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        const MOVES: usize = 3;
        const PAUSE: Duration = Duration::from_millis(5);
        let mut moves = 0;
        loop {
            let Some(node) = self.nodes.current() else {
                // At start under Sentinel or Cluster: the search is under way; the caller
                // bounds the wait.
                self.nodes.announce();
                let mut found = self.nodes.watch();
                if found.wait_for(Option::is_some).await.is_err() {
                    return Err(redis::RedisError::from((ErrorKind::Io, "no Redis node found")));
                }
                continue;
            };
            let mut conn = node.conn.clone();
            let r = invocation.invoke_async::<T>(&mut conn).await;
            let Err(e) = &r else { return r };
            let answer = match e.kind() {
                ErrorKind::Server(ServerErrorKind::Moved) => "moved",
                ErrorKind::Server(ServerErrorKind::Ask) => "ask",
                ErrorKind::Server(ServerErrorKind::TryAgain) => "tryagain",
                _ => return r,
            };
            self.metrics.redirections.with_label_values(&[answer]).inc();
            match e.kind() {
                ErrorKind::Server(ServerErrorKind::Moved) => {
                    moves += 1;
                    if moves > MOVES {
                        return r;
                    }
                    let Some((host, port)) = e.redirect_node().and_then(|(a, _)| node::split_addr(a)) else {
                        return r;
                    };
                    if self.nodes.switch(host, port, "moved") {
                        self.metrics.node_changes.with_label_values(&["moved"]).inc();
                    }
                }
                ErrorKind::Server(ServerErrorKind::Ask) => {
                    let Some((addr, _)) = e.redirect_node() else {
                        return r;
                    };
                    let addr = addr.to_owned();
                    let asked = self.nodes.asking(&addr, invocation).await;
                    // Asked again by the node asked: the migration ends soon; try from the start.
                    if !matches!(&asked, Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::TryAgain)) {
                        return asked;
                    }
                    self.metrics.redirections.with_label_values(&["tryagain"]).inc();
                    tokio::time::sleep(PAUSE).await;
                }
                // A slot's keys are split between two nodes for a moment while it migrates.
                _ => tokio::time::sleep(PAUSE).await,
            }
        }
    }

    /// A late answer: said at most once a minute, and limits stay shared.
    fn slow(&self, op: &str, took: Duration) {
        let now = self.health.since_start().as_millis() as u64 + 1;
        let last = self.slow_logged.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= SLOW_LOG.as_millis() as u64)
            && self
                .slow_logged
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                op,
                took = ?took,
                timeout = ?self.config.timeout,
                down_after = ?self.config.down_after,
                "Redis is slow: limits stay shared while it answers within down_after"
            );
        }
    }
}
