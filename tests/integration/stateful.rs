//! Stateful programs: state shared by methods through one arena, written back by explicit copy
//! nodes, initial state through each bank's copy function.

use crate::common;

use common::scratch;

use memmap2::{Mmap, MmapMut};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use xnnblob::named_data::{DataBuffer, FileDataMap, InMemoryMap, NamedBlobStore, NamedDataMap};
use xnnblob::state::{
    HostBank, InitialState, Instance, MemoryBank, StateLayout, StateSpec, StatefulMethod,
    StatefulProgram,
};
use xnnblob_test_support::builder::{BuiltGraph, ConvGeometry, GraphBuilder};
use xnnblob_test_support::synthetic::SplitMix64;

const D: usize = 8;
const W: usize = 4;
const SRC: usize = 16;

struct Weights {
    enc: Vec<f32>, // [D, SRC]
    inp: Vec<f32>, // [D, D]
    out: Vec<f32>, // [D, W*D]
}

fn weights() -> Weights {
    let mut rng = SplitMix64(99);
    let mut r = |n: usize, s: f32| (0..n).map(|_| rng.unit() * s).collect::<Vec<f32>>();
    Weights {
        enc: r(D * SRC, 0.3),
        inp: r(D * D, 0.4),
        out: r(D * W * D, 0.2),
    }
}

fn fc(x: &[f32], w: &[f32], rows: usize) -> Vec<f32> {
    let cols = x.len();
    (0..rows)
        .map(|o| (0..cols).map(|k| x[k] * w[o * cols + k]).sum())
        .collect()
}

/// The Rust reference of the toy.
struct Reference {
    cross: Vec<f32>,
    window: Vec<f32>, // [W, D]
}

impl Reference {
    fn new() -> Reference {
        Reference {
            cross: vec![0.0; D],
            window: vec![0.0; W * D],
        }
    }
    fn encode(&mut self, w: &Weights, x: &[f32]) {
        self.cross = fc(x, &w.enc, D).iter().map(|v| v.max(0.0)).collect();
    }
    fn decode(&mut self, w: &Weights, tok: &[f32]) -> Vec<f32> {
        let h = fc(tok, &w.inp, D);
        self.window.drain(..D);
        self.window.extend(h);
        let y = fc(&self.window, &w.out, D);
        y.iter().zip(&self.cross).map(|(a, b)| a + b).collect()
    }
}

fn payload(b: &BuiltGraph) -> DataBuffer {
    let mut m = InMemoryMap::new("payload");
    m.insert("p", &b.payload, 64, None).unwrap();
    m.get_data("p").unwrap()
}

/// encode: cross = relu(x · Wencᵀ) → state "cross".
/// decode_step: h = tok · Winᵀ; self = concat(self[1:], h) → state "self";
///              out = flatten(self) · Woutᵀ + cross.
fn toy(dir: &Path) -> Arc<StatefulProgram> {
    toy_with(dir, &default_model())
}

fn toy_with(dir: &Path, model: &xnnblob::backend::ModelContext) -> Arc<StatefulProgram> {
    let w = weights();
    let mut enc = GraphBuilder::new();
    let x = enc.input(&[1, SRC as u32]);
    let wv = enc.constant_f32(&[D as u32, SRC as u32], &w.enc);
    let c = enc.fully_connected(x, wv, None, 0.0, f32::INFINITY);
    let cross_out = enc.output_copy(c);
    let cross_w = enc.external_id(cross_out);
    let enc = enc.finish();

    let mut dec = GraphBuilder::new();
    let tok = dec.input(&[1, D as u32]);
    let cross_in = dec.input(&[1, D as u32]);
    let self_in = dec.input(&[W as u32, D as u32]);
    let wi = dec.constant_f32(&[D as u32, D as u32], &w.inp);
    let h = dec.fully_connected(tok, wi, None, f32::NEG_INFINITY, f32::INFINITY);
    let kept = dec.slice(self_in, &[1, 0], &[(W - 1) as u32, D as u32]);
    let window = dec.concat2(kept, h, 0);
    let flat = dec.reshape(window, &[1, (W * D) as u32]);
    let wo = dec.constant_f32(&[D as u32, (W * D) as u32], &w.out);
    let y = dec.fully_connected(flat, wo, None, f32::NEG_INFINITY, f32::INFINITY);
    let out = dec.add(y, cross_in, f32::NEG_INFINITY, f32::INFINITY);
    dec.output(out);
    let self_out = dec.output_copy(window);
    let ids = (
        dec.external_id(cross_in),
        dec.external_id(self_in),
        dec.external_id(self_out),
    );
    let dec = dec.finish();

    let mut store = NamedBlobStore::new();
    for (k, v) in enc.blobs.iter().chain(&dec.blobs) {
        store.add_named_blob(k, v, 16, "model", None).unwrap();
    }
    store
        .add_named_blob("slack", &[0; 64], 16, "model", None)
        .unwrap();
    let ptd = dir.join("model.ptd");
    store.write_ptd("model", &ptd).unwrap();
    let map: Arc<dyn NamedDataMap> = Arc::new(FileDataMap::open_ptd(&ptd).unwrap());
    let specs = vec![
        StateSpec {
            name: "cross".into(),
            shape: vec![1, D],
            bank: 0,
            initial: InitialState::Zeros,
        },
        StateSpec {
            name: "self".into(),
            shape: vec![W, D],
            bank: 0,
            initial: InitialState::Zeros,
        },
    ];
    let methods = vec![
        StatefulMethod {
            name: "encode".into(),
            payload: payload(&enc),
            reads: vec![],
            writes: vec![(cross_w, "cross".into())],
        },
        StatefulMethod {
            name: "decode_step".into(),
            payload: payload(&dec),
            reads: vec![(ids.0, "cross".into()), (ids.1, "self".into())],
            writes: vec![(ids.2, "self".into())],
        },
    ];
    Arc::new(StatefulProgram::new(model, specs, methods, map).unwrap())
}

fn source(seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..SRC).map(|_| rng.unit()).collect()
}

fn token(step: usize) -> Vec<f32> {
    (0..D)
        .map(|i| ((step * 7 + i * 3) % 11) as f32 / 11.0 - 0.5)
        .collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-4)
}

fn run_steps(inst: &mut Instance, reference: &mut Reference, w: &Weights, steps: usize) {
    for step in 0..steps {
        let out = inst.execute("decode_step", &[&token(step)]).unwrap();
        let want = reference.decode(w, &token(step));
        assert!(
            close(&out[0], &want),
            "step {step}: {:?} vs {want:?}",
            out[0]
        );
    }
}

#[test]
fn encoder_decoder_toy_matches_reference_for_16_steps_and_resets() {
    let dir = scratch("toy");
    let program = toy(&dir);
    let w = weights();
    let mut inst = program.instantiate().unwrap();
    let mut reference = Reference::new();
    assert!(inst.execute("encode", &[&source(1)]).unwrap().is_empty());
    reference.encode(&w, &source(1));
    assert!(close(&inst.read_state("cross").unwrap(), &reference.cross));
    run_steps(&mut inst, &mut reference, &w, 16);
    assert!(close(&inst.read_state("self").unwrap(), &reference.window));

    inst.reset().unwrap();
    assert!(inst.read_state("cross").unwrap().iter().all(|v| *v == 0.0));
    assert!(inst.read_state("self").unwrap().iter().all(|v| *v == 0.0));
    let mut fresh = Reference::new();
    run_steps(&mut inst, &mut fresh, &w, 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stateful_program_with_a_cache_file_packs_nothing_on_its_second_launch() {
    use xnnblob::backend::{Backend, WeightsCacheChoice};
    let dir = scratch("toy-file-cache");
    let cache = WeightsCacheChoice::File(dir.join("toy.xbc"));
    let launch = || {
        let backend = Backend::with_defaults().unwrap();
        let model = backend.model(Some(&cache)).unwrap();
        let program = toy_with(&dir, &model);
        let mut inst = program.instantiate().unwrap();
        inst.execute("encode", &[&source(1)]).unwrap();
        let out = inst.execute("decode_step", &[&token(0)]).unwrap();
        let packed = model.packed_cache().unwrap().stats().packed;
        model.packed_cache().unwrap().wait_saved().unwrap();
        (out, packed)
    };
    let (cold, packed_cold) = launch();
    let (warm, packed_warm) = launch();
    assert!(packed_cold > 0);
    assert_eq!(
        packed_warm, 0,
        "the warm launch finds every weight in the file"
    );
    assert_eq!(cold, warm);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_instances_do_not_see_each_others_state_and_load_order_does_not_matter() {
    let dir = scratch("instances");
    let program = toy(&dir);
    let w = weights();
    let mut a = program.instantiate().unwrap();
    let mut b = program.instantiate().unwrap();
    // a loads encode first, b loads decode_step first: one layout, planned for the program.
    a.load("encode").unwrap();
    b.load("decode_step").unwrap();
    let specs = vec![
        StateSpec {
            name: "cross".into(),
            shape: vec![1, D],
            bank: 0,
            initial: InitialState::Zeros,
        },
        StateSpec {
            name: "self".into(),
            shape: vec![W, D],
            bank: 0,
            initial: InitialState::Zeros,
        },
    ];
    assert_eq!(Some(program.layout()), StateLayout::plan(&specs).as_ref());
    assert_eq!(program.layout().offsets, vec![(0, 0), (0, 64)]);
    let (mut ra, mut rb) = (Reference::new(), Reference::new());
    a.execute("encode", &[&source(1)]).unwrap();
    ra.encode(&w, &source(1));
    b.execute("encode", &[&source(2)]).unwrap();
    rb.encode(&w, &source(2));
    for step in 0..5 {
        let oa = a.execute("decode_step", &[&token(step)]).unwrap();
        let ob = b.execute("decode_step", &[&token(step + 100)]).unwrap();
        assert!(close(&oa[0], &ra.decode(&w, &token(step))));
        assert!(close(&ob[0], &rb.decode(&w, &token(step + 100))));
    }
    assert_ne!(
        a.read_state("cross").unwrap(),
        b.read_state("cross").unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A host bank that counts its copy function's calls.
struct CountingBank {
    inner: HostBank,
    copies: Arc<Mutex<usize>>,
}

// SAFETY: delegates to a HostBank.
unsafe impl MemoryBank for CountingBank {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn base(&mut self) -> NonNull<u8> {
        self.inner.base()
    }
    fn copy_in(&mut self, offset: usize, src: &[u8]) {
        *self.copies.lock().unwrap() += 1;
        self.inner.copy_in(offset, src)
    }
    fn copy_out(&mut self, offset: usize, dst: &mut [u8]) {
        self.inner.copy_out(offset, dst)
    }
}

#[test]
fn counter_with_named_initial_state_and_a_zero_buffer_that_costs_no_bytes() {
    let dir = scratch("counter");
    let mut g = GraphBuilder::new();
    let count = g.input(&[1]);
    let one = g.constant_f32(&[1], &[1.0]);
    let next = g.add(count, one, f32::NEG_INFINITY, f32::INFINITY);
    g.output(next);
    let written = g.output_copy(next);
    let (count_id, written_id) = (g.external_id(count), g.external_id(written));
    let tick = g.finish();

    // Two files with the same blobs: the program with a zero buffer declared adds nothing.
    let write = |path: &Path| {
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
        store.write_ptd("m", path).unwrap();
    };
    let ptd = dir.join("counter.ptd");
    write(&ptd);
    let map = Arc::new(FileDataMap::open_ptd(&ptd).unwrap());
    let keys: Vec<String> = (0..map.num_keys())
        .map(|i| map.key_at(i).unwrap().to_string())
        .collect();
    assert_eq!(
        keys.len(),
        tick.blobs.len() + 2,
        "weights, count_init, slack: nothing for zeros"
    );
    assert!(
        keys.iter().any(|k| k == "count_init") && !keys.iter().any(|k| k.contains("zeros")),
        "{keys:?}"
    );

    let specs = vec![
        StateSpec {
            name: "count".into(),
            shape: vec![1],
            bank: 0,
            initial: InitialState::Named("count_init".into()),
        },
        StateSpec {
            name: "zeros".into(),
            shape: vec![16],
            bank: 1,
            initial: InitialState::Zeros,
        },
    ];
    let methods = vec![StatefulMethod {
        name: "tick".into(),
        payload: payload(&tick),
        reads: vec![(count_id, "count".into())],
        writes: vec![(written_id, "count".into())],
    }];
    let program = Arc::new(StatefulProgram::new(&default_model(), specs, methods, map).unwrap());
    let copies = Arc::new(Mutex::new(0));
    let banks: Vec<Box<dyn MemoryBank>> = program
        .layout()
        .bank_sizes
        .iter()
        .map(|&n| {
            Box::new(CountingBank {
                inner: HostBank::new(n).unwrap(),
                copies: copies.clone(),
            }) as Box<dyn MemoryBank>
        })
        .collect();
    let mut inst = program.instantiate_in(banks).unwrap();
    assert_eq!(
        *copies.lock().unwrap(),
        2,
        "initial state of both buffers, through the copy function"
    );
    assert_eq!(inst.read_state("count").unwrap(), vec![5.0]);
    for expected in [6.0, 7.0, 8.0] {
        assert_eq!(inst.execute("tick", &[]).unwrap(), vec![vec![expected]]);
    }
    assert_eq!(
        *copies.lock().unwrap(),
        2,
        "execution copies nothing through the runtime"
    );
    inst.reset().unwrap();
    assert_eq!(*copies.lock().unwrap(), 4);
    assert_eq!(inst.read_state("count").unwrap(), vec![5.0]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Memory that is read-only except inside its copy function and while XNNPACK's operators run:
/// any other write by the runtime faults. Every copy is recorded.
struct GuardedBank {
    map: Option<Result<Mmap, MmapMut>>,
    len: usize,
    log: Arc<Mutex<Vec<String>>>,
}

impl GuardedBank {
    fn new(len: usize, log: Arc<Mutex<Vec<String>>>) -> GuardedBank {
        let map = MmapMut::map_anon(len).unwrap().make_read_only().unwrap();
        GuardedBank {
            map: Some(Ok(map)),
            len,
            log,
        }
    }
    fn writable(&mut self) -> &mut MmapMut {
        if let Some(Ok(ro)) = self.map.take() {
            self.map = Some(Err(ro.make_mut().unwrap()));
        }
        match self.map.as_mut().unwrap() {
            Err(rw) => rw,
            Ok(_) => unreachable!(),
        }
    }
    fn protect(&mut self) {
        if let Some(Err(rw)) = self.map.take() {
            self.map = Some(Ok(rw.make_read_only().unwrap()));
        }
    }
}

// SAFETY: an anonymous mapping of `len` bytes that never moves (mprotect keeps the address).
unsafe impl MemoryBank for GuardedBank {
    fn len(&self) -> usize {
        self.len
    }
    fn base(&mut self) -> NonNull<u8> {
        let ptr = match self.map.as_ref().unwrap() {
            Ok(ro) => ro.as_ptr() as *mut u8,
            Err(rw) => rw.as_ptr() as *mut u8,
        };
        NonNull::new(ptr).unwrap()
    }
    fn copy_in(&mut self, offset: usize, src: &[u8]) {
        self.log
            .lock()
            .unwrap()
            .push(format!("in {offset} {}", src.len()));
        self.writable()[offset..offset + src.len()].copy_from_slice(src);
        self.protect();
    }
    fn copy_out(&mut self, offset: usize, dst: &mut [u8]) {
        self.log
            .lock()
            .unwrap()
            .push(format!("out {offset} {}", dst.len()));
        let bytes: &[u8] = match self.map.as_ref().unwrap() {
            Ok(ro) => ro,
            Err(rw) => rw,
        };
        dst.copy_from_slice(&bytes[offset..offset + dst.len()]);
    }
    fn begin_execute(&mut self) {
        self.log.lock().unwrap().push("execute".into());
        self.writable();
    }
    fn end_execute(&mut self) {
        self.protect();
    }
}

/// A bank id is below the number of buffers (a bank for each at most): one taken on trust sized
/// the table of banks, and an id near 2^40 aborted the process (found by a fuzzing review).
#[test]
fn a_bank_id_past_the_number_of_buffers_is_refused_not_planned() {
    let spec = |bank: usize| StateSpec {
        name: format!("in bank {bank}"),
        shape: vec![4],
        bank,
        initial: InitialState::Zeros,
    };
    let two_banks = StateLayout::plan(&[spec(1), spec(0)]).expect("ids 0 and 1 for two buffers");
    assert_eq!(two_banks.bank_sizes.len(), 2);
    for far in [2, 1 << 40, usize::MAX] {
        assert_eq!(StateLayout::plan(&[spec(0), spec(far)]), None, "bank {far}");
    }
    let empty: Arc<dyn NamedDataMap> = Arc::new(InMemoryMap::new("no state data"));
    let e = StatefulProgram::new(&default_model(), vec![spec(1 << 40)], vec![], empty)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("bank id"), "{e}");
}

#[test]
fn the_runtime_writes_bank_memory_only_through_its_copy_function() {
    let dir = scratch("guarded");
    let program = toy(&dir);
    let w = weights();
    let log = Arc::new(Mutex::new(Vec::new()));
    let banks: Vec<Box<dyn MemoryBank>> = program
        .layout()
        .bank_sizes
        .iter()
        .map(|&n| {
            Box::new(GuardedBank::new(n.next_multiple_of(4096), log.clone())) as Box<dyn MemoryBank>
        })
        .collect();
    let mut inst = program.instantiate_in(banks).unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        vec!["in 0 32", "in 64 128"],
        "load: initial state only"
    );
    log.lock().unwrap().clear();
    let mut reference = Reference::new();
    inst.execute("encode", &[&source(3)]).unwrap();
    reference.encode(&w, &source(3));
    run_steps(&mut inst, &mut reference, &w, 4);
    inst.reset().unwrap();
    let events = log.lock().unwrap().clone();
    let executes = events.iter().filter(|e| *e == "execute").count();
    assert_eq!(executes, 5, "{events:?}");
    assert_eq!(
        &events[5..],
        ["in 0 32", "in 64 128"],
        "reset: through the copy function"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn default_model() -> xnnblob::backend::ModelContext {
    let backend = xnnblob::backend::Backend::with_defaults().unwrap();
    backend.model(None).unwrap()
}

/// How the method of [`write_back_program`] reads its state `s` ([1, 4]) and writes it back
/// through an explicit copy (`XNNCopy`).
#[derive(Clone, Copy, Debug)]
enum WriteBack {
    /// `y = |2 s|`, the multiply after the add that computes `s + 10`, which the copy at the
    /// graph's end writes back: XNNPACK fuses the copy into the add, which then writes `s`
    /// itself, before the multiply reads it.
    ComputedBeforeALaterRead,
    /// As `ComputedBeforeALaterRead`, `s` read through a static reshape to [4], which the
    /// delegate could fold into the input (the multiply would then read `s` itself).
    ComputedBeforeALaterReadOfAReshape,
    /// `y = |copy(reshape(s))|`, `s` written back from the method's input `u` between the
    /// copy and the absolute value: XNNPACK fuses the copy into the absolute value, which then
    /// reads what the reshape wrote, or `s` itself if the reshape were folded.
    ReadThroughACopyAfterTheWrite,
    /// `y = |s|` after `W s` is computed, which a clamp writes back: XNNPACK fuses the clamp
    /// into the fully connected node, which then writes `s` while it reads it, before the
    /// absolute value reads it.
    ClampedBeforeALaterRead,
    /// `s` ([1, 2, 2, 1] here) padded with zeros and read by a 1x1 convolution after `2 u` is
    /// computed, which a copy writes back: XNNPACK fuses the copy into the multiply, which then
    /// writes `s` there, and the pad into the convolution, which then reads `s` itself, after.
    PaddedReadAfterTheWrite,
    /// `s` written back from `u` before `y = |s|` reads it: no order of the graph keeps the
    /// state as it was read, and the method is refused.
    WrittenBeforeItIsRead,
}

/// `ClampedBeforeALaterRead`'s W: -3 on the diagonal, 0.5 elsewhere (exact in fp32 for the
/// states the test reaches).
const CLAMPED_WEIGHTS: [f32; 16] = [
    -3.0, 0.5, 0.5, 0.5, 0.5, -3.0, 0.5, 0.5, 0.5, 0.5, -3.0, 0.5, 0.5, 0.5, 0.5, -3.0,
];

/// A one-method program of `layout` over the state `s`, starting at [1, -2, 3, -4].
fn write_back_program(dir: &Path, layout: WriteBack) -> Arc<StatefulProgram> {
    use xnnblob::schema::xnn::XNodeUnion;
    let dims: &[u32] = match layout {
        WriteBack::PaddedReadAfterTheWrite => &[1, 2, 2, 1],
        _ => &[1, 4],
    };
    let mut g = GraphBuilder::new();
    let s_in = g.input(dims);
    let u = g.input(dims);
    let written = match layout {
        WriteBack::PaddedReadAfterTheWrite => {
            let padded = g.pad(s_in, &[0, 1, 1, 0], &[0, 1, 1, 0], 0.0);
            let two = g.constant_f32(dims, &[2.0; 4]);
            let next = g.multiply(u, two);
            let one = g.constant_f32(&[1, 1, 1, 1], &[1.0]);
            let geometry = ConvGeometry::square(1, 0);
            let y = g.conv2d(
                padded,
                one,
                None,
                geometry,
                f32::NEG_INFINITY,
                f32::INFINITY,
            );
            g.output(y);
            let written = g.unary_node(XNodeUnion::XNNCopy, next);
            g.output(written);
            written
        }
        WriteBack::ComputedBeforeALaterRead | WriteBack::ComputedBeforeALaterReadOfAReshape => {
            let read = match layout {
                WriteBack::ComputedBeforeALaterRead => s_in,
                _ => g.reshape(s_in, &[4]),
            };
            // [1, 4] + [4]: the sum has the state's shape, so the copy writes it back as it is.
            let ten = g.constant_f32(&[1, 4], &[10.0; 4]);
            let next = g.add(ten, read, f32::NEG_INFINITY, f32::INFINITY);
            let two = g.constant_f32(&[4], &[2.0; 4]);
            let doubled = g.multiply(read, two);
            let y = g.unary_node(XNodeUnion::XNNAbs, doubled);
            g.output(y);
            let written = g.unary_node(XNodeUnion::XNNCopy, next);
            g.output(written);
            written
        }
        WriteBack::ClampedBeforeALaterRead => {
            let w = g.constant_f32(&[4, 4], &CLAMPED_WEIGHTS);
            let next = g.fully_connected(s_in, w, None, f32::NEG_INFINITY, f32::INFINITY);
            let y = g.unary_node(XNodeUnion::XNNAbs, s_in);
            g.output(y);
            let written = g.clamp(next, -6.0, 6.0);
            g.output(written);
            written
        }
        WriteBack::WrittenBeforeItIsRead | WriteBack::ReadThroughACopyAfterTheWrite => {
            let read = match layout {
                WriteBack::WrittenBeforeItIsRead => s_in,
                _ => {
                    let r = g.reshape(s_in, &[4]);
                    g.unary_node(XNodeUnion::XNNCopy, r)
                }
            };
            let written = g.unary_node(XNodeUnion::XNNCopy, u);
            g.output(written);
            let y = g.unary_node(XNodeUnion::XNNAbs, read);
            g.output(y);
            written
        }
    };
    let (s_id, written_id) = (g.external_id(s_in), g.external_id(written));
    let name = format!("{layout:?}");
    one_state_program(dir, &name, &g.finish(), dims, (s_id, written_id))
}

/// A program whose method `step` (`graph`) reads the state `s` (of `dims`, starting at
/// [1, -2, 3, -4]) as the input `ids.0` and writes it back as the output `ids.1`.
fn one_state_program(
    dir: &Path,
    name: &str,
    graph: &BuiltGraph,
    dims: &[u32],
    ids: (u32, u32),
) -> Arc<StatefulProgram> {
    let mut store = NamedBlobStore::new();
    for (k, v) in &graph.blobs {
        store.add_named_blob(k, v, 16, "m", None).unwrap();
    }
    let initial: Vec<u8> = [1.0f32, -2.0, 3.0, -4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    store
        .add_named_blob("s_init", &initial, 16, "m", None)
        .unwrap();
    let ptd = dir.join(format!("{name}.ptd"));
    store.write_ptd("m", &ptd).unwrap();
    let map = Arc::new(FileDataMap::open_ptd(&ptd).unwrap());
    let specs = vec![StateSpec {
        name: "s".into(),
        shape: dims.iter().map(|&d| d as usize).collect(),
        bank: 0,
        initial: InitialState::Named("s_init".into()),
    }];
    let methods = vec![StatefulMethod {
        name: "step".into(),
        payload: payload(graph),
        reads: vec![(ids.0, "s".into())],
        writes: vec![(ids.1, "s".into())],
    }];
    Arc::new(StatefulProgram::new(&default_model(), specs, methods, map).unwrap())
}

#[test]
fn a_state_is_written_back_after_its_last_read_wherever_xnnpack_fuses_the_write_back() {
    let dir = scratch("write-back-order");
    for layout in [
        WriteBack::ComputedBeforeALaterRead,
        WriteBack::ComputedBeforeALaterReadOfAReshape,
        WriteBack::ReadThroughACopyAfterTheWrite,
        WriteBack::ClampedBeforeALaterRead,
        WriteBack::PaddedReadAfterTheWrite,
    ] {
        let program = write_back_program(&dir, layout);
        let mut inst = program.instantiate().unwrap();
        let mut s = vec![1.0f32, -2.0, 3.0, -4.0];
        for step in 0..3 {
            let u: Vec<f32> = (0..4).map(|i| (step * 4 + i) as f32 - 5.5).collect();
            let (y, next): (Vec<f32>, Vec<f32>) = match layout {
                WriteBack::ReadThroughACopyAfterTheWrite | WriteBack::WrittenBeforeItIsRead => {
                    (s.iter().map(|v| v.abs()).collect(), u.clone())
                }
                WriteBack::PaddedReadAfterTheWrite => (
                    (0..16)
                        .map(|at| match (at / 4, at % 4) {
                            (1..=2, 1..=2) => s[(at / 4 - 1) * 2 + at % 4 - 1],
                            _ => 0.0,
                        })
                        .collect(),
                    u.iter().map(|v| v * 2.0).collect(),
                ),
                WriteBack::ClampedBeforeALaterRead => (
                    s.iter().map(|v| v.abs()).collect(),
                    CLAMPED_WEIGHTS
                        .chunks(4)
                        .map(|row| row.iter().zip(&s).map(|(w, v)| w * v).sum::<f32>())
                        .map(|v| v.clamp(-6.0, 6.0))
                        .collect(),
                ),
                _ => (
                    s.iter().map(|v| (v * 2.0).abs()).collect(),
                    s.iter().map(|v| v + 10.0).collect(),
                ),
            };
            let out = inst.execute("step", &[&u]).unwrap();
            assert_eq!(
                out,
                vec![y],
                "{layout:?} step {step}: the state as it was read"
            );
            assert_eq!(
                inst.read_state("s").unwrap(),
                next,
                "{layout:?} step {step}"
            );
            s = next;
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_method_that_writes_a_state_back_before_reading_it_is_refused_naming_both() {
    use xnnblob::delegate::DelegateError;
    use xnnblob::state::StateError;
    let dir = scratch("write-back-early");
    let program = write_back_program(&dir, WriteBack::WrittenBeforeItIsRead);
    let mut inst = program.instantiate().unwrap();
    let error = inst
        .execute("step", &[&[0.0; 4]])
        .expect_err("the write-back comes before the read");
    match &error {
        StateError::Delegate {
            method,
            error: DelegateError::Alias { input, output, why },
        } => {
            assert_eq!(method, "step");
            assert_eq!((*input, *output), (0, 2), "{why}");
            assert!(
                why.contains("node 0 writes the output") && why.contains("node 1 reads"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Nothing was written: the state is as it started.
    assert_eq!(inst.read_state("s").unwrap(), vec![1.0, -2.0, 3.0, -4.0]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A node of a random one-state method ([`random_method`]), over [1, 4] values by index: 0 is
/// the state `s`, 1 the method's input `u`, `2 + i` the output of node `i`.
#[derive(Clone, Copy, Debug)]
enum RandomNode {
    Abs(usize),
    /// Clamped to [-1.5, 1.5]: XNNPACK fuses it into a fully connected producer.
    Clamp(usize),
    Copy(usize),
    Add(usize, usize),
    /// Clamped to [-2, 2]: XNNPACK adds a Clamp node after the add.
    AddClamped(usize, usize),
    Multiply(usize, usize),
    /// By the weights of `random_method`.
    FullyConnected(usize),
}

impl RandomNode {
    fn reads(&self) -> Vec<usize> {
        match *self {
            RandomNode::Abs(a)
            | RandomNode::Clamp(a)
            | RandomNode::Copy(a)
            | RandomNode::FullyConnected(a) => vec![a],
            RandomNode::Add(a, b) | RandomNode::AddClamped(a, b) | RandomNode::Multiply(a, b) => {
                vec![a, b]
            }
        }
    }

    fn eval(&self, v: &[Vec<f32>], weights: &[f32]) -> Vec<f32> {
        let zip = |a: usize, b: usize, f: fn(f32, f32) -> f32| {
            v[a].iter().zip(&v[b]).map(|(x, y)| f(*x, *y)).collect()
        };
        match *self {
            RandomNode::Abs(a) => v[a].iter().map(|x| x.abs()).collect(),
            RandomNode::Clamp(a) => v[a].iter().map(|x| x.clamp(-1.5, 1.5)).collect(),
            RandomNode::Copy(a) => v[a].clone(),
            RandomNode::Add(a, b) => zip(a, b, |x, y| x + y),
            RandomNode::AddClamped(a, b) => zip(a, b, |x, y| (x + y).clamp(-2.0, 2.0)),
            RandomNode::Multiply(a, b) => zip(a, b, |x, y| x * y),
            RandomNode::FullyConnected(a) => weights
                .chunks(4)
                .map(|row| row.iter().zip(&v[a]).map(|(w, x)| w * x).sum())
                .collect(),
        }
    }
}

/// A random method over the state `s` and the input `u`: nodes, the values written to
/// outputs, and the value written back to `s` (a node's own output, or a Copy or Clamp of one
/// appended last).
struct RandomMethod {
    nodes: Vec<RandomNode>,
    outputs: Vec<usize>,
    written: usize,
    weights: Vec<f32>,
}

fn random_method(rng: &mut SplitMix64) -> RandomMethod {
    let pick = |rng: &mut SplitMix64, n: usize| (rng.next_u64() % n as u64) as usize;
    let weights: Vec<f32> = (0..16).map(|_| rng.unit() * 0.5).collect();
    let count = 2 + pick(rng, 6);
    let mut nodes = Vec::new();
    for i in 0..count {
        let values = 2 + i;
        let (a, b) = (pick(rng, values), pick(rng, values));
        nodes.push(match pick(rng, 7) {
            0 => RandomNode::Abs(a),
            1 => RandomNode::Clamp(a),
            2 => RandomNode::Copy(a),
            3 => RandomNode::Add(a, b),
            4 => RandomNode::AddClamped(a, b),
            5 => RandomNode::Multiply(a, b),
            _ => RandomNode::FullyConnected(a),
        });
    }
    let written = match pick(rng, 3) {
        // A node's output, wherever the node is.
        0 => 2 + pick(rng, count),
        // A Copy or a Clamp of one, last: a write-back as stateful programs write them.
        k => {
            let source = 2 + pick(rng, count);
            nodes.push(match k {
                1 => RandomNode::Copy(source),
                _ => RandomNode::Clamp(source),
            });
            1 + nodes.len()
        }
    };
    // A value no node reads must be an output (the delegate refuses dangling values).
    let read = |v: usize| nodes.iter().any(|n| n.reads().contains(&v));
    let outputs = (2..2 + nodes.len())
        .filter(|&v| v != written && (!read(v) || pick(rng, 3) == 0))
        .collect();
    RandomMethod {
        nodes,
        outputs,
        written,
        weights,
    }
}

impl RandomMethod {
    /// The graph, and the external ids of `s` and of its write-back.
    fn graph(&self) -> (BuiltGraph, (u32, u32)) {
        use xnnblob::schema::xnn::XNodeUnion;
        let mut g = GraphBuilder::new();
        let mut values = vec![g.input(&[1, 4]), g.input(&[1, 4])];
        let w = g.constant_f32(&[4, 4], &self.weights);
        let mut written_id = None;
        for (i, node) in self.nodes.iter().enumerate() {
            let v = |k: usize| values[k];
            let out = match *node {
                RandomNode::Abs(a) => g.unary_node(XNodeUnion::XNNAbs, v(a)),
                RandomNode::Clamp(a) => g.clamp(v(a), -1.5, 1.5),
                RandomNode::Copy(a) => g.unary_node(XNodeUnion::XNNCopy, v(a)),
                RandomNode::Add(a, b) => g.add(v(a), v(b), f32::NEG_INFINITY, f32::INFINITY),
                RandomNode::AddClamped(a, b) => g.add(v(a), v(b), -2.0, 2.0),
                RandomNode::Multiply(a, b) => g.multiply(v(a), v(b)),
                RandomNode::FullyConnected(a) => {
                    g.fully_connected(v(a), w, None, f32::NEG_INFINITY, f32::INFINITY)
                }
            };
            values.push(out);
            if self.outputs.contains(&(2 + i)) || self.written == 2 + i {
                g.output(out);
                if self.written == 2 + i {
                    written_id = Some(g.external_id(out));
                }
            }
        }
        let ids = (g.external_id(values[0]), written_id.expect("written"));
        (g.finish(), ids)
    }

    /// The non-state outputs and the new state, every node reading `s` as it was.
    fn reference(&self, s: &[f32], u: &[f32]) -> (Vec<Vec<f32>>, Vec<f32>) {
        let mut values = vec![s.to_vec(), u.to_vec()];
        for node in &self.nodes {
            let out = node.eval(&values, &self.weights);
            values.push(out);
        }
        let outputs = self.outputs.iter().map(|&v| values[v].clone()).collect();
        (outputs, values[self.written].clone())
    }

    /// Whether the graph itself writes `s` back before (or where) a node reads it last.
    fn writes_before_last_read(&self) -> bool {
        let writer = self.written - 2;
        let last_read = self.nodes.iter().rposition(|n| n.reads().contains(&0));
        last_read.is_some_and(|r| writer <= r)
    }
}

fn near(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-4 * y.abs().max(1.0))
}

#[test]
fn random_stateful_methods_read_their_state_as_it_was_however_xnnpack_fuses_them() {
    use xnnblob::delegate::DelegateError;
    use xnnblob::state::StateError;
    let dir = scratch("random-write-backs");
    let mut rng = SplitMix64(0x5eed_f05e);
    let (mut ran, mut refused) = (0, 0);
    for case in 0..200 {
        let method = random_method(&mut rng);
        let (graph, ids) = method.graph();
        let program = one_state_program(&dir, &format!("case{case}"), &graph, &[1, 4], ids);
        let mut inst = program.instantiate().unwrap();
        let mut s = vec![1.0f32, -2.0, 3.0, -4.0];
        for step in 0..2 {
            let u: Vec<f32> = (0..4).map(|_| rng.unit()).collect();
            match inst.execute("step", &[&u]) {
                Ok(outputs) => {
                    assert!(
                        !method.writes_before_last_read(),
                        "case {case}: ran a graph that writes s before reading it: {:?}",
                        method.nodes
                    );
                    let (want, next) = method.reference(&s, &u);
                    assert_eq!(outputs.len(), want.len(), "case {case}");
                    for (got, want) in outputs.iter().zip(&want) {
                        assert!(
                            near(got, want),
                            "case {case} step {step}: {got:?} against {want:?}; {:?} written {}",
                            method.nodes,
                            method.written
                        );
                    }
                    let state = inst.read_state("s").unwrap();
                    assert!(
                        near(&state, &next),
                        "case {case} step {step}: state {state:?} against {next:?}"
                    );
                    s = next;
                    ran += 1;
                }
                Err(StateError::Delegate {
                    error: DelegateError::Alias { .. },
                    ..
                }) => {
                    assert!(
                        method.writes_before_last_read(),
                        "case {case}: refused a graph that reads s before writing it: {:?}",
                        method.nodes
                    );
                    refused += 1;
                    break;
                }
                Err(other) => panic!(
                    "case {case}: {other:?} {:?} written {}",
                    method.nodes, method.written
                ),
            }
        }
    }
    // Both kinds were drawn.
    assert!(ran > 100 && refused > 5, "ran {ran}, refused {refused}");
    std::fs::remove_dir_all(&dir).unwrap();
}
