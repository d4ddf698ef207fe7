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

/// `man --dir DIR` writes one page per command: `dedupkv.1` and one for
/// every subcommand at every level, each a roff page naming its command.
#[test]
fn man_dir_writes_a_page_per_subcommand() -> TestResult {
    let dir = tempfile::tempdir()?;
    let d = dir.path().to_str().ok_or("path")?;
    let out = dedupkv(&["man", "--dir", d])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    pages.sort();
    // Every subcommand `--help` lists, and each group's own subcommands.
    let mut want = vec!["dedupkv.1".to_owned()];
    let help = String::from_utf8(dedupkv(&["--help"])?.stdout)?;
    for sub in subcommands(&help) {
        want.push(format!("dedupkv-{sub}.1"));
        let inner = String::from_utf8(dedupkv(&[sub.as_str(), "--help"])?.stdout)?;
        for leaf in subcommands(&inner) {
            want.push(format!("dedupkv-{sub}-{leaf}.1"));
        }
    }
    want.sort();
    assert_eq!(pages, want);
    for page in &pages {
        let text = std::fs::read_to_string(dir.path().join(page))?;
        let name = page.trim_end_matches(".1").replace('-', "\\-");
        assert!(
            text.contains(".TH") && text.contains(&name),
            "{page}: {text}"
        );
    }
    // Not a directory: an error naming it, nothing written.
    let missing = dir.path().join("missing");
    let out = dedupkv(&["man", "--dir", missing.to_str().ok_or("path")?])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)?.contains("missing: not a directory"));
    Ok(())
}

/// The subcommands a `--help` lists (`help` aside).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| *s != "help")
        .map(str::to_owned)
        .collect()
}
