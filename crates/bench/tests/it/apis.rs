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

/// The prefix of the answer's id in each API: chat completions' `chatcmpl-` (which vLLM's
/// Messages API also answers with), completions' `cmpl-`, the Responses API's `resp_`.
fn id_prefix(api: Api) -> &'static str {
    match api {
        Api::Chat | Api::Messages => "chatcmpl-",
        Api::Completions => "cmpl-",
        Api::Responses => "resp_",
    }
}

/// On a paused clock (as `accuracy` does for chat), so that what is checked is the reading of each
/// API's stream, not the machine: 4 clients, 40 requests, every one served; its tokens, prompt
/// tokens, first token and gaps are the engine's. The Responses API's ids are random, as vLLM's
/// are, so the client's first tokens are held against the engine's in order rather than by id:
/// when each client TTFT lies within a step after its own request's, the sorted lists do too.
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
        // The bench's first request asks for 2 tokens; the level's, OUTPUT each.
        let served: Vec<engine::RequestRecord> = engine
            .engine
            .records()
            .into_iter()
            .filter(|r| r.output_tokens == OUTPUT)
            .collect();
        let records = level.records.as_ref().unwrap();
        assert_eq!(served.len(), records.len(), "{api}");
        let mut ids = std::collections::HashSet::new();
        for rec in records {
            let id = rec
                .id
                .as_deref()
                .unwrap_or_else(|| panic!("{api}: a record without id"));
            assert!(id.starts_with(id_prefix(api)) && ids.insert(id), "{api}: {id}");
            assert_eq!(rec.output_tokens, OUTPUT, "{api} {id}");
            assert_eq!(rec.input_tokens, Some(served[0].prompt_tokens), "{api} {id}");
            assert_eq!(
                rec.itl_us.len() as u32,
                OUTPUT - 1,
                "{api} {id}: a gap between each two tokens"
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
        let mut client: Vec<Duration> = records.iter().map(|r| r.ttft.unwrap()).collect();
        let mut truth: Vec<Duration> = served.iter().map(|r| r.ttft.unwrap()).collect();
        client.sort();
        truth.sort();
        for (c, t) in client.iter().zip(&truth) {
            assert!(
                *c >= *t && *c - *t < STEP,
                "{api}: client TTFT {c:?}, the engine's {t:?}"
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
