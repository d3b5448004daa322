//! Turns a validated payload into an XNNPACK runtime: constants come from the named-data map
//! through the shared data cache, packed weights from the packed-weight cache.

use super::constants::{
    Loaded, Treatment, deferrable_constants, failed_fill, load_constants, load_scales,
    pin_read_as_is,
};
use super::error::{DelegateError, at};
use super::fold::Folds;
use super::fusion::{Alias, FusedOrder, Fusion};
use super::graph::{ById, Values, XNN_FLAG_EXTERNAL_OUTPUT};
use super::operators::GraphIo;
use super::payload;
use super::prepack::Prepacked;
use super::values::define_values;
use super::weight_identities::{KeyCheck, register_constants};
use crate::backend::{ModelContext, Weights};
use crate::cache::OwnedRegistration;
use crate::fast_hash::FastMap;
use crate::named_data::{DataBuffer, NamedDataMap};
use crate::xnn::{Runtime, Subgraph};
use std::sync::Arc;

self_cell::self_cell!(
    /// A delegate's runtime together with everything its subgraph borrowed (the loaded constants
    /// and scales, the weights cache), so it can be stored and moved freely:
    /// the runtime borrows from the owner, which lives at a fixed heap address and is dropped
    /// after it.
    pub(crate) struct OwnedRuntime {
        owner: Keep,
        #[covariant]
        dependent: Runtime,
    }
);

/// Everything a delegate's runtime borrows: owned here so the runtime can live in a handle.
///
/// Not the payload: XNNPACK copies the graph into the runtime, and the constants inline in it
/// are held by their own views. ExecuTorch's mmap loader maps each delegate's payload apart, so
/// keeping it held two pages per delegate resident for the runtime's life (400 KiB for a
/// 62-delegate decoder) that ExecuTorch's own backend frees after init.
pub(crate) struct Keep {
    /// Filled once, while the graph is built (the payload is parsed and verified once).
    loaded: std::sync::OnceLock<Loaded>,
    cache: Weights,
    /// What this delegate lends the packed-weight cache to keep is lent under this number
    /// (see [`super::constants::load_constants`]), and copied when it ends if no save copied it.
    lender: u64,
}

impl Drop for Keep {
    fn drop(&mut self) {
        // Before the constants go: a buffer lent from them must not outlive the data source
        // that lent it (its program's loader).
        if let Weights::Packed(cache) = &self.cache {
            cache.take_back_lent(self.lender);
        }
    }
}

/// Where `init`'s time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InitTimings {
    /// Validating the payload and loading (mapping) its constants.
    pub load: std::time::Duration,
    /// Packing, on the backend's threads, the weights the cache did not hold yet (see
    /// [`prepack`](super::prepack)).
    pub prepack: std::time::Duration,
    /// Building the subgraph and creating the XNNPACK runtime (packing, or finding packed).
    pub create: std::time::Duration,
    /// XNNPACK's runtime creation alone (`xnn_create_runtime_v4`: its operators made, each
    /// weight packed or found in the cache): what any backend of XNNPACK spends.
    pub runtime: std::time::Duration,
    /// What packing ahead of creation did.
    pub prepacked: Prepacked,
    /// Weights XNNPACK packed inside the runtime's creation (0 when packing ahead found them
    /// all, or when every weight was in the cache).
    pub packed_at_creation: usize,
    /// Finalizing the weights cache (a background save starts here).
    pub finalize: std::time::Duration,
    /// The first question of the pool's size (left out of the other parts): the first in a
    /// process starts the host's pool threads (ExecuTorch's), which no backend whose operators
    /// run on that pool avoids. Zero when the delegate never asked.
    pub pool_start: std::time::Duration,
}

/// The most external ids a payload may declare: ExecuTorch's own backend's limit.
const MAX_EXTERNAL_IDS: u32 = 4096;

/// Rejects unsupported nodes, and more external ids than ExecuTorch allows, before anything is
/// loaded.
fn check_nodes(known: &Values<'_>, io: &GraphIo) -> Result<(), DelegateError> {
    let graph = known.graph();
    // XNNPACK allocates a value slot (some 200 bytes) for every external id up front: a count
    // taken on trust let a 1.5 KB payload make it allocate and zero 3 GB (found by fuzzing).
    // The count is not bounded by the graph's values: an input its method never reads has an
    // external id (its place among the call's arguments) and no value.
    if graph.num_externs() > MAX_EXTERNAL_IDS {
        return Err(DelegateError::BadGraph(format!(
            "{} external ids, above ExecuTorch's {MAX_EXTERNAL_IDS}",
            graph.num_externs()
        )));
    }
    let nodes = graph.xnodes().map_or(0, |n| n.len());
    let values = graph.xvalues().map_or(0, |v| v.len());
    let largest = (0..nodes)
        .filter_map(|n| io.node(n))
        .flat_map(|(reads, writes)| reads.iter().chain(writes))
        .copied()
        .max()
        .unwrap_or(0)
        .max(known.largest());
    let mut reads: ById<usize> = ById::new(largest, values);
    // Each written value: its node, and how many values that node writes.
    let mut writer: ById<(usize, usize)> = ById::new(largest, values);
    for (n, node) in graph.xnodes().iter().flatten().enumerate() {
        let kind = node.xnode_union_type();
        let Some((inputs, outputs)) = io.node(n) else {
            return Err(DelegateError::UnsupportedNode {
                index: n,
                name: kind
                    .variant_name()
                    .map_or_else(|| format!("node type {}", kind.0), str::to_string),
            });
        };
        for &i in inputs {
            *reads.get_or_insert_with(i, || 0) += 1;
        }
        for &output in outputs {
            if let Some((first, _)) = writer.insert(output, (n, outputs.len())) {
                return Err(DelegateError::BadGraph(format!(
                    "value {output} is written by nodes {first} and {n}"
                )));
            }
        }
    }
    // XNNPACK drops a node whose output nothing reads, but not what fed it, and then aborts the
    // process in its fusion pass: such a graph (no exporter writes one) is refused here.
    let mut outputs: ById<()> = ById::new(largest, values);
    for (_, t) in known.tensors() {
        if t.flags() & XNN_FLAG_EXTERNAL_OUTPUT != 0 {
            outputs.insert(t.id_out(), ());
        }
    }
    // A node of several outputs (argmax pooling's values and indices) is kept while one is used.
    let used = |value: u32| reads.contains(value) || outputs.contains(value);
    for (value, &(n, written)) in writer.iter() {
        let node_used = written > 1
            && io
                .node(n)
                .is_some_and(|(_, writes)| writes.iter().any(|&v| used(v)));
        if !used(value) && !node_used {
            return Err(DelegateError::BadGraph(format!(
                "node {n} writes value {value}, which no node reads and which is no output"
            )));
        }
    }
    Ok(())
}

/// What building the runtime hands back besides it.
struct Built {
    /// Registrations that must outlive runtime creation.
    registrations: Vec<OwnedRegistration>,
    /// How long loading the constants took.
    load: std::time::Duration,
    /// What packing ahead of creation did, and how long it took.
    prepacked: (Prepacked, std::time::Duration),
    /// Weights the creation itself packed.
    packed_at_creation: usize,
    /// How long XNNPACK's runtime creation took.
    runtime: std::time::Duration,
}

/// How many weights the packed-weight cache has packed so far (0 for other caches).
fn packs(weights: &Weights) -> usize {
    match weights {
        Weights::Packed(cache) => cache.packed_count(),
        _ => 0,
    }
}

/// Enables setup (and saves, for the packed-weight cache).
fn finalize(weights: &Weights) -> Result<(), DelegateError> {
    match weights {
        Weights::None => Ok(()),
        Weights::Packed(c) => c.finalize().map_err(DelegateError::Cache),
        Weights::Xnnpack(c) => c.finalize().map_err(at(|| "weights cache".to_string())),
        Weights::Provider(c) => {
            c.finalize();
            Ok(())
        }
    }
}

/// Validates the payload (once), loads its constants through the backend's shared data cache,
/// builds and creates the runtime with the model's weights cache, workspace and thread pool.
///
/// With `deferral` (the same map, shared) and a packed-weight cache, constants XNNPACK reads only
/// to pack them, named by content, are not read at all: a warm launch finds their packing by
/// key, and a miss reads them from `deferral` then (see [`crate::deferred`]).
pub(crate) fn compile(
    payload_bytes: DataBuffer,
    map: &dyn NamedDataMap,
    deferral: Option<Arc<dyn NamedDataMap>>,
    model: &ModelContext,
    aliases: &[Alias],
) -> Result<(OwnedRuntime, InitTimings), DelegateError> {
    static LENDERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let keep = Keep {
        loaded: std::sync::OnceLock::new(),
        cache: model.weights().clone(),
        lender: LENDERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    let deferral = deferral.filter(|_| matches!(model.weights(), Weights::Packed(_)));
    let started = std::time::Instant::now();
    // The pool's size, asked only where hashing or packing would use it: the first question
    // of ExecuTorch's pool starts its threads, which a delegate that runs on the calling
    // thread and finds its weights packed never needs.
    let pool_threads = std::cell::OnceCell::new();
    let pool_start = std::cell::Cell::new(std::time::Duration::ZERO);
    let threads = || {
        *pool_threads.get_or_init(|| {
            let asking = std::time::Instant::now();
            let threads = model.threads();
            pool_start.set(asking.elapsed());
            threads
        })
    };
    // What the builder hands out besides the runtime: registrations that must live while the
    // runtime is created, and the time constants took.
    let mut built: Option<Built> = None;
    let runtime = OwnedRuntime::try_new(keep, |k| -> Result<Runtime<'_>, DelegateError> {
        let p = payload::parse(&payload_bytes)?;
        let io = GraphIo::of(&p.graph);
        let known = Values::of(&p.graph);
        check_nodes(&known, &io)?;
        let fp16_as_fp32 = super::fallback::computes_fp16_as_fp32(&known)?;
        // The operands XNNPACK reads only to pack: asked by three passes below.
        let packed = super::operators::packed_operands(&p.graph);
        let converted = if fp16_as_fp32 {
            super::fallback::fp16_constants(&known)?
        } else {
            FastMap::default()
        };
        // A launch whose cache file held nothing packs every weight. A delegate of few weights
        // then reads its constants as ExecuTorch's backend does and packs them in its runtime's
        // creation: a placeholder would be read in there (pinned, then released: system calls
        // each), and packing ahead takes a runtime of its own, each costing more than such a
        // delegate's packing (a small 8da4w LLM's cold load 2.15 ms with them, ExecuTorch's
        // without a cache 1.81).
        let packs_in_creation = match &k.cache {
            Weights::Packed(cache) => {
                cache.opened_empty() && super::prepack::packs_little(&known, &packed)
            }
            _ => false,
        };
        let mut deferrable = match deferral {
            Some(_) if !packs_in_creation => deferrable_constants(&known, &packed)?,
            _ => FastMap::default(),
        };
        let mut check = match &k.cache {
            Weights::Packed(cache) => Some(KeyCheck::new(map, cache, &threads)),
            _ => None,
        };
        if let Some(check) = &mut check {
            // A key whose check finds another identity is packed from its bytes; the check
            // comes first, so that placeholders are made only for keys that matched.
            deferrable.retain(|&i, _| {
                known.named_key(i).is_none_or(|key| {
                    known
                        .stated_id(i)
                        .is_none_or(|claimed| check.identity(key, claimed) == claimed)
                })
            });
        }
        let constants = load_constants(
            &known,
            &payload_bytes,
            p.constant_data,
            p.header.constant_data_offset as usize,
            map,
            model,
            Treatment {
                deferrable: &deferrable,
                converted: &converted,
                packed: &packed,
            },
            k.lender,
        )?;
        let scales = load_scales(&known, &constants)?;
        let loaded = k.loaded.get_or_init(|| Loaded {
            constants,
            scales,
            pinned: parking_lot::Mutex::new(Vec::new()),
            fp16_as_fp32,
            private: std::sync::OnceLock::new(),
        });
        // Each part without the pool's start, which is a part of its own.
        let load_time = started.elapsed().saturating_sub(pool_start.get());
        let registrations = match (&k.cache, &mut check) {
            (Weights::Packed(cache), Some(check)) => {
                let (registrations, private) = register_constants(
                    &known,
                    loaded,
                    cache,
                    deferral.as_ref(),
                    check,
                    payload_bytes.data(),
                )?;
                // Loaded once per delegate, registered once with it.
                let _ = loaded.private.set(private);
                registrations
            }
            _ => Vec::new(),
        };
        let mut g = Subgraph::new(p.graph.num_externs()).map_err(at(|| "subgraph".into()))?;
        // Room for every value of the payload past the external ids (an upper bound: external
        // values take their ids' slots), and for its nodes; a payload's counts are its own
        // claims, so room past MOST_RESERVED is left to growing as each is defined.
        const MOST_RESERVED: usize = 1 << 16;
        let nodes = p.graph.xnodes().map_or(0, |n| n.len());
        let values = p.graph.num_externs() as usize + known.len();
        g.reserve(values.min(MOST_RESERVED), nodes.min(MOST_RESERVED))
            .map_err(at(|| "subgraph".into()))?;
        // Asked only where a fold or an alias needs it.
        let order = std::cell::OnceCell::new();
        let order = || order.get_or_init(|| FusedOrder::of(&known, &io));
        let folds = Folds::of(&known, fp16_as_fp32, order);
        let fusion = match aliases {
            [] => Fusion::Allowed,
            _ => order().fusion_for(aliases, |input| folds.read_as(input), fp16_as_fp32)?,
        };
        let (ids, twins) = define_values(&mut g, &known, loaded, &folds)?;
        twins.define_inputs(&mut g)?;
        let read_as_is =
            super::operators::define_nodes(&mut g, &p.graph, &io, &ids, folds.nodes())?;
        twins.define_outputs(&mut g)?;
        pin_read_as_is(&known, loaded, &read_as_is, deferral.as_ref())?;
        let prepacked = match &k.cache {
            Weights::Packed(cache) if model.packs_ahead() && !packs_in_creation => {
                let (started, before) = (std::time::Instant::now(), pool_start.get());
                let done = super::prepack::prepack(
                    &known,
                    loaded,
                    cache,
                    &io,
                    &packed,
                    deferral.as_ref(),
                    &threads,
                )?;
                (
                    done,
                    started.elapsed().saturating_sub(pool_start.get() - before),
                )
            }
            _ => Default::default(),
        };
        let packs_before = packs(&k.cache);
        // The graph's tables are done with: freed before XNNPACK's runtime is created, their
        // memory is what its allocations take next, where they would otherwise fault fresh
        // pages in (each page a fault, a microsecond or more in a VM).
        drop((ids, read_as_is, folds, deferrable, converted, packed));
        drop(known);
        let mut options = model.runtime_options().clone();
        options.keep_node_order = fusion == Fusion::Off;
        if options.threadpool.is_some() {
            // The host's pool starts in the load (its first question starts ExecuTorch's
            // threads), as ExecuTorch's backend starts it in every load it is in use for: a
            // program whose own kernels run on it would otherwise start it in its first execute.
            threads();
        }
        let creating = std::time::Instant::now();
        let runtime = Runtime::with_options(&g, k.cache.as_xnn(), &options)?;
        built = Some(Built {
            registrations,
            load: load_time,
            prepacked,
            packed_at_creation: packs(&k.cache) - packs_before,
            runtime: creating.elapsed(),
        });
        Ok(runtime)
    })?;
    let built = built.expect("set when the runtime was made");
    OwnedRegistration::end_all(built.registrations);
    let load_time = built.load;
    if let Some(error) = runtime.borrow_owner().loaded.get().and_then(failed_fill) {
        return Err(error);
    }
    let mut timings = InitTimings {
        load: load_time,
        prepack: built.prepacked.1,
        create: started
            .elapsed()
            .saturating_sub(load_time + built.prepacked.1 + pool_start.get()),
        prepacked: built.prepacked.0,
        packed_at_creation: built.packed_at_creation,
        runtime: built.runtime,
        pool_start: pool_start.get(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    finalize(&runtime.borrow_owner().cache)?;
    timings.finalize = started.elapsed();
    if runtime.borrow_owner().fp16_as_fp32() {
        super::fallback::count();
    }
    Ok((runtime, timings))
}

impl Keep {
    /// Whether the runtime computes the graph's fp16 values as fp32 (see [`super::fallback`]).
    pub(crate) fn fp16_as_fp32(&self) -> bool {
        self.loaded.get().is_some_and(|l| l.fp16_as_fp32)
    }
}
