//! Intents before external calls (an outbox): what the caller records
//! ([`Intent`]) and what the store lists ([`IntentEntry`]).

use std::time::SystemTime;

use crate::clock::to_system_time;
use crate::key::Key;

/// An intent to call an external system (a payment API, a carrier, an
/// email service) for an operation, recorded with
/// [`Store::begin_with_intent`](crate::Store::begin_with_intent) in the
/// claim's own commit, before the call.
///
/// # Examples
/// ```
/// use dedupkv::{Begin, BeginOptions, Fingerprint, Intent, Key, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("shop-42", "ship-order-7");
/// let intent = Intent { target: "carrier", request: b"{\"order\":7}" };
/// let Begin::Started(claim) = store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent)? else { unreachable!() };
/// // call the carrier with Idempotency-Key: claim.provider_key() ...
/// store.mark_sent(&claim, b"tracking 1Z999")?; // it answered
/// store.complete(&claim, b"1Z999")?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intent<'a> {
    /// What is called: the caller's name for the system (for the operator).
    pub target: &'a str,
    /// The request as it will be sent (for reconciliation and replay).
    pub request: &'a [u8],
}

/// A recorded intent, as [`Store::intent`](crate::Store::intent) and the
/// listings show it.
///
/// # Examples
/// ```
/// use dedupkv::{Begin, BeginOptions, Fingerprint, Intent, Key, Listing, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("shop-42", "charge-9");
/// let intent = Intent { target: "payments", request: b"100 EUR" };
/// let Begin::Started(claim) = store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent)? else { unreachable!() };
/// let pending = store.pending_intents(&Listing::new())?;
/// let e = &pending.items[0];
/// assert_eq!((e.key(), e.target(), e.request(), e.is_sent()), (&key, "payments", Some(&b"100 EUR"[..]), false));
/// assert_eq!(e.provider_key(), claim.provider_key()); // what to ask the provider about
/// # store.complete(&claim, b"")?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentEntry {
    pub(crate) key: Key<'static>,
    pub(crate) target: String,
    pub(crate) sent: bool,
    pub(crate) data: Vec<u8>,
    pub(crate) provider_key: u128,
    pub(crate) recorded_at: u64,
    pub(crate) attempt: u32,
}

impl IntentEntry {
    /// The operation's key.
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn key(&self) -> &Key<'static> {
        &self.key
    }

    /// What is called.
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The request, while the intent is unanswered.
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn request(&self) -> Option<&[u8]> {
        (!self.sent).then_some(self.data.as_slice())
    }

    /// The provider's reference, once [`mark_sent`](crate::Store::mark_sent)
    /// recorded it.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Begin, BeginOptions, Fingerprint, Intent, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "op");
    /// # let Begin::Started(c) = store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), Intent { target: "x", request: b"r" })? else { unreachable!() };
    /// store.mark_sent(&c, b"ref-1")?;
    /// assert_eq!(store.intent(&key)?.expect("recorded").reference(), Some(&b"ref-1"[..]));
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn reference(&self) -> Option<&[u8]> {
        self.sent.then_some(self.data.as_slice())
    }

    /// Whether the provider answered.
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn is_sent(&self) -> bool {
        self.sent
    }

    /// The operation's provider idempotency key: the same on every attempt
    /// (see [`Claim::provider_key`](crate::Claim::provider_key)).
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn provider_key(&self) -> String {
        format!("{:032x}", self.provider_key)
    }

    /// When the intent was first recorded.
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn recorded_at(&self) -> SystemTime {
        to_system_time(self.recorded_at)
    }

    /// The attempt that recorded it (or, sent, marked it sent).
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}
