//! The rival engines belong to this crate: the library's own build graph
//! (its dependencies and dev-dependencies) holds none of them, so its
//! `cargo test` never compiles SQLite.

#![allow(clippy::doc_markdown)] // product names (PostgreSQL, SQLite) are not code

use std::process::Command;

#[test]
fn the_library_does_not_depend_on_the_rival_engines() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", "dedupkv", "-e", "normal,build,dev"])
        .args(["--prefix", "none", "--locked", "--offline"])
        .current_dir(dedupkv_bench_compare::workspace_root())
        .output()
        .expect("run cargo tree");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let has = |name: &str| tree.lines().any(|l| l.starts_with(&format!("{name} v")));
    assert!(has("redb"), "the tree lists the library's graph:\n{tree}");
    for rival in ["rusqlite", "libsqlite3-sys", "postgres"] {
        assert!(!has(rival), "the library depends on {rival}:\n{tree}");
    }
}
