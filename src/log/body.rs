//! The bodies of the records that carry more than an outcome: a dead
//! letter's and an intent's (see `Kind::DeadLetter`, `Kind::Intent`), and
//! the round a `Claim` or `Release` record's claim belongs to.

/// What an `Intent` record says besides its claim fields:
///
/// ```text
/// version:u8 (=1) | recorded_at:u64 LE | target_len:u32 LE | target (UTF-8)
///                 | data (the rest: the request, or once sent the reference)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IntentBody<'a> {
    /// When the intent was first recorded.
    pub recorded_at: u64,
    /// What is called (the caller's name for it).
    pub target: &'a str,
    /// The request (pending), or the provider's reference (sent).
    pub data: &'a [u8],
}

impl<'a> IntentBody<'a> {
    const VERSION: u8 = 1;

    /// The encoded body.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = head(
            Self::VERSION,
            self.recorded_at,
            self.target,
            self.data.len(),
        );
        out.extend_from_slice(self.data);
        out
    }

    /// The body encoded in `bytes`, if well formed.
    pub(crate) fn decode(bytes: &'a [u8]) -> Option<Self> {
        let (recorded_at, target, data) = read_head(bytes, Self::VERSION)?;
        Some(IntentBody {
            recorded_at,
            target: std::str::from_utf8(target).ok()?,
            data,
        })
    }
}

/// What a `DeadLetter` record says besides its claim fields:
///
/// ```text
/// version:u8 (=1) | failed_at:u64 LE | reason_len:u32 LE | reason (UTF-8)
///                 | has_payload:u8 (0 or 1) | payload (the rest)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeadLetterBody<'a> {
    /// When the last attempt failed and the operation was dead-lettered.
    pub failed_at: u64,
    /// The caller's reason.
    pub reason: &'a str,
    /// The bytes the caller asked to keep, if any.
    pub payload: Option<&'a [u8]>,
}

impl<'a> DeadLetterBody<'a> {
    const VERSION: u8 = 1;

    /// The encoded body.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let payload = self.payload.unwrap_or_default();
        let mut out = head(
            Self::VERSION,
            self.failed_at,
            self.reason,
            1 + payload.len(),
        );
        out.push(u8::from(self.payload.is_some()));
        out.extend_from_slice(payload);
        out
    }

    /// The body encoded in `bytes`, if well formed.
    pub(crate) fn decode(bytes: &'a [u8]) -> Option<Self> {
        let (failed_at, reason, rest) = read_head(bytes, Self::VERSION)?;
        let (&has, payload) = rest.split_first()?;
        let payload = match has {
            0 if payload.is_empty() => None,
            1 => Some(payload),
            _ => return None,
        };
        Some(DeadLetterBody {
            failed_at,
            reason: std::str::from_utf8(reason).ok()?,
            payload,
        })
    }
}

/// The round of attempts a `Claim` or `Release` record's claim belongs
/// to, in that record's outcome (which is empty for an operation's first
/// round while none of its attempts was interrupted):
///
/// ```text
/// version:u8 (=1) | before:u32 LE | since:u64 LE | interrupted:u32 LE
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoundBody {
    /// Attempts of earlier rounds.
    pub before: u32,
    /// When the round began (ms).
    pub since: u64,
    /// Attempts of this round that ended without an answer.
    pub interrupted: u32,
}

/// The length of an encoded [`RoundBody`].
pub(crate) const ROUND_BODY_LEN: usize = 17;

impl RoundBody {
    const VERSION: u8 = 1;

    /// The encoded body.
    pub(crate) fn encode(&self) -> [u8; ROUND_BODY_LEN] {
        let mut out = [0; ROUND_BODY_LEN];
        out[0] = Self::VERSION;
        out[1..5].copy_from_slice(&self.before.to_le_bytes());
        out[5..13].copy_from_slice(&self.since.to_le_bytes());
        out[13..].copy_from_slice(&self.interrupted.to_le_bytes());
        out
    }

    /// The body encoded in `bytes`, if well formed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; ROUND_BODY_LEN] = bytes.try_into().ok()?;
        if bytes[0] != Self::VERSION {
            return None;
        }
        Some(RoundBody {
            before: u32::from_le_bytes(bytes[1..5].try_into().ok()?),
            since: u64::from_le_bytes(bytes[5..13].try_into().ok()?),
            interrupted: u32::from_le_bytes(bytes[13..].try_into().ok()?),
        })
    }
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
    fn a_round_body_round_trips_and_refuses_damage() {
        for body in [
            RoundBody {
                before: 0,
                since: 0,
                interrupted: 1,
            },
            RoundBody {
                before: u32::MAX,
                since: u64::MAX,
                interrupted: u32::MAX,
            },
        ] {
            let bytes = body.encode();
            assert_eq!(RoundBody::decode(&bytes), Some(body));
            for n in 0..bytes.len() {
                assert_eq!(RoundBody::decode(&bytes[..n]), None, "cut at {n}");
            }
            let mut longer = bytes.to_vec();
            longer.push(0);
            assert_eq!(RoundBody::decode(&longer), None);
            let mut other = bytes;
            other[0] = 2;
            assert_eq!(RoundBody::decode(&other), None, "another version");
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
                reason,
                payload,
            };
            let bytes = body.encode();
            assert_eq!(DeadLetterBody::decode(&bytes), Some(body));
            // Every truncation up to the payload (whose end the row's
            // checksum guards), and every bad version or flag, is refused.
            let flag = 1 + 8 + 4 + reason.len();
            for n in 0..=flag {
                assert_eq!(DeadLetterBody::decode(&bytes[..n]), None, "{n}");
            }
            let mut bad = bytes.clone();
            bad[0] = 2;
            assert_eq!(DeadLetterBody::decode(&bad), None);
            bad = bytes.clone();
            bad[flag] = 2;
            assert_eq!(DeadLetterBody::decode(&bad), None);
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
        for (target, data) in [("", &b""[..]), ("shipping", &b"{\"order\":7}"[..])] {
            let body = IntentBody {
                recorded_at: 1_700_000_000_000,
                target,
                data,
            };
            let bytes = body.encode();
            assert_eq!(IntentBody::decode(&bytes), Some(body));
            for n in 0..13 + target.len() {
                assert_eq!(IntentBody::decode(&bytes[..n]), None, "{n}");
            }
            let mut bad = bytes.clone();
            bad[0] = 9;
            assert_eq!(IntentBody::decode(&bad), None);
        }
    }
}
