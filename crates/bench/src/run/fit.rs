//! Request lengths against the served model's context (`max_model_len` from `/v1/models`): the
//! long mix's default lengths shrink to fit it; lengths given that cannot fit stop the run at once.

use super::{BenchError, Options};
use crate::spec::{LengthDist, Phase};
use crate::workload::Source;

/// The long mix's prompt length when `--long-input-len` is not given, context permitting.
pub const DEFAULT_LONG_INPUT: u32 = 4096;
/// The long mix's output length when `--long-output-len` is not given, context permitting.
pub const DEFAULT_LONG_OUTPUT: u32 = 512;
/// Tokens left free beside a fitted prompt for the chat template's own (role headers, markers).
const TEMPLATE_ROOM: u32 = 64;

/// The long mix's lengths, resolved, and a note for each default that was shortened.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    pub long_input: LengthDist,
    pub long_output: LengthDist,
    pub notes: Vec<String>,
}

/// Fits the long mix's defaults inside `context` and refuses lengths that a server with that
/// context would refuse on every request (prompt + output above it). `None`: the server did not
/// publish its context; the defaults stand.
pub fn fit(opts: &Options, context: Option<u32>) -> Result<Fitted, BenchError> {
    let model = &opts.target.model;
    let fits =
        |input: &LengthDist, output: &LengthDist, ctx: u32| input.bound() + output.bound() <= f64::from(ctx);
    if let (Some(ctx), Source::Synthetic { input, output }) = (context, &opts.workload.source)
        && !fits(input, output, ctx)
    {
        return Err(BenchError::Setup(format!(
            "--input-len {input} and --output-len {output} reach {} tokens, above the context of {model} \
             on this server (max_model_len {ctx} in /v1/models): it would refuse those requests; shorten them",
            input.bound() + output.bound()
        )));
    }
    let mut notes = Vec::new();
    let long_output = opts.long_output.unwrap_or_else(|| {
        let tokens = context.map_or(DEFAULT_LONG_OUTPUT, |ctx| DEFAULT_LONG_OUTPUT.min(ctx / 8).max(1));
        LengthDist::Fixed { tokens }
    });
    let long_input = opts.long_input.unwrap_or_else(|| {
        let room = context.map_or(u32::MAX, |ctx| {
            ctx.saturating_sub(long_output.bound() as u32 + TEMPLATE_ROOM)
                .max(1)
        });
        LengthDist::Fixed {
            tokens: DEFAULT_LONG_INPUT.min(room),
        }
    });
    if opts.phases.contains(&Phase::LongMix)
        && let Some(ctx) = context
    {
        if !fits(&long_input, &long_output, ctx) {
            return Err(BenchError::Setup(format!(
                "--long-input-len {long_input} and --long-output-len {long_output} reach {} tokens, above the \
                 context of {model} on this server (max_model_len {ctx} in /v1/models): it would refuse every \
                 long request; shorten them, or leave them out to have them fitted",
                long_input.bound() + long_output.bound()
            )));
        }
        let defaults = (
            LengthDist::Fixed {
                tokens: DEFAULT_LONG_INPUT,
            },
            LengthDist::Fixed {
                tokens: DEFAULT_LONG_OUTPUT,
            },
        );
        let shortened = (opts.long_input.is_none() && long_input != defaults.0)
            || (opts.long_output.is_none() && long_output != defaults.1);
        if shortened {
            notes.push(format!(
                "long mix: {long_input} tokens in, {long_output} out, to fit the context of {model} \
                 (max_model_len {ctx} in /v1/models; the defaults {DEFAULT_LONG_INPUT} + {DEFAULT_LONG_OUTPUT} do not)"
            ));
        }
    }
    Ok(Fitted {
        long_input,
        long_output,
        notes,
    })
}

/// The long mix's prompt length again, once the server's own count of the prompts is known:
/// `ratio` tokens of its tokenizer for each one asked. A fitted (defaulted) length shrinks to fit
/// the context with the server's tokens; one given on the command line stays, with a note when it
/// no longer fits (vLLM then cuts the output short, or refuses a prompt longer than the context).
pub fn refit(
    fitted: &Fitted,
    opts: &Options,
    context: Option<u32>,
    ratio: f64,
) -> (LengthDist, Option<String>) {
    let input = fitted.long_input;
    let Some(ctx) = context.filter(|_| ratio > 1.0) else {
        return (input, None);
    };
    let output = fitted.long_output.bound();
    let need = input.bound() * ratio + output + f64::from(TEMPLATE_ROOM);
    if need <= f64::from(ctx) {
        return (input, None);
    }
    let room = (f64::from(ctx) - output - f64::from(TEMPLATE_ROOM)).max(1.0);
    let model = &opts.target.model;
    if opts.long_input.is_some() {
        let note = format!(
            "long mix: --long-input-len {input} is about {:.0} tokens with the server's tokenizer ({:.2} per asked token): \
             with {output:.0} out it passes the context of {model} (max_model_len {ctx}); the server cuts those answers \
             short, or refuses a prompt longer than the context",
            input.bound() * ratio,
            ratio
        );
        return (input, Some(note));
    }
    let tokens = ((room / ratio).floor() as u32).max(1);
    let refitted = LengthDist::Fixed { tokens };
    let note = format!(
        "long mix: {refitted} tokens in (asked), about {:.0} with the server's tokenizer ({ratio:.2} per asked token), \
         to fit the context of {model} (max_model_len {ctx}) beside {output:.0} out",
        f64::from(tokens) * ratio
    );
    (refitted, Some(note))
}
