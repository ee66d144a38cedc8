//! Files that carry shared-memory state across a clean restart (the statistics, the memory store), in the
//! data directory's `pg_stat/` as pg_stat_statements keeps its own.
//!
//! A file is `magic (8 bytes) | payload | checksum (8 bytes)`, all integers little-endian; the checksum is
//! a SipHash-2-4 of everything before it. It is written to a temporary name and renamed, so a reader sees
//! the whole of a file or none of it; it is deleted once loaded, so a crash after the next start never
//! brings back older state. A file that is missing says nothing; one that is short, has another magic, a
//! wrong checksum, or a payload its reader rejects is logged and ignored: the state starts empty, and the
//! server always starts.

use std::fs;
use std::hash::Hasher;
use std::io::Write;

use pgrx::prelude::*;
use siphasher::sip::SipHasher24;

/// Appends the fields of a payload.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// A payload starting with `magic`.
    pub fn new(magic: &[u8; 8]) -> Writer {
        Writer {
            buf: magic.to_vec(),
        }
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends an `i64`.
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// Appends bytes as they are.
    pub fn bytes(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }

    /// The whole file: the payload and its checksum.
    pub fn finish(mut self) -> Vec<u8> {
        let sum = checksum(&self.buf);
        self.buf.extend_from_slice(&sum.to_le_bytes());
        self.buf
    }
}

/// Reads the fields of a payload; every read fails (`None`) past the end.
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    /// Reads a `u32`.
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    /// Reads a `u64`.
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// Reads an `i64`.
    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// Reads `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        self.take(n)
    }

    /// Whether every byte was read.
    pub fn at_end(&self) -> bool {
        self.rest.is_empty()
    }
}

fn checksum(bytes: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(0x7261_7465_5f6c_696d, 0x6974_2d66_696c_6573);
    h.write(bytes);
    h.finish()
}

/// Checks a whole file: its magic and its checksum. Returns a reader over the payload after the magic.
pub fn open<'a>(file: &'a [u8], magic: &[u8; 8]) -> Result<Reader<'a>, &'static str> {
    if file.len() < 16 {
        return Err("the file is truncated");
    }
    let (body, sum) = file.split_at(file.len() - 8);
    if &body[..8] != magic {
        return Err("the file is not of this kind or version");
    }
    let expected = u64::from_le_bytes(sum.try_into().map_err(|_| "the file is truncated")?);
    if checksum(body) != expected {
        return Err("the checksum does not match (truncated or damaged)");
    }
    Ok(Reader { rest: &body[8..] })
}

/// Writes `contents` to `path` (relative to the data directory) through a temporary file and a rename;
/// logs and gives up on any error (a shutdown must never fail because of us).
pub fn write_file(path: &str, what: &str, contents: &[u8]) {
    let tmp = format!("{path}.tmp");
    let result = (|| -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    match result {
        Ok(()) => log!(
            "rate_limit: saved {what} to \"{path}\" ({} bytes)",
            contents.len()
        ),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            warning!("rate_limit: could not save {what} to \"{path}\": {e}");
        }
    }
}

/// Reads and deletes the file at `path`, then hands it to `load`, which returns how many items it
/// restored or why it rejects the payload. Every failure is logged and ignored.
pub fn read_file(path: &str, what: &str, load: impl FnOnce(&[u8]) -> Result<usize, &'static str>) {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            warning!("rate_limit: could not read {what} from \"{path}\": {e}; starting empty");
            let _ = fs::remove_file(path);
            return;
        }
    };
    // deleted before use: a crash from here on must not load this state a second time
    let _ = fs::remove_file(path);
    match load(&bytes) {
        Ok(n) => log!("rate_limit: restored {n} {what} from \"{path}\""),
        Err(why) => warning!("rate_limit: ignored {what} in \"{path}\": {why}; starting empty"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage_is_detected() {
        let mut w = Writer::new(b"RLTEST01");
        w.u32(7);
        w.i64(-5);
        w.bytes(b"abc");
        let file = w.finish();
        let mut r = open(&file, b"RLTEST01").expect("valid");
        assert_eq!(
            (r.u32(), r.i64(), r.bytes(3)),
            (Some(7), Some(-5), Some(&b"abc"[..]))
        );
        assert!(r.at_end());
        assert!(r.u32().is_none(), "no read past the end");
        assert!(open(&file, b"RLOTHER1").is_err(), "another magic");
        assert!(
            open(&file[..file.len() - 1], b"RLTEST01").is_err(),
            "truncated"
        );
        for i in 0..file.len() {
            let mut damaged = file.clone();
            damaged[i] ^= 0x40;
            assert!(open(&damaged, b"RLTEST01").is_err(), "a flipped bit at {i}");
        }
    }
}
