//! Typed outcomes: whatever `complete_value` accepts, `outcome_as` reads
//! back, across reopen; what could not be read back is refused before
//! anything is recorded; outcomes written by earlier builds (postcard) still
//! read.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use dedupkv::{Begin, Error, Fingerprint, Key, ManualClock, Result, State, Store};
use dedupkv_testkit::{started, tempdir};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

const T0: u64 = 1_700_000_040_000;

fn open(path: &Path, clock: &ManualClock) -> Result<Store> {
    Store::builder().clock(clock.clone()).open(path)
}

/// Completes a fresh key with `value`, then reads it back from the replay of
/// a repeat `begin`, and again after reopening the store.
fn replays<T>(id: &str, value: &T) -> Result<()>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let key = Key::new("t", id);
    {
        let store = open(&path, &clock)?;
        let claim = started(store.begin(&key, Fingerprint::NONE)?);
        store.complete_value(&claim, value)?;
        let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else {
            panic!("{id}: expected Completed")
        };
        assert_eq!(&rec.outcome_as::<T>()?, value, "{id}: replay");
    }
    let store = open(&path, &clock)?;
    let rec = store.get(&key)?.expect("recorded");
    assert_eq!(&rec.outcome_as::<T>()?, value, "{id}: after reopen");
    Ok(())
}

#[test]
fn a_skipped_none_field_replays() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Receipt {
        id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        coupon: Option<String>,
        cents: u64,
    }
    replays(
        "skip-none",
        &Receipt {
            id: "r1".into(),
            coupon: None,
            cents: 100,
        },
    )?;
    replays(
        "skip-some",
        &Receipt {
            id: "r2".into(),
            coupon: Some("SPRING".into()),
            cents: 90,
        },
    )
}

#[test]
fn an_untagged_enum_replays() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(untagged)]
    enum Body {
        Text(String),
        Code(u32),
        Pair { a: u8, b: u8 },
    }
    replays("untagged-text", &Body::Text("ok".into()))?;
    replays("untagged-code", &Body::Code(404))?;
    replays("untagged-pair", &Body::Pair { a: 1, b: 2 })
}

#[test]
fn a_flattened_struct_replays() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Meta {
        region: String,
        shard: u16,
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Response {
        status: u16,
        #[serde(flatten)]
        meta: Meta,
        #[serde(flatten)]
        extra: BTreeMap<String, String>,
    }
    replays(
        "flatten",
        &Response {
            status: 201,
            meta: Meta {
                region: "eu".into(),
                shard: 3,
            },
            extra: BTreeMap::from([("trace".to_string(), "t-1".to_string())]),
        },
    )
}

#[test]
fn defaulted_fields_replay() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Response {
        status: u16,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
        #[serde(default)]
        retries: u32,
    }
    replays(
        "default-empty",
        &Response {
            status: 200,
            warnings: vec![],
            retries: 0,
        },
    )?;
    replays(
        "default-full",
        &Response {
            status: 200,
            warnings: vec!["slow".into()],
            retries: 2,
        },
    )
}

#[test]
fn internally_and_adjacently_tagged_enums_replay() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(tag = "type")]
    enum Internal {
        Charged { id: String, cents: u64 },
        Declined { reason: String },
        Skipped,
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(tag = "t", content = "c")]
    enum Adjacent {
        Charged(u64),
        Declined { reason: String },
        Skipped,
    }
    replays(
        "internal-charged",
        &Internal::Charged {
            id: "ch_1".into(),
            cents: 5,
        },
    )?;
    replays(
        "internal-declined",
        &Internal::Declined {
            reason: "card".into(),
        },
    )?;
    replays("internal-skipped", &Internal::Skipped)?;
    replays("adjacent-charged", &Adjacent::Charged(5))?;
    replays(
        "adjacent-declined",
        &Adjacent::Declined {
            reason: "card".into(),
        },
    )?;
    replays("adjacent-skipped", &Adjacent::Skipped)
}

#[test]
fn renamed_fields_and_variants_replay() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Receipt {
        charge_id: String,
        amount_cents: u64,
        #[serde(rename = "ccy")]
        currency: String,
        state: ChargeState,
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
    enum ChargeState {
        PartlyRefunded,
        Settled,
    }
    replays(
        "rename-all",
        &Receipt {
            charge_id: "ch_1".into(),
            amount_cents: 100,
            currency: "EUR".into(),
            state: ChargeState::PartlyRefunded,
        },
    )
}

#[test]
fn maps_floats_and_wide_integers_replay_exactly() -> Result<()> {
    let map: HashMap<u32, String> = (0..20).map(|i| (i, format!("v{i}"))).collect();
    replays("int-keyed-map", &map)?;
    replays(
        "floats",
        &vec![0.1f64, -0.0, 1e300, f64::MIN_POSITIVE, 2.0 / 3.0],
    )?;
    replays("wide", &(u128::MAX, i128::MIN, u64::MAX, i64::MIN))
}

/// `complete_value` of a value that is refused: the error names the reason,
/// nothing is recorded (also after reopen), and the same claim completes
/// with a good value afterwards.
fn refused<T: Serialize + DeserializeOwned>(id: &str, bad: &T, needle: &str) -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let key = Key::new("t", id);
    {
        let store = open(&path, &clock)?;
        let claim = started(store.begin(&key, Fingerprint::NONE)?);
        let err = store
            .complete_value(&claim, bad)
            .expect_err("an outcome that cannot be replayed is refused");
        let msg = err.to_string();
        assert!(matches!(err, Error::Codec(_)), "{id}: {msg}");
        assert!(msg.contains(needle), "{id}: {msg}");
        let rec = store.get(&key)?.expect("claimed");
        assert_eq!(rec.state(), State::InProgress, "{id}");
        assert_eq!(rec.outcome(), None, "{id}");
        assert!(matches!(
            store.begin(&key, Fingerprint::NONE)?,
            Begin::InProgress(_)
        ));
        drop(store);
    }
    // Nothing reached the log either.
    let store = open(&path, &clock)?;
    let rec = store.get(&key)?.expect("claimed");
    assert_eq!(rec.state(), State::InProgress, "{id} after reopen");
    // The claim of the closed store was taken over at reopen; a new one
    // completes with a good outcome.
    let claim = started(store.begin(&key, Fingerprint::NONE)?);
    store.complete_value(&claim, &"good".to_string())?;
    let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("{id}: expected Completed")
    };
    assert_eq!(rec.outcome_as::<String>()?, "good");
    Ok(())
}

#[test]
fn a_nan_outcome_is_refused_and_the_claim_stays_usable() -> Result<()> {
    refused("nan", &f64::NAN, "cannot be read back")?;
    refused(
        "nan-in-struct",
        &vec![1.0, f64::INFINITY],
        "cannot be read back",
    )
}

#[test]
fn a_map_with_non_string_keys_is_refused() -> Result<()> {
    let map: HashMap<(u8, u8), u8> = HashMap::from([((1, 2), 3)]);
    refused("tuple-keys", &map, "key must be a string")
}

#[test]
fn a_refused_outcome_leaves_the_same_claim_usable() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    let key = Key::new("t", "same-claim");
    let claim = started(store.begin(&key, Fingerprint::NONE)?);
    assert!(matches!(
        store.complete_value(&claim, &f64::NAN),
        Err(Error::Codec(_))
    ));
    store.complete_value(&claim, &2.5f64)?;
    let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else {
        panic!("expected Completed")
    };
    assert_eq!(rec.attempts(), 1);
    assert_eq!(rec.outcome_as::<f64>()?.to_bits(), 2.5f64.to_bits());
    Ok(())
}

/// `tests/fixtures/v1-postcard-outcome.redb` was written by `complete_value`
/// when typed outcomes were postcard (format tag 1). No build writes that tag
/// any more, so the file is frozen: it cannot be regenerated, only kept.
fn legacy_fixture() -> (tempfile::TempDir, PathBuf) {
    let from =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-postcard-outcome.redb");
    let dir = tempdir();
    let to = dir.path().join("legacy.redb");
    std::fs::copy(from, &to).expect("copy fixture");
    (dir, to)
}

#[test]
fn postcard_outcomes_of_earlier_builds_still_read_back() -> Result<()> {
    #[derive(Deserialize, Debug, PartialEq)]
    struct Receipt {
        id: String,
        cents: u64,
    }
    let (_dir, path) = legacy_fixture();
    let clock = ManualClock::new(T0 + 60_000);
    let store = Store::builder()
        .clock(clock.clone())
        .background_eviction(false)
        .compact_when_free(None)
        .open(&path)?;
    let fp = Fingerprint::of("p");

    let Begin::Completed(rec) = store.begin(&Key::new("legacy", "tuple"), fp)? else {
        panic!("expected Completed")
    };
    // The stored bytes are postcard's, not JSON.
    assert_eq!(rec.outcome(), Some(&b"\x05typed\x2a"[..]));
    assert_eq!(
        rec.outcome_as::<(String, u32)>()?,
        ("typed".to_string(), 42)
    );

    let Begin::Completed(rec) = store.begin(&Key::new("legacy", "struct"), fp)? else {
        panic!("expected Completed")
    };
    assert_eq!(
        rec.outcome_as::<Receipt>()?,
        Receipt {
            id: "r-1".into(),
            cents: 1999
        }
    );
    assert!(matches!(
        rec.outcome_as::<Vec<String>>(),
        Err(Error::Codec(_))
    ));
    Ok(())
}

#[test]
fn raw_outcomes_are_not_typed() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    let store = open(&dir.path().join("s.redb"), &clock)?;
    let key = Key::new("t", "raw");
    let claim = started(store.begin(&key, Fingerprint::NONE)?);
    store.complete(&claim, b"\"looks like json\"")?;
    let rec = store.get(&key)?.expect("recorded");
    let err = rec
        .outcome_as::<String>()
        .expect_err("raw bytes are not typed");
    assert!(matches!(err, Error::Codec(_)), "{err}");
    Ok(())
}
