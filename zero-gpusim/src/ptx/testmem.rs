//! Test support: a flat global memory of named allocations with bounds checks, and the
//! packing of kernel parameters.

use super::{GlobalMemory, Kernel};

/// A value that travels as little-endian bytes.
pub(crate) trait Elem: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

macro_rules! elem {
    ($t:ty, $n:expr, $to:expr, $from:expr) => {
        impl Elem for $t {
            const SIZE: usize = $n;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&($to)(self));
            }
            fn get(b: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(&b[..$n]);
                ($from)(a)
            }
        }
    };
}
elem!(f32, 4, f32::to_le_bytes, f32::from_le_bytes);
elem!(f64, 8, f64::to_le_bytes, f64::from_le_bytes);
elem!(u16, 2, u16::to_le_bytes, u16::from_le_bytes);
elem!(u32, 4, u32::to_le_bytes, u32::from_le_bytes);
elem!(i32, 4, i32::to_le_bytes, i32::from_le_bytes);
elem!(u64, 8, u64::to_le_bytes, u64::from_le_bytes);
elem!(
    half::f16,
    2,
    |x: half::f16| x.to_le_bytes(),
    half::f16::from_le_bytes
);
elem!(
    half::bf16,
    2,
    |x: half::bf16| x.to_le_bytes(),
    half::bf16::from_le_bytes
);

/// The bytes of a slice.
pub(crate) fn bytes<T: Elem>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    for &x in v {
        x.put(&mut out);
    }
    out
}

/// A slice back from bytes.
pub(crate) fn values<T: Elem>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(T::SIZE).map(T::get).collect()
}

struct Alloc {
    name: String,
    base: u64,
    data: Vec<u8>,
}

/// Global memory for tests: allocations 256-byte aligned with unmapped gaps between them.
pub(crate) struct TestMem {
    allocs: Vec<Alloc>,
    next: u64,
    /// Accesses (per lane) made.
    pub(crate) loads: u64,
    pub(crate) stores: u64,
}

impl TestMem {
    pub(crate) fn new() -> TestMem {
        TestMem {
            allocs: Vec::new(),
            next: 0x7f00_0000_0000,
            loads: 0,
            stores: 0,
        }
    }

    /// A new allocation holding `data`; its address.
    pub(crate) fn alloc(&mut self, name: &str, data: Vec<u8>) -> u64 {
        let base = self.next;
        self.next = (base + data.len() as u64 + 4096).next_multiple_of(256);
        self.allocs.push(Alloc {
            name: name.to_string(),
            base,
            data,
        });
        base
    }

    pub(crate) fn alloc_of<T: Elem>(&mut self, name: &str, v: &[T]) -> u64 {
        self.alloc(name, bytes(v))
    }

    fn find(&self, addr: u64, size: u64) -> Result<(usize, usize), String> {
        let i = self.allocs.partition_point(|a| a.base <= addr);
        if i > 0 {
            let a = &self.allocs[i - 1];
            let off = addr - a.base;
            if off + size <= a.data.len() as u64 {
                return Ok((i - 1, off as usize));
            }
            return Err(format!(
                "{size} bytes at offset {off} of allocation `{}` ({} bytes): {} bytes past its end",
                a.name,
                a.data.len(),
                off + size - a.data.len() as u64
            ));
        }
        Err(format!("0x{addr:x} is in no allocation"))
    }

    /// The bytes of the allocation at `base`.
    pub(crate) fn data(&self, base: u64) -> &[u8] {
        let i = self
            .allocs
            .iter()
            .position(|a| a.base == base)
            .expect("an allocation's base");
        &self.allocs[i].data
    }

    pub(crate) fn read<T: Elem>(&self, base: u64) -> Vec<T> {
        values(self.data(base))
    }
}

impl GlobalMemory for TestMem {
    fn load(
        &mut self,
        size: u32,
        addrs: &[u64],
        _threads: &[u32],
        out: &mut [u128],
    ) -> Result<(), String> {
        for (a, o) in addrs.iter().zip(out.iter_mut()) {
            let (i, off) = self.find(*a, size as u64)?;
            let mut v = 0u128;
            for (k, &b) in self.allocs[i].data[off..off + size as usize]
                .iter()
                .enumerate()
            {
                v |= (b as u128) << (8 * k);
            }
            *o = v;
        }
        self.loads += addrs.len() as u64;
        Ok(())
    }

    fn store(
        &mut self,
        size: u32,
        addrs: &[u64],
        _threads: &[u32],
        vals: &[u128],
    ) -> Result<(), String> {
        for (a, v) in addrs.iter().zip(vals) {
            let (i, off) = self.find(*a, size as u64)?;
            for (k, b) in self.allocs[i].data[off..off + size as usize]
                .iter_mut()
                .enumerate()
            {
                *b = (v >> (8 * k)) as u8;
            }
        }
        self.stores += addrs.len() as u64;
        Ok(())
    }
}

/// A kernel argument.
#[derive(Clone, Debug)]
pub(crate) enum Arg {
    U64(u64),
    F32(f32),
    I32(i32),
    Bytes(Vec<u8>),
}

/// Packs `args` at the kernel's parameter offsets (sizes must match).
pub(crate) fn pack(k: &Kernel, args: &[Arg]) -> Vec<u8> {
    assert_eq!(k.params().len(), args.len(), "{}: argument count", k.name());
    let mut out = vec![0u8; k.param_bytes()];
    for (slot, a) in k.params().iter().zip(args) {
        let b = match a {
            Arg::U64(x) => x.to_le_bytes().to_vec(),
            Arg::F32(x) => x.to_le_bytes().to_vec(),
            Arg::I32(x) => x.to_le_bytes().to_vec(),
            Arg::Bytes(b) => b.clone(),
        };
        assert_eq!(
            b.len(),
            slot.size,
            "{}: argument size at offset {}",
            k.name(),
            slot.offset
        );
        out[slot.offset..slot.offset + slot.size].copy_from_slice(&b);
    }
    out
}
