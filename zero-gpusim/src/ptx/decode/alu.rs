//! Decoding of arithmetic, logic, comparison, selection and conversion instructions.

use super::pick::*;
use super::*;

impl Dec<'_> {
    fn bin(&self, f: BinFn, ty: Ty) -> R<Op> {
        let o = self.ops(3)?;
        Ok(Op::Bin {
            f,
            d: self.dst(&o[0])?,
            a: self.src(&o[1], ty)?,
            b: self.src(&o[2], ty)?,
        })
    }

    fn un(&self, f: UnFn, ty: Ty) -> R<Op> {
        let o = self.ops(2)?;
        Ok(Op::Un {
            f,
            d: self.dst(&o[0])?,
            a: self.src(&o[1], ty)?,
        })
    }

    /// The rounding of float arithmetic: only to nearest even.
    fn float_rounding(&self, m: &mut Mods<'_>, required: bool) -> R<()> {
        match m.rnd.take() {
            None if required => syntax(format!(
                "`{}` needs a rounding modifier (.rn)",
                self.raw.opcode
            )),
            None | Some("rn") => Ok(()),
            Some(r) => unsup(
                format!("{} (.{r})", self.raw.opcode),
                "only round-to-nearest-even (.rn) arithmetic",
            ),
        }
    }

    fn float_check(&self, m: &mut Mods<'_>, ty: Ty) -> R<()> {
        if m.approx {
            return unsup(
                self.raw.opcode.clone(),
                "approximate math (results are not bit-exact with the GPU)",
            );
        }
        if matches!(ty, Ty::F16 | Ty::F16x2 | Ty::BF16 | Ty::BF16x2) {
            return unsup(self.raw.opcode.clone(), "half-precision arithmetic");
        }
        if ty == Ty::F64 && (m.ftz || m.sat) {
            return syntax(format!(
                "`{}`: .ftz/.sat are not allowed on .f64",
                self.raw.opcode
            ));
        }
        Ok(())
    }

    pub(super) fn add_sub(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        if m.words.contains(&"cc") {
            return unsup(
                self.raw.opcode.clone(),
                "extended-precision carry chains (.cc)",
            );
        }
        let add = base == "add";
        if ty.is_float() {
            self.float_check(&mut m, ty)?;
            self.float_rounding(&mut m, false)?;
            let (ftz, sat) = (std::mem::take(&mut m.ftz), std::mem::take(&mut m.sat));
            m.done()?;
            let f = if add {
                float_bin::<{ fop::ADD }>(ty, ftz, sat)
            } else {
                float_bin::<{ fop::SUB }>(ty, ftz, sat)
            };
            return self.bin(f.ok_or(DErr::Syntax("bad type".into()))?, ty);
        }
        let sat = std::mem::take(&mut m.sat);
        m.done()?;
        if sat && ty != Ty::S32 {
            return syntax(format!("`{}`: .sat only on .s32", self.raw.opcode));
        }
        let f = match (add, sat) {
            (true, false) => int_bin::<{ iop::ADD }>(ty),
            (false, false) => int_bin::<{ iop::SUB }>(ty),
            (true, true) => int_bin::<{ iop::ADDSAT }>(ty),
            (false, true) => int_bin::<{ iop::SUBSAT }>(ty),
        };
        self.bin(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn mul(&self, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        if ty.is_float() {
            self.float_check(&mut m, ty)?;
            self.float_rounding(&mut m, false)?;
            let (ftz, sat) = (std::mem::take(&mut m.ftz), std::mem::take(&mut m.sat));
            m.done()?;
            return self.bin(
                float_bin::<{ fop::MUL }>(ty, ftz, sat).ok_or(DErr::Syntax("bad type".into()))?,
                ty,
            );
        }
        let mode = m.word(&["lo", "hi", "wide"]);
        m.done()?;
        let f = match mode {
            Some("hi") => int_bin::<{ iop::MULHI }>(ty),
            Some("wide") => match ty {
                Ty::U16 => Some(ops::mul_wide::<u16> as BinFn),
                Ty::S16 => Some(ops::mul_wide::<i16> as BinFn),
                Ty::U32 => Some(ops::mul_wide::<u32> as BinFn),
                Ty::S32 => Some(ops::mul_wide::<i32> as BinFn),
                _ => None,
            },
            Some(_) => int_bin::<{ iop::MULLO }>(ty),
            None => return syntax(format!("`{}` needs .lo, .hi or .wide", self.raw.opcode)),
        };
        self.bin(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn mad(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        let o = self.ops(4)?;
        let f: TernFn = if ty.is_float() {
            self.float_check(&mut m, ty)?;
            self.float_rounding(&mut m, true)?;
            let (ftz, sat) = (std::mem::take(&mut m.ftz), std::mem::take(&mut m.sat));
            m.done()?;
            match (ty, ftz, sat) {
                (Ty::F32, false, false) => ops::ffma::<f32, false, false>,
                (Ty::F32, true, false) => ops::ffma::<f32, true, false>,
                (Ty::F32, false, true) => ops::ffma::<f32, false, true>,
                (Ty::F32, true, true) => ops::ffma::<f32, true, true>,
                _ => ops::ffma::<f64, false, false>,
            }
        } else {
            if base == "fma" {
                return syntax("fma is for floating point");
            }
            let mode = m.word(&["lo", "hi", "wide"]);
            if m.sat {
                return unsup(self.raw.opcode.clone(), "mad.hi.sat");
            }
            m.done()?;
            macro_rules! by_ty {
                ($f:ident) => {
                    match ty {
                        Ty::U16 => Some(ops::$f::<u16> as TernFn),
                        Ty::S16 => Some(ops::$f::<i16> as TernFn),
                        Ty::U32 => Some(ops::$f::<u32> as TernFn),
                        Ty::S32 => Some(ops::$f::<i32> as TernFn),
                        Ty::U64 if stringify!($f) != "mad_wide" => Some(ops::$f::<u64> as TernFn),
                        Ty::S64 if stringify!($f) != "mad_wide" => Some(ops::$f::<i64> as TernFn),
                        _ => None,
                    }
                };
            }
            let f = match mode {
                Some("lo") => by_ty!(mad_lo),
                Some("hi") => by_ty!(mad_hi),
                Some(_) => by_ty!(mad_wide),
                None => return syntax(format!("`{}` needs .lo, .hi or .wide", self.raw.opcode)),
            };
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?
        };
        let cty = if base == "mad" && m_wide(&self.raw.opcode) {
            wide_of(ty)
        } else {
            ty
        };
        Ok(Op::Tern {
            f,
            d: self.dst(&o[0])?,
            a: self.src(&o[1], ty)?,
            b: self.src(&o[2], ty)?,
            c: self.src(&o[3], cty)?,
        })
    }

    pub(super) fn div_rem(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        if ty.is_float() {
            if base == "rem" {
                return syntax("rem is for integers");
            }
            self.float_check(&mut m, ty)?;
            self.float_rounding(&mut m, true)?;
            let (ftz, sat) = (std::mem::take(&mut m.ftz), std::mem::take(&mut m.sat));
            m.done()?;
            return self.bin(
                float_bin::<{ fop::DIV }>(ty, ftz, sat).ok_or(DErr::Syntax("bad type".into()))?,
                ty,
            );
        }
        m.done()?;
        let f = if base == "div" {
            int_bin::<{ iop::DIV }>(ty)
        } else {
            int_bin::<{ iop::REM }>(ty)
        };
        self.bin(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn min_max(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        let min = base == "min";
        if m.words.contains(&"relu") || m.words.contains(&"xorsign") || m.words.contains(&"abs") {
            return unsup(self.raw.opcode.clone(), "min/max variants");
        }
        if ty.is_float() {
            self.float_check(&mut m, ty)?;
            let nan = m.has("NaN");
            let ftz = std::mem::take(&mut m.ftz);
            m.done()?;
            let f = match (min, nan) {
                (true, false) => float_bin::<{ fop::MIN }>(ty, ftz, false),
                (false, false) => float_bin::<{ fop::MAX }>(ty, ftz, false),
                (true, true) => float_bin::<{ fop::MIN_NAN }>(ty, ftz, false),
                (false, true) => float_bin::<{ fop::MAX_NAN }>(ty, ftz, false),
            };
            return self.bin(f.ok_or(DErr::Syntax("bad type".into()))?, ty);
        }
        m.done()?;
        let f = if min {
            int_bin::<{ iop::MIN }>(ty)
        } else {
            int_bin::<{ iop::MAX }>(ty)
        };
        self.bin(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn abs_neg(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        let abs = base == "abs";
        if ty.is_float() {
            self.float_check(&mut m, ty)?;
            let ftz = std::mem::take(&mut m.ftz);
            m.done()?;
            let f = if abs {
                float_un::<{ fun_op::ABS }>(ty, ftz)
            } else {
                float_un::<{ fun_op::NEG }>(ty, ftz)
            };
            return self.un(f.ok_or(DErr::Syntax("bad type".into()))?, ty);
        }
        m.done()?;
        let f = if abs {
            int_un::<{ iun_op::ABS }>(ty)
        } else {
            int_un::<{ iun_op::NEG }>(ty)
        };
        self.un(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn sqrt_rcp(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        self.float_check(&mut m, ty)?;
        self.float_rounding(&mut m, true)?;
        let ftz = std::mem::take(&mut m.ftz);
        m.done()?;
        let f = if base == "sqrt" {
            float_un::<{ fun_op::SQRT }>(ty, ftz)
        } else {
            float_un::<{ fun_op::RCP }>(ty, ftz)
        };
        self.un(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn copysign(&self, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        m.done()?;
        let f = float_bin::<{ fop::COPYSIGN }>(ty, false, false);
        self.bin(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn logic(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        m.done()?;
        let op = match base {
            "and" => BoolOp::And,
            "or" => BoolOp::Or,
            _ => BoolOp::Xor,
        };
        if ty == Ty::Pred {
            let o = self.ops(3)?;
            let d = match &o[0] {
                Opnd::Name(n) => self.pred(n)?,
                other => return syntax(format!("expected a predicate, found {other:?}")),
            };
            return Ok(Op::PredBin {
                op,
                d,
                a: self.psrc(&o[1])?,
                b: self.psrc(&o[2])?,
            });
        }
        let f = match op {
            BoolOp::And => int_bin::<{ iop::AND }>(ty),
            BoolOp::Or => int_bin::<{ iop::OR }>(ty),
            BoolOp::Xor => int_bin::<{ iop::XOR }>(ty),
        };
        self.bin(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn not(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        m.done()?;
        if ty == Ty::Pred && base == "not" {
            let o = self.ops(2)?;
            let d = match &o[0] {
                Opnd::Name(n) => self.pred(n)?,
                other => return syntax(format!("expected a predicate, found {other:?}")),
            };
            let a = match self.psrc(&o[1])? {
                PSrc::Reg(r, neg) => PSrc::Reg(r, !neg),
                PSrc::Imm(b) => PSrc::Imm(!b),
            };
            return Ok(Op::PredMov { d, a });
        }
        let f = if base == "not" {
            int_un::<{ iun_op::NOT }>(ty)
        } else {
            int_un::<{ iun_op::CNOT }>(ty)
        };
        self.un(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn shift(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        m.done()?;
        if base == "shl" && ty.is_signed() {
            return syntax("shl takes .b types");
        }
        let f = if base == "shl" {
            int_bin::<{ iop::SHL }>(ty)
        } else {
            int_bin::<{ iop::SHR }>(ty)
        };
        let f = f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?;
        let o = self.ops(3)?;
        Ok(Op::Bin {
            f,
            d: self.dst(&o[0])?,
            a: self.src(&o[1], ty)?,
            b: self.src(&o[2], Ty::U32)?,
        })
    }

    pub(super) fn bits_un(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        let shiftamt = m.has("shiftamt");
        m.done()?;
        let f = match base {
            "popc" => int_un::<{ iun_op::POPC }>(ty),
            "clz" => int_un::<{ iun_op::CLZ }>(ty),
            "brev" => int_un::<{ iun_op::BREV }>(ty),
            _ if shiftamt => int_un::<{ iun_op::BFIND_SHIFT }>(ty),
            _ => int_un::<{ iun_op::BFIND }>(ty),
        };
        self.un(
            f.ok_or_else(|| DErr::Syntax(format!("bad type {}", ty.name())))?,
            ty,
        )
    }

    pub(super) fn bits_multi(&self, base: &str, mut m: Mods<'_>) -> R<Op> {
        match base {
            "shf" => {
                let left = match m.word(&["l", "r"]) {
                    Some("l") => true,
                    Some(_) => false,
                    None => return syntax("shf needs .l or .r"),
                };
                let clamp = match m.word(&["wrap", "clamp"]) {
                    Some("clamp") => true,
                    Some(_) => false,
                    None => return syntax("shf needs .wrap or .clamp"),
                };
                let ty = m.one_type()?;
                m.done()?;
                if ty.bits() != 32 {
                    return syntax("shf is .b32");
                }
                let f: TernFn = match (left, clamp) {
                    (true, false) => ops::shf::<true, false>,
                    (true, true) => ops::shf::<true, true>,
                    (false, false) => ops::shf::<false, false>,
                    (false, true) => ops::shf::<false, true>,
                };
                let o = self.ops(4)?;
                Ok(Op::Tern {
                    f,
                    d: self.dst(&o[0])?,
                    a: self.src(&o[1], ty)?,
                    b: self.src(&o[2], ty)?,
                    c: self.src(&o[3], Ty::U32)?,
                })
            }
            "prmt" => {
                let ty = m.one_type()?;
                if let Some(w) = m.words.first() {
                    return unsup(format!("prmt.{w}"), "prmt modes");
                }
                m.done()?;
                if ty.bits() != 32 {
                    return syntax("prmt is .b32");
                }
                let o = self.ops(4)?;
                Ok(Op::Tern {
                    f: ops::prmt,
                    d: self.dst(&o[0])?,
                    a: self.src(&o[1], ty)?,
                    b: self.src(&o[2], ty)?,
                    c: self.src(&o[3], ty)?,
                })
            }
            "bfe" => {
                let ty = m.one_type()?;
                m.done()?;
                let f: TernFn = match ty {
                    Ty::U32 => ops::bfe::<u32>,
                    Ty::S32 => ops::bfe::<i32>,
                    Ty::U64 => ops::bfe::<u64>,
                    Ty::S64 => ops::bfe::<i64>,
                    _ => return syntax(format!("bad type {}", ty.name())),
                };
                let o = self.ops(4)?;
                Ok(Op::Tern {
                    f,
                    d: self.dst(&o[0])?,
                    a: self.src(&o[1], ty)?,
                    b: self.src(&o[2], Ty::U32)?,
                    c: self.src(&o[3], Ty::U32)?,
                })
            }
            _ => {
                let ty = m.one_type()?;
                m.done()?;
                let f: QuadFn = match ty {
                    Ty::B32 => ops::bfi::<u32>,
                    Ty::B64 => ops::bfi::<u64>,
                    _ => return syntax(format!("bad type {}", ty.name())),
                };
                let o = self.ops(5)?;
                Ok(Op::Quad {
                    f,
                    d: self.dst(&o[0])?,
                    a: self.src(&o[1], ty)?,
                    b: self.src(&o[2], ty)?,
                    c: self.src(&o[3], Ty::U32)?,
                    e: self.src(&o[4], Ty::U32)?,
                })
            }
        }
    }

    pub(super) fn setp(&self, mut m: Mods<'_>) -> R<Op> {
        let cname = m.word(&[
            "eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu",
            "gtu", "geu", "num", "nan",
        ]);
        let comb = m.word(&["and", "or", "xor"]);
        let ty = m.one_type()?;
        let Some(cname) = cname else {
            return syntax("setp needs a comparison");
        };
        let f: CmpFn = if ty.is_float() {
            self.float_check(&mut m, ty)?;
            let ftz = std::mem::take(&mut m.ftz);
            let c = match cname {
                "eq" => cmp::EQ,
                "ne" => cmp::NE,
                "lt" => cmp::LT,
                "le" => cmp::LE,
                "gt" => cmp::GT,
                "ge" => cmp::GE,
                "equ" => cmp::EQU,
                "neu" => cmp::NEU,
                "ltu" => cmp::LTU,
                "leu" => cmp::LEU,
                "gtu" => cmp::GTU,
                "geu" => cmp::GEU,
                "num" => cmp::NUM,
                "nan" => cmp::NAN,
                other => return syntax(format!("setp.{other} is not a float comparison")),
            };
            match (ty, ftz) {
                (Ty::F32, false) => fcmp_of::<f32, false>(c),
                (Ty::F32, true) => fcmp_of::<f32, true>(c),
                (Ty::F64, false) => fcmp_of::<f64, false>(c),
                _ => return syntax("bad setp type"),
            }
        } else {
            let (c, unsigned) = match cname {
                "eq" => (cmp::EQ, false),
                "ne" => (cmp::NE, false),
                "lt" => (cmp::LT, false),
                "le" => (cmp::LE, false),
                "gt" => (cmp::GT, false),
                "ge" => (cmp::GE, false),
                "lo" => (cmp::LT, true),
                "ls" => (cmp::LE, true),
                "hi" => (cmp::GT, true),
                "hs" => (cmp::GE, true),
                other => return syntax(format!("setp.{other} is not an integer comparison")),
            };
            let signed = ty.is_signed() && !unsigned;
            match (ty.bits(), signed) {
                (8, false) => icmp_of::<u8>(c),
                (16, false) => icmp_of::<u16>(c),
                (32, false) => icmp_of::<u32>(c),
                (64, false) => icmp_of::<u64>(c),
                (8, true) => icmp_of::<i8>(c),
                (16, true) => icmp_of::<i16>(c),
                (32, true) => icmp_of::<i32>(c),
                (64, true) => icmp_of::<i64>(c),
                _ => return syntax("bad setp type"),
            }
        };
        m.done()?;
        let o = self.raw.operands.as_slice();
        let want = if comb.is_some() { 4 } else { 3 };
        if o.len() != want {
            return syntax(format!(
                "`{}` takes {want} operands, found {}",
                self.raw.opcode,
                o.len()
            ));
        }
        let (p, q) = match &o[0] {
            Opnd::Name(p) => (self.pred(p)?, SINK),
            Opnd::Pipe(p, q) => (self.pred(p)?, if q == "_" { SINK } else { self.pred(q)? }),
            other => return syntax(format!("expected a predicate, found {other:?}")),
        };
        let comb = match comb {
            None => None,
            Some(c) => {
                let op = match c {
                    "and" => BoolOp::And,
                    "or" => BoolOp::Or,
                    _ => BoolOp::Xor,
                };
                Some((op, self.psrc(&o[3])?))
            }
        };
        Ok(Op::Setp {
            f,
            p,
            q,
            a: self.src(&o[1], ty)?,
            b: self.src(&o[2], ty)?,
            comb,
        })
    }

    pub(super) fn selp(&self, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        m.done()?;
        let o = self.ops(4)?;
        Ok(Op::Selp {
            d: self.dst(&o[0])?,
            a: self.src(&o[1], ty)?,
            b: self.src(&o[2], ty)?,
            p: self.psrc(&o[3])?,
        })
    }

    pub(super) fn slct(&self, mut m: Mods<'_>) -> R<Op> {
        if m.types.len() != 2 {
            return syntax("slct needs two types");
        }
        let (dty, cty) = (m.types[0], m.types[1]);
        m.types.clear();
        let ftz = std::mem::take(&mut m.ftz);
        m.done()?;
        let f: TernFn = match (cty, ftz) {
            (Ty::S32, false) => ops::slct_s32,
            (Ty::F32, false) => ops::slct_f32::<false>,
            (Ty::F32, true) => ops::slct_f32::<true>,
            _ => return syntax("slct's selector is .s32 or .f32"),
        };
        let o = self.ops(4)?;
        Ok(Op::Tern {
            f,
            d: self.dst(&o[0])?,
            a: self.src(&o[1], dty)?,
            b: self.src(&o[2], dty)?,
            c: self.src(&o[3], cty)?,
        })
    }

    pub(super) fn cvt(&self, mut m: Mods<'_>) -> R<Op> {
        if m.types.len() != 2 {
            return syntax("cvt needs a destination and a source type");
        }
        if let Some(w) = m.words.first() {
            return unsup(format!("cvt.{w}"), "conversion modifier");
        }
        let (d, s) = (m.types[0], m.types[1]);
        m.types.clear();
        let r = m.rnd.take();
        let ftz = std::mem::take(&mut m.ftz);
        let sat = std::mem::take(&mut m.sat);
        m.done()?;
        let what = self.raw.opcode.clone();
        if matches!(d, Ty::F16x2 | Ty::BF16x2 | Ty::B128 | Ty::Pred)
            || matches!(s, Ty::F16x2 | Ty::BF16x2 | Ty::B128 | Ty::Pred)
        {
            return unsup(what, "packed or predicate conversions");
        }
        let int_r = match r {
            Some("rni") => Some(rnd::RNI),
            Some("rzi") => Some(rnd::RZI),
            Some("rmi") => Some(rnd::RMI),
            Some("rpi") => Some(rnd::RPI),
            _ => None,
        };
        let f: Option<UnFn> = if d.is_int() && s.is_int() {
            if r.is_some() || ftz {
                return syntax("integer conversions take no rounding or .ftz");
            }
            cvt_ii_fn(d, s, sat)
        } else if d.is_int() {
            // Float to integer: an integer rounding is required.
            let Some(ir) = int_r else {
                return match r {
                    None => syntax("float-to-integer cvt needs .rni, .rzi, .rmi or .rpi"),
                    Some(x) => unsup(
                        format!("{what} (.{x})"),
                        "rounding of float-to-integer conversion",
                    ),
                };
            };
            if ftz && s != Ty::F32 {
                return syntax(".ftz only with .f32");
            }
            match (s, ftz) {
                (Ty::F32, false) => cvt_fi_to::<f32, false>(d, ir),
                (Ty::F32, true) => cvt_fi_to::<f32, true>(d, ir),
                (Ty::F64, _) => cvt_fi_to::<f64, false>(d, ir),
                (Ty::F16, _) => cvt_fi_to::<f16, false>(d, ir),
                (Ty::BF16, _) => cvt_fi_to::<bf16, false>(d, ir),
                _ => None,
            }
        } else if s.is_int() {
            match r {
                Some("rn") | None => {}
                Some(x) => {
                    return unsup(
                        format!("{what} (.{x})"),
                        "only round-to-nearest-even integer-to-float conversion",
                    )
                }
            }
            match d {
                Ty::F16 => cvt_if_from::<f16>(s, sat),
                Ty::BF16 => cvt_if_from::<bf16>(s, sat),
                Ty::F32 => cvt_if_from::<f32>(s, sat),
                Ty::F64 => cvt_if_from::<f64>(s, sat),
                _ => None,
            }
        } else {
            // Float to float.
            let widening = d.bits() > s.bits();
            let rr = if d == s {
                match (r, int_r) {
                    (None, _) => rnd::NONE,
                    (_, Some(ir)) => ir,
                    (Some(x), None) => {
                        return unsup(
                            format!("{what} (.{x})"),
                            "same-type float conversion rounding",
                        )
                    }
                }
            } else if widening {
                if r.is_some() {
                    return syntax("a widening float conversion takes no rounding");
                }
                rnd::RN
            } else {
                match r {
                    Some("rn") => rnd::RN,
                    None => return syntax("a narrowing float conversion needs a rounding (.rn)"),
                    Some(x) => {
                        return unsup(
                            format!("{what} (.{x})"),
                            "only round-to-nearest-even narrowing",
                        )
                    }
                }
            };
            if ftz && d != Ty::F32 && s != Ty::F32 {
                return syntax(".ftz only with .f32");
            }
            match s {
                Ty::F16 => cvt_ff_to::<f16>(d, rr, ftz, sat),
                Ty::BF16 => cvt_ff_to::<bf16>(d, rr, ftz, sat),
                Ty::F32 => cvt_ff_to::<f32>(d, rr, ftz, sat),
                Ty::F64 => cvt_ff_to::<f64>(d, rr, ftz, sat),
                _ => None,
            }
        };
        let f = f.ok_or_else(|| {
            DErr::Syntax(format!("bad conversion {} from {}", d.name(), s.name()))
        })?;
        self.un(f, s)
    }
}

/// Whether a mad opcode is `.wide` (its addend is twice as wide).
fn m_wide(opcode: &str) -> bool {
    opcode.split('.').any(|p| p == "wide")
}

/// The type twice as wide (for `mad.wide`'s addend).
fn wide_of(t: Ty) -> Ty {
    match t {
        Ty::U16 => Ty::U32,
        Ty::S16 => Ty::S32,
        Ty::U32 => Ty::U64,
        Ty::S32 => Ty::S64,
        other => other,
    }
}
