//! Writes XNNPACK delegate payloads (and the named data their constants live in), as
//! ExecuTorch's exporter does, so that synthetic models of any size can be made without Python:
//! constants are keyed by the sha256 hex of their bytes, scales by `scale_<sha256>`.

use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, WIPOffset};
use std::path::Path;
use xnnblob::delegate::payload::{FLATBUFFER_ALIGNMENT, HEADER_LENGTH, PayloadHeader};
use xnnblob::named_data::{InMemoryMap, NamedBlobStore, NamedDataError, StoreError};
use xnnblob::schema::xnn as fb;
use xnnblob::sha256::{sha256, to_hex};

mod encode;

const EXTERNAL_INPUT: u32 = 1;
const EXTERNAL_OUTPUT: u32 = 2;

/// A value of the graph being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Value(u32);

enum Quant {
    Channel {
        scale_idx: u32,
        channel_dim: i32,
    },
    ChannelGroup {
        /// The bf16 scales' constant, or 0 where they are written inline as fp32.
        scale_idx: u32,
        channel_dim: i32,
        group_size: i32,
    },
    TokenDynamic {
        num_nonbatch_dims: i32,
    },
}

struct ValueSpec {
    datatype: fb::XNNDatatype,
    dims: Vec<u32>,
    constant: u32,
    external_id: u32,
    flags: u32,
    quant: Option<Quant>,
    /// Blockwise scales written inline in the payload as fp32, as exporters before bf16 scale
    /// buffers wrote them.
    inline_scales: Option<Vec<f32>>,
}

/// Convolution geometry (NHWC input, filters `[out, kh, kw, in / groups]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Kernel size in pixels: (height, width).
    pub kernel: (u32, u32),
    /// Step between output pixels, in input pixels: (vertical, horizontal).
    pub stride: (u32, u32),
    /// Implicit zero padding of the input, in pixels: top, right, bottom, left.
    pub padding: [u32; 4],
    /// Spacing between kernel taps, in input pixels (1: dense): (vertical, horizontal).
    pub dilation: (u32, u32),
}

impl ConvGeometry {
    /// A `k`x`k` kernel, stride 1, padding `p` all round.
    pub fn square(k: u32, p: u32) -> ConvGeometry {
        ConvGeometry {
            kernel: (k, k),
            stride: (1, 1),
            padding: [p; 4],
            dilation: (1, 1),
        }
    }

    fn out(&self, h: u32, w: u32) -> (u32, u32) {
        let span = |size: u32, pad: u32, k: u32, d: u32, s: u32| {
            ((size + pad).saturating_sub((k - 1) * d + 1)) / s + 1
        };
        (
            span(
                h,
                self.padding[0] + self.padding[2],
                self.kernel.0,
                self.dilation.0,
                self.stride.0,
            ),
            span(
                w,
                self.padding[1] + self.padding[3],
                self.kernel.1,
                self.dilation.1,
                self.stride.1,
            ),
        )
    }
}

enum Node {
    FullyConnected {
        input: u32,
        filter: u32,
        bias: Option<u32>,
        output: u32,
    },
    Conv {
        depthwise: bool,
        geometry: ConvGeometry,
        groups: u32,
        group_in: u32,
        group_out: u32,
        input: u32,
        filter: u32,
        bias: Option<u32>,
        output: u32,
    },
    Binary {
        kind: fb::XNodeUnion,
        a: u32,
        b: u32,
        output: u32,
    },
    Unary {
        kind: fb::XNodeUnion,
        input: u32,
        output: u32,
        flags: u32,
    },
    Reshape {
        shape: Vec<u32>,
        input: u32,
        output: u32,
    },
    Pad {
        pre: Vec<u32>,
        post: Vec<u32>,
        value: f32,
        input: u32,
        output: u32,
    },
    Transpose {
        perm: Vec<u32>,
        input: u32,
        output: u32,
    },
    Slice {
        offsets: Vec<u32>,
        sizes: Vec<u32>,
        input: u32,
        output: u32,
    },
    Elu {
        alpha: f32,
        input: u32,
        output: u32,
    },
    Attention {
        query: u32,
        key: u32,
        value: u32,
        scale: u32,
        mask: u32,
        output: u32,
    },
    Concat2 {
        axis: u32,
        a: u32,
        b: u32,
        output: u32,
    },
}

/// Builds one delegate payload.
#[derive(Default)]
pub struct GraphBuilder {
    values: Vec<ValueSpec>,
    nodes: Vec<(Node, Option<(f32, f32)>)>,
    /// constant_data entries after the reserved index 0: their named keys.
    constants: Vec<String>,
    blobs: Vec<(String, Vec<u8>)>,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    externs: u32,
}

/// A built payload and the named data it refers to.
pub struct BuiltGraph {
    /// The delegate payload (ExecuTorch's "processed" bytes): `XH00` header, `XN01` flatbuffer.
    pub payload: Vec<u8>,
    /// (key, bytes), each key once.
    pub blobs: Vec<(String, Vec<u8>)>,
    /// The graph's inputs and outputs (fp32, or fp16 from [`GraphBuilder::input_f16`]), by
    /// external id: what a program around it plans.
    pub externals: Vec<crate::program_writer::External>,
}

impl BuiltGraph {
    /// The blobs as a `.ptd` at `path` (alignment 16, as ExecuTorch requests for XNNPACK).
    pub fn write_ptd(&self, path: &Path) -> Result<(), StoreError> {
        let mut store = NamedBlobStore::new();
        for (key, bytes) in &self.blobs {
            store.add_named_blob(key, bytes, 16, "model", None)?;
        }
        // XNNPACK may read past a constant: keep the last one away from the end of the file.
        store.add_named_blob("xnnblob.slack", &[0; 64], 16, "model", None)?;
        store.write_ptd("model", path)
    }

    /// An ExecuTorch program (`.pte`) whose method `method` is this graph, fully delegated to
    /// `XnnpackBackend`; its weights are the `.ptd` of [`write_ptd`](Self::write_ptd).
    pub fn write_pte(&self, path: &Path, method: &str) -> Result<(), StoreError> {
        let program = crate::program_writer::DelegatedProgram {
            method,
            payload: &self.payload,
            externals: &self.externals,
        };
        program.write(path)
    }

    /// The blobs as an in-memory map.
    pub fn map(&self, name: &str) -> Result<InMemoryMap, NamedDataError> {
        let mut map = InMemoryMap::new(name);
        for (key, bytes) in &self.blobs {
            map.insert(key, bytes, 64, None)?;
        }
        Ok(map)
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    fn value(&mut self, datatype: fb::XNNDatatype, dims: Vec<u32>) -> Value {
        self.values.push(ValueSpec {
            datatype,
            dims,
            constant: 0,
            external_id: u32::MAX,
            flags: 0,
            quant: None,
            inline_scales: None,
        });
        Value(self.values.len() as u32 - 1)
    }

    /// The dims of a value.
    pub fn dims(&self, v: Value) -> &[u32] {
        &self.values[v.0 as usize].dims
    }

    /// Adds a named blob (once per key) and a constant_data entry for it.
    fn constant_entry(&mut self, key: String, bytes: Vec<u8>) -> u32 {
        if !self.blobs.iter().any(|(k, _)| *k == key) {
            self.blobs.push((key.clone(), bytes));
        }
        self.constants.push(key);
        self.constants.len() as u32
    }

    /// An fp32 external input.
    pub fn input(&mut self, dims: &[u32]) -> Value {
        let v = self.value(fb::XNNDatatype::xnn_datatype_fp32, dims.to_vec());
        let spec = &mut self.values[v.0 as usize];
        spec.external_id = self.externs;
        spec.flags = EXTERNAL_INPUT;
        self.externs += 1;
        self.inputs.push(v.0);
        v
    }

    /// An fp16 external input: the nodes it feeds compute in fp16 (fully connected layers write
    /// fp16 outputs).
    pub fn input_f16(&mut self, dims: &[u32]) -> Value {
        let v = self.input(dims);
        self.values[v.0 as usize].datatype = fb::XNNDatatype::xnn_datatype_fp16;
        v
    }

    /// The external id of an input or output value.
    pub fn external_id(&self, v: Value) -> u32 {
        self.values[v.0 as usize].external_id
    }

    /// Writes `v` to a new external output through an explicit copy node (a state write-back):
    /// the output can then be bound to the same memory as an input the graph read earlier.
    pub fn output_copy(&mut self, v: Value) -> Value {
        let dims = self.dims(v).to_vec();
        let out = self.reshape(v, &dims);
        self.output(out);
        out
    }

    /// Makes `v` an external output (of its own datatype).
    pub fn output(&mut self, v: Value) {
        let spec = &mut self.values[v.0 as usize];
        spec.external_id = self.externs;
        spec.flags |= EXTERNAL_OUTPUT;
        self.externs += 1;
        self.outputs.push(v.0);
    }

    /// An fp32 constant, stored as named data keyed by its sha256.
    pub fn constant_f32(&mut self, dims: &[u32], data: &[f32]) -> Value {
        assert_eq!(
            dims.iter().product::<u32>() as usize,
            data.len(),
            "constant size"
        );
        let bytes = f32_bytes(data);
        let idx = self.constant_entry(to_hex(&sha256(&bytes)), bytes);
        let v = self.value(fb::XNNDatatype::xnn_datatype_fp32, dims.to_vec());
        self.values[v.0 as usize].constant = idx;
        v
    }

    /// An fp16 constant (`bits`: IEEE half-precision bit patterns), stored as named data keyed
    /// by its sha256.
    pub fn constant_f16(&mut self, dims: &[u32], bits: &[u16]) -> Value {
        assert_eq!(
            dims.iter().product::<u32>() as usize,
            bits.len(),
            "constant size"
        );
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let idx = self.constant_entry(to_hex(&sha256(&bytes)), bytes);
        let v = self.value(fb::XNNDatatype::xnn_datatype_fp16, dims.to_vec());
        self.values[v.0 as usize].constant = idx;
        v
    }

    /// Per-channel int8 weights `[out, in]` with one fp32 scale per output channel (qc8w),
    /// scales stored as named data `scale_<sha256>` as ExecuTorch does.
    pub fn constant_qc8w(&mut self, dims: &[u32], q: &[i8], scales: &[f32]) -> Value {
        assert_eq!(
            dims.iter().product::<u32>() as usize,
            q.len(),
            "weights size"
        );
        assert_eq!(
            dims[0] as usize,
            scales.len(),
            "one scale per output channel"
        );
        let bytes: Vec<u8> = q.iter().map(|v| *v as u8).collect();
        let idx = self.constant_entry(to_hex(&sha256(&bytes)), bytes);
        let scale_bytes = f32_bytes(scales);
        let scale_idx = self.constant_entry(
            format!("scale_{}", to_hex(&sha256(&scale_bytes))),
            scale_bytes,
        );
        let v = self.value(fb::XNNDatatype::xnn_datatype_qcint8, dims.to_vec());
        let spec = &mut self.values[v.0 as usize];
        spec.constant = idx;
        spec.quant = Some(Quant::Channel {
            scale_idx,
            channel_dim: 0,
        });
        v
    }

    /// Blockwise 4-bit weights `[out, in]` (two per byte, value + 8, even column in the low
    /// nibble) with one bf16 scale per `group_size` inputs of each output (qb4w).
    pub fn constant_qb4w(
        &mut self,
        dims: &[u32],
        packed: &[u8],
        bf16_scales: &[u16],
        group_size: u32,
    ) -> Value {
        let v = self.qb4w_value(dims, packed, group_size);
        let scale_bytes: Vec<u8> = bf16_scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let scale_idx = self.constant_entry(
            format!("scale_{}", to_hex(&sha256(&scale_bytes))),
            scale_bytes,
        );
        if let Some(Quant::ChannelGroup { scale_idx: at, .. }) =
            &mut self.values[v.0 as usize].quant
        {
            *at = scale_idx;
        }
        v
    }

    /// As [`constant_qb4w`](Self::constant_qb4w), with the scales written inline as fp32 (the
    /// `scale` field, no scale buffer), as ExecuTorch's exporters before 0.7 wrote them.
    pub fn constant_qb4w_inline_scales(
        &mut self,
        dims: &[u32],
        packed: &[u8],
        scales: &[f32],
        group_size: u32,
    ) -> Value {
        let v = self.qb4w_value(dims, packed, group_size);
        self.values[v.0 as usize].inline_scales = Some(scales.to_vec());
        v
    }

    /// A blockwise 4-bit constant of `packed`, its scales not yet given (constant 0: inline).
    fn qb4w_value(&mut self, dims: &[u32], packed: &[u8], group_size: u32) -> Value {
        let bytes = packed.to_vec();
        let idx = self.constant_entry(to_hex(&sha256(&bytes)), bytes);
        let v = self.value(fb::XNNDatatype::xnn_datatype_qbint4, dims.to_vec());
        let spec = &mut self.values[v.0 as usize];
        spec.constant = idx;
        spec.quant = Some(Quant::ChannelGroup {
            scale_idx: 0,
            channel_dim: 0,
            group_size: group_size as i32,
        });
        v
    }

    fn node(&mut self, node: Node, clamp: Option<(f32, f32)>) {
        self.nodes.push((node, clamp));
    }

    fn fp32(&mut self, dims: Vec<u32>) -> Value {
        self.value(fb::XNNDatatype::xnn_datatype_fp32, dims)
    }

    /// `clamp(x · filterᵀ + bias, min, max)`; filter `[out, in]`.
    pub fn fully_connected(
        &mut self,
        x: Value,
        filter: Value,
        bias: Option<Value>,
        min: f32,
        max: f32,
    ) -> Value {
        let mut dims = self.dims(x).to_vec();
        *dims.last_mut().expect("input has dims") = self.dims(filter)[0];
        // fp16 in, fp16 out; fp32 and dynamically quantized inputs give fp32.
        let out = if self.values[x.0 as usize].datatype == fb::XNNDatatype::xnn_datatype_fp16 {
            self.value(fb::XNNDatatype::xnn_datatype_fp16, dims)
        } else {
            self.fp32(dims)
        };
        self.node(
            Node::FullyConnected {
                input: x.0,
                filter: filter.0,
                bias: bias.map(|b| b.0),
                output: out.0,
            },
            Some((min, max)),
        );
        out
    }

    /// fp32 → dynamically quantized int8, one scale per row (qd8).
    pub fn convert_qd8(&mut self, x: Value) -> Value {
        let dims = self.dims(x).to_vec();
        let out = self.value(fb::XNNDatatype::xnn_datatype_qdint8, dims);
        self.values[out.0 as usize].quant = Some(Quant::TokenDynamic {
            num_nonbatch_dims: 1,
        });
        self.node(
            Node::Unary {
                kind: fb::XNodeUnion::XNNConvert,
                input: x.0,
                output: out.0,
                flags: 0,
            },
            None,
        );
        out
    }

    /// 2-D convolution of an NHWC input with filter `[out, kh, kw, in]`.
    pub fn conv2d(
        &mut self,
        x: Value,
        filter: Value,
        bias: Option<Value>,
        geometry: ConvGeometry,
        min: f32,
        max: f32,
    ) -> Value {
        let [n, h, w, cin] = self.dims(x).try_into().expect("NHWC input");
        let cout = self.dims(filter)[0];
        let (oh, ow) = geometry.out(h, w);
        let out = self.fp32(vec![n, oh, ow, cout]);
        self.node(
            Node::Conv {
                depthwise: false,
                geometry,
                groups: 1,
                group_in: cin,
                group_out: cout,
                input: x.0,
                filter: filter.0,
                bias: bias.map(|b| b.0),
                output: out.0,
            },
            Some((min, max)),
        );
        out
    }

    /// Depthwise convolution (multiplier 1) of an NHWC input with filter `[1, kh, kw, C]`.
    pub fn depthwise_conv2d(
        &mut self,
        x: Value,
        filter: Value,
        bias: Option<Value>,
        geometry: ConvGeometry,
        min: f32,
        max: f32,
    ) -> Value {
        let [n, h, w, c] = self.dims(x).try_into().expect("NHWC input");
        let (oh, ow) = geometry.out(h, w);
        let out = self.fp32(vec![n, oh, ow, c]);
        self.node(
            Node::Conv {
                depthwise: true,
                geometry,
                groups: c,
                group_in: 1,
                group_out: 1,
                input: x.0,
                filter: filter.0,
                bias: bias.map(|b| b.0),
                output: out.0,
            },
            Some((min, max)),
        );
        out
    }

    /// Global average pooling of NHWC to `[N, 1, 1, C]`.
    pub fn global_avg_pool(&mut self, x: Value) -> Value {
        let d = self.dims(x).to_vec();
        let out = self.fp32(vec![d[0], 1, 1, d[3]]);
        self.node(
            Node::Unary {
                kind: fb::XNodeUnion::XNNGlobalAvgPooling2d,
                input: x.0,
                output: out.0,
                flags: xnnpack_sys::XNN_FLAG_KEEP_DIMS,
            },
            None,
        );
        out
    }

    fn binary(
        &mut self,
        kind: fb::XNodeUnion,
        a: Value,
        b: Value,
        clamp: Option<(f32, f32)>,
    ) -> Value {
        let dims = self.dims(a).to_vec();
        let out = self.fp32(dims);
        self.node(
            Node::Binary {
                kind,
                a: a.0,
                b: b.0,
                output: out.0,
            },
            clamp,
        );
        out
    }

    /// `clamp(a + b, min, max)` elementwise, fp32, of `a`'s shape.
    pub fn add(&mut self, a: Value, b: Value, min: f32, max: f32) -> Value {
        self.binary(fb::XNodeUnion::XNNAdd, a, b, Some((min, max)))
    }

    /// `a * b` elementwise, fp32, of `a`'s shape.
    pub fn multiply(&mut self, a: Value, b: Value) -> Value {
        self.binary(fb::XNodeUnion::XNNMultiply, a, b, None)
    }

    fn unary(&mut self, kind: fb::XNodeUnion, x: Value, clamp: Option<(f32, f32)>) -> Value {
        let dims = self.dims(x).to_vec();
        // fp16 in, fp16 out; fp32 otherwise.
        let out = if self.values[x.0 as usize].datatype == fb::XNNDatatype::xnn_datatype_fp16 {
            self.value(fb::XNNDatatype::xnn_datatype_fp16, dims)
        } else {
            self.fp32(dims)
        };
        self.node(
            Node::Unary {
                kind,
                input: x.0,
                output: out.0,
                flags: 0,
            },
            clamp,
        );
        out
    }

    /// A one-input node of `kind` (an element-wise node of ExecuTorch's schema: XNNSigmoid,
    /// XNNTanh, ...), of `x`'s datatype and shape.
    pub fn unary_node(&mut self, kind: fb::XNodeUnion, x: Value) -> Value {
        self.unary(kind, x, None)
    }

    /// A two-input element-wise node of `kind` (XNNSubtract, XNNDiv, XNNMinimum, ...), fp32, of
    /// `a`'s shape.
    pub fn binary_node(&mut self, kind: fb::XNodeUnion, a: Value, b: Value) -> Value {
        self.binary(kind, a, b, None)
    }

    /// `x` where positive, `alpha * (exp(x) - 1)` elsewhere.
    pub fn elu(&mut self, x: Value, alpha: f32) -> Value {
        let dims = self.dims(x).to_vec();
        let out = self.fp32(dims);
        self.node(
            Node::Elu {
                alpha,
                input: x.0,
                output: out.0,
            },
            None,
        );
        out
    }

    /// `softmax(query · keyᵀ · scale + mask) · value`: query [H, T, C], key and value [H, S, C],
    /// scale [C], mask [T, S]; the output has query's shape.
    pub fn attention(
        &mut self,
        query: Value,
        key: Value,
        value: Value,
        scale: Value,
        mask: Value,
    ) -> Value {
        let dims = self.dims(query).to_vec();
        let out = self.fp32(dims);
        self.node(
            Node::Attention {
                query: query.0,
                key: key.0,
                value: value.0,
                scale: scale.0,
                mask: mask.0,
                output: out.0,
            },
            None,
        );
        out
    }

    /// `clamp(x, min, max)` elementwise.
    pub fn clamp(&mut self, x: Value, min: f32, max: f32) -> Value {
        self.unary(fb::XNodeUnion::XNNClamp, x, Some((min, max)))
    }

    /// `1 / (1 + exp(-x))` elementwise (of `x`'s datatype).
    pub fn sigmoid(&mut self, x: Value) -> Value {
        self.unary(fb::XNodeUnion::XNNSigmoid, x, None)
    }

    /// Softmax of `x` over its last dimension (of `x`'s datatype).
    pub fn softmax(&mut self, x: Value) -> Value {
        self.unary(fb::XNodeUnion::XNNSoftmax, x, None)
    }

    /// `x` with the dims `shape` (the same number of elements).
    pub fn reshape(&mut self, x: Value, shape: &[u32]) -> Value {
        let out = self.fp32(shape.to_vec());
        self.node(
            Node::Reshape {
                shape: shape.to_vec(),
                input: x.0,
                output: out.0,
            },
            None,
        );
        out
    }

    /// `x` padded with `value`: `pre[i]` elements before and `post[i]` after dimension `i`.
    pub fn pad(&mut self, x: Value, pre: &[u32], post: &[u32], value: f32) -> Value {
        let dims = self.dims(x).to_vec();
        let out = self.fp32(
            dims.iter()
                .zip(pre.iter().zip(post))
                .map(|(d, (a, b))| d + a + b)
                .collect(),
        );
        self.node(
            Node::Pad {
                pre: pre.to_vec(),
                post: post.to_vec(),
                value,
                input: x.0,
                output: out.0,
            },
            None,
        );
        out
    }

    /// `x` with its dimensions permuted: output dimension `i` is input dimension `perm[i]`.
    pub fn transpose(&mut self, x: Value, perm: &[u32]) -> Value {
        let d = self.dims(x).to_vec();
        let out = self.fp32(perm.iter().map(|&p| d[p as usize]).collect());
        self.node(
            Node::Transpose {
                perm: perm.to_vec(),
                input: x.0,
                output: out.0,
            },
            None,
        );
        out
    }

    /// `x[offsets .. offsets + sizes]`.
    pub fn slice(&mut self, x: Value, offsets: &[u32], sizes: &[u32]) -> Value {
        let out = self.fp32(sizes.to_vec());
        self.node(
            Node::Slice {
                offsets: offsets.to_vec(),
                sizes: sizes.to_vec(),
                input: x.0,
                output: out.0,
            },
            None,
        );
        out
    }

    /// `concat(a, b)` along `axis`.
    pub fn concat2(&mut self, a: Value, b: Value, axis: u32) -> Value {
        let mut dims = self.dims(a).to_vec();
        dims[axis as usize] += self.dims(b)[axis as usize];
        let out = self.fp32(dims);
        self.node(
            Node::Concat2 {
                axis,
                a: a.0,
                b: b.0,
                output: out.0,
            },
            None,
        );
        out
    }
}
