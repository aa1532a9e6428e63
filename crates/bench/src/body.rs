//! The request each API is sent, streamed: one user turn of the prompt's text and its output cap,
//! in the API's own field names, with the headers that API's clients send.

use bytes::Bytes;
use serde::Serialize;

use crate::request::{Api, Target};
use crate::workload::Prompt;

/// The Messages API's version header, as the `anthropic` SDK sends it (vLLM does not read it; an
/// Anthropic-speaking gateway may).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `prompt` as `target`'s API asks for it.
pub fn body(target: &Target, prompt: &Prompt) -> Bytes {
    let text: &str = &prompt.text;
    let user = [Turn {
        role: "user",
        content: text,
    }];
    let ignore_eos = target.ignore_eos.then_some(true);
    let model = &target.model;
    let max = prompt.max_tokens;
    let written = match target.api {
        Api::Chat | Api::Completions => {
            let chat = target.api == Api::Chat;
            serde_json::to_vec(&OpenAi {
                model,
                messages: chat.then_some(&user),
                prompt: (!chat).then_some(text),
                max_tokens: max,
                stream: true,
                stream_options: StreamOptions { include_usage: true },
                ignore_eos,
            })
        }
        Api::Responses => serde_json::to_vec(&Responses {
            model,
            input: text,
            max_output_tokens: max,
            stream: true,
            ignore_eos,
        }),
        // vLLM 0.32 drops `ignore_eos` here (Anthropic's request has no such field): its answers
        // may end before `max_tokens`; the simulator honours it.
        Api::Messages => serde_json::to_vec(&Messages {
            model,
            messages: &user,
            max_tokens: max,
            stream: true,
            ignore_eos,
        }),
    };
    // Strings and numbers always serialise.
    Bytes::from(written.unwrap_or_default())
}

/// The headers a request of `api` carries besides its content type: the key as a bearer token
/// (what vLLM checks, on every route) and, for Messages, as `x-api-key` too, with the version, as
/// the `anthropic` SDK sends them.
pub fn headers(api: Api, key: Option<&str>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(key) = key {
        out.push(("authorization", format!("Bearer {key}")));
        if api == Api::Messages {
            out.push(("x-api-key", key.to_owned()));
        }
    }
    if api == Api::Messages {
        out.push(("anthropic-version", ANTHROPIC_VERSION.to_owned()));
    }
    out
}

#[derive(Serialize)]
struct OpenAi<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<&'a [Turn<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a str>,
    max_tokens: u32,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignore_eos: Option<bool>,
}

#[derive(Serialize)]
struct Responses<'a> {
    model: &'a str,
    input: &'a str,
    max_output_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignore_eos: Option<bool>,
}

#[derive(Serialize)]
struct Messages<'a> {
    model: &'a str,
    messages: &'a [Turn<'a>; 1],
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignore_eos: Option<bool>,
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'a str,
    content: &'a str,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::time::Duration;

    fn target(api: Api) -> Target {
        Target {
            url: "http://x".into(),
            model: "m".into(),
            api_key: None,
            api,
            ignore_eos: true,
            timeout: Duration::from_secs(1),
            ca_cert: None,
        }
    }

    fn sent(api: Api) -> Value {
        let prompt = Prompt {
            text: "hi there".into(),
            max_tokens: 7,
            long: false,
            input_tokens: None,
        };
        serde_json::from_slice(&body(&target(api), &prompt)).unwrap()
    }

    #[test]
    fn each_api_gets_its_own_fields() {
        let user = json!([{"role": "user", "content": "hi there"}]);
        let usage = json!({"include_usage": true});
        assert_eq!(
            sent(Api::Chat),
            json!({"model": "m", "messages": user, "max_tokens": 7, "stream": true, "stream_options": usage, "ignore_eos": true})
        );
        assert_eq!(
            sent(Api::Completions),
            json!({"model": "m", "prompt": "hi there", "max_tokens": 7, "stream": true, "stream_options": usage, "ignore_eos": true})
        );
        assert_eq!(
            sent(Api::Responses),
            json!({"model": "m", "input": "hi there", "max_output_tokens": 7, "stream": true, "ignore_eos": true})
        );
        assert_eq!(
            sent(Api::Messages),
            json!({"model": "m", "messages": user, "max_tokens": 7, "stream": true, "ignore_eos": true})
        );
    }

    #[test]
    fn messages_carry_the_key_both_ways_and_the_version() {
        let names = |api, key| headers(api, key).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(names(Api::Chat, Some("k")), ["authorization"]);
        assert!(names(Api::Responses, None).is_empty());
        assert_eq!(
            names(Api::Messages, Some("k")),
            ["authorization", "x-api-key", "anthropic-version"]
        );
        assert_eq!(headers(Api::Messages, Some("k"))[1].1, "k");
        assert_eq!(names(Api::Messages, None), ["anthropic-version"]);
    }
}
