//! The routing table — routes and tenants — built from a configuration and swapped whole on a
//! reload, so that every request sees one consistent table from start to end.

use crate::config::{Config, ConfigError};
use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::prepare::Parsed;
use crate::route::Route;
use crate::tenant::{Tenant, Tenants};
use axum::http::HeaderMap;
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
            .map(|r| {
                let old = previous.and_then(|p| p.route(&r.model)).map(|a| a.as_ref());
                Route::new(r.clone(), metrics, old, config.redis.as_ref()).map(Arc::new)
            })
            .collect::<Result<_, _>>()?;
        let by_model = routes
            .iter()
            .enumerate()
            .map(|(i, r)| (r.config.model.clone(), i))
            .collect();
        let mut rule_headers: Vec<String> = Vec::new();
        for route in &config.routes {
            let classes = route.classes.iter().filter_map(|c| c.when.as_ref());
            for when in classes.chain(route.redirect.iter().map(|r| &r.when)) {
                if let Some(h) = &when.header {
                    let name = h.name.to_ascii_lowercase();
                    if !rule_headers.contains(&name) {
                        rule_headers.push(name);
                    }
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

    /// The route serving the request: its model's (404 if none, 403 if the tenant may not use
    /// it), or where one of that route's rules sends it (one hop).
    pub(crate) fn route_for(
        &self,
        parsed: &Parsed,
        tenant: &Tenant,
        headers: &HeaderMap,
    ) -> Result<Arc<Route>, GatewayError> {
        let Some(route) = self.route(parsed.model()) else {
            return Err(GatewayError::ModelNotFound(
                parsed.model().chars().take(100).collect(),
            ));
        };
        if !tenant.may_use(&route.config.model) {
            return Err(GatewayError::ModelNotAllowed {
                team: tenant.team.to_string(),
                model: route.config.model.clone(),
            });
        }
        if route.config.redirect.is_empty() {
            return Ok(route.clone());
        }
        let target = route
            .redirect(parsed.max_tokens(), parsed.input_tokens(route), headers)
            .and_then(|to| self.route(to));
        Ok(target.unwrap_or(route).clone())
    }
}
