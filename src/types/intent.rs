//! Intents before external calls (an outbox): what the caller records
//! ([`Intent`], then each [`Answer`] of the provider) and what the store
//! lists ([`IntentEntry`], with its [`Duplicate`] doubt if any).

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
/// let idempotency_key = claim.provider_key()?;
/// // call the carrier with `Idempotency-Key: {idempotency_key}` ...
/// store.mark_sent(&claim, b"tracking 1Z999")?; // it accepted: Answer::Accepted
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

/// What the provider answered, recorded with
/// [`Store::mark_answered`](crate::Store::mark_answered): to this attempt's
/// call (accepted, refused, no answer), or, asked before calling again,
/// about the operation's calls (found, not found).
///
/// What is recorded decides what
/// [`duplicate_candidates`](crate::Store::duplicate_candidates) lists: an
/// operation where more than one call may have reached the provider and
/// the provider did not confirm one effect.
///
/// # Examples
/// ```
/// use dedupkv::{Answer, Begin, BeginOptions, Fingerprint, Intent, Key, Listing, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("shop-42", "ship-7");
/// let intent = Intent { target: "carrier", request: b"order 7" };
/// let begin = || store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent);
/// let Begin::Started(c) = begin()? else { unreachable!() };
/// store.mark_answered(&c, Answer::Refused("503 Service Unavailable"))?;
/// drop(c); // released for a retry
/// let Begin::Started(c) = begin()? else { unreachable!() };
/// assert!(!c.unanswered_intent(), "refused: nothing to ask about");
/// store.mark_answered(&c, Answer::Unknown)?; // timed out
/// drop(c);
/// let Begin::Started(c) = begin()? else { unreachable!() };
/// assert!(c.unanswered_intent()); // ask the carrier first
/// store.mark_answered(&c, Answer::Found(b"1Z999"))?; // it has the shipment
/// store.complete(&c, b"1Z999")?;
/// assert!(store.duplicate_candidates(&Listing::new())?.items.is_empty());
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer<'a> {
    /// The provider accepted this attempt's call: its reference (a
    /// tracking number, a charge id). [`Store::mark_sent`](crate::Store::mark_sent)
    /// records this.
    Accepted(&'a [u8]),
    /// The provider refused this attempt's call (a 503, a 400, a declined
    /// card): it had no effect. The reason, for the operator.
    Refused(&'a str),
    /// No answer came to this attempt's call (a timeout, a dropped
    /// connection): it may or may not have happened. The intent stays
    /// unanswered, so the next attempt is told to ask first.
    Unknown,
    /// Asked with the provider key before calling again, the provider has
    /// the operation's call: its reference. Settles every earlier call
    /// whose fate was unknown.
    Found(&'a [u8]),
    /// Asked, the provider has no call with the operation's provider key:
    /// every earlier call whose fate was unknown had no effect. This
    /// attempt may call now (record that call's answer, [`Unknown`](Self::Unknown)
    /// included): until it does, the intent stays unanswered. If the
    /// attempt gives up instead ([`Failure::Exhausted`](crate::Failure::Exhausted)),
    /// the intent is settled: nothing happened.
    NotFound,
}

/// Why [`duplicate_candidates`](crate::Store::duplicate_candidates) lists
/// an operation ([`IntentEntry::duplicate`]).
///
/// # Examples
/// ```
/// use dedupkv::{Answer, Begin, BeginOptions, Duplicate, Fingerprint, Intent, Key, Listing, Store};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = Store::open(dir.path().join("s.redb"))?;
/// let key = Key::new("shop-42", "ship-7");
/// let intent = Intent { target: "carrier", request: b"order 7" };
/// let begin = || store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), intent);
/// let Begin::Started(c) = begin()? else { unreachable!() };
/// store.mark_sent(&c, b"1Z001")?;
/// drop(c); // the worker died before it completed
/// let Begin::Started(c) = begin()? else { unreachable!() };
/// store.mark_sent(&c, b"1Z002")?; // a carrier that does not deduplicate
/// store.complete(&c, b"1Z002")?;
/// let twice = store.duplicate_candidates(&Listing::new())?;
/// assert_eq!(twice.items[0].duplicate(), Some(Duplicate::TwoReferences));
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Duplicate {
    /// A call whose fate was unknown (no answer recorded before the next
    /// attempt, or [`Answer::Unknown`]) was followed by another call
    /// accepted or unanswered, without asking the provider in between.
    AfterUnknown,
    /// The provider accepted two calls with different references: it did
    /// not deduplicate them.
    TwoReferences,
    /// Recorded by an older build (store format 3), which kept no
    /// answers: marked sent by an attempt after the first.
    Unrecorded,
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
/// assert_eq!(e.provider_key(), claim.provider_key()?); // what to ask the provider about
/// # store.complete(&claim, b"")?;
/// # Ok::<(), dedupkv::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentEntry {
    pub(crate) key: Key<'static>,
    pub(crate) target: String,
    pub(crate) answer: Answered,
    pub(crate) unanswered: bool,
    pub(crate) duplicate: Option<Duplicate>,
    /// The request, the reference or the reason (see `answer`).
    pub(crate) data: Vec<u8>,
    pub(crate) provider_key: u128,
    pub(crate) recorded_at: u64,
    pub(crate) attempt: u32,
}

impl IntentEntry {
    /// An intent entry for a backend of the [contract](crate::contract)
    /// building its listings: the operation's `key`, what is called
    /// (`target`) with `request`, the provider's `answer` to the latest
    /// call (`None`: none recorded yet), the operation's provider key (as
    /// [`provider_key`](Self::provider_key) shows it, in hex), when the
    /// intent was first recorded and the attempt that last wrote it. It
    /// is unanswered as the answer says (no answer, [`Answer::Unknown`] or
    /// [`Answer::NotFound`]) unless [`with_open_call`](Self::with_open_call)
    /// says an earlier call's fate is open; no doubt unless
    /// [`with_duplicate`](Self::with_duplicate) gives one.
    ///
    /// # Examples
    /// ```
    /// use dedupkv::{Answer, Duplicate, IntentEntry, Key};
    /// use std::time::UNIX_EPOCH;
    ///
    /// let key = Key::new("shop-42", "ship-7").into_owned();
    /// let e = IntentEntry::new(key, "carrier", b"order 7", Some(Answer::Accepted(b"1Z")), 0xab, UNIX_EPOCH, 2);
    /// assert_eq!((e.reference(), e.request(), e.is_sent()), (Some(&b"1Z"[..]), None, true));
    /// let e = e.with_open_call().with_duplicate(Duplicate::AfterUnknown);
    /// assert!(!e.is_sent());
    /// assert_eq!(e.duplicate(), Some(Duplicate::AfterUnknown));
    /// ```
    #[must_use]
    pub fn new(
        key: Key<'static>,
        target: impl Into<String>,
        request: &[u8],
        answer: Option<Answer<'_>>,
        provider_key: u128,
        recorded_at: SystemTime,
        attempt: u32,
    ) -> IntentEntry {
        let (answer, data) = match answer {
            None => (Answered::None, request),
            Some(Answer::Accepted(r) | Answer::Found(r)) => (Answered::Accepted, r),
            Some(Answer::Refused(reason)) => (Answered::Refused, reason.as_bytes()),
            Some(Answer::Unknown) => (Answered::Unknown, request),
            Some(Answer::NotFound) => (Answered::Absent, request),
        };
        IntentEntry {
            key,
            target: target.into(),
            answer,
            unanswered: matches!(
                answer,
                Answered::None | Answered::Unknown | Answered::Absent
            ),
            duplicate: None,
            data: data.to_vec(),
            provider_key,
            recorded_at: crate::clock::to_ms(recorded_at),
            attempt,
        }
    }

    /// This entry with an earlier call's fate open (no answer came to it
    /// and no lookup settled it): unanswered, whatever the latest call's
    /// answer.
    ///
    /// # Examples
    /// See [`IntentEntry::new`].
    #[must_use]
    pub fn with_open_call(mut self) -> IntentEntry {
        self.unanswered = true;
        self
    }

    /// This entry with the doubt `duplicate` (what
    /// [`duplicate_candidates`](crate::Store::duplicate_candidates) lists).
    ///
    /// # Examples
    /// See [`IntentEntry::new`].
    #[must_use]
    pub fn with_duplicate(mut self, duplicate: Duplicate) -> IntentEntry {
        self.duplicate = Some(duplicate);
        self
    }

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

    /// The request, while no answer to the latest call is recorded (or
    /// the answer was [`Answer::Unknown`]).
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn request(&self) -> Option<&[u8]> {
        matches!(
            self.answer,
            Answered::None | Answered::Unknown | Answered::Absent
        )
        .then_some(self.data.as_slice())
    }

    /// The provider's reference, once it accepted the latest call
    /// ([`mark_sent`](crate::Store::mark_sent), [`Answer::Accepted`] or
    /// [`Answer::Found`]).
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
        (self.answer == Answered::Accepted).then_some(self.data.as_slice())
    }

    /// What the provider answered the latest call: `None` while no answer
    /// is recorded; otherwise [`Answer::Accepted`] (also for an answer
    /// [`Found`](Answer::Found) by asking), [`Answer::Refused`],
    /// [`Answer::Unknown`], or [`Answer::NotFound`] (asked, it had none,
    /// and no call's answer came since).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::{Answer, Begin, BeginOptions, Fingerprint, Intent, Key, Store};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = Store::open(dir.path().join("s.redb"))?;
    /// # let key = Key::new("t", "op");
    /// # let Begin::Started(c) = store.begin_with_intent(&key, Fingerprint::NONE, &BeginOptions::new(), Intent { target: "x", request: b"r" })? else { unreachable!() };
    /// assert_eq!(store.intent(&key)?.expect("recorded").answer(), None);
    /// store.mark_answered(&c, Answer::Refused("429 Too Many Requests"))?;
    /// let e = store.intent(&key)?.expect("recorded");
    /// assert_eq!(e.answer(), Some(Answer::Refused("429 Too Many Requests")));
    /// assert!(e.is_sent() && e.request().is_none());
    /// # Ok::<(), dedupkv::Error>(())
    /// ```
    pub fn answer(&self) -> Option<Answer<'_>> {
        match self.answer {
            Answered::None => None,
            Answered::Accepted => Some(Answer::Accepted(&self.data)),
            Answered::Refused => Some(Answer::Refused(
                std::str::from_utf8(&self.data).unwrap_or_default(),
            )),
            Answered::Unknown => Some(Answer::Unknown),
            Answered::Absent => Some(Answer::NotFound),
        }
    }

    /// Whether the provider's answer settled the operation's calls: it
    /// accepted or refused the latest one, and no earlier call's fate is
    /// unknown. Otherwise the intent is unanswered: listed by
    /// [`pending_intents`](crate::Store::pending_intents) while its
    /// operation is open.
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn is_sent(&self) -> bool {
        !self.unanswered
    }

    /// Why the operation may have had its effect twice, if it may (what
    /// [`duplicate_candidates`](crate::Store::duplicate_candidates) lists).
    ///
    /// # Examples
    /// See [`Duplicate`].
    pub fn duplicate(&self) -> Option<Duplicate> {
        self.duplicate
    }

    /// The operation's provider idempotency key, to ask the provider
    /// about: the one [`Claim::provider_key`](crate::Claim::provider_key)
    /// gives every attempt of the operation, on every owner (a call was
    /// only ever made with a key that method gave, so with a key every
    /// later owner derives as well).
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

    /// The attempt that last wrote it (recorded it, or recorded an answer).
    ///
    /// # Examples
    /// See [`IntentEntry`].
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// What the provider answered an operation's latest call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answered {
    /// No answer recorded yet: the call may be under way, or done.
    None = 0,
    /// The provider accepted it (it said so, or, asked, it has it).
    Accepted = 1,
    /// The provider refused it: no effect.
    Refused = 2,
    /// No answer came (a timeout): it may or may not have happened.
    Unknown = 3,
    /// Asked before calling again, the provider had no call: nothing
    /// happened so far, and this attempt may call now.
    Absent = 4,
}

/// Why an operation may have had its external effect twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Doubt {
    /// None: at most one call reached the provider, or it confirmed one
    /// effect (the same reference every time).
    None = 0,
    /// A call of unknown fate was followed by another call.
    AfterUnknown = 1,
    /// The provider accepted two calls with different references.
    TwoReferences = 2,
    /// A format-3 record: sent by an attempt after the first, with no
    /// answers recorded to tell.
    Unrecorded = 3,
}

/// What an operation's `Intent` record says about its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Calls {
    pub answer: Answered,
    /// An earlier call's fate is unknown, and no lookup settled it.
    pub open: bool,
    /// xxh3-64 of the first reference the provider gave (it tells a
    /// second reference from the first; a collision would hide one
    /// doubt in 2^64).
    pub reference: Option<u64>,
    pub doubt: Doubt,
}

impl Calls {
    /// An operation's first intent: no call answered, none open.
    pub(crate) const FIRST: Calls = Calls {
        answer: Answered::None,
        open: false,
        reference: None,
        doubt: Doubt::None,
    };
}
