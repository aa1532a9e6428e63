//! Spillway's own config: one route, one class holding this gateway's share of C and Q.

use serde::Serialize;

use super::Human;
use crate::arith::Plan;

#[derive(Serialize)]
pub(super) struct Config<'a> {
    listen: &'a str,
    routes: Vec<Route<'a>>,
}

#[derive(Serialize)]
struct Route<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_model: Option<&'a str>,
    replicas: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
    timeouts: Timeouts,
    classes: Vec<Class<'a>>,
}

/// The answer length the budgets were derived for: capped, and sent when a request gives none.
#[derive(Serialize)]
struct Limits {
    max_tokens: MaxTokens,
}

#[derive(Serialize)]
struct MaxTokens {
    default: u32,
    cap: u32,
}

#[derive(Serialize)]
struct Timeouts {
    connect: Human,
    first_token: Human,
    stream_idle: Human,
    total: Human,
}

#[derive(Serialize)]
struct Class<'a> {
    name: &'a str,
    concurrency: u32,
    queue: u32,
    queue_wait: Human,
    #[serde(skip_serializing_if = "Option::is_none")]
    slo: Option<Slo>,
}

#[derive(Serialize)]
struct Slo {
    #[serde(skip_serializing_if = "Option::is_none")]
    ttft: Option<Human>,
    #[serde(skip_serializing_if = "Option::is_none")]
    itl: Option<Human>,
}

pub(super) fn config(plan: &Plan) -> Config<'_> {
    let n = &plan.names;
    let b = &plan.budgets;
    Config {
        listen: &n.listen,
        routes: vec![Route {
            model: &n.model,
            upstream_model: (n.served_model != n.model).then_some(n.served_model.as_str()),
            replicas: &n.upstreams,
            limits: plan.max_tokens.map(|cap| Limits {
                max_tokens: MaxTokens { default: cap, cap },
            }),
            timeouts: Timeouts {
                connect: Human(b.connect),
                first_token: Human(b.first_token),
                stream_idle: Human(b.stream_idle),
                total: Human(b.total),
            },
            classes: vec![Class {
                name: &n.class,
                concurrency: plan.per_gateway.concurrency,
                queue: plan.per_gateway.queue,
                queue_wait: Human(b.queue_wait),
                slo: plan
                    .slo
                    .filter(|s| s.ttft.is_some() || s.itl.is_some())
                    .map(|s| Slo {
                        ttft: s.ttft.map(Human),
                        itl: s.itl.map(Human),
                    }),
            }],
        }],
    }
}
