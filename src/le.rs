//! The one reader of the binary headers xnnblob parses (the `.pte` and `.ptd` headers, the
//! delegate payload's, the packed-weight cache file's): little-endian fields at byte offsets,
//! bounds-checked, `None` past the end. Each parser turns `None` into its own error.

/// The `N` bytes at `at`, or None when they run past the end of `bytes`.
pub(crate) fn array_at<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// The little-endian `u32` at `at`.
pub(crate) fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    array_at(bytes, at).map(u32::from_le_bytes)
}

/// The little-endian `u64` at `at`.
pub(crate) fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    array_at(bytes, at).map(u64::from_le_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_little_endian_and_nothing_past_the_end() {
        let b = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(u32_at(&b, 1), Some(0x0504_0302));
        assert_eq!(u64_at(&b, 1), Some(0x0908_0706_0504_0302));
        assert_eq!(u64_at(&b, 2), None);
        assert_eq!(u32_at(&b, usize::MAX - 1), None, "no overflow");
        assert_eq!(array_at::<0>(&b, 9), Some([]));
        assert_eq!(array_at::<1>(&b, 9), None);
    }
}
