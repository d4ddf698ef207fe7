//! Typed outcomes: whatever `complete_value` accepts, `outcome_as` reads
//! back as its type, bit for bit (NaN payloads, infinities, -0.0, the full
//! `u128`/`i128` range, bytes), across reopen; what could not be read back is
//! refused before anything is recorded, and the claim stays usable;
//! outcomes written by earlier builds (postcard, JSON) still read.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use dedupkv::{Begin, Error, Failure, Fingerprint, Key, ManualClock, Result, State, Store};
use dedupkv_testkit::{T0, started, tempdir};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

fn open(path: &Path, clock: &ManualClock) -> Result<Store> {
    Store::builder().clock(clock.clone()).open(path)
}

/// Completes a fresh key with `value`; returns it as read back from the
/// replay of a repeat `begin`, and from `get` after reopening the store.
fn replay<T>(id: &str, value: &T) -> Result<[T; 2]>
where
    T: Serialize + DeserializeOwned,
{
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    let key = Key::new("t", id);
    let replayed = {
        let store = open(&path, &clock)?;
        let claim = started(store.begin(&key, Fingerprint::NONE)?);
        store.complete_value(&claim, value)?;
        let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else {
            panic!("{id}: expected Completed")
        };
        rec.outcome_as::<T>()?
    };
    let store = open(&path, &clock)?;
    let rec = store.get(&key)?.expect("recorded");
    Ok([replayed, rec.outcome_as::<T>()?])
}

/// [`replay`], asserting both reads equal `value`.
fn replays<T>(id: &str, value: &T) -> Result<()>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let [replayed, reopened] = replay(id, value)?;
    assert_eq!(&replayed, value, "{id}: replay");
    assert_eq!(&reopened, value, "{id}: after reopen");
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

/// Units inside the types serde buffers (`untagged`, `flatten`, internally
/// tagged) replay as they did when outcomes were JSON.
#[test]
fn units_inside_untagged_and_flattened_types_replay() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Ack;
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(untagged)]
    enum Reply {
        Ack(Ack),
        Items(Vec<u8>),
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Marker {
        seen: (),
        note: Option<()>,
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Flat {
        id: u8,
        #[serde(flatten)]
        marker: Marker,
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(tag = "type")]
    enum Event {
        Done { unit: () },
    }
    replays("untagged-unit-struct", &Reply::Ack(Ack))?;
    replays("untagged-items", &Reply::Items(vec![]))?;
    replays(
        "flattened-units",
        &Flat {
            id: 1,
            marker: Marker {
                seen: (),
                note: None,
            },
        },
    )?;
    replays("internal-unit", &Event::Done { unit: () })
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
    replays("wide", &(u128::MAX, i128::MIN, u64::MAX, i64::MIN))?;
    replays(
        "wide-edges",
        &vec![
            (0u128, 0i128),
            (1 << 64, -(1 << 64)),
            ((1 << 64) - 1, i128::MAX),
            (u128::MAX - 1, -1),
        ],
    )
}

/// `f64`s and `f32`s whose bit patterns must come back unchanged.
fn odd_f64s() -> Vec<f64> {
    [
        0x7ff8_0000_0000_0000u64, // NaN (quiet)
        0xfff8_0000_0000_0000,    // -NaN
        0x7ff8_0000_dead_beef,    // NaN with a payload
        0x7ff0_0000_0000_0001,    // signalling NaN
        0x7ff0_0000_0000_0000,    // +inf
        0xfff0_0000_0000_0000,    // -inf
        0x8000_0000_0000_0000,    // -0.0
        0x0000_0000_0000_0001,    // smallest subnormal
    ]
    .into_iter()
    .map(f64::from_bits)
    .collect()
}

fn odd_f32s() -> Vec<f32> {
    [
        0x7fc0_0000u32, // NaN
        0xffc0_1234,    // -NaN with a payload
        0x7fa0_0001,    // signalling NaN
        0x7f80_0000,    // +inf
        0xff80_0000,    // -inf
        0x8000_0000,    // -0.0
    ]
    .into_iter()
    .map(f32::from_bits)
    .collect()
}

fn f64_bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn f32_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// The bits an `f32` reads back with: its own, but a signalling NaN comes
/// back quiet (the encoder widens `f32` to `f64`, which sets the quiet bit),
/// with its sign and payload. Every `f64` reads back as it was.
fn f32_read_back(bits: u32) -> u32 {
    const QUIET: u32 = 0x0040_0000;
    let nan = bits & 0x7f80_0000 == 0x7f80_0000 && bits & 0x007f_ffff != 0;
    if nan { bits | QUIET } else { bits }
}

#[test]
fn non_finite_floats_and_negative_zero_replay_bit_exactly() -> Result<()> {
    // The issue's receipt: a ratio of 0/0 and an unbounded limit.
    #[derive(Serialize, Deserialize, Debug)]
    struct Quote {
        id: String,
        ratio: f64,
        limit: f64,
    }
    for got in replay("f64s", &odd_f64s())? {
        assert_eq!(f64_bits(&got), f64_bits(&odd_f64s()));
    }
    let want: Vec<u32> = f32_bits(&odd_f32s())
        .into_iter()
        .map(f32_read_back)
        .collect();
    for got in replay("f32s", &odd_f32s())? {
        assert_eq!(f32_bits(&got), want);
    }
    let quote = Quote {
        id: "q-1".into(),
        ratio: f64::NAN,
        limit: f64::INFINITY,
    };
    for got in replay("quote", &quote)? {
        assert_eq!(got.id, "q-1");
        assert_eq!(got.ratio.to_bits(), f64::NAN.to_bits());
        assert_eq!(got.limit.to_bits(), f64::INFINITY.to_bits());
    }
    Ok(())
}

#[test]
fn non_finite_floats_replay_inside_untagged_and_flatten() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug)]
    #[serde(untagged)]
    enum Limit {
        Text(String),
        Number(f64),
    }
    #[derive(Serialize, Deserialize, Debug)]
    struct Stats {
        mean: f64,
        max: f32,
    }
    #[derive(Serialize, Deserialize, Debug)]
    struct Report {
        limit: Limit,
        #[serde(flatten)]
        stats: Stats,
    }
    let report = Report {
        limit: Limit::Number(f64::NEG_INFINITY),
        stats: Stats {
            mean: f64::from_bits(0x7ff8_0000_dead_beef),
            max: -0.0,
        },
    };
    for got in replay("report", &report)? {
        assert!(matches!(got.limit, Limit::Number(f) if f == f64::NEG_INFINITY));
        assert_eq!(got.stats.mean.to_bits(), 0x7ff8_0000_dead_beef);
        assert_eq!(got.stats.max.to_bits(), (-0.0f32).to_bits());
    }
    Ok(())
}

#[test]
fn bytes_replay() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Inner {
        #[serde(with = "serde_bytes")]
        sig: Vec<u8>,
    }
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Signed {
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
        plain: Vec<u8>,
        #[serde(flatten)]
        inner: Inner,
    }
    replays("bytebuf", &serde_bytes::ByteBuf::from(vec![0u8, 255, 7]))?;
    replays("bytebuf-empty", &serde_bytes::ByteBuf::new())?;
    replays("vec-u8", &(0..=255u8).collect::<Vec<u8>>())?;
    replays(
        "signed",
        &Signed {
            body: b"\x00\xffpayload".to_vec(),
            plain: vec![1, 2, 3],
            inner: Inner {
                sig: vec![0xde, 0xad],
            },
        },
    )
}

#[test]
fn maps_with_non_string_keys_replay() -> Result<()> {
    #[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    struct Cell {
        row: u8,
        col: u8,
    }
    replays("tuple-keys", &HashMap::from([((1u8, 2u8), 3u8)]))?;
    replays(
        "struct-keys",
        &BTreeMap::from([(Cell { row: 1, col: 2 }, "x".to_string())]),
    )?;
    replays(
        "bytes-keys",
        &BTreeMap::from([(vec![0u8, 1], 1u8), (vec![], 0)]),
    )
}

/// A value whose `Serialize` fails.
struct Unserializable;

impl Serialize for Unserializable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("no wire form"))
    }
}

impl<'de> Deserialize<'de> for Unserializable {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> std::result::Result<Self, D::Error> {
        Err(serde::de::Error::custom("never stored"))
    }
}

/// A `u128` under `flatten`: serde buffers flattened fields in a form that
/// has no 128-bit integers, so no format reads it back.
#[derive(Serialize, Deserialize, Debug)]
struct FlatWide {
    #[serde(flatten)]
    inner: Wide,
}

#[derive(Serialize, Deserialize, Debug)]
struct Wide {
    big: u128,
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
fn an_outcome_that_does_not_read_back_or_encode_is_refused() -> Result<()> {
    refused(
        "flat-u128",
        &FlatWide {
            inner: Wide { big: u128::MAX },
        },
        "cannot be read back",
    )?;
    refused("unserializable", &Unserializable, "cannot be encoded")
}

/// How `complete_value` is made to refuse an outcome.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    Encode,
    ReadBack,
    TooLong,
}

/// The outcome limit of [`refuse`]'s store.
const MAX_OUTCOME: usize = 64;

/// Begins `id`, has `complete_value` refuse an outcome as `how`, then
/// returns the store and the same claim.
fn refuse(
    path: &Path,
    clock: &ManualClock,
    id: &str,
    how: Refusal,
) -> Result<(Store, Key<'static>, dedupkv::Claim)> {
    let store = Store::builder()
        .clock(clock.clone())
        .max_outcome_len(MAX_OUTCOME)
        .open(path)?;
    let key = Key::new("t", id).into_owned();
    let claim = started(store.begin(&key, Fingerprint::NONE)?);
    let err = match how {
        Refusal::Encode => store.complete_value(&claim, &Unserializable),
        Refusal::ReadBack => store.complete_value(
            &claim,
            &FlatWide {
                inner: Wide { big: 1 },
            },
        ),
        Refusal::TooLong => store.complete_value(&claim, &"x".repeat(MAX_OUTCOME * 2)),
    }
    .expect_err("refused");
    match how {
        Refusal::TooLong => assert!(matches!(err, Error::InvalidInput { .. }), "{err}"),
        _ => assert!(matches!(err, Error::Codec(_)), "{how:?}: {err}"),
    }
    Ok((store, key, claim))
}

/// The caller's effect already happened when its outcome is refused: the
/// claim it holds must still record it, as bytes or as a failure.
#[test]
fn a_refused_outcome_leaves_the_claim_usable_for_complete_or_fail() -> Result<()> {
    let dir = tempdir();
    let clock = ManualClock::new(T0);
    for (i, how) in [Refusal::Encode, Refusal::ReadBack, Refusal::TooLong]
        .into_iter()
        .enumerate()
    {
        let path = dir.path().join(format!("s{i}.redb"));
        let (store, key, claim) = refuse(&path, &clock, "bytes", how)?;
        store.complete(&claim, b"charged: ch_1")?;
        let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else {
            panic!("{how:?}: expected Completed")
        };
        assert_eq!(rec.attempts(), 1, "{how:?}: the same claim, not a takeover");
        assert_eq!(rec.outcome(), Some(&b"charged: ch_1"[..]), "{how:?}");
        drop(store);

        let (store, key, claim) = refuse(&path, &clock, "fail", how)?;
        store.fail(&claim, Failure::Permanent(b"declined"))?;
        let Begin::Completed(rec) = store.begin(&key, Fingerprint::NONE)? else {
            panic!("{how:?}: expected the failure replayed")
        };
        assert!(rec.is_failure(), "{how:?}");
        assert_eq!(rec.attempts(), 1, "{how:?}");
        assert_eq!(rec.outcome(), Some(&b"declined"[..]), "{how:?}");
        drop(store);

        let (store, key, claim) = refuse(&path, &clock, "value", how)?;
        store.complete_value(&claim, &2.5f64)?;
        let rec = store.get(&key)?.expect("completed");
        assert_eq!(rec.state(), State::Completed, "{how:?}");
        assert_eq!(rec.outcome_as::<f64>()?.to_bits(), 2.5f64.to_bits());
    }
    Ok(())
}

/// A float bit pattern, weighted towards the ones JSON could not store:
/// NaNs with any sign and payload, infinities, zeros, subnormals.
fn f64_pattern() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        (any::<bool>(), 1u64..(1 << 52))
            .prop_map(|(neg, m)| (u64::from(neg) << 63) | 0x7ff0_0000_0000_0000 | m),
        (any::<bool>(), 0u64..(1 << 52)).prop_map(|(neg, m)| (u64::from(neg) << 63) | m),
        prop::sample::select(vec![
            0x7ff0_0000_0000_0000,
            0xfff0_0000_0000_0000,
            0x8000_0000_0000_0000,
            0,
        ]),
    ]
}

fn f32_pattern() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        (any::<bool>(), 1u32..(1 << 23))
            .prop_map(|(neg, m)| (u32::from(neg) << 31) | 0x7f80_0000 | m),
        (any::<bool>(), 0u32..(1 << 23)).prop_map(|(neg, m)| (u32::from(neg) << 31) | m),
    ]
}

fn wide_u128() -> impl Strategy<Value = u128> {
    prop_oneof![
        any::<u128>(),
        prop::sample::select(vec![0, 1, u128::from(u64::MAX), 1 << 64, u128::MAX]),
    ]
}

fn wide_i128() -> impl Strategy<Value = i128> {
    prop_oneof![
        any::<i128>(),
        prop::sample::select(vec![0, -1, i128::MIN, i128::MAX, -(1 << 64)]),
    ]
}

#[derive(Serialize, Deserialize, Debug)]
struct Sample {
    f: f64,
    g: f32,
    fs: Vec<f64>,
    u: u128,
    i: i128,
}

impl Sample {
    /// Its bits as written.
    fn bits(&self) -> (u64, u32, Vec<u64>, u128, i128) {
        (
            self.f.to_bits(),
            self.g.to_bits(),
            f64_bits(&self.fs),
            self.u,
            self.i,
        )
    }

    /// [`Sample::bits`] as the sample reads back: every `f64` and integer
    /// as written, the `f32` by [`f32_read_back`].
    fn read_back(&self) -> (u64, u32, Vec<u64>, u128, i128) {
        let mut bits = self.bits();
        bits.1 = f32_read_back(bits.1);
        bits
    }
}

fn sample() -> impl Strategy<Value = Sample> {
    (
        f64_pattern(),
        f32_pattern(),
        prop::collection::vec(f64_pattern(), 0..4),
        wide_u128(),
        wide_i128(),
    )
        .prop_map(|(f, g, fs, u, i)| Sample {
            f: f64::from_bits(f),
            g: f32::from_bits(g),
            fs: fs.into_iter().map(f64::from_bits).collect(),
            u,
            i,
        })
}

/// Arbitrary float bit patterns and 128-bit integers, through
/// `complete_value`, come back bit for bit from a replay (`Begin::Completed`)
/// and from `get`, also after reopen. One store for all cases, a key each.
#[test]
fn arbitrary_float_bits_and_wide_integers_replay_exactly() -> Result<()> {
    let dir = tempdir();
    let path = dir.path().join("s.redb");
    let clock = ManualClock::new(T0);
    // `run` takes a `Fn`: what the cases share is behind cells.
    let written = std::cell::RefCell::new(Vec::new());
    {
        let store = open(&path, &clock)?;
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 128,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        let n = std::cell::Cell::new(0u32);
        runner
            .run(&sample(), |s| {
                n.set(n.get() + 1);
                let key = Key::new("prop", &format!("k{}", n.get())).into_owned();
                let want = s.read_back();
                let claim = started(store.begin(&key, Fingerprint::NONE).expect("begin"));
                store
                    .complete_value(&claim, &s)
                    .map_err(|e| TestCaseError::fail(format!("{want:016x?}: {e}")))?;
                let Ok(Begin::Completed(rec)) = store.begin(&key, Fingerprint::NONE) else {
                    return Err(TestCaseError::fail("expected Completed"));
                };
                let back = rec.outcome_as::<Sample>().expect("replay");
                prop_assert_eq!(back.bits(), want.clone(), "replay");
                let rec = store.get(&key).expect("get").expect("recorded");
                let back = rec.outcome_as::<Sample>().expect("get");
                prop_assert_eq!(back.bits(), want.clone(), "get");
                written.borrow_mut().push((key, want));
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let store = open(&path, &clock)?;
    for (key, want) in written.into_inner() {
        let rec = store.get(&key)?.expect("recorded");
        assert_eq!(
            rec.outcome_as::<Sample>()?.bits(),
            want,
            "{key} after reopen"
        );
    }
    Ok(())
}

/// A copy of `tests/fixtures/{name}`, a store written by an earlier build's
/// `complete_value`, frozen: no build writes its outcome tag any more, so
/// it cannot be regenerated, only kept.
fn legacy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let dir = tempdir();
    let to = dir.path().join("legacy.redb");
    std::fs::copy(from, &to).expect("copy fixture");
    (dir, to)
}

fn open_legacy(path: &Path) -> Result<Store> {
    Store::builder()
        .clock(ManualClock::new(T0 + 60_000))
        .background_eviction(false)
        .compact_when_free(None)
        .open(path)
}

fn completed(store: &Store, id: &str) -> Result<dedupkv::Record> {
    match store.begin(&Key::new("legacy", id), Fingerprint::of("p"))? {
        Begin::Completed(rec) => Ok(rec),
        other => panic!("{id}: expected Completed, got {other:?}"),
    }
}

#[derive(Deserialize, Debug, PartialEq)]
struct LegacyReceipt {
    id: String,
    cents: u64,
}

/// `v1-postcard-outcome.redb`: typed outcomes of the builds before JSON
/// (format tag 1).
#[test]
fn postcard_outcomes_of_earlier_builds_still_read_back() -> Result<()> {
    let (_dir, path) = legacy_fixture("v1-postcard-outcome.redb");
    let store = open_legacy(&path)?;

    let rec = completed(&store, "tuple")?;
    // The stored bytes are postcard's.
    assert_eq!(rec.outcome(), Some(&b"\x05typed\x2a"[..]));
    assert_eq!(
        rec.outcome_as::<(String, u32)>()?,
        ("typed".to_string(), 42)
    );

    let rec = completed(&store, "struct")?;
    assert_eq!(
        rec.outcome_as::<LegacyReceipt>()?,
        LegacyReceipt {
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

/// `v3-json-outcome.redb`: typed outcomes of the builds before CBOR
/// (format tag 2), read back as before, also after this build wrote to the
/// file and reopened it.
#[test]
fn json_outcomes_of_earlier_builds_still_read_back() -> Result<()> {
    let (_dir, path) = legacy_fixture("v3-json-outcome.redb");
    let check = |store: &Store| -> Result<()> {
        let rec = completed(store, "tuple")?;
        // The stored bytes are JSON.
        assert_eq!(rec.outcome(), Some(&br#"["typed",42]"#[..]));
        assert_eq!(
            rec.outcome_as::<(String, u32)>()?,
            ("typed".to_string(), 42)
        );
        let rec = completed(store, "struct")?;
        assert_eq!(
            rec.outcome_as::<LegacyReceipt>()?,
            LegacyReceipt {
                id: "r-1".into(),
                cents: 1999
            }
        );
        assert!(matches!(
            rec.outcome_as::<Vec<String>>(),
            Err(Error::Codec(_))
        ));
        let floats = completed(store, "floats")?.outcome_as::<Vec<f64>>()?;
        assert_eq!(
            f64_bits(&floats),
            f64_bits(&[0.1, -0.0, 1e300, 5e-324, 2.0 / 3.0])
        );
        let wide = completed(store, "wide")?.outcome_as::<(u128, i128)>()?;
        assert_eq!(wide, (u128::MAX, i128::MIN));
        Ok(())
    };
    {
        // Not upgraded: new outcomes are JSON, which the build before reads,
        // so a NaN is refused and the claim stays usable.
        let store = open_legacy(&path)?;
        check(&store)?;
        let claim = started(store.begin(&Key::new("legacy", "new"), Fingerprint::of("p"))?);
        assert!(matches!(
            store.complete_value(&claim, &f64::NAN),
            Err(Error::Codec(_))
        ));
        store.complete_value(&claim, &0.5_f64)?;
        assert_eq!(completed(&store, "new")?.outcome(), Some(&b"0.5"[..]));
    }
    {
        // Upgraded: CBOR, NaN and all, next to the old outcomes.
        let store = Store::builder()
            .clock(ManualClock::new(T0 + 60_000))
            .background_eviction(false)
            .compact_when_free(None)
            .upgrade(true)
            .open(&path)?;
        check(&store)?;
        let claim = started(store.begin(&Key::new("legacy", "nan"), Fingerprint::of("p"))?);
        store.complete_value(&claim, &f64::NAN)?;
    }
    let store = open_legacy(&path)?;
    check(&store)?;
    assert_eq!(
        completed(&store, "new")?.outcome_as::<f64>()?.to_bits(),
        0.5_f64.to_bits()
    );
    assert!(completed(&store, "nan")?.outcome_as::<f64>()?.is_nan());
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
