//! `spillway key`: a new API key and the `key_sha256` line the configuration holds for it.

use anyhow::{Context, Result};
use clap::Args;
use std::io::Read;

#[derive(Args, Debug)]
pub(crate) struct KeyArgs {
    /// Hash a key read from standard input instead of making one (for keys issued elsewhere).
    #[arg(long)]
    hash: bool,
}

pub(crate) fn run(args: &KeyArgs) -> Result<()> {
    if args.hash {
        let mut key = String::new();
        std::io::stdin()
            .read_to_string(&mut key)
            .context("cannot read the key from standard input")?;
        let key = key.trim_end_matches(['\n', '\r']);
        anyhow::ensure!(!key.is_empty(), "no key on standard input");
        println!("{}", gateway::key_sha256(key));
        return Ok(());
    }
    let key = gateway::new_key();
    println!("key:        {key}");
    println!("key_sha256: {}", gateway::key_sha256(&key));
    eprintln!(
        "The key is shown only this once: give it to the team. The configuration holds only its hash:\n  tenants:\n    - team: <team>\n      key_sha256: [ \"{}\" ]",
        gateway::key_sha256(&key)
    );
    Ok(())
}
