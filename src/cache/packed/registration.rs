//! Registration: which unpacked data, at which address, stands for which blob, while XNNPACK
//! packs from it.

use super::*;

impl PackedWeightsCache {
    /// Declares that `data` (about to be handed to XNNPACK as a kernel, bias or other packed
    /// constant) is the blob `id`, for as long as the registration lives.
    ///
    /// `id` must stand for everything XNNPACK packs from the data besides its operator's own
    /// parameters (which its look-up seed carries): for a weight, its bytes *and* its datatype,
    /// shape and quantization (see [`BlobId::described`]). The same address registered under
    /// two identities at once is found by neither: look-ups through it miss, and what XNNPACK
    /// packs from it is used by its runtime only, never kept.
    pub fn register<'a, T: Copy>(&'a self, data: &'a [T], id: BlobId) -> Registration<'a> {
        let ptr = data.as_ptr().cast::<u8>();
        self.core().register(ptr, id, None);
        Registration {
            cache: self,
            ptr,
            id,
        }
    }

    /// Room for `more` registrations, for a caller about to make that many.
    pub fn reserve_registrations(&self, more: usize) {
        self.core().reserve_registrations(more);
    }

    /// As [`register`](Self::register), for data from a named-data map: once XNNPACK has packed
    /// it, its pages are released (if it is file-backed) so unpacked and packed copies are not
    /// both resident.
    pub fn register_buffer<'a>(&'a self, buffer: &'a DataBuffer, id: BlobId) -> Registration<'a> {
        self.core()
            .register(buffer.as_ptr(), id, Some(buffer.clone()));
        Registration {
            cache: self,
            ptr: buffer.as_ptr(),
            id,
        }
    }

    /// As [`register_buffer`](Self::register_buffer), without a borrow: the registration holds
    /// the buffer (so its address cannot be reused while registered) and the cache. None, with
    /// nothing registered, if the buffer's address is registered under another identity now
    /// (the same bytes as another tensor): the caller gives this one an address of its own.
    pub fn register_owned(
        self: &Arc<Self>,
        buffer: DataBuffer,
        id: BlobId,
    ) -> Option<OwnedRegistration> {
        if !self
            .core()
            .try_register(buffer.as_ptr(), id, Some(buffer.clone()))
        {
            return None;
        }
        Some(OwnedRegistration {
            cache: self.clone(),
            address: buffer.as_ptr() as usize,
            id,
            token: None,
            ended: false,
            _held: Held::Buffer(buffer),
        })
    }

    /// As [`register`](Self::register), for a caller that cannot hold a [`Registration`] (the C
    /// API): the address stays registered until [`unregister_raw`](Self::unregister_raw). The
    /// pointer is a key only; it is never dereferenced. False, with nothing registered, if the
    /// address is registered under another identity now.
    pub fn register_raw(&self, ptr: *const u8, id: BlobId) -> bool {
        self.core().try_register(ptr, id, None)
    }

    /// Ends a [`register_raw`](Self::register_raw) registration of `ptr` (a raw address holds
    /// one identity at a time, so the address alone names it).
    pub fn unregister_raw(&self, ptr: *const u8) {
        if let Some(id) = self.core().registered_id(ptr) {
            self.core().unregister(ptr, id, None);
        }
    }

    /// Releases `data`'s resident pages (if it is file-backed) whenever the weights registered
    /// at `registered` (a registration's address) have been packed, as their own are: data
    /// XNNPACK reads only to pack them, such as a blockwise layer's scales. Lasts as long as the
    /// registration; false if nothing is registered there.
    pub fn release_with(&self, registered: *const u8, data: DataBuffer) -> bool {
        self.core().release_with(registered, data)
    }

    /// Reads the placeholder `data` in with `fill` whenever the weights registered at
    /// `registered` are about to be packed (a look-up of them misses), and lets it go once they
    /// are: a placeholder of data XNNPACK reads only to pack them, such as a blockwise layer's
    /// scales, which a warm launch then never reads. Lasts as long as the registration; false
    /// if nothing is registered there.
    pub fn read_with(
        &self,
        registered: *const u8,
        data: Arc<DeferredData>,
        fill: Arc<Fill>,
    ) -> bool {
        self.core().read_with(registered, data, fill)
    }

    /// Which of `kernels` (addresses registered with this cache) have no packed entry yet, by
    /// index: the weights a runtime created now would pack.
    pub(crate) fn unpacked_kernels(&self, kernels: &[*const u8]) -> Vec<usize> {
        self.core().unpacked_kernels(kernels)
    }

    /// The identity `ptr` is registered under, if it is.
    pub(crate) fn registered_id(&self, ptr: *const u8) -> Option<BlobId> {
        self.core().registered_id(ptr)
    }

    /// Registers a placeholder ([`DeferredData`]) under `id`: XNNPACK gets its address, and its
    /// bytes are read in with `fill` only if a look-up misses (then released once packed). `fill`
    /// is dropped with the registration, so it may use a data source that lives only as long.
    /// None, with nothing registered, if the placeholder is registered under another identity
    /// now (one placeholder shared by two tensors of the same bytes and another shape).
    pub fn register_deferred(
        self: &Arc<Self>,
        data: Arc<DeferredData>,
        id: BlobId,
        fill: Arc<Fill>,
    ) -> Option<OwnedRegistration> {
        static TOKENS: AtomicU64 = AtomicU64::new(1);
        let token = TOKENS.fetch_add(1, Ordering::Relaxed);
        if !self.core().register_deferred(&data, id, fill, token) {
            return None;
        }
        Some(OwnedRegistration {
            cache: self.clone(),
            address: data.address() as usize,
            id,
            token: Some(token),
            ended: false,
            _held: Held::Deferred(data),
        })
    }
}

/// Keeps a pointer → identity registration alive; dropping it unregisters.
pub struct Registration<'a> {
    cache: &'a PackedWeightsCache,
    ptr: *const u8,
    id: BlobId,
}

/// A registration that owns its buffer and a reference to the cache; dropping it unregisters.
pub struct OwnedRegistration {
    cache: Arc<PackedWeightsCache>,
    /// The registered address (a key, never dereferenced).
    address: usize,
    /// The identity it is registered under.
    id: BlobId,
    /// Names this registration's fill, for a placeholder.
    token: Option<u64>,
    /// Unregistered already, by [`end_all`](Self::end_all).
    ended: bool,
    _held: Held,
}

impl OwnedRegistration {
    /// Ends `registrations` (a delegate's, once its runtime is created), those of one cache
    /// under one lock of it: dropped one by one, each took the lock, and a delegate holds one
    /// per weight.
    pub fn end_all(mut registrations: Vec<OwnedRegistration>) {
        let Some(cache) = registrations.first().map(|r| r.cache.clone()) else {
            return;
        };
        cache.core().unregister_all(
            registrations
                .iter_mut()
                .filter(|r| Arc::ptr_eq(&r.cache, &cache))
                .map(|r| {
                    r.ended = true;
                    (r.address as *const u8, r.id, r.token)
                }),
        );
        // What each held is let go only now, after its address is free again; another
        // cache's registrations end as they drop.
        drop(registrations);
    }
}

/// What a registration keeps alive so its address is not reused while registered.
#[allow(dead_code)] // Kept alive, never read.
enum Held {
    Buffer(DataBuffer),
    Deferred(Arc<DeferredData>),
}

impl Drop for OwnedRegistration {
    fn drop(&mut self) {
        if !self.ended {
            self.cache
                .core()
                .unregister(self.address as *const u8, self.id, self.token);
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.cache.core().unregister(self.ptr, self.id, None);
    }
}
