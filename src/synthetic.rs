//! Synthetic models with deterministic weights, for the demo, tests and benches, each with a
//! plain Rust reference to check XNNPACK's results against.

use crate::xnn::{Subgraph, ValueRole, XnnError};

/// A dense layer: `y = x · Wᵀ + b`, W stored [outputs, inputs] as XNNPACK expects.
pub struct DenseLayer {
    pub inputs: usize,
    pub outputs: usize,
    pub weights: Vec<f32>,
    pub bias: Vec<f32>,
}

/// A multi-layer perceptron with ReLU between layers and none after the last.
pub struct Mlp {
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

    pub fn input_width(&self) -> usize {
        self.layers.first().map_or(0, |l| l.inputs)
    }

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
