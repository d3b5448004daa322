//! The cxx bridge: everything C++ sees of xnnblob. Shared plain-data structs first, then the
//! Rust side (opaque handles, every fallible call a `Result`, which C++ sees as an exception),
//! then the C++ side (a user's `NamedDataMap`, and the C++ code compiled into the crate).
//! C++ headers: `include/xnnblob/`.
//!
//! The Rust side's larger parts live in child modules (named-data maps, whole programs, stateful
//! programs); their types and free functions are named here, where the bridge looks for them.

use std::collections::HashMap;
use std::sync::Arc;
use xnnblob::backend::{BackendOptions, ModelContext, WeightsCacheChoice, WorkspaceSharing};
use xnnblob::cache::PackedWeightsCache;
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{Backing, DataBuffer, FileDataMap, MergedMap, NamedDataError};
use xnnblob::tensor::{DType, Shape};
use xnnblob::xnn::AsXnnWeightsCache;
use xnnblob::xnn::{RawInput, RawOutput};

mod data_maps;
mod programs;
mod stateful;

// The bridge finds what it names in this module: each part's types and free functions.
use data_maps::{data_map_from_cpp, merge_data_maps, open_data_map};
use programs::load_program;
pub use programs::{Method, Program};
use stateful::new_stateful_builder;
pub use stateful::{InstanceBuilder, Stateful, StatefulBuilder, StatefulInstance};

#[cxx::bridge(namespace = "xnnblob")]
mod bridge {
    /// A key's tensor layout; `present` is false for keys stored without one.
    struct TensorLayout {
        /// Whether the key has a layout; the other fields are zero or empty when it has not.
        present: bool,
        /// The ExecuTorch scalar type code of the elements.
        scalar_type: i8,
        /// The dimensions (ExecuTorch's `sizes`).
        sizes: Vec<i32>,
        /// ExecuTorch's `dim_order`: dimension indices from outermost to innermost in memory.
        dim_order: Vec<u8>,
        /// The bytes a tensor of this layout takes (0 when that overflows).
        nbytes: usize,
    }

    /// Counters of a backend's shared data cache, read together: the core's
    /// `xnnblob::shared_data::SharedDataStats`, named in C++ after this face's `SharedCache`.
    struct SharedCacheStats {
        /// Calls served by a live entry or by joining an init in flight.
        hits: usize,
        /// Loads that succeeded.
        inits: usize,
        /// Loads that failed or panicked (not cached: the next call loads again).
        failures: usize,
        /// Live entries.
        entries: usize,
        /// Bytes the live entries hold.
        bytes_held: usize,
    }

    /// Counters of a packed-weight cache.
    struct WeightsCacheStats {
        /// XNNPACK look-ups that found packed weights.
        hits: usize,
        /// XNNPACK look-ups that found none (XNNPACK then packs).
        misses: usize,
        /// Weights XNNPACK packed into this cache.
        packed: usize,
        /// Entries known (loaded from the file and packed here).
        entries: usize,
        /// Bytes of packed weights the known entries hold.
        packed_bytes: usize,
    }

    /// A delegate constant that looks like a shared mutable buffer ExecuTorch's partitioner
    /// froze at export (`xnnblob::program::FrozenBufferSuspect`): the method computes with the
    /// buffer's export-time zeros, not with what the other methods write.
    struct FrozenBufferSuspect {
        /// The method whose delegate holds the constant.
        method: String,
        /// Which of its XNNPACK delegates, counting from 0.
        delegate: usize,
        /// The constant's named key (the sha256 of its bytes, all zero).
        key: String,
        /// Its length in bytes.
        bytes: usize,
        /// The shared mutable buffers of that size, as `value N of METHOD`.
        buffers: Vec<String>,
        /// The warning to give, one sentence naming the method, the buffer and the recipe.
        warning: String,
    }

    /// A mutable buffer of a stateful program; `initial_key` empty: zeros.
    struct StateDecl {
        /// The name methods bind the buffer by, unique within the program.
        name: String,
        /// The buffer's shape, in fp32 elements.
        shape: Vec<usize>,
        /// The id of the memory bank the buffer lives in, counting from 0; below the number of
        /// buffers declared.
        bank: usize,
        /// The named-data key of the buffer's initial fp32 bytes; empty: zeros.
        initial_key: String,
    }

    /// One of ExecuTorch's compile specs for a delegate.
    struct CompileSpec {
        /// The spec's key (ExecuTorch's `CompileSpec::key`).
        key: String,
        /// The spec's value, as uninterpreted bytes.
        value: Vec<u8>,
    }

    /// How a backend is set up (ExecuTorch's option names, where it has them).
    struct BackendConfig {
        /// 0: off, 1: per model, 2: global (ExecuTorch's `workspace_sharing_mode`).
        workspace_sharing_mode: i32,
        /// Threads XNNPACK splits operators across; 0 or 1: the calling thread.
        threads: usize,
        /// False: XNNPACK packs privately (ExecuTorch's `weight_cache_enabled`).
        weight_cache_enabled: bool,
        /// Empty: packed weights in memory (ExecuTorch's `packed_cache_path`).
        packed_cache_path: String,
        /// Read-only packed-weight caches made ahead of time (`xnnblob prepack`), files or
        /// directories, consulted before `packed_cache_path`, which they need (the drop-in's
        /// `packed_cache_layers`). Empty: none.
        packed_cache_layers: Vec<String>,
    }

    extern "Rust" {
        /// A named-data map: a `.ptd`, a `.pte`'s named data, a merge, or a C++ map.
        type DataMap;
        /// A zero-copy view of one key's bytes; keeps its backing alive until destroyed.
        type Buffer;
        /// The backend-wide shared data cache.
        type SharedCache;
        /// The packed-weight cache (an `xnn_weights_cache_t`).
        type WeightsCache;
        /// The backend-wide object: shared data cache, packed-weight caches, workspace, threads.
        type Backend;
        /// What the delegates of one model share: a packed-weight cache and a workspace.
        type Model;
        /// An initialised XNNPACK delegate.
        type Delegate;
        /// An ExecuTorch program (`.pte` + external `.ptd` files) fully delegated to XNNPACK.
        type Program;
        /// An initialised method of a program.
        type Method;

        /// xnnblob's crate version.
        fn version() -> &'static str;
        /// The sha256 hex of the linked XNNPACK's build identifier (packed weights depend on it).
        fn xnnpack_build_identifier() -> String;

        /// The named data of the `.ptd` or `.pte` at `path`, mapped (the weights are not read).
        fn open_data_map(path: &str) -> Result<Box<DataMap>>;
        /// Your own C++ map, named `name` in errors; its keys are read once, here.
        fn data_map_from_cpp(map: SharedPtr<NamedDataMap>, name: &str) -> Result<Box<DataMap>>;
        /// Both maps' keys as one map; a key in both is an error.
        fn merge_data_maps(first: &DataMap, second: &DataMap) -> Result<Box<DataMap>>;
        /// The number of keys; `key_at` takes indices below it.
        fn num_keys(self: &DataMap) -> usize;
        /// The key at `index`, in the map's own order.
        fn key_at(self: &DataMap, index: usize) -> Result<String>;
        /// `key`'s bytes, zero-copy (not through the shared data cache).
        fn get_data(self: &DataMap, key: &str) -> Result<Box<Buffer>>;
        /// The tensor layout stored with `key`.
        fn tensor_layout(self: &DataMap, key: &str) -> Result<TensorLayout>;
        /// Copies `key`'s bytes into `out`, which must be exactly their size.
        fn load_data_into(self: &DataMap, key: &str, out: &mut [u8]) -> Result<()>;

        /// The bytes (empty after `free`).
        fn data(self: &Buffer) -> &[u8];
        /// Releases the hold on the bytes early (ExecuTorch's `FreeableBuffer::Free`).
        fn free(self: &mut Buffer);

        /// The default config: no workspace sharing, the calling thread, packed weights in memory.
        fn default_backend_config() -> BackendConfig;
        /// A backend set up as `config` says; throws on a `workspace_sharing_mode` not 0, 1 or 2.
        fn new_backend(config: &BackendConfig) -> Result<Box<Backend>>;
        /// The backend's shared data cache.
        fn shared_cache(self: &Backend) -> Box<SharedCache>;
        /// A model context: packed weights in the file at `packed_cache_path` (empty: the
        /// backend's default).
        fn model(self: &Backend, packed_cache_path: &str) -> Result<Box<Model>>;
        /// A model context whose runtimes pack privately (no cache).
        fn model_without_weights_cache(self: &Backend) -> Result<Box<Model>>;
        /// The model's packed-weight cache; throws if it has none.
        fn weights_cache(self: &Model) -> Result<Box<WeightsCache>>;

        /// Read-only mode: the map's zero-copy buffer, loaded once per key.
        fn get_or_load(self: &SharedCache, map: &DataMap, key: &str) -> Result<Box<Buffer>>;
        /// The shared data cache's counters, read together.
        fn stats(self: &SharedCache) -> SharedCacheStats;

        /// The packed-weight cache of the file at `path` (created on the first save, mode
        /// 0600: the files its weights came from are not known).
        fn open_weights_cache(path: &str) -> Result<Box<WeightsCache>>;
        /// A new packed-weight cache with no file: nothing persists.
        fn in_memory_weights_cache() -> Box<WeightsCache>;
        /// The `xnn_weights_cache_t` (as an address) for `xnn_create_runtime_v4`.
        fn xnn_weights_cache(self: &WeightsCache) -> usize;
        /// Saves what was packed since the last save (if it has a file), on a background thread.
        fn finalize(self: &WeightsCache) -> Result<()>;
        /// Waits for a background save to be durable on disk; throws its error.
        fn wait_saved(self: &WeightsCache) -> Result<()>;
        /// The packed-weight cache's counters.
        fn stats(self: &WeightsCache) -> WeightsCacheStats;

        /// Initialises a delegate from ExecuTorch's XNNPACK payload (`processed`), its constants
        /// loaded from `map` through the backend's shared data cache; compile specs are ignored.
        fn delegate_init(
            processed: &[u8],
            compile_specs: &[CompileSpec],
            map: &DataMap,
            model: &Model,
        ) -> Result<Box<Delegate>>;
        /// The number of external inputs, bound in ascending external id.
        fn num_inputs(self: &Delegate) -> usize;
        /// The number of external outputs, bound in ascending external id.
        fn num_outputs(self: &Delegate) -> usize;
        /// The declared (largest) shape of an input.
        fn input_shape(self: &Delegate, index: usize) -> Result<Vec<usize>>;
        /// An ExecuTorch scalar type code.
        fn input_scalar_type(self: &Delegate, index: usize) -> Result<i8>;
        /// The shape of an output after the last execute (declared before the first).
        fn output_shape(self: &Delegate, index: usize) -> Result<Vec<usize>>;
        /// An ExecuTorch scalar type code.
        fn output_scalar_type(self: &Delegate, index: usize) -> Result<i8>;
        /// Writes output `index`'s shape into `dims`; returns its rank (no allocation).
        fn output_shape_into(self: &Delegate, index: usize, dims: &mut [usize]) -> Result<usize>;
        /// Binds input `index` for the next `execute`, in place: the bytes must stay valid and
        /// unchanged until it returns (the C++ `execute` binds and runs in one call).
        fn bind_input(
            self: &mut Delegate,
            index: usize,
            scalar_type: i8,
            shape: &[usize],
            data: &[u8],
            has_slack: bool,
        ) -> Result<()>;
        /// Binds output `index` for the next `execute`, in place (as `bind_input`).
        fn bind_output(
            self: &mut Delegate,
            index: usize,
            scalar_type: i8,
            data: &mut [u8],
        ) -> Result<()>;
        /// Runs on the bound buffers, then forgets them.
        fn execute(self: &mut Delegate) -> Result<()>;

        /// Collects the declarations and methods of a stateful program.
        type StatefulBuilder;
        /// A stateful program (declarations, layout, methods).
        type Stateful;
        /// One instance of a stateful program, with its own state.
        type StatefulInstance;
        /// Collects the C++ banks of a new instance.
        type InstanceBuilder;

        /// An empty stateful-program builder.
        fn new_stateful_builder() -> Box<StatefulBuilder>;
        /// Declares a mutable buffer.
        fn declare(self: &mut StatefulBuilder, decl: StateDecl);
        /// Adds method `name`, whose graph is the XNNPACK payload `payload` (copied).
        fn add_method(self: &mut StatefulBuilder, name: &str, payload: &[u8]);
        /// Binds external `external_id` of method `method` to state `state` (read or write-back).
        fn bind(
            self: &mut StatefulBuilder,
            method: &str,
            external_id: u32,
            state: &str,
            write: bool,
        );
        /// Builds the program from what was collected (the builder is left empty).
        fn build(self: &mut StatefulBuilder, map: &DataMap, model: &Model)
        -> Result<Box<Stateful>>;
        /// The bytes each memory bank must hold at least, by bank id.
        fn bank_sizes(self: &Stateful) -> Vec<usize>;
        /// An instance whose banks are host memory (memcpy).
        fn instantiate(self: &Stateful) -> Result<Box<StatefulInstance>>;
        /// Starts an instance whose banks are C++ banks, added in bank order.
        fn instance_builder(self: &Stateful) -> Box<InstanceBuilder>;
        /// Adds the next bank (bank ids count from 0).
        fn add_bank(self: &mut InstanceBuilder, bank: UniquePtr<MemoryBank>);
        /// The instance over the banks added, its state initialised.
        fn finish(self: &mut InstanceBuilder) -> Result<Box<StatefulInstance>>;
        /// Sets every buffer back to its initial value.
        fn reset(self: &mut StatefulInstance) -> Result<()>;
        /// Runs `method` on its non-state inputs (flattened fp32, in external-id order,
        /// `input_sizes` elements each); returns its non-state outputs concatenated.
        fn run(
            self: &mut StatefulInstance,
            method: &str,
            inputs: &[f32],
            input_sizes: &[usize],
        ) -> Result<Vec<f32>>;
        /// A copy of buffer `name`'s current fp32 values.
        fn read_state(self: &mut StatefulInstance, name: &str) -> Result<Vec<f32>>;

        /// Loads a program from `pte` with its weights in the `.ptd` files `ptds`; `cache_path`
        /// empty: the backend's default packed-weight cache.
        fn load_program(
            backend: &Backend,
            pte: &str,
            ptds: &[String],
            cache_path: &str,
        ) -> Result<Box<Program>>;
        /// The names of the program's methods.
        fn method_names(self: &Program) -> Vec<String>;
        /// The shared mutable buffers that look frozen into a delegate at export (looked for
        /// at the first call, from the program's file); empty for most programs. Nothing is
        /// printed: the app says each `warning` where its user will see it.
        fn frozen_buffer_suspects(self: &Program) -> Vec<FrozenBufferSuspect>;
        /// The packed-weight cache the program's methods pack into; throws if it has none.
        fn weights_cache(self: &Program) -> Result<Box<WeightsCache>>;
        /// Initialises method `name`.
        fn method(self: &Program, name: &str) -> Result<Box<Method>>;
        /// The number of the method's inputs.
        fn num_inputs(self: &Method) -> usize;
        /// The declared (largest) shape of an input.
        fn input_shape(self: &Method, index: usize) -> Result<Vec<usize>>;
        /// An ExecuTorch scalar type code.
        fn input_scalar_type(self: &Method, index: usize) -> Result<i8>;
        /// Binds input `index` for the next `execute`, in place (as for delegates).
        fn bind_input(
            self: &mut Method,
            index: usize,
            scalar_type: i8,
            shape: &[usize],
            data: &[u8],
            has_slack: bool,
        ) -> Result<()>;
        /// Runs on the bound inputs, then forgets them.
        fn execute(self: &mut Method) -> Result<()>;
        /// The number of outputs.
        fn num_outputs(self: &Method) -> usize;
        /// Output `index` of the last execute, in place.
        fn output_data(self: &Method, index: usize) -> Result<&[u8]>;
        /// The shape of output `index` after the last execute.
        fn output_shape(self: &Method, index: usize) -> Result<Vec<usize>>;
        /// An ExecuTorch scalar type code.
        fn output_scalar_type(self: &Method, index: usize) -> Result<i8>;
    }

    unsafe extern "C++" {
        include!("xnnblob/named_data.h");

        /// A named-data map implemented in C++ (see named_data.h for its contract).
        type NamedDataMap;
        /// The number of keys. Fallible, as every call into a user's map: named_data.h lets
        /// an implementation throw, and a throw from a call not declared fallible would end the
        /// process.
        fn num_keys(self: &NamedDataMap) -> Result<usize>;
        /// The key at `index` (below `num_keys`).
        fn key_at(self: &NamedDataMap, index: usize) -> Result<String>;
        /// `key`'s bytes, valid and unchanged while the map lives.
        fn get_data(self: &NamedDataMap, key: &str) -> Result<&[u8]>;

        include!("xnnblob/memory_bank.h");

        /// A memory bank implemented in C++ (see memory_bank.h for its contract).
        type MemoryBank;
        /// The bank's size in bytes.
        fn len(self: &MemoryBank) -> usize;
        /// The bank's first byte: 64-aligned, at a fixed address for the bank's life.
        fn base(self: Pin<&mut MemoryBank>) -> *mut u8;
        /// Writes `src` at `offset` bytes into the bank.
        fn copy_in(self: Pin<&mut MemoryBank>, offset: usize, src: &[u8]);
        /// Reads the bank's bytes from `offset` into `dst`.
        fn copy_out(self: Pin<&mut MemoryBank>, offset: usize, dst: &mut [u8]);
        /// Called before XNNPACK reads and writes the bank directly.
        fn begin_execute(self: Pin<&mut MemoryBank>);
        /// Called once XNNPACK is done with the bank.
        fn end_execute(self: Pin<&mut MemoryBank>);

        include!("xnnblob/xnnblob.h");

        /// One line naming xnnblob and XNNPACK, assembled in C++ (whose strings may throw
        /// `bad_alloc`: an `Err` here, not the end of the process).
        fn describe() -> Result<String>;
    }
}

pub use bridge::{
    BackendConfig, CompileSpec, SharedCacheStats, StateDecl, TensorLayout, WeightsCacheStats,
    describe,
};

// SAFETY: named_data.h requires C++ maps to be safe to call from any thread (const methods,
// no unsynchronised mutation) and to outlive nothing they hand out: Rust holds a shared_ptr.
unsafe impl Send for bridge::NamedDataMap {}
// SAFETY: as above.
unsafe impl Sync for bridge::NamedDataMap {}

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

fn xnnpack_build_identifier() -> String {
    xnnblob::sha256::to_hex(xnnblob::xnn::build_identifier())
}

/// A named-data map, behind the bridge's `DataMap`.
pub struct DataMap(Arc<dyn xnnblob::named_data::NamedDataMap>);
/// A buffer, and the shared-cache entry it came from (held so the entry lives as long).
pub struct Buffer(DataBuffer, Option<xnnblob::shared_data::SharedData>);
/// The backend's shared data cache (the backend handle, whose cache it is).
pub struct SharedCache(xnnblob::backend::Backend);
/// A packed-weight cache, behind the bridge's `WeightsCache`.
pub struct WeightsCache(Arc<PackedWeightsCache>);
/// The backend-wide object, behind the bridge's `Backend`.
pub struct Backend(xnnblob::backend::Backend);
/// What the delegates of one model share, behind the bridge's `Model`.
pub struct Model(ModelContext);

/// Buffers bound by C++ for the next execute: raw, because they are borrowed across two bridge
/// calls that the C++ `execute` makes back to back.
struct Bindings {
    inputs: Vec<Option<RawInput>>,
    outputs: Vec<Option<RawOutput>>,
}

impl Bindings {
    fn new(inputs: usize, outputs: usize) -> Bindings {
        Bindings {
            inputs: (0..inputs).map(|_| None).collect(),
            outputs: (0..outputs).map(|_| None).collect(),
        }
    }

    fn bind_input(
        &mut self,
        index: usize,
        scalar_type: i8,
        shape: &[usize],
        data: &[u8],
        has_slack: bool,
    ) -> Result<(), String> {
        let n = self.inputs.len();
        let slot = self
            .inputs
            .get_mut(index)
            .ok_or_else(|| out_of_range("input", index, n))?;
        *slot = Some(raw_input(scalar_type, shape, data, has_slack)?);
        Ok(())
    }

    fn bind_output(
        &mut self,
        index: usize,
        scalar_type: i8,
        data: &mut [u8],
    ) -> Result<(), String> {
        let n = self.outputs.len();
        let slot = self
            .outputs
            .get_mut(index)
            .ok_or_else(|| out_of_range("output", index, n))?;
        *slot = Some(RawOutput {
            data: data.as_mut_ptr(),
            capacity: data.len(),
            dtype: dtype_of(scalar_type)?,
        });
        Ok(())
    }

    /// Every binding, or which one is missing.
    fn check_complete(&self) -> Result<(), String> {
        if let Some(i) = self.inputs.iter().position(Option::is_none) {
            return Err(format!("input {i} is not bound"));
        }
        if let Some(i) = self.outputs.iter().position(Option::is_none) {
            return Err(format!("output {i} is not bound"));
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.inputs.iter_mut().for_each(|b| *b = None);
        self.outputs.iter_mut().for_each(|b| *b = None);
    }
}

/// C++'s description of an input, checked, as the runtime binds it.
fn raw_input(
    scalar_type: i8,
    shape: &[usize],
    data: &[u8],
    has_slack: bool,
) -> Result<RawInput, String> {
    Ok(RawInput {
        data: data.as_ptr(),
        len: data.len(),
        dtype: dtype_of(scalar_type)?,
        shape: Shape::new(shape).map_err(|e| e.to_string())?,
        padded: has_slack,
    })
}

/// Runs a bridge call with panics caught: cxx aborts the host process when a panic reaches
/// C++, so a panic becomes the call's error, as in every face of xnnblob. Public so that code
/// extending the bridge (the C++ checks) holds to the same policy.
pub fn guarded<T>(call: impl FnOnce() -> Result<T, Reported>) -> Result<T, Reported> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
        .unwrap_or_else(|panic| Err(Reported(panicked(&*panic))))
}

/// [`guarded`] for calls whose errors are plain text.
fn guarded_text<T>(call: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
        .unwrap_or_else(|panic| Err(panicked(&*panic)))
}

/// What a caught panic said, as the bridge reports it.
fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    format!(
        "xnnblob panicked: {}",
        xnnblob::report::panic_message(panic)
    )
}

/// An error as it crosses into C++ (`rust::Error`): cxx shows only `Display`, and each
/// error's `Display` says only its own layer, so the message is the whole chain of causes.
#[derive(Debug)]
pub struct Reported(String);

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<E: std::error::Error + 'static> From<E> for Reported {
    fn from(error: E) -> Reported {
        Reported(xnnblob::report::report(&error))
    }
}

fn dtype_of(scalar_type: i8) -> Result<DType, String> {
    DType::from_scalar_type(scalar_type)
        .ok_or_else(|| format!("scalar type {scalar_type} is not one xnnblob binds"))
}

/// An initialised XNNPACK delegate, and the C++ buffers bound for its next execute.
pub struct Delegate {
    inner: XnnDelegate,
    bound: Bindings,
}

fn default_backend_config() -> BackendConfig {
    BackendConfig {
        workspace_sharing_mode: 0,
        threads: 1,
        weight_cache_enabled: true,
        packed_cache_path: String::new(),
        packed_cache_layers: Vec::new(),
    }
}

fn new_backend(config: &BackendConfig) -> Result<Box<Backend>, Reported> {
    guarded(|| {
        let workspace_sharing = WorkspaceSharing::from_code(config.workspace_sharing_mode.into())
            .ok_or_else(|| xnnblob::backend::BackendError::InvalidOption {
            name: "workspace_sharing_mode (0, 1 or 2)",
            value: config.workspace_sharing_mode.to_string(),
        })?;
        let layers: Vec<std::path::PathBuf> =
            config.packed_cache_layers.iter().map(Into::into).collect();
        let packed_cache = match (
            config.weight_cache_enabled,
            config.packed_cache_path.as_str(),
        ) {
            (false, _) => WeightsCacheChoice::Disabled,
            (true, "") if !layers.is_empty() => {
                return Err(xnnblob::backend::BackendError::InvalidOption {
                    name: "packed_cache_layers (they need packed_cache_path)",
                    value: config.packed_cache_layers.join(":"),
                }
                .into());
            }
            (true, "") => WeightsCacheChoice::InMemory,
            (true, path) if layers.is_empty() => WeightsCacheChoice::File(path.into()),
            (true, path) => WeightsCacheChoice::Layered {
                layers,
                path: path.into(),
            },
        };
        let backend = xnnblob::backend::Backend::new(BackendOptions {
            workspace_sharing,
            threads: config.threads,
            packed_cache,
            ..Default::default()
        })?;
        Ok(Box::new(Backend(backend)))
    })
}

impl Backend {
    fn shared_cache(&self) -> Box<SharedCache> {
        Box::new(SharedCache(self.0.clone()))
    }

    fn model(&self, packed_cache_path: &str) -> Result<Box<Model>, Reported> {
        guarded(|| {
            let file = WeightsCacheChoice::File(packed_cache_path.into());
            let cache = (!packed_cache_path.is_empty()).then_some(&file);
            Ok(Box::new(Model(self.0.model(cache)?)))
        })
    }

    fn model_without_weights_cache(&self) -> Result<Box<Model>, Reported> {
        guarded(|| {
            Ok(Box::new(Model(
                self.0.model(Some(&WeightsCacheChoice::Disabled))?,
            )))
        })
    }
}

impl Model {
    fn weights_cache(&self) -> Result<Box<WeightsCache>, String> {
        guarded_text(|| {
            self.0
                .packed_cache()
                .map(|c| Box::new(WeightsCache(c.clone())))
                .ok_or_else(|| "this model packs without a cache".to_string())
        })
    }
}

impl SharedCache {
    fn get_or_load(&self, map: &DataMap, key: &str) -> Result<Box<Buffer>, Reported> {
        guarded(|| {
            let data = self
                .0
                .shared_data()
                .get_or_init(key, || map.0.get_data(key))?;
            Ok(Box::new(Buffer(data.buffer().clone(), Some(data))))
        })
    }

    fn stats(&self) -> SharedCacheStats {
        let s = self.0.shared_data().stats();
        SharedCacheStats {
            hits: s.hits,
            inits: s.inits,
            failures: s.failures,
            entries: s.entries,
            bytes_held: s.bytes_held,
        }
    }
}

fn open_weights_cache(path: &str) -> Result<Box<WeightsCache>, Reported> {
    guarded(|| {
        let cache = PackedWeightsCache::open(path)?;
        // Weights reach this cache as bytes, not as the files they came from: in doubt, the
        // files it creates are its owner's alone.
        cache.limit_permissions(xnnblob::cache::PRIVATE_MODE);
        Ok(Box::new(WeightsCache(cache)))
    })
}

fn in_memory_weights_cache() -> Box<WeightsCache> {
    Box::new(WeightsCache(PackedWeightsCache::in_memory()))
}

impl WeightsCache {
    fn xnn_weights_cache(&self) -> usize {
        self.0.as_xnn_weights_cache() as usize
    }

    fn finalize(&self) -> Result<(), Reported> {
        guarded(|| self.0.finalize().map_err(Reported::from))
    }

    fn wait_saved(&self) -> Result<(), Reported> {
        guarded(|| self.0.wait_saved().map_err(Reported::from))
    }

    fn stats(&self) -> WeightsCacheStats {
        let s = self.0.stats();
        WeightsCacheStats {
            hits: s.hits,
            misses: s.misses,
            packed: s.packed,
            entries: s.entries,
            packed_bytes: s.packed_bytes,
        }
    }
}

/// ExecuTorch's XNNPACK compile specs carry nothing this delegate needs; they are accepted and
/// ignored.
fn delegate_init(
    processed: &[u8],
    _compile_specs: &[CompileSpec],
    map: &DataMap,
    model: &Model,
) -> Result<Box<Delegate>, Reported> {
    guarded(|| {
        // The payload is small (constants are named data): one aligned copy owned by the delegate.
        let copy = xnnblob::aligned::AlignedBytes::copy_from(processed, 64).ok_or_else(|| {
            xnnblob::delegate::DelegateError::OutOfMemory {
                what: "a copy of the payload".into(),
                bytes: processed.len(),
            }
        })?;
        let payload = DataBuffer::new(Arc::new(copy), 0, processed.len()).expect("whole copy");
        let inner = XnnDelegate::init(&model.0, payload, &*map.0)?;
        let bound = Bindings::new(inner.inputs().len(), inner.outputs().len());
        Ok(Box::new(Delegate { inner, bound }))
    })
}

fn out_of_range(what: &str, index: usize, len: usize) -> String {
    format!("{what} {index} out of range ({len} of them)")
}

impl Delegate {
    fn num_inputs(&self) -> usize {
        self.inner.inputs().len()
    }

    fn num_outputs(&self) -> usize {
        self.inner.outputs().len()
    }

    fn input(&self, index: usize) -> Result<xnnblob::xnn::External, String> {
        guarded_text(|| {
            self.inner
                .inputs()
                .nth(index)
                .ok_or_else(|| out_of_range("input", index, self.num_inputs()))
        })
    }

    fn output(&self, index: usize) -> Result<xnnblob::xnn::External, String> {
        guarded_text(|| {
            self.inner
                .outputs()
                .nth(index)
                .ok_or_else(|| out_of_range("output", index, self.num_outputs()))
        })
    }

    fn input_shape(&self, index: usize) -> Result<Vec<usize>, String> {
        guarded_text(|| Ok(self.input(index)?.bound.dims().to_vec()))
    }

    fn input_scalar_type(&self, index: usize) -> Result<i8, String> {
        guarded_text(|| Ok(self.input(index)?.dtype.scalar_type()))
    }

    fn output_shape(&self, index: usize) -> Result<Vec<usize>, String> {
        guarded_text(|| Ok(self.output(index)?.shape.dims().to_vec()))
    }

    fn output_scalar_type(&self, index: usize) -> Result<i8, String> {
        guarded_text(|| Ok(self.output(index)?.dtype.scalar_type()))
    }

    fn output_shape_into(&self, index: usize, dims: &mut [usize]) -> Result<usize, String> {
        guarded_text(|| {
            let shape = self.output(index)?.shape;
            let to = dims
                .get_mut(..shape.rank())
                .ok_or_else(|| format!("output {index} has rank {}", shape.rank()))?;
            to.copy_from_slice(shape.dims());
            Ok(shape.rank())
        })
    }

    fn bind_input(
        &mut self,
        index: usize,
        scalar_type: i8,
        shape: &[usize],
        data: &[u8],
        has_slack: bool,
    ) -> Result<(), String> {
        guarded_text(|| {
            self.bound
                .bind_input(index, scalar_type, shape, data, has_slack)
        })
    }

    fn bind_output(
        &mut self,
        index: usize,
        scalar_type: i8,
        data: &mut [u8],
    ) -> Result<(), String> {
        guarded_text(|| self.bound.bind_output(index, scalar_type, data))
    }

    fn execute(&mut self) -> Result<(), Reported> {
        guarded(|| {
            let complete = self.bound.check_complete();
            if let Err(e) = complete {
                self.bound.clear();
                return Err(Reported(e));
            }
            let bound = &self.bound;
            let take = |b: &Option<RawInput>| *b.as_ref().expect("checked complete");
            // SAFETY: the bindings point to C++ buffers that delegate.h's `execute` binds and keeps
            // valid until this call returns (it binds and executes in one call); lengths and slack
            // are as C++ declared them.
            let result = unsafe {
                self.inner.execute_raw(
                    |i| take(&bound.inputs[i]),
                    |j| *bound.outputs[j].as_ref().expect("checked complete"),
                )
            };
            self.bound.clear();
            result.map_err(Reported::from)
        })
    }
}
