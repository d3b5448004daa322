//! Programs described by an `NAME.io.json` (steps of inputs and ExecuTorch's outputs, each a raw
//! little-endian file with its dtype and shape), as ExecuTorch's exporter scripts write them.

use serde_json::Value;
use std::path::Path;
use xnnblob::tensor::{DType, Shape, to_f32_lossy};

/// The io.json of program `name` in `dir`.
pub fn io(dir: &Path, name: &str) -> Value {
    let path = dir.join(format!("{name}.io.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// The program `io` describes (its `.pte` and `.ptd` files in `dir`), loaded through `backend`
/// with `cache`; panics naming `name` if it cannot be.
pub fn load(
    backend: &xnnblob::backend::Backend,
    dir: &Path,
    io: &Value,
    name: &str,
    cache: Option<&xnnblob::backend::WeightsCacheChoice>,
) -> xnnblob::program::Program {
    let data: Vec<std::path::PathBuf> = io["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| dir.join(d.as_str().unwrap()))
        .collect();
    xnnblob::program::Program::load(
        backend,
        dir.join(io["program"].as_str().unwrap()),
        &data,
        cache,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A tensor of an io.json step, its file in `dir`: dtype, shape, bytes.
pub fn tensor(dir: &Path, t: &Value) -> (DType, Shape, Vec<u8>) {
    let dtype = DType::parse(t["dtype"].as_str().unwrap()).unwrap();
    let dims: Vec<usize> = t["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let bytes = std::fs::read(dir.join(t["file"].as_str().unwrap())).unwrap();
    (dtype, Shape::new(&dims).unwrap(), bytes)
}

/// Max |ours - ExecuTorch's| over the range of ExecuTorch's output; a NaN counts as infinite,
/// and outputs of different lengths fail.
pub fn relative_error(dtype: DType, ours: &[u8], theirs: &[u8]) -> f32 {
    let (a, b) = (to_f32_lossy(dtype, ours), to_f32_lossy(dtype, theirs));
    assert_eq!(a.len(), b.len(), "output lengths");
    super::close::relative_difference(&a, &b)
}

/// Runs every step of `io` (files in `dir`) on one loaded method, so state carries from step to
/// step; checks each output's dtype and actual shape, and that ExecuTorch's output is not
/// constant (a constant one would check nothing). Returns the worst [`relative_error`].
pub fn run_steps(
    dir: &Path,
    io: &Value,
    method: &mut xnnblob::program::Method,
    name: &str,
    require_varied: bool,
) -> f32 {
    let mut worst = 0f32;
    for step in io["steps"].as_array().unwrap() {
        let inputs: Vec<(DType, Shape, Vec<u8>)> = step["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| tensor(dir, t))
            .collect();
        let views: Vec<xnnblob::tensor::TensorRef<'_>> = inputs
            .iter()
            .map(|(d, s, b)| xnnblob::tensor::TensorRef::new(*d, *s, b))
            .collect();
        method
            .execute(&views)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, expected) in step["outputs_et"].as_array().unwrap().iter().enumerate() {
            let (dtype, shape, bytes) = tensor(dir, expected);
            if require_varied {
                let values = to_f32_lossy(dtype, &bytes);
                assert!(
                    values.iter().any(|v| *v != values[0]),
                    "{name} output {i}: ExecuTorch's output is constant, so it checks nothing"
                );
            }
            let out = method.output(i).unwrap();
            assert_eq!(out.dtype(), dtype, "{name} output {i}");
            assert_eq!(*out.shape(), shape, "{name} output {i}: the actual shape");
            worst = worst.max(relative_error(dtype, out.data(), &bytes));
        }
    }
    worst
}

/// The `--call` value (`xnnblob run`, `xnnblob-et-run`) for one call of a `NAME.calls.json`, its
/// files in `dir`: `METHOD:INPUT,...`.
pub fn call_arg(dir: &Path, call: &Value) -> String {
    let inputs: Vec<String> = call["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| dir.join(t["file"].as_str().unwrap()).display().to_string())
        .collect();
    format!("{}:{}", call["method"].as_str().unwrap(), inputs.join(","))
}

/// A `NAME.calls.json` of one call followed by calls of one method, staged for `--times`: the
/// repeated calls' inputs copied into `into` as `in{I}.{STEP}.bin`, so that one `--call` with
/// `{step}` in its paths reads each iteration's own.
pub struct RepeatedCall<'a> {
    /// The call before the repeated ones.
    pub first: &'a Value,
    /// The method called again.
    pub method: String,
    /// How many times it is called (`--times`).
    pub times: usize,
    /// Its `--call` value: `METHOD:into/in0.{step}.bin,...`.
    pub call_arg: String,
}

/// Stages the calls of `description` (a `NAME.calls.json` whose files are in `dir`) as a
/// [`RepeatedCall`], asserting that every call after the first calls one method.
pub fn repeated_call<'a>(dir: &Path, description: &'a Value, into: &Path) -> RepeatedCall<'a> {
    let calls = description["calls"].as_array().unwrap();
    let (first, repeated) = calls.split_first().unwrap();
    let method = repeated[0]["method"].as_str().unwrap().to_string();
    assert!(
        repeated.iter().all(|c| c["method"] == method.as_str()),
        "one method after the first call"
    );
    std::fs::create_dir_all(into).unwrap();
    let count = repeated[0]["inputs"].as_array().unwrap().len();
    for (step, call) in repeated.iter().enumerate() {
        for (i, t) in call["inputs"].as_array().unwrap().iter().enumerate() {
            let file = dir.join(t["file"].as_str().unwrap());
            std::fs::copy(file, into.join(format!("in{i}.{step}.bin"))).unwrap();
        }
    }
    let templates: Vec<String> = (0..count)
        .map(|i| {
            into.join(format!("in{i}.{{step}}.bin"))
                .display()
                .to_string()
        })
        .collect();
    RepeatedCall {
        first,
        call_arg: format!("{method}:{}", templates.join(",")),
        method,
        times: repeated.len(),
    }
}
