//! The checksum of packed weights and of the cache file's header and index: XXH3-64 (seed 0), a
//! published, analysed hash that any xxHash implementation can recompute, at memory speed.
//! It detects accidental damage (bit flips, torn or misplaced writes), not tampering.

/// The XXH3-64 of `data`.
pub fn checksum64(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

#[cfg(test)]
mod tests {
    use super::checksum64;

    #[test]
    fn is_xxh3_64_as_published() {
        // Values from the Python binding of the reference C implementation (seed 0), so that a
        // tool outside xnnblob can check a cache file.
        assert_eq!(checksum64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(checksum64(b"xnnblob"), 0x13ae_e579_d5bd_0c5a);
        let long: Vec<u8> = (0..1000u32).map(|i| (i * 37 % 251) as u8).collect();
        assert_eq!(checksum64(&long), 0x7b02_9767_f25b_b08f);
    }

    #[test]
    fn every_single_bit_flip_changes_the_checksum() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 37 % 251) as u8).collect();
        let base = checksum64(&data);
        for bit in 0..data.len() * 8 {
            let mut d = data.clone();
            d[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(checksum64(&d), base, "bit {bit}");
        }
    }
}
