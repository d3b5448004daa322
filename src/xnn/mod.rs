//! A small safe layer over XNNPACK: process-wide initialisation, owned subgraphs and runtimes,
//! weights-cache providers, and `xnn_status` as a typed error.

pub mod activity;
mod capability;
mod convolutions;
mod datatype;
mod error;
mod in_memory_provider;
mod kernel_info;
mod nodes;
mod runtime;
mod subgraph;
mod threadpool;
mod weights_provider;
mod workspace;
mod xnnpack_provider;

pub use capability::runs_fp16_gemm;
pub use convolutions::{
    Convolution2dParams, DepthwiseConvolution2dParams, FullyConnectedFlags, Padding2d,
};
pub use datatype::Datatype;
pub(crate) use error::buffer_too_small;
pub use error::{Status, XnnError};
pub use in_memory_provider::{InMemoryProvider, ProviderStats};
pub use kernel_info::{Qd8Weights, qd8_gemm_kernel};
pub use nodes::{BinaryOp, Deconvolution2dParams, Pooling2dParams, UnaryOp};
pub use runtime::{External, RawInput, RawOutput, Runtime, RuntimeOptions};
pub use subgraph::{
    BlockwiseQuantization, BlockwiseScales, ChannelwiseQuantization, ExternalDecl, Subgraph,
    ValueRole,
};
pub use threadpool::Threadpool;
pub use weights_provider::{
    AsXnnWeightsCache, LookUpKey, PackedWeightsProvider, ProvidedWeightsCache,
};
pub use workspace::Workspace;
pub use xnnpack_provider::XnnpackWeightsCache;
/// The two operations a pool gives XNNPACK ([`Threadpool::with_ops`]).
pub use xnnpack_sys::pool::{PoolOps, RangeFn};

use std::sync::OnceLock;
use xnnpack_sys as sys;

/// Initialises XNNPACK once per process; later calls return the first call's result.
pub fn initialize() -> Result<(), XnnError> {
    static INIT: OnceLock<Result<(), XnnError>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: a null allocator selects XNNPACK's default; xnn_initialize is thread-safe and
        // OnceLock runs it once.
        error::check("xnn_initialize", unsafe {
            sys::xnn_initialize(std::ptr::null())
        })
    })
    .clone()
}

/// The identifier of the XNNPACK build linked in: changes whenever its packing code may have.
pub fn build_identifier() -> &'static [u8] {
    // SAFETY: both calls return constants of the linked library; data points to size bytes
    // with static lifetime.
    unsafe {
        let data = sys::xnn_experimental_get_build_identifier_data();
        let size = sys::xnn_experimental_get_build_identifier_size();
        std::slice::from_raw_parts(data.cast::<u8>(), size)
    }
}
