//! Which microkernel XNNPACK runs a quantized fully connected layer with on this CPU.
//!
//! XNNPACK picks one GEMM microkernel family per weight type from the CPU's ISA (AVX2, AVX512-VNNI,
//! AVX512-VNNI with GFNI, AMX, ...), and a wrong result is a property of one family. Tests print
//! these names beside every quantized comparison, so that a failure on a CPU class names its kernel.

use super::XnnError;
use xnnpack_sys as sys;

/// The weight types of XNNPACK's fully connected operators with dynamically quantized (qd8)
/// activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qd8Weights {
    /// 8-bit weights, one scale per output channel.
    Qc8w,
    /// 4-bit weights, one scale per output channel.
    Qc4w,
    /// 4-bit weights, one bf16 scale per block of input channels.
    Qb4w,
}

impl Qd8Weights {
    /// All weight types, in a stable order.
    pub const ALL: [Qd8Weights; 3] = [Qd8Weights::Qc8w, Qd8Weights::Qc4w, Qd8Weights::Qb4w];

    /// XNNPACK's name for the operator: `qd8_f32_qc8w`, `qd8_f32_qc4w` or `qd8_f32_qb4w`.
    pub fn operator_name(self) -> &'static str {
        match self {
            Qd8Weights::Qc8w => "qd8_f32_qc8w",
            Qd8Weights::Qc4w => "qd8_f32_qc4w",
            Qd8Weights::Qb4w => "qd8_f32_qb4w",
        }
    }
}

/// The symbol of the widest-tile GEMM microkernel XNNPACK's configuration selects on this CPU
/// for qd8 activations with `weights`, for example
/// `xnnblob_qd8_f32_qb4w_gemm_minmax_ukernel_12x16c4__avx512vnni`; its tile geometry when no
/// symbol matches. Followed by `(one row: NAME)` where one-row GEMMs take another kernel (AVX2's
/// qb4w, xnnpack-sys patch 0015). `Ok(None)` when the linked XNNPACK was not built by `xnnpack-sys` (a
/// user-provided build has no internal headers to read its configuration with) or has no such
/// kernel for this CPU.
pub fn qd8_gemm_kernel(weights: Qd8Weights) -> Result<Option<String>, XnnError> {
    super::initialize()?;
    Ok(query(weights))
}

fn query(weights: Qd8Weights) -> Option<String> {
    if !sys::HAS_KERNEL_INFO {
        return None;
    }
    let code = match weights {
        Qd8Weights::Qc8w => 0,
        Qd8Weights::Qc4w => 1,
        Qd8Weights::Qb4w => 2,
    };
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is writable for its length, which is passed as the size; the shim writes
    // a NUL-terminated string of at most that many bytes and keeps no pointer to it.
    let status =
        unsafe { sys::xnnblob_qd8_gemm_kernel(code, buffer.as_mut_ptr().cast(), buffer.len()) };
    if status != 0 {
        return None;
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    Some(String::from_utf8_lossy(&buffer[..end]).into_owned())
}
