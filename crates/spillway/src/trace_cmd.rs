//! `spillway trace`: a trace (the gateway's access log, Mooncake JSONL, the Azure CSV) converted
//! into another format or summarised.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use trace::{Format, Summary, Trace};

#[derive(Args, Debug)]
pub(crate) struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(Subcommand, Debug)]
enum TraceCommand {
    /// Print what a trace holds: arrivals per second, input and output lengths, prefix reuse, and
    /// (from an access log) classes, teams and refusals.
    Summary {
        #[command(flatten)]
        input: Input,
        /// The summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a trace in another format (to standard output unless --output).
    Convert {
        #[command(flatten)]
        input: Input,
        /// access-log, mooncake or azure.
        #[arg(long)]
        to: Format,
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

/// A trace file and how to read it.
#[derive(Args, Debug)]
pub(crate) struct Input {
    /// The trace: a gateway access log, a Mooncake JSONL file or an Azure CSV file.
    file: PathBuf,
    /// Its format (access-log, mooncake or azure); by default, told from its first line.
    #[arg(long)]
    format: Option<Format>,
    /// Prompt tokens per hash id in a Mooncake file (Mooncake's 512 by default).
    #[arg(long)]
    block_size: Option<u32>,
}

/// Reads a trace file, its format given or told from its first line.
pub(crate) fn load(file: &Path, format: Option<Format>, block_size: Option<u32>) -> Result<Trace> {
    let open = || File::open(file).with_context(|| format!("cannot open {}", file.display()));
    let format = match format {
        Some(f) => f,
        None => {
            let mut first = String::new();
            BufReader::new(open()?)
                .take(trace::MAX_LINE_BYTES as u64)
                .read_line(&mut first)
                .with_context(|| format!("cannot read {}", file.display()))?;
            Format::sniff(&first).with_context(|| {
                format!(
                    "{}: cannot tell its format from the first line; give --format ({})",
                    file.display(),
                    Format::NAMES
                )
            })?
        }
    };
    trace::format::read(format, BufReader::new(open()?), block_size)
        .with_context(|| format!("{} ({})", file.display(), format.name()))
}

pub(crate) fn run(args: &TraceArgs) -> Result<()> {
    match &args.command {
        TraceCommand::Summary { input, json } => {
            let t = load(&input.file, input.format, input.block_size)?;
            let s = Summary::of(&t);
            let mut out = std::io::stdout().lock();
            if *json {
                serde_json::to_writer_pretty(&mut out, &s)?;
                writeln!(out)?;
            } else {
                write!(out, "{s}")?;
            }
        }
        TraceCommand::Convert { input, to, output } => {
            let t = load(&input.file, input.format, input.block_size)?;
            let mut out: Box<dyn Write> = match output {
                Some(p) => Box::new(BufWriter::new(
                    File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
                )),
                None => Box::new(BufWriter::new(std::io::stdout().lock())),
            };
            trace::format::write(&t, *to, &mut out)?;
            out.flush()?;
            for s in &t.skipped {
                eprintln!("left out: {s}");
            }
        }
    }
    Ok(())
}
