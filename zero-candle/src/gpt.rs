//! A small decoder-only transformer written with candle-nn, from differentiable ops only
//! (no fused RmsNorm, softmax or rope, whose gradients candle drops): token and position
//! embeddings, blocks of causal self-attention and a GELU MLP, each behind an RMSNorm,
//! and an untied output head. The GPT example trains it; the tests train it against
//! `candle_nn::AdamW`.
//!
//! It is built as a list of parts (`embed`, `blocks.0`, …, `head`), so that under ZeRO
//! stage 3 each part can be wrapped ([`Gpt::wrapped`]) and hold its parameters only while
//! in use.

use crate::{Grouping, Result, ZeroCandle};
use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Embedding, Linear, VarBuilder};
use zero_comm::Communicator;
use zero_runtime::Engine;

/// The model's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptConfig {
    /// Letters.
    pub vocab: usize,
    /// Positions per sequence.
    pub context: usize,
    /// Width of the residual stream.
    pub dim: usize,
    /// Attention heads (`dim` must be a multiple).
    pub heads: usize,
    /// Transformer blocks.
    pub blocks: usize,
}

impl GptConfig {
    /// The example's model: 16 letters, 16 positions, width 160, 4 heads, 4 blocks
    /// (1.24 M parameters).
    pub fn example() -> Self {
        Self {
            vocab: 16,
            context: 16,
            dim: 160,
            heads: 4,
            blocks: 4,
        }
    }

    /// Parameters.
    pub fn numel(&self) -> usize {
        let d = self.dim;
        let block = 2 * d + d * 3 * d + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
        self.vocab * d + self.context * d + self.blocks * block + d + d * self.vocab
    }

    /// The grouping into engine modules used with the parts: `embed.wte`, `blocks.0.attn`,
    /// `blocks.0.mlp`, `head.norm`, `head.out` (at most the first three components of each
    /// name), so a block's attention reduces while backward is still in its MLP's inputs.
    pub fn grouping() -> Grouping {
        Grouping::Prefix(3)
    }
}

/// A differentiable RMSNorm: `x / sqrt(mean(x²) + eps) · w`.
struct RmsNorm {
    weight: Tensor,
}

impl RmsNorm {
    fn new(dim: usize, vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Self {
            weight: vb.get_with_hints(dim, "weight", candle_nn::Init::Const(1.0))?,
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        let r = (ms + 1e-5)?.sqrt()?;
        x.broadcast_div(&r)?.broadcast_mul(&self.weight)
    }
}

/// Token and position embeddings.
struct Embed {
    wte: Embedding,
    wpe: Embedding,
}

impl Module for Embed {
    fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let t = ids.dim(1)?;
        let pos = Tensor::arange(0u32, t as u32, ids.device())?;
        self.wte
            .forward(ids)?
            .broadcast_add(&self.wpe.forward(&pos)?)
    }
}

/// One block: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
struct Block {
    norm1: RmsNorm,
    qkv: Linear,
    proj: Linear,
    norm2: RmsNorm,
    up: Linear,
    down: Linear,
    heads: usize,
    /// 0 on and below the diagonal, −1e9 above.
    mask: Tensor,
}

impl Block {
    fn new(cfg: &GptConfig, vb: VarBuilder) -> candle_core::Result<Self> {
        let d = cfg.dim;
        let t = cfg.context;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
            .collect();
        Ok(Self {
            norm1: RmsNorm::new(d, vb.pp("attn.norm"))?,
            // No bias: softmax ignores a key bias, so its gradient would be rounding noise.
            qkv: candle_nn::linear_no_bias(d, 3 * d, vb.pp("attn.qkv"))?,
            proj: candle_nn::linear(d, d, vb.pp("attn.proj"))?,
            norm2: RmsNorm::new(d, vb.pp("mlp.norm"))?,
            up: candle_nn::linear(d, 4 * d, vb.pp("mlp.up"))?,
            down: candle_nn::linear(4 * d, d, vb.pp("mlp.down"))?,
            heads: cfg.heads,
            mask: Tensor::from_vec(mask, (t, t), &Device::Cpu)?,
        })
    }

    fn attention(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let (h, hd) = (self.heads, c / self.heads);
        let qkv = self.qkv.forward(x)?.reshape((b, t, 3, h, hd))?;
        let part = |i: usize| {
            qkv.narrow(2, i, 1)?
                .squeeze(2)?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let scores = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
        let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        let p = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
        let y = p.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))?;
        self.proj.forward(&y)
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = (x + self.attention(&self.norm1.forward(x)?)?)?;
        let m = self.up.forward(&self.norm2.forward(&x)?)?.gelu()?;
        &x + self.down.forward(&m)?
    }
}

/// The final norm and the output projection.
struct Head {
    norm: RmsNorm,
    out: Linear,
}

impl Module for Head {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.out.forward(&self.norm.forward(x)?)
    }
}

/// A named part of the model.
pub type Part = (String, Box<dyn Module + Send + Sync>);

/// Builds the parts, in order: `embed`, `blocks.0` … `blocks.{n-1}`, `head`.
pub fn parts(cfg: &GptConfig, vb: VarBuilder) -> candle_core::Result<Vec<Part>> {
    if cfg.heads == 0 || cfg.dim % cfg.heads != 0 {
        return Err(candle_core::Error::Msg(format!(
            "dim {} is not a multiple of heads {}",
            cfg.dim, cfg.heads
        )));
    }
    let mut out: Vec<Part> = Vec::with_capacity(cfg.blocks + 2);
    let e = vb.pp("embed");
    out.push((
        "embed".into(),
        Box::new(Embed {
            wte: candle_nn::embedding(cfg.vocab, cfg.dim, e.pp("wte"))?,
            wpe: candle_nn::embedding(cfg.context, cfg.dim, e.pp("wpe"))?,
        }),
    ));
    for i in 0..cfg.blocks {
        let name = format!("blocks.{i}");
        out.push((name.clone(), Box::new(Block::new(cfg, vb.pp(&name))?)));
    }
    let h = vb.pp("head");
    out.push((
        "head".into(),
        Box::new(Head {
            norm: RmsNorm::new(cfg.dim, h.pp("norm"))?,
            out: candle_nn::linear_no_bias(cfg.dim, cfg.vocab, h.pp("out"))?,
        }),
    ));
    Ok(out)
}

/// A boxed part as a `Module` (for the wrapper).
struct Boxed(Box<dyn Module + Send + Sync>);

impl Module for Boxed {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.0.forward(x)
    }
}

/// The model: its parts applied in order.
pub struct Gpt {
    parts: Vec<Box<dyn Module + Send + Sync>>,
}

impl Gpt {
    /// The model over `parts` as built (plain candle, or ZeRO stages 0–2).
    pub fn new(parts: Vec<Part>) -> Self {
        Self {
            parts: parts.into_iter().map(|(_, m)| m).collect(),
        }
    }

    /// The model with each part wrapped by `zc` (stage 3 gathers each part's parameters
    /// just before its forward and backward and frees them after).
    pub fn wrapped<C, Dv>(zc: &ZeroCandle<C, Dv>, parts: Vec<Part>) -> Result<Self>
    where
        C: Communicator + 'static,
        Dv: zero_runtime::Device<Buffer = C::Buffer> + 'static,
        Engine<C, Dv>: Send,
    {
        let mut out: Vec<Box<dyn Module + Send + Sync>> = Vec::with_capacity(parts.len());
        for (name, m) in parts {
            out.push(Box::new(zc.wrap(&name, Boxed(m))?));
        }
        Ok(Self { parts: out })
    }

    /// Logits `(batch, time, vocab)` for letters `ids` `(batch, time)` (u32).
    pub fn logits(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let mut x = ids.clone();
        for p in &self.parts {
            x = p.forward(&x)?;
        }
        Ok(x)
    }

    /// Mean cross-entropy (nats) of predicting `targets` from `ids` (both `(batch, time)`,
    /// u32) over positions `from..`.
    pub fn loss(&self, ids: &Tensor, targets: &Tensor, from: usize) -> candle_core::Result<Tensor> {
        let logits = self.logits(ids)?;
        let (b, t, v) = logits.dims3()?;
        let logits = logits.narrow(1, from, t - from)?;
        let targets = targets.narrow(1, from, t - from)?;
        let logits = logits.reshape((b * (t - from), v))?;
        let targets = targets.reshape(b * (t - from))?.to_dtype(DType::U32)?;
        candle_nn::loss::cross_entropy(&logits, &targets)
    }
}
