//! Shell completions and the man page, made from the same clap definition
//! as `--help`, so they cannot drift from it.

use std::io::Write as _;
use std::path::Path;

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

/// Writes one man page per command into `dir` (which must exist):
/// `dedupkv.1`, and `dedupkv-SUB.1` for each subcommand at every level;
/// says on stderr how many.
pub fn man_pages(dir: &Path) -> Result<(), String> {
    if !dir.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    clap_mangen::generate_to(Cli::command(), dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    eprintln!("dedupkv man: pages written to {}", dir.display());
    Ok(())
}
