//! A prompt's prefill as an LLM app runs it: feed-forward blocks of 8da4w layers (qd8
//! activations, 4-bit blockwise weights with bf16 scales) over a batch of token rows, written as
//! ExecuTorch's exporter writes such a program (`<name>.pte`, weights inside). The batch is what
//! a prefill changes: XNNPACK runs its rows in tiles of the GEMM's row count, so the kernels a
//! prompt of T tokens runs, and the tiles it wastes, follow from T.

use crate::builder::{BuiltGraph, GraphBuilder};
use crate::synthetic::SplitMix64;
use crate::synthetic::model::QB4W_GROUP;
use std::path::{Path, PathBuf};

/// The shape of a Llama-style feed-forward stack, and the prompt's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillSpec {
    /// Token rows of the batch (the prompt's length).
    pub tokens: u32,
    /// The model's width.
    pub width: u32,
    /// The feed-forward layers' inner width.
    pub hidden: u32,
    /// Feed-forward blocks, each `down(silu(gate(x)) * up(x)) + x`.
    pub blocks: u32,
}

impl PrefillSpec {
    /// Four blocks of width 1024 and inner width 2816 (a small Llama's), over `tokens` rows.
    pub fn ffn(tokens: u32) -> PrefillSpec {
        PrefillSpec {
            tokens,
            width: 1024,
            hidden: 2816,
            blocks: 4,
        }
    }

    /// The program's file stem (`prefill-8da4w-4x1024x2816-t16`).
    pub fn name(&self) -> String {
        format!(
            "prefill-8da4w-{}x{}x{}-t{}",
            self.blocks, self.width, self.hidden, self.tokens
        )
    }

    /// The deterministic input: `tokens x width` fp32 values in [-1, 1).
    pub fn input(&self) -> Vec<f32> {
        (0..self.tokens as usize * self.width as usize)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) / 11.0)
            .collect()
    }

    /// The program: input `[tokens, width]`, output of the same shape.
    pub fn build(&self) -> BuiltGraph {
        let mut rng = SplitMix64(0xF00D ^ u64::from(self.width));
        let mut g = GraphBuilder::new();
        let mut x = g.input(&[self.tokens, self.width]);
        for _ in 0..self.blocks {
            let xq = g.convert_qd8(x);
            let gate = qb4w_layer(&mut g, &mut rng, self.hidden, self.width);
            let gate = g.fully_connected(xq, gate, None, f32::NEG_INFINITY, f32::INFINITY);
            let up = qb4w_layer(&mut g, &mut rng, self.hidden, self.width);
            let up = g.fully_connected(xq, up, None, f32::NEG_INFINITY, f32::INFINITY);
            let sigmoid = g.sigmoid(gate);
            let silu = g.multiply(gate, sigmoid);
            let h = g.multiply(silu, up);
            let hq = g.convert_qd8(h);
            let down = qb4w_layer(&mut g, &mut rng, self.width, self.hidden);
            let down = g.fully_connected(hq, down, None, f32::NEG_INFINITY, f32::INFINITY);
            x = g.add(down, x, f32::NEG_INFINITY, f32::INFINITY);
        }
        g.output(x);
        g.finish()
    }

    /// Writes `<name>.pte` (method `forward`), `<name>.ptd` and its input `<name>.input.f32` into `dir` unless
    /// they are there, and says where they are.
    pub fn ensure(&self, dir: &Path) -> std::io::Result<PrefillFiles> {
        let files = PrefillFiles {
            pte: dir.join(format!("{}.pte", self.name())),
            ptd: dir.join(format!("{}.ptd", self.name())),
            input: dir.join(format!("{}.input.f32", self.name())),
        };
        if files.pte.is_file() && files.ptd.is_file() && files.input.is_file() {
            return Ok(files);
        }
        std::fs::create_dir_all(dir)?;
        let input: Vec<u8> = self.input().iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&files.input, input)?;
        let built = self.build();
        built
            .write_ptd(&files.ptd)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        built
            .write_pte(&files.pte, "forward")
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(files)
    }
}

/// Where a prefill program's files are.
#[derive(Debug, Clone)]
pub struct PrefillFiles {
    /// The program.
    pub pte: PathBuf,
    /// Its weights, as named data.
    pub ptd: PathBuf,
    /// Its input, raw little-endian fp32.
    pub input: PathBuf,
}

/// A `[outputs, inputs]` qb4w weight of random nibbles, scaled so that a layer keeps its input's
/// size.
fn qb4w_layer(
    g: &mut GraphBuilder,
    rng: &mut SplitMix64,
    outputs: u32,
    inputs: u32,
) -> crate::builder::Value {
    let nibbles: Vec<u8> = (0..outputs * inputs / 2)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let scale = super::model::bf16(1.7 / 8.0 / (inputs as f32).sqrt());
    let scales = vec![scale; (outputs * (inputs / QB4W_GROUP)) as usize];
    g.constant_qb4w(&[outputs, inputs], &nibbles, &scales, QB4W_GROUP)
}
