//! The bridge's named-data maps: files, merges, C++ maps as Rust ones, and their buffers.

use super::*;

pub(super) fn open_data_map(path: &str) -> Result<Box<DataMap>, Reported> {
    guarded(|| Ok(Box::new(DataMap(Arc::new(FileDataMap::open(path)?)))))
}

pub(super) fn merge_data_maps(first: &DataMap, second: &DataMap) -> Result<Box<DataMap>, Reported> {
    guarded(|| {
        let merged = MergedMap::new(vec![first.0.clone(), second.0.clone()])?;
        Ok(Box::new(DataMap(Arc::new(merged))))
    })
}

impl DataMap {
    pub(super) fn num_keys(&self) -> usize {
        self.0.num_keys()
    }

    pub(super) fn key_at(&self, index: usize) -> Result<String, Reported> {
        guarded(|| Ok(self.0.key_at(index)?.to_string()))
    }

    pub(super) fn get_data(&self, key: &str) -> Result<Box<Buffer>, Reported> {
        guarded(|| Ok(Box::new(Buffer(self.0.get_data(key)?, None))))
    }

    pub(super) fn tensor_layout(&self, key: &str) -> Result<TensorLayout, Reported> {
        guarded(|| {
            Ok(match self.0.get_tensor_layout(key)? {
                None => TensorLayout {
                    present: false,
                    scalar_type: 0,
                    sizes: Vec::new(),
                    dim_order: Vec::new(),
                    nbytes: 0,
                },
                Some(l) => TensorLayout {
                    present: true,
                    scalar_type: l.scalar_type().code(),
                    sizes: l.sizes().to_vec(),
                    dim_order: l.dim_order().to_vec(),
                    nbytes: l.nbytes().unwrap_or(0),
                },
            })
        })
    }

    pub(super) fn load_data_into(&self, key: &str, out: &mut [u8]) -> Result<(), Reported> {
        guarded(|| self.0.load_data_into(key, out).map_err(Reported::from))
    }
}

impl Buffer {
    pub(super) fn data(&self) -> &[u8] {
        self.0.data()
    }

    pub(super) fn free(&mut self) {
        self.0.free();
        self.1 = None;
    }
}

/// A C++ map seen as a Rust one. Keys are read once; data is borrowed from the C++ map, which
/// the returned buffers keep alive through their shared_ptr.
struct CppMap {
    map: cxx::SharedPtr<bridge::NamedDataMap>,
    name: String,
    keys: Vec<String>,
    by_key: HashMap<String, usize>,
}

/// Bytes owned by a C++ map.
struct CppBytes {
    _map: cxx::SharedPtr<bridge::NamedDataMap>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are immutable while the map lives (named_data.h's contract), and the map is
// Send + Sync (see above).
unsafe impl Send for CppBytes {}
// SAFETY: as above.
unsafe impl Sync for CppBytes {}

impl Backing for CppBytes {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr`/`len` came from the map's get_data, whose contract keeps them valid and
        // unchanged for as long as the map lives; `_map` keeps it alive.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

pub(super) fn data_map_from_cpp(
    map: cxx::SharedPtr<bridge::NamedDataMap>,
    name: &str,
) -> Result<Box<DataMap>, Reported> {
    guarded(|| {
        let backend = |e: cxx::Exception| NamedDataError::Backend {
            map: name.to_string(),
            message: e.what().to_string(),
        };
        let m = map.as_ref().ok_or_else(|| NamedDataError::Backend {
            map: name.to_string(),
            message: "null map".into(),
        })?;
        let mut keys = Vec::new();
        let mut by_key = HashMap::new();
        for i in 0..m.num_keys().map_err(backend)? {
            let key = m.key_at(i).map_err(backend)?;
            if by_key.insert(key.clone(), i).is_some() {
                return Err(Reported::from(NamedDataError::DuplicateKey {
                    key,
                    map: name.to_string(),
                }));
            }
            keys.push(key);
        }
        Ok(Box::new(DataMap(Arc::new(CppMap {
            map,
            name: name.to_string(),
            keys,
            by_key,
        }))))
    })
}

impl xnnblob::named_data::NamedDataMap for CppMap {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        if !self.by_key.contains_key(key) {
            return Err(NamedDataError::KeyNotFound {
                key: key.to_string(),
                map: self.name.clone(),
            });
        }
        let m = self.map.as_ref().expect("checked non-null at construction");
        let bytes = m.get_data(key).map_err(|e| NamedDataError::Backend {
            map: self.name.clone(),
            message: e.what().to_string(),
        })?;
        let backing = CppBytes {
            _map: self.map.clone(),
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        };
        let len = bytes.len();
        Ok(DataBuffer::new(Arc::new(backing), 0, len).expect("whole range"))
    }

    fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
        Ok(self.get_data(key)?.len())
    }

    fn get_tensor_layout(
        &self,
        key: &str,
    ) -> Result<Option<xnnblob::named_data::TensorLayout>, NamedDataError> {
        self.by_key
            .get(key)
            .map(|_| None)
            .ok_or_else(|| NamedDataError::KeyNotFound {
                key: key.to_string(),
                map: self.name.clone(),
            })
    }

    fn lists(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    fn num_keys(&self) -> usize {
        self.keys.len()
    }

    fn key_at(&self, index: usize) -> Result<&str, NamedDataError> {
        self.keys
            .get(index)
            .map(String::as_str)
            .ok_or(NamedDataError::IndexOutOfRange {
                index,
                len: self.keys.len(),
            })
    }

    fn name(&self) -> &str {
        &self.name
    }
}
