//! Heap memory aligned for `O_DIRECT`, with no `unsafe`: a vector of page-sized,
//! page-aligned blocks, seen as bytes through `bytemuck`.

/// The alignment (and size granularity) `O_DIRECT` transfers use.
pub const ALIGN: usize = 4096;

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(4096))]
struct Block([u8; ALIGN]);

/// A zeroed byte buffer whose start is aligned to [`ALIGN`] and whose capacity is a
/// multiple of it.
pub struct AlignedBuf {
    blocks: Vec<Block>,
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len())
    }
}

impl AlignedBuf {
    /// At least `bytes` bytes (rounded up to a multiple of [`ALIGN`]), zeroed by the
    /// allocator (fresh pages cost nothing until touched).
    pub fn new(bytes: usize) -> Self {
        Self {
            blocks: bytemuck::allocation::zeroed_vec(bytes.div_ceil(ALIGN).max(1)),
        }
    }

    /// A placeholder holding no memory (for a slot whose buffer is lent out).
    pub fn empty() -> Self {
        Self { blocks: Vec::new() }
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.blocks.len() * ALIGN
    }

    /// Whether it holds no memory (only [`AlignedBuf::empty`]).
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        bytemuck::cast_slice(&self.blocks)
    }

    /// The bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.blocks)
    }

    /// The bytes as `f32`s, to fill (a block's size and alignment are multiples of an
    /// `f32`'s, so the view always exists).
    pub fn as_mut_f32s(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(&mut self.blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_aligned_and_rounded_up() {
        for n in [0, 1, 4095, 4096, 4097, 100_000] {
            let mut b = AlignedBuf::new(n);
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert!(b.len() >= n && b.len() % ALIGN == 0);
            let last = b.len() - 1;
            b.as_mut_slice()[last] = 7;
            assert_eq!(b.as_slice()[last], 7);
            let bytes = b.len();
            let floats = b.as_mut_f32s();
            assert_eq!(floats.len(), bytes / 4);
            floats[0] = 1.5;
            assert_eq!(&b.as_slice()[..4], &1.5f32.to_ne_bytes());
        }
    }
}
