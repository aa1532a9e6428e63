//! The four rows on one screen: user impact, generation, engine, infrastructure, over one window.

use crate::catalog::{Found, Key};
use crate::window::{Agg, Distribution, Level, Series, Window};
use serde::Serialize;

/// Success, errors, latency and cancellations as users see them (the gateway's view when there is
/// one, else the engines').
#[derive(Debug, Clone, Default, Serialize)]
pub struct UserImpact {
    /// `gateway` or `engine`: whose counters these are.
    pub seen_at: Option<&'static str>,
    pub requests_per_s: Option<f64>,
    pub success_ratio: Option<f64>,
    pub status_429_per_s: Option<f64>,
    pub status_5xx_per_s: Option<f64>,
    /// 504s and streams cut by a deadline or an idle timeout.
    pub timeouts_per_s: Option<f64>,
    /// Clients that left: the gateway's count; `None` where only engines are seen and they did
    /// not count any (vLLM 0.32 counts no abort, so a 0 there says nothing).
    pub cancellations_per_s: Option<f64>,
    /// (429 + 5xx) / requests.
    pub error_ratio: Option<f64>,
    /// Requests inside their class's TTFT and ITL objectives / requests measured: the goodput
    /// of the admitted requests that completed, not of all requests (refusals are not measured).
    pub goodput_ratio: Option<f64>,
    /// (429 + 5xx − refused by design) / (requests − refused by design): the errors of the
    /// requests the gateway let in. Equals `error_ratio` where nothing was refused by design.
    pub admitted_error_ratio: Option<f64>,
    /// Refused by design / requests answered (the refusals are among the 429s and 503s).
    pub refused_by_design_ratio: Option<f64>,
    /// The refusals by design in the window, by reason and team, largest first.
    pub refused: Vec<Refused>,
    pub latency: Option<Distribution>,
}

/// The reasons of `spillway_rejections_total` that are the configured limits doing their job:
/// the class's queue full or its wait run out, a predicted wait over the objective, a sheddable
/// request shed or predicted to miss its own objectives, a tenant over its quota. Anything else
/// refused is a failure, not a design.
pub const DESIGNED_REFUSALS: &[&str] = &[
    "queue_full",
    "queue_timeout",
    "predicted_wait",
    "shed",
    "slo_unattainable",
    "tenant_parallel",
    "tenant_rpm",
    "tenant_tpm",
];

/// Requests refused by design for one reason (and one team, where tenants are configured).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Refused {
    pub reason: String,
    pub team: Option<String>,
    /// Refused in the window.
    pub requests: f64,
    /// Of all the requests answered in the window.
    pub share: Option<f64>,
}

/// "queue_full 30.0%, rate_limit team a 5.0%": who was refused and their share, `pct` writing a
/// share as the caller's text does.
pub(crate) fn refused_by(refused: &[Refused], pct: impl Fn(Option<f64>) -> String) -> String {
    let by: Vec<String> = refused
        .iter()
        .map(|x| match &x.team {
            Some(t) => format!("{} team {t} {}", x.reason, pct(x.share)),
            None => format!("{} {}", x.reason, pct(x.share)),
        })
        .collect();
    by.join(", ")
}

/// Time to first token, gaps between tokens, and the tokens themselves.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Generation {
    pub gateway_ttft: Option<Distribution>,
    pub engine_ttft: Option<Distribution>,
    pub gateway_itl: Option<Distribution>,
    pub engine_itl: Option<Distribution>,
    pub prompt_tokens_per_s: Option<f64>,
    pub generation_tokens_per_s: Option<f64>,
    pub prompt_tokens_per_request: Option<f64>,
    pub output_tokens_per_request: Option<f64>,
}

/// The scheduler's state: who runs, who waits and for how long, and the KV cache.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineRow {
    pub running: Option<Level>,
    pub waiting: Option<Level>,
    pub queue_time: Option<Distribution>,
    pub prefill_time: Option<Distribution>,
    pub decode_time: Option<Distribution>,
    /// Highest KV-cache usage of any replica (0–1).
    pub kv_usage: Option<Level>,
    /// The KV cache's blocks, summed over the engines that say (vLLM's `cache_config_info`).
    pub kv_blocks: Option<f64>,
    pub preemptions: Option<f64>,
    pub prefix_hit_ratio: Option<f64>,
    /// Requests the engines finished in the window.
    pub finished: Option<f64>,
    /// The gateway's own admission queue, in front of the engines.
    pub gateway_queued: Option<Level>,
    pub gateway_queue_wait: Option<Distribution>,
    /// How long the oldest request waiting in the gateway's queue has waited (the longest of any
    /// class): the age of what waits, now.
    pub gateway_oldest_wait: Option<Level>,
    pub gateway_in_flight: Option<Level>,
    pub gateway_concurrency_limit: Option<f64>,
    /// Requests the gateway refused because its queue was full or their wait ran out.
    pub gateway_overflow: Option<f64>,
    /// Requests the engines refused at their own queue limit (vLLM's `--max-num-queued-reqs`
    /// or `--max-num-queued-tokens`).
    pub engine_overflow: Option<f64>,
}

/// Targets, replicas, restarts and the GPUs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Infrastructure {
    pub targets_up: usize,
    pub targets_down: Vec<String>,
    pub replicas_healthy: Option<Level>,
    pub replicas_known: Option<usize>,
    /// Targets whose counters went back (their process restarted inside the window).
    pub restarted: Vec<String>,
    /// Mean `DCGM_FI_DEV_GPU_UTIL` across GPUs, as a ratio.
    pub gpu_util: Option<Level>,
    pub gpu_engine_active: Option<Level>,
    pub fb_used_mib: Option<f64>,
    pub fb_total_mib: Option<f64>,
    /// The last XID of any GPU (0: none).
    pub xid: Option<f64>,
    /// Double-bit ECC errors at the end, and how many appeared in the window.
    pub ecc_dbe: Option<Level>,
}

/// The four rows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rows {
    pub user_impact: UserImpact,
    pub generation: Generation,
    pub engine: EngineRow,
    pub infrastructure: Infrastructure,
}

/// Reads a window through the names discovery found.
pub(crate) struct Reader<'a> {
    pub(crate) w: &'a Window<'a>,
    pub(crate) found: &'a [Found],
}

impl Reader<'_> {
    pub(crate) fn name(&self, key: Key) -> Option<&'static str> {
        self.found.iter().find(|f| f.key == key).and_then(|f| f.name)
    }

    fn level(&self, key: Key, agg: Agg) -> Option<Level> {
        self.w.level(self.name(key)?, agg)
    }

    fn increase(&self, key: Key, keep: impl Fn(&Series) -> bool) -> Option<f64> {
        self.w.increase(self.name(key)?, keep)
    }

    fn rate(&self, key: Key, keep: impl Fn(&Series) -> bool) -> Option<f64> {
        let secs = self.w.secs();
        self.increase(key, keep).filter(|_| secs > 0.0).map(|v| v / secs)
    }

    fn dist(&self, key: Key) -> Option<Distribution> {
        self.w.distribution(self.name(key)?)
    }
}

fn status_is(s: &Series, pred: impl Fn(&str) -> bool) -> bool {
    s.label("status").is_some_and(pred)
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

pub(crate) fn build(r: &Reader<'_>) -> Rows {
    Rows {
        user_impact: user_impact(r),
        generation: generation(r),
        engine: engine(r),
        infrastructure: infrastructure(r),
    }
}

fn user_impact(r: &Reader<'_>) -> UserImpact {
    if r.name(Key::GwRequests).is_some() {
        let all = r.rate(Key::GwRequests, |_| true);
        let ok = r.rate(Key::GwRequests, |s| status_is(s, |v| v.starts_with('2')));
        let r429 = r.rate(Key::GwRequests, |s| status_is(s, |v| v == "429"));
        let r5xx = r.rate(Key::GwRequests, |s| status_is(s, |v| v.starts_with('5')));
        let r504 = r
            .rate(Key::GwRequests, |s| status_is(s, |v| v == "504"))
            .unwrap_or(0.0);
        let cut = r
            .rate(Key::GwCancellations, |s| {
                // The gateway's words since issue 36, and `deadline` from gateways before it.
                matches!(
                    s.label("reason"),
                    Some("deadline" | "first_token_timeout" | "deadline_exceeded" | "stream_idle_timeout")
                )
            })
            .unwrap_or(0.0);
        let gone = r.rate(Key::GwCancellations, |s| {
            s.label("reason") == Some("client_disconnect")
        });
        let errors = Some(r429.unwrap_or(0.0) + r5xx.unwrap_or(0.0));
        let refused = refused(r, all);
        let secs = r.w.secs();
        let designed = (secs > 0.0).then(|| refused.iter().map(|x| x.requests).sum::<f64>() / secs);
        let admitted_errors = errors.zip(designed).map(|(e, d)| (e - d).max(0.0));
        let admitted = all.zip(designed).map(|(a, d)| (a - d).max(0.0));
        return UserImpact {
            seen_at: Some("gateway"),
            requests_per_s: all,
            success_ratio: ratio(ok, all),
            status_429_per_s: r429,
            status_5xx_per_s: r5xx,
            timeouts_per_s: Some(r504 + cut),
            cancellations_per_s: gone,
            error_ratio: ratio(errors, all),
            admitted_error_ratio: ratio(admitted_errors, admitted),
            refused_by_design_ratio: ratio(designed, all),
            refused,
            goodput_ratio: ratio(
                r.increase(Key::GwGoodput, |_| true),
                r.increase(Key::GwSloRequests, |_| true),
            ),
            latency: r.dist(Key::GwDuration),
        };
    }
    if r.name(Key::RequestSuccess).is_some() {
        let reason = |want: &'static [&'static str]| {
            move |s: &Series| s.label("finished_reason").is_some_and(|v| want.contains(&v))
        };
        let finished = r.rate(Key::RequestSuccess, |_| true);
        let ok = r.rate(Key::RequestSuccess, reason(&["stop", "length", "repetition"]));
        let failed = r.rate(Key::RequestSuccess, reason(&["error"]));
        // vLLM's refusals at its own queue limits (a 503) are requests too, refused by design:
        // `--max-num-queued-reqs` is a limit the operator set.
        let refused = engine_refused(r, finished);
        let secs = r.w.secs();
        let designed = (secs > 0.0).then(|| refused.iter().map(|x| x.requests).sum::<f64>() / secs);
        let all = finished.map(|f| f + designed.unwrap_or(0.0));
        let errors = failed.map(|f| f + designed.unwrap_or(0.0));
        // A gateway's own count where it is scraped; else the engines' aborts only where they
        // counted some (releases before 0.32 did): vLLM 0.32 leaves `abort` at 0 whatever happens.
        let cancellations = r
            .rate(Key::GwCancellations, |s| {
                s.label("reason") == Some("client_disconnect")
            })
            .or_else(|| {
                r.rate(Key::RequestSuccess, reason(&["abort"]))
                    .filter(|v| *v > 0.0)
            });
        return UserImpact {
            seen_at: Some("engine"),
            requests_per_s: all,
            success_ratio: ratio(ok, all),
            status_5xx_per_s: errors,
            cancellations_per_s: cancellations,
            error_ratio: ratio(errors, all),
            admitted_error_ratio: ratio(failed, finished),
            refused_by_design_ratio: ratio(designed, all),
            refused,
            latency: r.dist(Key::E2e),
            ..UserImpact::default()
        };
    }
    UserImpact::default()
}

/// A team worth naming: the gateway labels every request `anonymous` when no tenants are
/// configured, which says nothing about who was refused.
fn named_team(t: &str) -> bool {
    !t.is_empty() && t != "anonymous"
}

/// The engines' refusals at their queue limits in the window, by reason (`vllm:` before it, so
/// the reason says whose limit), largest first.
fn engine_refused(r: &Reader<'_>, finished_per_s: Option<f64>) -> Vec<Refused> {
    let Some(name) = r.name(Key::EngineRejections) else {
        return Vec::new();
    };
    let mut reasons: Vec<&str> = r.w.end.named(name).filter_map(|s| s.label("reason")).collect();
    reasons.sort_unstable();
    reasons.dedup();
    let secs = r.w.secs();
    let counted: Vec<(&str, f64)> = reasons
        .into_iter()
        .filter_map(|reason| {
            let n = r.increase(Key::EngineRejections, |s| s.label("reason") == Some(reason))?;
            (n > 0.0).then_some((reason, n))
        })
        .collect();
    let all = finished_per_s.map(|f| f * secs + counted.iter().map(|(_, n)| n).sum::<f64>());
    let mut out: Vec<Refused> = counted
        .into_iter()
        .map(|(reason, n)| Refused {
            reason: format!("vllm:{reason}"),
            team: None,
            requests: n,
            share: ratio(Some(n), all),
        })
        .collect();
    out.sort_by(|a, b| b.requests.total_cmp(&a.requests));
    out
}

/// The gateways' C, summed over routes and classes. Gateways that share their limits through
/// Redis (they export `spillway_limits_mode`) each report the whole shared C: counted once, not
/// once per gateway; gateways on their own each add theirs.
fn gateway_concurrency(r: &Reader<'_>) -> Option<f64> {
    let name = r.name(Key::GwConcurrencyLimit)?;
    let shared: std::collections::HashSet<&str> =
        r.w.end
            .named("spillway_limits_mode")
            .filter_map(|s| s.label("instance"))
            .collect();
    let mut by_class: std::collections::BTreeMap<(&str, &str), (f64, f64)> = Default::default();
    for s in r.w.end.named(name) {
        let key = (s.label("route").unwrap_or(""), s.label("class").unwrap_or(""));
        let (most_shared, own) = by_class.entry(key).or_default();
        if s.label("instance").is_some_and(|i| shared.contains(i)) {
            *most_shared = most_shared.max(s.value);
        } else {
            *own += s.value;
        }
    }
    (!by_class.is_empty()).then(|| by_class.values().map(|(s, o)| s + o).sum())
}

/// The gateway's refusals by design in the window, by reason and team, largest first.
fn refused(r: &Reader<'_>, all_per_s: Option<f64>) -> Vec<Refused> {
    let Some(name) = r.name(Key::GwRejections) else {
        return Vec::new();
    };
    let mut keys: Vec<(String, Option<String>)> =
        r.w.end
            .series
            .iter()
            .filter(|s| s.name == name)
            .filter_map(|s| {
                let reason = s.label("reason").filter(|v| DESIGNED_REFUSALS.contains(v))?;
                let team = s.label("team").filter(|t| named_team(t)).map(str::to_owned);
                Some((reason.to_owned(), team))
            })
            .collect();
    keys.sort();
    keys.dedup();
    let all = all_per_s.map(|v| v * r.w.secs());
    let mut out: Vec<Refused> = keys
        .into_iter()
        .filter_map(|(reason, team)| {
            let n = r.increase(Key::GwRejections, |s| {
                s.label("reason") == Some(reason.as_str())
                    && s.label("team").filter(|t| named_team(t)) == team.as_deref()
            })?;
            (n > 0.0).then(|| Refused {
                share: ratio(Some(n), all),
                reason,
                team,
                requests: n,
            })
        })
        .collect();
    out.sort_by(|a, b| b.requests.total_cmp(&a.requests));
    out
}

fn generation(r: &Reader<'_>) -> Generation {
    let finished = r.increase(Key::RequestSuccess, |_| true);
    Generation {
        gateway_ttft: r.dist(Key::GwTtft),
        engine_ttft: r.dist(Key::Ttft),
        gateway_itl: r.dist(Key::GwItl),
        engine_itl: r.dist(Key::Itl),
        prompt_tokens_per_s: r.rate(Key::PromptTokens, |_| true),
        generation_tokens_per_s: r.rate(Key::GenerationTokens, |_| true),
        prompt_tokens_per_request: ratio(r.increase(Key::PromptTokens, |_| true), finished),
        output_tokens_per_request: ratio(r.increase(Key::GenerationTokens, |_| true), finished),
    }
}

fn engine(r: &Reader<'_>) -> EngineRow {
    EngineRow {
        running: r.level(Key::Running, Agg::Sum),
        waiting: r.level(Key::Waiting, Agg::Sum),
        queue_time: r.dist(Key::QueueTime),
        prefill_time: r.dist(Key::PrefillTime),
        decode_time: r.dist(Key::DecodeTime),
        kv_usage: r.level(Key::KvUsage, Agg::Max),
        kv_blocks: r.name(Key::CacheConfig).and_then(|name| {
            let blocks =
                r.w.end
                    .named(name)
                    .filter_map(|s| s.label("num_gpu_blocks")?.parse::<f64>().ok());
            blocks.fold(None, |sum, b| Some(sum.unwrap_or(0.0) + b))
        }),
        preemptions: r.increase(Key::Preemptions, |_| true),
        prefix_hit_ratio: ratio(
            r.increase(Key::PrefixHits, |_| true),
            r.increase(Key::PrefixQueries, |_| true),
        ),
        finished: r.increase(Key::RequestSuccess, |_| true),
        gateway_queued: r.level(Key::GwQueued, Agg::Sum),
        gateway_oldest_wait: r.level(Key::GwOldestWait, Agg::Max),
        gateway_queue_wait: r.dist(Key::GwQueueWait),
        gateway_in_flight: r.level(Key::GwInFlight, Agg::Sum),
        gateway_concurrency_limit: gateway_concurrency(r),
        engine_overflow: r.increase(Key::EngineRejections, |_| true),
        gateway_overflow: r.increase(Key::GwRejections, |s| {
            matches!(s.label("reason"), Some("queue_full" | "queue_timeout"))
        }),
    }
}

fn infrastructure(r: &Reader<'_>) -> Infrastructure {
    let up = r.w.end.up_instances();
    let mut down: Vec<String> =
        r.w.end
            .series
            .iter()
            .filter(|s| s.name == "up" && s.value != 1.0)
            .filter_map(|s| s.label("instance").map(str::to_owned))
            .collect();
    down.sort();
    let fb_used = r.level(Key::FbUsed, Agg::Sum).map(|l| l.end);
    let fb_free = r.level(Key::FbFree, Agg::Sum).map(|l| l.end);
    let percent = |l: Level| Level {
        start: l.start.map(|v| v / 100.0),
        end: l.end / 100.0,
    };
    Infrastructure {
        targets_up: up.len(),
        targets_down: down,
        replicas_healthy: r.level(Key::GwReplicaHealthy, Agg::Sum),
        replicas_known: r
            .name(Key::GwReplicaHealthy)
            .map(|n| r.w.end.series.iter().filter(|s| s.name == n).count()),
        restarted: r.w.restarted_instances(),
        gpu_util: r.level(Key::GpuUtil, Agg::Mean).map(percent),
        gpu_engine_active: r.level(Key::GrEngineActive, Agg::Mean),
        fb_used_mib: fb_used,
        fb_total_mib: fb_used.zip(fb_free).map(|(u, f)| u + f),
        xid: r.level(Key::Xid, Agg::Max).map(|l| l.end),
        ecc_dbe: r.level(Key::EccDbe, Agg::Sum),
    }
}
