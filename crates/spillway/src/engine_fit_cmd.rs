//! `spillway engine fit`: a cost model fitted to a bench run of a real engine, written for
//! `spillway engine --cost-model` and `spillway plan --simulate --cost-model`.

use anyhow::{Context, Result};
use clap::Args;
use engine::fit::{FitOptions, fit, samples_from_bench_json};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct FitArgs {
    /// The bench's JSON result, written with `--json FILE --records`.
    bench: PathBuf,
    /// Where to write the cost model (JSON, schema spillway-cost-model/1).
    #[arg(long, short, value_name = "FILE")]
    out: PathBuf,
    /// The measured engine's --max-num-batched-tokens: a longer prompt's prefill took several steps.
    #[arg(long, default_value_t = 8192)]
    max_num_batched_tokens: u32,
}

pub(crate) fn run(args: &FitArgs) -> Result<()> {
    let shown = args.bench.display();
    let text = std::fs::read_to_string(&args.bench).with_context(|| format!("cannot read {shown}"))?;
    let samples = samples_from_bench_json(&text).with_context(|| format!("{shown}"))?;
    let options = FitOptions {
        max_num_batched_tokens: args.max_num_batched_tokens,
    };
    let fitted = fit(&samples, options).with_context(|| format!("{shown}"))?;
    print!("{}", fitted.render());
    let source = format!(
        "spillway engine fit {shown} ({} requests; --max-num-batched-tokens {})",
        samples.len(),
        args.max_num_batched_tokens
    );
    let file = fitted.file(source, options);
    std::fs::write(&args.out, file.to_json())
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}
