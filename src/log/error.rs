//! The log's own errors: what its storage reports, in the log's terms.
//! Each converts into the crate's [`Error`]; the storage engine's own
//! error types never leave [`store`](super::store).

use std::fmt;

use crate::Error;
use crate::error::StorageError;

/// What can go wrong below the log: in the file, or in the storage engine
/// that keeps it.
#[derive(Debug)]
pub(crate) enum LogError {
    /// The storage engine or the file system failed.
    Storage(StorageError),
    /// The file is damaged: a checksum, a table or a structure the engine
    /// checks is wrong.
    Corrupt(String),
    /// The file is not a store (nor a damaged one).
    NotAStore(String),
    /// The file is already open, in this process or another one.
    AlreadyOpen,
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Storage(e) => write!(f, "storage: {e}"),
            LogError::Corrupt(why) => write!(f, "corrupt store: {why}"),
            LogError::NotAStore(why) => write!(f, "not a dedupkv store: {why}"),
            LogError::AlreadyOpen => f.write_str("the store file is already open"),
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogError::Storage(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for LogError {
    fn from(e: std::io::Error) -> Self {
        LogError::Storage(e.into())
    }
}

impl From<LogError> for Error {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Storage(e) => Error::Storage(e),
            LogError::Corrupt(why) => Error::Corrupt(why),
            LogError::NotAStore(why) => Error::NotAStore(why),
            LogError::AlreadyOpen => Error::AlreadyOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_log_error_becomes_the_crate_error_of_the_same_meaning() {
        let io = std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full");
        let err = Error::from(LogError::from(io));
        assert!(
            matches!(&err, Error::Storage(s) if s.io_kind() == Some(std::io::ErrorKind::StorageFull)),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "storage: I/O error: disk full");
        assert!(matches!(
            Error::from(LogError::Corrupt("x".into())),
            Error::Corrupt(w) if w == "x"
        ));
        assert!(matches!(
            Error::from(LogError::NotAStore("y".into())),
            Error::NotAStore(w) if w == "y"
        ));
        assert!(matches!(
            Error::from(LogError::AlreadyOpen),
            Error::AlreadyOpen
        ));
    }

    #[test]
    fn a_storage_error_keeps_the_io_error_as_its_source() {
        let err = Error::from(LogError::from(std::io::Error::other("boom")));
        let storage = std::error::Error::source(&err).expect("a storage error");
        let io = storage.source().expect("the io error");
        assert_eq!(io.to_string(), "boom");
    }
}
