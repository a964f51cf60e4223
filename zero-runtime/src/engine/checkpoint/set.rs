//! New values for some parameters, chosen by one rank: what DeepSpeed's
//! `GatheredParameters(modifier_rank=r)` does on exit. The values travel from rank `r` to
//! every rank, each rank writes the fp32 master weights it holds, and the 16-bit parameters
//! are rounded from the master weights as after a load (the optimizer's moments are kept).

use super::super::Engine;
use crate::device::Device;
use crate::EngineError;
use zero_comm::{Communicator, Completion};
use zero_kernels::DType;

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Sets each listed parameter (by global id, [`Engine::param_id`]) to rank `root`'s
    /// values, on every rank: a collective every rank
    /// calls with the same ids (the values of other ranks are ignored). Between optimizer
    /// steps only; not with `offload_optimizer`.
    pub fn set_params(
        &mut self,
        values: Vec<(usize, Vec<f32>)>,
        root: usize,
    ) -> Result<(), EngineError> {
        self.require_boundary("set_params")?;
        if self.offload.is_some() {
            return Err(EngineError::Order(
                "set_params (GatheredParameters with modifier_rank) is not supported with offload_optimizer".into(),
            ));
        }
        if root >= self.dp.size {
            return Err(EngineError::Order(format!(
                "modifier rank {root} is not a rank of a group of {}",
                self.dp.size
            )));
        }
        // Where each parameter's values sit in the one broadcast buffer.
        let mut offsets = vec![None; self.param_count()];
        let mut total = 0;
        for (id, v) in &values {
            if *id >= self.param_count() {
                return Err(EngineError::InvalidModel(format!(
                    "parameter {id} does not exist: the model has {}",
                    self.param_count()
                )));
            }
            let spec = self.param_spec(*id);
            if v.len() != spec.numel() {
                return Err(EngineError::GradShape {
                    module: self.param_name(*id),
                    detail: format!("{} values for {} elements", v.len(), spec.numel()),
                });
            }
            offsets[*id] = Some(total);
            total += v.len();
        }
        // Rank root's values to every rank, in one broadcast.
        let mut flat = self.dev.zeros(DType::F32, total)?;
        if self.dp.rank == root {
            let mut at = 0;
            for (_, v) in &values {
                self.dev.upload_f32(&mut flat, at, v)?;
                at += v.len();
            }
        }
        // Inside each shard group from root's position, then across the replicas from
        // root's group (with `mics_shard_size`; else the second is nothing).
        let (s, at) = (self.shard.size, root % self.shard.size);
        let work = self.issue(|c| &mut c.control, |comm| comm.broadcast(flat, at))?;
        let flat = work.wait()?;
        let work = self.issue(
            |c| &mut c.control,
            |comm| comm.replicas_broadcast(flat, root / s),
        )?;
        let flat = work.wait()?;
        for b in self.trainable_range() {
            let start = self.opt_start(b)?;
            for piece in self.held_pieces(b)? {
                let Some(from) = offsets[piece.param] else {
                    continue;
                };
                let src = from + piece.tensor_range.start..from + piece.tensor_range.end;
                let at = piece.flat_range.start - start;
                let (dev, master, held) = self.master_mut(b)?;
                dev.copy(&flat, src, master, held + at)?;
            }
        }
        for id in self.frozen_ids() {
            let Some(from) = offsets[id] else {
                continue;
            };
            for r in self.held_ranges(id)? {
                let vals = self.dev.download_f32(&flat, from + r.start..from + r.end)?;
                self.upload_held(id, r, &vals)?;
            }
        }
        self.params_from_master()
    }

    /// Sets each listed parameter (by global id) to `values` on this rank only, with no
    /// collective: the parameters this rank holds (whole, or its shards in stage 3) and its
    /// held master weights; the optimizer's moments are kept. What a front-end calls when
    /// the trainer changed a parameter itself (PyTorch's `load_state_dict` or `p.data = …`
    /// after the engine was built): each rank passes its own values, so ranks that change
    /// a parameter alike stay alike. Checked before anything is written; not with
    /// `offload_optimizer` (the master weights live in the offload tier).
    pub fn adopt_params(&mut self, values: &[(usize, Vec<f32>)]) -> Result<(), EngineError> {
        if self.offload.is_some() {
            return Err(EngineError::Order(
                "changing parameters in place after the engine was built is not supported with offload_optimizer: load a checkpoint instead".into(),
            ));
        }
        let mut by_id: Vec<Option<&[f32]>> = vec![None; self.param_count()];
        for (id, v) in values {
            if *id >= self.param_count() {
                return Err(EngineError::InvalidModel(format!(
                    "parameter {id} does not exist: the model has {}",
                    self.param_count()
                )));
            }
            let n = self.param_spec(*id).numel();
            if v.len() != n {
                return Err(EngineError::GradShape {
                    module: self.param_name(*id),
                    detail: format!("{} values for {n} elements", v.len()),
                });
            }
            by_id[*id] = Some(v);
        }
        for (id, v) in values {
            self.upload_param(*id, v)?;
        }
        for b in self.trainable_range() {
            if self.buckets[b].opt.master.is_none() {
                continue; // fp32: written with the parameters
            }
            let start = self.opt_start(b)?;
            for piece in self.held_pieces(b)? {
                let Some(v) = by_id[piece.param] else {
                    continue;
                };
                let at = piece.flat_range.start - start;
                let (dev, master, held) = self.master_mut(b)?;
                dev.upload_f32(master, held + at, &v[piece.tensor_range])?;
            }
        }
        Ok(())
    }

    /// The global id of parameter `k` of module `m` (registration order over all modules).
    pub fn param_id(&self, m: usize, k: usize) -> Result<usize, EngineError> {
        let module = self.module(m)?;
        if k >= module.params.len() {
            return Err(EngineError::GradShape {
                module: module.name.clone(),
                detail: format!("no parameter {k}: the module has {}", module.params.len()),
            });
        }
        Ok(self.plan.param_id(m, k))
    }
}
