//! A hand-written SVG bar chart of ops/s per scenario (log scale).

use std::fmt::Write as _;

use crate::report::{ScenarioReport, thousands};

const WIDTH: f64 = 1000.0;
const X0: f64 = 250.0;
const X1: f64 = 880.0;
const BAR: f64 = 13.0;
const GAP: f64 = 3.0;
const HEADER: f64 = 24.0;

fn color(id: &str) -> &'static str {
    match id {
        "dedupkv-immediate" => "#1f63a8",
        "dedupkv-deferred" => "#8fb8e0",
        "dedupkv-journal" => "#0b3d6e",
        "redb" => "#e07b1f",
        "sqlite-full" => "#2c8c2c",
        "sqlite-full-2tx" => "#1a5c1a",
        "sqlite-normal" => "#96d48a",
        "postgres" => "#7a52b3",
        "postgres-2tx" => "#4b2d7a",
        "dedupkv-pg" => "#c23b8a",
        "dedupkv-pg-single" => "#e89bc6",
        "memory" => "#9a9a9a",
        _ => "#444444",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn si(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v => format!("{v}"),
    }
}

/// The chart: one group of horizontal bars per scenario, one bar per
/// contender, on a shared log-scale x axis.
#[allow(clippy::cast_possible_truncation)] // decade exponents of rates: small integers
pub fn chart(all: &[ScenarioReport], subtitle: &str) -> String {
    let values = all
        .iter()
        .flat_map(|s| s.rows.iter().map(|r| r.median))
        .filter(|v| *v > 0.0);
    let (min, max) = values.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo_exp, hi_exp) = if max > 0.0 {
        (
            min.log10().floor() as i32,
            (max.log10().ceil() as i32).max(min.log10().floor() as i32 + 1),
        )
    } else {
        (0, 1)
    };
    let x = |v: f64| {
        let f =
            (v.max(10f64.powi(lo_exp)).log10() - f64::from(lo_exp)) / f64::from(hi_exp - lo_exp);
        X0 + f * (X1 - X0)
    };
    let top = 64.0;
    let rows: usize = all.iter().map(|s| s.rows.len()).sum();
    #[allow(clippy::cast_precision_loss)] // a few dozen rows
    let height = top + all.len() as f64 * (HEADER + 8.0) + rows as f64 * (BAR + GAP) + 40.0;

    let mut body = String::new();
    let mut y = top;
    for s in all {
        let _ = writeln!(
            body,
            r#"<text x="10" y="{:.1}" class="group">{} — {}</text>"#,
            y + 16.0,
            esc(&s.name),
            esc(&s.title)
        );
        y += HEADER;
        for r in &s.rows {
            let w = (x(r.median) - X0).max(1.0);
            let _ = writeln!(
                body,
                r#"<text x="{:.1}" y="{:.1}" class="label">{}</text><rect x="{X0}" y="{y:.1}" width="{w:.1}" height="{BAR}" fill="{}"><title>{}: {} keys/s ({})</title></rect><text x="{:.1}" y="{:.1}" class="value">{}</text>"#,
                X0 - 6.0,
                y + BAR - 2.5,
                esc(&r.name),
                color(&r.id),
                esc(&r.name),
                thousands(r.median),
                esc(&r.durability),
                X0 + w + 4.0,
                y + BAR - 2.5,
                thousands(r.median)
            );
            y += BAR + GAP;
        }
        y += 8.0;
    }
    let mut axis = String::new();
    for e in lo_exp..=hi_exp {
        let v = 10f64.powi(e);
        let gx = x(v);
        let _ = writeln!(
            axis,
            r#"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{:.1}" class="grid"/><text x="{gx:.1}" y="{:.1}" class="tick">{}</text>"#,
            top - 4.0,
            y,
            y + 14.0,
            si(v)
        );
    }
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" font-family="Helvetica, Arial, sans-serif">
<style>
.title {{ font-size: 16px; font-weight: bold; }}
.sub {{ font-size: 11px; fill: #555; }}
.group {{ font-size: 12px; font-weight: bold; }}
.label {{ font-size: 11px; text-anchor: end; }}
.value {{ font-size: 10px; fill: #333; }}
.tick {{ font-size: 10px; text-anchor: middle; fill: #555; }}
.grid {{ stroke: #ddd; stroke-width: 1; }}
</style>
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="22" class="title">dedupkv vs. other engines: keys per second (log scale, more is better)</text>
<text x="10" y="40" class="sub">{}</text>
{axis}{body}</svg>
"#,
        esc(subtitle)
    )
}
