//! Tensor layouts as ExecuTorch stores them next to named data.

use std::fmt;

/// ExecuTorch's `ScalarType` (its numbering is the file format's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarType {
    /// `uint8` (code 0).
    Byte,
    /// `int8` (code 1).
    Char,
    /// `int16` (code 2).
    Short,
    /// `int32` (code 3).
    Int,
    /// `int64` (code 4).
    Long,
    /// `float16`, IEEE half precision (code 5).
    Half,
    /// `float32` (code 6).
    Float,
    /// `float64` (code 7).
    Double,
    /// `complex32`: two `float16` (code 8).
    ComplexHalf,
    /// `complex64`: two `float32` (code 9).
    ComplexFloat,
    /// `complex128`: two `float64` (code 10).
    ComplexDouble,
    /// `bool`, one byte (code 11).
    Bool,
    /// `qint8`: quantized signed 8-bit (code 12).
    QInt8,
    /// `quint8`: quantized unsigned 8-bit (code 13).
    QUInt8,
    /// `qint32`: quantized signed 32-bit (code 14).
    QInt32,
    /// `bfloat16` (code 15).
    BFloat16,
    /// `quint4x2`: two quantized unsigned 4-bit values per byte (code 16).
    QUInt4x2,
    /// `quint2x4`: four quantized unsigned 2-bit values per byte (code 17).
    QUInt2x4,
    /// `bits1x8`: eight uninterpreted 1-bit values per byte (code 18).
    Bits1x8,
    /// `bits2x4`: four uninterpreted 2-bit values per byte (code 19).
    Bits2x4,
    /// `bits4x2`: two uninterpreted 4-bit values per byte (code 20).
    Bits4x2,
    /// `bits8`: eight uninterpreted bits (code 21).
    Bits8,
    /// `bits16`: sixteen uninterpreted bits (code 22).
    Bits16,
    /// `float8_e5m2`: 8-bit float, 5 exponent and 2 mantissa bits (code 23).
    Float8E5M2,
    /// `float8_e4m3fn`: 8-bit float, 4 exponent and 3 mantissa bits, no infinities (code 24).
    Float8E4M3Fn,
    /// `float8_e5m2fnuz`: as `float8_e5m2`, no infinities or negative zero (code 25).
    Float8E5M2Fnuz,
    /// `float8_e4m3fnuz`: as `float8_e4m3fn`, no negative zero (code 26).
    Float8E4M3Fnuz,
    /// `uint16` (code 27).
    UInt16,
    /// `uint32` (code 28).
    UInt32,
    /// `uint64` (code 29).
    UInt64,
    /// A code this build does not know; kept so nothing read is lost.
    Unknown(i8),
}

const BY_CODE: [ScalarType; 30] = {
    use ScalarType::*;
    [
        Byte,
        Char,
        Short,
        Int,
        Long,
        Half,
        Float,
        Double,
        ComplexHalf,
        ComplexFloat,
        ComplexDouble,
        Bool,
        QInt8,
        QUInt8,
        QInt32,
        BFloat16,
        QUInt4x2,
        QUInt2x4,
        Bits1x8,
        Bits2x4,
        Bits4x2,
        Bits8,
        Bits16,
        Float8E5M2,
        Float8E4M3Fn,
        Float8E5M2Fnuz,
        Float8E4M3Fnuz,
        UInt16,
        UInt32,
        UInt64,
    ]
};

impl ScalarType {
    /// The type of an ExecuTorch code as stored in files; [`ScalarType::Unknown`] for codes
    /// this build does not know.
    pub fn from_code(code: i8) -> ScalarType {
        usize::try_from(code)
            .ok()
            .and_then(|i| BY_CODE.get(i).copied())
            .unwrap_or(ScalarType::Unknown(code))
    }

    /// The ExecuTorch code stored in files; the inverse of [`from_code`](Self::from_code).
    pub fn code(self) -> i8 {
        match self {
            ScalarType::Unknown(code) => code,
            known => BY_CODE.iter().position(|t| *t == known).expect("listed") as i8,
        }
    }

    /// Bytes per element (sub-byte packed types count one byte per packed element, as
    /// ExecuTorch's `elementSize` does); None for unknown types.
    pub fn element_size(self) -> Option<usize> {
        use ScalarType::*;
        Some(match self {
            Byte | Char | Bool | QInt8 | QUInt8 | QUInt4x2 | QUInt2x4 | Bits1x8 | Bits2x4
            | Bits4x2 | Bits8 | Float8E5M2 | Float8E4M3Fn | Float8E5M2Fnuz | Float8E4M3Fnuz => 1,
            Short | Half | BFloat16 | Bits16 | UInt16 => 2,
            Int | Float | QInt32 | UInt32 => 4,
            Long | Double | ComplexFloat | UInt64 => 8,
            ComplexHalf => 4,
            ComplexDouble => 16,
            Unknown(_) => return None,
        })
    }

    /// The name ExecuTorch's manifests and Python API use (`float32`, `int8`, ...).
    pub fn name(self) -> String {
        use ScalarType::*;
        match self {
            Byte => "uint8",
            Char => "int8",
            Short => "int16",
            Int => "int32",
            Long => "int64",
            Half => "float16",
            Float => "float32",
            Double => "float64",
            ComplexHalf => "complex32",
            ComplexFloat => "complex64",
            ComplexDouble => "complex128",
            Bool => "bool",
            QInt8 => "qint8",
            QUInt8 => "quint8",
            QInt32 => "qint32",
            BFloat16 => "bfloat16",
            QUInt4x2 => "quint4x2",
            QUInt2x4 => "quint2x4",
            Bits1x8 => "bits1x8",
            Bits2x4 => "bits2x4",
            Bits4x2 => "bits4x2",
            Bits8 => "bits8",
            Bits16 => "bits16",
            Float8E5M2 => "float8_e5m2",
            Float8E4M3Fn => "float8_e4m3fn",
            Float8E5M2Fnuz => "float8_e5m2fnuz",
            Float8E4M3Fnuz => "float8_e4m3fnuz",
            UInt16 => "uint16",
            UInt32 => "uint32",
            UInt64 => "uint64",
            Unknown(code) => return format!("unknown({code})"),
        }
        .to_string()
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The layout of a tensor stored as named data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    scalar_type: ScalarType,
    sizes: Vec<i32>,
    dim_order: Vec<u8>,
    nbytes: Option<usize>,
}

impl TensorLayout {
    /// A validated layout: sizes non-negative, dim order a permutation of the dimensions,
    /// byte size free of overflow.
    pub fn new(
        scalar_type: ScalarType,
        sizes: Vec<i32>,
        dim_order: Vec<u8>,
    ) -> Result<TensorLayout, String> {
        if let Some(bad) = sizes.iter().find(|s| **s < 0) {
            return Err(format!("negative size {bad}"));
        }
        let mut seen = vec![false; sizes.len()];
        if dim_order.len() != sizes.len() {
            return Err(format!(
                "dim order has {} entries for {} dimensions",
                dim_order.len(),
                sizes.len()
            ));
        }
        for d in &dim_order {
            match seen.get_mut(usize::from(*d)) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("dim order {dim_order:?} is not a permutation")),
            }
        }
        let nbytes = match scalar_type.element_size() {
            None => None,
            Some(element) => Some(
                sizes
                    .iter()
                    .try_fold(element, |acc, s| acc.checked_mul(*s as usize))
                    .ok_or_else(|| format!("byte size of {sizes:?} overflows"))?,
            ),
        };
        Ok(TensorLayout {
            scalar_type,
            sizes,
            dim_order,
            nbytes,
        })
    }

    /// A contiguous layout (dim order 0, 1, ..., n-1).
    pub fn contiguous(scalar_type: ScalarType, sizes: Vec<i32>) -> Result<TensorLayout, String> {
        let dim_order = (0..sizes.len() as u8).collect();
        TensorLayout::new(scalar_type, sizes, dim_order)
    }

    /// The type of the tensor's elements.
    pub fn scalar_type(&self) -> ScalarType {
        self.scalar_type
    }

    /// The size of each dimension in elements, in dimension order (not memory order).
    pub fn sizes(&self) -> &[i32] {
        &self.sizes
    }

    /// The dimensions in memory order, outermost first: a permutation of `0..sizes().len()`.
    pub fn dim_order(&self) -> &[u8] {
        &self.dim_order
    }

    /// The tensor's size in bytes; None when the scalar type is unknown.
    pub fn nbytes(&self) -> Option<usize> {
        self.nbytes
    }
}
