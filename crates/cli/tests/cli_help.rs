//! `dedupkv completions SHELL` and `dedupkv man` print, on stdout, a script
//! and a page that name the subcommands (made from the clap definition,
//! so a new subcommand is in them without more work).

type TestResult = Result<(), Box<dyn std::error::Error>>;

// Shared with the other tests; this one reads no `--json`.
#[allow(dead_code)]
mod common;
use common::dedupkv;

/// Subcommands every output must name.
const NAMED: [&str; 6] = ["get", "stats", "keys", "filter", "replica", "dead-letters"];

#[test]
fn completions_name_the_subcommands_for_each_shell() -> TestResult {
    for shell in ["bash", "zsh", "fish"] {
        let out = dedupkv(&["completions", shell])?;
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8(out.stdout)?;
        for sub in NAMED {
            assert!(script.contains(sub), "{shell}: no `{sub}` in the script");
        }
        assert!(script.contains("dedupkv"), "{shell}");
    }
    // An unknown shell is a usage error.
    assert_eq!(dedupkv(&["completions", "tcsh"])?.status.code(), Some(2));
    Ok(())
}

#[test]
fn the_man_page_is_roff_and_names_the_subcommands() -> TestResult {
    let out = dedupkv(&["man"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = String::from_utf8(out.stdout)?;
    assert!(
        page.starts_with(".ie") || page.contains(".TH dedupkv"),
        "{page}"
    );
    for sub in NAMED {
        // roff escapes `-` as `\-`.
        let escaped = sub.replace('-', "\\-");
        assert!(
            page.contains(sub) || page.contains(&escaped),
            "no `{sub}` in the man page"
        );
    }
    Ok(())
}
