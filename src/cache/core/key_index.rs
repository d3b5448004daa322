//! The entries of a cache by key, and which kernel identities any entry holds: what a look-up
//! asks, and what packing ahead asks of each weight (whether a runtime created now would pack
//! it) without collecting every key of the file at each delegate's load.
//!
//! The entries of the cache's own file are held as its index lists them, ascending by key
//! (every file this build writes is), and searched in place: a warm launch hashes none of them
//! and builds no table of them. Keys of any other entry (packed or kept in this process, read
//! from a read-only layer or from a file whose index is not in key order) are hashed into a
//! table, which also holds a file key pointed at another entry since.

use super::super::format::EntryKey;
use super::super::identity::BlobId;
use crate::fast_hash::FastMap;

#[derive(Default)]
pub(crate) struct KeyIndex {
    by_key: FastMap<EntryKey, usize>,
    /// How many keys of `by_key` have each kernel identity.
    kernels: FastMap<BlobId, usize>,
    /// The keys of the file's entries, strictly ascending: `file[j]` is entry `file_first + j`.
    file: Vec<EntryKey>,
    /// By position in `file`: its key's lead ([`lead_of`]), ascending as the keys are.
    file_leads: Vec<u64>,
    file_first: usize,
    /// By position in `file`: its key is no longer served from there (forgotten, or pointed at
    /// another entry, which `by_key` then holds). A key is in `by_key` or served from `file`,
    /// never both.
    file_gone: Vec<bool>,
}

impl KeyIndex {
    /// Holds the keys of a file's entries `first..first + keys.len()` as they are, unhashed,
    /// where nothing is indexed yet and the keys are strictly ascending (so none repeats);
    /// false, with nothing held, otherwise (the caller indexes them one by one).
    pub fn hold_file(&mut self, keys: Vec<EntryKey>, first: usize) -> bool {
        if !self.by_key.is_empty() || !self.file.is_empty() || !keys.windows(2).all(|w| w[0] < w[1])
        {
            return false;
        }
        self.file_gone = vec![false; keys.len()];
        self.file_leads = keys.iter().map(|k| lead_of(&k.kernel)).collect();
        self.file = keys;
        self.file_first = first;
        true
    }

    /// The position of `key` in the file's keys, served or not: found among their leads (a
    /// dense table, searched as numbers), then compared whole.
    fn in_file(&self, key: &EntryKey) -> Option<usize> {
        self.lead_run(&key.kernel).find(|&j| self.file[j] == *key)
    }

    /// The positions in `file` of the keys whose kernel has `kernel`'s lead: every key of that
    /// kernel is among them (the keys are ordered by kernel first).
    fn lead_run(&self, kernel: &BlobId) -> std::ops::Range<usize> {
        let lead = lead_of(kernel);
        let start = self.file_leads.partition_point(|&l| l < lead);
        let len = self.file_leads[start..].partition_point(|&l| l == lead);
        start..start + len
    }

    pub fn get(&self, key: &EntryKey) -> Option<usize> {
        if !self.by_key.is_empty()
            && let Some(&i) = self.by_key.get(key)
        {
            return Some(i);
        }
        self.in_file(key)
            .filter(|&j| !self.file_gone[j])
            .map(|j| self.file_first + j)
    }

    pub fn contains_key(&self, key: &EntryKey) -> bool {
        self.get(key).is_some()
    }

    /// Whether an entry holds a packing of the weights identified `kernel` (of any bias or
    /// packing parameters).
    pub fn holds_kernel(&self, kernel: &BlobId) -> bool {
        if self.kernels.contains_key(kernel) {
            return true;
        }
        self.lead_run(kernel)
            .any(|j| self.file[j].kernel == *kernel && !self.file_gone[j])
    }

    pub fn keys(&self) -> impl Iterator<Item = &EntryKey> {
        self.iter().map(|(k, _)| k)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&EntryKey, usize)> {
        let first = self.file_first;
        self.by_key.iter().map(|(k, &i)| (k, i)).chain(
            self.file
                .iter()
                .zip(&self.file_gone)
                .enumerate()
                .filter(|(_, (_, gone))| !**gone)
                .map(move |(j, (k, _))| (k, first + j)),
        )
    }

    pub fn reserve(&mut self, additional: usize) {
        self.by_key.reserve(additional);
        self.kernels.reserve(additional);
    }

    /// Points `key` at entry `i`, returning the entry it pointed at.
    pub fn insert(&mut self, key: EntryKey, i: usize) -> Option<usize> {
        let before = self.get(&key);
        match self.in_file(&key) {
            // Its file entry serves it again.
            Some(j) if i == self.file_first + j => {
                self.file_gone[j] = false;
                self.forget_hashed(&key);
            }
            Some(j) => {
                self.file_gone[j] = true;
                self.insert_hashed(key, i);
            }
            None => self.insert_hashed(key, i),
        }
        before
    }

    /// Forgets `key`, returning the entry it pointed at.
    pub fn remove(&mut self, key: &EntryKey) -> Option<usize> {
        let before = self.get(key);
        self.forget_hashed(key);
        if let Some(j) = self.in_file(key) {
            self.file_gone[j] = true;
        }
        before
    }

    fn insert_hashed(&mut self, key: EntryKey, i: usize) {
        if self.by_key.insert(key, i).is_none() {
            *self.kernels.entry(key.kernel).or_default() += 1;
        }
    }

    fn forget_hashed(&mut self, key: &EntryKey) {
        if self.by_key.remove(key).is_some()
            && let Some(n) = self.kernels.get_mut(&key.kernel)
        {
            *n -= 1;
            if *n == 0 {
                self.kernels.remove(&key.kernel);
            }
        }
    }
}
/// The first 8 bytes of a kernel identity, as one number that orders as the bytes do: kernel
/// identities are sha256s, so the leads of two nearly always differ, and a search compares
/// numbers where whole keys would each be a call into `memcmp`.
fn lead_of(kernel: &BlobId) -> u64 {
    let b = &kernel.0;
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
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

    #[test]
    fn keys_whose_kernels_share_their_first_bytes_are_told_apart() {
        let kernel = |last: u8| {
            let mut id = [7u8; 32];
            id[31] = last;
            BlobId(id)
        };
        let at = |last: u8, seed: u32| EntryKey {
            kernel: kernel(last),
            bias: BlobId::NONE,
            seed,
        };
        let mut index = KeyIndex::default();
        assert!(index.hold_file(vec![at(1, 1), at(2, 1), at(2, 2), at(4, 1)], 0));
        assert_eq!(index.get(&at(2, 2)), Some(2));
        assert_eq!(index.get(&at(3, 1)), None);
        assert_eq!(index.get(&at(4, 1)), Some(3));
        assert!(index.holds_kernel(&kernel(2)));
        assert!(!index.holds_kernel(&kernel(3)));
        index.remove(&at(1, 1));
        assert!(!index.holds_kernel(&kernel(1)));
        assert!(index.holds_kernel(&kernel(4)));
    }

    #[test]
    fn a_files_keys_are_served_in_place_until_forgotten_or_pointed_elsewhere() {
        let mut index = KeyIndex::default();
        assert!(
            !index.hold_file(vec![key(2, 1), key(1, 1)], 0),
            "not ascending"
        );
        assert!(
            !index.hold_file(vec![key(1, 1), key(1, 1)], 0),
            "a key twice"
        );
        // Entries 5, 6, 7.
        assert!(index.hold_file(vec![key(1, 1), key(1, 2), key(3, 1)], 5));
        assert!(!index.hold_file(vec![key(4, 1)], 8), "one file only");
        assert_eq!(index.get(&key(1, 2)), Some(6));
        assert_eq!(index.get(&key(2, 1)), None);
        assert!(index.holds_kernel(&BlobId([1; 32])));
        assert!(!index.holds_kernel(&BlobId([2; 32])));
        assert!(index.holds_kernel(&BlobId([3; 32])));
        // Pointed elsewhere, then back at its file entry.
        assert_eq!(index.insert(key(1, 2), 9), Some(6));
        assert_eq!(index.get(&key(1, 2)), Some(9));
        assert_eq!(index.keys().filter(|k| **k == key(1, 2)).count(), 1);
        assert_eq!(index.insert(key(1, 2), 6), Some(9));
        assert_eq!(index.get(&key(1, 2)), Some(6));
        // Forgotten: its kernel is held while another key of it is.
        assert_eq!(index.remove(&key(1, 1)), Some(5));
        assert_eq!(index.remove(&key(1, 1)), None, "removed twice");
        assert!(index.holds_kernel(&BlobId([1; 32])));
        assert_eq!(index.remove(&key(1, 2)), Some(6));
        assert!(!index.holds_kernel(&BlobId([1; 32])));
        // A key beside the file's, hashed.
        assert_eq!(index.insert(key(2, 1), 10), None);
        assert!(index.holds_kernel(&BlobId([2; 32])));
        let mut all: Vec<(EntryKey, usize)> = index.iter().map(|(k, i)| (*k, i)).collect();
        all.sort_by_key(|&(_, i)| i);
        assert_eq!(all, vec![(key(3, 1), 7), (key(2, 1), 10)]);
        // A forgotten file key given a new entry.
        assert_eq!(index.insert(key(1, 1), 11), None);
        assert_eq!(index.get(&key(1, 1)), Some(11));
        assert_eq!(index.remove(&key(1, 1)), Some(11));
        assert_eq!(index.get(&key(1, 1)), None);
    }
}
