//! The same initial values for a model trained by candle alone: a `VarBuilder` over a
//! `VarMap` whose variables are initialized as the adapter initializes the engine's
//! parameters (each from the model's `Init` hint, seeded by the parameter's name). Use it
//! to compare a zero-candle run with a plain candle run, or to start one from the other.

use crate::init;
use crate::register::Constants;
use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};

struct Seeded {
    map: VarMap,
    seed: u64,
    constants: Option<Constants>,
}

impl SimpleBackend for Seeded {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if let Some(t) = self.constants.as_ref().and_then(|c| c(name, &s, dev)) {
            return t;
        }
        let mut vars = self
            .map
            .data()
            .lock()
            .map_err(|_| crate::error::to_candle("the VarMap's lock is poisoned"))?;
        if let Some(v) = vars.get(name) {
            if v.dims() != s.dims() {
                return Err(crate::error::to_candle(format!(
                    "`{name}` asked for with shape {:?}, exists with {:?}",
                    s.dims(),
                    v.dims()
                )));
            }
            return Ok(v.as_tensor().clone());
        }
        let mut values = vec![0f32; s.elem_count()];
        init::fill(self.seed, name, s.dims(), &h, &mut values);
        let var = Var::from_vec(values, s, dev)?;
        let var = if dtype == DType::F32 {
            var
        } else {
            Var::from_tensor(&var.to_dtype(dtype)?)?
        };
        let t = var.as_tensor().clone();
        vars.insert(name.to_string(), var);
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        Err(crate::error::to_candle(format!(
            "`{name}` was asked for without a shape"
        )))
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.map.data().lock().is_ok_and(|v| v.contains_key(name))
    }
}

/// A `VarBuilder` that creates the model's variables in `map`, initialized exactly as
/// [`ZeroCandle::new`](crate::ZeroCandle::new) with the same `seed` initializes them.
/// `constants` answers for tensors that are not parameters, as in [`Options`](crate::Options).
pub fn seeded_var_builder(
    map: &VarMap,
    seed: u64,
    constants: Option<Constants>,
    device: &Device,
) -> VarBuilder<'static> {
    VarBuilder::from_backend(
        Box::new(Seeded {
            map: map.clone(),
            seed,
            constants,
        }),
        DType::F32,
        device.clone(),
    )
}
