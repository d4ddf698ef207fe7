//! The bodies of the records that carry more than an outcome: a dead
//! letter's, an intent's and a window's keys (see `Kind::DeadLetter`,
//! `Kind::Intent`, `Kind::Keys`), and the round a `Claim` or `Release`
//! record's claim belongs to.

use crate::types::intent::{Answered, Calls, Doubt};

/// What an `Intent` record says besides its claim fields. Version 2
/// (store format 4) records what the provider answered the operation's
/// calls:
///
/// ```text
/// version:u8 (=2) | recorded_at:u64 LE | target_len:u32 LE | target (UTF-8)
///                 | answer:u8 | flags:u8 | doubt:u8 | reference_hash:u64 LE
///                 | data (the rest)
/// ```
///
/// - `answer` ([`Answered`]): what the provider answered the latest call
///   (0 none yet, 1 accepted, 2 refused, 3 unknown, 4 asked: not found);
/// - `flags`: bit 0 `open` (an earlier call's fate is unknown and no
///   lookup settled it), bit 1 a reference is known (`reference_hash`,
///   xxh3-64 of the first reference the provider gave; 0 otherwise);
///   other bits 0;
/// - `doubt` ([`Doubt`]): why the operation is a candidate for a
///   duplicate effect (0 none);
/// - `data`: the request while no answer is recorded or the answer is
///   unknown, or the provider was asked and had none; the reference when
///   accepted; the reason when refused.
///
/// Version 1 (format 3) is `version:u8 (=1) | recorded_at | target_len |
/// target | data`, with `data` the request (`outcome_tag` pending) or the
/// reference (sent). It still reads: a sent one as accepted, and, if an
/// attempt after the first sent it, as [`Doubt::Unrecorded`] (format 3
/// kept no answers, and listed every such intent as a candidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IntentBody<'a> {
    /// When the intent was first recorded.
    pub recorded_at: u64,
    /// What is called (the caller's name for it).
    pub target: &'a str,
    /// What the provider answered the operation's calls, so far.
    pub calls: Calls,
    /// The request, the provider's reference or its reason (see above).
    pub data: &'a [u8],
}

/// The hash of a provider's reference that an intent keeps (so a later
/// reference can be compared with it whatever was stored since).
pub(crate) fn reference_hash(reference: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(reference)
}

const OPEN: u8 = 1;
const HAS_REFERENCE: u8 = 2;

impl<'a> IntentBody<'a> {
    /// The body as format 4 writes it (version 2).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let c = self.calls;
        let mut out = head(2, self.recorded_at, self.target, 11 + self.data.len());
        out.push(c.answer as u8);
        out.push((u8::from(c.open) * OPEN) | (u8::from(c.reference.is_some()) * HAS_REFERENCE));
        out.push(c.doubt as u8);
        out.extend_from_slice(&c.reference.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(self.data);
        out
    }

    /// The body as format 3 writes it (version 1): the time, the target
    /// and the data; what the provider answered is only the record's
    /// pending or sent tag.
    pub(crate) fn encode_v1(&self) -> Vec<u8> {
        let mut out = head(1, self.recorded_at, self.target, self.data.len());
        out.extend_from_slice(self.data);
        out
    }

    /// The body encoded in `bytes`, if well formed; `sent` and `attempt`
    /// are the record's (a version-1 body has nothing more to tell).
    pub(crate) fn decode(bytes: &'a [u8], sent: bool, attempt: u32) -> Option<Self> {
        let version = *bytes.first()?;
        let (recorded_at, target, rest) = read_head(bytes, version)?;
        let target = std::str::from_utf8(target).ok()?;
        let (calls, data) = match version {
            1 => {
                let calls = if sent {
                    Calls {
                        answer: Answered::Accepted,
                        reference: Some(reference_hash(rest)),
                        doubt: if attempt > 1 {
                            Doubt::Unrecorded
                        } else {
                            Doubt::None
                        },
                        ..Calls::FIRST
                    }
                } else {
                    Calls::FIRST
                };
                (calls, rest)
            }
            2 => {
                let (fixed, data) = rest.split_at_checked(11)?;
                let answer = match fixed[0] {
                    0 => Answered::None,
                    1 => Answered::Accepted,
                    2 => Answered::Refused,
                    3 => Answered::Unknown,
                    4 => Answered::Absent,
                    _ => return None,
                };
                let flags = fixed[1];
                if flags & !(OPEN | HAS_REFERENCE) != 0 {
                    return None;
                }
                let doubt = match fixed[2] {
                    0 => Doubt::None,
                    1 => Doubt::AfterUnknown,
                    2 => Doubt::TwoReferences,
                    3 => Doubt::Unrecorded,
                    _ => return None,
                };
                let hash = u64::from_le_bytes(fixed[3..].try_into().ok()?);
                let calls = Calls {
                    answer,
                    open: flags & OPEN != 0,
                    reference: (flags & HAS_REFERENCE != 0).then_some(hash),
                    doubt,
                };
                (calls, data)
            }
            _ => return None,
        };
        Some(IntentBody {
            recorded_at,
            target,
            calls,
            data,
        })
    }
}

/// What a `DeadLetter` record says besides its claim fields. Version 2
/// (store format 4) adds when the round's first failure came:
///
/// ```text
/// version:u8 (=2) | failed_at:u64 LE | reason_len:u32 LE | reason (UTF-8)
///                 | first_failed_at:u64 LE | has_payload:u8 (0 or 1) | payload (the rest)
/// ```
///
/// Version 1 (format 3) has no `first_failed_at`; it reads as 0 (not
/// recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeadLetterBody<'a> {
    /// When the last attempt failed and the operation was dead-lettered.
    pub failed_at: u64,
    /// When the first attempt of its round failed (a retryable failure, a
    /// dropped claim, a lapsed lease or a dead process); 0: not recorded.
    pub first_failed_at: u64,
    /// The caller's reason.
    pub reason: &'a str,
    /// The bytes the caller asked to keep, if any.
    pub payload: Option<&'a [u8]>,
}

impl<'a> DeadLetterBody<'a> {
    /// The body as format 4 writes it (version 2).
    pub(crate) fn encode(&self) -> Vec<u8> {
        self.encode_as(2)
    }

    /// The body as format 3 writes it (version 1: no first failure time).
    pub(crate) fn encode_v1(&self) -> Vec<u8> {
        self.encode_as(1)
    }

    fn encode_as(&self, version: u8) -> Vec<u8> {
        let payload = self.payload.unwrap_or_default();
        let first = if version >= 2 { 8 } else { 0 };
        let mut out = head(
            version,
            self.failed_at,
            self.reason,
            first + 1 + payload.len(),
        );
        if version >= 2 {
            out.extend_from_slice(&self.first_failed_at.to_le_bytes());
        }
        out.push(u8::from(self.payload.is_some()));
        out.extend_from_slice(payload);
        out
    }

    /// The body encoded in `bytes`, if well formed.
    pub(crate) fn decode(bytes: &'a [u8]) -> Option<Self> {
        let version = *bytes.first()?;
        let (failed_at, reason, rest) = read_head(bytes, version)?;
        let (first_failed_at, rest) = match version {
            1 => (0, rest),
            2 => {
                let (first, rest) = rest.split_at_checked(8)?;
                (u64::from_le_bytes(first.try_into().ok()?), rest)
            }
            _ => return None,
        };
        let (&has, payload) = rest.split_first()?;
        let payload = match has {
            0 if payload.is_empty() => None,
            1 => Some(payload),
            _ => return None,
        };
        Some(DeadLetterBody {
            failed_at,
            first_failed_at,
            reason: std::str::from_utf8(reason).ok()?,
            payload,
        })
    }
}

/// What a `Keys` record holds: as many keys as the record's count, each
///
/// ```text
/// version:u8 (=1) | ( id_len:var | id | provider_key:u128 LE | at_offset:var ){count}
/// ```
///
/// `at_offset` is the completion's time in ms after the window's start;
/// `var` an unsigned LEB128 varint. A key with a 16-byte id takes 36
/// bytes or so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeysBody<'a> {
    keys: &'a [u8],
    count: u64,
}

/// One key of a [`KeysBody`].
pub(crate) type KeyOf<'a> = (&'a [u8], u128, u64);

impl<'a> KeysBody<'a> {
    const VERSION: u8 = 1;

    /// An empty body, to [`push`](Self::push) keys onto.
    pub(crate) fn start() -> Vec<u8> {
        vec![Self::VERSION]
    }

    /// Appends a key to an encoded body.
    pub(crate) fn push(out: &mut Vec<u8>, (id, provider_key, at_offset): KeyOf<'_>) {
        put_var(out, id.len() as u64);
        out.extend_from_slice(id);
        out.extend_from_slice(&provider_key.to_le_bytes());
        put_var(out, at_offset);
    }

    /// The body encoded in `bytes` with `count` keys, if well formed:
    /// every key whole and nothing after the last.
    pub(crate) fn decode(bytes: &'a [u8], count: u64) -> Option<Self> {
        let (&v, keys) = bytes.split_first()?;
        if v != Self::VERSION {
            return None;
        }
        let mut rest = keys;
        for _ in 0..count {
            rest = read_key(rest)?.1;
        }
        rest.is_empty().then_some(KeysBody { keys, count })
    }

    /// The keys: (id, provider key, ms after the window's start).
    pub(crate) fn iter(&self) -> impl Iterator<Item = KeyOf<'a>> + use<'a> {
        let mut rest = self.keys;
        std::iter::from_fn(move || {
            let (key, more) = read_key(rest)?;
            rest = more;
            Some(key)
        })
    }
}

/// The round of attempts a `Claim` or `Release` record's claim belongs
/// to, in that record's outcome (which is empty for an operation's first
/// round while none of its attempts failed or was interrupted). Version 2
/// (store format 4) adds when the round's first failure came:
///
/// ```text
/// version:u8 (=2) | before:u32 LE | since:u64 LE | interrupted:u32 LE | first_failed_at:u64 LE
/// ```
///
/// Version 1 (format 3) is the first four fields; `first_failed_at` reads
/// as 0 (none recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoundBody {
    /// Attempts of earlier rounds.
    pub before: u32,
    /// When the round began (ms).
    pub since: u64,
    /// Attempts of this round that ended without an answer.
    pub interrupted: u32,
    /// When the round's first failure came (ms; 0: none yet).
    pub first_failed_at: u64,
}

/// The length of an encoded [`RoundBody`] (version 2).
pub(crate) const ROUND_BODY_LEN: usize = 25;
/// The length of a version-1 [`RoundBody`].
const ROUND_BODY_V1_LEN: usize = 17;

impl RoundBody {
    /// The body as format 4 writes it (version 2), and its length.
    pub(crate) fn encode(&self) -> ([u8; ROUND_BODY_LEN], usize) {
        let mut out = [0; ROUND_BODY_LEN];
        out[0] = 2;
        out[1..5].copy_from_slice(&self.before.to_le_bytes());
        out[5..13].copy_from_slice(&self.since.to_le_bytes());
        out[13..17].copy_from_slice(&self.interrupted.to_le_bytes());
        out[17..].copy_from_slice(&self.first_failed_at.to_le_bytes());
        (out, ROUND_BODY_LEN)
    }

    /// The body as format 3 writes it (version 1, no first failure time),
    /// and its length.
    pub(crate) fn encode_v1(&self) -> ([u8; ROUND_BODY_LEN], usize) {
        let (mut out, _) = self.encode();
        out[0] = 1;
        out[ROUND_BODY_V1_LEN..].fill(0);
        (out, ROUND_BODY_V1_LEN)
    }

    /// The body encoded in `bytes`, if well formed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let first_failed_at = match (bytes.first()?, bytes.len()) {
            (1, ROUND_BODY_V1_LEN) => 0,
            (2, ROUND_BODY_LEN) => u64::from_le_bytes(bytes[17..].try_into().ok()?),
            _ => return None,
        };
        Some(RoundBody {
            before: u32::from_le_bytes(bytes[1..5].try_into().ok()?),
            since: u64::from_le_bytes(bytes[5..13].try_into().ok()?),
            interrupted: u32::from_le_bytes(bytes[13..17].try_into().ok()?),
            first_failed_at,
        })
    }
}

/// One key of a keys body, and what follows it.
fn read_key(bytes: &[u8]) -> Option<(KeyOf<'_>, &[u8])> {
    let (len, rest) = read_var(bytes)?;
    let (id, rest) = rest.split_at_checked(usize::try_from(len).ok()?)?;
    let (pk, rest) = rest.split_at_checked(16)?;
    let (at, rest) = read_var(rest)?;
    Some(((id, u128::from_le_bytes(pk.try_into().ok()?), at), rest))
}

fn put_var(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// An unsigned LEB128 varint of at most 64 bits, and what follows it.
fn read_var(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        let part = u64::from(b & 0x7f);
        if i == 9 && part > 1 {
            return None;
        }
        v |= part << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, &bytes[i + 1..]));
        }
    }
    None
}

/// The head both bodies share: `version | time:u64 LE | len:u32 LE |
/// text`, with room for `rest` more bytes.
fn head(version: u8, time: u64, text: &str, rest: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + text.len() + rest);
    out.push(version);
    out.extend_from_slice(&time.to_le_bytes());
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// The time, the text's bytes and the rest of a body whose head is
/// `version`'s, if well formed (the text's UTF-8 is the caller's check).
fn read_head(bytes: &[u8], version: u8) -> Option<(u64, &[u8], &[u8])> {
    let (&v, rest) = bytes.split_first()?;
    if v != version {
        return None;
    }
    let (at, rest) = rest.split_at_checked(8)?;
    let (len, rest) = rest.split_at_checked(4)?;
    let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
    let (text, rest) = rest.split_at_checked(len)?;
    Some((u64::from_le_bytes(at.try_into().ok()?), text, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_body_round_trips_and_refuses_damage() {
        let mut body = KeysBody::start();
        KeysBody::push(&mut body, (b"order-1", 7, 0));
        KeysBody::push(&mut body, (b"", u128::MAX, u64::MAX));
        let back = KeysBody::decode(&body, 2).expect("well formed");
        let keys: Vec<_> = back.iter().collect();
        assert_eq!(
            keys,
            vec![(&b"order-1"[..], 7, 0), (&b""[..], u128::MAX, u64::MAX)]
        );
        assert_eq!(back.count, 2);
        assert!(
            KeysBody::decode(&body, 1).is_none(),
            "bytes after the count"
        );
        assert!(KeysBody::decode(&body, 3).is_none(), "a key missing");
        for cut in 0..body.len() {
            assert!(KeysBody::decode(&body[..cut], 2).is_none(), "cut at {cut}");
        }
        let mut other = body.clone();
        other[0] = 2;
        assert!(KeysBody::decode(&other, 2).is_none(), "another version");
        assert!(
            KeysBody::decode(
                &[
                    1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f
                ],
                1
            )
            .is_none()
        );
    }

    #[test]
    fn a_round_body_round_trips_and_refuses_damage() {
        for body in [
            RoundBody {
                before: 0,
                since: 0,
                interrupted: 1,
                first_failed_at: 0,
            },
            RoundBody {
                before: u32::MAX,
                since: u64::MAX,
                interrupted: u32::MAX,
                first_failed_at: u64::MAX,
            },
        ] {
            let (bytes, len) = body.encode();
            assert_eq!(len, bytes.len());
            assert_eq!(RoundBody::decode(&bytes), Some(body));
            for n in 0..bytes.len() {
                if n != 17 {
                    assert_eq!(RoundBody::decode(&bytes[..n]), None, "cut at {n}");
                }
            }
            let mut longer = bytes.to_vec();
            longer.push(0);
            assert_eq!(RoundBody::decode(&longer), None);
            for v in [0, 3] {
                let mut other = bytes;
                other[0] = v;
                assert_eq!(RoundBody::decode(&other), None, "version {v}");
            }
            // Format 3's: the first four fields, no first failure time.
            let (v1, len) = body.encode_v1();
            assert_eq!((v1[0], len), (1, 17));
            let back = RoundBody::decode(&v1[..len]).expect("version 1");
            assert_eq!(
                back,
                RoundBody {
                    first_failed_at: 0,
                    ..body
                }
            );
            assert_eq!(RoundBody::decode(&bytes[..17]), None, "a cut version 2");
        }
    }

    #[test]
    fn a_dead_letter_body_round_trips_and_refuses_damage() {
        for (reason, payload) in [
            ("", None),
            ("timeout after 5 attempts", Some(&b"{\"order\":7}"[..])),
            ("é", Some(&b""[..])),
        ] {
            let body = DeadLetterBody {
                failed_at: u64::MAX,
                first_failed_at: 1_700_000_000_000,
                reason,
                payload,
            };
            let bytes = body.encode();
            assert_eq!(DeadLetterBody::decode(&bytes), Some(body));
            // Every truncation up to the payload (whose end the row's
            // checksum guards), and every bad version or flag, is refused.
            let flag = 1 + 8 + 4 + reason.len() + 8;
            for n in 0..=flag {
                assert_eq!(DeadLetterBody::decode(&bytes[..n]), None, "{n}");
            }
            let mut bad = bytes.clone();
            bad[0] = 3;
            assert_eq!(DeadLetterBody::decode(&bad), None);
            bad = bytes.clone();
            bad[flag] = 2;
            assert_eq!(DeadLetterBody::decode(&bad), None);
            // Format 3's: no first failure time.
            let v1 = body.encode_v1();
            assert_eq!(v1.len(), bytes.len() - 8);
            assert_eq!(
                DeadLetterBody::decode(&v1),
                Some(DeadLetterBody {
                    first_failed_at: 0,
                    ..body
                })
            );
        }
        assert_eq!(DeadLetterBody::decode(&[1, 0, 0]), None);
        // A reason that is not UTF-8.
        let mut raw = vec![1];
        raw.extend_from_slice(&0u64.to_le_bytes());
        raw.extend_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(&[0xff, 0]);
        assert_eq!(DeadLetterBody::decode(&raw), None);
    }

    #[test]
    fn an_intent_body_round_trips_and_refuses_damage() {
        let calls = [
            Calls::FIRST,
            Calls {
                answer: Answered::Unknown,
                open: true,
                reference: None,
                doubt: Doubt::AfterUnknown,
            },
            Calls {
                answer: Answered::Accepted,
                open: false,
                reference: Some(u64::MAX - 3),
                doubt: Doubt::TwoReferences,
            },
            Calls {
                answer: Answered::Refused,
                open: true,
                reference: Some(0),
                doubt: Doubt::Unrecorded,
            },
            Calls {
                answer: Answered::Absent,
                ..Calls::FIRST
            },
        ];
        for (target, data) in [("", &b""[..]), ("shipping", &b"{\"order\":7}"[..])] {
            for calls in calls {
                let body = IntentBody {
                    recorded_at: 1_700_000_000_000,
                    target,
                    calls,
                    data,
                };
                let bytes = body.encode();
                assert_eq!(IntentBody::decode(&bytes, false, 1), Some(body));
                for n in 0..13 + target.len() + 11 {
                    assert_eq!(IntentBody::decode(&bytes[..n], false, 1), None, "{n}");
                }
                for (at, bad) in [(0, 9), (13 + target.len(), 5), (14 + target.len(), 4)] {
                    let mut b = bytes.clone();
                    b[at] = bad;
                    assert_eq!(IntentBody::decode(&b, false, 1), None, "byte {at}");
                }
                let mut b = bytes.clone();
                b[15 + target.len()] = 4;
                assert_eq!(IntentBody::decode(&b, false, 1), None, "doubt");
            }
        }
    }

    #[test]
    fn a_format_3_intent_body_reads_as_pending_or_accepted() {
        let body = IntentBody {
            recorded_at: 7,
            target: "carrier",
            calls: Calls::FIRST,
            data: b"1Z999",
        };
        let v1 = body.encode_v1();
        assert_eq!(v1.len(), 13 + 7 + 5, "format 3's layout");
        assert_eq!(IntentBody::decode(&v1, false, 2), Some(body), "pending");
        let sent = IntentBody::decode(&v1, true, 1).expect("sent");
        assert_eq!(
            (
                sent.calls.answer,
                sent.calls.reference,
                sent.calls.doubt,
                sent.data
            ),
            (
                Answered::Accepted,
                Some(reference_hash(b"1Z999")),
                Doubt::None,
                &b"1Z999"[..]
            )
        );
        let later = IntentBody::decode(&v1, true, 2).expect("sent");
        assert_eq!(
            later.calls.doubt,
            Doubt::Unrecorded,
            "listed as format 3 did"
        );
    }
}
