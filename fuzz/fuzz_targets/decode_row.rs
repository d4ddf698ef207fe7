//! The log-row decoder that recovery runs on every row read from disk:
//! arbitrary bytes must decode to `Ok` or `Err`, never panic, hang or
//! allocate beyond the input.
//!
//! Each input is tried twice: as is (almost always a checksum error), and
//! sealed with a valid xxh3 checksum so the fuzzer reaches the record parser
//! behind it. The same goes for the journal's records: the input as a
//! whole segment, and as the payload of one valid record, so the commit
//! decoder and the rows inside it are reached.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = dedupkv::__fuzz::decode_row(data);

    let mut sealed = Vec::with_capacity(data.len() + 8);
    sealed.extend_from_slice(data);
    sealed.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(data).to_le_bytes());
    let _ = dedupkv::__fuzz::decode_row(&sealed);

    let _ = dedupkv::__fuzz::decode_journal(data);
    let _ = dedupkv::__fuzz::decode_journal(&dedupkv::__fuzz::journal_of(data));
});
