//! A plain Rust reference for XNNPACK graphs of dynamically quantized fully connected layers, as
//! ExecuTorch's exporter writes them: `Convert` (fp32 to qdint8, one zero point and scale per
//! row) followed by `FullyConnected` with qcint8, qcint4 or qbint4 weights and an fp32 bias.
//!
//! It reads the graph from a fixture's manifest (the decoded delegate) and the weights through
//! the program's named data, dequantizes them and multiplies in f64: no XNNPACK, no xnnblob
//! delegate code. Activations are quantized exactly as XNNPACK's qd8 convert does (range widened
//! to include 0, 255 steps, zero point nudged to the nearer end, ties rounded to even), so what
//! remains between it and a kernel is the order of float additions.

use serde_json::Value;
use std::collections::HashMap;
use xnnblob::named_data::NamedDataMap;

/// A value computed by the reference: row-major with its dims.
#[derive(Clone)]
enum Tensor {
    F32 {
        dims: Vec<usize>,
        data: Vec<f32>,
    },
    /// Per row: quantized values, zero point and scale (real = (q - zero_point) * scale).
    Qd8 {
        dims: Vec<usize>,
        data: Vec<i8>,
        rows: Vec<(i32, f32)>,
    },
}

/// Weights of a fully connected layer, dequantized: `[out][in]`.
struct Weights {
    out: usize,
    input: usize,
    w: Vec<f64>,
}

fn bytes(map: &dyn NamedDataMap, delegate: &Value, index: u64) -> Vec<u8> {
    let entry = &delegate["constant_data"][index as usize];
    let key = entry["named_key"].as_str().expect("named_key");
    assert!(!key.is_empty(), "constant {index} is not named data");
    map.get_data(key)
        .unwrap_or_else(|e| panic!("named data {key}: {e}"))
        .data()
        .to_vec()
}

fn f32_le(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bf16_le(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f32::from_bits((u16::from_le_bytes(c.try_into().unwrap()) as u32) << 16))
        .collect()
}

/// The i-th 4-bit value of a `[rows][cols]` matrix stored two per byte, even column in the low
/// nibble, each row padded to a whole byte, as unsigned `value + 8`.
fn nibble(packed: &[u8], cols: usize, row: usize, col: usize) -> i32 {
    let row_bytes = cols.div_ceil(2);
    let byte = packed[row * row_bytes + col / 2];
    let v = if col.is_multiple_of(2) {
        byte & 0xF
    } else {
        byte >> 4
    };
    v as i32 - 8
}

fn dequantized_filter(map: &dyn NamedDataMap, delegate: &Value, value: &Value) -> Weights {
    let dims: Vec<usize> = value["dims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(dims.len(), 2, "filter dims {dims:?}");
    let (out, input) = (dims[0], dims[1]);
    let q = &value["quant"];
    assert_eq!(q["channel_dim"], 0, "only [out, in] filters");
    let raw = bytes(
        map,
        delegate,
        value["constant_buffer_idx"].as_u64().unwrap(),
    );
    let scale_idx = q["scale_buffer_idx"].as_u64().expect("scales in a buffer");
    let scale_bytes = bytes(map, delegate, scale_idx);
    let mut w = vec![0f64; out * input];
    match (
        value["datatype"].as_str().unwrap(),
        q["type"].as_str().unwrap(),
    ) {
        ("xnn_datatype_qcint8", "PerChannelQuant") => {
            let s = f32_le(&scale_bytes);
            for o in 0..out {
                for i in 0..input {
                    w[o * input + i] = raw[o * input + i] as i8 as f64 * s[o] as f64;
                }
            }
        }
        ("xnn_datatype_qcint4", "PerChannelQuant") => {
            let s = f32_le(&scale_bytes);
            for o in 0..out {
                for i in 0..input {
                    w[o * input + i] = nibble(&raw, input, o, i) as f64 * s[o] as f64;
                }
            }
        }
        ("xnn_datatype_qbint4", "PerChannelGroupQuant") => {
            let group = q["group_size"].as_u64().unwrap() as usize;
            let s = bf16_le(&scale_bytes);
            let blocks = input / group;
            assert_eq!(s.len(), out * blocks);
            for o in 0..out {
                for i in 0..input {
                    w[o * input + i] =
                        nibble(&raw, input, o, i) as f64 * s[o * blocks + i / group] as f64;
                }
            }
        }
        (dt, qt) => panic!("reference has no {dt} with {qt}"),
    }
    Weights { out, input, w }
}

/// XNNPACK's per-row asymmetric int8 quantization of fp32 activations.
fn quantize_rows(x: &[f32], cols: usize) -> (Vec<i8>, Vec<(i32, f32)>) {
    let mut q = Vec::with_capacity(x.len());
    let mut rows = Vec::new();
    for row in x.chunks_exact(cols) {
        let min = row.iter().copied().fold(0f32, f32::min);
        let max = row.iter().copied().fold(0f32, f32::max);
        let inv = if min == max { 1.0 } else { 255.0 / (max - min) };
        let (lo, hi) = (min * inv, max * inv);
        let zp = if (-128.0 + lo) + (127.0 + hi) > 0.0 {
            -128.0 - lo
        } else {
            127.0 - hi
        };
        let zp = zp.clamp(-128.0, 127.0).round_ties_even() as i32;
        for &v in row {
            let scaled = (v * inv).clamp((-128 - zp) as f32, (127 - zp) as f32);
            q.push((scaled.round_ties_even() as i32 + zp) as i8);
        }
        rows.push((zp, 1.0 / inv));
    }
    (q, rows)
}

/// Runs the manifest's first delegate on `input` (its first external input) and returns its
/// first output.
pub fn run(manifest: &Value, map: &dyn NamedDataMap, input: &[f32]) -> Vec<f32> {
    let delegate = &manifest["delegates"][0];
    let values: HashMap<u64, &Value> = delegate["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["id"].as_u64().unwrap(), v))
        .collect();
    let dims_of = |id: u64| -> Vec<usize> {
        values[&id]["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect()
    };
    let mut env: HashMap<u64, Tensor> = HashMap::new();
    let in_id = delegate["input_ids"][0].as_u64().unwrap();
    env.insert(
        in_id,
        Tensor::F32 {
            dims: dims_of(in_id),
            data: input.to_vec(),
        },
    );
    for node in delegate["nodes"].as_array().unwrap() {
        match node["type"].as_str().unwrap() {
            "XNNConvert" => {
                let Tensor::F32 { dims, data } = env[&node["input_id"].as_u64().unwrap()].clone()
                else {
                    panic!("convert from a non-f32 value")
                };
                let cols = *dims.last().unwrap();
                let (q, rows) = quantize_rows(&data, cols);
                env.insert(
                    node["output_id"].as_u64().unwrap(),
                    Tensor::Qd8 {
                        dims,
                        data: q,
                        rows,
                    },
                );
            }
            "XNNFullyConnected" => {
                assert_eq!(node["flags"], 0, "transposed or reshaped fully connected");
                let Tensor::Qd8 { dims, data, rows } =
                    env[&node["input1_id"].as_u64().unwrap()].clone()
                else {
                    panic!("fully connected on a non-qd8 input")
                };
                let filter =
                    dequantized_filter(map, delegate, values[&node["filter_id"].as_u64().unwrap()]);
                assert_eq!(*dims.last().unwrap(), filter.input);
                let bias = match node["bias_id"].as_u64() {
                    Some(id) if id != u32::MAX as u64 => f32_le(&bytes(
                        map,
                        delegate,
                        values[&id]["constant_buffer_idx"].as_u64().unwrap(),
                    )),
                    _ => vec![0.0; filter.out],
                };
                let (lo, hi) = match &node["output_min_max"] {
                    Value::Null => (f64::NEG_INFINITY, f64::INFINITY),
                    m => (
                        m["output_min"].as_f64().unwrap_or(f64::NEG_INFINITY),
                        m["output_max"].as_f64().unwrap_or(f64::INFINITY),
                    ),
                };
                let mut out = Vec::with_capacity(rows.len() * filter.out);
                for (r, &(zp, scale)) in rows.iter().enumerate() {
                    let a = &data[r * filter.input..(r + 1) * filter.input];
                    for (w, b) in filter.w.chunks_exact(filter.input).zip(&bias) {
                        let dot: f64 = a
                            .iter()
                            .zip(w)
                            .map(|(&q, &w)| (q as i32 - zp) as f64 * w)
                            .sum();
                        out.push((dot * scale as f64 + *b as f64).clamp(lo, hi) as f32);
                    }
                }
                let mut out_dims = dims.clone();
                *out_dims.last_mut().unwrap() = filter.out;
                env.insert(
                    node["output_id"].as_u64().unwrap(),
                    Tensor::F32 {
                        dims: out_dims,
                        data: out,
                    },
                );
            }
            other => panic!("reference has no {other} node"),
        }
    }
    match env.remove(&delegate["output_ids"][0].as_u64().unwrap()) {
        Some(Tensor::F32 { data, .. }) => data,
        _ => panic!("output is not an f32 value"),
    }
}
