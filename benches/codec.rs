//! The outcome codec's cost: encoding and decoding a typical small receipt
//! as CBOR (tag 3, what `complete_value` writes) against JSON (tag 2, what
//! it wrote before), with the same calls `src/codec.rs` makes. Per
//! operation: `encode`, `decode` (a replay's `outcome_as`), and
//! `complete_value`'s codec work (encode, then the read-back decode). The
//! two codecs run alternately in one process, the order swapped from round
//! to round; the table gives medians of ns/op and of the CBOR ÷ JSON ratio
//! measured in the same round (with its range), and the encoded size. One
//! more row decodes a stored tag-3 record through `Record::outcome_as`, the
//! library's own path, as a check that the mirrored calls are the ones
//! that run.
//!
//! `cargo bench --bench codec` (`DEDUPKV_BENCH_RUNS` rounds, default 31;
//! `DEDUPKV_CODEC_ITERS` operations per timing, default 20,000).
#![allow(missing_docs, clippy::unwrap_used, clippy::cast_precision_loss)]

#[path = "common/mod.rs"]
mod common;
use common::env_or;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use dedupkv::{Begin, Fingerprint, Key, Record, Store};
use serde::{Deserialize, Serialize};

/// A payment provider's answer, as a caller would store it.
#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Receipt {
    charge_id: String,
    status: u16,
    amount_cents: u64,
    currency: String,
    fee_ratio: f64,
    created_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    coupon: Option<String>,
    metadata: BTreeMap<String, String>,
}

fn receipt() -> Receipt {
    Receipt {
        charge_id: "ch_3PqXyZ2eZvKYlo2C".into(),
        status: 201,
        amount_cents: 1_999,
        currency: "EUR".into(),
        fee_ratio: 0.029,
        created_at_ms: 1_700_000_040_000,
        coupon: None,
        metadata: BTreeMap::from([
            ("order".to_string(), "o-10042".to_string()),
            ("shop".to_string(), "shop-42".to_string()),
        ]),
    }
}

#[derive(Clone, Copy)]
enum Codec {
    Json,
    Cbor,
}

impl Codec {
    fn encode(self, r: &Receipt) -> Vec<u8> {
        match self {
            Codec::Json => serde_json::to_vec(r).unwrap(),
            Codec::Cbor => {
                let mut out = Vec::new();
                ciborium::into_writer(r, &mut out).unwrap();
                out
            }
        }
    }

    fn decode(self, bytes: &[u8]) -> Receipt {
        match self {
            Codec::Json => serde_json::from_slice(bytes).unwrap(),
            Codec::Cbor => ciborium::de::from_reader_with_recursion_limit(bytes, 128).unwrap(),
        }
    }
}

/// What one timing does `iters` times.
#[derive(Clone, Copy)]
enum Op {
    Encode,
    Decode,
    /// `complete_value`'s codec work: encode, then decode back.
    CompleteValue,
}

const OPS: [(Op, &str); 3] = [
    (Op::Encode, "encode"),
    (Op::Decode, "decode (replay)"),
    (
        Op::CompleteValue,
        "encode + read-back decode (complete_value)",
    ),
];

/// ns per operation of `op` with `codec`.
fn time(codec: Codec, op: Op, r: &Receipt, bytes: &[u8], iters: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        match op {
            Op::Encode => {
                black_box(codec.encode(black_box(r)));
            }
            Op::Decode => {
                black_box(codec.decode(black_box(bytes)));
            }
            Op::CompleteValue => {
                let b = codec.encode(black_box(r));
                black_box(codec.decode(&b));
            }
        }
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

/// ns per `Record::outcome_as` of a stored tag-3 receipt.
fn time_outcome_as(rec: &Record, iters: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        black_box(black_box(rec).outcome_as::<Receipt>().unwrap());
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let runs = env_or("DEDUPKV_BENCH_RUNS", 31);
    let iters = env_or("DEDUPKV_CODEC_ITERS", 20_000);
    let r = receipt();
    let json = Codec::Json.encode(&r);
    let cbor = Codec::Cbor.encode(&r);
    assert_eq!(Codec::Json.decode(&json), r);
    assert_eq!(Codec::Cbor.decode(&cbor), r);

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("codec.redb")).unwrap();
    let key = Key::new("bench", "receipt");
    let Begin::Started(claim) = store.begin(&key, Fingerprint::NONE).unwrap() else {
        panic!("a fresh key was not started");
    };
    store.complete_value(&claim, &r).unwrap();
    let rec = store.get(&key).unwrap().unwrap();
    // The stored bytes are the mirrored CBOR encoding.
    assert_eq!(rec.outcome(), Some(&cbor[..]));

    let n = OPS.len();
    let (mut ns_json, mut ns_cbor, mut ratio) = (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
    let mut ns_outcome_as = vec![];
    for round in 0..runs {
        for (i, &(op, _)) in OPS.iter().enumerate() {
            let (j, c) = if round % 2 == 0 {
                let j = time(Codec::Json, op, &r, &json, iters);
                (j, time(Codec::Cbor, op, &r, &cbor, iters))
            } else {
                let c = time(Codec::Cbor, op, &r, &cbor, iters);
                (time(Codec::Json, op, &r, &json, iters), c)
            };
            ns_json[i].push(j);
            ns_cbor[i].push(c);
            ratio[i].push(c / j);
        }
        ns_outcome_as.push(time_outcome_as(&rec, iters));
    }

    let mut out = String::new();
    let mut row = |line: String| {
        println!("{line}");
        writeln!(out, "{line}").unwrap();
    };
    row(format!(
        "dedupkv codec bench: an 8-field receipt, JSON {} B / CBOR {} B, {runs} alternating rounds of {iters} ops, medians",
        json.len(),
        cbor.len()
    ));
    row(String::new());
    row(
        "| per operation | JSON (tag 2) ns | CBOR (tag 3) ns | CBOR ÷ JSON, same round (range) |"
            .into(),
    );
    row("|---|---|---|---|".into());
    for (i, &(_, name)) in OPS.iter().enumerate() {
        let (lo, hi) = ratio[i]
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        row(format!(
            "| {name} | {:.0} | {:.0} | {:.2} ({lo:.2}–{hi:.2}) |",
            median(ns_json[i].clone()),
            median(ns_cbor[i].clone()),
            median(ratio[i].clone()),
        ));
    }
    row(format!(
        "| `Record::outcome_as` of the stored tag-3 record | – | {:.0} | – |",
        median(ns_outcome_as)
    ));
    let dirp = Path::new("target/bench-codec");
    let _ = std::fs::create_dir_all(dirp);
    let _ = std::fs::write(dirp.join("codec.md"), out);
}
