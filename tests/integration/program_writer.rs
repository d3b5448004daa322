//! Programs written by `xnnblob_test_support::program_writer` around generated graphs: they parse as ExecuTorch
//! programs (header, flatbuffer, segment), and xnnblob's own executor runs them to the plain Rust
//! reference. ExecuTorch's runtime runs them too: see faces/executorch/tests.

use crate::common;

use common::scratch;

use xnnblob::named_data::pte_format;
use xnnblob::program::Program;
use xnnblob_test_support::synthetic::Mlp;

#[test]
fn a_written_mlp_program_runs_to_the_reference() {
    let dir = scratch("mlp");
    let mlp = Mlp::random(&[32, 64, 48, 16], 5);
    let built = xnnblob_test_support::synthetic::mlp_payload(&mlp, 3);
    built.write_pte(&dir.join("mlp.pte"), "forward").unwrap();
    built.write_ptd(&dir.join("mlp.ptd")).unwrap();

    let bytes = std::fs::read(dir.join("mlp.pte")).unwrap();
    let header = pte_format::parse_header(&bytes)
        .unwrap()
        .expect("an eh00 header");
    assert_eq!(header.segment_data_size, built.payload.len() as u64);
    let base = header.segment_base_offset as usize;
    assert_eq!(base % 128, 0);
    assert_eq!(&bytes[base..], &built.payload[..]);

    let backend = common::new_backend();
    let program =
        Program::load(&backend, dir.join("mlp.pte"), &[dir.join("mlp.ptd")], None).unwrap();
    assert_eq!(program.method_names(), vec!["forward"]);
    assert_eq!(program.input_shapes("forward").unwrap(), vec![vec![3, 32]]);
    let mut method = program.method("forward").unwrap();
    let input: Vec<f32> = (0..96).map(|i| ((i % 11) as f32 - 5.0) / 5.0).collect();
    let out = method.execute_f32(&[&input]).unwrap();
    let reference = mlp.reference_forward(&input, 3);
    assert_eq!(out[0].len(), reference.len());
    common::close::assert_close(
        &out[0],
        &reference,
        common::close::Tolerance::Absolute(1e-4),
        "the written MLP",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
