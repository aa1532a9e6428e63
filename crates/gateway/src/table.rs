//! The routing table — routes and tenants — built from a configuration and swapped whole on a
//! reload, so that every request sees one consistent table from start to end.

use crate::config::Config;
use crate::metrics::Metrics;
use crate::route::Route;
use crate::tenant::Tenants;
use std::collections::HashMap;
use std::sync::Arc;

pub struct Table {
    pub routes: Vec<Arc<Route>>,
    pub by_model: HashMap<String, usize>,
    pub tenants: Tenants,
    pub config: Config,
}

impl Table {
    /// Builds a table; with `previous`, routes that stay keep their live state (see [`Route::new`]).
    pub fn build(config: Config, metrics: &Metrics, previous: Option<&Table>) -> Result<Table, String> {
        let routes: Vec<Arc<Route>> = config
            .routes
            .iter()
            .map(|r| {
                let old = previous.and_then(|p| p.route(&r.model)).map(|a| a.as_ref());
                Route::new(r.clone(), metrics, old).map(Arc::new)
            })
            .collect::<Result<_, _>>()?;
        let by_model = routes
            .iter()
            .enumerate()
            .map(|(i, r)| (r.config.model.clone(), i))
            .collect();
        Ok(Table {
            tenants: Tenants::new(&config.tenants),
            routes,
            by_model,
            config,
        })
    }

    pub fn route(&self, model: &str) -> Option<&Arc<Route>> {
        self.by_model.get(model).map(|&i| &self.routes[i])
    }
}
