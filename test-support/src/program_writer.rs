//! Writes an ExecuTorch program (`.pte`) around one XNNPACK payload: one method, fully delegated
//! to `XnnpackBackend`, its inputs and outputs memory-planned, its weights left to a `.ptd`. What
//! ExecuTorch's exporter writes for such a model, so that generated models of any size run
//! through ExecuTorch's own runtime (benches, tests) with either XNNPACK backend.
//!
//! ```text
//! 0      4      8      12     16              24             32                 40
//! | root | ET12 | eh00 | 32   | program_size  | segment_base | segment_data_size | flatbuffer…
//! segment_base (aligned to SEGMENT_ALIGNMENT): segment 0, the empty constant segment, and
//! segment 1, the payload
//! ```

use xnnblob::named_data::ScalarType;
use xnnblob::named_data::pte_format::{HEADER_LENGTH, HEADER_MAGIC};
use xnnblob::schema::pte as fb;

/// Where ExecuTorch's exporter aligns segments by default, so that they can be mapped.
const SEGMENT_ALIGNMENT: usize = 128;
/// Planned tensors start at multiples of this inside the planned buffer.
const TENSOR_ALIGNMENT: usize = 16;
/// ExecuTorch looks delegates up by this id.
const BACKEND_ID: &str = "XnnpackBackend";
/// The byte offset of the `eh00` header: after the root offset and the file identifier.
const HEADER_AT: usize = 8;
/// Planned buffer 0 is reserved by ExecuTorch's memory planning; activations live in buffer 1.
const PLANNED_BUFFER: u32 = 1;

/// One input or output of a delegated graph, in the order of its external id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct External {
    dtype: ScalarType,
    sizes: Vec<usize>,
    /// An output (the method returns it) rather than an input.
    output: bool,
}

impl External {
    /// An fp32 input or output of shape `sizes`.
    pub fn f32(sizes: Vec<usize>, output: bool) -> External {
        External {
            dtype: ScalarType::Float,
            sizes,
            output,
        }
    }

    /// An fp16 input or output of shape `sizes`.
    pub fn f16(sizes: Vec<usize>, output: bool) -> External {
        External {
            dtype: ScalarType::Half,
            sizes,
            output,
        }
    }

    /// The planned bytes; every constructor takes a dtype of known size.
    fn nbytes(&self) -> usize {
        self.sizes.iter().product::<usize>() * self.dtype.element_size().unwrap_or(1)
    }
}

/// A program whose one method runs one XNNPACK payload.
#[derive(Debug, Clone, Copy)]
pub struct DelegatedProgram<'a> {
    /// The name of the program's one method, which runtimes load it by (e.g. `forward`).
    pub method: &'a str,
    /// The delegate's processed bytes (`XH00` header, flatbuffer, inline constants).
    pub payload: &'a [u8],
    /// The payload's externals by id: the delegate call's arguments in that order.
    pub externals: &'a [External],
}

impl DelegatedProgram<'_> {
    /// Writes the program to `path` atomically: a crash leaves the old file or the new one.
    pub fn write(&self, path: &std::path::Path) -> Result<(), xnnblob::named_data::StoreError> {
        xnnblob::named_data::write_atomically(path, &self.serialize())
    }

    /// The program's bytes: flatbuffer with the `eh00` header spliced in, then the payload as a
    /// segment.
    pub fn serialize(&self) -> Vec<u8> {
        let mut builder = flatbuffers::FlatBufferBuilder::new();

        // Values: one planned tensor per external, in external-id order, so value i is
        // argument i of the delegate call.
        let mut planned = 0usize;
        let values: Vec<_> = self
            .externals
            .iter()
            .map(|external| {
                let offset = planned.next_multiple_of(TENSOR_ALIGNMENT);
                planned = offset + external.nbytes();
                let sizes: Vec<i32> = external.sizes.iter().map(|&d| d as i32).collect();
                let sizes = builder.create_vector(&sizes);
                let dim_order: Vec<u8> = (0..external.sizes.len() as u8).collect();
                let dim_order = builder.create_vector(&dim_order);
                let allocation = fb::AllocationDetails::create(
                    &mut builder,
                    &fb::AllocationDetailsArgs {
                        memory_id: PLANNED_BUFFER,
                        memory_offset_low: offset as u32,
                        memory_offset_high: (offset as u64 >> 32) as u32,
                    },
                );
                let tensor = fb::Tensor::create(
                    &mut builder,
                    &fb::TensorArgs {
                        scalar_type: external.dtype.code(),
                        sizes: Some(sizes),
                        dim_order: Some(dim_order),
                        allocation_info: Some(allocation),
                        ..Default::default()
                    },
                );
                fb::EValue::create(
                    &mut builder,
                    &fb::EValueArgs {
                        val_type: fb::KernelTypes::Tensor,
                        val: Some(tensor.as_union_value()),
                    },
                )
            })
            .collect();
        let indices = |output: bool| -> Vec<i32> {
            (0..self.externals.len() as i32)
                .filter(|&i| self.externals[i as usize].output == output)
                .collect()
        };
        let (inputs, outputs) = (indices(false), indices(true));
        let arguments: Vec<i32> = (0..self.externals.len() as i32).collect();

        let call_args = builder.create_vector(&arguments);
        let call = fb::DelegateCall::create(
            &mut builder,
            &fb::DelegateCallArgs {
                delegate_index: 0,
                args: Some(call_args),
            },
        );
        let instruction = fb::Instruction::create(
            &mut builder,
            &fb::InstructionArgs {
                instr_args_type: fb::InstructionArguments::DelegateCall,
                instr_args: Some(call.as_union_value()),
            },
        );
        let chain_inputs = builder.create_vector(&inputs);
        let chain_outputs = builder.create_vector(&outputs);
        let instructions = builder.create_vector(&[instruction]);
        let chain = fb::Chain::create(
            &mut builder,
            &fb::ChainArgs {
                inputs: Some(chain_inputs),
                outputs: Some(chain_outputs),
                instructions: Some(instructions),
            },
        );

        let id = builder.create_string(BACKEND_ID);
        let processed = fb::BackendDelegateDataReference::create(
            &mut builder,
            &fb::BackendDelegateDataReferenceArgs {
                location: DATA_IN_SEGMENT,
                index: PAYLOAD_SEGMENT,
            },
        );
        let compile_specs = builder.create_vector::<flatbuffers::WIPOffset<fb::CompileSpec>>(&[]);
        let delegate = fb::BackendDelegate::create(
            &mut builder,
            &fb::BackendDelegateArgs {
                id: Some(id),
                processed: Some(processed),
                compile_specs: Some(compile_specs),
            },
        );

        let name = builder.create_string(self.method);
        let values = builder.create_vector(&values);
        let plan_inputs = builder.create_vector(&inputs);
        let plan_outputs = builder.create_vector(&outputs);
        let chains = builder.create_vector(&[chain]);
        let operators = builder.create_vector::<flatbuffers::WIPOffset<fb::Operator>>(&[]);
        let delegates = builder.create_vector(&[delegate]);
        let buffer_sizes = builder.create_vector(&[0i64, planned as i64]);
        let plan = fb::ExecutionPlan::create(
            &mut builder,
            &fb::ExecutionPlanArgs {
                name: Some(name),
                values: Some(values),
                inputs: Some(plan_inputs),
                outputs: Some(plan_outputs),
                chains: Some(chains),
                operators: Some(operators),
                delegates: Some(delegates),
                non_const_buffer_sizes: Some(buffer_sizes),
            },
        );

        // ExecuTorch 1.5's runtime takes constants only from a constant segment (its inline
        // constant buffers are compiled out), so there is one, empty but for the reserved entry
        // 0, as the exporter writes for a program whose constants are all external.
        let constants =
            fb::DataSegment::create(&mut builder, &fb::DataSegmentArgs { offset: 0, size: 0 });
        let payload = fb::DataSegment::create(
            &mut builder,
            &fb::DataSegmentArgs {
                offset: 0,
                size: self.payload.len() as u64,
            },
        );
        let reserved = builder.create_vector(&[0u64]);
        let constant_segment = fb::SubsegmentOffsets::create(
            &mut builder,
            &fb::SubsegmentOffsetsArgs {
                segment_index: CONSTANT_SEGMENT,
                offsets: Some(reserved),
            },
        );
        let plans = builder.create_vector(&[plan]);
        let segments = builder.create_vector(&[constants, payload]);
        let root = fb::Program::create(
            &mut builder,
            &fb::ProgramArgs {
                version: 0,
                execution_plan: Some(plans),
                segments: Some(segments),
                constant_segment: Some(constant_segment),
                ..Default::default()
            },
        );
        fb::finish_program_buffer(&mut builder, root);
        let flatbuffer = builder.finished_data();

        // Splice the header in after the identifier; the root offset moves by its length, and
        // every other offset is relative, so nothing else changes.
        let header_len = HEADER_LENGTH as usize;
        let program_size = flatbuffer.len() + header_len;
        let segment_base = program_size.next_multiple_of(SEGMENT_ALIGNMENT);
        let root_offset = u32::from_le_bytes(flatbuffer[..4].try_into().expect("4 bytes"));
        let mut out = Vec::with_capacity(segment_base + self.payload.len());
        out.extend_from_slice(&(root_offset + HEADER_LENGTH).to_le_bytes());
        out.extend_from_slice(&flatbuffer[4..HEADER_AT]);
        out.extend_from_slice(&HEADER_MAGIC);
        out.extend_from_slice(&HEADER_LENGTH.to_le_bytes());
        out.extend_from_slice(&(program_size as u64).to_le_bytes());
        out.extend_from_slice(&(segment_base as u64).to_le_bytes());
        out.extend_from_slice(&(self.payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&flatbuffer[HEADER_AT..]);
        out.resize(segment_base, 0);
        out.extend_from_slice(self.payload);
        out
    }
}

/// `BackendDelegateDataReference.location`: the processed bytes are `Program.segments[index]`.
const DATA_IN_SEGMENT: i8 = 1;
/// `Program.segments`: the (empty) constant segment, then the payload.
const CONSTANT_SEGMENT: u32 = 0;
const PAYLOAD_SEGMENT: u32 = 1;
