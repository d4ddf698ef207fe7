//! Operation keys, the keyed hash the index is built on, and request
//! fingerprints.
//!
//! Invariant: the key hash function and its seed never change for an
//! existing file; both are persisted at creation.

use std::borrow::Cow;
use std::fmt;

use siphasher::sip128::{Hasher128, SipHasher13};

/// An operation key: a scope (tenant, stream, source) and an id within it.
///
/// The same id in two scopes is two keys. Both parts are arbitrary bytes,
/// and neither may be empty: every call that takes a key refuses an empty
/// scope or id with [`Error::InvalidArgument`](crate::Error::InvalidArgument).
///
/// # Examples
/// ```
/// use dedupkv::Key;
/// let a = Key::new("shop-42", "evt_1");
/// let b = Key::new("shop-43", "evt_1");
/// assert_ne!(a, b);
/// let owned: Key<'static> = Key::owned(b"shop-42".to_vec(), b"evt_1".to_vec());
/// assert_eq!(a, owned);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key<'a> {
    scope: Cow<'a, [u8]>,
    id: Cow<'a, [u8]>,
}

impl<'a> Key<'a> {
    /// A key borrowing its scope and id.
    ///
    /// # Examples
    /// ```
    /// let k = dedupkv::Key::new("tenant", b"\x00binary-id");
    /// assert_eq!(k.scope(), b"tenant");
    /// ```
    pub fn new<S, I>(scope: &'a S, id: &'a I) -> Self
    where
        S: AsRef<[u8]> + ?Sized,
        I: AsRef<[u8]> + ?Sized,
    {
        Self {
            scope: Cow::Borrowed(scope.as_ref()),
            id: Cow::Borrowed(id.as_ref()),
        }
    }

    /// A key owning its scope and id.
    ///
    /// # Examples
    /// ```
    /// let k = dedupkv::Key::owned(b"t".to_vec(), format!("evt_{}", 7).into_bytes());
    /// assert_eq!(k.id(), b"evt_7");
    /// ```
    pub fn owned(scope: Vec<u8>, id: Vec<u8>) -> Key<'static> {
        Key {
            scope: Cow::Owned(scope),
            id: Cow::Owned(id),
        }
    }

    /// The scope bytes.
    ///
    /// # Examples
    /// ```
    /// assert_eq!(dedupkv::Key::new("s", "i").scope(), b"s");
    /// ```
    pub fn scope(&self) -> &[u8] {
        &self.scope
    }

    /// The id bytes.
    ///
    /// # Examples
    /// ```
    /// assert_eq!(dedupkv::Key::new("s", "i").id(), b"i");
    /// ```
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// Copies borrowed parts so the key can outlive them.
    ///
    /// # Examples
    /// ```
    /// let k = { let s = String::from("t"); dedupkv::Key::new(&s, "i").into_owned() };
    /// assert_eq!(k.scope(), b"t");
    /// ```
    pub fn into_owned(self) -> Key<'static> {
        Key {
            scope: Cow::Owned(self.scope.into_owned()),
            id: Cow::Owned(self.id.into_owned()),
        }
    }
}

impl Key<'static> {
    /// A key whose id is derived from fields of a structured value, so two
    /// services (or a retry that rebuilt the request) compute the same key
    /// for the same business operation: the counterpart of an "event key
    /// expression".
    ///
    /// Each path is a dotted walk from the top of `value`: a segment names
    /// a struct field or a string map key, or, in a sequence, is a decimal
    /// index (`items.0`). A field name that contains a dot cannot be
    /// addressed; maps with non-string keys can be selected whole but not
    /// walked into. The selected values form the map `{path: value}`, and
    /// the id is the 32 lowercase hex digits of xxh3-128 of its canonical
    /// encoding (the model of [`Fingerprint::of_value`], another domain
    /// byte), so it always fits the id limit. The order of `paths` does not
    /// matter; fields not selected do not matter; the types do not matter
    /// beyond that model (a struct, a `HashMap` and a `serde_json::Value`
    /// with equal selected fields give one key). A field present as `null`
    /// is selected; a field skipped by `skip_serializing_if` is missing.
    ///
    /// The hash is not collision-resistant against someone who chooses
    /// field values to collide with another request's key: derive keys
    /// this way only from values that no adversary picks freely, or scope
    /// them per tenant.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `paths`
    /// is empty or lists a path twice, or a path has an empty segment or
    /// selects nothing (the message names the path and what is missing);
    /// as [`Fingerprint::of_value`] for a value without a canonical form.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::Key;
    ///
    /// #[derive(serde::Serialize)]
    /// struct Order { id: u64, note: &'static str }
    /// #[derive(serde::Serialize)]
    /// struct Request { order: Order, customer: &'static str, sent_at: u64 }
    ///
    /// let req = Request { order: Order { id: 7, note: "gift" }, customer: "c-42", sent_at: 1 };
    /// let key = Key::from_fields("payments", &req, &["order.id", "customer"])?;
    /// assert_eq!(key.id().len(), 32);
    ///
    /// // Another service, holding the JSON with other fields, agrees:
    /// let json = serde_json::json!({"customer": "c-42", "order": {"id": 7}, "retry": 3});
    /// assert_eq!(Key::from_fields("payments", &json, &["customer", "order.id"])?, key);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn from_fields<S, T>(scope: &S, value: &T, paths: &[&str]) -> crate::Result<Key<'static>>
    where
        S: AsRef<[u8]> + ?Sized,
        T: serde::Serialize + ?Sized,
    {
        let value = crate::canon::to_value(value)?;
        let selected = crate::canon::select(&value, paths)?;
        let hash = crate::canon::hash(crate::canon::KEY_V1, &selected)?;
        Ok(Key::owned(
            scope.as_ref().to_vec(),
            format!("{hash:032x}").into_bytes(),
        ))
    }
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", crate::error::show_key(&self.scope, &self.id))
    }
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::error::show_key(&self.scope, &self.id))
    }
}

/// Which function turns a key into the 128-bit hash the index is keyed on.
///
/// Chosen when a store file is created and fixed for its life.
///
/// # Examples
/// ```
/// use dedupkv::{KeyHashing, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// // Only for keys no adversary can choose:
/// let store = Store::builder().key_hashing(KeyHashing::Xxh3).open(dir.path().join("s.redb"))?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyHashing {
    /// SipHash-1-3-128 keyed with a random 128-bit secret made at creation and
    /// stored in the file. Two different keys collide (and one would be taken
    /// for a duplicate of the other) with probability about 2^-128 per pair,
    /// even when an adversary picks the keys. The default.
    #[default]
    SipHash13,
    /// xxh3-128, seeded. Faster, but collisions can be constructed on
    /// purpose: use it only when no untrusted party chooses keys.
    Xxh3,
}

impl KeyHashing {
    pub(crate) fn tag(self) -> u8 {
        match self {
            KeyHashing::SipHash13 => 1,
            KeyHashing::Xxh3 => 2,
        }
    }

    pub(crate) fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            1 => Some(KeyHashing::SipHash13),
            2 => Some(KeyHashing::Xxh3),
            _ => None,
        }
    }
}

/// Marks the entity domain in the length prefix of the hashed frame.
const ENTITY_DOMAIN: u32 = 1 << 31;

/// The 128-bit hash of a key, in two halves: `hi` picks the shard, `lo` feeds
/// the shard's hash table (whose tag bits are the top of `lo`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct KeyHash {
    pub hi: u64,
    pub lo: u64,
}

/// The persisted key-hash function: algorithm and secret.
#[derive(Clone)]
pub(crate) struct KeyHasher {
    kind: KeyHashing,
    secret: [u8; 16],
}

impl KeyHasher {
    pub(crate) fn new(kind: KeyHashing, secret: [u8; 16]) -> Self {
        Self { kind, secret }
    }

    pub(crate) fn kind(&self) -> KeyHashing {
        self.kind
    }

    pub(crate) fn secret(&self) -> [u8; 16] {
        self.secret
    }

    /// Hashes `len(scope) ‖ scope ‖ id`; the length prefix keeps
    /// `("ab","c")` and `("a","bc")` apart. Short keys are framed in a stack
    /// buffer and hashed in one shot: the streaming hashers set up (and
    /// copy through) a buffer of their own on every call, which costs more
    /// than the index lookup. Both paths give the same hash.
    pub(crate) fn hash(&self, scope: &[u8], id: &[u8]) -> KeyHash {
        self.hash_in(0, scope, id)
    }

    /// The hash of an entity key: another domain than event keys (the
    /// length prefix has its top bit set, which no scope length has), so an
    /// entity and an event key with the same scope and id never collide.
    pub(crate) fn hash_entity(&self, scope: &[u8], id: &[u8]) -> KeyHash {
        self.hash_in(ENTITY_DOMAIN, scope, id)
    }

    fn hash_in(&self, domain: u32, scope: &[u8], id: &[u8]) -> KeyHash {
        const SHORT: usize = 96;
        let total = 4 + scope.len() + id.len();
        let prefix = (scope.len() as u32 | domain).to_le_bytes();
        if total <= SHORT {
            let mut buf = [0u8; SHORT];
            buf[..4].copy_from_slice(&prefix);
            buf[4..4 + scope.len()].copy_from_slice(scope);
            buf[4 + scope.len()..total].copy_from_slice(id);
            return self.hash_framed(&buf[..total]);
        }
        self.hash_streaming(prefix, scope, id)
    }

    fn hash_framed(&self, framed: &[u8]) -> KeyHash {
        match self.kind {
            KeyHashing::SipHash13 => {
                let out = SipHasher13::new_with_key(&self.secret).hash(framed);
                KeyHash {
                    hi: out.h1,
                    lo: out.h2,
                }
            }
            KeyHashing::Xxh3 => {
                let out = xxhash_rust::xxh3::xxh3_128_with_seed(framed, self.seed());
                KeyHash {
                    hi: (out >> 64) as u64,
                    lo: out as u64,
                }
            }
        }
    }

    fn seed(&self) -> u64 {
        u64::from_le_bytes(self.secret[..8].try_into().unwrap_or([0; 8]))
    }

    fn hash_streaming(&self, len: [u8; 4], scope: &[u8], id: &[u8]) -> KeyHash {
        match self.kind {
            KeyHashing::SipHash13 => {
                let mut h = SipHasher13::new_with_key(&self.secret);
                std::hash::Hasher::write(&mut h, &len);
                std::hash::Hasher::write(&mut h, scope);
                std::hash::Hasher::write(&mut h, id);
                let out = h.finish128();
                KeyHash {
                    hi: out.h1,
                    lo: out.h2,
                }
            }
            KeyHashing::Xxh3 => {
                let mut h = xxhash_rust::xxh3::Xxh3::with_seed(self.seed());
                h.update(&len);
                h.update(scope);
                h.update(id);
                let out = h.digest128();
                KeyHash {
                    hi: (out >> 64) as u64,
                    lo: out as u64,
                }
            }
        }
    }
}

/// A 128-bit digest of a request's essential parameters.
///
/// Stored with a key at [`begin`](crate::Store::begin); a later `begin` of the
/// same key with a different fingerprint fails with
/// [`Error::FingerprintMismatch`](crate::Error::FingerprintMismatch) instead of
/// replaying an outcome that belongs to another request. Computed with
/// xxh3-128: it guards against client mistakes (a key reused for other
/// parameters), not against a client attacking its own keys.
///
/// # Examples
/// ```
/// use dedupkv::Fingerprint;
/// let a = Fingerprint::of(br#"{"amount":100,"currency":"EUR"}"#);
/// let b = Fingerprint::of(br#"{"amount":200,"currency":"EUR"}"#);
/// assert_ne!(a, b);
/// assert_eq!(a, Fingerprint::of(br#"{"amount":100,"currency":"EUR"}"#));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Fingerprint(pub u128);

impl Fingerprint {
    /// The fingerprint of some bytes (a canonical encoding of the parameters).
    ///
    /// # Examples
    /// ```
    /// let f = dedupkv::Fingerprint::of("charge 100 EUR to card 4242");
    /// assert_ne!(f, dedupkv::Fingerprint::NONE);
    /// ```
    pub fn of(bytes: impl AsRef<[u8]>) -> Self {
        Self(xxhash_rust::xxh3::xxh3_128(bytes.as_ref()))
    }

    /// The fingerprint of a serializable value, canonically: equal values
    /// give equal fingerprints whatever their types' map order, so a retry
    /// that rebuilt its request (a fresh `HashMap`, a parsed
    /// `serde_json::Value`) matches the first attempt.
    ///
    /// "Equal" is the JSON-like model of `docs/design.md` ("Canonical
    /// values"): every integer type is one kind (`5u8` equals `5i64`, but
    /// not `5.0`); floats compare by their `f64` bits with one NaN (`0.0`
    /// is not `-0.0`); `char` is a string; bytes are a sequence of
    /// integers; tuples and tuple structs are sequences; structs and maps
    /// are maps, compared as sets of entries; `None` and `()` are null,
    /// `Some(x)` and a newtype struct are `x`; enums are tagged like
    /// `serde_json` (a unit variant is its name, any other
    /// `{name: content}`). So a struct and a map or `serde_json::Value`
    /// with the same field names and values agree, and so do two services
    /// that serialize the same JSON.
    ///
    /// The digest is xxh3-128 of a version byte and the canonical
    /// encoding. It guards against a key reused for other parameters, not
    /// against a client that crafts collisions. Fingerprints of builds
    /// before the canonical encoding differ: see
    /// [`of_postcard`](Self::of_postcard).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a map
    /// that serializes a key twice (the message names the key and where),
    /// or a value nested deeper than 128 levels;
    /// [`Error::Codec`](crate::Error::Codec) if the value's `Serialize`
    /// fails.
    ///
    /// # Examples
    /// ```
    /// use std::collections::{BTreeMap, HashMap};
    /// use dedupkv::Fingerprint;
    ///
    /// #[derive(serde::Serialize)]
    /// struct Charge { amount: u64, currency: &'static str }
    /// let f = Fingerprint::of_value(&Charge { amount: 100, currency: "EUR" })?;
    ///
    /// let json: serde_json::Value = serde_json::from_str(r#"{"currency":"EUR","amount":100}"#).unwrap();
    /// assert_eq!(Fingerprint::of_value(&json)?, f);
    ///
    /// let a: HashMap<&str, u32> = [("x", 1), ("y", 2)].into();
    /// let b: BTreeMap<&str, u8> = [("y", 2), ("x", 1)].into();
    /// assert_eq!(Fingerprint::of_value(&a)?, Fingerprint::of_value(&b)?);
    /// assert_ne!(Fingerprint::of_value(&1)?, Fingerprint::of_value("1")?);
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn of_value<T: serde::Serialize + ?Sized>(value: &T) -> crate::Result<Self> {
        let value = crate::canon::to_value(value)?;
        Ok(Self(crate::canon::hash(
            crate::canon::FINGERPRINT_V1,
            &value,
        )?))
    }

    /// What `of_value` returned before it was canonical: xxh3-128 of the
    /// value's postcard encoding, which depends on map iteration order.
    /// Only for matching keys begun by such a build while they last.
    ///
    /// # Errors
    /// [`Error::Codec`](crate::Error::Codec) if postcard cannot encode the
    /// value.
    ///
    /// # Examples
    /// ```
    /// # #![allow(deprecated)]
    /// let f = dedupkv::Fingerprint::of_postcard(&(7u32, "x"))?;
    /// assert_eq!(f, dedupkv::Fingerprint::of([7, 1, b'x']));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    #[deprecated(
        since = "0.1.0",
        note = "depends on map iteration order; use `Fingerprint::of_value`"
    )]
    pub fn of_postcard<T: serde::Serialize + ?Sized>(value: &T) -> crate::Result<Self> {
        Ok(Self::of(crate::codec::to_postcard(value)?))
    }

    /// "No parameters": a key begun with `NONE` matches only `NONE`.
    pub const NONE: Fingerprint = Fingerprint(0);
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({:032x})", self.0)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The provider key of the operation on (`scope`, `id`) first claimed at
/// `first_at` (ms): SipHash-1-3-128 keyed with the store's persisted secret,
/// over a domain tag, `len(scope)`, scope, id, `first_at` and the request
/// fingerprint. `first_at` and the fingerprint are carried from attempt to
/// attempt (and in every claim record), so every attempt of one operation
/// gets the same key; a corrected request (after
/// `Failure::RetryableAnyRequest`) gets a new one, since a provider refuses
/// (or replays the old answer to) a key reused with other parameters. The
/// fixed-size fields after the variable ones keep the framing unambiguous.
pub(crate) fn provider_key(
    secret: &[u8; 16],
    scope: &[u8],
    id: &[u8],
    first_at: u64,
    fingerprint: u128,
) -> u128 {
    use std::hash::Hasher;
    let mut h = SipHasher13::new_with_key(secret);
    h.write(b"dedupkv provider key v2\0");
    h.write(&(scope.len() as u64).to_le_bytes());
    h.write(scope);
    h.write(id);
    h.write(&first_at.to_le_bytes());
    h.write(&fingerprint.to_le_bytes());
    h.finish128().as_u128()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefix_separates_scope_from_id() {
        for kind in [KeyHashing::SipHash13, KeyHashing::Xxh3] {
            let h = KeyHasher::new(kind, [7; 16]);
            assert_ne!(h.hash(b"ab", b"c"), h.hash(b"a", b"bc"));
            assert_eq!(h.hash(b"a", b"bc"), h.hash(b"a", b"bc"));
        }
    }

    #[test]
    fn one_shot_and_streaming_agree() {
        for kind in [KeyHashing::SipHash13, KeyHashing::Xxh3] {
            let h = KeyHasher::new(kind, [9; 16]);
            for (s, i) in [(0, 0), (3, 16), (10, 82), (10, 83), (50, 200)] {
                let scope = vec![b's'; s];
                let id = vec![b'i'; i];
                let len = (scope.len() as u32).to_le_bytes();
                assert_eq!(
                    h.hash(&scope, &id),
                    h.hash_streaming(len, &scope, &id),
                    "{kind:?} {s} {i}"
                );
                assert_ne!(h.hash(&scope, &id), h.hash_entity(&scope, &id));
            }
        }
    }

    #[test]
    fn secret_changes_the_hash() {
        let a = KeyHasher::new(KeyHashing::SipHash13, [1; 16]);
        let b = KeyHasher::new(KeyHashing::SipHash13, [2; 16]);
        assert_ne!(a.hash(b"s", b"i"), b.hash(b"s", b"i"));
    }
}
