//! SHA-256 as ExecuTorch uses it: XNNPACK constants are keyed by the lowercase hex of their
//! bytes' digest. The digest is the `sha2` crate's (SHA-NI where the CPU has it); this module
//! only fixes the shapes xnnblob passes around.

use sha2::Digest;
pub use sha2::Sha256;

/// The SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// The digest of a streaming hasher, as a plain array.
pub fn finish(hasher: Sha256) -> [u8; 32] {
    hasher.finalize().into()
}

/// Lowercase hex, as ExecuTorch writes sha256 keys.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_fips_180_test_vectors() {
        assert_eq!(
            to_hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            to_hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
