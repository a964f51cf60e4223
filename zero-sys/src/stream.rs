//! Streaming (non-temporal) stores: writes that go to memory without first reading the
//! destination's cache lines for ownership and without filling the caches.
//!
//! For an output far larger than the caches that nothing reads soon (a reduce-scatter's
//! shard of a large gradient bucket), an ordinary store reads every line before writing
//! it: a third more memory traffic than the bytes written. Streaming stores are weakly
//! ordered: [`fence`] must run, on the thread that stored, before another thread or
//! process is told the data is there.

use bytemuck::Pod;

/// Bytes per streaming store (SSE2's, part of every x86-64 CPU).
const LANE: usize = 16;

/// Copies `src` into `dst` (the same length): streaming stores for the 16-byte-aligned
/// body of `dst`, ordinary ones for its unaligned head and tail (and everywhere on CPUs
/// other than x86-64). Call [`fence`] before publishing `dst`.
///
/// # Panics
/// If the lengths differ.
pub fn copy_streaming<T: Pod>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming of unequal lengths");
    let d: &mut [u8] = bytemuck::cast_slice_mut(dst);
    let s: &[u8] = bytemuck::cast_slice(src);
    let head = d.as_ptr().align_offset(LANE).min(d.len());
    let body = (d.len() - head) / LANE * LANE;
    d[..head].copy_from_slice(&s[..head]);
    stream_body(&mut d[head..head + body], &s[head..head + body]);
    d[head + body..].copy_from_slice(&s[head + body..]);
}

#[cfg(target_arch = "x86_64")]
fn stream_body(d: &mut [u8], s: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    debug_assert!(d.len() == s.len() && d.len() % LANE == 0);
    debug_assert!(d.is_empty() || d.as_ptr() as usize % LANE == 0);
    for (dc, sc) in d.chunks_exact_mut(LANE).zip(s.chunks_exact(LANE)) {
        // SAFETY: both chunks are 16 bytes in bounds; `dc` is 16-byte aligned (the body
        // starts aligned and steps by 16), `sc` is read unaligned; SSE2 is part of the
        // x86-64 baseline.
        unsafe {
            let v = _mm_loadu_si128(sc.as_ptr().cast::<__m128i>());
            _mm_stream_si128(dc.as_mut_ptr().cast::<__m128i>(), v);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn stream_body(d: &mut [u8], s: &[u8]) {
    d.copy_from_slice(s);
}

/// Orders this thread's streaming stores before its later stores (such as the release
/// that tells another thread or process the data is there).
pub fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no operands and only orders stores; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_and_alignment_exactly() {
        // Seeded bytes, never zeros; every head offset and odd lengths, into poisoned
        // destinations.
        let seed = 0x5eed_u64;
        println!("seed {seed:#x}");
        let mut x = seed;
        let src: Vec<u8> = (0..1000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8 | 1
            })
            .collect();
        for off in 0..LANE {
            for len in [0, 1, 15, 16, 17, 63, 64, 65, 333, 1000 - LANE] {
                let mut dst = vec![0xAAu8; 1000 + LANE];
                copy_streaming(&mut dst[off..off + len], &src[..len]);
                fence();
                assert_eq!(
                    &dst[off..off + len],
                    &src[..len],
                    "offset {off}, length {len}"
                );
                assert!(
                    dst[..off].iter().all(|&b| b == 0xAA),
                    "wrote before the start"
                );
                assert!(
                    dst[off + len..].iter().all(|&b| b == 0xAA),
                    "wrote past the end"
                );
            }
        }
        let wide: Vec<f32> = (0..37).map(|i| i as f32 * 1.5 - 7.0).collect();
        let mut out = vec![f32::NAN; 37];
        copy_streaming(&mut out, &wide);
        fence();
        assert_eq!(out, wide);
    }

    #[test]
    #[should_panic(expected = "unequal lengths")]
    fn unequal_lengths_panic() {
        copy_streaming(&mut [0u8; 3], &[1u8; 4]);
    }
}
