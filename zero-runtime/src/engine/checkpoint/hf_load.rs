//! `load_hf_checkpoint`: a Hugging Face checkpoint's weights into a running engine, each
//! rank reading the byte ranges of what it holds and nothing else.
//!
//! Every rank opens the folder (the files' headers: where each tensor's bytes are), finds
//! each parameter's tensor by Hugging Face's key rules (its name or one of its aliases,
//! with or without the model's base prefix; tied weights stored once), checks shapes, and
//! reads the element ranges of its master weights (its partition of each bucket in stages
//! 1–3, every bucket in stage 0; frozen parameters whole) through the checkpoint load's
//! staging. The ranks then agree: any rank's failure fails every rank and changes
//! nothing. The master weights take the file's values, first rounded to the loading
//! model's 16-bit dtype where [`HfLoadOptions::round_to`] names one (DeepSpeed's master
//! weights of a loaded 16-bit model). The 16-bit parameters are rounded from the new master weights (and gathered
//! where the stage keeps them whole); the moments start from zero, as after a
//! weights-only load.

use super::super::Engine;
use super::load::{Resume, Sink, Source};
use crate::checkpoint::hf::{HfCheckpoint, HfReadStats};
use crate::checkpoint::resolve::StateKind;
use crate::checkpoint::{CheckpointError, LoadOptions};
use crate::device::Device;
use crate::EngineError;
use std::collections::HashSet;
use std::ops::Range;
use std::path::Path;
use zero_comm::Communicator;
use zero_kernels::{DType, Element};

/// How [`Engine::load_hf_checkpoint`] matches the checkpoint to the model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HfLoadOptions {
    /// Every parameter must be in the checkpoint, and every tensor of the checkpoint a
    /// parameter (or in `ignore`). Without it, parameters missing from the checkpoint keep
    /// their values and tensors the model lacks are left.
    pub strict: bool,
    /// The model's base prefix (`model` for `LlamaForCausalLM`): a checkpoint saved from
    /// the base model, or from a model with a head, loads either way, as in transformers.
    pub prefix: Option<String>,
    /// Tensors of the checkpoint that are not parameters and that the caller takes itself
    /// (a front-end's buffers).
    pub ignore: Vec<String>,
    /// The dtype of the model the weights are loaded into, when 16-bit: each value is
    /// rounded to it before it becomes a master weight, as when transformers loads the
    /// file into a model of that dtype and DeepSpeed (or `initialize`) makes the fp32
    /// master weights from its parameters. `None` (or `F32`): the file's values, widened.
    pub round_to: Option<DType>,
}

/// `vals` rounded to `dtype` and widened back (nothing for `F32`).
fn round_through(vals: &mut [f32], dtype: DType) {
    fn through<T: Element>(vals: &mut [f32]) {
        vals.iter_mut().for_each(|v| *v = T::from_f32(*v).to_f32());
    }
    match dtype {
        DType::F32 => {}
        DType::BF16 => through::<half::bf16>(vals),
        DType::F16 => through::<half::f16>(vals),
    }
}

/// Where each parameter's tensor is.
struct HfSource<'a> {
    ck: &'a mut HfCheckpoint,
    keys: &'a [Option<String>],
    round_to: Option<DType>,
}

impl Source for HfSource<'_> {
    fn has(&self, id: usize) -> bool {
        self.keys[id].is_some()
    }

    fn state(
        &mut self,
        id: usize,
        kind: StateKind,
        range: Range<usize>,
        sink: Sink<'_>,
    ) -> Result<(), CheckpointError> {
        let Some(key) = &self.keys[id] else {
            return Ok(());
        };
        let mut vals = vec![0f32; range.len()];
        if kind == StateKind::Master {
            self.ck.read_f32(key, range, &mut vals)?;
            if let Some(dtype) = self.round_to {
                round_through(&mut vals, dtype);
            }
        }
        sink(0, &vals)
    }

    fn frozen(&mut self, id: usize, range: Range<usize>) -> Result<Vec<f32>, CheckpointError> {
        let Some(key) = &self.keys[id] else {
            return Ok(Vec::new());
        };
        let mut vals = vec![0f32; range.len()];
        self.ck.read_f32(key, range, &mut vals)?;
        Ok(vals)
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Loads the weights of the Hugging Face checkpoint in `dir` (`model.safetensors`, or
    /// shards with `model.safetensors.index.json`) into this engine: every rank calls it at
    /// a step boundary and reads only the byte ranges of what it holds. Returns what this
    /// rank read, and the checkpoint's tensors no parameter took (the caller's buffers,
    /// say). All or nothing across ranks: a missing or unexpected tensor (strict), a wrong
    /// shape, a damaged or missing file fails every rank, naming the tensor and the file,
    /// and nothing changes.
    pub fn load_hf_checkpoint(
        &mut self,
        dir: &Path,
        options: &HfLoadOptions,
    ) -> Result<(HfReadStats, Vec<String>), EngineError> {
        self.require_boundary("load_hf_checkpoint")?;
        let read = self.read_hf(dir, options);
        let outcome = read.as_ref().map(|_| ()).map_err(|e| match e {
            EngineError::Checkpoint(c) => c.clone(),
            other => CheckpointError::Io(other.to_string()),
        });
        if let Err(e) = self.agree_outcome(outcome, "agreeing that every rank read its weights") {
            if let Ok((staged, _, _)) = read {
                self.discard(staged);
            }
            return Err(e);
        }
        let (staged, stats, left) = read?;
        let options = LoadOptions {
            load_module_only: true,
            ..LoadOptions::default()
        };
        self.apply(staged, options)?;
        Ok((stats, left))
    }

    /// Opens the checkpoint, matches it to the model and reads this rank's part.
    #[allow(clippy::type_complexity)]
    fn read_hf(
        &mut self,
        dir: &Path,
        options: &HfLoadOptions,
    ) -> Result<(super::load::Staged<C::Buffer>, HfReadStats, Vec<String>), EngineError> {
        let mut ck = HfCheckpoint::open(dir, 4 << 20)?;
        let mismatch = |path: &Path, reason: String| CheckpointError::Mismatch {
            path: path.display().to_string(),
            reason,
        };
        let prefixed = |name: &str| -> Vec<String> {
            let mut v = vec![name.to_string()];
            if let Some(p) = &options.prefix {
                v.push(format!("{p}.{name}"));
                if let Some(bare) = name.strip_prefix(&format!("{p}.")) {
                    v.push(bare.to_string());
                }
            }
            v
        };
        let mut keys: Vec<Option<String>> = Vec::with_capacity(self.param_count());
        for id in 0..self.param_count() {
            let name = self.param_name(id);
            let spec = self.param_spec(id);
            let mut names = vec![name.clone()];
            names.extend(spec.aliases.iter().cloned());
            let found = names
                .iter()
                .flat_map(|n| prefixed(n))
                .find(|k| ck.tensors().contains_key(k));
            match found {
                Some(k) => {
                    let t = &ck.tensors()[&k];
                    if t.shape != spec.shape {
                        return Err(mismatch(
                            ck.file_of(t),
                            format!(
                                "tensor `{k}` has shape {:?} in the checkpoint and {:?} in the model",
                                t.shape, spec.shape
                            ),
                        )
                        .into());
                    }
                    keys.push(Some(k));
                }
                None if options.strict => {
                    return Err(mismatch(
                        dir,
                        format!("the model's parameter `{name}` is not in the checkpoint (load with strict = false to keep its value)"),
                    )
                    .into())
                }
                None => keys.push(None),
            }
        }
        let taken: HashSet<&str> = keys.iter().flatten().map(|k| k.as_str()).collect();
        let left: Vec<String> = ck
            .tensors()
            .keys()
            .filter(|k| !taken.contains(k.as_str()))
            .cloned()
            .collect();
        if options.strict {
            let ignored: HashSet<String> =
                options.ignore.iter().flat_map(|n| prefixed(n)).collect();
            if let Some(extra) = left.iter().find(|k| !ignored.contains(*k)) {
                let t = &ck.tensors()[extra];
                return Err(mismatch(
                    ck.file_of(t),
                    format!("the checkpoint's tensor `{extra}` is not a parameter of the model (load with strict = false to leave it)"),
                )
                .into());
            }
        }
        let (opt, frozen, offload) = self.stage_from(
            &mut HfSource {
                ck: &mut ck,
                keys: &keys,
                round_to: options.round_to,
            },
            false,
        )?;
        let (optimizer, skipped, global) = self.step_counts();
        let staged = super::load::Staged {
            opt,
            frozen,
            offload,
            resume: Resume {
                steps: crate::checkpoint::format::Steps {
                    optimizer,
                    skipped,
                    global,
                },
                scaler: None,
                lr_last_batch_iteration: None,
                client_state: serde_json::Value::Null,
            },
        };
        Ok((staged, ck.stats(), left))
    }
}
