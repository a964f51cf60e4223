//! Registration through candle's `VarBuilder`: the model's constructor runs twice over a
//! `SimpleBackend` of ours. The first pass records every tensor it asks for (name, shape,
//! `Init` hint); those become the engine's `ParamSpec`s, grouped into modules by name. The
//! second pass hands the constructor, for each name, the tensor the adapter manages.

use crate::error::{Error, Result};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::Init;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How parameters are grouped into engine modules (the unit of `grads_ready`, and in
/// stage 3 of gathering).
#[derive(Clone)]
pub enum Grouping {
    /// By layer: a parameter's module is its name up to the last `.` (`blocks.0.attn.q`
    /// for `blocks.0.attn.q.weight`). The default.
    Layer,
    /// By the first `n` components of the name (`Prefix(2)`: `blocks.0`).
    Prefix(usize),
    /// By the caller's function of the name; it must return a prefix of the name that ends
    /// at a `.` (or the empty string).
    Custom(Arc<dyn Fn(&str) -> String + Send + Sync>),
}

impl std::fmt::Debug for Grouping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Grouping::Layer => write!(f, "Layer"),
            Grouping::Prefix(n) => write!(f, "Prefix({n})"),
            Grouping::Custom(_) => write!(f, "Custom"),
        }
    }
}

impl Grouping {
    /// The module of parameter `name`, checked to be a `.`-boundary prefix.
    pub(crate) fn module_of(&self, name: &str) -> Result<String> {
        let group = match self {
            Grouping::Layer => name.rsplit_once('.').map_or("", |(g, _)| g).to_string(),
            Grouping::Prefix(n) => name.split('.').take(*n).collect::<Vec<_>>().join("."),
            Grouping::Custom(f) => f(name),
        };
        let group = if group == name {
            // A group of one parameter named like the parameter itself.
            name.rsplit_once('.').map_or("", |(g, _)| g).to_string()
        } else {
            group
        };
        if group.is_empty() || name.starts_with(&format!("{group}.")) {
            Ok(group)
        } else {
            Err(Error::Model(format!(
                "the grouping put `{name}` in module `{group}`, which is not a prefix of it ending at a `.`"
            )))
        }
    }
}

/// A tensor a model asks for that is not a parameter (llama2_c's rotary tables, say): the
/// hook returns it, computed, or `None` for a parameter.
pub type Constants =
    Arc<dyn Fn(&str, &Shape, &Device) -> Option<candle_core::Result<Tensor>> + Send + Sync>;

/// One tensor the first pass asked for.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

fn f32_only(name: &str, dtype: DType) -> candle_core::Result<()> {
    if dtype != DType::F32 {
        return Err(crate::error::to_candle(format!(
            "`{name}` asked for {dtype:?}: build the model in f32 (the engine keeps the 16-bit copy and the fp32 master weights)"
        )));
    }
    Ok(())
}

/// The first pass.
pub(crate) struct Recorder {
    pub seen: Arc<Mutex<Vec<Recorded>>>,
    pub constants: Option<Constants>,
}

impl SimpleBackend for Recorder {
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
        f32_only(name, dtype)?;
        let mut seen = self
            .seen
            .lock()
            .map_err(|_| crate::error::to_candle("registration poisoned"))?;
        match seen.iter().find(|r| r.name == name) {
            Some(r) if r.shape != s.dims() => {
                return Err(crate::error::to_candle(format!(
                    "`{name}` asked for twice with shapes {:?} and {:?}",
                    r.shape,
                    s.dims()
                )))
            }
            Some(_) => {}
            None => seen.push(Recorded {
                name: name.to_string(),
                shape: s.dims().to_vec(),
                init: h,
            }),
        }
        Tensor::zeros(s, DType::F32, dev)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        Err(crate::error::to_candle(format!(
            "`{name}` was asked for without a shape: zero-candle creates parameters, so it needs `get` with a shape"
        )))
    }

    fn contains_tensor(&self, _: &str) -> bool {
        false
    }
}

/// The second pass: each name's managed tensor.
pub(crate) struct Live {
    pub tensors: HashMap<String, Tensor>,
    pub constants: Option<Constants>,
}

impl SimpleBackend for Live {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        if let Some(t) = self.constants.as_ref().and_then(|c| c(name, &s, dev)) {
            return t;
        }
        f32_only(name, dtype)?;
        match self.tensors.get(name) {
            Some(t) if t.dims() == s.dims() => Ok(t.clone()),
            Some(t) => Err(crate::error::to_candle(format!(
                "`{name}` has shape {:?}, asked for as {:?}",
                t.dims(),
                s.dims()
            ))),
            None => Err(crate::error::to_candle(format!(
                "`{name}` was not asked for when the model was first built: the constructor must ask for the same tensors every time"
            ))),
        }
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        self.tensors
            .get(name)
            .cloned()
            .ok_or_else(|| crate::error::to_candle(format!("no parameter `{name}`")))
    }

    fn contains_tensor(&self, _: &str) -> bool {
        false
    }
}

/// A [`Constants`] hook for tensors the model computes itself when the `VarBuilder` has
/// none: asking for any of `names` fails, so the model falls back to its own values
/// instead of getting a trainable parameter (of zeros, or random). llama2_c's rotary
/// tables are the case: `Cache::new` reads `freq_cis_real` and `freq_cis_imag` and
/// computes them only if that fails.
pub fn not_parameters(names: &[&str]) -> Constants {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    Arc::new(move |name: &str, _: &Shape, _: &Device| {
        names.iter().any(|n| n == name).then(|| {
            Err(crate::error::to_candle(format!(
                "`{name}` is not a parameter: the model computes it"
            )))
        })
    })
}
