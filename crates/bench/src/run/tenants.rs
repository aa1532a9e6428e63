//! The one level of a multi-tenant run: every tenant's load at once, then each tenant's report
//! and the fairness over them.

use super::{BenchError, Ctx};
use crate::client::{Client, Record};
use crate::spec::{Load, Phase};
use crate::tenants::{Fairness, TenantReport};

impl Ctx {
    /// Runs every tenant together for one level at `load` (their loads added up, for its row).
    pub(super) async fn tenants_level(&mut self, load: Load) -> (Vec<TenantReport>, Fairness) {
        let workload = self.opts.workload.clone();
        let ticker = self.progress.level(Phase::Tenants, load, self.sink.clone());
        let run = self
            .driver
            .run_tenants(&self.tenant_clients, self.opts.stop, &workload, self.sink.clone())
            .await;
        drop(ticker);
        let warm = self.opts.warmup;
        let (measured, warmup): (Vec<&Record>, Vec<&Record>) =
            run.records.iter().partition(|r| r.scheduled >= warm);
        // The same time and the same records as the level's own statistics, so that the tenants'
        // counts add up to the level's.
        let wall = run.end.saturating_sub(run.start + warm);
        let (tenants, fairness) =
            crate::tenants::reports(&self.extras.tenants, &measured, &warmup, wall, &self.opts.slo);
        let report = self.judge(Phase::Tenants, load, run, false);
        self.kept(report);
        (tenants, fairness)
    }
}

/// `2 tenants at once: served a 85.0%, b 15.0% of the requests; Jain's fairness index 0.67 over
/// served tokens, 0.67 over served requests (1: equal shares; 0.5: one of 2 got everything).`
pub(super) fn summarize(tenants: &[TenantReport], f: &Fairness) -> String {
    let shares: Vec<String> = tenants
        .iter()
        .map(|t| format!("{} {:.1}%", t.name, t.served_share * 100.0))
        .collect();
    let index = |j: Option<f64>| j.map_or("-".to_owned(), |j| format!("{j:.2}"));
    format!(
        "{} tenant(s) at once: served {} of the requests; Jain's fairness index {} over served tokens, \
         {} over served requests (1: equal shares; {}: one tenant got everything).",
        tenants.len(),
        shares.join(", "),
        index(f.jain_served_tokens),
        index(f.jain_served_requests),
        crate::report::number(1.0 / tenants.len().max(1) as f64),
    )
}

/// Each tenant's client, sharing `client`'s connections; its name and load checked.
pub(super) fn clients(
    client: &Client,
    tenants: &[crate::tenants::Tenant],
) -> Result<Vec<(Client, Load)>, BenchError> {
    let mut names = std::collections::BTreeSet::new();
    tenants
        .iter()
        .map(|t| {
            let spec = crate::tenants::TenantSpec {
                name: t.name.clone(),
                api_key_env: t.api_key_env.clone(),
                clients: match t.load {
                    Load::Concurrency(c) => Some(c),
                    Load::Rate(_) => None,
                },
                rate: match t.load {
                    Load::Rate(r) => Some(r),
                    Load::Concurrency(_) => None,
                },
            };
            spec.load().map_err(BenchError::Setup)?;
            if !names.insert(t.name.as_str()) {
                return Err(BenchError::Setup(format!(
                    "tenant {}: named twice; each tenant needs a name of its own",
                    t.name
                )));
            }
            Ok((client.for_tenant(&t.name, &t.api_key), t.load))
        })
        .collect()
}
