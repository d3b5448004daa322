//! Reads structured choices out of fuzzer bytes. Past the end every read returns zeros, so any
//! input decodes to something: the fuzzer never wastes runs on inputs a decoder refuses, and a
//! one-byte change changes one choice.

/// A cursor over the input.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The next `n` bytes, fewer at the end.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.bytes.split_at(n.min(self.bytes.len()));
        self.bytes = tail;
        head
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.bytes.len())
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    /// The next two bytes, little-endian (missing bytes are 0).
    pub fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let got = self.take(2);
        b[..got.len()].copy_from_slice(got);
        u16::from_le_bytes(b)
    }

    /// The next eight bytes, little-endian (missing bytes are 0).
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let got = self.take(8);
        b[..got.len()].copy_from_slice(got);
        u64::from_le_bytes(b)
    }

    /// One of `n` choices (`n` > 0).
    pub fn choose(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n
    }
}
