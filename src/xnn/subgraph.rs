//! An owned XNNPACK subgraph: values and nodes, before a runtime is made of it.
//!
//! Every `define_*` method is a thin wrapper over the `xnn_define_*` call of the same name: it
//! checks what XNNPACK would otherwise read out of bounds or trust blindly (static data and
//! scale lengths, alignment, value ranks), and leaves the rest of the validation to XNNPACK,
//! whose refusals come back as [`XnnError::Call`]. Where the wrapper itself refuses a call that
//! XNNPACK would mishandle, it answers as XNNPACK does for invalid arguments:
//! `XnnError::Call { call, status: Status::InvalidParameter }`.

use super::datatype::Datatype;
use super::error::{Status, XnnError, check};
use std::marker::PhantomData;
use std::ptr::NonNull;
use xnnpack_sys as sys;

/// How a tensor value takes part in the graph.
#[derive(Debug, Clone, Copy)]
pub enum ValueRole<'data> {
    /// Produced and consumed inside the graph.
    Internal,
    /// Constant data (weights), borrowed for as long as the subgraph and its runtimes live: the
    /// tensor's elements in native byte order, exactly [`Datatype::tensor_bytes`] long and
    /// aligned to the element size. The `static_*` constructors make it from typed slices.
    ///
    /// XNNPACK's contract (`XNN_EXTRA_BYTES` in xnnpack.h) lets it read, never write, up to
    /// that many bytes past the end of any tensor data, static data included (some packing and
    /// elementwise kernels do); borrow static data from buffers that have them.
    Static(&'data [u8]),
    /// Constant data behind a placeholder: XNNPACK gets its address, and its bytes are read in
    /// only if a packed-weight look-up misses (see [`crate::deferred`]). Only for operands
    /// XNNPACK reads solely to pack them (or ones pinned readable before runtime creation).
    Deferred(&'data crate::deferred::DeferredData),
    /// Fed by the caller under this external id.
    Input(u32),
    /// Read by the caller under this external id.
    Output(u32),
}

impl<'data> ValueRole<'data> {
    /// Static fp32 data.
    pub fn static_f32(data: &'data [f32]) -> ValueRole<'data> {
        ValueRole::Static(as_bytes(data))
    }

    /// Static 16-bit data: fp16 or bf16 bit patterns.
    pub fn static_u16(data: &'data [u16]) -> ValueRole<'data> {
        ValueRole::Static(as_bytes(data))
    }

    /// Static signed 8-bit data (qint8, qcint8).
    pub fn static_i8(data: &'data [i8]) -> ValueRole<'data> {
        ValueRole::Static(as_bytes(data))
    }

    /// Static 32-bit integer data (int32, qint32, qcint32).
    pub fn static_i32(data: &'data [i32]) -> ValueRole<'data> {
        ValueRole::Static(as_bytes(data))
    }
}

/// The bytes of a slice of plain numbers.
fn as_bytes<T: Number>(data: &[T]) -> &[u8] {
    // SAFETY: `Number` types have no padding and every byte of them is initialised; u8 has
    // alignment 1; the length is the slice's size in bytes and the lifetime is the slice's.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// Primitive numbers: no padding, no invalid bit patterns.
trait Number: Copy {}
impl Number for f32 {}
impl Number for u16 {}
impl Number for i8 {}
impl Number for i32 {}

/// Per-channel quantization of a tensor (`xnn_define_channelwise_quantized_tensor_value_v2`):
/// element `q` of channel `c` stands for `(q - zero_point) * scales[c]`.
#[derive(Debug, Clone, Copy)]
pub struct ChannelwiseQuantization<'data> {
    /// Subtracted from every element; 0 for the 8- and 32-bit types, 0 (signed nibbles) or 8
    /// (unsigned nibbles) for qcint4 in a fully connected filter.
    pub zero_point: i32,
    /// One positive, normal scale per index of `channel_dim`; XNNPACK keeps the pointer, so it
    /// is borrowed like static data.
    pub scales: &'data [f32],
    /// The dimension the scales run along: the output channels, i.e. 0 for convolution and
    /// fully connected filters (1 with transposed fully connected weights), the last one for
    /// depthwise convolution filters.
    pub channel_dim: usize,
}

/// Blockwise quantization of a 2-D `[output_channels, input_channels]` filter
/// (`xnn_define_blockwise_quantized_tensor_value`): each run of `block_size` input channels of
/// each output channel has its own bf16 scale.
#[derive(Debug, Clone, Copy)]
pub struct BlockwiseQuantization<'data> {
    /// 0 (signed nibbles) or 8 (unsigned nibbles) for a fully connected filter.
    pub zero_point: i32,
    /// bf16 bit patterns, `dims[0] * dims[1] / block_size` of them, blocks of an output channel
    /// adjacent; XNNPACK keeps the pointer, so it is borrowed like static data.
    pub scales: BlockwiseScales<'data>,
    /// The output-channel dimension: 0.
    pub channel_dim: usize,
    /// Input channels per block: non-zero, dividing the input channels; fully connected
    /// operators need at least `XNN_MIN_BLOCKSIZE`.
    pub block_size: usize,
}

/// Where a blockwise filter's scales are.
#[derive(Debug, Clone, Copy)]
pub enum BlockwiseScales<'data> {
    /// In memory.
    InMemory(&'data [u16]),
    /// Behind a placeholder of their byte length, read in only when the filter is packed:
    /// XNNPACK (with patch 0007) reads a blockwise filter's scales only to pack it, on a
    /// weights-cache miss, when the packed-weight cache fills the placeholder (see
    /// [`PackedWeightsCache::read_with`](crate::cache::PackedWeightsCache::read_with)).
    Deferred(&'data crate::deferred::DeferredData),
}

impl BlockwiseScales<'_> {
    /// How many scales.
    fn len(&self) -> usize {
        match self {
            BlockwiseScales::InMemory(s) => s.len(),
            BlockwiseScales::Deferred(d) => d.len() / 2,
        }
    }

    /// The first scale's address, for XNNPACK.
    fn as_ptr(&self) -> *const u16 {
        match self {
            BlockwiseScales::InMemory(s) => s.as_ptr(),
            BlockwiseScales::Deferred(d) => d.address().cast(),
        }
    }
}

/// What the wrapper remembers of a value it defined.
#[derive(Debug, Clone)]
struct ValueInfo {
    datatype: Datatype,
    /// Inline: a subgraph records one per value it defines, and a warm launch defines them all.
    shape: crate::tensor::Shape,
    /// Internal or an external output: a node may write it.
    writable: bool,
}

/// A call the wrapper refuses to make, reported as XNNPACK reports invalid arguments.
pub(super) fn refuse(call: &'static str) -> XnnError {
    XnnError::Call {
        call,
        status: Status::InvalidParameter,
    }
}

/// The element count a filter or bias must have: the product of `parts`; None on overflow.
pub(super) fn elements(parts: &[usize]) -> Option<usize> {
    parts.iter().try_fold(1usize, |n, &p| n.checked_mul(p))
}

/// An external input or output as the subgraph declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExternalDecl {
    /// The external value id (below the count given to [`Subgraph::new`]) a buffer is bound to.
    pub id: u32,
    /// The XNNPACK element type of the value.
    pub datatype: Datatype,
    /// The declared shape: the largest a runtime accepts, dimension by dimension.
    pub shape: crate::tensor::Shape,
    /// XNNPACK reads this input under another shape of the same elements (see
    /// [`Subgraph::define_reshaped_input`]): every run binds exactly `shape`'s elements.
    pub reshaped: bool,
}

/// What this handle knows of each value it defined, by XNNPACK's value id: ids are dense
/// (external ids first, then each internal value in turn), so a table, not a map (a value of a
/// graph of a few hundred was a hash insert and some rehashes per launch).
#[derive(Default)]
struct ValueTable(Vec<Option<ValueInfo>>);

impl ValueTable {
    fn get(&self, id: &u32) -> Option<&ValueInfo> {
        self.0.get(*id as usize).and_then(Option::as_ref)
    }

    fn insert(&mut self, id: u32, info: ValueInfo) {
        let at = id as usize;
        if at >= self.0.len() {
            self.0.resize(at + 1, None);
        }
        self.0[at] = Some(info);
    }
}

/// An XNNPACK subgraph. `'data` is the lifetime of the static data (and quantization scales) its
/// values point to; the runtimes made from it borrow that data too.
pub struct Subgraph<'data> {
    raw: NonNull<sys::xnn_subgraph>,
    pub(super) inputs: Vec<ExternalDecl>,
    pub(super) outputs: Vec<ExternalDecl>,
    values: ValueTable,
    _data: PhantomData<&'data [u8]>,
}

// SAFETY: a subgraph is plain data owned by this handle; XNNPACK keeps no thread affinity.
unsafe impl Send for Subgraph<'_> {}

impl<'data> Subgraph<'data> {
    /// A subgraph that reserves external ids `0..external_value_ids`.
    pub fn new(external_value_ids: u32) -> Result<Subgraph<'data>, XnnError> {
        super::initialize()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("xnn_create_subgraph", unsafe {
            sys::xnn_create_subgraph(external_value_ids, 0, &mut raw)
        })?;
        let raw = NonNull::new(raw).ok_or(XnnError::Call {
            call: "xnn_create_subgraph",
            status: super::Status::OutOfMemory,
        })?;
        Ok(Subgraph {
            raw,
            inputs: Vec::new(),
            outputs: Vec::new(),
            values: ValueTable::default(),
            _data: PhantomData,
        })
    }

    /// Makes room for `values` values (external ones included) and `nodes` nodes, so that
    /// defining them grows no table: XNNPACK grows its arrays by copying them (a 200-value graph
    /// four times), each growth into fresh pages. More than that still fits, by growing.
    pub fn reserve(&mut self, values: usize, nodes: usize) -> Result<(), XnnError> {
        // SAFETY: `self.raw` is a live subgraph this value owns.
        check("xnn_reserve_subgraph", unsafe {
            sys::xnn_reserve_subgraph(self.raw.as_ptr(), values, nodes)
        })?;
        // Only room: where it cannot be had, the table grows as values are defined.
        let _ = self
            .values
            .0
            .try_reserve(values.saturating_sub(self.values.0.len()));
        Ok(())
    }

    pub(super) fn as_raw(&self) -> sys::xnn_subgraph_t {
        self.raw.as_ptr()
    }

    /// Defines an fp32 tensor and returns its value id.
    pub fn define_f32_tensor(
        &mut self,
        dims: &[usize],
        role: ValueRole<'data>,
    ) -> Result<u32, XnnError> {
        self.define_tensor(Datatype::Fp32, dims, role)
    }

    /// Defines an unquantized tensor (fp32, fp16, bf16 or int32; XNNPACK refuses the others
    /// here) and returns its value id.
    ///
    /// [`Runtime::invoke`](super::Runtime::invoke) binds f32 buffers, so external inputs and
    /// outputs read by it should be fp32; convert inside the graph. Tensors of this and every
    /// other kind have at least one dimension and at most `isize::MAX` bytes: the wrapper
    /// refuses scalars and larger ones.
    pub fn define_tensor(
        &mut self,
        datatype: Datatype,
        dims: &[usize],
        role: ValueRole<'data>,
    ) -> Result<u32, XnnError> {
        const CALL: &str = "xnn_define_tensor_value";
        self.fresh_external(CALL, role)?;
        let (data, external_id, flags) = role_parts(CALL, datatype, dims, role)?;
        let mut id = sys::XNN_INVALID_VALUE_ID;
        // SAFETY: `dims` is read during the call only; `data` is null or holds the tensor's
        // bytes (checked above), borrowed for 'data, which outlives the subgraph and every
        // runtime made from it.
        check(CALL, unsafe {
            sys::xnn_define_tensor_value(
                self.as_raw(),
                datatype.to_raw(),
                dims.len(),
                dims.as_ptr(),
                data,
                external_id,
                flags,
                &mut id,
            )
        })?;
        self.defined(id, datatype, dims, role);
        Ok(id)
    }

    /// Defines an unquantized external input that the caller binds as `caller_dims` and the
    /// graph reads as `dims`, the same elements in the same order: a static reshape of the
    /// input, done by binding it rather than by copying it every run. Every run must bind
    /// exactly `caller_dims`' elements (a caller shape of another rank with that many elements
    /// is accepted, as for other inputs); the runtime never reshapes the input.
    pub fn define_reshaped_input(
        &mut self,
        datatype: Datatype,
        dims: &[usize],
        caller_dims: &[usize],
        external_id: u32,
    ) -> Result<u32, XnnError> {
        const CALL: &str = "xnn_define_tensor_value";
        let caller_shape = crate::tensor::Shape::new(caller_dims).map_err(|_| refuse(CALL))?;
        if caller_dims.is_empty()
            || caller_shape
                .numel()
                .is_none_or(|n| Some(n) != elements(dims))
        {
            return Err(refuse(CALL));
        }
        let id = self.define_tensor(datatype, dims, ValueRole::Input(external_id))?;
        let declared = self.inputs.last_mut().expect("just defined as an input");
        declared.shape = caller_shape;
        declared.reshaped = true;
        Ok(id)
    }

    /// Defines a tensor quantized per tensor (qint8, quint8, qint32): element `q` stands for
    /// `(q - zero_point) * scale`. XNNPACK checks the zero point's range and that the scale is
    /// positive and normal.
    pub fn define_quantized_tensor(
        &mut self,
        datatype: Datatype,
        dims: &[usize],
        zero_point: i32,
        scale: f32,
        role: ValueRole<'data>,
    ) -> Result<u32, XnnError> {
        const CALL: &str = "xnn_define_quantized_tensor_value";
        self.fresh_external(CALL, role)?;
        let (data, external_id, flags) = role_parts(CALL, datatype, dims, role)?;
        let mut id = sys::XNN_INVALID_VALUE_ID;
        // SAFETY: as in `define_tensor`.
        check(CALL, unsafe {
            sys::xnn_define_quantized_tensor_value(
                self.as_raw(),
                datatype.to_raw(),
                zero_point,
                scale,
                dims.len(),
                dims.as_ptr(),
                data,
                external_id,
                flags,
                &mut id,
            )
        })?;
        self.defined(id, datatype, dims, role);
        Ok(id)
    }

    /// Defines a tensor quantized per channel (qcint8, qcint32, qcint4). The scales must number
    /// `dims[quantization.channel_dim]`, else [`XnnError::QuantizationScales`].
    pub fn define_channelwise_quantized_tensor(
        &mut self,
        datatype: Datatype,
        dims: &[usize],
        quantization: ChannelwiseQuantization<'data>,
        role: ValueRole<'data>,
    ) -> Result<u32, XnnError> {
        const CALL: &str = "xnn_define_channelwise_quantized_tensor_value_v2";
        let Some(&channels) = dims.get(quantization.channel_dim) else {
            return Err(refuse(CALL));
        };
        if quantization.scales.len() != channels {
            return Err(XnnError::QuantizationScales {
                expected: channels,
                given: quantization.scales.len(),
            });
        }
        self.fresh_external(CALL, role)?;
        let (data, external_id, flags) = role_parts(CALL, datatype, dims, role)?;
        let mut id = sys::XNN_INVALID_VALUE_ID;
        // SAFETY: as in `define_tensor`; XNNPACK reads `dims[channel_dim]` scales, which is how
        // many the slice holds (checked above), and keeps the pointer, borrowed for 'data.
        check(CALL, unsafe {
            sys::xnn_define_channelwise_quantized_tensor_value_v2(
                self.as_raw(),
                datatype.to_raw(),
                quantization.zero_point,
                quantization.scales.as_ptr(),
                dims.len(),
                quantization.channel_dim,
                dims.as_ptr(),
                data,
                external_id,
                flags,
                &mut id,
            )
        })?;
        self.defined(id, datatype, dims, role);
        Ok(id)
    }

    /// Defines a blockwise quantized 2-D filter (qbint4). The wrapper refuses other ranks and a
    /// zero block size (XNNPACK reads `dims[1]` and divides by the block size before checking
    /// either), and scales that do not number `dims[0] * dims[1] / block_size`
    /// ([`XnnError::QuantizationScales`]).
    pub fn define_blockwise_quantized_tensor(
        &mut self,
        datatype: Datatype,
        dims: &[usize],
        quantization: BlockwiseQuantization<'data>,
        role: ValueRole<'data>,
    ) -> Result<u32, XnnError> {
        const CALL: &str = "xnn_define_blockwise_quantized_tensor_value";
        if dims.len() != 2 || quantization.block_size == 0 || quantization.channel_dim >= 2 {
            return Err(refuse(CALL));
        }
        let blocks =
            dims[0].checked_mul(dims[1]).ok_or_else(|| refuse(CALL))? / quantization.block_size;
        let whole = match quantization.scales {
            BlockwiseScales::Deferred(d) => d.len() % 2 == 0,
            BlockwiseScales::InMemory(_) => true,
        };
        if quantization.scales.len() != blocks || !whole {
            return Err(XnnError::QuantizationScales {
                expected: blocks,
                given: quantization.scales.len(),
            });
        }
        self.fresh_external(CALL, role)?;
        let (data, external_id, flags) = role_parts(CALL, datatype, dims, role)?;
        let mut id = sys::XNN_INVALID_VALUE_ID;
        // SAFETY: as in `define_tensor`; `dims` has the two entries XNNPACK reads, the block
        // size is non-zero, and XNNPACK reads `dims[0] * dims[1] / block_size` scales, which is
        // how many the slice or placeholder holds (checked above; a placeholder is readable
        // whenever XNNPACK packs the filter, the one time it reads them); it keeps the pointer,
        // borrowed for 'data.
        check(CALL, unsafe {
            sys::xnn_define_blockwise_quantized_tensor_value(
                self.as_raw(),
                datatype.to_raw(),
                quantization.zero_point,
                quantization.scales.as_ptr(),
                dims.len(),
                quantization.channel_dim,
                quantization.block_size,
                dims.as_ptr(),
                data,
                external_id,
                flags,
                &mut id,
            )
        })?;
        self.defined(id, datatype, dims, role);
        Ok(id)
    }

    /// Defines an internal tensor quantized at run time (qdint8), e.g. the output of
    /// [`define_convert`](Self::define_convert) from fp32 feeding a fully connected node with
    /// quantized weights. The leading `dims.len() - num_non_batch_dims` dimensions are batch
    /// dimensions, each batch row getting its own zero point and scale. XNNPACK allows such
    /// tensors neither as external values nor with static data.
    pub fn define_dynamically_quantized_tensor(
        &mut self,
        datatype: Datatype,
        dims: &[usize],
        num_non_batch_dims: usize,
    ) -> Result<u32, XnnError> {
        const CALL: &str = "xnn_define_dynamically_quantized_tensor_value";
        // No scalars, as in `role_parts`.
        if dims.is_empty() {
            return Err(refuse(CALL));
        }
        check_size(CALL, datatype, dims)?;
        let mut id = sys::XNN_INVALID_VALUE_ID;
        // SAFETY: `dims` is read during the call only; `id` is a valid out-pointer.
        check(CALL, unsafe {
            sys::xnn_define_dynamically_quantized_tensor_value(
                self.as_raw(),
                datatype.to_raw(),
                dims.len(),
                num_non_batch_dims,
                dims.as_ptr(),
                sys::XNN_INVALID_VALUE_ID,
                0,
                &mut id,
            )
        })?;
        self.defined(id, datatype, dims, ValueRole::Internal);
        Ok(id)
    }

    /// Records a value just defined, and the external ones for the runtime.
    fn defined(&mut self, id: u32, datatype: Datatype, dims: &[usize], role: ValueRole<'data>) {
        // XNNPACK has refused more than XNN_MAX_TENSOR_DIMS dimensions by now.
        let shape = crate::tensor::Shape::new(dims).unwrap_or_default();
        match role {
            ValueRole::Input(id) => self.inputs.push(ExternalDecl {
                id,
                datatype,
                shape,
                reshaped: false,
            }),
            ValueRole::Output(id) => self.outputs.push(ExternalDecl {
                id,
                datatype,
                shape,
                reshaped: false,
            }),
            _ => {}
        }
        let writable = matches!(role, ValueRole::Internal | ValueRole::Output(_));
        self.values.insert(
            id,
            ValueInfo {
                datatype,
                shape,
                writable,
            },
        );
    }

    /// Refuses an external id already defined here: XNNPACK keeps an external value in the slot
    /// of its id, so a second definition replaces the first without a word, and an input and an
    /// output sharing an id are one value bound to two buffers (found by fuzzing).
    fn fresh_external(&self, call: &'static str, role: ValueRole<'_>) -> Result<(), XnnError> {
        let id = match role {
            ValueRole::Input(id) | ValueRole::Output(id) => id,
            _ => return Ok(()),
        };
        if self.inputs.iter().chain(&self.outputs).any(|e| e.id == id) {
            return Err(refuse(call));
        }
        Ok(())
    }

    /// Refuses `output` as what a node writes unless it is an internal value or an external
    /// output of this subgraph. XNNPACK writes a node's output wherever the value lives,
    /// unchecked: an input's buffer is the caller's (found by fuzzing: a concatenation whose
    /// output id went missing wrote 32 floats into an 8-float input), a constant's the model's.
    pub(super) fn writable(&self, output: u32, call: &'static str) -> Result<(), XnnError> {
        match self.values.get(&output) {
            Some(v) if v.writable => Ok(()),
            _ => Err(refuse(call)),
        }
    }

    /// The datatype value `id` was defined with here, if it was.
    pub fn datatype(&self, id: u32) -> Option<Datatype> {
        self.values.get(&id).map(|v| v.datatype)
    }

    /// The dimensions value `id` was defined with here, if it was.
    pub(super) fn dims(&self, id: u32) -> Option<&[usize]> {
        self.values.get(&id).map(|v| v.shape.dims())
    }

    /// Whether value `id` was defined here with exactly `count` elements (None: the count the
    /// caller's parameters imply overflowed, which no value holds).
    pub(super) fn holds(&self, id: u32, count: Option<usize>) -> bool {
        let held = self.values.get(&id).and_then(|v| elements(v.shape.dims()));
        held.is_some() && held == count
    }

    /// Defines a global average pooling over the second- and third-innermost dimensions (H and
    /// W of an NHWC tensor), clamped to [output_min, output_max]: the output is [N, C], or
    /// [N, 1, 1, C] with `keep_dims`. The input must be a value of this subgraph with at least
    /// three dimensions: XNNPACK reads it unchecked. (This header marks
    /// `xnn_define_global_average_pooling_2d` deprecated in favour of `xnn_define_static_reduce`,
    /// which cannot clamp; the deprecated call is a mean reduction plus an optional clamp node.)
    pub fn define_global_average_pooling_2d(
        &mut self,
        input: u32,
        output: u32,
        output_min: f32,
        output_max: f32,
        keep_dims: bool,
    ) -> Result<(), XnnError> {
        const CALL: &str = "xnn_define_global_average_pooling_2d";
        if self
            .values
            .get(&input)
            .is_none_or(|v| v.shape.dims().len() < 3)
        {
            return Err(refuse(CALL));
        }
        let flags = if keep_dims {
            sys::XNN_FLAG_KEEP_DIMS
        } else {
            0
        };
        self.writable(output, CALL)?;
        // SAFETY: `input` is a tensor of this subgraph with at least three dimensions (checked
        // above), which is all XNNPACK reads before validating the rest.
        check(CALL, unsafe {
            sys::xnn_define_global_average_pooling_2d(
                self.as_raw(),
                output_min,
                output_max,
                input,
                output,
                flags,
            )
        })
    }

    /// Defines an elementwise conversion between datatypes of the same shape, e.g. fp32 to a
    /// dynamically quantized qdint8 tensor (`xnn_define_unary` with `xnn_unary_convert`;
    /// `xnn_define_convert` is deprecated in this header).
    pub fn define_convert(&mut self, input: u32, output: u32) -> Result<(), XnnError> {
        self.convert_with_flags(input, output, 0)
    }

    /// [`define_convert`](Self::define_convert) from fp32 to qdint8 for fully connected nodes
    /// with 4-bit blockwise (qbint4) weights only: where XNNPACK has qp8 GEMMs for such weights
    /// (KleidiAI's, on aarch64 with i8mm or the dot product), `output` becomes qpint8, quantized
    /// and laid out in the blocks those kernels read; elsewhere this is `define_convert`. The
    /// flag is XNNPACK's `XNN_FLAG_MAYBE_PACK_FOR_QB4W_GEMM` (src/xnnpack/internal.h, not in
    /// xnnpack.h), which ExecuTorch's backend sets the same way. Every reader of `output` must be
    /// such a node: XNNPACK's other GEMMs do not read qpint8.
    pub fn define_convert_for_qb4w_gemm(
        &mut self,
        input: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        const XNN_FLAG_MAYBE_PACK_FOR_QB4W_GEMM: u32 = 0x100;
        self.convert_with_flags(input, output, XNN_FLAG_MAYBE_PACK_FOR_QB4W_GEMM)
    }

    fn convert_with_flags(&mut self, input: u32, output: u32, flags: u32) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_unary")?;
        // SAFETY: convert takes no parameters, so null is allowed; XNNPACK validates the ids and
        // ignores flags it does not know.
        check("xnn_define_unary", unsafe {
            sys::xnn_define_unary(
                self.as_raw(),
                sys::xnn_unary_convert,
                std::ptr::null(),
                input,
                output,
                flags,
            )
        })
    }

    /// Defines `output = clamp(input, min, max)` elementwise (`xnn_define_unary` with
    /// `xnn_unary_clamp`).
    pub fn define_clamp(
        &mut self,
        input: u32,
        output: u32,
        min: f32,
        max: f32,
    ) -> Result<(), XnnError> {
        let params = sys::xnn_unary_params {
            clamp: sys::xnn_unary_params__bindgen_ty_1 { min, max },
        };
        self.writable(output, "xnn_define_unary")?;
        // SAFETY: `params` is a clamp parameter block that lives through the call (XNNPACK
        // copies it); XNNPACK validates the ids.
        check("xnn_define_unary", unsafe {
            sys::xnn_define_unary(
                self.as_raw(),
                sys::xnn_unary_clamp,
                &params,
                input,
                output,
                0,
            )
        })
    }

    /// Defines `output = input1 + input2` elementwise, with numpy-style broadcasting.
    pub fn define_add(&mut self, input1: u32, input2: u32, output: u32) -> Result<(), XnnError> {
        self.define_binary(sys::xnn_binary_add, input1, input2, output)
    }

    /// Defines `output = input1 * input2` elementwise, with numpy-style broadcasting.
    pub fn define_multiply(
        &mut self,
        input1: u32,
        input2: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        self.define_binary(sys::xnn_binary_multiply, input1, input2, output)
    }

    fn define_binary(
        &mut self,
        op: sys::xnn_binary_operator,
        input1: u32,
        input2: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_binary")?;
        // SAFETY: the parameters are optional (null: no clamping); XNNPACK validates the ids.
        check("xnn_define_binary", unsafe {
            sys::xnn_define_binary(
                self.as_raw(),
                op,
                std::ptr::null(),
                input1,
                input2,
                output,
                0,
            )
        })
    }

    /// Defines `output = input1 @ input2` over the last two dimensions, batched over the others
    /// (`transpose_b`: `input2`'s last two dimensions are [N, K]).
    pub fn define_batch_matrix_multiply(
        &mut self,
        input1: u32,
        input2: u32,
        output: u32,
        transpose_b: bool,
    ) -> Result<(), XnnError> {
        let flags = if transpose_b {
            sys::XNN_FLAG_TRANSPOSE_B
        } else {
            0
        };
        self.writable(output, "xnn_define_batch_matrix_multiply")?;
        // SAFETY: plain values; XNNPACK validates the ids and flags.
        check("xnn_define_batch_matrix_multiply", unsafe {
            sys::xnn_define_batch_matrix_multiply(self.as_raw(), input1, input2, output, flags)
        })
    }

    /// Defines a softmax over the innermost dimension.
    pub fn define_softmax(&mut self, input: u32, output: u32) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_softmax")?;
        // SAFETY: plain values; XNNPACK validates the ids.
        check("xnn_define_softmax", unsafe {
            sys::xnn_define_softmax(self.as_raw(), input, output, 0)
        })
    }

    /// Defines a reshape of `input` to `new_shape` (same number of elements, at least one
    /// dimension).
    pub fn define_static_reshape(
        &mut self,
        new_shape: &[usize],
        input: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        const CALL: &str = "xnn_define_static_reshape";
        // To a scalar: refused, as scalar tensors are (see `role_parts`).
        if new_shape.is_empty() {
            return Err(refuse(CALL));
        }
        self.writable(output, CALL)?;
        // SAFETY: `new_shape` is read during the call only (XNNPACK checks its length against
        // XNN_MAX_TENSOR_DIMS first); XNNPACK validates the ids.
        check(CALL, unsafe {
            sys::xnn_define_static_reshape(
                self.as_raw(),
                new_shape.len(),
                new_shape.as_ptr(),
                input,
                output,
                0,
            )
        })
    }

    /// Defines a transpose: output dimension `i` is input dimension `perm[i]`.
    pub fn define_static_transpose(
        &mut self,
        perm: &[usize],
        input: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_static_transpose")?;
        // SAFETY: `perm` is read during the call only (XNNPACK checks its length against
        // XNN_MAX_TENSOR_DIMS first); XNNPACK validates the permutation and the ids.
        check("xnn_define_static_transpose", unsafe {
            sys::xnn_define_static_transpose(
                self.as_raw(),
                perm.len(),
                perm.as_ptr(),
                input,
                output,
                0,
            )
        })
    }

    /// Defines `output = input[offsets .. offsets + sizes]` (one offset and size per dimension,
    /// at most `XNN_MAX_TENSOR_DIMS` of them).
    pub fn define_static_slice(
        &mut self,
        offsets: &[usize],
        sizes: &[usize],
        input: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        // XNNPACK copies `offsets.len()` of each into arrays of XNN_MAX_TENSOR_DIMS without
        // checking the count (found by fuzzing: a slice of 16 dimensions overwrote its node).
        let dims = offsets.len();
        if dims != sizes.len() || dims == 0 || dims > sys::XNN_MAX_TENSOR_DIMS as usize {
            return Err(refuse("xnn_define_static_slice"));
        }
        self.writable(output, "xnn_define_static_slice")?;
        // SAFETY: both arrays hold `offsets.len()` entries, at most XNN_MAX_TENSOR_DIMS (checked
        // above), and are read during the call only.
        check("xnn_define_static_slice", unsafe {
            sys::xnn_define_static_slice(
                self.as_raw(),
                offsets.len(),
                offsets.as_ptr(),
                sizes.as_ptr(),
                input,
                output,
                0,
            )
        })
    }

    /// Defines `output = concat(input1, input2)` along `axis`.
    pub fn define_concatenate2(
        &mut self,
        axis: i32,
        input1: u32,
        input2: u32,
        output: u32,
    ) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_concatenate2")?;
        // SAFETY: plain values; XNNPACK validates the axis and the ids.
        check("xnn_define_concatenate2", unsafe {
            sys::xnn_define_concatenate2(self.as_raw(), axis, input1, input2, output, 0)
        })
    }

    /// Defines `output = input` (an explicit copy, e.g. a state write-back).
    pub fn define_copy(&mut self, input: u32, output: u32) -> Result<(), XnnError> {
        self.writable(output, "xnn_define_copy")?;
        // SAFETY: plain values; XNNPACK validates the ids.
        check("xnn_define_copy", unsafe {
            sys::xnn_define_copy(self.as_raw(), input, output, 0)
        })
    }
}

/// Static data must be exactly the tensor's bytes (a shape too large for usize needs more bytes
/// than any buffer holds).
fn check_static_size(datatype: Datatype, dims: &[usize], given: usize) -> Result<(), XnnError> {
    let expected = datatype.tensor_bytes(dims).unwrap_or(usize::MAX);
    if given != expected {
        return Err(XnnError::StaticDataSize {
            datatype,
            expected_bytes: expected,
            given_bytes: given,
        });
    }
    Ok(())
}

/// Refuses a tensor whose size in bytes exceeds what any buffer can hold (`isize::MAX`):
/// XNNPACK computes sizes in `size_t`, unchecked, so a wrapped size would plan a small buffer for
/// a huge shape (found by fuzzing: a payload declared an external of more than 2^64 bytes).
fn check_size(call: &'static str, datatype: Datatype, dims: &[usize]) -> Result<(), XnnError> {
    match datatype.tensor_bytes(dims) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(()),
        _ => Err(refuse(call)),
    }
}

/// The data pointer, external id and flags of a value in `role`, after checking static data
/// against the tensor's size and alignment.
fn role_parts(
    call: &'static str,
    datatype: Datatype,
    dims: &[usize],
    role: ValueRole<'_>,
) -> Result<(*const std::ffi::c_void, u32, u32), XnnError> {
    // XNNPACK's fully connected node writes the output's last dimension at rank - 1 and copies
    // rank - 1 leading ones, unchecked: a scalar input wrote past the runtime's values (found by
    // fuzzing, as an input and as an internal value nothing writes, which keeps its declared
    // shape). With no scalar declared, and none made by a reshape (refused too), every node
    // keeps its input's rank or makes one of at least one.
    if dims.is_empty() {
        return Err(refuse(call));
    }
    let parts = match role {
        ValueRole::Internal => (std::ptr::null(), sys::XNN_INVALID_VALUE_ID, 0),
        ValueRole::Static(data) => {
            check_static_size(datatype, dims, data.len())?;
            let alignment = datatype.alignment();
            if !data.is_empty() && !(data.as_ptr() as usize).is_multiple_of(alignment) {
                return Err(XnnError::StaticDataAlignment {
                    datatype,
                    alignment,
                });
            }
            (data.as_ptr().cast(), sys::XNN_INVALID_VALUE_ID, 0)
        }
        ValueRole::Deferred(data) => {
            check_static_size(datatype, dims, data.len())?;
            // Page aligned, so aligned for every datatype.
            (data.address().cast(), sys::XNN_INVALID_VALUE_ID, 0)
        }
        ValueRole::Input(id) => (std::ptr::null(), id, sys::XNN_VALUE_FLAG_EXTERNAL_INPUT),
        ValueRole::Output(id) => (std::ptr::null(), id, sys::XNN_VALUE_FLAG_EXTERNAL_OUTPUT),
    };
    // After the static checks, which name a static size that overflows as such.
    check_size(call, datatype, dims)?;
    Ok(parts)
}

impl Drop for Subgraph<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the subgraph; runtimes made from it do not reference it.
        unsafe { sys::xnn_delete_subgraph(self.raw.as_ptr()) };
    }
}
