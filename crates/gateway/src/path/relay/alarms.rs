//! What can end a relayed stream besides its upstream: the idle/total timer and the drain's signal,
//! each registered once per setting so that a chunk costs no timer update.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// Resolves when the drain runs out; never if the gateway that would say so is gone.
async fn stopped(mut stop: watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What can end a stream besides its upstream: the idle/total timer and the drain's signal.
/// Each is polled (which registers the task's waker) once per setting, and later wake-ups read
/// its state: a chunk then costs no timer update and no lock on the signal's waiter list.
pub(super) struct Alarms {
    /// Set at the idle or total deadline, and moved only when it fires early.
    timer: Pin<Box<Sleep>>,
    timer_armed: bool,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    stop_seen: watch::Receiver<bool>,
    stop_waiting: bool,
}

impl Alarms {
    pub(super) fn new(at: Instant, stop: watch::Receiver<bool>) -> Alarms {
        Alarms {
            timer: Box::pin(tokio::time::sleep_until(at)),
            timer_armed: false,
            stop_seen: stop.clone(),
            stop: Box::pin(stopped(stop)),
            stop_waiting: false,
        }
    }

    /// Whether the drain has run out.
    pub(super) fn stopping(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.stop_waiting {
            // A poll made once the task's budget is spent returns Pending without registering
            // anything (tokio's coop); it counts as waiting only if it could register.
            self.stop_waiting = tokio::task::coop::has_budget_remaining();
            return self.stop.as_mut().poll(cx).is_ready();
        }
        self.stop_seen.has_changed().unwrap_or(false) && self.stop.as_mut().poll(cx).is_ready()
    }

    /// Whether the timer has fired.
    pub(super) fn timer_due(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.timer_armed {
            self.timer_armed = tokio::task::coop::has_budget_remaining();
            return self.timer.as_mut().poll(cx).is_ready();
        }
        self.timer.is_elapsed() && self.timer.as_mut().poll(cx).is_ready()
    }

    pub(super) fn reset(&mut self, at: Instant) {
        self.timer.as_mut().reset(at);
        self.timer_armed = false;
    }
}
