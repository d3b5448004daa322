//! Registrations: the unpacked data callers hand XNNPACK, by address, with its content identity,
//! which translate XNNPACK's pointer keys into content keys; placeholders read in when a look-up
//! misses, and pages released once packed.

use super::{CacheCore, State};
use crate::cache::format::EntryKey;
use crate::cache::identity::BlobId;
use crate::deferred::{DeferredData, Fill};
use crate::named_data::DataBuffer;
use crate::xnn::LookUpKey;
use std::sync::Arc;

/// What is registered at one address.
pub(super) struct Registered {
    /// The identities the address is registered under (see [`Ids`]).
    ids: Ids,
    /// Mapped data whose pages may be released once packed.
    release: Option<DataBuffer>,
    /// Other data XNNPACK reads only to pack this (a blockwise layer's scales): released with it.
    companions: Vec<DataBuffer>,
    /// Placeholders of other data XNNPACK reads only to pack this, with how to read each in:
    /// read in when a look-up of it misses, released once it is packed.
    companion_placeholders: Vec<(Arc<DeferredData>, Arc<Fill>)>,
    /// A placeholder: its bytes are read in (pinned) only when a look-up misses.
    deferred: Option<Arc<DeferredData>>,
    /// How to read them in, one per live registration (each from an init whose data source
    /// is alive while it is registered), by registration token.
    fills: Vec<(u64, Arc<Fill>)>,
}

impl Registered {
    fn new(id: BlobId, release: Option<DataBuffer>) -> Registered {
        Registered {
            ids: Ids::One(id, 1),
            release,
            companions: Vec::new(),
            companion_placeholders: Vec::new(),
            deferred: None,
            fills: Vec::new(),
        }
    }

    /// The one identity of the address; None while it is ambiguous.
    fn id(&self) -> Option<BlobId> {
        match &self.ids {
            Ids::One(id, _) => Some(*id),
            Ids::Many(_) => None,
        }
    }
}

/// The identities one address is registered under, each with its number of live registrations.
/// One identity is the rule, held in place (a delegate registers each of its weights once, and
/// drops every registration after its runtime is created); two or more at once (a caller that
/// registered the same bytes as two different tensors) make the address ambiguous: look-ups
/// through it find nothing and what XNNPACK packs from it is never kept, so neither identity
/// can be served the other's packing.
enum Ids {
    One(BlobId, usize),
    /// Two or more identities; never fewer (one left is held as `One`).
    Many(Vec<(BlobId, usize)>),
}

impl Ids {
    /// Whether an identity other than `id` holds the address.
    fn other_than(&self, id: BlobId) -> bool {
        match self {
            Ids::One(only, _) => *only != id,
            Ids::Many(_) => true,
        }
    }

    /// One more registration under `id`.
    fn add(&mut self, id: BlobId) {
        match self {
            Ids::One(only, count) if *only == id => *count += 1,
            Ids::One(only, count) => *self = Ids::Many(vec![(*only, *count), (id, 1)]),
            Ids::Many(ids) => match ids.iter_mut().find(|(other, _)| *other == id) {
                Some((_, count)) => *count += 1,
                None => ids.push((id, 1)),
            },
        }
    }

    /// One registration under `id` fewer (none if it holds none); true when none is left.
    fn remove(&mut self, id: BlobId) -> bool {
        match self {
            Ids::One(only, count) => {
                if *only == id {
                    *count -= 1;
                }
                *count == 0
            }
            Ids::Many(ids) => {
                if let Some(at) = ids.iter().position(|(other, _)| *other == id) {
                    ids[at].1 -= 1;
                    if ids[at].1 == 0 {
                        ids.remove(at);
                    }
                }
                if let [(id, count)] = ids.as_slice() {
                    *self = Ids::One(*id, *count);
                }
                false
            }
        }
    }
}

impl CacheCore {
    /// Room for `more` registrations: a delegate registering a thousand weights would otherwise
    /// grow the table (hashing every address again) ten times.
    pub fn reserve_registrations(&self, more: usize) {
        self.state.lock().registered.reserve(more);
    }

    /// Registers `ptr` under `id`. If it is registered under another identity already, it is
    /// ambiguous until one of them is unregistered (see [`Registered`]).
    pub fn register(&self, ptr: *const u8, id: BlobId, release: Option<DataBuffer>) {
        let mut state = self.state.lock();
        Self::add_registration(&mut state, ptr, id, release);
    }

    /// Registers `ptr` under `id` only if it is free or registered under `id` already; false
    /// (and nothing registered) if another identity holds it.
    pub fn try_register(&self, ptr: *const u8, id: BlobId, release: Option<DataBuffer>) -> bool {
        let mut state = self.state.lock();
        if let Some(r) = state.registered.get(&(ptr as usize))
            && r.ids.other_than(id)
        {
            return false;
        }
        Self::add_registration(&mut state, ptr, id, release);
        true
    }

    fn add_registration(
        state: &mut State,
        ptr: *const u8,
        id: BlobId,
        release: Option<DataBuffer>,
    ) {
        match state.registered.entry(ptr as usize) {
            std::collections::hash_map::Entry::Occupied(held) => {
                let r = held.into_mut();
                r.ids.add(id);
                if release.is_some() {
                    r.release = release;
                }
            }
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert(Registered::new(id, release));
            }
        }
    }

    /// Registers a placeholder's address under `id`, with how to read its bytes in if a look-up
    /// misses; `token` names this registration's `fill` for [`unregister`](Self::unregister).
    /// False (and nothing registered) if another identity holds the address.
    pub fn register_deferred(
        &self,
        data: &Arc<DeferredData>,
        id: BlobId,
        fill: Arc<Fill>,
        token: u64,
    ) -> bool {
        let address = data.address();
        let mut state = self.state.lock();
        if let Some(r) = state.registered.get(&(address as usize))
            && r.ids.other_than(id)
        {
            return false;
        }
        Self::add_registration(&mut state, address, id, None);
        let r = state
            .registered
            .get_mut(&(address as usize))
            .expect("registered just now");
        r.deferred = Some(data.clone());
        r.fills.push((token, fill));
        true
    }

    /// Ends one registration of `ptr` under `id` (and, for a placeholder, its `token`'s fill).
    pub fn unregister(&self, ptr: *const u8, id: BlobId, token: Option<u64>) {
        Self::unregister_in(&mut self.state.lock(), ptr, id, token);
    }

    /// [`unregister`](Self::unregister) of each of `registrations`, under one lock: a delegate
    /// ends every registration of its weights at once, once its runtime is created.
    pub fn unregister_all(
        &self,
        registrations: impl IntoIterator<Item = (*const u8, BlobId, Option<u64>)>,
    ) {
        let mut state = self.state.lock();
        for (ptr, id, token) in registrations {
            Self::unregister_in(&mut state, ptr, id, token);
        }
    }

    fn unregister_in(state: &mut State, ptr: *const u8, id: BlobId, token: Option<u64>) {
        if let Some(r) = state.registered.get_mut(&(ptr as usize)) {
            if let Some(token) = token {
                r.fills.retain(|(t, _)| *t != token);
            }
            if r.ids.remove(id) {
                state.registered.remove(&(ptr as usize));
            }
        }
    }

    /// The identity `ptr` is registered under.
    pub fn registered_id(&self, ptr: *const u8) -> Option<BlobId> {
        self.state
            .lock()
            .registered
            .get(&(ptr as usize))
            .and_then(Registered::id)
    }

    /// Which of `kernels` (registered addresses) no entry is packed from yet, under any seed
    /// or bias: by index into `kernels`. An unregistered address counts as not packed.
    pub fn unpacked_kernels(&self, kernels: &[*const u8]) -> Vec<usize> {
        let state = self.state.lock();
        kernels
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                state
                    .registered
                    .get(&(**p as usize))
                    .and_then(Registered::id)
                    .is_none_or(|id| !state.by_key.holds_kernel(&id))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The content key of XNNPACK's pointer key; None if a non-null pointer is unknown.
    pub(super) fn entry_key(state: &State, key: &LookUpKey) -> Option<EntryKey> {
        // A registered address whose identity is NONE stands for bytes no look-up may find
        // (see `register_constants`): read in on a miss, never identified.
        let id = |p: *const std::ffi::c_void| -> Option<BlobId> {
            if p.is_null() {
                Some(BlobId::NONE)
            } else {
                state
                    .registered
                    .get(&(p as usize))
                    .and_then(Registered::id)
                    .filter(|id| !id.is_none())
            }
        };
        let kernel = id(key.kernel)?;
        if kernel.is_none() {
            return None;
        }
        Some(EntryKey {
            kernel,
            bias: id(key.bias)?,
            seed: key.seed,
        })
    }

    /// The placeholders among a key's kernel and bias, and those of what XNNPACK reads to pack
    /// them ([`read_with`](Self::read_with)), each with the ways to read it in (one per live
    /// registration, newest first).
    pub(super) fn deferred_of(
        state: &State,
        key: &LookUpKey,
    ) -> Vec<(Arc<DeferredData>, Vec<Arc<Fill>>)> {
        let registered = [key.kernel, key.bias].map(|p| state.registered.get(&(p as usize)));
        let registered = registered.iter().flatten();
        // A warm launch's look-ups meet no placeholder: they allocate nothing.
        if registered
            .clone()
            .all(|r| r.deferred.is_none() && r.companion_placeholders.is_empty())
        {
            return Vec::new();
        }
        let own = registered.clone().filter_map(|r| {
            let d = r.deferred.clone()?;
            Some((d, r.fills.iter().rev().map(|(_, f)| f.clone()).collect()))
        });
        let companions = registered.flat_map(|r| {
            r.companion_placeholders
                .iter()
                .map(|(d, f)| (d.clone(), vec![f.clone()]))
        });
        own.chain(companions).collect()
    }

    /// Reads `data` in with `fill` whenever what is registered at `ptr` is about to be packed (a
    /// look-up of it misses), and lets it go once packed: a placeholder of data XNNPACK reads
    /// only to pack it. False if nothing is registered there.
    pub fn read_with(&self, ptr: *const u8, data: Arc<DeferredData>, fill: Arc<Fill>) -> bool {
        let mut state = self.state.lock();
        match state.registered.get_mut(&(ptr as usize)) {
            Some(r) => {
                r.companion_placeholders.push((data, fill));
                true
            }
            None => false,
        }
    }

    pub(super) fn release_unpacked(state: &State, key: &LookUpKey) {
        for p in [key.kernel, key.bias] {
            if let Some(r) = state.registered.get(&(p as usize)) {
                r.release
                    .iter()
                    .chain(&r.companions)
                    .for_each(DataBuffer::release_pages);
            }
        }
    }

    /// Releases `data`'s pages too whenever what is registered at `ptr` has been packed:
    /// data XNNPACK reads only while packing it. False if nothing is registered there.
    pub fn release_with(&self, ptr: *const u8, data: DataBuffer) -> bool {
        let mut state = self.state.lock();
        match state.registered.get_mut(&(ptr as usize)) {
            Some(r) => {
                r.companions.push(data);
                true
            }
            None => false,
        }
    }
}
