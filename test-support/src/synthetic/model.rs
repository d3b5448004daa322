//! Whole synthetic programs of any size (the load benchmark's, the demo's, the tests'), written like ExecuTorch's exporter writes them: an
//! XNNPACK payload (`<name>.xnn`), its weights as named data (`<name>.ptd`), and the payload as a
//! program (`<name>.pte`) for ExecuTorch's runtime.

use crate::builder::{ConvGeometry, GraphBuilder};
use crate::synthetic::SplitMix64;
use std::path::{Path, PathBuf};

/// The architecture of a benchmark model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// A long chain of fully connected layers, as an on-device LLM has (1184 weights by default).
    LlmLike,
    /// Convolutions and depthwise convolutions.
    Cnn,
}

/// The weight type of a benchmark model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// fp32 weights and activations.
    Fp32,
    /// qd8 activations, qc8w weights (one fp32 scale per output channel).
    Qd8,
    /// qd8 activations, qb4w weights: 4-bit, one bf16 scale per [`QB4W_GROUP`] inputs of each
    /// output (the format on-device LLMs export).
    Qb4w,
}

/// Inputs per bf16 scale of the qb4w models.
pub const QB4W_GROUP: u32 = 32;

/// A benchmark model: what [`ensure`] generates, and what its file names record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// The architecture.
    pub preset: Preset,
    /// The weight type (the CNN is fp32 only).
    pub dtype: Dtype,
    /// Total bytes of weights, in MiB.
    pub mib: usize,
    /// Weighted layers (fully connected, or convolutions for the CNN).
    pub layers: usize,
}

impl ModelSpec {
    /// An llm-like model of about `mib` MiB of `dtype` weights, in 1184 fully connected layers.
    pub fn llm_like(mib: usize, dtype: Dtype) -> ModelSpec {
        ModelSpec {
            preset: Preset::LlmLike,
            dtype,
            mib,
            layers: 1184,
        }
    }

    /// A CNN of about `mib` MiB of fp32 weights, in 32 convolution + depthwise layers.
    pub fn cnn(mib: usize) -> ModelSpec {
        ModelSpec {
            preset: Preset::Cnn,
            dtype: Dtype::Fp32,
            mib,
            layers: 32,
        }
    }

    /// Bits per weight, scales left out.
    fn element_bits(&self) -> usize {
        match self.dtype {
            Dtype::Fp32 => 32,
            Dtype::Qd8 => 8,
            Dtype::Qb4w => 4,
        }
    }

    /// The width (features or channels) that gives `mib` MiB over `layers` layers.
    pub fn width(&self) -> u32 {
        let per_layer = (self.mib << 20) * 8 / self.layers.max(1) / self.element_bits();
        let per_layer = match self.preset {
            Preset::LlmLike => per_layer,
            Preset::Cnn => per_layer / 9,
        };
        // qb4w rows hold whole scale groups.
        let step = match self.dtype {
            Dtype::Qb4w => QB4W_GROUP,
            _ => 16,
        };
        ((per_layer as f64).sqrt() as u32 / step * step).max(step)
    }

    /// The model's file stem: preset, dtype, MiB, layers and width
    /// (`llm-like-fp32-512mib-1184x<width>`).
    pub fn name(&self) -> String {
        let preset = match self.preset {
            Preset::LlmLike => "llm-like",
            Preset::Cnn => "cnn",
        };
        let dtype = match self.dtype {
            Dtype::Fp32 => "fp32",
            Dtype::Qd8 => "qd8-qc8w",
            Dtype::Qb4w => "qd8-qb4w",
        };
        format!(
            "{preset}-{dtype}-{}mib-{}x{}",
            self.mib,
            self.layers,
            self.width()
        )
    }

    /// Bytes of weights actually generated (qb4w's scales included).
    pub fn weight_bytes(&self) -> usize {
        let w = self.width() as usize;
        let per = match self.preset {
            Preset::LlmLike => w * w,
            Preset::Cnn => 9 * w * w + 9 * w,
        };
        let scales = match self.dtype {
            Dtype::Fp32 => 0,
            Dtype::Qd8 => w * 4,
            Dtype::Qb4w => w * (w / QB4W_GROUP as usize) * 2,
        };
        (per * self.element_bits() / 8 + scales) * self.layers
    }

    /// The deterministic input every launch of the model gets ([`input_len`](Self::input_len)
    /// values in [-1, 1)).
    pub fn input(&self) -> Vec<f32> {
        (0..self.input_len())
            .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
            .collect()
    }

    /// Writes [`input`](Self::input) to `path` as raw little-endian f32 (what `xnnblob run
    /// --input` and `xnnblob-et-run --input` read).
    pub fn write_input(&self, path: &Path) -> std::io::Result<()> {
        let bytes: Vec<u8> = self.input().iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes)
    }

    /// The model's input length (fp32 elements).
    pub fn input_len(&self) -> usize {
        match self.preset {
            Preset::LlmLike => self.width() as usize,
            Preset::Cnn => 8 * 8 * self.width() as usize,
        }
    }
}

/// Where a model's files are.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// The XNNPACK delegate payload (`<name>.xnn`).
    pub payload: PathBuf,
    /// The weights as named data (`<name>.ptd`).
    pub ptd: PathBuf,
    /// The payload as an ExecuTorch program (method `forward`), for ExecuTorch's runtime.
    pub pte: PathBuf,
}

/// Writes the model into `dir` unless it is there already.
pub fn ensure(spec: &ModelSpec, dir: &Path) -> std::io::Result<ModelFiles> {
    let files = ModelFiles {
        payload: dir.join(format!("{}.xnn", spec.name())),
        ptd: dir.join(format!("{}.ptd", spec.name())),
        pte: dir.join(format!("{}.pte", spec.name())),
    };
    if files.payload.exists() && files.ptd.exists() && files.pte.exists() {
        return Ok(files);
    }
    std::fs::create_dir_all(dir)?;
    let built = build(spec);
    built
        .write_ptd(&files.ptd)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    built
        .write_pte(&files.pte, "forward")
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    std::fs::write(&files.payload, &built.payload)?;
    Ok(files)
}

/// `x` rounded to bfloat16 (to nearest, ties to even), as its bits.
pub(crate) fn bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

fn build(spec: &ModelSpec) -> crate::builder::BuiltGraph {
    let w = spec.width();
    let mut rng = SplitMix64(0x5EED ^ spec.layers as u64);
    let mut g = GraphBuilder::new();
    match spec.preset {
        Preset::LlmLike => {
            let mut x = g.input(&[1, w]);
            let scale = 1.0 / (w as f32).sqrt();
            for i in 0..spec.layers {
                let last = i + 1 == spec.layers;
                let min = if last { f32::NEG_INFINITY } else { 0.0 };
                x = match spec.dtype {
                    Dtype::Fp32 => {
                        let data: Vec<f32> = (0..w * w).map(|_| rng.unit() * scale * 1.7).collect();
                        let wv = g.constant_f32(&[w, w], &data);
                        g.fully_connected(x, wv, None, min, f32::INFINITY)
                    }
                    Dtype::Qd8 => {
                        let q: Vec<i8> = (0..w * w)
                            .map(|_| ((rng.next_u64() % 255) as i32 - 127) as i8)
                            .collect();
                        let scales: Vec<f32> = (0..w).map(|_| scale * 1.7 / 127.0).collect();
                        let xq = g.convert_qd8(x);
                        let wv = g.constant_qc8w(&[w, w], &q, &scales);
                        g.fully_connected(xq, wv, None, min, f32::INFINITY)
                    }
                    Dtype::Qb4w => {
                        let nibbles: Vec<u8> =
                            (0..w * w / 2).map(|_| rng.next_u64() as u8).collect();
                        // A 4-bit weight is -8..7: scale so that a layer keeps its input's size.
                        let group_scale = bf16(scale * 1.7 / 8.0);
                        let scales = vec![group_scale; (w * (w / QB4W_GROUP)) as usize];
                        let xq = g.convert_qd8(x);
                        let wv = g.constant_qb4w(&[w, w], &nibbles, &scales, QB4W_GROUP);
                        g.fully_connected(xq, wv, None, min, f32::INFINITY)
                    }
                };
            }
            g.output(x);
        }
        Preset::Cnn => {
            let mut x = g.input(&[1, 8, 8, w]);
            let scale = 1.0 / ((9 * w) as f32).sqrt();
            let geometry = ConvGeometry::square(3, 1);
            for _ in 0..spec.layers {
                let f: Vec<f32> = (0..9 * w * w).map(|_| rng.unit() * scale * 1.7).collect();
                let fv = g.constant_f32(&[w, 3, 3, w], &f);
                x = g.conv2d(x, fv, None, geometry, 0.0, f32::INFINITY);
                let d: Vec<f32> = (0..9 * w).map(|_| rng.unit() * 0.5).collect();
                let dv = g.constant_f32(&[1, 3, 3, w], &d);
                x = g.depthwise_conv2d(x, dv, None, geometry, 0.0, f32::INFINITY);
            }
            let x = g.global_avg_pool(x);
            let x = g.reshape(x, &[1, w]);
            g.output(x);
        }
    }
    g.finish()
}
