//! Parallel cold packing.
//!
//! XNNPACK packs a runtime's weights one after another, inside `xnn_create_runtime`, on the
//! calling thread. Before a delegate's runtime is created, each fully connected or convolution
//! node whose filter the packed-weight cache holds no packing of yet is packed apart from the
//! graph: a runtime of that node alone over the same filter and bias (the same addresses, so the
//! same look-up keys) and the same cache, created on one of as many threads as the backend's
//! pool has. A small model's are packed on the calling thread (`ONE_THREAD_BELOW_ELEMENTS`), all
//! by one runtime of those nodes side by side, sharing no value. XNNPACK's look-up key is the
//! operator's parameters and the filter and bias, not the rest of the graph, so the real
//! creation then finds every weight packed and packs none.
//!
//! A filter or bias that stands behind a placeholder (see [`crate::deferred`]) is not read into
//! it: the packing runtime packs from the data source's own bytes (mapped by the mmap loader),
//! registered under the placeholder's identity while it packs, and their pages are released
//! once packed; so are a blockwise filter's scales. So a cold launch copies no unpacked weight.
//!
//! Nothing here can change a result: a weight that packing ahead failed to pack, or packed under
//! another key, is packed by the real creation as before.

use super::constants::{Loaded, deferred_constant};
use super::error::{DelegateError, at};
use super::graph::{ById, TensorView, Values, dims_of};
use super::operators::{define_node, packing_operands};
use super::values::{define_value, define_value_scaled, role_of};
use crate::cache::{OwnedRegistration, PackedWeightsCache};
use crate::fast_hash::{FastMap, FastSet};
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::schema::xnn as fb;
use crate::tensor::XNN_EXTRA_BYTES;
use crate::xnn::{BlockwiseScales, Datatype, Runtime, RuntimeOptions, Subgraph, ValueRole};
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use zerocopy::FromBytes;

/// What `prepack` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prepacked {
    /// Nodes whose filter had no packing in the cache yet.
    pub missing: usize,
    /// Of those, the nodes packed ahead (their weights are in the cache).
    pub packed: usize,
    /// Threads the packing ran on (0: nothing was missing).
    pub threads: usize,
}

/// Filters of fewer elements in all (4 MiB of fp32) are packed on the calling thread alone: on
/// a small model, starting, scheduling and joining other threads, each packing in runtimes of
/// its own and faulting in pages beside the other, costs more than they save. A MobileNetV3's
/// 270 Ki elements: a cold load of 4.23 ms packed by the runtime's creation, against 5.00 packed
/// ahead on two threads; a ResNet's (int8, 705 Ki) 2.94 against 3.04 (medians of 15 alternating
/// launches on 2 cores, Emerald Rapids; ExecuTorch's backend without a cache, packing them in
/// its creation: 4.16 and 2.91). Where another process keeps a core busy, a thread packing ahead
/// waits for it: the ResNet's cold load took 7.0 ms so, against 2.8 on one thread. (A UNet's 3.5
/// Ki elements, when the limit was first set: 1.117 ms on one thread against 1.239 on two.)
const ONE_THREAD_BELOW_ELEMENTS: usize = 1 << 20;

/// Whether the filters XNNPACK packs through the cache (`through_cache`) are few enough that a
/// delegate's packing would run on the calling thread alone (`ONE_THREAD_BELOW_ELEMENTS`).
pub(super) fn packs_little(values: &Values<'_>, through_cache: &FastSet<u32>) -> bool {
    let elements = through_cache
        .iter()
        .filter_map(|&id| values.tensor(id))
        .map(|(_, t)| dims_of(&t).iter().fold(1usize, |n, &d| n.saturating_mul(d)))
        .fold(0usize, usize::saturating_add);
    elements < ONE_THREAD_BELOW_ELEMENTS
}

/// A node to pack: its index, and the payload ids of its operands.
struct Job<'g> {
    index: usize,
    node: fb::XNode<'g>,
    input: u32,
    filter: u32,
    bias: Option<u32>,
    output: u32,
    /// Whether the real graph converts the input for qp8 GEMMs
    /// ([`super::operators::qb4w_gemm_inputs`]).
    qb4w_input: bool,
    /// The filter's size in elements, to hand out the largest first.
    size: usize,
}

/// Packs into `cache`, on up to `threads` threads, the weights of every node of the graph of
/// `values` whose filter `cache` has not packed yet. `loaded` holds the constants the real
/// runtime will be created with (registered with `cache`); `through_cache` the operands XNNPACK
/// packs through the cache; `source` is the map placeholders are read from.
pub(super) fn prepack(
    values: &Values<'_>,
    loaded: &Loaded,
    cache: &Arc<PackedWeightsCache>,
    io: &super::operators::GraphIo,
    through_cache: &FastSet<u32>,
    source: Option<&Arc<dyn NamedDataMap>>,
    threads: &dyn Fn() -> usize,
) -> Result<Prepacked, DelegateError> {
    let graph = values.graph();
    // Only filters XNNPACK reads only to pack, through the cache (`through_cache`, the graph's
    // [`packed_operands`](super::operators::packed_operands)); the others (a depthwise
    // convolution's among them) are packed by the runtime's creation.
    let address = |filter: u32| -> Result<Option<*const u8>, DelegateError> {
        let Some((f, t)) = values.tensor(filter) else {
            return Ok(None);
        };
        Ok(match role_of(&t, f, loaded)? {
            ValueRole::Static(bytes) => Some(bytes.as_ptr()),
            ValueRole::Deferred(data) => Some(data.address()),
            _ => None,
        })
    };
    // A warm launch finds every filter packed: asked of the filters themselves, before the
    // nodes that pack them are read.
    let mut filters = Vec::with_capacity(through_cache.len());
    for &filter in through_cache {
        filters.extend(address(filter)?);
    }
    if cache.unpacked_kernels(&filters).is_empty() {
        return Ok(Prepacked::default());
    }
    let mut jobs = Vec::new();
    let mut kernels = Vec::new();
    for (index, node) in graph.xnodes().iter().flatten().enumerate() {
        let Some((input, filter, bias, output)) = packing_operands(&node) else {
            continue;
        };
        if !through_cache.contains(&filter) {
            continue;
        }
        let (Some((_, t)), Some(address)) = (values.tensor(filter), address(filter)?) else {
            continue;
        };
        kernels.push(address);
        jobs.push(Job {
            index,
            node,
            input,
            filter,
            bias,
            output,
            qb4w_input: false,
            size: dims_of(&t).iter().product(),
        });
    }
    let missing = cache.unpacked_kernels(&kernels);
    if missing.is_empty() {
        return Ok(Prepacked::default());
    }
    let mut missing: Vec<Job<'_>> = {
        let mut keep = vec![false; jobs.len()];
        missing.iter().for_each(|&i| keep[i] = true);
        jobs.into_iter()
            .zip(keep)
            .filter_map(|(j, k)| k.then_some(j))
            .collect()
    };
    // The pool's size is asked only now (a warm launch never asks: the first question of
    // ExecuTorch's pool starts its threads). On one thread the runtime's creation packs them.
    let threads = threads();
    if threads <= 1 {
        return Ok(Prepacked::default());
    }
    // A small model's weights are packed sooner on this thread than others can be started
    // and joined.
    let elements: usize = missing.iter().map(|j| j.size).sum();
    let threads = if elements < ONE_THREAD_BELOW_ELEMENTS {
        1
    } else {
        threads.min(missing.len())
    };
    // The real graph's conversions for qp8 GEMMs are made the same way here: the packing, and
    // so the cache's key, follows the GEMM the input's layout selects. (Asked only now: a warm
    // launch, with nothing missing, needs none of it.)
    let qb4w_inputs = super::operators::qb4w_gemm_inputs(&graph, io, |filter| {
        values
            .tensor(filter)
            .is_some_and(|(_, t)| t.datatype() == fb::XNNDatatype::xnn_datatype_qbint4)
    });
    for job in &mut missing {
        job.qb4w_input = qb4w_inputs.contains(&job.input);
    }
    // On one thread, one runtime packs them all (a failure of any is retried alone below).
    if threads == 1 && pack_together(values, &missing, loaded, cache, source).is_ok() {
        return Ok(Prepacked {
            missing: missing.len(),
            packed: missing.len(),
            threads,
        });
    }
    missing.sort_by_key(|j| std::cmp::Reverse(j.size));
    let next = AtomicUsize::new(0);
    let packed = AtomicUsize::new(0);
    let work = || {
        while let Some(job) = missing.get(next.fetch_add(1, Ordering::Relaxed)) {
            // A failure here is the real creation's to report (it packs the weight itself).
            let one = std::slice::from_ref(job);
            if pack_together(values, one, loaded, cache, source).is_ok() {
                packed.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            let spawned = std::thread::Builder::new()
                .name("xnnblob-pack".into())
                .spawn_scoped(s, work);
            // Without another thread, this one does all the work.
            drop(spawned);
        }
        work();
    });
    Ok(Prepacked {
        missing: missing.len(),
        packed: packed.into_inner(),
        threads,
    })
}

/// What packing ahead packs a value from in place of its placeholder: the source's own
/// bytes, registered under the identity its address in the graph has, and those of its
/// blockwise scales where they wait behind a placeholder too ([`source_scales`]).
struct SourceBytes {
    bytes: DataBuffer,
    _registration: OwnedRegistration,
    scales: Option<DataBuffer>,
}

/// Value `i`'s [`SourceBytes`], when the source can give its bytes with XNNPACK's over-read room
/// and their address is free to take that identity (another tensor of the same bytes may be
/// packing from it now: then the placeholder serves).
fn source_bytes(
    t: &TensorView<'_>,
    i: usize,
    loaded: &Loaded,
    cache: &Arc<PackedWeightsCache>,
    source: Option<&Arc<dyn NamedDataMap>>,
) -> Option<SourceBytes> {
    let (key, _) = deferred_constant(t, loaded)?;
    let ValueRole::Deferred(placeholder) = role_of(t, i, loaded).ok()? else {
        return None;
    };
    let id = cache.registered_id(placeholder.address())?;
    let bytes = source?.get_data(key).ok()?;
    if bytes.len() != placeholder.len() || bytes.slack_after() < XNN_EXTRA_BYTES {
        return None;
    }
    let registration = cache.register_owned(bytes.clone(), id)?;
    // The scales' pages are released with the value's own once it is packed; where they are
    // not read from the source, their placeholder is read in (or released) with them.
    let scales = source_scales(i, loaded, source);
    match &scales {
        Some(scales) => {
            cache.release_with(bytes.as_ptr(), scales.clone());
        }
        None => {
            super::weight_identities::attach_read_to_pack(cache, bytes.as_ptr(), loaded, i, source)
        }
    }
    Some(SourceBytes {
        bytes,
        _registration: registration,
        scales,
    })
}

/// The source's own bytes of value `i`'s blockwise scales, where they wait behind a placeholder
/// and the source gives them as XNNPACK reads them: the placeholder's length, aligned for bf16,
/// with XNNPACK's over-read room. Read from there, the placeholder is never read in: its read-in
/// and release take a copy, three changes of the pages' protection and a release of them (those
/// that take access away flush the TLB of every core the process runs on), per weight of a cold
/// launch.
fn source_scales(
    i: usize,
    loaded: &Loaded,
    source: Option<&Arc<dyn NamedDataMap>>,
) -> Option<DataBuffer> {
    let (key, placeholder) = loaded.deferred_scales(i)?;
    let buffer = source?.get_data(key).ok()?;
    let readable = buffer.len() == placeholder.len()
        && <[u16]>::ref_from_bytes(buffer.data()).is_ok()
        && buffer.slack_after() >= XNN_EXTRA_BYTES;
    readable.then_some(buffer)
}

/// Creates (and drops) one runtime that packs the weights of every job of `jobs` with `cache`:
/// each job's node as a graph of its own would define it (job `k` reads external input `2k` and
/// writes external output `2k + 1`), its filter and bias as the real graph defines them, or as
/// their source's bytes. The nodes share no value, so XNNPACK fuses none of them and packs each
/// weight under the key a one-node graph would; and one runtime's creation costs less than one
/// per weight.
fn pack_together(
    values: &Values<'_>,
    jobs: &[Job<'_>],
    loaded: &Loaded,
    cache: &Arc<PackedWeightsCache>,
    source: Option<&Arc<dyn NamedDataMap>>,
) -> Result<(), DelegateError> {
    // Outlive the subgraph and its runtime.
    let reads = jobs
        .iter()
        .map(|job| {
            operands(job)
                .map(|id| {
                    let i = value_of(values, job, id)?;
                    let (t, _) = values.tensor_at(i)?;
                    Ok(source_bytes(&t, i, loaded, cache, source))
                })
                .collect::<Result<Vec<_>, DelegateError>>()
        })
        .collect::<Result<Vec<_>, DelegateError>>()?;
    let externals = u32::try_from(jobs.len() * 2)
        .map_err(|_| DelegateError::BadGraph(format!("{} nodes to pack", jobs.len())))?;
    let mut g = Subgraph::new(externals).map_err(at(|| "subgraph".into()))?;
    for (k, (job, read)) in jobs.iter().zip(&reads).enumerate() {
        define_job(&mut g, values, job, read, loaded, 2 * k as u32)?;
    }
    let cache: &PackedWeightsCache = cache;
    Runtime::with_options(&g, Some(cache), &RuntimeOptions::default())?;
    Ok(())
}

/// The constants `job`'s node packs: its filter, and its bias if it has one.
fn operands<'j>(job: &'j Job<'_>) -> impl Iterator<Item = u32> + 'j {
    std::iter::once(job.filter).chain(job.bias)
}

/// The index of the value of payload id `id`, which `job`'s node names.
fn value_of(values: &Values<'_>, job: &Job<'_>, id: u32) -> Result<usize, DelegateError> {
    values.index_of(id).ok_or_else(|| {
        DelegateError::BadGraph(format!("node {}: value {id} is not defined", job.index))
    })
}

/// Defines `job`'s node in `g`, reading external `external` and writing external
/// `external + 1`, with its operands read from `read` where their source's bytes are there
/// (by [`operands`]' order).
fn define_job<'k>(
    g: &mut Subgraph<'k>,
    values: &Values<'_>,
    job: &Job<'_>,
    read: &'k [Option<SourceBytes>],
    loaded: &'k Loaded,
    external: u32,
) -> Result<(), DelegateError> {
    let what = |part: &'static str| move || format!("node {}: {part}", job.index);
    let mut ids = ById::Map(FastMap::default());

    let i = value_of(values, job, job.input)?;
    let (t, q) = values.tensor_at(i)?;
    let dynamic = q.is_some_and(|q| q.quant_params_as_per_token_dynamic_quant().is_some());
    let input = if dynamic {
        // XNNPACK takes a dynamically quantized tensor only from a convert node.
        let x = g
            .define_tensor(Datatype::Fp32, &dims_of(&t), ValueRole::Input(external))
            .map_err(at(what("input")))?;
        let quantized = define_value(g, (t, q), i, loaded, ValueRole::Internal)?;
        if job.qb4w_input {
            g.define_convert_for_qb4w_gemm(x, quantized)
        } else {
            g.define_convert(x, quantized)
        }
        .map_err(at(what("input conversion")))?;
        quantized
    } else {
        define_value(g, (t, q), i, loaded, ValueRole::Input(external))?
    };
    ids.insert(job.input, input);

    for (id, read) in operands(job).zip(read) {
        let i = value_of(values, job, id)?;
        let tensor = values.tensor_at(i)?;
        let t = tensor.0;
        let role = match (role_of(&t, i, loaded)?, read) {
            (ValueRole::Deferred(_), Some(read)) => ValueRole::Static(read.bytes.data()),
            (role @ (ValueRole::Static(_) | ValueRole::Deferred(_)), _) => role,
            _ => {
                return Err(DelegateError::BadGraph(format!(
                    "node {}: operand {id} is not constant",
                    job.index
                )));
            }
        };
        let scales = read
            .as_ref()
            .and_then(|r| r.scales.as_ref())
            .and_then(|s| <[u16]>::ref_from_bytes(s.data()).ok())
            .map(BlockwiseScales::InMemory);
        ids.insert(id, define_value_scaled(g, tensor, i, loaded, role, scales)?);
    }

    let o = value_of(values, job, job.output)?;
    let output = define_value(
        g,
        values.tensor_at(o)?,
        o,
        loaded,
        ValueRole::Output(external + 1),
    )?;
    ids.insert(job.output, output);

    let read_as_is = RefCell::new(ById::like(&ids));
    define_node(
        g,
        job.index,
        &job.node,
        &ids,
        &FastSet::default(),
        &read_as_is,
    )?;
    Ok(())
}
