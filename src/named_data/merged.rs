//! One map over several: a program's named data plus its external `.ptd` files.

use super::NamedDataMap;
use super::buffer::DataBuffer;
use super::error::NamedDataError;
use super::layout::TensorLayout;
use std::collections::HashMap;
use std::sync::Arc;

/// The union of N maps. As in ExecuTorch, a key may live in one map only: a key found in two
/// is an error at construction naming the key and both sources.
pub struct MergedMap {
    maps: Vec<Arc<dyn NamedDataMap>>,
    /// (map, index in that map) for each merged key index.
    order: Vec<(usize, usize)>,
    by_key: HashMap<String, usize>,
    source: String,
}

impl MergedMap {
    /// The union of `maps`, keys in map order then each map's own order; a key in two maps is
    /// [`NamedDataError::DuplicateKeyAcrossMaps`].
    pub fn new(maps: Vec<Arc<dyn NamedDataMap>>) -> Result<MergedMap, NamedDataError> {
        let mut order: Vec<(usize, usize)> = Vec::new();
        let mut by_key: HashMap<String, usize> = HashMap::new();
        for (m, map) in maps.iter().enumerate() {
            for i in 0..map.num_keys() {
                let key = map.key_at(i)?;
                if let Some(&first) = by_key.get(key) {
                    return Err(NamedDataError::DuplicateKeyAcrossMaps {
                        key: key.to_string(),
                        first: maps[order[first].0].name().to_string(),
                        second: map.name().to_string(),
                    });
                }
                by_key.insert(key.to_string(), order.len());
                order.push((m, i));
            }
        }
        let source = format!(
            "merged({})",
            maps.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
        );
        Ok(MergedMap {
            maps,
            order,
            by_key,
            source,
        })
    }

    fn map_of(&self, key: &str) -> Result<&dyn NamedDataMap, NamedDataError> {
        self.by_key
            .get(key)
            .map(|&i| &*self.maps[self.order[i].0])
            .ok_or_else(|| NamedDataError::KeyNotFound {
                key: key.to_string(),
                map: self.source.clone(),
            })
    }
}

impl NamedDataMap for MergedMap {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        self.map_of(key)?.get_data(key)
    }

    fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
        self.map_of(key)?.data_size(key)
    }

    fn tells_sizes(&self) -> bool {
        self.maps.iter().all(|m| m.tells_sizes())
    }

    fn get_tensor_layout(&self, key: &str) -> Result<Option<TensorLayout>, NamedDataError> {
        self.map_of(key)?.get_tensor_layout(key)
    }

    fn load_data_into(&self, key: &str, buffer: &mut [u8]) -> Result<(), NamedDataError> {
        self.map_of(key)?.load_data_into(key, buffer)
    }

    fn lists(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    fn num_keys(&self) -> usize {
        self.order.len()
    }

    fn key_at(&self, index: usize) -> Result<&str, NamedDataError> {
        let &(m, i) = self
            .order
            .get(index)
            .ok_or(NamedDataError::IndexOutOfRange {
                index,
                len: self.order.len(),
            })?;
        self.maps[m].key_at(i)
    }

    fn name(&self) -> &str {
        &self.source
    }

    fn file_identity(&self, key: &str) -> Option<crate::mmap::FileIdentity> {
        self.map_of(key).ok()?.file_identity(key)
    }
}
