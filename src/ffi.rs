//! The cxx bridge: everything C++ sees of xnnblob. Shared plain-data structs first, then the
//! Rust side (opaque handles, every fallible call a `Result`, which C++ sees as an exception),
//! then the C++ side (a user's `NamedDataMap`, and the C++ code compiled into the crate).
//! C++ headers: `cpp/include/xnnblob/`.

use crate::cache::PackedWeightsCache;
use crate::delegate::XnnDelegate;
use crate::named_data::{Backing, DataBuffer, FileDataMap, MergedMap, NamedDataError};
use crate::shared_cache::SharedDataCache;
use crate::xnn::AsXnnWeightsCache;
use std::collections::HashMap;
use std::sync::Arc;

#[cxx::bridge(namespace = "xnnblob")]
mod bridge {
    /// A key's tensor layout; `present` is false for keys stored without one.
    struct TensorLayout {
        present: bool,
        scalar_type: i8,
        sizes: Vec<i32>,
        dim_order: Vec<u8>,
        nbytes: usize,
    }

    struct SharedCacheStats {
        hits: usize,
        inits: usize,
        failures: usize,
        entries: usize,
        bytes_held: usize,
    }

    struct WeightsCacheStats {
        hits: usize,
        misses: usize,
        packed: usize,
        entries: usize,
        packed_bytes: usize,
    }

    /// A mutable buffer of a stateful program; `initial_key` empty: zeros.
    struct StateDecl {
        name: String,
        shape: Vec<usize>,
        bank: usize,
        initial_key: String,
    }

    /// One of ExecuTorch's compile specs for a delegate.
    struct CompileSpec {
        key: String,
        value: Vec<u8>,
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
        /// An initialised XNNPACK delegate.
        type Delegate;
        /// An ExecuTorch program (`.pte` + external `.ptd` files) fully delegated to XNNPACK.
        type Program;
        /// An initialised method of a program.
        type Method;

        fn version() -> &'static str;
        fn xnnpack_build_identifier() -> String;

        fn open_data_map(path: &str) -> Result<Box<DataMap>>;
        fn data_map_from_cpp(map: SharedPtr<NamedDataMap>, name: &str) -> Result<Box<DataMap>>;
        fn merge_data_maps(first: &DataMap, second: &DataMap) -> Result<Box<DataMap>>;
        fn num_keys(self: &DataMap) -> usize;
        fn key_at(self: &DataMap, index: usize) -> Result<String>;
        fn get_data(self: &DataMap, key: &str) -> Result<Box<Buffer>>;
        fn tensor_layout(self: &DataMap, key: &str) -> Result<TensorLayout>;
        fn load_data_into(self: &DataMap, key: &str, out: &mut [u8]) -> Result<()>;

        fn data(self: &Buffer) -> &[u8];
        fn free(self: &mut Buffer);

        fn new_shared_cache() -> Box<SharedCache>;
        /// Read-only mode: the map's zero-copy buffer, loaded once per key.
        fn get_or_load(self: &SharedCache, map: &DataMap, key: &str) -> Result<Box<Buffer>>;
        fn stats(self: &SharedCache) -> SharedCacheStats;

        fn open_weights_cache(path: &str) -> Result<Box<WeightsCache>>;
        fn in_memory_weights_cache() -> Box<WeightsCache>;
        /// The `xnn_weights_cache_t` (as an address) for `xnn_create_runtime_v4`.
        fn xnn_weights_cache(self: &WeightsCache) -> usize;
        fn finalize(self: &WeightsCache) -> Result<()>;
        fn wait_saved(self: &WeightsCache) -> Result<()>;
        fn stats(self: &WeightsCache) -> WeightsCacheStats;

        fn delegate_init(
            processed: &[u8],
            compile_specs: &[CompileSpec],
            map: &DataMap,
            shared: &SharedCache,
            weights: &WeightsCache,
        ) -> Result<Box<Delegate>>;
        fn delegate_init_without_weights_cache(
            processed: &[u8],
            compile_specs: &[CompileSpec],
            map: &DataMap,
            shared: &SharedCache,
        ) -> Result<Box<Delegate>>;
        fn num_inputs(self: &Delegate) -> usize;
        fn num_outputs(self: &Delegate) -> usize;
        fn input_shape(self: &Delegate, index: usize) -> Result<Vec<usize>>;
        fn output_shape(self: &Delegate, index: usize) -> Result<Vec<usize>>;
        fn set_input(self: &mut Delegate, index: usize, data: &[f32]) -> Result<()>;
        fn execute(self: &mut Delegate) -> Result<()>;
        fn output(self: &Delegate, index: usize) -> Result<&[f32]>;

        /// Collects the declarations and methods of a stateful program.
        type StatefulBuilder;
        /// A stateful program (declarations, layout, methods).
        type Stateful;
        /// One instance of a stateful program, with its own state.
        type StatefulInstance;
        /// Collects the C++ banks of a new instance.
        type InstanceBuilder;

        fn new_stateful_builder() -> Box<StatefulBuilder>;
        fn declare(self: &mut StatefulBuilder, decl: StateDecl);
        fn add_method(self: &mut StatefulBuilder, name: &str, payload: &[u8]);
        /// Binds external `external_id` of method `method` to state `state` (read or write-back).
        fn bind(
            self: &mut StatefulBuilder,
            method: &str,
            external_id: u32,
            state: &str,
            write: bool,
        );
        fn build(self: &mut StatefulBuilder, map: &DataMap) -> Result<Box<Stateful>>;
        fn bank_sizes(self: &Stateful) -> Vec<usize>;
        /// An instance whose banks are host memory (memcpy).
        fn instantiate(self: &Stateful) -> Result<Box<StatefulInstance>>;
        /// Starts an instance whose banks are C++ banks, added in bank order.
        fn instance_builder(self: &Stateful) -> Box<InstanceBuilder>;
        fn add_bank(self: &mut InstanceBuilder, bank: UniquePtr<MemoryBank>);
        fn finish(self: &mut InstanceBuilder) -> Result<Box<StatefulInstance>>;
        fn reset(self: &mut StatefulInstance) -> Result<()>;
        /// Runs `method` on its non-state inputs (flattened fp32, in external-id order,
        /// `input_sizes` elements each); returns its non-state outputs concatenated.
        fn run(
            self: &mut StatefulInstance,
            method: &str,
            inputs: &[f32],
            input_sizes: &[usize],
        ) -> Result<Vec<f32>>;
        fn read_state(self: &mut StatefulInstance, name: &str) -> Result<Vec<f32>>;

        /// `cache_path` empty: packed weights stay in memory.
        fn load_program(pte: &str, ptds: &[String], cache_path: &str) -> Result<Box<Program>>;
        fn method_names(self: &Program) -> Vec<String>;
        fn method(self: &Program, name: &str) -> Result<Box<Method>>;
        fn num_inputs(self: &Method) -> usize;
        fn input_shape(self: &Method, index: usize) -> Result<Vec<usize>>;
        fn set_input(self: &mut Method, index: usize, data: &[f32]) -> Result<()>;
        fn execute(self: &mut Method) -> Result<()>;
        fn num_outputs(self: &Method) -> usize;
        fn output(self: &Method, index: usize) -> Result<&[f32]>;
    }

    unsafe extern "C++" {
        include!("xnnblob/named_data.h");

        /// A named-data map implemented in C++ (see named_data.h for its contract).
        type NamedDataMap;
        fn num_keys(self: &NamedDataMap) -> usize;
        fn key_at(self: &NamedDataMap, index: usize) -> Result<String>;
        fn get_data(self: &NamedDataMap, key: &str) -> Result<&[u8]>;

        include!("xnnblob/memory_bank.h");

        /// A memory bank implemented in C++ (see memory_bank.h for its contract).
        type MemoryBank;
        fn len(self: &MemoryBank) -> usize;
        fn base(self: Pin<&mut MemoryBank>) -> *mut u8;
        fn copy_in(self: Pin<&mut MemoryBank>, offset: usize, src: &[u8]);
        fn copy_out(self: Pin<&mut MemoryBank>, offset: usize, dst: &mut [u8]);
        fn begin_execute(self: Pin<&mut MemoryBank>);
        fn end_execute(self: Pin<&mut MemoryBank>);

        include!("xnnblob/xnnblob.h");

        /// One line naming xnnblob and XNNPACK, assembled in C++.
        fn describe() -> String;
        /// docs/delegate.md's example (cpp/examples/minimal_delegate.cc).
        fn run_minimal_example(ptd_path: &str, payload: &[u8], input: &[f32]) -> Result<Vec<f32>>;
        /// C++ checks of the delegate API (cpp/tests/delegate_checks.cc): returns a report.
        fn cpp_delegate_checks(ptd_path: &str, payload: &[u8], input: &[f32]) -> Result<String>;
        /// The stateful counter, from C++ with a C++ bank (cpp/tests/stateful_checks.cc).
        fn cpp_stateful_counter(
            ptd_path: &str,
            payload: &[u8],
            count_in: u32,
            count_out: u32,
        ) -> Result<String>;
        /// Runs a program's method from C++ (cpp/tests/program_run.cc).
        fn cpp_run_program(
            pte: &str,
            ptds: &Vec<String>,
            method: &str,
            input: &[f32],
        ) -> Result<Vec<f32>>;
    }
}

pub use bridge::{
    cpp_delegate_checks, cpp_run_program, cpp_stateful_counter, describe, run_minimal_example,
    CompileSpec, SharedCacheStats, StateDecl, TensorLayout, WeightsCacheStats,
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
    crate::sha256::to_hex(crate::xnn::build_identifier())
}

pub struct DataMap(Arc<dyn crate::named_data::NamedDataMap>);
/// A buffer, and the shared-cache entry it came from (held so the entry lives as long).
pub struct Buffer(DataBuffer, Option<crate::shared_cache::SharedData>);
pub struct SharedCache(Arc<SharedDataCache>);
pub struct WeightsCache(Arc<PackedWeightsCache>);
pub struct Delegate {
    inner: XnnDelegate,
    inputs: Vec<Vec<f32>>,
    outputs: Vec<Vec<f32>>,
}

fn open_data_map(path: &str) -> Result<Box<DataMap>, NamedDataError> {
    Ok(Box::new(DataMap(Arc::new(FileDataMap::open(path)?))))
}

fn merge_data_maps(first: &DataMap, second: &DataMap) -> Result<Box<DataMap>, NamedDataError> {
    let merged = MergedMap::new(vec![first.0.clone(), second.0.clone()])?;
    Ok(Box::new(DataMap(Arc::new(merged))))
}

impl DataMap {
    fn num_keys(&self) -> usize {
        self.0.num_keys()
    }

    fn key_at(&self, index: usize) -> Result<String, NamedDataError> {
        Ok(self.0.key_at(index)?.to_string())
    }

    fn get_data(&self, key: &str) -> Result<Box<Buffer>, NamedDataError> {
        Ok(Box::new(Buffer(self.0.get_data(key)?, None)))
    }

    fn tensor_layout(&self, key: &str) -> Result<TensorLayout, NamedDataError> {
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
    }

    fn load_data_into(&self, key: &str, out: &mut [u8]) -> Result<(), NamedDataError> {
        self.0.load_data_into(key, out)
    }
}

impl Buffer {
    fn data(&self) -> &[u8] {
        self.0.data()
    }

    fn free(&mut self) {
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

fn data_map_from_cpp(
    map: cxx::SharedPtr<bridge::NamedDataMap>,
    name: &str,
) -> Result<Box<DataMap>, NamedDataError> {
    let backend = |e: cxx::Exception| NamedDataError::Backend {
        source: name.to_string(),
        message: e.what().to_string(),
    };
    let m = map.as_ref().ok_or_else(|| NamedDataError::Backend {
        source: name.to_string(),
        message: "null map".into(),
    })?;
    let mut keys = Vec::new();
    let mut by_key = HashMap::new();
    for i in 0..m.num_keys() {
        let key = m.key_at(i).map_err(backend)?;
        if by_key.insert(key.clone(), i).is_some() {
            return Err(NamedDataError::DuplicateKey {
                key,
                source: name.to_string(),
            });
        }
        keys.push(key);
    }
    Ok(Box::new(DataMap(Arc::new(CppMap {
        map,
        name: name.to_string(),
        keys,
        by_key,
    }))))
}

impl crate::named_data::NamedDataMap for CppMap {
    fn get_data(&self, key: &str) -> Result<DataBuffer, NamedDataError> {
        if !self.by_key.contains_key(key) {
            return Err(NamedDataError::KeyNotFound {
                key: key.to_string(),
                source: self.name.clone(),
            });
        }
        let m = self.map.as_ref().expect("checked non-null at construction");
        let bytes = m.get_data(key).map_err(|e| NamedDataError::Backend {
            source: self.name.clone(),
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
    ) -> Result<Option<crate::named_data::TensorLayout>, NamedDataError> {
        self.by_key
            .get(key)
            .map(|_| None)
            .ok_or_else(|| NamedDataError::KeyNotFound {
                key: key.to_string(),
                source: self.name.clone(),
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
        &self.name
    }
}

fn new_shared_cache() -> Box<SharedCache> {
    Box::new(SharedCache(Arc::new(SharedDataCache::new())))
}

impl SharedCache {
    fn get_or_load(&self, map: &DataMap, key: &str) -> Result<Box<Buffer>, String> {
        let data = self
            .0
            .get_or_init(key, || map.0.get_data(key))
            .map_err(|e| e.to_string())?;
        Ok(Box::new(Buffer(data.buffer().clone(), Some(data))))
    }

    fn stats(&self) -> SharedCacheStats {
        let s = self.0.stats();
        SharedCacheStats {
            hits: s.hits,
            inits: s.inits,
            failures: s.failures,
            entries: s.entries,
            bytes_held: s.bytes_held,
        }
    }
}

fn open_weights_cache(path: &str) -> Result<Box<WeightsCache>, crate::cache::CacheError> {
    Ok(Box::new(WeightsCache(PackedWeightsCache::open(path)?)))
}

fn in_memory_weights_cache() -> Box<WeightsCache> {
    Box::new(WeightsCache(PackedWeightsCache::in_memory()))
}

impl WeightsCache {
    fn xnn_weights_cache(&self) -> usize {
        self.0.as_xnn_weights_cache() as usize
    }

    fn finalize(&self) -> Result<(), crate::cache::CacheError> {
        self.0.finalize()
    }

    fn wait_saved(&self) -> Result<(), crate::cache::CacheError> {
        self.0.wait_saved()
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

fn init(
    processed: &[u8],
    map: &DataMap,
    shared: &SharedCache,
    weights: Option<&WeightsCache>,
) -> Result<Box<Delegate>, crate::delegate::DelegateError> {
    // The payload is small (constants are named data): one aligned copy owned by the delegate.
    let copy = crate::aligned::AlignedBytes::copy_from(processed, 64)
        .ok_or_else(|| crate::delegate::DelegateError::BadGraph("out of memory".into()))?;
    let payload = DataBuffer::new(Arc::new(copy), 0, processed.len()).expect("whole copy");
    let inner = XnnDelegate::init(payload, &*map.0, &shared.0, weights.map(|w| w.0.clone()))?;
    let inputs = inner
        .input_shapes()
        .iter()
        .map(|s| vec![0.0; s.iter().product()])
        .collect();
    let outputs = inner
        .output_shapes()
        .iter()
        .map(|s| vec![0.0; s.iter().product()])
        .collect();
    Ok(Box::new(Delegate {
        inner,
        inputs,
        outputs,
    }))
}

/// ExecuTorch's XNNPACK compile specs carry nothing this delegate needs; they are accepted and
/// ignored.
fn delegate_init(
    processed: &[u8],
    _compile_specs: &[CompileSpec],
    map: &DataMap,
    shared: &SharedCache,
    weights: &WeightsCache,
) -> Result<Box<Delegate>, crate::delegate::DelegateError> {
    init(processed, map, shared, Some(weights))
}

fn delegate_init_without_weights_cache(
    processed: &[u8],
    _compile_specs: &[CompileSpec],
    map: &DataMap,
    shared: &SharedCache,
) -> Result<Box<Delegate>, crate::delegate::DelegateError> {
    init(processed, map, shared, None)
}

fn out_of_range(what: &str, index: usize, len: usize) -> String {
    format!("{what} {index} out of range ({len} of them)")
}

/// Copies `data` into the staged input `index` (C++ hands inputs over one at a time).
fn stage_input(inputs: &mut [Vec<f32>], index: usize, data: &[f32]) -> Result<(), String> {
    let n = inputs.len();
    let slot = inputs
        .get_mut(index)
        .ok_or_else(|| out_of_range("input", index, n))?;
    if slot.len() != data.len() {
        return Err(format!(
            "input {index} holds {} elements, {} given",
            slot.len(),
            data.len()
        ));
    }
    slot.copy_from_slice(data);
    Ok(())
}

/// Output `index` of the last execution.
fn read_output(outputs: &[Vec<f32>], index: usize) -> Result<&[f32], String> {
    outputs
        .get(index)
        .map(Vec::as_slice)
        .ok_or_else(|| out_of_range("output", index, outputs.len()))
}

impl Delegate {
    fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    fn input_shape(&self, index: usize) -> Result<Vec<usize>, String> {
        self.inner
            .input_shapes()
            .get(index)
            .cloned()
            .ok_or_else(|| out_of_range("input", index, self.inputs.len()))
    }

    fn output_shape(&self, index: usize) -> Result<Vec<usize>, String> {
        self.inner
            .output_shapes()
            .get(index)
            .cloned()
            .ok_or_else(|| out_of_range("output", index, self.outputs.len()))
    }

    fn set_input(&mut self, index: usize, data: &[f32]) -> Result<(), String> {
        stage_input(&mut self.inputs, index, data)
    }

    fn execute(&mut self) -> Result<(), crate::delegate::DelegateError> {
        let inputs: Vec<&[f32]> = self.inputs.iter().map(Vec::as_slice).collect();
        let mut outputs: Vec<&mut [f32]> = self.outputs.iter_mut().map(Vec::as_mut_slice).collect();
        self.inner.execute(&inputs, &mut outputs)
    }

    fn output(&self, index: usize) -> Result<&[f32], String> {
        read_output(&self.outputs, index)
    }
}

pub struct Program(crate::program::Program);
pub struct Method {
    inner: crate::program::Method,
    inputs: Vec<Vec<f32>>,
    outputs: Vec<Vec<f32>>,
}

fn load_program(
    pte: &str,
    ptds: &[String],
    cache_path: &str,
) -> Result<Box<Program>, crate::program::ProgramError> {
    let cache = (!cache_path.is_empty()).then(|| std::path::Path::new(cache_path));
    Ok(Box::new(Program(crate::program::Program::load(
        pte, ptds, cache,
    )?)))
}

impl Program {
    fn method_names(&self) -> Vec<String> {
        self.0
            .method_names()
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn method(&self, name: &str) -> Result<Box<Method>, crate::program::ProgramError> {
        let inner = self.0.method(name)?;
        let inputs = inner
            .input_shapes()
            .iter()
            .map(|s| vec![0.0; s.iter().product()])
            .collect();
        Ok(Box::new(Method {
            inner,
            inputs,
            outputs: Vec::new(),
        }))
    }
}

impl Method {
    fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    fn input_shape(&self, index: usize) -> Result<Vec<usize>, String> {
        self.inner
            .input_shapes()
            .get(index)
            .cloned()
            .ok_or_else(|| out_of_range("input", index, self.inputs.len()))
    }

    fn set_input(&mut self, index: usize, data: &[f32]) -> Result<(), String> {
        stage_input(&mut self.inputs, index, data)
    }

    fn execute(&mut self) -> Result<(), crate::program::ProgramError> {
        let inputs: Vec<&[f32]> = self.inputs.iter().map(Vec::as_slice).collect();
        self.outputs = self.inner.execute(&inputs)?;
        Ok(())
    }

    fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    fn output(&self, index: usize) -> Result<&[f32], String> {
        read_output(&self.outputs, index)
    }
}

// SAFETY: memory_bank.h requires C++ banks to be usable from the thread that runs the instance.
unsafe impl Send for bridge::MemoryBank {}

/// A C++ bank as a Rust one.
struct CppBank(cxx::UniquePtr<bridge::MemoryBank>);

// SAFETY: memory_bank.h's contract is MemoryBank's: `base` points to `len` bytes, 64-aligned,
// valid and fixed while the bank lives.
unsafe impl crate::state::MemoryBank for CppBank {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.len())
    }
    fn base(&mut self) -> std::ptr::NonNull<u8> {
        let ptr = self.0.as_mut().map_or(std::ptr::null_mut(), |b| b.base());
        // A null base (no bank) never reaches XNNPACK: instantiation checks the length first.
        std::ptr::NonNull::new(ptr).unwrap_or(std::ptr::NonNull::dangling())
    }
    fn copy_in(&mut self, offset: usize, src: &[u8]) {
        if let Some(b) = self.0.as_mut() {
            b.copy_in(offset, src);
        }
    }
    fn copy_out(&mut self, offset: usize, dst: &mut [u8]) {
        if let Some(b) = self.0.as_mut() {
            b.copy_out(offset, dst);
        }
    }
    fn begin_execute(&mut self) {
        if let Some(b) = self.0.as_mut() {
            b.begin_execute();
        }
    }
    fn end_execute(&mut self) {
        if let Some(b) = self.0.as_mut() {
            b.end_execute();
        }
    }
}

#[derive(Default)]
pub struct StatefulBuilder {
    specs: Vec<crate::state::StateSpec>,
    methods: Vec<crate::state::StatefulMethod>,
}

pub struct Stateful(Arc<crate::state::StatefulProgram>);
pub struct StatefulInstance(crate::state::Instance);

fn new_stateful_builder() -> Box<StatefulBuilder> {
    Box::default()
}

impl StatefulBuilder {
    fn declare(&mut self, decl: StateDecl) {
        self.specs.push(crate::state::StateSpec {
            name: decl.name,
            shape: decl.shape,
            bank: decl.bank,
            initial: if decl.initial_key.is_empty() {
                crate::state::InitialState::Zeros
            } else {
                crate::state::InitialState::Named(decl.initial_key)
            },
        });
    }

    fn add_method(&mut self, name: &str, payload: &[u8]) {
        let copy = crate::aligned::AlignedBytes::copy_from(payload, 64).expect("allocation");
        let payload = DataBuffer::new(Arc::new(copy), 0, payload.len()).expect("whole copy");
        self.methods.push(crate::state::StatefulMethod {
            name: name.to_string(),
            payload,
            reads: Vec::new(),
            writes: Vec::new(),
        });
    }

    fn bind(&mut self, method: &str, external_id: u32, state: &str, write: bool) {
        if let Some(m) = self.methods.iter_mut().find(|m| m.name == method) {
            let list = if write { &mut m.writes } else { &mut m.reads };
            list.push((external_id, state.to_string()));
        }
    }

    fn build(&mut self, map: &DataMap) -> Result<Box<Stateful>, crate::state::StateError> {
        let program = crate::state::StatefulProgram::new(
            std::mem::take(&mut self.specs),
            std::mem::take(&mut self.methods),
            map.0.clone(),
        )?;
        Ok(Box::new(Stateful(Arc::new(program))))
    }
}

impl Stateful {
    fn bank_sizes(&self) -> Vec<usize> {
        self.0.layout().bank_sizes.clone()
    }

    fn instantiate(&self) -> Result<Box<StatefulInstance>, crate::state::StateError> {
        Ok(Box::new(StatefulInstance(self.0.instantiate()?)))
    }

    fn instance_builder(&self) -> Box<InstanceBuilder> {
        Box::new(InstanceBuilder {
            program: self.0.clone(),
            banks: Vec::new(),
        })
    }
}

pub struct InstanceBuilder {
    program: Arc<crate::state::StatefulProgram>,
    banks: Vec<Box<dyn crate::state::MemoryBank>>,
}

impl InstanceBuilder {
    fn add_bank(&mut self, bank: cxx::UniquePtr<bridge::MemoryBank>) {
        self.banks.push(Box::new(CppBank(bank)));
    }

    fn finish(&mut self) -> Result<Box<StatefulInstance>, crate::state::StateError> {
        let banks = std::mem::take(&mut self.banks);
        Ok(Box::new(StatefulInstance(
            self.program.instantiate_in(banks)?,
        )))
    }
}

impl StatefulInstance {
    fn reset(&mut self) -> Result<(), crate::state::StateError> {
        self.0.reset()
    }

    fn run(
        &mut self,
        method: &str,
        inputs: &[f32],
        input_sizes: &[usize],
    ) -> Result<Vec<f32>, crate::state::StateError> {
        let mut parts = Vec::new();
        let mut at = 0;
        for &n in input_sizes {
            let part = inputs.get(at..at + n).ok_or_else(|| {
                crate::state::StateError::Invalid(format!(
                    "input sizes {input_sizes:?} exceed the {} values given",
                    inputs.len()
                ))
            })?;
            parts.push(part);
            at += n;
        }
        Ok(self.0.execute(method, &parts)?.concat())
    }

    fn read_state(&mut self, name: &str) -> Result<Vec<f32>, crate::state::StateError> {
        self.0.read_state(name)
    }
}
