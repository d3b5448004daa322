//! The entries of a cache by key, and which kernel identities any entry holds: what a look-up
//! asks, and what packing ahead asks of each weight (whether a runtime created now would pack
//! it) without collecting every key of the file at each delegate's load.

use super::super::format::EntryKey;
use super::super::identity::BlobId;
use crate::fast_hash::FastMap;

#[derive(Default)]
pub(crate) struct KeyIndex {
    by_key: FastMap<EntryKey, usize>,
    /// How many keys of `by_key` have each kernel identity.
    kernels: FastMap<BlobId, usize>,
}

impl KeyIndex {
    pub fn get(&self, key: &EntryKey) -> Option<&usize> {
        self.by_key.get(key)
    }

    pub fn contains_key(&self, key: &EntryKey) -> bool {
        self.by_key.contains_key(key)
    }

    /// Whether an entry holds a packing of the weights identified `kernel` (of any bias or
    /// packing parameters).
    pub fn holds_kernel(&self, kernel: &BlobId) -> bool {
        self.kernels.contains_key(kernel)
    }

    pub fn keys(&self) -> impl Iterator<Item = &EntryKey> {
        self.by_key.keys()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&EntryKey, &usize)> {
        self.by_key.iter()
    }

    pub fn reserve(&mut self, additional: usize) {
        self.by_key.reserve(additional);
        self.kernels.reserve(additional);
    }

    /// Points `key` at entry `i`, returning the entry it pointed at.
    pub fn insert(&mut self, key: EntryKey, i: usize) -> Option<usize> {
        let before = self.by_key.insert(key, i);
        if before.is_none() {
            *self.kernels.entry(key.kernel).or_default() += 1;
        }
        before
    }

    /// Forgets `key`, returning the entry it pointed at.
    pub fn remove(&mut self, key: &EntryKey) -> Option<usize> {
        let before = self.by_key.remove(key);
        if before.is_some()
            && let Some(n) = self.kernels.get_mut(&key.kernel)
        {
            *n -= 1;
            if *n == 0 {
                self.kernels.remove(&key.kernel);
            }
        }
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kernel: u8, seed: u32) -> EntryKey {
        EntryKey {
            kernel: BlobId([kernel; 32]),
            bias: BlobId::NONE,
            seed,
        }
    }

    #[test]
    fn a_kernel_is_held_while_any_of_its_keys_is() {
        let mut index = KeyIndex::default();
        assert!(!index.holds_kernel(&BlobId([1; 32])));
        assert_eq!(index.insert(key(1, 7), 0), None);
        assert_eq!(index.insert(key(1, 8), 1), None);
        assert_eq!(index.insert(key(1, 8), 2), Some(1), "pointed elsewhere");
        assert!(index.holds_kernel(&BlobId([1; 32])));
        assert_eq!(index.remove(&key(1, 7)), Some(0));
        assert!(index.holds_kernel(&BlobId([1; 32])), "one key left");
        assert_eq!(index.remove(&key(1, 7)), None, "removed twice");
        assert_eq!(index.remove(&key(1, 8)), Some(2));
        assert!(!index.holds_kernel(&BlobId([1; 32])));
        assert_eq!(index.keys().count(), 0);
    }
}
