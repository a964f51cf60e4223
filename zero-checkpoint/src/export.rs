//! Consolidated weights in the Hugging Face layout: `model-0000k-of-0000n.safetensors`
//! plus `model.safetensors.index.json`, each file's `__metadata__` `{"format": "pt"}`, at
//! most `max_shard_bytes` per shard (a larger tensor gets a shard of its own). Written one
//! tensor at a time: the most memory held is the largest tensor plus the I/O buffer.
//!
//! `zero-ckpt to-safetensors` exports a checkpoint's fp32 master weights this way (in
//! fp32 or a 16-bit dtype); `Engine::save_16bit_model` writes the trained 16-bit weights.
//! Several ranks can share the writing ([`HfWriter::shared`]): every rank plans the same
//! shards, shard `k` is written by rank `k mod world`, and rank 0 writes the index.

use super::format::{dtype_name, safetensors_header, TensorSpec};
use super::resolve::{CheckpointDir, StateKind};
use super::CheckpointError;
use crate::io::{write_file, FileWriter, WrittenFile};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use zero_kernels::{bf16, cast, f16, DType};

/// The index file's name.
pub const INDEX: &str = "model.safetensors.index.json";

/// Hugging Face's default shard size (`max_shard_size="5GB"`).
pub const DEFAULT_MAX_SHARD: u64 = 5_000_000_000;

/// Parses a size such as `5GB`, `500MB`, `10GiB` or `123` (bytes).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KIB" => 1024.0,
        "MIB" => 1024.0 * 1024.0,
        "GIB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v = n * mult;
    (v >= 1.0 && v.is_finite()).then_some(v as u64)
}

/// Cuts `tensors` (in order) into shards of at most `max_bytes` of data each.
pub fn plan_shards(tensors: &[TensorSpec], max_bytes: u64) -> Vec<Vec<TensorSpec>> {
    let mut shards: Vec<Vec<TensorSpec>> = Vec::new();
    let mut size = 0u64;
    for t in tensors {
        let b = t.bytes() as u64;
        if shards.is_empty() || (size > 0 && size + b > max_bytes) {
            shards.push(Vec::new());
            size = 0;
        }
        if let Some(last) = shards.last_mut() {
            last.push(t.clone());
        }
        size += b;
    }
    if shards.is_empty() {
        shards.push(Vec::new());
    }
    shards
}

/// `values` rounded to `dtype`, as little-endian bytes into `dst` (of the right length).
pub fn encode_into(values: &[f32], dtype: DType, dst: &mut [u8]) -> Result<(), CheckpointError> {
    let bad = |e: String| CheckpointError::Io(format!("encoding {dtype}: {e}"));
    match dtype {
        DType::F32 => {
            let d: &mut [f32] =
                bytemuck::try_cast_slice_mut(dst).map_err(|e| bad(e.to_string()))?;
            d.copy_from_slice(values);
        }
        DType::F16 => {
            let d: &mut [f16] =
                bytemuck::try_cast_slice_mut(dst).map_err(|e| bad(e.to_string()))?;
            cast(values, d).map_err(|e| bad(e.to_string()))?;
        }
        DType::BF16 => {
            let d: &mut [bf16] =
                bytemuck::try_cast_slice_mut(dst).map_err(|e| bad(e.to_string()))?;
            cast(values, d).map_err(|e| bad(e.to_string()))?;
        }
    }
    Ok(())
}

/// Writes tensors, in the order planned, into Hugging Face shards: all of them, or (shared
/// among ranks) the shards of one rank.
#[derive(Debug)]
pub struct HfWriter {
    dir: PathBuf,
    shards: Vec<Vec<TensorSpec>>,
    buffer: usize,
    shard: usize,
    next: usize,
    current: Option<FileWriter>,
    written: Vec<WrittenFile>,
    rank: usize,
    world: usize,
}

impl HfWriter {
    /// Plans the shards of `tensors` under `dir` (created if needed); this writer writes
    /// every shard and the index.
    pub fn new(
        dir: &Path,
        tensors: &[TensorSpec],
        max_shard_bytes: u64,
        buffer: usize,
    ) -> Result<Self, CheckpointError> {
        Self::shared(dir, tensors, max_shard_bytes, buffer, 0, 1)
    }

    /// The writer of rank `rank` of `world` ranks that share the writing of one folder
    /// (which they all see): each plans the same shards from the same `tensors` and is
    /// given every tensor in order, writes the shards `k` with `k mod world == rank`
    /// ([`Self::owns_next`]; the others' tensors are passed with [`Self::skip_tensor`]),
    /// and rank 0 writes the index.
    pub fn shared(
        dir: &Path,
        tensors: &[TensorSpec],
        max_shard_bytes: u64,
        buffer: usize,
        rank: usize,
        world: usize,
    ) -> Result<Self, CheckpointError> {
        if world == 0 || rank >= world {
            return Err(CheckpointError::Io(format!(
                "rank {rank} of a world of {world} cannot share a write"
            )));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| CheckpointError::Io(format!("creating {}: {e}", dir.display())))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            shards: plan_shards(tensors, max_shard_bytes),
            buffer,
            shard: 0,
            next: 0,
            current: None,
            written: Vec::new(),
            rank,
            world,
        })
    }

    /// Whether this writer writes the next planned tensor (its shard is this rank's); where
    /// not, pass it with [`Self::skip_tensor`] instead of computing its values.
    pub fn owns_next(&self) -> bool {
        self.shard % self.world == self.rank
    }

    /// The next planned tensor, `name`, checked and passed: another rank writes it.
    pub fn skip_tensor(&mut self, name: &str) -> Result<(), CheckpointError> {
        let spec = self.next_spec(name, None)?;
        if self.owns_next() {
            return Err(CheckpointError::Io(format!(
                "`{}` is this rank's to write, not to skip",
                spec.name
            )));
        }
        self.advance()
    }

    /// The next planned tensor's spec, checked against `name` (and the count of values).
    fn next_spec(&self, name: &str, values: Option<usize>) -> Result<TensorSpec, CheckpointError> {
        let spec = self
            .shards
            .get(self.shard)
            .and_then(|s| s.get(self.next))
            .cloned()
            .ok_or_else(|| CheckpointError::Io(format!("`{name}` was not planned")))?;
        let count = spec.shape.iter().product::<usize>();
        if spec.name != name || values.is_some_and(|n| n != count) {
            return Err(CheckpointError::Io(format!(
                "`{name}` ({} values) written where `{}` {:?} was planned",
                values.unwrap_or(count),
                spec.name,
                spec.shape
            )));
        }
        Ok(spec)
    }

    /// Past the tensor just written or skipped; a finished shard is closed.
    fn advance(&mut self) -> Result<(), CheckpointError> {
        self.next += 1;
        if self.next == self.shards[self.shard].len() {
            self.close_shard()?;
        }
        Ok(())
    }

    fn shard_name(&self, k: usize) -> String {
        format!("model-{:05}-of-{:05}.safetensors", k + 1, self.shards.len())
    }

    /// Writes the next planned tensor, `name`, from its values in `f32` (rounded to the
    /// planned dtype).
    pub fn write_tensor(&mut self, name: &str, values: &[f32]) -> Result<(), CheckpointError> {
        let spec = self.next_spec(name, Some(values.len()))?;
        if !self.owns_next() {
            return Err(CheckpointError::Io(format!(
                "`{name}` is in shard {} of {}, rank {}'s to write",
                self.shard + 1,
                self.shards.len(),
                self.shard % self.world
            )));
        }
        if self.current.is_none() {
            let file = self.shard_name(self.shard);
            let mut w = FileWriter::create(&self.dir.join(&file), self.buffer)?;
            let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
            w.write(&safetensors_header(&self.shards[self.shard], meta)?)?;
            self.current = Some(w);
        }
        let size = spec.dtype.size_of();
        let w = self
            .current
            .as_mut()
            .ok_or_else(|| CheckpointError::Io("no shard open".into()))?;
        w.write_with(spec.bytes(), |at, dst| {
            let first = at / size;
            encode_into(&values[first..first + dst.len() / size], spec.dtype, dst)
        })?;
        self.advance()
    }

    fn close_shard(&mut self) -> Result<(), CheckpointError> {
        if let Some(w) = self.current.take() {
            self.written.push(w.finish()?);
        }
        self.shard += 1;
        self.next = 0;
        Ok(())
    }

    /// Finishes the last shard (an empty model still gets one, from rank 0) and, on rank 0,
    /// writes the index; the files this writer wrote.
    pub fn finish(mut self) -> Result<Vec<WrittenFile>, CheckpointError> {
        if self.shard < self.shards.len() {
            if self.shards[self.shard].len() != self.next {
                return Err(CheckpointError::Io(format!(
                    "{} of the planned tensors were not written",
                    self.shards[self.shard].len() - self.next
                )));
            }
            if self.current.is_none() && self.shards[self.shard].is_empty() && self.rank == 0 {
                let mut w = FileWriter::create(&self.dir.join(self.shard_name(0)), self.buffer)?;
                let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
                w.write(&safetensors_header(&[], meta)?)?;
                self.current = Some(w);
            }
            self.close_shard()?;
        }
        if self.rank != 0 {
            return Ok(self.written);
        }
        let mut weight_map = BTreeMap::new();
        let mut total = 0u64;
        for (k, shard) in self.shards.iter().enumerate() {
            for spec in shard {
                weight_map.insert(spec.name.clone(), self.shard_name(k));
                total += spec.bytes() as u64;
            }
        }
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        let text =
            serde_json::to_vec_pretty(&index).map_err(|e| CheckpointError::Io(e.to_string()))?;
        self.written.push(write_file(&self.dir.join(INDEX), &text)?);
        Ok(self.written)
    }
}

/// Exports checkpoint `ckpt`'s fp32 master weights (and frozen parameters) to `out` in
/// `dtype`, every parameter whole under its name.
pub fn export_safetensors(
    ckpt: &mut CheckpointDir,
    out: &Path,
    dtype: DType,
    max_shard_bytes: u64,
    buffer: usize,
) -> Result<Vec<WrittenFile>, CheckpointError> {
    let params = ckpt.manifest.params.clone();
    // Each parameter under its name and, for tied weights, under each alias too.
    let specs: Vec<TensorSpec> = params
        .iter()
        .flat_map(|p| {
            std::iter::once(&p.name)
                .chain(&p.aliases)
                .map(|name| TensorSpec {
                    name: name.clone(),
                    dtype,
                    shape: p.shape.clone(),
                })
        })
        .collect();
    let mut w = HfWriter::new(out, &specs, max_shard_bytes, buffer)?;
    let mut values: Vec<f32> = Vec::new();
    for p in &params {
        if p.trainable {
            values.clear();
            values.resize(p.numel(), 0.0);
            ckpt.read_state(p, StateKind::Master, 0..p.numel(), |at, v| {
                values[at..at + v.len()].copy_from_slice(v);
                Ok(())
            })?;
        } else {
            values = ckpt.read_frozen(p)?;
        }
        for name in std::iter::once(&p.name).chain(&p.aliases) {
            w.write_tensor(name, &values)?;
        }
    }
    w.finish()
}

/// The dtype names the CLI takes.
pub fn parse_dtype_arg(s: &str) -> Option<DType> {
    match s.to_ascii_lowercase().as_str() {
        "fp32" | "f32" | "float32" => Some(DType::F32),
        "fp16" | "f16" | "float16" => Some(DType::F16),
        "bf16" | "bfloat16" => Some(DType::BF16),
        _ => None,
    }
}

/// For messages: the dtype as safetensors names it.
pub fn dtype_label(d: DType) -> &'static str {
    dtype_name(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    #[test]
    fn sizes_parse_as_hugging_face_writes_them() {
        assert_eq!(parse_size("5GB"), Some(5_000_000_000));
        assert_eq!(parse_size("500MB"), Some(500_000_000));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("1234"), Some(1234));
        assert_eq!(parse_size("1.5 kb"), Some(1500));
        assert_eq!(parse_size("5 parsecs"), None);
        assert_eq!(parse_size("0"), None);
    }

    #[test]
    fn shards_hold_at_most_the_limit_unless_one_tensor_is_larger() {
        let t = |n: &str, k: usize| TensorSpec {
            name: n.into(),
            dtype: DType::F32,
            shape: vec![k],
        };
        let plan = plan_shards(&[t("a", 10), t("b", 10), t("c", 30), t("d", 1)], 80);
        let names: Vec<Vec<&str>> = plan
            .iter()
            .map(|s| s.iter().map(|t| t.name.as_str()).collect())
            .collect();
        assert_eq!(names, vec![vec!["a", "b"], vec!["c"], vec!["d"]]);
    }

    /// Three ranks sharing the writing give the files of one writer, byte for byte, each
    /// rank its own shards; a rank that writes another's tensor, or skips its own, is told.
    #[test]
    fn ranks_sharing_a_write_give_one_writers_files() {
        let seed = zero_kernels::testing::fresh_seed("shared HfWriter");
        let mut rng = StdRng::seed_from_u64(seed);
        let specs: Vec<TensorSpec> = (0..11)
            .map(|i| TensorSpec {
                name: format!("t{i}"),
                dtype: DType::BF16,
                shape: vec![rng.gen_range(0..40), 3],
            })
            .collect();
        let values: Vec<Vec<f32>> = specs
            .iter()
            .map(|t| {
                (0..t.shape.iter().product::<usize>())
                    .map(|_| rng.gen_range(-4.0f32..4.0))
                    .collect()
            })
            .collect();
        let one = tempfile::tempdir().unwrap();
        let mut w = HfWriter::new(one.path(), &specs, 200, 64).unwrap();
        for (t, v) in specs.iter().zip(&values) {
            w.write_tensor(&t.name, v).unwrap();
        }
        let single = w.finish().unwrap();
        let shared = tempfile::tempdir().unwrap();
        let mut by_rank = Vec::new();
        for rank in 0..3 {
            let mut w = HfWriter::shared(shared.path(), &specs, 200, 64, rank, 3).unwrap();
            for (t, v) in specs.iter().zip(&values) {
                if w.owns_next() {
                    let wrong = w.skip_tensor(&t.name).unwrap_err().to_string();
                    assert!(wrong.contains("not to skip"), "{wrong}");
                    w.write_tensor(&t.name, v).unwrap();
                } else {
                    let wrong = w.write_tensor(&t.name, v).unwrap_err().to_string();
                    assert!(wrong.contains("'s to write"), "{wrong}");
                    w.skip_tensor(&t.name).unwrap();
                }
            }
            by_rank.push(w.finish().unwrap().len());
        }
        assert!(single.len() > 4, "seed {seed}: too few shards to share");
        assert_eq!(by_rank.iter().sum::<usize>(), single.len(), "seed {seed}");
        assert!(by_rank.iter().all(|&n| n > 0), "seed {seed}: {by_rank:?}");
        for f in &single {
            let name = f.path.file_name().unwrap();
            let want = std::fs::read(&f.path).unwrap();
            let got = std::fs::read(shared.path().join(name)).unwrap();
            assert!(want == got, "seed {seed}: {name:?} differs");
        }
        assert!(HfWriter::shared(shared.path(), &specs, 200, 64, 3, 3).is_err());
    }
}
