//! Many short strings in one buffer. A vocabulary of 262,144 tokens kept as `Vec<String>` costs
//! one heap block per token (24 bytes of `String` plus a 32-byte malloc chunk at least, ~15 MB
//! in all); packed it costs its bytes plus 4 bytes of offset per token (~3.3 MB).

use anyhow::{anyhow, Result};

/// Byte strings packed end to end: string `i` is `buf[ends[i - 1]..ends[i]]` (with
/// `ends[-1] = 0`). `B` is `Vec<u8>` for bytes or `String` for text (slices need no UTF-8 check).
#[derive(Clone, Debug, Default)]
pub(crate) struct Packed<B> {
    buf: B,
    ends: Vec<u32>,
}

/// Token pieces: arbitrary bytes (a byte-fallback piece may be part of a UTF-8 character).
pub(crate) type PackedBytes = Packed<Vec<u8>>;
/// Token texts: UTF-8.
pub(crate) type PackedStrs = Packed<String>;

/// What [`Packed`] needs from its buffer.
pub(crate) trait Buf: Default {
    /// The borrowed string type (`[u8]` or `str`).
    type Slice: ?Sized;
    fn with_capacity(bytes: usize) -> Self;
    fn append(&mut self, s: &Self::Slice);
    fn byte_len(&self) -> usize;
    fn slice(&self, start: usize, end: usize) -> &Self::Slice;
    fn shrink(&mut self);
}

impl Buf for Vec<u8> {
    type Slice = [u8];
    fn with_capacity(bytes: usize) -> Self {
        Vec::with_capacity(bytes)
    }
    fn append(&mut self, s: &[u8]) {
        self.extend_from_slice(s);
    }
    fn byte_len(&self) -> usize {
        self.len()
    }
    fn slice(&self, start: usize, end: usize) -> &[u8] {
        &self[start..end]
    }
    fn shrink(&mut self) {
        self.shrink_to_fit();
    }
}

impl Buf for String {
    type Slice = str;
    fn with_capacity(bytes: usize) -> Self {
        String::with_capacity(bytes)
    }
    fn append(&mut self, s: &str) {
        self.push_str(s);
    }
    fn byte_len(&self) -> usize {
        self.len()
    }
    fn slice(&self, start: usize, end: usize) -> &str {
        // Every boundary is the end of an appended `&str`, hence a char boundary.
        &self[start..end]
    }
    fn shrink(&mut self) {
        self.shrink_to_fit();
    }
}

impl<B: Buf> Packed<B> {
    /// An empty table with room for `n` strings of `bytes` bytes in all.
    pub fn with_capacity(n: usize, bytes: usize) -> Self {
        Packed {
            buf: B::with_capacity(bytes),
            ends: Vec::with_capacity(n),
        }
    }

    /// Appends one string. Errors when the table would pass 4 GiB (offsets are `u32`).
    pub fn push(&mut self, s: &B::Slice) -> Result<()> {
        self.buf.append(s);
        let end = u32::try_from(self.buf.byte_len())
            .map_err(|_| anyhow!("token strings exceed 4 GiB in all"))?;
        self.ends.push(end);
        Ok(())
    }

    /// Releases spare capacity (after the last [`push`](Self::push)).
    pub fn shrink_to_fit(&mut self) {
        self.buf.shrink();
        self.ends.shrink_to_fit();
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Total bytes of all strings.
    pub fn total_bytes(&self) -> usize {
        self.buf.byte_len()
    }

    /// String `i`, or `None` when `i >= len()`.
    pub fn get(&self, i: usize) -> Option<&B::Slice> {
        let end = *self.ends.get(i)? as usize;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        Some(self.buf.slice(start, end))
    }
}

impl PackedStrs {
    /// Texts in id order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_strings_round_trip() {
        let mut p = PackedStrs::with_capacity(0, 0);
        for s in ["▁a", "", "<0x0A>", "b"] {
            p.push(s).unwrap();
        }
        p.shrink_to_fit();
        assert_eq!(p.len(), 4);
        assert_eq!(p.total_bytes(), 4 + 6 + 1);
        assert_eq!(p.get(0), Some("▁a"));
        assert_eq!(p.get(1), Some(""));
        assert_eq!(p.get(2), Some("<0x0A>"));
        assert_eq!(p.get(3), Some("b"));
        assert_eq!(p.get(4), None);
        assert_eq!(p.iter().collect::<Vec<_>>(), ["▁a", "", "<0x0A>", "b"]);

        let mut b = PackedBytes::with_capacity(2, 2);
        b.push(&[0xE3]).unwrap();
        b.push(b" x").unwrap();
        assert_eq!(b.get(0), Some(&[0xE3u8][..]));
        assert_eq!(b.get(1), Some(&b" x"[..]));
        assert_eq!(b.get(2), None);
    }
}
