//! Stateful programs' declarations (`xnnblob::state`) on arbitrary bytes: buffers with any
//! names, shapes, banks and initial values, methods binding any externals of the fixed state
//! graphs to any buffers, then any sequence of instantiation (in host memory or in banks of the
//! wrong count or size), loads, executes with inputs of any length, resets and reads. Decoded by
//! `xnnblob_fuzz::state_script`. Nothing may panic or crash.
//!
//! Asserted: `StateLayout::plan` puts every buffer 64-aligned inside its bank with XNNPACK's
//! 16 bytes of slack after it and apart from the others, and fails only on a size that
//! overflows or a bank id not below the number of buffers; `StatefulProgram::new` accepts
//! exactly the declarations without duplicate names, overflowing sizes, such bank ids, initial
//! values of the wrong size or missing, or bindings to unknown buffers; `instantiate_in` accepts exactly one bank per id, each large enough; a read gives a
//! declared buffer's element count, and its initial value after instantiation or a reset; an
//! execute never changes a buffer its method does not write back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use xnnblob::named_data::{DataBuffer, NamedDataMap};
use xnnblob::state::{
    HostBank, InitialState, Instance, MemoryBank, StateLayout, StateSpec, StatefulMethod,
    StatefulProgram,
};
use xnnblob_fuzz::state_script::{METHOD_NAMES, Op, STATE_GRAPHS, Script, state_name};

/// Instances are made only when their banks total at most this: a declared size may be huge.
const INSTANCE_LIMIT: usize = 1 << 20;

/// The state graphs' payloads, copied into aligned buffers once.
fn payloads() -> &'static [DataBuffer] {
    static PAYLOADS: OnceLock<Vec<DataBuffer>> = OnceLock::new();
    PAYLOADS.get_or_init(|| {
        STATE_GRAPHS
            .iter()
            .map(|g| xnnblob_fuzz::buffer(&xnnblob_fuzz::graph(g).payload))
            .collect()
    })
}

fn check_layout(specs: &[StateSpec]) -> Option<StateLayout> {
    let layout = StateLayout::plan(specs);
    // Bank ids are below the number of buffers; sizes far from overflow must be planned.
    let banks_in_range = specs.iter().all(|s| s.bank < specs.len());
    assert!(
        layout.is_none() || banks_in_range,
        "a bank id past the buffers was planned"
    );
    let small = specs
        .iter()
        .all(|s| s.bank < specs.len() && s.bytes().is_some_and(|b| b < 1 << 40));
    assert!(layout.is_some() || !small, "a layout of small sizes failed");
    let layout = layout?;
    assert_eq!(layout.offsets.len(), specs.len());
    let banks = specs.iter().map(|s| s.bank + 1).max().unwrap_or(0);
    assert_eq!(layout.bank_sizes.len(), banks);
    let mut ends = vec![0usize; banks];
    for (s, &(bank, offset)) in specs.iter().zip(&layout.offsets) {
        assert_eq!(bank, s.bank);
        assert_eq!(offset % 64, 0, "{:?} at {offset}", s.name);
        assert!(
            offset >= ends[bank],
            "{:?} overlaps the buffer before it",
            s.name
        );
        ends[bank] = offset + s.bytes().expect("planned") + 16;
        assert!(
            ends[bank] <= layout.bank_sizes[bank],
            "{:?} past its bank",
            s.name
        );
    }
    Some(layout)
}

fn valid(specs: &[StateSpec], script: &Script, map: &dyn NamedDataMap, planned: bool) -> bool {
    let names_unique = specs
        .iter()
        .enumerate()
        .all(|(i, s)| specs[..i].iter().all(|o| o.name != s.name));
    let initial_fits = specs.iter().all(|s| {
        let bytes = s.bytes();
        match &s.initial {
            InitialState::Zeros => bytes.is_some(),
            InitialState::Named(key) => bytes.is_some() && map.data_size(key).ok() == bytes,
        }
    });
    let bindings_known = script.methods.iter().all(|m| {
        Script::named(&m.reads)
            .iter()
            .chain(&Script::named(&m.writes))
            .all(|(_, n)| specs.iter().any(|s| s.name == *n))
    });
    names_unique && initial_fits && bindings_known && planned
}

/// Every declared buffer's bytes, by declaration.
fn snapshot(instance: &mut Instance, specs: &[StateSpec]) -> Vec<Vec<u8>> {
    specs
        .iter()
        .map(|s| {
            let values = instance
                .read_state(&s.name)
                .expect("a declared buffer reads");
            assert_eq!(
                Some(values.len()),
                s.elements(),
                "{:?}: element count",
                s.name
            );
            values.iter().flat_map(|v| v.to_le_bytes()).collect()
        })
        .collect()
}

fn initial_bytes(spec: &StateSpec, map: &dyn NamedDataMap) -> Vec<u8> {
    match &spec.initial {
        InitialState::Zeros => vec![0; spec.bytes().expect("validated")],
        InitialState::Named(key) => map.get_data(key).expect("validated").to_vec(),
    }
}

fn fresh(instance: &mut Instance, specs: &[StateSpec], map: &dyn NamedDataMap) {
    for (s, bytes) in specs.iter().zip(snapshot(instance, specs)) {
        assert!(
            bytes == initial_bytes(s, map),
            "{:?} is not its initial value",
            s.name
        );
    }
}

fn run(script: &Script) {
    let specs = script.specs();
    let planned = check_layout(&specs);
    let map: Arc<dyn NamedDataMap> = xnnblob_fuzz::named_data().clone();
    let methods: Vec<StatefulMethod> = script
        .methods
        .iter()
        .map(|m| StatefulMethod {
            name: METHOD_NAMES[m.name].to_string(),
            payload: payloads()[m.graph].clone(),
            reads: Script::named(&m.reads),
            writes: Script::named(&m.writes),
        })
        .collect();
    let expected = valid(&specs, script, &*map, planned.is_some());
    let program = StatefulProgram::new(xnnblob_fuzz::model(), specs.clone(), methods, map.clone());
    assert_eq!(program.is_ok(), expected, "{:?}", program.err());
    let Ok(program) = program else {
        return;
    };
    let program = Arc::new(program);
    let layout = planned.expect("valid declarations are planned");
    assert_eq!(program.layout(), &layout);
    let total = layout
        .bank_sizes
        .iter()
        .try_fold(0usize, |t, &b| t.checked_add(b));
    if total.is_none_or(|t| t > INSTANCE_LIMIT) {
        return;
    }
    let mut instance: Option<Instance> = None;
    // Whether every buffer holds its initial value (nothing ran since instantiation or reset).
    let mut pristine = false;
    for op in &script.ops {
        match op {
            Op::Instantiate => {
                let mut made = program.instantiate().expect("a small layout instantiates");
                fresh(&mut made, &specs, &*map);
                instance = Some(made);
                pristine = true;
            }
            &Op::InstantiateIn {
                banks_delta,
                size_delta,
            } => {
                let sizes = &layout.bank_sizes;
                let count = (sizes.len() + banks_delta).saturating_sub(1);
                let lens: Vec<usize> = (0..count)
                    .map(|i| {
                        let need = sizes.get(i).copied().unwrap_or(64);
                        need.saturating_add_signed(isize::from(size_delta))
                    })
                    .collect();
                let fits = count == sizes.len() && lens.iter().zip(sizes).all(|(l, n)| l >= n);
                let banks: Vec<Box<dyn MemoryBank>> = lens
                    .iter()
                    .map(|&l| {
                        Box::new(HostBank::new(l).expect("a small bank")) as Box<dyn MemoryBank>
                    })
                    .collect();
                match program.instantiate_in(banks) {
                    Ok(mut made) => {
                        assert!(fits, "banks of {lens:?} taken for a layout of {sizes:?}");
                        fresh(&mut made, &specs, &*map);
                        instance = Some(made);
                        pristine = true;
                    }
                    Err(e) => assert!(!fits, "banks of {lens:?} refused: {e}"),
                }
            }
            Op::Load(m) => {
                if let Some(i) = instance.as_mut() {
                    let name = METHOD_NAMES[*m];
                    let declared = script.methods.iter().any(|d| d.name == *m);
                    let loaded = i.load(name);
                    assert!(declared || loaded.is_err(), "{name} loaded undeclared");
                }
            }
            Op::Execute(m, lens) => {
                let Some(i) = instance.as_mut() else {
                    continue;
                };
                let name = METHOD_NAMES[*m];
                let inputs: Vec<Vec<f32>> = lens
                    .iter()
                    .enumerate()
                    .map(|(k, &n)| (0..n).map(|j| (k * 64 + j) as f32 * 0.125).collect())
                    .collect();
                let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                // The method that runs is the first declared under the name.
                let written: Vec<String> = script
                    .methods
                    .iter()
                    .find(|d| d.name == *m)
                    .map(|d| {
                        Script::named(&d.writes)
                            .into_iter()
                            .map(|(_, n)| n)
                            .collect()
                    })
                    .unwrap_or_default();
                let before = snapshot(i, &specs);
                let _ = i.execute(name, &refs);
                let after = snapshot(i, &specs);
                for ((s, b), a) in specs.iter().zip(&before).zip(&after) {
                    if !written.contains(&s.name) {
                        assert!(
                            b == a,
                            "{name} changed {:?}, which it does not write",
                            s.name
                        );
                    }
                }
                pristine &= before == after;
            }
            Op::Reset => {
                if let Some(i) = instance.as_mut() {
                    i.reset().expect("validated initial values reset");
                    fresh(i, &specs, &*map);
                    pristine = true;
                }
            }
            Op::Read(s) => {
                let Some(i) = instance.as_mut() else {
                    continue;
                };
                let name = state_name(*s);
                let spec = specs.iter().find(|d| d.name == name);
                match (i.read_state(name), spec) {
                    (Ok(values), Some(spec)) => {
                        assert_eq!(Some(values.len()), spec.elements());
                        if pristine {
                            let bytes: Vec<u8> =
                                values.iter().flat_map(|v| v.to_le_bytes()).collect();
                            assert!(bytes == initial_bytes(spec, &*map), "{name}: not initial");
                        }
                    }
                    (Err(_), None) => {}
                    (r, spec) => panic!("read of {name:?}: {:?} for {spec:?}", r.map(|v| v.len())),
                }
            }
        }
    }
}

fuzz_target!(init: xnnblob_fuzz::limit_address_space(), |data: &[u8]| {
    xnnblob_fuzz::record_input(data);
    run(&Script::decode(data));
});
