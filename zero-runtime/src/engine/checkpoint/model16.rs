//! `save_16bit_model`: the trained weights in the run's 16-bit dtype, consolidated into
//! one Hugging Face safetensors set by rank 0 (as DeepSpeed writes it); `save_hf_weights`:
//! the same set with the writing shared among the ranks.

use super::super::Engine;
use crate::checkpoint::export::{HfWriter, DEFAULT_MAX_SHARD};
use crate::checkpoint::format::TensorSpec;
use crate::checkpoint::CheckpointError;
use crate::device::Device;
use crate::io::{WrittenFile, DEFAULT_BUFFER};
use crate::EngineError;
use std::path::Path;
use zero_comm::{Communicator, Completion};
use zero_kernels::DType;

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Writes the model's weights, in the run's 16-bit dtype (fp32 for an fp32 run), to
    /// `dir` as `model-0000k-of-0000n.safetensors` and `model.safetensors.index.json`
    /// (shards of at most 5 GB), every parameter whole under its `module.param` name.
    /// Every rank calls it; rank 0 writes. Under stage 3 the sharded parameters are
    /// gathered bucket by bucket, which DeepSpeed asks to be enabled with
    /// `stage3_gather_16bit_weights_on_model_save`; without it this is an error naming that
    /// key. Returns the files written (on rank 0; empty elsewhere).
    pub fn save_16bit_model(&mut self, dir: &Path) -> Result<Vec<WrittenFile>, EngineError> {
        self.require_boundary("save_16bit_model")?;
        if self.policy.shards_parameters() && !self.cfg.zero.gather_16bit_weights_on_model_save {
            return Err(CheckpointError::Gather16.into());
        }
        self.save_weights(dir, DEFAULT_MAX_SHARD, self.dtype, true, false)
    }

    /// Writes the model's weights to `dir` as Hugging Face safetensors shards of at most
    /// `max_shard_bytes` (`model-0000k-of-0000n.safetensors` and
    /// `model.safetensors.index.json`), each parameter whole in `dtype`, tied weights once
    /// under their first name, as
    /// `save_pretrained` stores them. The values are the parameters' (rounded to a 16-bit
    /// `dtype`), except fp32 from a 16-bit run: then trainable parameters are their fp32
    /// master weights, gathered from the ranks' partitions (what DeepSpeed's
    /// `zero_to_fp32` recovers), and frozen ones their 16-bit values widened. Every rank
    /// calls it, and the ranks share the writing
    /// of `dir` (a folder they all see: one host, or a shared filesystem): shard `k` is
    /// written by rank `k mod world`, the index by rank 0, while the ranks gather one bucket
    /// at a time. Any rank's failure is an error on every rank. Returns the files this rank
    /// wrote.
    pub fn save_hf_weights(
        &mut self,
        dir: &Path,
        max_shard_bytes: u64,
        dtype: DType,
    ) -> Result<Vec<WrittenFile>, EngineError> {
        self.save_weights(dir, max_shard_bytes, dtype, false, true)
    }

    /// Both savers: with `aliases`, tied weights under each of their names; with `shared`,
    /// every rank writes its shards (else rank 0 writes all).
    fn save_weights(
        &mut self,
        dir: &Path,
        max_shard_bytes: u64,
        dtype: DType,
        aliases: bool,
        shared: bool,
    ) -> Result<Vec<WrittenFile>, EngineError> {
        self.require_boundary("saving the model's weights")?;
        self.on_replica_zero(
            "saving the model's weights",
            |e| {
                let mut files = Vec::new();
                let result = e
                    .write_hf(dir, max_shard_bytes, dtype, aliases, shared)
                    .map(|written| files = written);
                e.agree_outcome(result, "saving the model's weights")?;
                Ok(files)
            },
            |_| String::new(),
            |_| Vec::new(), // (replica 0 wrote the files)
        )
    }

    /// The writers (every rank with `shared`, else rank 0) write bucket by bucket (a
    /// stage-3 bucket, trainable or frozen, gathered on every rank first), then the frozen
    /// parameters kept whole; each
    /// downloads only the tensors of its own shards.
    fn write_hf(
        &mut self,
        dir: &Path,
        max_shard_bytes: u64,
        dtype: DType,
        aliases: bool,
        shared: bool,
    ) -> Result<Vec<WrittenFile>, EngineError> {
        let mut order: Vec<usize> = Vec::with_capacity(self.param_count());
        for plan in &self.plan.buckets {
            order.extend(&plan.params);
        }
        let frozen = self.frozen_buffer_params();
        order.extend(frozen.iter().map(|&(id, _)| id));
        let mut writer = if shared || self.shard.rank == 0 {
            let mut specs: Vec<TensorSpec> = Vec::with_capacity(order.len());
            for &id in &order {
                for name in self.names_of(id, aliases) {
                    specs.push(TensorSpec {
                        name,
                        dtype,
                        shape: self.param_spec(id).shape.clone(),
                    });
                }
            }
            let (rank, world) = if shared {
                (self.shard.rank, self.shard.size)
            } else {
                (0, 1)
            };
            Some(HfWriter::shared(
                dir,
                &specs,
                max_shard_bytes,
                DEFAULT_BUFFER,
                rank,
                world,
            )?)
        } else {
            None
        };
        // fp32 from a 16-bit run: the master weights, not the rounded parameters.
        let masters = dtype == DType::F32 && self.dtype != DType::F32;
        // A write that fails must not stop rank 0 from joining the other ranks' gathers:
        // the first failure is kept and returned at the end.
        let mut failure: Option<EngineError> = None;
        for b in 0..self.buckets.len() {
            let layout = self.plan.buckets[b].layout.clone();
            let gathered = if masters && !self.plan.buckets[b].frozen {
                Some(self.whole_masters(b)?)
            } else {
                self.gather_if_sharded(b)?
            };
            if let (Some(w), None) = (writer.as_mut(), &failure) {
                let full = match &gathered {
                    Some(g) => Ok(g),
                    None => self.buckets[b].params.get(),
                };
                let wrote = full.and_then(|full| {
                    for (i, &id) in self.plan.buckets[b].params.iter().enumerate() {
                        let range = layout.tensor_range(i);
                        self.write_param(w, id, aliases, |e| e.dev.download_f32(full, range))?;
                    }
                    Ok(())
                });
                failure = wrote.err();
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let Some(mut w) = writer else {
            return Ok(Vec::new());
        };
        for (id, offset) in frozen {
            let n = self.param_spec(id).numel();
            self.write_param(&mut w, id, aliases, |e| {
                e.dev.download_f32(&e.frozen, offset..offset + n)
            })?;
        }
        Ok(w.finish()?)
    }

    /// Bucket `b`'s fp32 master weights, whole: gathered from the ranks' partitions at
    /// stages 1–3 (a collective), read from wherever they live (the device or the offload
    /// tier).
    fn whole_masters(&mut self, b: usize) -> Result<C::Buffer, EngineError> {
        let layout = self.plan.buckets[b].layout.clone();
        let held = if self.policy.shards_optimizer() {
            layout.partition_len()
        } else {
            layout.total_len()
        };
        let mut part = self.dev.zeros(DType::F32, held)?;
        if self.offload.is_some() {
            let mut vals = vec![0f32; held];
            self.read_held(b, 0, 0..held, |at, x| {
                vals[at..at + x.len()].copy_from_slice(x);
                Ok(())
            })?;
            self.dev.upload_f32(&mut part, 0, &vals)?;
        } else {
            let (buf, at) = self.held_array(b, 0)?;
            self.dev
                .copy(buf, Self::held_range(at, 0..held), &mut part, 0)?;
        }
        if !self.policy.shards_optimizer() {
            return Ok(part);
        }
        let output = self.dev.zeros(DType::F32, layout.total_len())?;
        let work = self.issue(
            |c| &mut c.param_gather,
            |comm| comm.all_gather(part, output),
        )?;
        Ok(work.wait()?.1)
    }

    /// Parameter `id` under each of its names, its values downloaded by `values` only where
    /// `w` writes them.
    fn write_param(
        &self,
        w: &mut HfWriter,
        id: usize,
        aliases: bool,
        values: impl FnOnce(&Self) -> Result<Vec<f32>, EngineError>,
    ) -> Result<(), EngineError> {
        let names = self.names_of(id, aliases);
        // Tied names are planned one after another and can straddle a shard's end.
        let mut fetch = Some(values);
        let mut got: Vec<f32> = Vec::new();
        for name in names {
            if !w.owns_next() {
                w.skip_tensor(&name)?;
                continue;
            }
            if let Some(f) = fetch.take() {
                got = f(self)?;
            }
            w.write_tensor(&name, &got)?;
        }
        Ok(())
    }

    /// Parameter `id`'s name, then (with `aliases`) its other names (tied weights).
    fn names_of(&self, id: usize, aliases: bool) -> Vec<String> {
        let others = if aliases {
            self.param_spec(id).aliases.as_slice()
        } else {
            &[]
        };
        std::iter::once(self.param_name(id))
            .chain(others.iter().cloned())
            .collect()
    }
}
