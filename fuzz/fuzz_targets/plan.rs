//! Whole `.pte` programs on arbitrary bytes, through `Program::load` (the header, the program
//! flatbuffer, its named data merged with the fixtures' external named data) and every method's
//! loading (the execution-plan reader: values, inputs and outputs, instructions, delegate
//! payloads inline or in segments, constants in the constant segment; each delegate compiled to
//! XNNPACK; mutable buffers, the shared state, write-backs and expand_copy), then one execute
//! on zeroed inputs; first, the check for shared buffers frozen into
//! delegates (`frozen_buffer_suspects`). Each step must return an error or work, never panic or
//! crash. The bytes are written to a scratch file first: programs load from a path.
//!
//! Asserted: a method asked for by a name the program lacks is `NoSuchMethod`; a loaded method
//! declares the inputs `Program::input_specs` reported; after a successful run every output is
//! readable and holds its shape's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use xnnblob::backend::WeightsCacheChoice;
use xnnblob::named_data::NamedDataMap;
use xnnblob::program::{Program, ProgramError};
use xnnblob::tensor::PaddedTensor;

/// As in the `payload` target: huge declared shapes are loaded but not run.
const RUN_LIMIT: usize = 1 << 20;

fuzz_target!(init: xnnblob_fuzz::limit_address_space(), |data: &[u8]| {
    xnnblob_fuzz::record_input(data);
    let path = xnnblob_fuzz::scratch_file("input.pte", data);
    // The frozen-buffer check reads the plans and every payload's constant table, and hashes
    // zeros only for sizes of constants the file holds: an error or an answer, never a crash.
    if let Ok(map) = xnnblob::named_data::FileDataMap::open(&path) {
        let _ = xnnblob::program::frozen_buffer_suspects(&map);
    }
    let external: Arc<dyn NamedDataMap> = xnnblob_fuzz::named_data().clone();
    let Ok(program) = Program::load_with_maps(
        xnnblob_fuzz::backend(),
        &path,
        vec![external],
        Some(&WeightsCacheChoice::Disabled),
    ) else {
        return;
    };
    let names: Vec<String> = program.method_names().iter().map(|s| s.to_string()).collect();
    let missing = "\u{0}not a method";
    if !names.iter().any(|n| n == missing) {
        assert!(matches!(
            program.method(missing),
            Err(ProgramError::NoSuchMethod { .. })
        ));
    }
    for name in &names {
        let specs = program.input_specs(name);
        let Ok(mut method) = program.method(name) else {
            continue;
        };
        let specs = specs.expect("a method that loads has input specs");
        assert_eq!(method.input_specs(), specs, "{name}: one plan, one reading");
        let bytes = specs.iter().try_fold(0usize, |total, s| {
            total.checked_add(s.bound.nbytes(s.dtype)?)
        });
        if bytes.is_none_or(|b| b > RUN_LIMIT) {
            continue;
        }
        let inputs: Vec<PaddedTensor> = specs
            .iter()
            .map(|s| PaddedTensor::zeros(s.dtype, s.bound).expect("small"))
            .collect();
        let views: Vec<_> = inputs.iter().map(PaddedTensor::as_ref).collect();
        if method.execute(&views).is_ok() {
            for i in 0..method.num_outputs() {
                let out = method.output(i).expect("an output below the count");
                let n = out.shape().nbytes(out.dtype()).expect("a real shape");
                assert!(out.data().len() >= n, "{name}: output {i} short of its shape");
            }
        }
    }
});
