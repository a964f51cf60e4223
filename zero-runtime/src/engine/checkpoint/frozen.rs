//! The frozen file of a checkpoint: every frozen parameter, whole, in the 16-bit dtype,
//! written by rank 0. Those kept whole are read from the frozen buffer; stage 3's frozen
//! buckets are all-gathered one at a time on every rank (a collective, joined whatever
//! else failed on the rank) and written from the gathered bucket, so no rank holds more
//! than one of them at once.

use super::super::Engine;
use super::save::file_meta;
use crate::checkpoint::export::encode_into;
use crate::checkpoint::format::{safetensors_header, TensorSpec};
use crate::device::Device;
use crate::io::{FileWriter, WrittenFile, DEFAULT_BUFFER};
use crate::EngineError;
use std::ops::Range;
use std::path::Path;
use zero_comm::Communicator;

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Every rank calls it (with frozen buckets it gathers them); rank 0 writes `path`
    /// where `write`. `None` where the model has no frozen parameter or this rank writes
    /// nothing.
    pub(super) fn write_frozen_file(
        &mut self,
        path: &Path,
        write: bool,
    ) -> Result<Option<WrittenFile>, EngineError> {
        let whole = self.frozen_buffer_params();
        let buckets: Vec<usize> = (self.trainable_range().end..self.buckets.len()).collect();
        if whole.is_empty() && buckets.is_empty() {
            return Ok(None);
        }
        let mut writer = None;
        // A failure on rank 0 must not keep it from the other ranks' gathers: the first
        // one is kept and returned at the end.
        let mut failure: Option<EngineError> = None;
        if self.shard.rank == 0 && write {
            match self.open_frozen_file(path, &whole, &buckets) {
                Ok(w) => writer = Some(w),
                Err(e) => failure = Some(e),
            }
        }
        if let Some(w) = writer.as_mut() {
            for &(id, offset) in &whole {
                let n = self.param_spec(id).numel();
                if let Err(e) = self.stream_encoded(w, &self.frozen, offset..offset + n) {
                    failure.get_or_insert(e);
                    break;
                }
            }
        }
        for b in buckets {
            let layout = self.plan.buckets[b].layout.clone();
            let full = self.gather_if_sharded(b)?;
            let (Some(w), None) = (writer.as_mut(), &failure) else {
                continue;
            };
            let buf = match &full {
                Some(f) => f,
                None => self.buckets[b].params.get()?,
            };
            for i in 0..self.plan.buckets[b].params.len() {
                if let Err(e) = self.stream_encoded(w, buf, layout.tensor_range(i)) {
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(match writer {
            Some(w) => Some(w.finish()?),
            None => None,
        })
    }

    /// The frozen file with its header: the parameters kept whole, then each frozen
    /// bucket's, in the order they are written.
    fn open_frozen_file(
        &self,
        path: &Path,
        whole: &[(usize, usize)],
        buckets: &[usize],
    ) -> Result<FileWriter, EngineError> {
        let ids = whole.iter().map(|&(id, _)| id).chain(
            buckets
                .iter()
                .flat_map(|&b| self.plan.buckets[b].params.clone()),
        );
        let tensors: Vec<TensorSpec> = ids
            .map(|id| TensorSpec {
                name: self.param_name(id),
                dtype: self.dtype,
                shape: self.param_spec(id).shape.clone(),
            })
            .collect();
        let meta = file_meta("frozen", self.shard.rank, self.shard.size);
        let mut w = FileWriter::create(path, DEFAULT_BUFFER)?;
        w.write(&safetensors_header(&tensors, meta)?)?;
        Ok(w)
    }

    /// Streams elements `range` of `buf` into `w` in the engine's dtype.
    fn stream_encoded(
        &self,
        w: &mut FileWriter,
        buf: &C::Buffer,
        range: Range<usize>,
    ) -> Result<(), EngineError> {
        let size = self.dtype.size_of();
        let mut vals: Vec<f32> = Vec::new();
        w.write_with(range.len() * size, |at, dst| {
            let first = range.start + at / size;
            vals.resize(dst.len() / size, 0.0);
            self.dev
                .download_f32_into(buf, first..first + vals.len(), &mut vals)?;
            encode_into(&vals, self.dtype, dst).map_err(EngineError::from)
        })
    }
}
