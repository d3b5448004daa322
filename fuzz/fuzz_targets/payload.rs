//! The XNNPACK delegate payload (`XH00` header, `XN01` graph flatbuffer, inline constants) on
//! arbitrary bytes, through compilation to an XNNPACK runtime and one execute: `XnnDelegate::init`
//! must return an error or a runtime, never panic or crash in XNNPACK. Constants resolve in the
//! fixtures' named data (`xnnblob_fuzz::named_data`, built once per process), which holds every
//! key the corpus's payloads name.
//!
//! Asserted of a runtime: its payload is one `delegate::packs_weights` reads; its inputs, and its
//! outputs, come in ascending id, no id is both, their sizes do not overflow, and a run on zeroed
//! inputs of the declared shapes (when they are small) either fails cleanly or leaves every
//! output with a shape that fits the room given for it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xnnblob::delegate::XnnDelegate;
use xnnblob::tensor::{PaddedTensor, TensorMut, TensorRef};

/// Above this many bytes of inputs and outputs, a runtime is only compiled, not run: a mutated
/// shape may ask for gigabytes, which says nothing about the parser.
const RUN_LIMIT: usize = 1 << 20;

fuzz_target!(init: xnnblob_fuzz::limit_address_space(), |data: &[u8]| {
    xnnblob_fuzz::record_input(data);
    let map = xnnblob_fuzz::named_data();
    // The ExecuTorch face asks this of a payload before its init: it answers or refuses whatever
    // the bytes, and refuses nothing the init accepts.
    let payload = xnnblob_fuzz::buffer(data);
    let packs = xnnblob::delegate::packs_weights(payload.data());
    let Ok(mut delegate) = XnnDelegate::init(xnnblob_fuzz::model(), payload, &**map) else {
        return;
    };
    assert!(packs.is_ok(), "a payload init accepts is read: {packs:?}");
    let mut bytes = 0usize;
    for list in [
        delegate.inputs().collect::<Vec<_>>(),
        delegate.outputs().collect(),
    ] {
        let mut last = None;
        for e in list {
            assert!(last < Some(e.id), "externals in ascending id");
            last = Some(e.id);
            let n = e.bound.nbytes(e.dtype);
            assert!(n.is_some(), "external {} has an overflowing size", e.id);
            bytes = bytes.saturating_add(n.unwrap_or(usize::MAX));
        }
    }
    assert!(
        delegate.inputs().all(|i| delegate.outputs().all(|o| o.id != i.id)),
        "an external is both an input and an output"
    );
    if bytes > RUN_LIMIT {
        return;
    }
    let inputs: Vec<PaddedTensor> = delegate
        .inputs()
        .map(|e| PaddedTensor::zeros(e.dtype, e.bound).expect("small"))
        .collect();
    let mut outputs: Vec<PaddedTensor> = delegate
        .outputs()
        .map(|e| PaddedTensor::zeros(e.dtype, e.bound).expect("small"))
        .collect();
    let views: Vec<TensorRef<'_>> = inputs.iter().map(PaddedTensor::as_ref).collect();
    let mut outs: Vec<TensorMut<'_>> = outputs.iter_mut().map(PaddedTensor::as_mut).collect();
    if delegate.execute(&views, &mut outs).is_ok() {
        for (e, o) in delegate.outputs().zip(&outs) {
            let n = e.shape.nbytes(e.dtype);
            assert!(
                n.is_some_and(|n| n <= o.capacity()),
                "output {} of shape {} does not fit its {} bytes",
                e.id,
                e.shape,
                o.capacity()
            );
            assert_eq!(o.shape(), &e.shape, "the output records the shape written");
        }
    }
});
