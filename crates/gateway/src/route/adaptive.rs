//! The task that runs the adaptive-concurrency controller of a route's adaptive classes (the
//! controller itself is [`admission::Admission::adapt`]).

use super::Route;
use crate::config::Concurrency;
use std::sync::Arc;

impl Route {
    /// Runs the adaptive-concurrency controller of this route's adaptive classes.
    pub(crate) async fn adapt_limits(self: Arc<Self>) {
        let every = self
            .classes
            .iter()
            .filter_map(|c| match c.config.concurrency {
                Concurrency::Adaptive { adaptive } => Some(adaptive.interval),
                Concurrency::Fixed(_) => None,
            })
            .min();
        let Some(every) = every else { return };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            for c in self
                .classes
                .iter()
                .filter(|c| matches!(c.config.concurrency, Concurrency::Adaptive { .. }))
            {
                let before = c.admission.limits().concurrency;
                let after = c.admission.adapt();
                c.limit_gauge.set(i64::from(after));
                if after != before {
                    crate::audit::adaptive(&self.config.model, &c.config.name, before, after);
                }
            }
        }
    }
}
