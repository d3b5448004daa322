//! The per-execute cost of a small MLP, through the delegate and through a whole program's
//! method: time (criterion) and bytes the Rust allocator hands out per execute.

use criterion::{Criterion, criterion_group, criterion_main};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use xnnblob::backend::Backend;
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{InMemoryMap, NamedDataMap};
use xnnblob::tensor::{Shape, TensorMut, TensorRef};
use xnnblob_test_support::synthetic::Mlp;

/// Counts the bytes and calls of every allocation, so the bench can report both per execute.
struct Counting;
static BYTES: AtomicUsize = AtomicUsize::new(0);
static CALLS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocated_per_call(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    let (b, c) = (BYTES.load(Ordering::Relaxed), CALLS.load(Ordering::Relaxed));
    for _ in 0..runs {
        f();
    }
    (
        (BYTES.load(Ordering::Relaxed) - b) as f64 / runs as f64,
        (CALLS.load(Ordering::Relaxed) - c) as f64 / runs as f64,
    )
}

fn delegate_execute(c: &mut Criterion) {
    let mlp = Mlp::random(&[32, 64, 48, 16], 21);
    let built = xnnblob_test_support::synthetic::mlp_payload(&mlp, 2);
    let map = built.map("mlp").unwrap();
    let mut holder = InMemoryMap::new("payload");
    holder.insert("p", &built.payload, 64, None).unwrap();
    let backend = Backend::with_defaults().unwrap();
    let model = backend.model(None).unwrap();
    let mut d = XnnDelegate::init(&model, holder.get_data("p").unwrap(), &map).unwrap();
    let input: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
    let shape = Shape::new(&[2, 32]).unwrap();
    let mut out = vec![0f32; 32];
    let mut run = || {
        d.execute(
            &[TensorRef::f32(shape, &input)],
            &mut [TensorMut::f32(&mut out)],
        )
        .unwrap()
    };
    run();
    let (bytes, calls) = allocated_per_call(100, &mut run);
    println!(
        "delegate execute, MLP 32-64-48-16 batch 2: {bytes:.0} bytes in {calls:.1} allocations per execute"
    );
    c.bench_function("delegate execute: MLP 32-64-48-16, batch 2", |b| {
        b.iter(&mut run)
    });
}

fn method_execute(c: &mut Criterion) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch");
    let backend = Backend::with_defaults().unwrap();
    let program = xnnblob::program::Program::load(
        &backend,
        dir.join("mlp_xnn_inline.pte"),
        &[] as &[&str],
        None,
    )
    .unwrap();
    let mut m = program.method("forward").unwrap();
    let shape = m.input_specs()[0].bound;
    let n = shape.numel().unwrap();
    let input: Vec<f32> = (0..n).map(|i| i as f32 / n as f32).collect();
    let mut run = || {
        m.execute(&[TensorRef::f32(shape, &input)]).unwrap();
        std::hint::black_box(m.output(0).unwrap().data());
    };
    run();
    let (bytes, calls) = allocated_per_call(100, &mut run);
    println!(
        "method execute, mlp_xnn_inline.pte: {bytes:.0} bytes in {calls:.1} allocations per execute"
    );
    c.bench_function("method execute: mlp_xnn_inline.pte", |b| b.iter(&mut run));
}

criterion_group!(benches, delegate_execute, method_execute);
criterion_main!(benches);
