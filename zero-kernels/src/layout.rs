//! `FlatLayout`: where each tensor lives in one flat buffer, and which rank owns what.
//!
//! # The choice
//! DeepSpeed pads a flat group to a multiple of `2 × dp` elements (a 4-byte-aligned NCCL
//! start) and cuts it into equal slices that ignore tensor boundaries. Megatron aligns every
//! parameter start to 64 elements and pads each bucket to `lcm(dp, 128)`. We take both
//! halves of that:
//!
//! - every tensor starts on a multiple of `align` elements (default
//!   [`align_elems`]: [`ALIGN_BYTES`] = 512 bytes whatever the dtype, 256 elements of bf16
//!   or 128 of f32: the granularity of PyTorch's CUDA caching allocator, so a parameter that
//!   views the buffer is as aligned as one torch allocated itself, and cuBLAS and fused
//!   kernels, which pick their code path by alignment, take the same path at every stage);
//! - the total is padded to a multiple of `world × align`, so the buffer splits into `world`
//!   equal partitions whose length is a multiple of `align`: every partition start is
//!   aligned too, and a reduce-scatter or all-gather moves equal counts on every rank;
//! - partitions ignore tensor boundaries: a tensor may span ranks and a rank may own none
//!   of a tensor. [`FlatLayout::shards`] says exactly which ranges each rank owns.
//!
//! Padding is at most `align - 1` elements per tensor plus `world × align - 1` at the end.

use crate::{DType, KernelError};
use std::ops::Range;

/// Default alignment of tensor starts, in bytes (PyTorch's CUDA allocator rounds every
/// block to it).
pub const ALIGN_BYTES: usize = 512;

/// [`ALIGN_BYTES`] in elements of `dtype`: where tensors of a default layout start.
pub const fn align_elems(dtype: DType) -> usize {
    ALIGN_BYTES / dtype.size_of()
}

/// A piece of one tensor that lies in one rank's partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Index of the tensor in the layout.
    pub tensor: usize,
    /// The rank whose partition holds it.
    pub rank: usize,
    /// Element range within the tensor.
    pub tensor_range: Range<usize>,
    /// The same elements' range within the flat buffer.
    pub flat_range: Range<usize>,
}

/// Offsets of many tensors in one flat, padded, partitionable buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatLayout {
    sizes: Vec<usize>,
    offsets: Vec<usize>,
    dtype: DType,
    align: usize,
    world: usize,
    total: usize,
}

impl FlatLayout {
    /// Lays out tensors of `sizes` elements, each starting on a multiple of `align`
    /// elements, padded so the total splits into `world` equal aligned partitions.
    pub fn new(
        sizes: &[usize],
        dtype: DType,
        align: usize,
        world: usize,
    ) -> Result<Self, KernelError> {
        if align == 0 {
            return Err(KernelError::InvalidLayout(
                "alignment must be at least 1 element".into(),
            ));
        }
        if world == 0 {
            return Err(KernelError::InvalidLayout(
                "world size must be at least 1".into(),
            ));
        }
        let overflow = || KernelError::InvalidLayout("total size overflows usize".into());
        let mut offsets = Vec::with_capacity(sizes.len());
        let mut end = 0usize;
        for &size in sizes {
            let start = end.checked_next_multiple_of(align).ok_or_else(overflow)?;
            offsets.push(start);
            end = start.checked_add(size).ok_or_else(overflow)?;
        }
        let unit = world.checked_mul(align).ok_or_else(overflow)?;
        let total = end.checked_next_multiple_of(unit).ok_or_else(overflow)?;
        Ok(Self {
            sizes: sizes.to_vec(),
            offsets,
            dtype,
            align,
            world,
            total,
        })
    }

    /// [`FlatLayout::new`] with tensors starting every [`ALIGN_BYTES`] bytes.
    pub fn with_default_alignment(
        sizes: &[usize],
        dtype: DType,
        world: usize,
    ) -> Result<Self, KernelError> {
        Self::new(sizes, dtype, align_elems(dtype), world)
    }

    /// Number of tensors.
    pub fn num_tensors(&self) -> usize {
        self.sizes.len()
    }

    /// Element count of each tensor.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The element type the buffer holds.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Alignment of tensor and partition starts, in elements.
    pub fn align(&self) -> usize {
        self.align
    }

    /// Number of partitions.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Length of the flat buffer in elements, padding included.
    pub fn total_len(&self) -> usize {
        self.total
    }

    /// Length of the flat buffer in bytes.
    pub fn total_bytes(&self) -> usize {
        self.total * self.dtype.size_of()
    }

    /// Elements that belong to tensors (the total without padding).
    pub fn numel(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Padding elements: alignment gaps plus the tail.
    pub fn padding(&self) -> usize {
        self.total - self.numel()
    }

    /// Elements in each rank's partition.
    pub fn partition_len(&self) -> usize {
        self.total / self.world
    }

    /// The flat range of tensor `index`.
    ///
    /// # Panics
    /// Like slice indexing, if `index >= num_tensors()`; see [`FlatLayout::try_tensor_range`].
    pub fn tensor_range(&self, index: usize) -> Range<usize> {
        self.offsets[index]..self.offsets[index] + self.sizes[index]
    }

    /// The flat range of tensor `index`, or an error if there is no such tensor.
    pub fn try_tensor_range(&self, index: usize) -> Result<Range<usize>, KernelError> {
        match (self.offsets.get(index), self.sizes.get(index)) {
            (Some(&o), Some(&s)) => Ok(o..o + s),
            _ => Err(KernelError::TensorOutOfRange {
                index,
                count: self.sizes.len(),
            }),
        }
    }

    /// The flat range of rank `rank`'s partition.
    pub fn partition_range(&self, rank: usize) -> Result<Range<usize>, KernelError> {
        if rank >= self.world {
            return Err(KernelError::RankOutOfRange {
                rank,
                world: self.world,
            });
        }
        let len = self.partition_len();
        Ok(rank * len..(rank + 1) * len)
    }

    /// The tensor pieces in rank `rank`'s partition, in flat order. Tensors the rank owns
    /// none of are absent; empty tensors are never listed.
    pub fn shards(&self, rank: usize) -> Result<Vec<Shard>, KernelError> {
        let part = self.partition_range(rank)?;
        // Tensors are sorted by offset: the first that can reach into the partition is the
        // last one starting before it, found by binary search.
        let first = self
            .offsets
            .partition_point(|&o| o < part.start)
            .saturating_sub(1);
        let mut out = Vec::new();
        for t in first..self.sizes.len() {
            let r = self.tensor_range(t);
            if r.start >= part.end {
                break;
            }
            if let Some(s) = self.clip(t, rank, &part) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Every rank's piece of tensor `index`, in rank order; ranks that own none are absent.
    pub fn tensor_shards(&self, index: usize) -> Result<Vec<Shard>, KernelError> {
        let r = self.try_tensor_range(index)?;
        if r.is_empty() {
            return Ok(Vec::new());
        }
        let len = self.partition_len();
        let (first, last) = (r.start / len, (r.end - 1) / len);
        Ok((first..=last)
            .filter_map(|rank| self.clip(index, rank, &(rank * len..(rank + 1) * len)))
            .collect())
    }

    fn clip(&self, tensor: usize, rank: usize, part: &Range<usize>) -> Option<Shard> {
        let r = self.tensor_range(tensor);
        let start = r.start.max(part.start);
        let end = r.end.min(part.end);
        (start < end).then(|| Shard {
            tensor,
            rank,
            tensor_range: start - r.start..end - r.start,
            flat_range: start..end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_aligned_and_partitions_equal() {
        let l = FlatLayout::new(&[3, 0, 130, 1], DType::BF16, 64, 3).unwrap();
        assert_eq!(l.tensor_range(0), 0..3);
        assert_eq!(l.tensor_range(1), 64..64);
        assert_eq!(l.tensor_range(2), 64..194);
        assert_eq!(l.tensor_range(3), 256..257);
        assert_eq!(l.total_len(), 384); // next multiple of 3 * 64
        assert_eq!(l.partition_len(), 128);
        assert_eq!(l.padding(), 384 - 134);
        assert_eq!(l.total_bytes(), 768);
    }

    #[test]
    fn tensor_split_across_ranks_and_rank_owning_nothing() {
        // 1 tensor of 10 elements, align 1, world 4: partitions of 3 (total padded to 12).
        let l = FlatLayout::new(&[10], DType::F32, 1, 4).unwrap();
        let s = l.tensor_shards(0).unwrap();
        let ranges: Vec<_> = s.iter().map(|s| (s.rank, s.tensor_range.clone())).collect();
        assert_eq!(ranges, vec![(0, 0..3), (1, 3..6), (2, 6..9), (3, 9..10)]);
        // With align 8 and world 2: total 16, partitions of 8; tensor [0,3) on rank 0 only.
        let l = FlatLayout::new(&[3, 2], DType::F32, 8, 2).unwrap();
        assert_eq!(
            l.shards(1)
                .unwrap()
                .iter()
                .map(|s| s.tensor)
                .collect::<Vec<_>>(),
            vec![1]
        );
        assert!(l.tensor_shards(0).unwrap().iter().all(|s| s.rank == 0));
        let l = FlatLayout::new(&[1], DType::F32, 1, 5).unwrap();
        assert!(l.shards(3).unwrap().is_empty());
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(FlatLayout::new(&[1], DType::F32, 0, 1).is_err());
        assert!(FlatLayout::new(&[1], DType::F32, 1, 0).is_err());
        assert!(FlatLayout::new(&[usize::MAX, 2], DType::F32, 1, 1).is_err());
        let l = FlatLayout::new(&[1], DType::F32, 1, 2).unwrap();
        assert_eq!(
            l.partition_range(2),
            Err(KernelError::RankOutOfRange { rank: 2, world: 2 })
        );
        assert!(l.try_tensor_range(1).is_err());
    }
}
