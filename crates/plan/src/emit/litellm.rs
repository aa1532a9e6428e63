//! A LiteLLM proxy `model_list` entry: the deployment's parallel cap and its two timeouts.

use serde::Serialize;

use crate::arith::Plan;

#[derive(Serialize)]
pub(super) struct Config<'a> {
    model_list: Vec<Deployment<'a>>,
}

#[derive(Serialize)]
struct Deployment<'a> {
    model_name: &'a str,
    litellm_params: Params<'a>,
}

#[derive(Serialize)]
struct Params<'a> {
    /// `openai/<name>`: the gateway speaks the OpenAI API and routes on the public name.
    model: String,
    api_base: &'a str,
    /// The gateway in front needs no provider key; a tenant key would come from the environment.
    api_key: &'a str,
    max_parallel_requests: u32,
    /// Seconds for the whole response.
    timeout: f64,
    /// Seconds until a stream's first chunk.
    stream_timeout: f64,
}

pub(super) fn config(plan: &Plan) -> Config<'_> {
    let n = &plan.names;
    Config {
        model_list: vec![Deployment {
            model_name: &n.model,
            litellm_params: Params {
                model: format!("openai/{}", n.model),
                api_base: &n.api_base,
                api_key: "none",
                max_parallel_requests: plan.litellm_max_parallel,
                timeout: plan.budgets.litellm_timeout.as_secs_f64(),
                stream_timeout: plan.budgets.litellm_stream_timeout.as_secs_f64(),
            },
        }],
    }
}
