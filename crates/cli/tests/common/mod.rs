//! What the tests of the built binary share: running it, reading its
//! `--json`.

use std::process::{Command, Output};

use serde_json::Value;

/// Runs the built `dedupkv` with `args`.
pub fn dedupkv(args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_dedupkv"))
        .args(args)
        .output()
}

/// The command's `--json` output, once it succeeded (else its stderr).
pub fn json(out: &Output) -> Result<Value, Box<dyn std::error::Error>> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}
