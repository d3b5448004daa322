//! XNNPACK's `xnn_weights_cache_provider` as a Rust trait.
//!
//! XNNPACK drives a weights cache through six C callbacks. [`ProvidedWeightsCache`] owns the C struct and
//! points its callbacks at one [`PackedWeightsProvider`], so a provider is plain safe Rust and the
//! unsafe surface is the trampolines in this file.
//!
//! The contract as XNNPACK uses it (seen with the pinned build): on a miss it calls `look_up`,
//! then `reserve_space(n)`, packs into that memory, then `look_up_or_insert(key, ptr, n)`, and keeps
//! the returned offset (its convolution path calls `look_up_or_insert` with a null pointer even
//! after a hit, expecting the existing offset back); after the cache reports finalized, setup turns offsets into addresses with
//! `offset_to_addr`. XNNPACK does not check `look_up_or_insert`'s result, so a provider must not
//! fail it for memory it reserved.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use xnnpack_sys as sys;

/// What XNNPACK looks packed weights up by: a seed derived from the operator's packing
/// parameters, and the addresses of the unpacked kernel and bias (bias may be null).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LookUpKey {
    /// A hash XNNPACK computes of the operator's packing parameters.
    pub seed: u32,
    /// The address of the unpacked kernel (weights) XNNPACK packs from.
    pub kernel: *const c_void,
    /// The address of the unpacked bias; null when the operator has none.
    pub bias: *const c_void,
    /// The bytes of packed weights the operator reads at the offset a look-up returns (XNNPACK
    /// patch 0006): an entry of any other size must not be returned for this key.
    pub packed_size: usize,
}

/// The Rust side of a weights cache. Every method may be called from several threads at once.
pub trait PackedWeightsProvider: Send + Sync {
    /// The offset of packed weights for `key`, if present.
    fn look_up(&self, key: &LookUpKey) -> Option<usize>;
    /// Writable memory for `n` bytes of packed weights, at least 64-byte aligned, that stays
    /// valid until `look_up_or_insert` is called with it.
    fn reserve_space(&self, n: usize) -> Option<NonNull<u8>>;
    /// Adopts the `size` packed bytes at `ptr` under `key`, or returns the offset of the entry
    /// already present for `key`. XNNPACK also calls it with a null `ptr` (None here) after a
    /// `look_up` hit (its convolution path does): that is a pure look-up.
    fn look_up_or_insert(
        &self,
        key: &LookUpKey,
        ptr: Option<NonNull<u8>>,
        size: usize,
    ) -> Option<usize>;
    /// Whether runtimes may now be set up against this cache.
    fn is_finalized(&self) -> bool;
    /// The address of the packed weights at `offset`.
    fn offset_to_addr(&self, offset: usize) -> Option<NonNull<u8>>;
    /// Whether every byte `reserve_space` hands out is zero (fresh pages): XNNPACK then packs
    /// into it without zeroing it first (patch 0037). A provider that reuses memory says no.
    fn reserves_zeroed(&self) -> bool {
        false
    }
}

impl<T: PackedWeightsProvider + ?Sized> PackedWeightsProvider for std::sync::Arc<T> {
    fn look_up(&self, key: &LookUpKey) -> Option<usize> {
        (**self).look_up(key)
    }
    fn reserve_space(&self, n: usize) -> Option<NonNull<u8>> {
        (**self).reserve_space(n)
    }
    fn look_up_or_insert(
        &self,
        key: &LookUpKey,
        ptr: Option<NonNull<u8>>,
        size: usize,
    ) -> Option<usize> {
        (**self).look_up_or_insert(key, ptr, size)
    }
    fn is_finalized(&self) -> bool {
        (**self).is_finalized()
    }
    fn offset_to_addr(&self, offset: usize) -> Option<NonNull<u8>> {
        (**self).offset_to_addr(offset)
    }
    fn reserves_zeroed(&self) -> bool {
        (**self).reserves_zeroed()
    }
}

/// Something that can be handed to `xnn_create_runtime_v4` as its weights cache.
///
/// # Safety
/// The returned pointer must stay valid, and its callbacks callable from any thread, for as long
/// as `self` is borrowed.
pub unsafe trait AsXnnWeightsCache {
    /// The `xnn_weights_cache_t` to pass to `xnn_create_runtime_v4`.
    fn as_xnn_weights_cache(&self) -> sys::xnn_weights_cache_t;
}

/// An `xnn_weights_cache_t` whose callbacks call `P`.
pub struct ProvidedWeightsCache<P: PackedWeightsProvider> {
    // Boxed so the addresses XNNPACK holds (the struct and its context) never move.
    raw: Box<sys::xnn_weights_cache_provider>,
    provider: Box<P>,
}

// SAFETY: the raw struct is only read by XNNPACK after construction; P is Send + Sync.
unsafe impl<P: PackedWeightsProvider> Send for ProvidedWeightsCache<P> {}
// SAFETY: as above; every callback goes to P, which is Sync.
unsafe impl<P: PackedWeightsProvider> Sync for ProvidedWeightsCache<P> {}

impl<P: PackedWeightsProvider> ProvidedWeightsCache<P> {
    /// Wraps `provider` in an `xnn_weights_cache_provider` whose callbacks call it.
    pub fn new(provider: P) -> ProvidedWeightsCache<P> {
        let provider = Box::new(provider);
        let context = &*provider as *const P as *mut c_void;
        let raw = Box::new(sys::xnn_weights_cache_provider {
            context,
            look_up: Some(look_up::<P>),
            reserve_space: Some(reserve_space::<P>),
            look_up_or_insert: Some(look_up_or_insert::<P>),
            is_finalized: Some(is_finalized::<P>),
            offset_to_addr: Some(offset_to_addr::<P>),
            delete_cache: Some(delete_cache),
            reserves_zeroed: provider.reserves_zeroed(),
        });
        ProvidedWeightsCache { raw, provider }
    }

    /// The provider XNNPACK's callbacks reach.
    pub fn provider(&self) -> &P {
        &self.provider
    }
}

impl<P: PackedWeightsProvider> std::ops::Deref for ProvidedWeightsCache<P> {
    type Target = P;
    fn deref(&self) -> &P {
        &self.provider
    }
}

// SAFETY: `raw` and the provider it points to are boxed and owned by `self`, so both outlive any
// borrow of `self`; the provider is Sync, so the callbacks may run on any thread.
unsafe impl<P: PackedWeightsProvider> AsXnnWeightsCache for ProvidedWeightsCache<P> {
    fn as_xnn_weights_cache(&self) -> sys::xnn_weights_cache_t {
        &*self.raw as *const sys::xnn_weights_cache_provider as sys::xnn_weights_cache_t
    }
}

const NOT_FOUND: usize = usize::MAX;

/// # Safety
/// `context` must be the `P` installed by [`ProvidedWeightsCache::new`], still alive.
unsafe fn provider<'a, P>(context: *mut c_void) -> &'a P {
    // SAFETY: guaranteed by the caller.
    unsafe { &*(context as *const P) }
}

/// Reads XNNPACK's key.
///
/// # Safety
/// `key` must be null or point to a valid key.
unsafe fn read_key(key: *const sys::xnn_weights_cache_look_up_key) -> Option<LookUpKey> {
    // SAFETY: guaranteed by the caller.
    let key = unsafe { key.as_ref()? };
    Some(LookUpKey {
        seed: key.seed,
        kernel: key.kernel,
        bias: key.bias,
        packed_size: key.packed_size,
    })
}

// The trampolines: a panic must not unwind into C, so each one catches it and reports failure.

unsafe extern "C" fn look_up<P: PackedWeightsProvider>(
    context: *mut c_void,
    key: *const sys::xnn_weights_cache_look_up_key,
) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: XNNPACK passes back our context and a valid key.
        let (p, key) = unsafe { (provider::<P>(context), read_key(key)) };
        key.and_then(|k| p.look_up(&k)).unwrap_or(NOT_FOUND)
    }))
    .unwrap_or(NOT_FOUND)
}

unsafe extern "C" fn reserve_space<P: PackedWeightsProvider>(
    context: *mut c_void,
    n: usize,
) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: XNNPACK passes back our context.
        let p = unsafe { provider::<P>(context) };
        p.reserve_space(n)
            .map_or(std::ptr::null_mut(), |ptr| ptr.as_ptr().cast())
    }))
    .unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn look_up_or_insert<P: PackedWeightsProvider>(
    context: *mut c_void,
    key: *const sys::xnn_weights_cache_look_up_key,
    ptr: *mut c_void,
    size: usize,
) -> usize {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: XNNPACK passes back our context and a valid key.
        let (p, key) = unsafe { (provider::<P>(context), read_key(key)) };
        match key {
            Some(k) => p
                .look_up_or_insert(&k, NonNull::new(ptr.cast::<u8>()), size)
                .unwrap_or(NOT_FOUND),
            None => NOT_FOUND,
        }
    }))
    .unwrap_or(NOT_FOUND)
}

unsafe extern "C" fn is_finalized<P: PackedWeightsProvider>(context: *mut c_void) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: XNNPACK passes back our context.
        unsafe { provider::<P>(context) }.is_finalized()
    }))
    .unwrap_or(false)
}

unsafe extern "C" fn offset_to_addr<P: PackedWeightsProvider>(
    context: *mut c_void,
    offset: usize,
) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: XNNPACK passes back our context.
        let p = unsafe { provider::<P>(context) };
        p.offset_to_addr(offset)
            .map_or(std::ptr::null_mut(), |ptr| ptr.as_ptr().cast())
    }))
    .unwrap_or(std::ptr::null_mut())
}

/// The Rust owner frees the cache; XNNPACK's `xnn_delete_weights_cache` must not.
unsafe extern "C" fn delete_cache(_context: *mut c_void) -> sys::xnn_status {
    sys::xnn_status_success
}
