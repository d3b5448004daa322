//! ExecuTorch's `NamedDataMap`, seen as xnnblob's [`NamedDataMap`].

use crate::ffi::{EtBuffer, EtDataMap};
use cxx::UniquePtr;
use parking_lot::Mutex;
use std::sync::Arc;
use xnnblob::aligned::AlignedBytes;
use xnnblob::named_data::{Backing, DataBuffer, NamedDataError, NamedDataMap, TensorLayout};
use xnnblob::tensor::XNN_EXTRA_BYTES;

/// A method's named-data map, valid while its init runs. Closing it at the end of init makes any
/// later use an error, never a use of a map ExecuTorch may have freed.
pub(crate) struct EtMap {
    map: Mutex<Option<UniquePtr<EtDataMap>>>,
    keys: Vec<String>,
    /// The same keys, to answer "is it listed" without a scan per constant.
    listed: std::collections::HashSet<String>,
    source: String,
}

// SAFETY: ExecuTorch's NamedDataMap methods are const and its maps (FlatTensorDataMap, the
// program's own) read through data loaders that serve concurrent loads; every call here is
// serialised by the mutex besides.
unsafe impl Send for EtMap {}
// SAFETY: as above.
unsafe impl Sync for EtMap {}

impl EtMap {
    pub fn new(map: UniquePtr<EtDataMap>) -> EtMap {
        let keys = match map.as_ref() {
            Some(m) => (0..m.num_keys().max(0) as u32)
                .map(|i| m.key_at(i))
                .collect(),
            None => Vec::new(),
        };
        // Keys not named by content are only meaningful within this map: its address names it
        // for as long as the program that owns it lives.
        let source = format!(
            "executorch-named-data@{:p}",
            map.as_ref()
                .map_or(std::ptr::null(), |m| m as *const EtDataMap)
        );
        EtMap {
            map: Mutex::new(Some(map).filter(|m| !m.is_null())),
            listed: keys.iter().cloned().collect(),
            keys,
            source,
        }
    }

    /// Ends the borrow: ExecuTorch may free the map once init returns.
    pub fn close(&self) {
        *self.map.lock() = None;
    }

    fn with<T>(
        &self,
        key: &str,
        call: impl FnOnce(&EtDataMap) -> Result<T, NamedDataError>,
    ) -> Result<T, NamedDataError> {
        let map = self.map.lock();
        match map.as_ref().and_then(|m| m.as_ref()) {
            Some(m) => call(m),
            None => Err(NamedDataError::Backend {
                source: self.source.clone(),
                message: format!("{key:?} asked for after the init that lent the map ended"),
            }),
        }
    }

    fn error(&self, key: &str, code: u32, what: &str) -> NamedDataError {
        // ExecuTorch's NotFound.
        if code == 0x20 {
            return NamedDataError::KeyNotFound {
                key: key.to_string(),
                source: self.source.clone(),
            };
        }
        NamedDataError::Backend {
            source: self.source.clone(),
            message: format!("{what}({key:?}) failed with ExecuTorch error {code:#x}"),
        }
    }
}

impl NamedDataMap for EtMap {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        self.with(key, |m| {
            let mut code = 0u32;
            let buffer: UniquePtr<EtBuffer> = m.get_data(key, &mut code);
            let Some(b) = buffer.as_ref() else {
                return Err(self.error(key, code, "get_data"));
            };
            // SAFETY: ExecuTorch's FreeableBuffer holds `size` readable bytes at `data` until
            // it is freed, which dropping `buffer` (after the copy) does.
            let bytes = unsafe { std::slice::from_raw_parts(b.data(), b.size()) };
            // An mmap loader's segment is read by faults: without this, each fault reads the
            // device's whole readahead window around a blob of a few KiB.
            xnnblob::mmap::advise_read_soon(bytes);
            // Copied into memory xnnblob owns (with XNNPACK's slack): a shared constant may
            // outlive the program, and data loader, it came from.
            let mut owned =
                AlignedBytes::zeroed(bytes.len() + XNN_EXTRA_BYTES, 64).ok_or_else(|| {
                    NamedDataError::Backend {
                        source: self.source.clone(),
                        message: format!("out of memory copying {key:?}"),
                    }
                })?;
            owned.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
            Ok(DataBuffer::new(Arc::new(owned), 0, bytes.len()).expect("the copy holds it"))
        })
    }

    /// Unknown without reading: ExecuTorch's `get_tensor_layout` is not safe on the blobs its
    /// XNNPACK exporter writes (they carry no layout, and FlatTensorDataMap dereferences the
    /// missing one). The size of a constant left unread is checked when it is read in.
    fn data_size(&self, key: &str) -> Result<usize, NamedDataError> {
        if !self.listed.contains(key) {
            return Err(NamedDataError::KeyNotFound {
                key: key.to_string(),
                source: self.source.clone(),
            });
        }
        Err(NamedDataError::Backend {
            source: self.source.clone(),
            message: format!("the size of {key:?} is not known without reading it"),
        })
    }

    fn get_tensor_layout(&self, _key: &str) -> Result<Option<TensorLayout>, NamedDataError> {
        Ok(None)
    }

    /// Through `get_data` and a copy: ExecuTorch's `load_data_into` looks the blob's layout up
    /// too, and crashes on the layout-less blobs of its XNNPACK exports (as `get_tensor_layout`).
    fn load_data_into(&self, key: &str, buffer: &mut [u8]) -> Result<(), NamedDataError> {
        self.with(key, |m| {
            let mut code = 0u32;
            let data: UniquePtr<EtBuffer> = m.get_data(key, &mut code);
            let Some(b) = data.as_ref() else {
                return Err(self.error(key, code, "get_data"));
            };
            if b.size() != buffer.len() {
                return Err(NamedDataError::SizeMismatch {
                    key: key.to_string(),
                    data_size: b.size(),
                    buffer_size: buffer.len(),
                });
            }
            // SAFETY: ExecuTorch's FreeableBuffer holds `size` readable bytes at `data` until
            // it is freed, which dropping `data` (after the copy) does.
            buffer.copy_from_slice(unsafe { std::slice::from_raw_parts(b.data(), b.size()) });
            Ok(())
        })
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

    fn source(&self) -> &str {
        &self.source
    }
}

/// The processed payload, owned by xnnblob from init on and freed (ExecuTorch's `Free`) when the
/// last view of it goes: at the end of init unless inline constants in it are in use.
pub(crate) struct Processed(pub UniquePtr<EtBuffer>);

// SAFETY: a FreeableBuffer is plain memory with a free function; nothing in it is thread-bound.
unsafe impl Send for Processed {}
// SAFETY: only read after construction.
unsafe impl Sync for Processed {}

impl Backing for Processed {
    fn bytes(&self) -> &[u8] {
        match self.0.as_ref() {
            // SAFETY: `size` readable bytes at `data` until the buffer is freed (on drop).
            Some(b) if !b.data().is_null() => unsafe {
                std::slice::from_raw_parts(b.data(), b.size())
            },
            _ => &[],
        }
    }
}
