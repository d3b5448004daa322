//! Synthetic models with deterministic weights, for the demo, tests and benches, each with a
//! plain Rust reference to check XNNPACK's results against.

pub mod model;
pub mod prefill;

use xnnblob::xnn::{Subgraph, ValueRole, XnnError};

/// A dense layer: `y = x · Wᵀ + b`, W stored [outputs, inputs] as XNNPACK expects.
pub struct DenseLayer {
    /// Width of the input rows (elements of `x`).
    pub inputs: usize,
    /// Width of the output rows (elements of `y`).
    pub outputs: usize,
    /// The weight matrix W, row-major `[outputs, inputs]`.
    pub weights: Vec<f32>,
    /// The bias b, one value per output.
    pub bias: Vec<f32>,
}

/// A multi-layer perceptron with ReLU between layers and none after the last.
pub struct Mlp {
    /// The layers, first (input side) to last.
    pub layers: Vec<DenseLayer>,
}

/// External id of the MLP's input in its subgraph.
pub const MLP_INPUT: u32 = 0;
/// External id of the MLP's output in its subgraph.
pub const MLP_OUTPUT: u32 = 1;

impl Mlp {
    /// An MLP with layer widths `widths` (`widths.len() - 1` layers) and weights drawn from
    /// `seed`, scaled so activations stay of order one.
    pub fn random(widths: &[usize], seed: u64) -> Mlp {
        let mut rng = SplitMix64(seed);
        let layers = widths
            .windows(2)
            .map(|w| {
                let (inputs, outputs) = (w[0], w[1]);
                let scale = 1.0 / (inputs as f32).sqrt();
                DenseLayer {
                    inputs,
                    outputs,
                    weights: (0..inputs * outputs).map(|_| rng.unit() * scale).collect(),
                    bias: (0..outputs).map(|_| rng.unit() * 0.1).collect(),
                }
            })
            .collect();
        Mlp { layers }
    }

    /// Elements per input row (the first layer's inputs; 0 with no layers).
    pub fn input_width(&self) -> usize {
        self.layers.first().map_or(0, |l| l.inputs)
    }

    /// Elements per output row (the last layer's outputs; 0 with no layers).
    pub fn output_width(&self) -> usize {
        self.layers.last().map_or(0, |l| l.outputs)
    }

    /// Plain f32 evaluation of `batch` rows of `input`.
    pub fn reference_forward(&self, input: &[f32], batch: usize) -> Vec<f32> {
        let mut x = input.to_vec();
        for (n, layer) in self.layers.iter().enumerate() {
            let last = n + 1 == self.layers.len();
            let mut y = vec![0f32; batch * layer.outputs];
            for b in 0..batch {
                let row = &x[b * layer.inputs..(b + 1) * layer.inputs];
                for o in 0..layer.outputs {
                    let w = &layer.weights[o * layer.inputs..(o + 1) * layer.inputs];
                    let dot: f32 = row.iter().zip(w).map(|(a, b)| a * b).sum();
                    let v = dot + layer.bias[o];
                    y[b * layer.outputs + o] = if last { v } else { v.max(0.0) };
                }
            }
            x = y;
        }
        x
    }

    /// The MLP as an XNNPACK subgraph over `batch` rows, input [`MLP_INPUT`] and output
    /// [`MLP_OUTPUT`]; the weights are borrowed, not copied.
    pub fn subgraph(&self, batch: usize) -> Result<Subgraph<'_>, XnnError> {
        let mut g = Subgraph::new(2)?;
        let mut x =
            g.define_f32_tensor(&[batch, self.input_width()], ValueRole::Input(MLP_INPUT))?;
        for (n, layer) in self.layers.iter().enumerate() {
            let last = n + 1 == self.layers.len();
            let w = g.define_f32_tensor(
                &[layer.outputs, layer.inputs],
                ValueRole::static_f32(&layer.weights),
            )?;
            let b = g.define_f32_tensor(&[layer.outputs], ValueRole::static_f32(&layer.bias))?;
            let role = if last {
                ValueRole::Output(MLP_OUTPUT)
            } else {
                ValueRole::Internal
            };
            let y = g.define_f32_tensor(&[batch, layer.outputs], role)?;
            let min = if last { f32::NEG_INFINITY } else { 0.0 };
            g.define_fully_connected(x, w, Some(b), y, min, f32::INFINITY)?;
            x = y;
        }
        Ok(g)
    }
}

/// A small deterministic generator (SplitMix64): same seed, same model, on every machine.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next value of the sequence, uniform over all of `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// The MLP as an ExecuTorch-style XNNPACK payload over named data (see
/// [`GraphBuilder`](crate::builder::GraphBuilder)): input `[batch, in]`.
pub fn mlp_payload(mlp: &Mlp, batch: u32) -> crate::builder::BuiltGraph {
    let mut g = crate::builder::GraphBuilder::new();
    let mut x = g.input(&[batch, mlp.input_width() as u32]);
    for (i, l) in mlp.layers.iter().enumerate() {
        let w = g.constant_f32(&[l.outputs as u32, l.inputs as u32], &l.weights);
        let b = g.constant_f32(&[l.outputs as u32], &l.bias);
        let min = if i + 1 == mlp.layers.len() {
            f32::NEG_INFINITY
        } else {
            0.0
        };
        x = g.fully_connected(x, w, Some(b), min, f32::INFINITY);
    }
    g.output(x);
    g.finish()
}

/// A small CNN payload: conv 3x3 (relu), depthwise 3x3 (relu), global average pooling, fully
/// connected, softmax; input `[1, h, w, 3]` NHWC, `classes` outputs.
pub fn cnn_payload(h: u32, w: u32, classes: u32, seed: u64) -> crate::builder::BuiltGraph {
    use crate::builder::{ConvGeometry, GraphBuilder};
    let (ci, co) = (3u32, 8u32);
    let mut rng = SplitMix64(seed);
    let mut random =
        |n: u32, scale: f32| -> Vec<f32> { (0..n).map(|_| rng.unit() * scale).collect() };
    let mut g = GraphBuilder::new();
    let x = g.input(&[1, h, w, ci]);
    let f1 = g.constant_f32(&[co, 3, 3, ci], &random(co * 9 * ci, 0.4));
    let b1 = g.constant_f32(&[co], &random(co, 0.1));
    let y = g.conv2d(
        x,
        f1,
        Some(b1),
        ConvGeometry::square(3, 1),
        0.0,
        f32::INFINITY,
    );
    let fd = g.constant_f32(&[1, 3, 3, co], &random(9 * co, 0.4));
    let bd = g.constant_f32(&[co], &random(co, 0.1));
    let y = g.depthwise_conv2d(
        y,
        fd,
        Some(bd),
        ConvGeometry::square(3, 1),
        0.0,
        f32::INFINITY,
    );
    let y = g.global_avg_pool(y);
    let y = g.reshape(y, &[1, co]);
    let wf = g.constant_f32(&[classes, co], &random(classes * co, 0.5));
    let bf = g.constant_f32(&[classes], &random(classes, 0.1));
    let y = g.fully_connected(y, wf, Some(bf), f32::NEG_INFINITY, f32::INFINITY);
    let y = g.softmax(y);
    g.output(y);
    g.finish()
}

/// A dynamically quantized MLP payload (qd8 activations, qc8w weights with one fp32 scale per
/// output channel): input `[batch, widths[0]]`.
pub fn qd8_mlp_payload(widths: &[u32], batch: u32, seed: u64) -> crate::builder::BuiltGraph {
    let mut rng = SplitMix64(seed);
    let mut g = crate::builder::GraphBuilder::new();
    let mut x = g.input(&[batch, widths[0]]);
    for (i, w) in widths.windows(2).enumerate() {
        let (cols, rows) = (w[0], w[1]);
        let q: Vec<i8> = (0..rows * cols)
            .map(|_| ((rng.next_u64() % 255) as i32 - 127) as i8)
            .collect();
        let scales: Vec<f32> = (0..rows).map(|r| 0.004 + 0.001 * (r % 5) as f32).collect();
        let bias: Vec<f32> = (0..rows).map(|r| (r as f32 * 0.37).sin() * 0.1).collect();
        let xq = g.convert_qd8(x);
        let wv = g.constant_qc8w(&[rows, cols], &q, &scales);
        let bv = g.constant_f32(&[rows], &bias);
        let last = i + 2 == widths.len();
        let min = if last { f32::NEG_INFINITY } else { 0.0 };
        x = g.fully_connected(xq, wv, Some(bv), min, f32::INFINITY);
    }
    g.output(x);
    g.finish()
}
