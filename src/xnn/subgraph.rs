//! An owned XNNPACK subgraph: values and nodes, before a runtime is made of it.

use super::error::{check, XnnError};
use std::marker::PhantomData;
use std::ptr::NonNull;
use xnnpack_sys as sys;

/// How a tensor value takes part in the graph.
#[derive(Debug, Clone, Copy)]
pub enum ValueRole<'data> {
    /// Produced and consumed inside the graph.
    Internal,
    /// Constant data (weights), borrowed for as long as the subgraph and its runtimes live.
    Static(&'data [f32]),
    /// Fed by the caller under this external id.
    Input(u32),
    /// Read by the caller under this external id.
    Output(u32),
}

/// An XNNPACK subgraph. `'data` is the lifetime of the static data its values point to; the
/// runtimes made from it borrow that data too.
pub struct Subgraph<'data> {
    raw: NonNull<sys::xnn_subgraph>,
    pub(super) inputs: Vec<u32>,
    pub(super) outputs: Vec<u32>,
    _data: PhantomData<&'data [f32]>,
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
            _data: PhantomData,
        })
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
        let (data, external_id, flags) = match role {
            ValueRole::Internal => (std::ptr::null(), sys::XNN_INVALID_VALUE_ID, 0),
            ValueRole::Static(data) => {
                let expected = dims.iter().product::<usize>();
                if data.len() != expected {
                    return Err(XnnError::StaticDataSize {
                        expected_elements: expected,
                        given_elements: data.len(),
                    });
                }
                (data.as_ptr().cast(), sys::XNN_INVALID_VALUE_ID, 0)
            }
            ValueRole::Input(id) => (std::ptr::null(), id, sys::XNN_VALUE_FLAG_EXTERNAL_INPUT),
            ValueRole::Output(id) => (std::ptr::null(), id, sys::XNN_VALUE_FLAG_EXTERNAL_OUTPUT),
        };
        let mut id = sys::XNN_INVALID_VALUE_ID;
        // SAFETY: `dims` is read during the call only; `data` is null or borrowed for 'data,
        // which outlives the subgraph and every runtime made from it.
        check("xnn_define_tensor_value", unsafe {
            sys::xnn_define_tensor_value(
                self.as_raw(),
                sys::xnn_datatype_fp32,
                dims.len(),
                dims.as_ptr(),
                data,
                external_id,
                flags,
                &mut id,
            )
        })?;
        match role {
            ValueRole::Input(ext) => self.inputs.push(ext),
            ValueRole::Output(ext) => self.outputs.push(ext),
            _ => {}
        }
        Ok(id)
    }

    /// Defines `output = clamp(input · filterᵀ + bias, output_min, output_max)` with a filter of
    /// shape [output_channels, input_channels].
    pub fn define_fully_connected(
        &mut self,
        input: u32,
        filter: u32,
        bias: Option<u32>,
        output: u32,
        output_min: f32,
        output_max: f32,
    ) -> Result<(), XnnError> {
        // SAFETY: plain values; XNNPACK validates the ids against this subgraph.
        check("xnn_define_fully_connected", unsafe {
            sys::xnn_define_fully_connected(
                self.as_raw(),
                output_min,
                output_max,
                input,
                filter,
                bias.unwrap_or(sys::XNN_INVALID_VALUE_ID),
                output,
                0,
            )
        })
    }
}

impl Drop for Subgraph<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the subgraph; runtimes made from it do not reference it.
        unsafe { sys::xnn_delete_subgraph(self.raw.as_ptr()) };
    }
}
