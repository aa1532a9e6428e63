//! The routing table — routes and tenants — built from a configuration and swapped whole on a
//! reload, so that every request sees one consistent table from start to end.

use crate::config::{Config, ConfigError};
use crate::metrics::Metrics;
use crate::route::Route;
use crate::tenant::Tenants;
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) struct Table {
    pub(crate) routes: Vec<Arc<Route>>,
    by_model: HashMap<String, usize>,
    pub(crate) tenants: Tenants,
    /// The request headers the routes' rules read (`when.header`, lowercased): with the few the
    /// request path itself reads, all that the public port's own HTTP/1.1 (`front`) keeps of a
    /// request's head for a request served by this table.
    pub(crate) rule_headers: Vec<String>,
}

impl Table {
    /// Builds a table; with `previous`, routes that stay keep their live state (see [`Route::new`]).
    pub(crate) fn build(
        config: &Config,
        metrics: &Metrics,
        previous: Option<&Table>,
    ) -> Result<Table, ConfigError> {
        let routes: Vec<Arc<Route>> = config
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let old = previous.and_then(|p| p.route(&r.model)).map(|a| a.as_ref());
                let trust = crate::tls::route_trust(r, i)?;
                Route::new(r.clone(), metrics, old, config.redis.as_ref(), trust).map(Arc::new)
            })
            .collect::<Result<_, _>>()?;
        for r in &config.routes {
            // The teams that may use this route (all, without tenants: the anonymous one).
            let teams: Vec<(&str, bool)> = if config.tenants.is_empty() {
                vec![("anonymous", false)]
            } else {
                config
                    .tenants
                    .iter()
                    .filter(|t| t.models.is_empty() || t.models.contains(&r.model))
                    .map(|t| {
                        let quota = t.max_parallel.is_some() || t.rpm.is_some() || t.tpm.is_some();
                        (t.team.as_str(), quota)
                    })
                    .collect()
            };
            for c in &r.classes {
                let slo = r.balance == crate::config::Balance::Slo;
                metrics.declare(&r.model, &c.name, &teams, slo);
            }
        }
        let by_model = routes
            .iter()
            .enumerate()
            .map(|(i, r)| (r.config.model.clone(), i))
            .collect();
        // The headers the routes' own rules read (classes, redirects, agent sessions), which the
        // public port's HTTP/1.1 keeps with the request path's own.
        let mut rule_headers: Vec<String> = Vec::new();
        for route in &config.routes {
            let classes = route.classes.iter().filter_map(|c| c.when.as_ref());
            let whens = classes.chain(route.redirect.iter().map(|r| &r.when));
            let named = whens.filter_map(|w| w.header.as_ref().map(|h| &h.name));
            for name in named.chain(&route.agents.session_headers) {
                let name = name.to_ascii_lowercase();
                if !rule_headers.contains(&name) {
                    rule_headers.push(name);
                }
            }
        }
        Ok(Table {
            rule_headers,
            tenants: Tenants::new(
                &config.tenants,
                previous.map(|p| &p.tenants),
                config.redis.as_ref(),
            ),
            routes,
            by_model,
        })
    }

    pub(crate) fn route(&self, model: &str) -> Option<&Arc<Route>> {
        self.by_model.get(model).map(|&i| &self.routes[i])
    }
}
