//! A stateful program from C++ with a C++ memory bank (hooks/stateful_checks.cc).

use crate::common::scratch;
use xnnblob::named_data::NamedBlobStore;
use xnnblob_test_support::builder::GraphBuilder;

#[test]
fn a_cpp_bank_through_the_bridge_gets_initial_state_only_through_its_copy_function() {
    let dir = scratch("cpp-bank");
    let mut g = GraphBuilder::new();
    let count = g.input(&[1]);
    let one = g.constant_f32(&[1], &[1.0]);
    let next = g.add(count, one, f32::NEG_INFINITY, f32::INFINITY);
    g.output(next);
    let written = g.output_copy(next);
    let (count_id, written_id) = (g.external_id(count), g.external_id(written));
    let tick = g.finish();
    let mut store = NamedBlobStore::new();
    for (k, v) in &tick.blobs {
        store.add_named_blob(k, v, 16, "m", None).unwrap();
    }
    store
        .add_named_blob("count_init", &5.0f32.to_le_bytes(), 16, "m", None)
        .unwrap();
    store
        .add_named_blob("slack", &[0; 64], 16, "m", None)
        .unwrap();
    let ptd = dir.join("counter.ptd");
    store.write_ptd("m", &ptd).unwrap();
    let report = xnnblob_checks::cpp_stateful_counter(
        ptd.to_str().unwrap(),
        &tick.payload,
        count_id,
        written_id,
    )
    .unwrap_or_else(|e| panic!("{}", e.what()));
    assert_eq!(report, "counter ok");
    std::fs::remove_dir_all(&dir).unwrap();
}
