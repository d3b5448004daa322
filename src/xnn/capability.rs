//! What the linked XNNPACK can run on this CPU, asked of XNNPACK itself.

use super::error::check;
use super::{Status, XnnError};
use crate::tensor::XNN_EXTRA_BYTES;
use std::sync::OnceLock;
use xnnpack_sys as sys;

/// Whether XNNPACK has fp16 GEMM kernels on this CPU: fully connected, convolution and batch
/// matrix multiply layers whose activations and weights are fp16.
///
/// On aarch64 this XNNPACK (Debian's 4ea82e5) has them only with FEAT_FP16 arithmetic
/// (Armv8.2); an Armv8.0 core such as the Cortex-A53 has none, and XNNPACK then refuses to
/// create such operators (`UnsupportedHardware`). On x86-64 they need AVX2 and F16C.
///
/// Asked once per process: a one-element fp16 fully connected operator is created (packing two
/// bytes) and deleted. Asking XNNPACK rather than the CPU's feature bits keeps the answer right
/// for whatever XNNPACK is linked (a user-provided build may have more kernels).
pub fn runs_fp16_gemm() -> Result<bool, XnnError> {
    static ANSWER: OnceLock<Result<bool, XnnError>> = OnceLock::new();
    ANSWER.get_or_init(probe_fp16_gemm).clone()
}

fn probe_fp16_gemm() -> Result<bool, XnnError> {
    super::initialize()?;
    // fp16 1.0 as the one weight, then zeros XNNPACK may over-read.
    let mut kernel = [0u16; 1 + XNN_EXTRA_BYTES / 2];
    kernel[0] = 0x3c00;
    let mut op: sys::xnn_operator_t = std::ptr::null_mut();
    // SAFETY: the kernel is one fp16 element plus XNNPACK's over-read slack, read during the call
    // only (no weights cache, so the packing is the operator's own); a null bias and code cache
    // are allowed; `op` is a valid out-pointer.
    let status = unsafe {
        sys::xnn_create_fully_connected_nc_f16(
            1,
            1,
            1,
            1,
            kernel.as_ptr().cast(),
            std::ptr::null(),
            f32::NEG_INFINITY,
            f32::INFINITY,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut op,
        )
    };
    if !op.is_null() {
        // SAFETY: `op` was created above and is not used after this.
        check("xnn_delete_operator", unsafe {
            sys::xnn_delete_operator(op)
        })?;
    }
    match check("xnn_create_fully_connected_nc_f16", status) {
        Ok(()) => Ok(true),
        Err(XnnError::Call {
            status: Status::UnsupportedHardware,
            ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}
