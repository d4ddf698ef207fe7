//! The medium under a store, when the caller supplies it: the bytes of one
//! file, read and written at offsets, with a sync that makes them durable.
//! [`PageBackend`] is dedupkv's own trait (its contract mirrors the page
//! backends of the storage engines it may sit on), so no storage engine's
//! type is part of the public API; the redb store adapts it to redb inside
//! `store/redb.rs`, one dynamic call per page read or write, as redb's own
//! backend trait costs.

/// The bytes of one store file, as a storage engine reads and writes them:
/// for an in-memory store, or one that injects faults or keeps crash
/// images in tests. A store opened by path uses the file itself and never
/// this trait.
///
/// Each method's contract, which the store relies on:
///
/// # Examples
///
/// An in-memory store:
///
/// ```
/// use std::sync::Mutex;
///
/// #[derive(Debug, Default)]
/// struct Memory(Mutex<Vec<u8>>);
///
/// impl dedupkv::PageBackend for Memory {
///     fn len(&self) -> std::io::Result<u64> {
///         Ok(self.0.lock().unwrap().len() as u64)
///     }
///     fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
///         let bytes = self.0.lock().unwrap();
///         let at = usize::try_from(offset).map_err(std::io::Error::other)?;
///         let src = bytes.get(at..at + out.len()).ok_or(std::io::ErrorKind::UnexpectedEof)?;
///         out.copy_from_slice(src);
///         Ok(())
///     }
///     fn set_len(&self, len: u64) -> std::io::Result<()> {
///         let len = usize::try_from(len).map_err(std::io::Error::other)?;
///         self.0.lock().unwrap().resize(len, 0);
///         Ok(())
///     }
///     fn sync_data(&self) -> std::io::Result<()> {
///         Ok(())
///     }
///     fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
///         let mut bytes = self.0.lock().unwrap();
///         let at = usize::try_from(offset).map_err(std::io::Error::other)?;
///         let dst = bytes.get_mut(at..at + data.len()).ok_or(std::io::ErrorKind::UnexpectedEof)?;
///         dst.copy_from_slice(data);
///         Ok(())
///     }
/// }
///
/// let store = dedupkv::Store::builder().open_with_backend(Memory::default())?;
/// assert!(store.insert_if_absent(&dedupkv::Key::new("orders", "o-1"))?);
/// # Ok::<(), dedupkv::Error>(())
/// ```
// `len` is a file length, as in redb's page contract; nothing asks for emptiness.
#[allow(clippy::len_without_is_empty)]
pub trait PageBackend: std::fmt::Debug + Send + Sync + 'static {
    /// The length of the file, in bytes.
    ///
    /// # Errors
    /// The medium's I/O error.
    fn len(&self) -> std::io::Result<u64>;

    /// Fills `out` with the bytes at `offset`; a range past the end is an
    /// error.
    ///
    /// # Errors
    /// The medium's I/O error, or a range past the end.
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()>;

    /// Sets the length of the file; bytes it adds read as zero.
    ///
    /// # Errors
    /// The medium's I/O error.
    fn set_len(&self, len: u64) -> std::io::Result<()>;

    /// Makes every write and `set_len` before it durable: what a crash
    /// keeps once this returned `Ok`.
    ///
    /// # Errors
    /// The medium's I/O error: nothing written since the last sync that
    /// returned `Ok` may be taken as durable.
    fn sync_data(&self) -> std::io::Result<()>;

    /// Writes `data` at `offset` (within the length set by `set_len`).
    ///
    /// # Errors
    /// The medium's I/O error.
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()>;
}
