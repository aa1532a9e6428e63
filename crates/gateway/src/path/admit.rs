//! Stages 5 and 6: the team's quota, then a slot in the class — through the limits every gateway
//! shares in Redis where they are configured, else (or while Redis does not answer) this
//! gateway's own [`admission`] gates.

use crate::error::GatewayError;
use crate::path::ledger::Ledger;
use crate::path::prepare::Prepared;
use crate::path::upstream::Budgets;
use crate::route::{Class, Route};
use crate::state::Gateway;
use crate::tenant::Tenant;
use std::sync::Arc;

/// The most a request may cost, charged to its team's `tpm` until it ends: its prompt and
/// `max_tokens` for each sequence it generates.
fn reserved_tokens(prepared: &Prepared) -> u64 {
    u64::from(prepared.input_tokens)
        + u64::from(prepared.max_tokens.unwrap_or(0)) * u64::from(prepared.sequences)
}

/// What the request is charged in its team's attained service when it gets a slot: its prompt
/// and the most it may generate, weighted (settled with what it really cost at the end).
fn claim(tenant: &Tenant, prepared: &Prepared) -> admission::Claim {
    let output = u64::from(prepared.max_tokens.unwrap_or(0)) * u64::from(prepared.sequences);
    admission::Claim {
        team: tenant.team.clone(),
        weight: tenant.weight,
        cost: admission::fair::service_cost(u64::from(prepared.input_tokens), output),
        objective: prepared.slo.ttft,
    }
}

/// Stages 5 and 6: the team's quota, then a slot in the class — one call to Redis where limits
/// are shared by several gateways, else (or while Redis does not answer) this gateway's own.
pub(super) async fn admit(
    g: &Gateway,
    route: &Route,
    class: &Class,
    tenant: &Tenant,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Ledger,
) -> Result<(), GatewayError> {
    let Some(shared) = &g.shared else {
        charge_quota(tenant, prepared, ex)?;
        return take_slot(route, class, tenant, prepared, budgets, ex).await;
    };
    // The Redis path's future is six times the local one's; boxed, it does not make every
    // request's future (allocated whole per request) that much larger.
    Box::pin(admit_with_redis(
        g, shared, route, class, tenant, prepared, budgets, ex,
    ))
    .await
}

/// [`admit`] where Redis is configured: shared limits while it answers, this gateway's share of
/// them while it does not.
#[allow(clippy::too_many_arguments)]
async fn admit_with_redis(
    g: &Gateway,
    shared: &Arc<crate::limits::SharedLimits>,
    route: &Route,
    class: &Class,
    tenant: &Tenant,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Ledger,
) -> Result<(), GatewayError> {
    if admit_shared(g, route, class, tenant, prepared, budgets, ex).await? {
        return Ok(());
    }
    charge_quota(tenant, prepared, ex)?;
    // Waiting on this gateway's share while Redis is out: if limits turn shared meanwhile, Redis
    // decides instead (a slot of the share handed over then would come on top of C).
    let local = tokio::select! {
        r = take_slot(route, class, tenant, prepared, budgets, ex) => Some(r),
        () = shared.sharing() => None,
    };
    match local {
        Some(r) => r?,
        None => {
            ex.give_back_local();
            if admit_shared(g, route, class, tenant, prepared, budgets, ex).await? {
                return Ok(());
            }
            charge_quota(tenant, prepared, ex)?;
            take_slot(route, class, tenant, prepared, budgets, ex).await?;
        }
    }
    // Admitted on this gateway's share: Redis learns of it when it is back.
    let team_slot = tenant.limits.max_parallel.is_some();
    ex.leased(shared.local_lease(&route.config.model, &class.config.name, &tenant.team, team_slot));
    if shared.reachable() {
        // Redis is back (or coming back): it learns of the slot now, not at the next renewal,
        // so that the shared count includes it.
        shared.register().await;
    }
    Ok(())
}

/// Stages 5 and 6 against the limits shared by every gateway through Redis, in one call: false
/// when there are none, or Redis does not answer (then this gateway enforces its share of them).
async fn admit_shared(
    g: &Gateway,
    route: &Route,
    class: &Class,
    tenant: &Tenant,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Ledger,
) -> Result<bool, GatewayError> {
    let Some(shared) = g.shared.as_ref().filter(|s| s.is_shared()) else {
        return Ok(false);
    };
    let tokens = reserved_tokens(prepared);
    let ask = crate::limits::Ask {
        status: route.config.overflow(),
        route: &route.config.model,
        class: &class.config.name,
        limits: class.limits,
        priority: prepared.priority,
        deadline: budgets.first_token_deadline,
        team: &tenant.team,
        quota: tenant.limits,
        tokens,
        claim: claim(tenant, prepared),
        fairness: class.config.fairness.unwrap_or_default(),
        admission: &class.admission,
    };
    match shared.admit(ask).await {
        Err(crate::limits::Unavailable) => Ok(false),
        Ok(Ok(admitted)) => {
            // Counted here too, so that this gateway's share starts from it should Redis fail.
            let headers = admitted.headers.unwrap_or_default();
            ex.quota_admitted(tenant.quota.admit_counted(tokens, headers));
            ex.leased(admitted.lease);
            ex.admitted(admitted.permit);
            Ok(true)
        }
        Ok(Err(e)) => {
            if let GatewayError::Overloaded {
                rejection: admission::Rejection::QueueTimeout { waited, .. },
                ..
            } = &e
            {
                ex.waited(*waited);
            }
            Err(e)
        }
    }
}

/// Stage 5: the team's quota, before the class queue, so a team over it never takes a queue
/// place. The request is charged what it may cost at most (see [`reserved_tokens`]).
fn charge_quota(tenant: &Tenant, prepared: &Prepared, ex: &mut Ledger) -> Result<(), GatewayError> {
    let tokens = reserved_tokens(prepared);
    match tenant.quota.admit(tokens) {
        Ok(permit) => {
            ex.quota_admitted(permit);
            Ok(())
        }
        Err(e) => {
            ex.rate_limited(tenant.quota.headers());
            Err(e.into())
        }
    }
}

/// Stage 6: a slot in the class, or a fast refusal with `Retry-After`.
async fn take_slot(
    route: &Route,
    class: &Class,
    tenant: &Tenant,
    prepared: &Prepared,
    budgets: &Budgets,
    ex: &mut Ledger,
) -> Result<(), GatewayError> {
    match class
        .admission
        .acquire(
            prepared.priority,
            budgets.first_token_deadline,
            &claim(tenant, prepared),
        )
        .await
    {
        Ok(permit) => {
            ex.admitted(permit);
            Ok(())
        }
        Err(rejection) => {
            if let admission::Rejection::QueueTimeout { waited, .. } = rejection {
                ex.waited(waited);
            }
            Err(GatewayError::Overloaded {
                status: route.config.overflow(),
                route: route.config.model.clone(),
                class: class.config.name.clone(),
                limits: class.admission.limits(),
                rejection,
            })
        }
    }
}
