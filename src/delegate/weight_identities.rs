//! The identities packed weights are looked up by: a constant's content, checked once per data
//! file where its named key claims it.

use super::constants::{ByValue, Constant, Loaded, Private, ReadToPack, fill_from, padded_copy};
use super::error::DelegateError;
use super::graph::{Tensor, Values, constant_index};
use super::operators::{self, NO_VALUE};
use super::remembered::Remembered;
use crate::cache::{BlobId, Description, OwnedRegistration, PackedWeightsCache};
use crate::deferred::{DeferredData, Fill};
use crate::fast_hash::FastMap;
use crate::mmap::FileIdentity;
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::schema::xnn as fb;
use std::sync::Arc;

/// The largest value given a copy of its own rather than a placeholder (see
/// [`register_constants`]): a page, what a placeholder read in holds resident anyway.
const COPY_AT_MOST: usize = 4096;

/// A named key, the identity it claims, and the bytes it names.
pub(super) type Claimed<'k> = (&'k str, BlobId, DataBuffer);

/// Below this many bytes in all, a file's keys are hashed on the calling thread: starting
/// others costs more than they save, and ExecuTorch's pool is not asked its size (which starts
/// its threads).
const ONE_THREAD_BELOW_BYTES: usize = 256 << 10;

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
    /// Threads the hashing may use (asked only when a file needs hashing).
    threads: &'a dyn Fn() -> usize,
    /// Files seen in this init, and whether they still need a check.
    files: FastMap<FileIdentity, bool>,
    /// Keys whose bytes did not match, with their bytes' hash.
    mismatched: FastMap<String, BlobId>,
    /// Each constant's identity ([`identity`]) once asked: a bias or a scale is asked for by
    /// every value and node that names it.
    identities: FastMap<usize, Option<BlobId>>,
}

impl<'a> KeyCheck<'a> {
    pub(super) fn new(
        map: &'a dyn NamedDataMap,
        cache: &'a PackedWeightsCache,
        threads: &'a dyn Fn() -> usize,
    ) -> KeyCheck<'a> {
        KeyCheck {
            map,
            cache,
            threads,
            files: FastMap::default(),
            mismatched: FastMap::default(),
            identities: FastMap::default(),
        }
    }

    /// The file `key`'s bytes come from (a key that states a sha256), if that file has no
    /// check recorded (a file checked in this init counts as checked).
    fn unchecked_file(&mut self, key: &str) -> Option<FileIdentity> {
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
        let bytes: usize = blobs.iter().map(|(_, _, data)| data.len()).sum();
        let threads = if bytes < ONE_THREAD_BELOW_BYTES {
            1
        } else {
            (self.threads)()
        };
        let mut shares: Vec<(usize, Vec<&Claimed<'_>>)> = (0..threads.min(blobs.len()).max(1))
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
    values: &Values<'_>,
    index: usize,
    keep: &Loaded,
    check: &mut KeyCheck<'_>,
) -> Option<BlobId> {
    if let Some(&known) = check.identities.get(&index) {
        return known;
    }
    let id = identity_of(values, index, keep, check);
    check.identities.insert(index, id);
    id
}

fn identity_of(
    values: &Values<'_>,
    index: usize,
    keep: &Loaded,
    check: &mut KeyCheck<'_>,
) -> Option<BlobId> {
    let key = values.named_key(index).unwrap_or("");
    let constant = keep.constants.get(index)?;
    // Converted data is known by its source's identity and the conversion: never hashed, and
    // never taken for genuine data of the converted type.
    let (source, conversion) = match constant {
        Constant::Converted {
            source, conversion, ..
        } => (&**source, Some(*conversion)),
        Constant::Deferred { conversion, .. } => (constant, *conversion),
        _ => (constant, None),
    };
    let id = match values.stated_id(index) {
        Some(claimed) => check.identity(key, claimed),
        None => BlobId::of_bytes(source.buffer()?.data()),
    };
    Some(match conversion {
        Some(c) => BlobId::converted(id, c.name()),
        None => id,
    })
}

/// A value's description: its datatype, shape (with `dims`) and quantization, with the identity
/// of its scales (and, for a constant, of its bytes: see [`register_constants`]). An activation
/// is described to a packing context without its shape: XNNPACK packs a filter the same whatever
/// the batch or sequence length it is applied to (a prefill's 16 tokens or a decode's one), so
/// two methods of one model find one packing of their shared weights.
fn describe(
    values: &Values<'_>,
    i: usize,
    (t, q): Tensor<'_>,
    keep: &Loaded,
    check: &mut KeyCheck<'_>,
    dims: bool,
) -> Result<Description, DelegateError> {
    let mut d = Description::new();
    d.number("datatype", t.datatype().0 as u64);
    if dims {
        // The encoding of `graph::dims_of`'s, read in place.
        match t.dims() {
            Some(dims) => d.numbers_from("dims", dims.iter().map(u64::from)),
            None => d.numbers_from("dims", std::iter::empty()),
        };
    }
    let Some(q) = q else {
        return Ok(d);
    };
    if let Some(p) = q.quant_params_as_per_tensor_quant() {
        d.numbers(
            "per_tensor",
            &[p.scale().to_bits() as u64, p.zero_point() as i64 as u64],
        );
    } else if let Some(p) = q.quant_params_as_per_token_dynamic_quant() {
        d.number("per_token_dynamic", p.num_nonbatch_dims() as i64 as u64);
    } else if let Some(p) = q.quant_params_as_per_channel_quant() {
        d.number("per_channel", p.channel_dim() as i64 as u64);
        scales_of(values, i, p.scale_buffer_idx(), &mut d, keep, check);
    } else if let Some(p) = q.quant_params_as_per_channel_group_quant() {
        d.numbers(
            "per_channel_group",
            &[p.channel_dim() as i64 as u64, p.group_size() as i64 as u64],
        );
        scales_of(values, i, p.scale_buffer_idx(), &mut d, keep, check);
    } else {
        d.number("quantization", q.quant_params_type().0 as u64);
    }
    Ok(d)
}

/// Adds the identity of value `i`'s scales (in constant `scale_index`, or inline) to `d`.
fn scales_of(
    values: &Values<'_>,
    i: usize,
    scale_index: u32,
    d: &mut Description,
    keep: &Loaded,
    check: &mut KeyCheck<'_>,
) {
    let id = if scale_index != 0 {
        identity(values, scale_index as usize, keep, check)
    } else {
        match (keep.f32_scales(i), keep.bf16_scales(i)) {
            (Some(s), _) => Some(BlobId::of_f32s(s)),
            (None, Some(crate::xnn::BlockwiseScales::InMemory(s))) => Some(BlobId::of_bytes(
                &s.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
            )),
            // Inline scales are always in memory.
            (None, _) => None,
        }
    };
    d.id("scales", id.unwrap_or(BlobId::NONE));
}

/// The descriptions a registration needs, made once each and only when asked: a value's
/// own (datatype, shape, quantization with its scales' identity), an activation's without its
/// shape (see [`describe`]), and a constant's content identity. Values are found by their
/// payload id; where several values have one id, the last of each kind counts.
struct Described<'g, 'v> {
    values: &'v Values<'g>,
    keep: &'v Loaded,
    /// Each id's last value, and its last value that is not a constant.
    last: FastMap<u32, usize>,
    last_activation: FastMap<u32, usize>,
    /// Each id's content identity, from its last constant value that has one.
    contents: FastMap<u32, BlobId>,
    full: FastMap<usize, Description>,
    activation: FastMap<usize, Description>,
    /// Each constant id's identity as described by [`full`](Self::full): a bias is asked for it
    /// as the operand of the node it is added in and again as a constant of its own, the same
    /// sha256 of the same description.
    described: FastMap<u32, BlobId>,
}

impl<'g, 'v> Described<'g, 'v> {
    fn new(
        values: &'v Values<'g>,
        keep: &'v Loaded,
        check: &mut KeyCheck<'_>,
    ) -> Result<Self, DelegateError> {
        let n = values.len();
        let mut last = FastMap::with_capacity_and_hasher(n, Default::default());
        let mut last_activation = FastMap::with_capacity_and_hasher(n, Default::default());
        let mut contents = FastMap::default();
        for each in values.each() {
            let (i, (t, _)) = each?;
            last.insert(t.id_out(), i);
            match constant_index(&t) {
                0 => {
                    last_activation.insert(t.id_out(), i);
                }
                index => {
                    if let Some(content) = identity(values, index, keep, check) {
                        contents.insert(t.id_out(), content);
                    }
                }
            }
        }
        Ok(Described {
            values,
            keep,
            last,
            last_activation,
            contents,
            full: FastMap::default(),
            activation: FastMap::default(),
            described: FastMap::default(),
        })
    }

    /// The content identity of id `id`'s last constant value that has one.
    fn content(&self, id: u32) -> Option<BlobId> {
        self.contents.get(&id).copied()
    }

    /// The description, with its shape, of id `id`'s last value.
    fn full(&mut self, id: u32, check: &mut KeyCheck<'_>) -> Result<&Description, DelegateError> {
        let Some(&i) = self.last.get(&id) else {
            return Err(DelegateError::BadGraph(format!(
                "value {id} is not defined"
            )));
        };
        if !self.full.contains_key(&i) {
            let d = self.describe(i, check, true)?;
            self.full.insert(i, d);
        }
        Ok(&self.full[&i])
    }

    /// The identity of constant id `id`, whose content is `content`, under its full description.
    fn described_id(
        &mut self,
        id: u32,
        content: BlobId,
        check: &mut KeyCheck<'_>,
    ) -> Result<BlobId, DelegateError> {
        if let Some(&known) = self.described.get(&id) {
            return Ok(known);
        }
        let described = BlobId::described(content, self.full(id, check)?);
        self.described.insert(id, described);
        Ok(described)
    }

    /// Value `i`'s description, with its shape where `dims` (see [`describe`]).
    fn describe(
        &self,
        i: usize,
        check: &mut KeyCheck<'_>,
        dims: bool,
    ) -> Result<Description, DelegateError> {
        describe(
            self.values,
            i,
            self.values.tensor_at(i)?,
            self.keep,
            check,
            dims,
        )
    }

    /// Appends operand `id` to a node's packing context as [`register_constants`] states it:
    /// a constant (a bias) by its identity, any other value (input, output) by its
    /// description, an activation's without its shape; nothing for an id no value has.
    fn operand(
        &mut self,
        context: &mut Description,
        name: &str,
        id: u32,
        check: &mut KeyCheck<'_>,
    ) -> Result<(), DelegateError> {
        if let Some(content) = self.content(id) {
            let described = self.described_id(id, content, check)?;
            context.bytes(name, &described.0);
        } else if let Some(&i) = self.last_activation.get(&id) {
            if !self.activation.contains_key(&i) {
                let d = self.describe(i, check, false)?;
                self.activation.insert(i, d);
            }
            context.bytes(name, self.activation[&i].encoded());
        } else if self.last.contains_key(&id) {
            let d = self.full(id, check)?;
            context.bytes(name, d.encoded());
        } else {
            context.bytes(name, &[]);
        }
        Ok(())
    }
}

/// Registers the data of every constant value with the packed-weight cache, under its identity:
/// its bytes, its description (datatype, shape, quantization with its scales' identity) and,
/// for an operand XNNPACK packs, the context of the nodes that pack it (each one's kind, packing
/// parameters, and its input, output and bias as [`Described::operand`] states them). Returns
/// the registrations, and the values given an address of their own:
/// - a value whose constant's address is registered under another identity (the same bytes as
///   another tensor: ExecuTorch names constants by content, so a layer and its transposed
///   twin, or zero-initialised layers, share one constant) gets a placeholder of its own, read
///   from the same source only if a look-up misses;
/// - a value packed by nodes of different contexts (a tied weight with two requantizations)
///   cannot be told apart at one address by XNNPACK's look-up: it gets a placeholder that no
///   look-up finds, so it is packed at each launch, never served another context's packing.
pub(super) fn register_constants(
    values: &Values<'_>,
    keep: &Loaded,
    cache: &Arc<PackedWeightsCache>,
    deferral: Option<&Arc<dyn NamedDataMap>>,
    check: &mut KeyCheck<'_>,
    payload: &[u8],
) -> Result<(Vec<OwnedRegistration>, ByValue<Private>), DelegateError> {
    let graph = &values.graph();
    let planned = match Remembered::for_payload(values, keep, check, payload)? {
        Some(remembered) => match remembered.recall(cache, values, keep) {
            Some(planned) => planned,
            None => {
                let planned = plan(graph, values, keep, check)?;
                remembered.keep(cache, &planned);
                planned
            }
        },
        None => plan(graph, values, keep, check)?,
    };
    register(values, &planned, keep, cache, deferral)
}

/// What registering a constant value takes: its identity, and whether nodes of different
/// contexts pack it (then it gets a placeholder no look-up finds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Planned {
    /// The value's index in the payload.
    pub(super) value: usize,
    pub(super) id: BlobId,
    pub(super) ambiguous: bool,
}

/// Each constant value's [`Planned`] registration, by ascending value index, as
/// [`register_constants`] states them; a constant value whose bytes have no identity has none.
fn plan(
    graph: &fb::XNNGraph<'_>,
    values: &Values<'_>,
    keep: &Loaded,
    check: &mut KeyCheck<'_>,
) -> Result<Vec<Planned>, DelegateError> {
    let mut described = Described::new(values, keep, check)?;
    // Each packed operand's context; None where two nodes pack it differently. Only the values
    // a packing node names, and the constants registered below, are ever described.
    let mut contexts: FastMap<u32, Option<Description>> = FastMap::default();
    for node in graph.xnodes().iter().flatten() {
        let mut context = Description::new();
        context.number("node", node.xnode_union_type().0 as u64);
        let Some(packing) = operators::packing(&node, &mut context) else {
            continue;
        };
        described.operand(&mut context, "input", packing.input, check)?;
        described.operand(&mut context, "output", packing.output, check)?;
        if packing.bias != NO_VALUE {
            described.operand(&mut context, "bias", packing.bias, check)?;
        }
        contexts
            .entry(packing.filter)
            .and_modify(|c| {
                if c.as_ref() != Some(&context) {
                    *c = None;
                }
            })
            .or_insert(Some(context));
    }
    let mut planned = Vec::new();
    for each in values.each() {
        let (i, (t, _)) = each?;
        if constant_index(&t) == 0 {
            continue;
        }
        let Some(content) = described.content(t.id_out()) else {
            continue;
        };
        let (id, ambiguous) = match contexts.get(&t.id_out()) {
            Some(Some(context)) => {
                let mut description = described.full(t.id_out(), check)?.clone();
                description.bytes("packed_by", context.encoded());
                (BlobId::described(content, &description), false)
            }
            // Packed by nodes of different contexts (ambiguous), or packed by none.
            other => (
                described.described_id(t.id_out(), content, check)?,
                other.is_some(),
            ),
        };
        planned.push(Planned {
            value: i,
            id,
            ambiguous,
        });
    }
    Ok(planned)
}

/// Registers each [`Planned`] constant value with the cache (see [`register_constants`]).
fn register(
    values: &Values<'_>,
    planned: &[Planned],
    keep: &Loaded,
    cache: &Arc<PackedWeightsCache>,
    deferral: Option<&Arc<dyn NamedDataMap>>,
) -> Result<(Vec<OwnedRegistration>, ByValue<Private>), DelegateError> {
    let mut registrations = Vec::with_capacity(planned.len());
    cache.reserve_registrations(planned.len());
    // By ascending value index, as `Loaded::private` looks them up.
    let mut private = Vec::new();
    for &Planned {
        value: i,
        id,
        ambiguous,
    } in planned
    {
        let (t, _) = values.tensor_at(i)?;
        let index = constant_index(&t);
        let constant = keep.constants.get(index).ok_or_else(|| {
            DelegateError::BadGraph(format!("value {i}: constant {index} was not loaded"))
        })?;
        let fill = || match constant {
            Constant::Deferred {
                key, conversion, ..
            } => {
                let map = deferral.expect("placeholders only with a source").clone();
                fill_from(map, key.clone(), *conversion)
            }
            constant => copy_of(constant.buffer().expect("not deferred").clone()),
        };
        let release_scales =
            |address: *const u8| attach_read_to_pack(cache, address, keep, i, deferral);
        if !ambiguous {
            let registered = match constant {
                Constant::Deferred { data, .. } => cache
                    .register_deferred(data.clone(), id, fill())
                    .inspect(|_| release_scales(data.address())),
                constant => {
                    let buffer = constant.buffer().expect("not deferred");
                    cache
                        .register_owned(buffer.clone(), id)
                        .inspect(|_| release_scales(buffer.as_ptr()))
                }
            };
            if let Some(registration) = registered {
                registrations.push(registration);
                continue;
            }
        }
        let len = match constant {
            Constant::Deferred { data, .. } => data.len(),
            constant => constant.buffer().expect("not deferred").len(),
        };
        if let Some(bytes) = constant
            .buffer()
            .filter(|_| !ambiguous && len <= COPY_AT_MOST)
        {
            // Small and in memory (most often a bias that another layer's has the same bytes
            // as): a copy of its own, which costs less than a placeholder's read-in (two
            // protection changes, and a page for the runtime's life) where XNNPACK reads it.
            let copy = padded_copy(bytes.data(), i)?;
            let registration = cache
                .register_owned(copy.clone(), id)
                .expect("a new copy's address is free");
            release_scales(copy.as_ptr());
            registrations.push(registration);
            private.push((i, Private::Copy(copy)));
            continue;
        }
        let data =
            Arc::new(
                DeferredData::reserve(len).map_err(|e| DelegateError::OutOfMemory {
                    what: format!("an address of its own for value {i} ({e})"),
                    bytes: len,
                })?,
            );
        let fill = fill();
        // Registered under NONE, a placeholder is read in when a look-up misses and found by no
        // look-up; under its identity, by this value's look-ups only (the address is new).
        let as_id = if ambiguous { BlobId::NONE } else { id };
        let registration = cache
            .register_deferred(data.clone(), as_id, fill.clone())
            .expect("a new placeholder's address is free");
        release_scales(data.address());
        registrations.push(registration);
        private.push((i, Private::Placeholder { data, fill }));
    }
    Ok((registrations, ByValue::from_ascending(private)))
}

/// Ties to the registration at `address` (value `i`'s) what XNNPACK reads only to pack it (a
/// blockwise filter's scales): released once it is packed, or read in when it is to be packed.
pub(super) fn attach_read_to_pack(
    cache: &PackedWeightsCache,
    address: *const u8,
    keep: &Loaded,
    i: usize,
    deferral: Option<&Arc<dyn NamedDataMap>>,
) {
    match keep.read_only_to_pack(i, deferral) {
        Some(ReadToPack::InMemory(data)) => {
            cache.release_with(address, data);
        }
        Some(ReadToPack::Deferred(data, fill)) => {
            cache.read_with(address, data, fill);
        }
        None => {}
    }
}

/// How a placeholder standing for `source`'s bytes is read in: a copy of them.
fn copy_of(source: DataBuffer) -> Arc<Fill> {
    Arc::new(move |bytes: &mut [u8]| {
        let data = source.data();
        if data.len() != bytes.len() {
            return Err(format!(
                "the source holds {} bytes, the placeholder {}",
                data.len(),
                bytes.len()
            )
            .into());
        }
        bytes.copy_from_slice(data);
        Ok(())
    })
}
