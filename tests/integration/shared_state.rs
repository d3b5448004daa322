//! Issue 43: ExecuTorch 1.5.1 exports whose methods share mutable buffers
//! (`MemoryPlanningPass(share_mutable_buffers=True)`), run in xnnblob's own executor: a call
//! sequence on the methods of one program, against eager PyTorch and ExecuTorch's own runtime
//! (their outputs in NAME.calls.json), cold and warm with a cache file. The programs and their
//! recipe are in scripts/export-executorch-fixtures.py (`export_shared`).

use serde_json::Value;
use std::path::{Path, PathBuf};
use xnnblob::backend::{Backend, WeightsCacheChoice};
use xnnblob::program::{Method, Program, ProgramError};
use xnnblob::tensor::TensorRef;

use crate::common;
use crate::common::io_steps::{relative_error, tensor};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/executorch/export")
}

fn calls(name: &str) -> Value {
    let path = dir().join(format!("{name}.calls.json"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn load(backend: &Backend, name: &str, cache: Option<&WeightsCacheChoice>) -> Program {
    let description = calls(name);
    let data: Vec<PathBuf> = description["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| dir().join(d.as_str().unwrap()))
        .collect();
    Program::load(backend, dir().join(format!("{name}.pte")), &data, cache)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Runs `call` (an entry of NAME.calls.json) on `method`; the worst difference of its first
/// output from eager's and from ExecuTorch's, over the range of each.
fn run_call(method: &mut Method, call: &Value) -> (f32, f32) {
    let inputs: Vec<_> = call["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| tensor(&dir(), t))
        .collect();
    let views: Vec<TensorRef<'_>> = inputs
        .iter()
        .map(|(d, s, b)| TensorRef::new(*d, *s, b))
        .collect();
    method.execute(&views).unwrap();
    let out = method.output(0).unwrap();
    let (_, _, eager) = tensor(&dir(), &call["outputs_eager"][0]);
    let (_, _, et) = tensor(&dir(), &call["outputs_et"][0]);
    (
        relative_error(out.dtype(), out.data(), &eager),
        relative_error(out.dtype(), out.data(), &et),
    )
}

/// Makes each distinct method of `name`'s calls once, from `make`, and runs the calls in order;
/// the worst difference from eager's outputs and from ExecuTorch's.
fn run_sequence(name: &str, make: impl Fn(&str) -> Method) -> (f32, f32) {
    let description = calls(name);
    let mut methods: Vec<Method> = Vec::new();
    let (mut eager, mut et) = (0f32, 0f32);
    for call in description["calls"].as_array().unwrap() {
        let m = call["method"].as_str().unwrap();
        let at = match methods.iter().position(|x| x.name() == m) {
            Some(at) => at,
            None => {
                methods.push(make(m));
                methods.len() - 1
            }
        };
        let (e, t) = run_call(&mut methods[at], call);
        (eager, et) = (eager.max(e), et.max(t));
    }
    (eager, et)
}

/// The exports whose every method xnnblob's executor runs: delegates, write-backs and
/// expand_copy only.
const RUN_HERE: [&str; 2] = ["shared_prefill_step", "shared_encoder_decoder"];

#[test]
fn methods_sharing_mutable_buffers_match_eager_in_xnnblobs_executor_cold_and_warm() {
    let tmp = common::scratch("shared-state-executor");
    for name in RUN_HERE {
        let cache = WeightsCacheChoice::File(tmp.join(format!("{name}.xbc")));
        for launch in ["cold", "warm"] {
            let backend = Backend::with_defaults().unwrap();
            let program = load(&backend, name, Some(&cache));
            let (eager, et) = run_sequence(name, |m| {
                program
                    .method(m)
                    .unwrap_or_else(|e| panic!("{name} {m}: {e}"))
            });
            eprintln!("{name} {launch}: {eager:e} from eager, {et:e} from ExecuTorch's");
            assert!(
                eager < 1e-5,
                "{name} {launch}: {eager:e} of the range from eager"
            );
            assert!(et < 1e-5, "{name} {launch}: {et:e} from ExecuTorch's");
            let stats = program.weights_cache().unwrap().stats();
            if launch == "warm" {
                assert_eq!(stats.packed, 0, "{name} warm: nothing packed");
                assert!(stats.hits > 0, "{name} warm: weights found packed");
            }
            program.weights_cache().unwrap().wait_saved().unwrap();
        }
    }
}

/// A mutable buffer exported with its initial value (`InitializedMutableBufferPass`) starts from
/// it, in its method's own memory and in the shared memory alike, as in ExecuTorch's runtime:
/// zeros would leave eager's outputs from the first call on (the value reaches 8.5).
#[test]
fn mutable_buffers_start_from_their_exported_initial_values() {
    let tmp = common::scratch("initial-state");
    for name in ["state_initial_value", "state_initial_value_shared"] {
        let cache = WeightsCacheChoice::File(tmp.join(format!("{name}.xbc")));
        for launch in ["cold", "warm"] {
            let backend = Backend::with_defaults().unwrap();
            let program = load(&backend, name, Some(&cache));
            let (eager, et) = run_sequence(name, |m| program.method(m).unwrap());
            assert!(
                eager < 1e-5,
                "{name} {launch}: {eager:e} of the range from eager"
            );
            assert!(et < 1e-5, "{name} {launch}: {et:e} from ExecuTorch's");
            program.weights_cache().unwrap().wait_saved().unwrap();
        }
    }
    // In the shared memory the value is there as soon as the method is made, before any call.
    let backend = Backend::with_defaults().unwrap();
    let program = load(&backend, "state_initial_value_shared", None);
    let _method = program.method("forward").unwrap();
    let start: Vec<f32> = program
        .state()
        .read(0, 64)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 + 1.0).collect();
    assert_eq!(start, want);
}

/// Each method in a state of its own (as ExecuTorch's Module without `share_memory_arenas`):
/// the reader sees zeros and the outputs leave eager's. So the agreement above comes from the
/// sharing, and the test can fail.
#[test]
fn methods_in_states_of_their_own_do_not_see_each_others_writes() {
    let backend = Backend::with_defaults().unwrap();
    for name in RUN_HERE {
        let program = load(&backend, name, None);
        let (eager, _) = run_sequence(name, |m| {
            let own = program.new_state().unwrap();
            assert!(!own.same_as(program.state()));
            program.method_in(m, &own).unwrap()
        });
        eprintln!("{name}, states apart: {eager:e} from eager");
        assert!(eager > 1e-2, "{name}: apart, {eager:e} from eager");
    }
}

/// Two instances of one program's state, as two conversations: what one's methods write, the
/// other's do not see, and each gives eager's outputs.
#[test]
fn two_states_of_one_program_are_independent() {
    let backend = Backend::with_defaults().unwrap();
    let name = "shared_prefill_step";
    let program = load(&backend, name, None);
    let second = program.new_state().unwrap();
    let (a, _) = run_sequence(name, |m| program.method(m).unwrap());
    let (b, _) = run_sequence(name, |m| program.method_in(m, &second).unwrap());
    assert!(a < 1e-5 && b < 1e-5, "{a:e} {b:e}");
    // The counter both sequences advanced is the same in each, not the sum.
    let len = program.state().len();
    assert_eq!(
        program.state().read(0, len),
        second.read(0, len),
        "the same calls leave the same state"
    );
}

/// Methods sharing one state, executed from several threads at once: each execute holds the
/// state, so no update of the counter that `step` adds 1 to is lost.
#[test]
fn methods_sharing_state_on_several_threads_lose_no_update() {
    let backend = Backend::with_defaults().unwrap();
    let name = "shared_prefill_step";
    let program = load(&backend, name, None);
    let description = calls(name);
    let step_call = description["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["method"] == "step")
        .unwrap()
        .clone();
    let (threads, each) = (4, 25);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let mut method = program.method("step").unwrap();
            let call = step_call.clone();
            scope.spawn(move || {
                for _ in 0..each {
                    run_call(&mut method, &call);
                }
            });
        }
    });
    // `counter`, the one-element buffer after the 16 of `cache` (the plan's offset 64).
    let counter = program.state().read(64, 4).unwrap();
    assert_eq!(
        f32::from_le_bytes(counter.try_into().unwrap()),
        (threads * each) as f32
    );
}

/// The exports that need ExecuTorch's portable operators (a KV cache updated with index_put, a
/// dtype conversion, a matrix product left outside the delegate) are refused by each method
/// that runs one, naming it and saying where the program runs.
#[test]
fn shared_state_programs_with_other_operators_are_refused_with_where_they_run() {
    let backend = Backend::with_defaults().unwrap();
    for name in ["shared_prefill_decode", "shared_matmul_operand"] {
        let program = load(&backend, name, None);
        let mut refused = 0;
        for method in program.method_names() {
            match program.method(method) {
                Err(err @ ProgramError::NotDelegated { .. }) => {
                    let said = err.to_string();
                    assert!(
                        said.contains("the operator ") && said.contains("xnnblob-et-run"),
                        "{name} {method}: {said}"
                    );
                    refused += 1;
                }
                Err(e) => panic!("{name} {method}: {e}"),
                Ok(_) => {}
            }
        }
        assert!(refused > 0, "{name}: some method needs a portable operator");
    }
}

/// A program loaded through `Program` keeps what its load found frozen: `frozen_matmul_operand`
/// (exported without the recipe) has one constant in `step`'s delegate, zeros the size of the
/// buffer `prefill` writes, and its warning names the method, the buffer and the recipe; the
/// exports that keep their buffers shared, and a program with no shared buffer, have none.
#[test]
fn a_program_loaded_keeps_the_shared_buffers_frozen_into_its_delegates() {
    let backend = Backend::with_defaults().unwrap();
    let frozen = load(&backend, "frozen_matmul_operand", None);
    let found = frozen.frozen_buffer_suspects();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].method.as_str(), found[0].delegate, found[0].bytes),
        ("step", 0, 16 * 16 * 4)
    );
    assert_eq!(found[0].buffers, ["value 0 of prefill"]);
    let said = found[0].to_string();
    assert!(
        said.starts_with("method \"step\", XNNPACK delegate 0: constant ")
            && said.contains(&found[0].key)
            && said.contains("shared mutable buffer value 0 of prefill")
            && said.contains("Methods that share state"),
        "{said}"
    );
    for name in [
        "shared_prefill_step",
        "shared_encoder_decoder",
        "shared_prefill_decode",
        "shared_matmul_operand",
        "state_initial_value",
        "state_initial_value_shared",
    ] {
        let program = load(&backend, name, None);
        assert_eq!(program.frozen_buffer_suspects(), [], "{name}");
    }
}
