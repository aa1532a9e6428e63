//! `spillway completions SHELL`: the shell's completion script for every command and flag.

use clap::Args;
use clap_complete::Shell;

#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

/// Writes the script to stdout, generated from the same definitions `--help` reads, so it cannot
/// fall behind the flags.
pub(crate) fn print(args: &CompletionsArgs, cli: &mut clap::Command) {
    clap_complete::generate(args.shell, cli, "spillway", &mut std::io::stdout());
}
