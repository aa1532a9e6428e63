//! `spillway completions SHELL`: the shell's completion script for every command and flag.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use clap_complete::Shell;

#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

/// Writes the script to stdout, generated from the same definitions `--help` reads, so it cannot
/// fall behind the flags. Built in memory first: clap_complete panics on a failed write, and a
/// reader that stops early (`| head`) is no error.
pub(crate) fn print(args: &CompletionsArgs, cli: &mut clap::Command) -> ExitCode {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, cli, "spillway", &mut script);
    match std::io::stdout().write_all(&script) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spillway: cannot write the completion script: {e}");
            ExitCode::from(2)
        }
    }
}
