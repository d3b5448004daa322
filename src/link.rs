//! Linked parameters, at run time: the parameters a build script wrote with `xnnblob-link` (one
//! aligned static per parameter in a dedicated link section, found by id through the generated
//! `lookup_linked_param`), served in place as a [`NamedDataMap`] by [`LinkedDataMap`].

use crate::named_data::{Backing, DataBuffer, NamedDataError, NamedDataMap, TensorLayout};
use std::sync::Arc;

/// Static bytes: the backing of linked parameters.
struct StaticBytes(&'static [u8]);

impl Backing for StaticBytes {
    fn bytes(&self) -> &[u8] {
        self.0
    }
}

/// A [`NamedDataMap`] over linked parameters: keys resolve to ids by binary search, ids to bytes
/// through the generated `match`; data is returned in place.
pub struct LinkedDataMap {
    name: String,
    keys: &'static [(&'static str, u32)],
    lookup: fn(u32) -> Option<&'static [u8]>,
    /// Keys in id order, for `key_at`.
    by_id: Vec<&'static str>,
}

impl LinkedDataMap {
    /// From a generated module's `LINKED_PARAM_KEYS` and `lookup_linked_param`.
    pub fn new(
        name: impl Into<String>,
        keys: &'static [(&'static str, u32)],
        lookup: fn(u32) -> Option<&'static [u8]>,
    ) -> LinkedDataMap {
        let mut by_id: Vec<(u32, &'static str)> = keys.iter().map(|(k, i)| (*i, *k)).collect();
        by_id.sort();
        LinkedDataMap {
            name: name.into(),
            keys,
            lookup,
            by_id: by_id.into_iter().map(|(_, k)| k).collect(),
        }
    }

    /// The id of `key`.
    pub fn id(&self, key: &str) -> Option<u32> {
        self.keys
            .binary_search_by(|(k, _)| (*k).cmp(key))
            .ok()
            .map(|i| self.keys[i].1)
    }

    /// The bytes of parameter `id`, or a "not found" error.
    pub fn by_id(&self, id: u32) -> Result<&'static [u8], NamedDataError> {
        (self.lookup)(id).ok_or_else(|| NamedDataError::KeyNotFound {
            key: format!("#{id}"),
            map: self.name.clone(),
        })
    }

    fn bytes(&self, key: &str) -> Result<&'static [u8], NamedDataError> {
        let not_found = || NamedDataError::KeyNotFound {
            key: key.to_string(),
            map: self.name.clone(),
        };
        let id = self.id(key).ok_or_else(not_found)?;
        (self.lookup)(id).ok_or_else(not_found)
    }
}

impl NamedDataMap for LinkedDataMap {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        let bytes = self.bytes(key)?;
        Ok(DataBuffer::new(Arc::new(StaticBytes(bytes)), 0, bytes.len()).expect("whole range"))
    }

    fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
        Ok(self.bytes(key)?.len())
    }

    fn get_tensor_layout(&self, key: &str) -> Result<Option<TensorLayout>, NamedDataError> {
        self.bytes(key).map(|_| None)
    }

    fn lists(&self, key: &str) -> bool {
        self.id(key).is_some()
    }

    fn num_keys(&self) -> usize {
        self.by_id.len()
    }

    fn key_at(&self, index: usize) -> Result<&str, NamedDataError> {
        self.by_id
            .get(index)
            .copied()
            .ok_or(NamedDataError::IndexOutOfRange {
                index,
                len: self.by_id.len(),
            })
    }

    fn name(&self) -> &str {
        &self.name
    }
}
