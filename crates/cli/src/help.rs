//! Shell completions and the man page, made from the same clap definition
//! as `--help`, so they cannot drift from it.

use std::io::Write as _;

use clap::CommandFactory;

use crate::Cli;

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut Cli::command(), "dedupkv", &mut out);
    out.flush().map_err(|e| format!("stdout: {e}"))
}

/// Writes the man page (roff, section 1) to stdout.
pub fn man() -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(Cli::command())
        .render(&mut out)
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))
}
