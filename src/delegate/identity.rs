//! The identities packed weights are looked up by: a constant's content, checked once per data
//! file where its named key claims it.

use super::constants::{fill_from, Constant, Loaded};
use super::error::DelegateError;
use super::graph::{constant_index, named_key, tensor_of};
use crate::cache::{BlobId, OwnedRegistration, PackedWeightsCache};
use crate::mmap::FileIdentity;
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::schema::xnn as fb;
use std::collections::HashMap;
use std::sync::Arc;

/// A named key, the identity it claims, and the bytes it names.
pub(super) type Claimed<'k> = (&'k str, BlobId, DataBuffer);

/// Checks named keys against their bytes before they are taken as identities ([`KeyTrust`]):
/// the first time an init meets a data file the cache has no check of, every key of that file
/// that states a sha256 is hashed and compared, at once, so that the file can be recorded as
/// checked whichever delegates later use which of its keys. Keys that do not match get their
/// bytes' own hash as identity.
///
/// [`KeyTrust`]: crate::cache::KeyTrust
pub(super) struct KeyCheck<'a> {
    map: &'a dyn NamedDataMap,
    cache: &'a PackedWeightsCache,
    /// Threads the hashing may use.
    threads: usize,
    /// Files seen in this init, and whether they still need a check.
    files: HashMap<FileIdentity, bool>,
    /// Keys whose bytes did not match, with their bytes' hash.
    mismatched: HashMap<String, BlobId>,
}

impl<'a> KeyCheck<'a> {
    pub(super) fn new(
        map: &'a dyn NamedDataMap,
        cache: &'a PackedWeightsCache,
        threads: usize,
    ) -> KeyCheck<'a> {
        KeyCheck {
            map,
            cache,
            threads: threads.max(1),
            files: HashMap::new(),
            mismatched: HashMap::new(),
        }
    }

    /// The file `key`'s bytes come from, if `key` states a sha256 and that file has no check
    /// recorded (a file checked in this init counts as checked).
    fn unchecked_file(&mut self, key: &str) -> Option<FileIdentity> {
        BlobId::from_named_key(key)?;
        let file = self.map.file_identity(key)?;
        let cache = self.cache;
        let unchecked = *self
            .files
            .entry(file)
            .or_insert_with(|| cache.must_check_keys_of(&file));
        unchecked.then_some(file)
    }

    /// Hashes every sha256-named key of `file` in the map, records what did not match, and
    /// tells the cache. A key that cannot be read is left to the load to report.
    fn check_file(&mut self, file: FileIdentity) {
        let map = self.map;
        let mut blobs: Vec<Claimed<'_>> = (0..map.num_keys())
            .filter_map(|i| {
                let key = map.key_at(i).ok()?;
                let claimed = BlobId::from_named_key(key)?;
                (map.file_identity(key) == Some(file))
                    .then(|| Some((key, claimed, map.get_data(key).ok()?)))?
            })
            .collect();
        // Largest first, each to the thread with the fewest bytes so far: the threads finish
        // together.
        blobs.sort_by_key(|(_, _, data)| std::cmp::Reverse(data.len()));
        let mut shares: Vec<(usize, Vec<&Claimed<'_>>)> = (0..self.threads.min(blobs.len()).max(1))
            .map(|_| (0, Vec::new()))
            .collect();
        for blob in &blobs {
            let share = shares
                .iter_mut()
                .min_by_key(|(bytes, _)| *bytes)
                .expect("a share");
            share.0 += blob.2.len();
            share.1.push(blob);
        }
        let hash = |share: &[&Claimed<'_>]| -> Vec<(String, BlobId)> {
            let mut differ = Vec::new();
            for (key, claimed, data) in share {
                let actual = BlobId::of_bytes(data.data());
                // Packing reads them again soon, from the page cache; until then they need
                // not count against this process's memory.
                data.release_pages();
                if actual != *claimed {
                    differ.push((key.to_string(), actual));
                }
            }
            differ
        };
        let differ: Vec<(String, BlobId)> = std::thread::scope(|scope| {
            let (first, rest) = shares.split_first().expect("a share");
            let others: Vec<_> = rest
                .iter()
                .map(|(_, share)| (share, scope.spawn(|| hash(share))))
                .collect();
            let mut all = hash(&first.1);
            for (share, other) in others {
                // Hashing does not panic; if a thread ever did, its share is hashed again here.
                all.extend(other.join().unwrap_or_else(|_| hash(share)));
            }
            all
        });
        let mismatches = differ.len();
        self.mismatched.extend(differ);
        self.files.insert(file, false);
        self.cache.keys_checked(file, mismatches);
    }

    /// The identity of the bytes named `key`, which claims `claimed`: the bytes' own hash
    /// where a check found them different.
    pub(super) fn identity(&mut self, key: &str, claimed: BlobId) -> BlobId {
        if let Some(file) = self.unchecked_file(key) {
            self.check_file(file);
        }
        self.mismatched.get(key).copied().unwrap_or(claimed)
    }
}

/// The identity of a constant as packed weights are looked up by: named keys of ExecuTorch's
/// XNNPACK exporter are the sha256 of the bytes (hashed only to check a new data file's keys);
/// anything else is hashed.
pub(super) fn identity(
    graph: &fb::XNNGraph<'_>,
    index: usize,
    keep: &Loaded,
    check: &mut KeyCheck<'_>,
) -> Option<BlobId> {
    let key = named_key(graph, index).unwrap_or("");
    let constant = keep.constants.get(index)?.as_ref()?;
    // Converted data is known by its source's identity and the conversion: never hashed, and
    // never taken for genuine data of the converted type.
    let (source, conversion) = match constant {
        Constant::Converted {
            source, conversion, ..
        } => (&**source, Some(*conversion)),
        Constant::Deferred { conversion, .. } => (constant, *conversion),
        _ => (constant, None),
    };
    let id = match BlobId::from_named_key(key) {
        Some(claimed) => check.identity(key, claimed),
        None => BlobId::of_bytes(source.buffer()?.data()),
    };
    Some(match conversion {
        Some(c) => BlobId::converted(id, c.name()),
        None => id,
    })
}

/// Registers the data of every constant value with the packed-weight cache, under its content
/// identity (combined with its scales' for quantized weights, whose packing includes them).
pub(super) fn register_constants(
    graph: &fb::XNNGraph<'_>,
    keep: &Loaded,
    cache: &Arc<PackedWeightsCache>,
    deferral: Option<&Arc<dyn NamedDataMap>>,
    check: &mut KeyCheck<'_>,
) -> Result<Vec<OwnedRegistration>, DelegateError> {
    let mut registrations = Vec::new();
    for (i, v) in graph.xvalues().iter().flatten().enumerate() {
        let (t, q) = tensor_of(v, i)?;
        let index = constant_index(&t);
        if index == 0 {
            continue;
        }
        let Some(mut id) = identity(graph, index, keep, check) else {
            continue;
        };
        if let Some(q) = q {
            let scale_index = q
                .quant_params_as_per_channel_quant()
                .map(|p| p.scale_buffer_idx())
                .or_else(|| {
                    q.quant_params_as_per_channel_group_quant()
                        .map(|p| p.scale_buffer_idx())
                })
                .unwrap_or(0) as usize;
            let scale_id = if scale_index != 0 {
                identity(graph, scale_index, keep, check)
            } else {
                match (keep.f32_scales(i), keep.bf16_scales(i)) {
                    (Some(s), _) => Some(BlobId::of_f32s(s)),
                    (None, Some(s)) => Some(BlobId::of_bytes(
                        &s.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
                    )),
                    (None, None) => None,
                }
            };
            if let Some(scale_id) = scale_id {
                id = BlobId::combine(&[id, scale_id]);
            }
        }
        let registration = match keep.constants[index].as_ref().expect("identity found it") {
            Constant::Deferred {
                key,
                data,
                conversion,
            } => {
                let map = deferral.expect("placeholders only with a source").clone();
                cache.register_deferred(data.clone(), id, fill_from(map, key.clone(), *conversion))
            }
            constant => cache.register_owned(constant.buffer().expect("not deferred").clone(), id),
        };
        registrations.push(registration);
    }
    Ok(registrations)
}
