//! The bridge's whole programs: a program fully delegated to XNNPACK, and its methods.

use super::*;

/// An ExecuTorch program fully delegated to XNNPACK, behind the bridge's `Program`.
pub struct Program(xnnblob::program::Program);
/// An initialised method of a program, and the C++ inputs bound for its next execute.
pub struct Method {
    inner: xnnblob::program::Method,
    inputs: Vec<Option<RawInput>>,
}

pub(super) fn load_program(
    backend: &Backend,
    pte: &str,
    ptds: &[String],
    cache_path: &str,
) -> Result<Box<Program>, Reported> {
    guarded(|| {
        let file = WeightsCacheChoice::File(cache_path.into());
        let cache = (!cache_path.is_empty()).then_some(&file);
        Ok(Box::new(Program(xnnblob::program::Program::load(
            &backend.0, pte, ptds, cache,
        )?)))
    })
}

impl Program {
    pub(super) fn method_names(&self) -> Vec<String> {
        self.0
            .method_names()
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    pub(super) fn frozen_buffer_suspects(&self) -> Vec<bridge::FrozenBufferSuspect> {
        self.0
            .frozen_buffer_suspects()
            .iter()
            .map(|s| bridge::FrozenBufferSuspect {
                method: s.method.clone(),
                delegate: s.delegate,
                key: s.key.clone(),
                bytes: s.bytes,
                buffers: s.buffers.clone(),
                warning: s.to_string(),
            })
            .collect()
    }

    pub(super) fn weights_cache(&self) -> Result<Box<WeightsCache>, String> {
        guarded_text(|| {
            self.0
                .weights_cache()
                .map(|c| Box::new(WeightsCache(c.clone())))
                .ok_or_else(|| "this program packs without a cache".to_string())
        })
    }

    pub(super) fn method(&self, name: &str) -> Result<Box<Method>, Reported> {
        guarded(|| {
            let inner = self.0.method(name)?;
            let inputs = (0..inner.input_specs().len()).map(|_| None).collect();
            Ok(Box::new(Method { inner, inputs }))
        })
    }
}

impl Method {
    pub(super) fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    pub(super) fn spec(&self, index: usize) -> Result<xnnblob::program::ValueSpec, String> {
        guarded_text(|| {
            self.inner
                .input_spec(index)
                .ok_or_else(|| out_of_range("input", index, self.inputs.len()))
        })
    }

    pub(super) fn input_shape(&self, index: usize) -> Result<Vec<usize>, String> {
        guarded_text(|| Ok(self.spec(index)?.bound.dims().to_vec()))
    }

    pub(super) fn input_scalar_type(&self, index: usize) -> Result<i8, String> {
        guarded_text(|| Ok(self.spec(index)?.dtype.scalar_type()))
    }

    pub(super) fn bind_input(
        &mut self,
        index: usize,
        scalar_type: i8,
        shape: &[usize],
        data: &[u8],
        has_slack: bool,
    ) -> Result<(), String> {
        guarded_text(|| {
            let n = self.inputs.len();
            *self
                .inputs
                .get_mut(index)
                .ok_or_else(|| out_of_range("input", index, n))? =
                Some(raw_input(scalar_type, shape, data, has_slack)?);
            Ok(())
        })
    }

    pub(super) fn execute(&mut self) -> Result<(), Reported> {
        guarded(|| {
            let mut views = Vec::with_capacity(self.inputs.len());
            for (i, b) in self.inputs.iter_mut().enumerate() {
                let Some(b) = b.take() else {
                    return Err(Reported(format!("input {i} is not bound")));
                };
                // SAFETY: C++ keeps the bound bytes valid and unchanged until execute returns
                // (bind_input's contract); `len` is their length and `padded` what C++ declared.
                let view = unsafe {
                    let data = std::slice::from_raw_parts(b.data, b.len);
                    if b.padded {
                        xnnblob::tensor::TensorRef::with_slack(b.dtype, b.shape, data)
                    } else {
                        xnnblob::tensor::TensorRef::new(b.dtype, b.shape, data)
                    }
                };
                views.push(view);
            }
            self.inner.execute(&views).map_err(Reported::from)
        })
    }

    pub(super) fn num_outputs(&self) -> usize {
        self.inner.num_outputs()
    }

    pub(super) fn output_data(&self, index: usize) -> Result<&[u8], Reported> {
        guarded(|| Ok(self.inner.output(index)?.data()))
    }

    pub(super) fn output_shape(&self, index: usize) -> Result<Vec<usize>, Reported> {
        guarded(|| Ok(self.inner.output(index)?.shape().dims().to_vec()))
    }

    pub(super) fn output_scalar_type(&self, index: usize) -> Result<i8, Reported> {
        guarded(|| Ok(self.inner.output(index)?.dtype().scalar_type()))
    }
}
