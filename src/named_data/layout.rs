//! Tensor layouts as ExecuTorch stores them next to named data.

use std::fmt;

/// Declares [`ScalarType`] and its table by code from one list, so that the two cannot
/// disagree; each code must be the next one (checked at compile time).
macro_rules! scalar_types {
    ($($(#[doc = $doc:expr_2021])* $name:ident = $code:literal,)*) => {
        /// ExecuTorch's `ScalarType` (its numbering is the file format's).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ScalarType {
            $(
                $(#[doc = $doc])*
                #[doc = concat!("(code ", $code, ")")]
                $name,
            )*
            /// A code this build does not know; kept so nothing read is lost.
            Unknown(i8),
        }

        /// Every known type, at the index of its code.
        const BY_CODE: &[ScalarType] = &[$(ScalarType::$name),*];

        const _: () = {
            let mut next = 0;
            $(
                assert!($code == next, "ScalarType codes must be listed in order");
                next += 1;
            )*
            let _ = next;
        };
    };
}

scalar_types! {
    /// `uint8`.
    Byte = 0,
    /// `int8`.
    Char = 1,
    /// `int16`.
    Short = 2,
    /// `int32`.
    Int = 3,
    /// `int64`.
    Long = 4,
    /// `float16`, IEEE half precision.
    Half = 5,
    /// `float32`.
    Float = 6,
    /// `float64`.
    Double = 7,
    /// `complex32`: two `float16`.
    ComplexHalf = 8,
    /// `complex64`: two `float32`.
    ComplexFloat = 9,
    /// `complex128`: two `float64`.
    ComplexDouble = 10,
    /// `bool`, one byte.
    Bool = 11,
    /// `qint8`: quantized signed 8-bit.
    QInt8 = 12,
    /// `quint8`: quantized unsigned 8-bit.
    QUInt8 = 13,
    /// `qint32`: quantized signed 32-bit.
    QInt32 = 14,
    /// `bfloat16`.
    BFloat16 = 15,
    /// `quint4x2`: two quantized unsigned 4-bit values per byte.
    QUInt4x2 = 16,
    /// `quint2x4`: four quantized unsigned 2-bit values per byte.
    QUInt2x4 = 17,
    /// `bits1x8`: eight uninterpreted 1-bit values per byte.
    Bits1x8 = 18,
    /// `bits2x4`: four uninterpreted 2-bit values per byte.
    Bits2x4 = 19,
    /// `bits4x2`: two uninterpreted 4-bit values per byte.
    Bits4x2 = 20,
    /// `bits8`: eight uninterpreted bits.
    Bits8 = 21,
    /// `bits16`: sixteen uninterpreted bits.
    Bits16 = 22,
    /// `float8_e5m2`: 8-bit float, 5 exponent and 2 mantissa bits.
    Float8E5M2 = 23,
    /// `float8_e4m3fn`: 8-bit float, 4 exponent and 3 mantissa bits, no infinities.
    Float8E4M3Fn = 24,
    /// `float8_e5m2fnuz`: as `float8_e5m2`, no infinities or negative zero.
    Float8E5M2Fnuz = 25,
    /// `float8_e4m3fnuz`: as `float8_e4m3fn`, no negative zero.
    Float8E4M3Fnuz = 26,
    /// `uint16`.
    UInt16 = 27,
    /// `uint32`.
    UInt32 = 28,
    /// `uint64`.
    UInt64 = 29,
}

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

#[cfg(test)]
mod tests {
    use super::ScalarType;

    #[test]
    fn every_code_reads_back_as_itself_and_known_types_are_the_first_thirty() {
        for code in i8::MIN..=i8::MAX {
            let t = ScalarType::from_code(code);
            assert_eq!(t.code(), code);
            let known = (0..30).contains(&code);
            assert_eq!(!matches!(t, ScalarType::Unknown(_)), known, "code {code}");
        }
        assert_eq!(ScalarType::from_code(6), ScalarType::Float);
        assert_eq!(ScalarType::from_code(15), ScalarType::BFloat16);
        assert_eq!(ScalarType::from_code(29), ScalarType::UInt64);
    }
}
