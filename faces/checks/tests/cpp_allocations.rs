//! A warm execute from C++ allocates nothing: a delegate made and held by C++, run through the
//! C++ span `execute` (hooks/delegate_checks.cc) 100 times after warm-up, counted by a global
//! allocator. Its own binary, so that no other test's allocations are counted.

use xnnblob_test_support as common;

use common::counting::{Counting, allocations};
use xnnblob_test_support::synthetic::Mlp;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_warm_execute_from_cpp_allocates_nothing() {
    let dir = common::scratch("alloc");
    let mlp = Mlp::random(&[32, 64, 48, 16], 21);
    let built = xnnblob_test_support::synthetic::mlp_payload(&mlp, 2);
    let ptd = dir.join("mlp.ptd");
    built.write_ptd(&ptd).unwrap();
    let mut d = xnnblob_checks::cpp_make_delegate(ptd.to_str().unwrap(), &built.payload).unwrap();
    let input: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
    let shape = [2usize, 32];
    let mut out = vec![0f32; 32];
    xnnblob_checks::cpp_execute_f32(d.pin_mut(), &input, &shape, &mut out).unwrap();
    let first = out.clone();
    let n = allocations(|| {
        for _ in 0..100 {
            xnnblob_checks::cpp_execute_f32(d.pin_mut(), &input, &shape, &mut out).unwrap();
        }
    });
    assert_eq!(n, 0, "allocations in 100 warm executes from C++");
    assert_eq!(out, first);
    let reference = mlp.reference_forward(&input, 2);
    assert_eq!(out.len(), reference.len());
    common::close::assert_close(
        &out,
        &reference,
        common::close::Tolerance::Absolute(1e-4),
        "the MLP",
    );
}
