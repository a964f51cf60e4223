//! PTX types and the modifiers of an opcode (`.rn`, `.ftz`, `.global`, `.v4`, `.u32`,
//! ...), taken one by one by the instruction decoders.

use super::{syntax, unsup, Space, R};

/// A PTX type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    B8,
    B16,
    B32,
    B64,
    B128,
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    F16,
    F16x2,
    BF16,
    BF16x2,
    F32,
    F64,
    Pred,
}

impl Ty {
    pub(super) fn parse(s: &str) -> Option<Ty> {
        use Ty::*;
        Some(match s {
            "b8" => B8,
            "b16" => B16,
            "b32" => B32,
            "b64" => B64,
            "b128" => B128,
            "u8" => U8,
            "u16" => U16,
            "u32" => U32,
            "u64" => U64,
            "s8" => S8,
            "s16" => S16,
            "s32" => S32,
            "s64" => S64,
            "f16" => F16,
            "f16x2" => F16x2,
            "bf16" => BF16,
            "bf16x2" => BF16x2,
            "f32" => F32,
            "f64" => F64,
            "pred" => Pred,
            _ => return None,
        })
    }

    pub(crate) fn bits(self) -> u32 {
        use Ty::*;
        match self {
            B8 | U8 | S8 => 8,
            B16 | U16 | S16 | F16 | BF16 => 16,
            B32 | U32 | S32 | F32 | F16x2 | BF16x2 => 32,
            B64 | U64 | S64 | F64 => 64,
            B128 => 128,
            Pred => 1,
        }
    }

    pub(super) fn is_float(self) -> bool {
        matches!(
            self,
            Ty::F16 | Ty::F16x2 | Ty::BF16 | Ty::BF16x2 | Ty::F32 | Ty::F64
        )
    }

    pub(super) fn is_signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }

    pub(super) fn is_int(self) -> bool {
        !self.is_float() && self != Ty::Pred && self != Ty::B128
    }

    pub(super) fn name(self) -> String {
        format!(".{}", format!("{self:?}").to_ascii_lowercase())
    }
}

/// The modifiers of an opcode, taken one by one by its decoder; whatever is left over at
/// the end is an unsupported modifier.
pub(super) struct Mods<'a> {
    pub(super) opcode: &'a str,
    pub(super) types: Vec<Ty>,
    pub(super) rnd: Option<&'a str>,
    pub(super) ftz: bool,
    pub(super) sat: bool,
    pub(super) approx: bool,
    pub(super) space: Option<Space>,
    pub(super) vec: u32,
    pub(super) words: Vec<&'a str>,
}

impl<'a> Mods<'a> {
    pub(super) fn parse(opcode: &'a str, parts: &[&'a str]) -> R<Mods<'a>> {
        let mut m = Mods {
            opcode,
            types: Vec::new(),
            rnd: None,
            ftz: false,
            sat: false,
            approx: false,
            space: None,
            vec: 0,
            words: Vec::new(),
        };
        for &p in parts {
            if let Some(t) = Ty::parse(p) {
                m.types.push(t);
                continue;
            }
            match p {
                "rn" | "rz" | "rm" | "rp" | "rni" | "rzi" | "rmi" | "rpi" | "rna" | "rs" => {
                    m.rnd = Some(p)
                }
                "ftz" => m.ftz = true,
                "sat" => m.sat = true,
                "approx" | "full" => m.approx = true,
                "global" => m.space = Some(Space::Global),
                "shared" | "shared::cta" => m.space = Some(Space::Shared),
                "local" => m.space = Some(Space::Local),
                "param" | "param::entry" => m.space = Some(Space::Param),
                "const" | "shared::cluster" | "param::func" => {
                    return unsup(format!("{opcode} (state space .{p})"), "not interpreted")
                }
                "v2" => m.vec = 2,
                "v4" => m.vec = 4,
                "v8" => return unsup(format!("{opcode} (.v8)"), "8-element vectors"),
                _ => m.words.push(p),
            }
        }
        Ok(m)
    }

    pub(super) fn word(&mut self, options: &[&str]) -> Option<&'a str> {
        let i = self.words.iter().position(|w| options.contains(w))?;
        Some(self.words.remove(i))
    }

    pub(super) fn has(&mut self, w: &str) -> bool {
        self.word(&[w]).is_some()
    }

    pub(super) fn one_type(&mut self) -> R<Ty> {
        match self.types.len() {
            1 => Ok(self.types.remove(0)),
            0 => syntax(format!("`{}` needs a type", self.opcode)),
            _ => syntax(format!("`{}` has more than one type", self.opcode)),
        }
    }

    /// Drops qualifiers of memory accesses that do not change a single-threaded
    /// interpreter's results (ordering, scope, cache hints).
    pub(super) fn memory_qualifiers(&mut self) -> R<()> {
        let mut keep = Vec::new();
        for &w in &self.words {
            match w {
                "weak" | "volatile" | "relaxed" | "acquire" | "release" | "cta" | "gpu" | "sys"
                | "cluster" | "ca" | "cg" | "cs" | "lu" | "cv" | "wb" | "wt" | "nc" => {}
                "L2::cache_hint" => {
                    return unsup(
                        format!("{} (.L2::cache_hint)", self.opcode),
                        "cache-policy operands",
                    )
                }
                _ if w.starts_with("L1::") || w.starts_with("L2::") => {}
                _ => keep.push(w),
            }
        }
        self.words = keep;
        Ok(())
    }

    pub(super) fn done(self) -> R<()> {
        if let Some(w) = self.words.first() {
            return unsup(
                format!("{} (modifier .{w})", self.opcode),
                "unknown or unsupported modifier",
            );
        }
        let extra = [
            (self.ftz, "ftz"),
            (self.sat, "sat"),
            (self.approx, "approx/full"),
            (self.space.is_some(), "state space"),
            (self.vec != 0, "vector"),
        ];
        if let Some((_, name)) = extra.iter().find(|(on, _)| *on) {
            return unsup(
                format!("{} (.{name})", self.opcode),
                "modifier not allowed here",
            );
        }
        if let Some(r) = self.rnd {
            return unsup(
                format!("{} (.{r})", self.opcode),
                "rounding modifier not allowed here",
            );
        }
        if let Some(t) = self.types.first() {
            return syntax(format!("unexpected type {} in `{}`", t.name(), self.opcode));
        }
        Ok(())
    }
}
