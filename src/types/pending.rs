//! What an answer rests on ([`Basis`]) and an answer with it
//! ([`Pending`]): the vocabulary of the operation-level contract
//! (`contract.rs`). Storage-neutral: a basis is positions in the
//! backend's commit order, nothing more.

/// What an answer rests on: the newest position (in the backend's commit
/// order) of a record the call wrote, and of a record the answer was read
/// from. `0` means nothing.
///
/// The two differ under [`Durability::Deferred`](crate::Durability): a
/// caller's own records may be acknowledged before their commit (within
/// the mode's delay), a record read from is never waited for.
///
/// # Examples
/// ```
/// use dedupkv::contract::Basis;
///
/// let b = Basis::written(7).and(Basis::read(9));
/// assert_eq!((b.written_at(), b.read_at()), (7, 9));
/// assert!(Basis::SETTLED.is_settled());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Basis {
    written: u64,
    read: u64,
}

impl Basis {
    /// Rests on nothing: the answer may be told at once.
    pub const SETTLED: Basis = Basis {
        written: 0,
        read: 0,
    };

    /// Rests on the call's own records, the newest at `position`.
    ///
    /// # Examples
    /// See [`Basis`].
    #[must_use]
    pub const fn written(position: u64) -> Basis {
        Basis {
            written: position,
            read: 0,
        }
    }

    /// Rests on a record written before, at `position`, that the answer
    /// was read from.
    ///
    /// # Examples
    /// See [`Basis`].
    #[must_use]
    pub const fn read(position: u64) -> Basis {
        Basis {
            written: 0,
            read: position,
        }
    }

    /// Rests on both `self` and `other`.
    ///
    /// # Examples
    /// See [`Basis`].
    #[must_use]
    pub const fn and(self, other: Basis) -> Basis {
        Basis {
            written: if self.written > other.written {
                self.written
            } else {
                other.written
            },
            read: if self.read > other.read {
                self.read
            } else {
                other.read
            },
        }
    }

    /// The newest position of the call's own records (0: none).
    ///
    /// # Examples
    /// See [`Basis`].
    #[must_use]
    pub const fn written_at(self) -> u64 {
        self.written
    }

    /// The newest position of a record the answer was read from (0: none).
    ///
    /// # Examples
    /// See [`Basis`].
    #[must_use]
    pub const fn read_at(self) -> u64 {
        self.read
    }

    /// Rests on nothing.
    ///
    /// # Examples
    /// See [`Basis`].
    #[must_use]
    pub const fn is_settled(self) -> bool {
        self.written == 0 && self.read == 0
    }
}

/// An answer and what it rests on. Tell the value only once its basis is
/// settled ([`Settle::wait`](crate::contract::Settle::wait),
/// [`Settle::settled`](crate::contract::Settle::settled)), or use
/// [`Settle::tell`](crate::contract::Settle::tell), which does both.
///
/// # Examples
/// ```
/// use dedupkv::contract::{Basis, Pending};
///
/// let p = Pending::new(true, Basis::written(3));
/// assert_eq!(p.basis(), Basis::written(3));
/// let (value, basis) = p.map(|new| !new).into_parts();
/// assert!(!value && basis == Basis::written(3));
/// ```
#[derive(Debug)]
#[must_use = "an answer is told only once its basis is settled"]
pub struct Pending<T> {
    value: T,
    basis: Basis,
}

impl<T> Pending<T> {
    /// `value`, resting on `basis`.
    ///
    /// # Examples
    /// See [`Pending`].
    pub const fn new(value: T, basis: Basis) -> Pending<T> {
        Pending { value, basis }
    }

    /// `value`, resting on nothing.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::contract::Pending;
    /// assert!(Pending::settled(1).basis().is_settled());
    /// ```
    pub const fn settled(value: T) -> Pending<T> {
        Pending {
            value,
            basis: Basis::SETTLED,
        }
    }

    /// What the answer rests on.
    ///
    /// # Examples
    /// See [`Pending`].
    pub const fn basis(&self) -> Basis {
        self.basis
    }

    /// The value with its basis, made into another.
    ///
    /// # Examples
    /// See [`Pending`].
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Pending<U> {
        Pending {
            value: f(self.value),
            basis: self.basis,
        }
    }

    /// Both values, resting on both bases: two calls' answers told
    /// together (after one wait).
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::contract::{Basis, Pending};
    /// let both = Pending::new(1, Basis::written(3)).zip(Pending::new(2, Basis::read(5)));
    /// assert_eq!(both.basis(), Basis::written(3).and(Basis::read(5)));
    /// ```
    pub fn zip<U>(self, other: Pending<U>) -> Pending<(T, U)> {
        Pending {
            value: (self.value, other.value),
            basis: self.basis.and(other.basis),
        }
    }

    /// The value, resting on `basis` too: an answer decided after an
    /// earlier call whose records it depends on.
    ///
    /// # Examples
    /// ```
    /// # use dedupkv::contract::{Basis, Pending};
    /// let p = Pending::new((), Basis::written(4)).after(Basis::written(2));
    /// assert_eq!(p.basis(), Basis::written(4));
    /// ```
    pub fn after(self, basis: Basis) -> Pending<T> {
        Pending {
            value: self.value,
            basis: self.basis.and(basis),
        }
    }

    /// The value and its basis, apart: the caller keeps the promise not to
    /// tell the value before the basis is settled.
    ///
    /// # Examples
    /// See [`Pending`].
    pub fn into_parts(self) -> (T, Basis) {
        (self.value, self.basis)
    }
}
