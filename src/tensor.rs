//! Tensors at the boundary of a delegate or method: their element types ([`DType`]), shapes
//! that need no allocation ([`Shape`]), borrowed views in and out ([`TensorRef`],
//! [`TensorMut`]), and an owned buffer with XNNPACK's over-read slack ([`PaddedTensor`]).
//!
//! XNNPACK may read [`XNN_EXTRA_BYTES`] past the end of any input. A view made from a plain
//! slice cannot promise those bytes are readable, so it is copied once into the delegate's
//! own padded staging buffer; a view of a [`PaddedTensor`] promises them and is bound in place.

use crate::aligned::AlignedBytes;
use std::fmt;

/// How many bytes XNNPACK may read past the end of an input.
pub const XNN_EXTRA_BYTES: usize = xnnpack_sys::XNN_EXTRA_BYTES as usize;
/// The most dimensions a tensor has (XNNPACK's limit).
pub const MAX_DIMS: usize = xnnpack_sys::XNN_MAX_TENSOR_DIMS as usize;

/// The element type of a tensor crossing a delegate's boundary, named as ExecuTorch's scalar
/// types are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// `float32` (ExecuTorch `Float`).
    F32,
    /// `float16` (ExecuTorch `Half`).
    F16,
    /// `bfloat16` (ExecuTorch `BFloat16`).
    BF16,
    /// `int8` (ExecuTorch `Char`): quantized per tensor, as XNNPACK's qint8.
    I8,
    /// `uint8` (ExecuTorch `Byte`): quantized per tensor, as XNNPACK's quint8.
    U8,
    /// `int32` (ExecuTorch `Int`).
    I32,
    /// `int64` (ExecuTorch `Long`): method values only; no XNNPACK value has this type.
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }

    /// ExecuTorch's `ScalarType` code.
    pub const fn scalar_type(self) -> i8 {
        match self {
            DType::U8 => 0,
            DType::I8 => 1,
            DType::I32 => 3,
            DType::I64 => 4,
            DType::F16 => 5,
            DType::F32 => 6,
            DType::BF16 => 15,
        }
    }

    /// The dtype of ExecuTorch's `ScalarType` code, if it is one of these.
    pub const fn from_scalar_type(code: i8) -> Option<DType> {
        Some(match code {
            0 => DType::U8,
            1 => DType::I8,
            3 => DType::I32,
            4 => DType::I64,
            5 => DType::F16,
            6 => DType::F32,
            15 => DType::BF16,
            _ => return None,
        })
    }

    /// The name used on the command line and in ExecuTorch's Python (`float32`, `int8`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
        }
    }

    /// Parses [`name`](Self::name) or a short form (`f32`, `f16`, `bf16`, `i8`, `u8`, `i32`,
    /// `i64`).
    pub fn parse(text: &str) -> Option<DType> {
        Some(match text {
            "float32" | "f32" | "float" => DType::F32,
            "float16" | "f16" | "half" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "int8" | "i8" => DType::I8,
            "uint8" | "u8" => DType::U8,
            "int32" | "i32" => DType::I32,
            "int64" | "i64" => DType::I64,
            _ => return None,
        })
    }

    /// The short form, used as a file extension for raw tensors (`output0.f16`).
    pub const fn short_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor shape of at most [`MAX_DIMS`] dimensions, held inline: copying or comparing one
/// never allocates.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    dims: [usize; MAX_DIMS],
    rank: u8,
}

/// A shape with more dimensions than XNNPACK takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a tensor of {rank} dimensions; XNNPACK takes at most {MAX_DIMS}")]
pub struct TooManyDims {
    /// The number of dimensions given.
    pub rank: usize,
}

impl Shape {
    /// The shape with these dimensions.
    pub fn new(dims: &[usize]) -> Result<Shape, TooManyDims> {
        if dims.len() > MAX_DIMS {
            return Err(TooManyDims { rank: dims.len() });
        }
        let mut shape = Shape {
            dims: [0; MAX_DIMS],
            rank: dims.len() as u8,
        };
        shape.dims[..dims.len()].copy_from_slice(dims);
        Ok(shape)
    }

    /// The dimensions, outermost first (`rank` of them).
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank as usize]
    }

    /// The number of dimensions (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// The number of elements; `None` when it overflows.
    pub fn numel(&self) -> Option<usize> {
        self.dims()
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// The bytes a tensor of this shape and `dtype` takes; `None` when that overflows.
    pub fn nbytes(&self, dtype: DType) -> Option<usize> {
        self.numel()?.checked_mul(dtype.size())
    }

    /// Whether every dimension is at most the matching one of `bound`, with the same rank.
    pub fn fits_within(&self, bound: &Shape) -> bool {
        self.rank == bound.rank && self.dims().iter().zip(bound.dims()).all(|(d, b)| d <= b)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

/// A shape that does not fit where it was given, and what it had to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShapeMismatch {
    /// The shape the caller gave.
    pub given: Shape,
    /// The declared shape (the upper bound of a dynamic one).
    pub bound: Shape,
}

/// A read-only tensor: dtype, shape, and bytes in C order (at least the shape's bytes).
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    dtype: DType,
    shape: Shape,
    data: &'a [u8],
    /// XNN_EXTRA_BYTES past `data` are readable too: bound in place, never staged.
    padded: bool,
}

impl<'a> TensorRef<'a> {
    /// A view of plain bytes. XNNPACK cannot be handed them directly (nothing says the bytes
    /// after them are readable): a delegate copies them once into its staging buffer.
    pub fn new(dtype: DType, shape: Shape, data: &'a [u8]) -> TensorRef<'a> {
        TensorRef {
            dtype,
            shape,
            data,
            padded: false,
        }
    }

    /// A view of f32 values (copied once into a delegate's staging buffer, as [`new`](Self::new)).
    pub fn f32(shape: Shape, data: &'a [f32]) -> TensorRef<'a> {
        TensorRef::new(DType::F32, shape, bytes_of_f32(data))
    }

    /// A view of bytes followed by at least [`XNN_EXTRA_BYTES`] readable ones, which a delegate
    /// binds in place.
    ///
    /// # Safety
    /// `data.as_ptr() + data.len() + XNN_EXTRA_BYTES` must lie within one readable allocation
    /// for as long as `'a`.
    pub unsafe fn with_slack(dtype: DType, shape: Shape, data: &'a [u8]) -> TensorRef<'a> {
        TensorRef {
            dtype,
            shape,
            data,
            padded: true,
        }
    }

    /// The element type of the bytes.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape the bytes hold.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The bytes (at least as many as the shape needs).
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Whether a delegate binds this view in place (true) or copies it once (false).
    pub fn is_padded(&self) -> bool {
        self.padded
    }

    /// The elements as f32, when the dtype is F32 and the bytes are 4-aligned.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        if self.dtype != DType::F32 {
            return None;
        }
        let n = self.shape.numel()?;
        let bytes = self.data.get(..n.checked_mul(4)?)?;
        // SAFETY: any 4 bytes are a valid f32; align_to only yields the aligned middle.
        let (head, values, _) = unsafe { bytes.align_to::<f32>() };
        head.is_empty().then_some(values)
    }
}

/// A writable tensor: a delegate writes its output here and records the shape it wrote.
pub struct TensorMut<'a> {
    dtype: DType,
    shape: Shape,
    data: &'a mut [u8],
}

impl<'a> TensorMut<'a> {
    /// Room for a tensor of `dtype` of up to `data.len()` bytes; the shape is set by whoever
    /// writes it.
    pub fn new(dtype: DType, data: &'a mut [u8]) -> TensorMut<'a> {
        TensorMut {
            dtype,
            shape: Shape::default(),
            data,
        }
    }

    /// Room for f32 values.
    pub fn f32(data: &'a mut [f32]) -> TensorMut<'a> {
        TensorMut::new(DType::F32, bytes_of_f32_mut(data))
    }

    /// The element type the writer must produce.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape of what was last written.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    pub(crate) fn set_shape(&mut self, shape: Shape) {
        self.shape = shape;
    }

    /// The capacity, in bytes.
    pub fn capacity(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data.as_mut_ptr()
    }

    /// The bytes of what was last written (the shape's bytes).
    pub fn data(&self) -> &[u8] {
        let n = self.shape.nbytes(self.dtype).unwrap_or(0);
        &self.data[..n.min(self.data.len())]
    }
}

/// An owned tensor buffer, 64-byte aligned, with XNNPACK's over-read slack after its capacity:
/// delegates bind it in place, as input or as output.
pub struct PaddedTensor {
    dtype: DType,
    shape: Shape,
    /// Capacity in bytes (without the slack).
    capacity: usize,
    bytes: AlignedBytes,
}

/// A buffer whose size overflows or cannot be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", allocation_message(*.bytes))]
pub struct AllocationError {
    /// The bytes that could not be allocated (slack included); `None` when the size overflows.
    pub bytes: Option<usize>,
}

/// The message of an [`AllocationError`], which depends on whether the size is known: a format
/// string cannot branch, and `#[error(fmt = ...)]` takes enums only. It formats in place rather
/// than into a `String`, as memory may be what ran out.
fn allocation_message(bytes: Option<usize>) -> impl fmt::Display {
    fmt::from_fn(move |f| match bytes {
        Some(n) => write!(f, "could not allocate {n} bytes"),
        None => f.write_str("a tensor size overflows"),
    })
}

impl PaddedTensor {
    /// A zeroed tensor of `dtype` with room for `capacity` (its largest shape), holding that
    /// shape until [`set_shape`](Self::set_shape) says otherwise.
    pub fn zeros(dtype: DType, capacity: Shape) -> Result<PaddedTensor, AllocationError> {
        let bytes = capacity
            .nbytes(dtype)
            .ok_or(AllocationError { bytes: None })?;
        let total = bytes
            .checked_add(XNN_EXTRA_BYTES)
            .ok_or(AllocationError { bytes: None })?;
        let storage =
            AlignedBytes::zeroed(total, 64).ok_or(AllocationError { bytes: Some(total) })?;
        Ok(PaddedTensor {
            dtype,
            shape: capacity,
            capacity: bytes,
            bytes: storage,
        })
    }

    /// The element type of the tensor.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The current shape (the capacity until [`set_shape`](Self::set_shape) changes it).
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the current shape; false (and unchanged) when it needs more than the capacity.
    pub fn set_shape(&mut self, shape: Shape) -> bool {
        match shape.nbytes(self.dtype) {
            Some(n) if n <= self.capacity => {
                self.shape = shape;
                true
            }
            _ => false,
        }
    }

    /// The bytes of the current shape.
    pub fn data(&self) -> &[u8] {
        let n = self.shape.nbytes(self.dtype).unwrap_or(0);
        &self.bytes[..n]
    }

    /// The bytes of the current shape, to fill.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let n = self.shape.nbytes(self.dtype).unwrap_or(0);
        &mut self.bytes.as_mut_slice()[..n]
    }

    /// A view a delegate binds in place.
    pub fn as_ref(&self) -> TensorRef<'_> {
        // SAFETY: the allocation holds XNN_EXTRA_BYTES past the capacity, so past any shape's
        // bytes too; it lives as long as the borrow.
        unsafe { TensorRef::with_slack(self.dtype, self.shape, self.data()) }
    }

    /// The whole capacity as a place for a delegate to write an output into.
    pub fn as_mut(&mut self) -> TensorMut<'_> {
        let capacity = self.capacity;
        TensorMut {
            dtype: self.dtype,
            shape: self.shape,
            data: &mut self.bytes.as_mut_slice()[..capacity],
        }
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_ptr()
    }
}

fn bytes_of_f32(data: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte of it is initialised; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

fn bytes_of_f32_mut(data: &mut [f32]) -> &mut [u8] {
    // SAFETY: as above; any byte pattern is a valid f32, so writes through the bytes are sound.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data)) }
}

/// Reads f16 bits as f32 (for reports and tests; exact: every f16 is an f32).
pub fn f16_to_f32(bits: u16) -> f32 {
    let negative = bits & 0x8000 != 0;
    let exponent = ((bits >> 10) & 0x1f) as u32;
    let mantissa = (bits & 0x3ff) as u32;
    let magnitude = match exponent {
        // Subnormal: mantissa * 2^-24, exact in f32.
        0 => mantissa as f32 * f32::from_bits(0x3380_0000),
        0x1f => f32::from_bits(0x7f80_0000 | (mantissa << 13)),
        e => f32::from_bits(((e + 127 - 15) << 23) | (mantissa << 13)),
    };
    if negative { -magnitude } else { magnitude }
}

/// Reads a raw little-endian tensor of `dtype` as f32 values (for reports and tests).
pub fn to_f32_lossy(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
            .collect(),
        DType::I8 => bytes.iter().map(|&b| b as i8 as f32).collect(),
        DType::U8 => bytes.iter().map(|&b| b as f32).collect(),
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
            .collect(),
        DType::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
    }
}
