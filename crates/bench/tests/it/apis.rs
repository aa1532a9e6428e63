//! Every API the bench drives, against the simulator serving it as vLLM 0.32 does: each record
//! joined to the engine's own by the answer's id, its tokens and first token the engine's.

use std::time::Duration;

use bench::Api;
use bench::load::Stop;
use bench::spec::Phase;

use crate::support::{concurrency, options, paused_engine};

/// The engine's step: every step costs this, whatever its batch.
const STEP: Duration = Duration::from_millis(5);
const OUTPUT: u32 = 12;

/// The engine's sequence number in an answer's id: chat completions' `chatcmpl-…` (which vLLM's
/// Messages API also answers with), the Responses API's `resp_…`, in hexadecimal.
fn sequence(id: &str) -> u64 {
    let hex = id
        .strip_prefix("chatcmpl-")
        .or_else(|| id.strip_prefix("resp_"))
        .or_else(|| id.strip_prefix("cmpl-"))
        .unwrap_or_else(|| panic!("an id the engine did not write: {id}"));
    u64::from_str_radix(hex, 16).unwrap()
}

/// On a paused clock (as `accuracy` does for chat), so that what is checked is the reading of each
/// API's stream, not the machine: 4 clients, 40 requests, every one served; its tokens, prompt
/// tokens, first token and gaps are the engine's.
#[tokio::test(start_paused = true)]
async fn every_api_is_measured_as_the_engine_served_it() {
    for api in Api::ALL {
        let engine = testkit::Engine::start(paused_engine(4, STEP)).await;
        let mut opts = options(&engine.url(), 16, OUTPUT, "ttft_p99=60s");
        opts.target.api = api;
        opts.phases = vec![Phase::Staircase];
        opts.loads = concurrency(&[4]);
        opts.stop = Stop::Requests(40);
        opts.keep_records = true;
        opts.metrics_urls.clear();
        let report = bench::run(opts).await.unwrap();
        assert_eq!(report.parameters.api, api);
        let level = &report.levels[0];
        assert_eq!(level.stats.ok, 40, "{api}: {}", bench::report::table(&report));
        let truth: std::collections::HashMap<u64, engine::RequestRecord> =
            engine.engine.records().into_iter().map(|r| (r.id, r)).collect();
        for rec in level.records.as_ref().unwrap() {
            let id = rec
                .id
                .as_deref()
                .unwrap_or_else(|| panic!("{api}: a record without id"));
            let served = &truth[&sequence(id)];
            assert_eq!(rec.output_tokens, OUTPUT, "{api} {id}");
            assert_eq!(rec.output_tokens, served.output_tokens, "{api} {id}");
            assert_eq!(rec.input_tokens, Some(served.prompt_tokens), "{api} {id}");
            assert_eq!(
                rec.itl_us.len() as u32,
                OUTPUT - 1,
                "{api} {id}: a gap between each two tokens"
            );
            let (client, engine_ttft) = (rec.ttft.unwrap(), served.ttft.unwrap());
            assert!(
                client >= engine_ttft && client - engine_ttft < STEP,
                "{api} {id}: client TTFT {client:?}, the engine's {engine_ttft:?}"
            );
            // Each token is a step after the one before, on the paused clock.
            assert!(
                rec.itl_us
                    .iter()
                    .all(|gap| u128::from(*gap) <= 2 * STEP.as_micros()),
                "{api} {id}: {:?}",
                rec.itl_us
            );
        }
    }
}

/// An engine that holds at most 4 requests (vLLM's `--max-num-queued-reqs`) under 8 clients
/// refuses the rest with 503 in each agent API's own body (Anthropic's envelope on
/// `/v1/messages`): the bench counts them as 503s with the engine's message, and nothing else
/// fails.
#[tokio::test(start_paused = true)]
async fn refusals_in_each_agent_apis_shape_count_as_their_status() {
    for api in [Api::Responses, Api::Messages] {
        let mut cfg = paused_engine(2, STEP);
        cfg.max_num_queued_reqs = Some(4);
        let engine = testkit::Engine::start(cfg).await;
        let mut opts = options(&engine.url(), 16, OUTPUT, "ttft_p99=60s");
        opts.target.api = api;
        opts.phases = vec![Phase::Staircase];
        opts.loads = concurrency(&[8]);
        opts.stop = Stop::Requests(60);
        opts.keep_records = true;
        opts.metrics_urls.clear();
        let report = bench::run(opts).await.unwrap();
        let level = &report.levels[0];
        let records = level.records.as_ref().unwrap();
        let refused: Vec<_> = records.iter().filter(|r| !r.ok()).collect();
        assert!(
            !refused.is_empty() && level.stats.ok > 0,
            "{api}: {}",
            bench::report::table(&report)
        );
        for r in refused {
            assert_eq!(r.outcome.kind(), "http_503", "{api}: {r:?}");
            let message = r.error.as_deref().unwrap_or_default();
            assert!(
                message.contains("The engine is currently busy"),
                "{api}: {message}"
            );
        }
    }
}
