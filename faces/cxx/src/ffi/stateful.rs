//! The bridge's stateful programs over C++ memory banks: the builder, the program, instances.

use super::*;

// SAFETY: memory_bank.h requires C++ banks to be usable from the thread that runs the instance.
unsafe impl Send for bridge::MemoryBank {}

/// A C++ bank as a Rust one.
struct CppBank(cxx::UniquePtr<bridge::MemoryBank>);

// SAFETY: memory_bank.h's contract is MemoryBank's: `base` points to `len` bytes, 64-aligned,
// valid and fixed while the bank lives.
unsafe impl xnnblob::state::MemoryBank for CppBank {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.len())
    }
    fn base(&mut self) -> std::ptr::NonNull<u8> {
        let ptr = self.0.as_mut().map_or(std::ptr::null_mut(), |b| b.base());
        // A null base (no bank) never reaches XNNPACK: instantiation checks the length first.
        std::ptr::NonNull::new(ptr).unwrap_or(std::ptr::NonNull::dangling())
    }
    fn copy_in(&mut self, offset: usize, src: &[u8]) {
        if let Some(b) = self.0.as_mut() {
            b.copy_in(offset, src);
        }
    }
    fn copy_out(&mut self, offset: usize, dst: &mut [u8]) {
        if let Some(b) = self.0.as_mut() {
            b.copy_out(offset, dst);
        }
    }
    fn begin_execute(&mut self) {
        if let Some(b) = self.0.as_mut() {
            b.begin_execute();
        }
    }
    fn end_execute(&mut self) {
        if let Some(b) = self.0.as_mut() {
            b.end_execute();
        }
    }
}

/// Collects the declarations and methods of a stateful program, for C++.
#[derive(Default)]
pub struct StatefulBuilder {
    specs: Vec<xnnblob::state::StateSpec>,
    methods: Vec<xnnblob::state::StatefulMethod>,
}

/// A stateful program (declarations, layout, methods), behind the bridge's `Stateful`.
pub struct Stateful(Arc<xnnblob::state::StatefulProgram>);
/// One instance of a stateful program, with its own state.
pub struct StatefulInstance(xnnblob::state::Instance);

pub(super) fn new_stateful_builder() -> Box<StatefulBuilder> {
    Box::default()
}

impl StatefulBuilder {
    pub(super) fn declare(&mut self, decl: StateDecl) {
        self.specs.push(xnnblob::state::StateSpec {
            name: decl.name,
            shape: decl.shape,
            bank: decl.bank,
            initial: if decl.initial_key.is_empty() {
                xnnblob::state::InitialState::Zeros
            } else {
                xnnblob::state::InitialState::Named(decl.initial_key)
            },
        });
    }

    pub(super) fn add_method(&mut self, name: &str, payload: &[u8]) {
        let copy = xnnblob::aligned::AlignedBytes::copy_from(payload, 64).expect("allocation");
        let payload = DataBuffer::new(Arc::new(copy), 0, payload.len()).expect("whole copy");
        self.methods.push(xnnblob::state::StatefulMethod {
            name: name.to_string(),
            payload,
            reads: Vec::new(),
            writes: Vec::new(),
        });
    }

    pub(super) fn bind(&mut self, method: &str, external_id: u32, state: &str, write: bool) {
        if let Some(m) = self.methods.iter_mut().find(|m| m.name == method) {
            let list = if write { &mut m.writes } else { &mut m.reads };
            list.push((external_id, state.to_string()));
        }
    }

    pub(super) fn build(
        &mut self,
        map: &DataMap,
        model: &Model,
    ) -> Result<Box<Stateful>, Reported> {
        guarded(|| {
            let program = xnnblob::state::StatefulProgram::new(
                &model.0,
                std::mem::take(&mut self.specs),
                std::mem::take(&mut self.methods),
                map.0.clone(),
            )?;
            Ok(Box::new(Stateful(Arc::new(program))))
        })
    }
}

impl Stateful {
    pub(super) fn bank_sizes(&self) -> Vec<usize> {
        self.0.layout().bank_sizes.clone()
    }

    pub(super) fn instantiate(&self) -> Result<Box<StatefulInstance>, Reported> {
        guarded(|| Ok(Box::new(StatefulInstance(self.0.instantiate()?))))
    }

    pub(super) fn instance_builder(&self) -> Box<InstanceBuilder> {
        Box::new(InstanceBuilder {
            program: self.0.clone(),
            banks: Vec::new(),
        })
    }
}

/// Collects the C++ banks of a new instance, in bank order.
pub struct InstanceBuilder {
    program: Arc<xnnblob::state::StatefulProgram>,
    banks: Vec<Box<dyn xnnblob::state::MemoryBank>>,
}

impl InstanceBuilder {
    pub(super) fn add_bank(&mut self, bank: cxx::UniquePtr<bridge::MemoryBank>) {
        self.banks.push(Box::new(CppBank(bank)));
    }

    pub(super) fn finish(&mut self) -> Result<Box<StatefulInstance>, Reported> {
        guarded(|| {
            let banks = std::mem::take(&mut self.banks);
            Ok(Box::new(StatefulInstance(
                self.program.instantiate_in(banks)?,
            )))
        })
    }
}

impl StatefulInstance {
    pub(super) fn reset(&mut self) -> Result<(), Reported> {
        guarded(|| self.0.reset().map_err(Reported::from))
    }

    pub(super) fn run(
        &mut self,
        method: &str,
        inputs: &[f32],
        input_sizes: &[usize],
    ) -> Result<Vec<f32>, Reported> {
        guarded(|| {
            let mut parts = Vec::new();
            let mut at = 0;
            for &n in input_sizes {
                let part = inputs.get(at..at + n).ok_or_else(|| {
                    xnnblob::state::StateError::Invalid(format!(
                        "input sizes {input_sizes:?} exceed the {} values given",
                        inputs.len()
                    ))
                })?;
                parts.push(part);
                at += n;
            }
            Ok(self.0.execute(method, &parts)?.concat())
        })
    }

    pub(super) fn read_state(&mut self, name: &str) -> Result<Vec<f32>, Reported> {
        guarded(|| self.0.read_state(name).map_err(Reported::from))
    }
}
