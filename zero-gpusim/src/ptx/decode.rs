//! One PTX instruction to its decoded form: an [`Op`] with dense register indices,
//! immediates as bits, addresses resolved to a state space, and arithmetic as a warp-wide
//! function chosen for the exact type and modifiers. Anything not implemented is an
//! error naming it.

use super::ops::{self, cmp, fop, fun_op, iop, iun_op, rnd, BinFn, CmpFn, QuadFn, TernFn, UnFn};
use super::{PtxError, LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW};
use half::{bf16, f16};
use std::collections::HashMap;

mod alu;
mod mods;
mod pick;

use mods::{Mods, Ty};

/// A declared register: a predicate or a data register of `bits` bits.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reg {
    Pred(u32),
    Data { idx: u32, bits: u32 },
}

/// A variable or parameter and its address in its own state space.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Sym {
    Param {
        offset: u64,
    },
    Shared {
        offset: u64,
    },
    Local {
        offset: u64,
    },
    /// A module-scope `.global` or `.const` variable (declared, not interpreted).
    Global,
}

/// The names an instruction may use: registers (innermost scope last) and symbols.
pub(crate) struct Names<'a> {
    pub(crate) scopes: &'a [HashMap<String, Reg>],
    pub(crate) syms: &'a HashMap<String, Sym>,
}

impl Names<'_> {
    fn reg(&self, name: &str) -> Option<Reg> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }
}

/// An instruction as written.
pub(crate) struct RawInst {
    pub(crate) guard: Option<(String, bool)>,
    pub(crate) opcode: String,
    pub(crate) operands: Vec<Opnd>,
    pub(crate) line: u32,
    pub(crate) text: String,
}

/// An operand as written.
#[derive(Debug, Clone)]
pub(crate) enum Opnd {
    /// A register, symbol, label, special register or `_`.
    Name(String),
    /// `!%p`.
    Not(String),
    Imm(Lit),
    /// `[base+off]`.
    Addr {
        base: Option<String>,
        off: i64,
    },
    /// `{a, b, ...}`.
    Vec(Vec<Opnd>),
    /// `%p|%q`.
    Pipe(String, String),
    /// `generic(var)`.
    Generic(String),
}

/// A literal.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lit {
    Int { neg: bool, mag: u64 },
    F32(u32),
    F64(u64),
    Dec(f64),
}

/// Parses a numeric literal (`12`, `0x1fU`, `017`, `0b101`, `0f3F800000`, `0d...`,
/// `1.5`); `None` when `w` is not one.
pub(crate) fn parse_lit(w: &str) -> Option<Lit> {
    let first = w.chars().next()?;
    if !first.is_ascii_digit() {
        return None;
    }
    let lower = w.to_ascii_lowercase();
    if let Some(h) = lower.strip_prefix("0f") {
        if h.len() == 8 {
            return u32::from_str_radix(h, 16).ok().map(Lit::F32);
        }
    }
    if let Some(h) = lower.strip_prefix("0d") {
        if h.len() == 16 {
            return u64::from_str_radix(h, 16).ok().map(Lit::F64);
        }
    }
    let int = lower.strip_suffix('u').unwrap_or(&lower);
    let parsed = if let Some(h) = int.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()
    } else if let Some(b) = int.strip_prefix("0b") {
        u64::from_str_radix(b, 2).ok()
    } else if int.len() > 1 && int.starts_with('0') && int.chars().all(|c| c.is_ascii_digit()) {
        u64::from_str_radix(&int[1..], 8).ok()
    } else {
        int.parse::<u64>().ok()
    };
    if let Some(mag) = parsed {
        return Some(Lit::Int { neg: false, mag });
    }
    if lower.contains('.') || lower.contains('e') {
        return lower.parse::<f64>().ok().map(Lit::Dec);
    }
    None
}

/// `-lit`.
pub(crate) fn negate_lit(l: Lit) -> Lit {
    match l {
        Lit::Int { neg, mag } => Lit::Int { neg: !neg, mag },
        Lit::F32(b) => Lit::F32(b ^ 0x8000_0000),
        Lit::F64(b) => Lit::F64(b ^ (1 << 63)),
        Lit::Dec(d) => Lit::Dec(-d),
    }
}

/// A state space of a memory access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    Generic,
    Global,
    Shared,
    Local,
    Param,
}

impl Space {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Space::Generic => "generic",
            Space::Global => ".global",
            Space::Shared => ".shared",
            Space::Local => ".local",
            Space::Param => ".param",
        }
    }
}

/// A special register.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Sreg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    LaneId,
    WarpId,
    NWarpId,
    SmId,
    NSmId,
    GridId,
    Clock,
    Clock64,
    /// `%lanemask_eq`, `_lt`, `_le`, `_gt`, `_ge` (0..=4).
    LaneMask(u8),
    DynSmem,
    TotalSmem,
}

/// A data source: a register, an immediate or a special register.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Src {
    Reg(u32),
    Imm(u64),
    Sreg(Sreg),
}

/// A predicate source: a register (possibly negated) or a constant.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PSrc {
    Reg(u32, bool),
    Imm(bool),
}

/// How `setp` combines with a third predicate, and predicate logic.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BoolOp {
    And,
    Or,
    Xor,
}

/// A destination register index that discards the value (`_`).
pub(crate) const SINK: u32 = u32::MAX;

/// A decoded operation.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Mov {
        d: u32,
        a: Src,
        m: u64,
    },
    Un {
        f: UnFn,
        d: u32,
        a: Src,
    },
    Bin {
        f: BinFn,
        d: u32,
        a: Src,
        b: Src,
    },
    Tern {
        f: TernFn,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Quad {
        f: QuadFn,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        e: Src,
    },
    Setp {
        f: CmpFn,
        p: u32,
        q: u32,
        a: Src,
        b: Src,
        comb: Option<(BoolOp, PSrc)>,
    },
    Selp {
        d: u32,
        a: Src,
        b: Src,
        p: PSrc,
    },
    PredMov {
        d: u32,
        a: PSrc,
    },
    PredBin {
        op: BoolOp,
        d: u32,
        a: PSrc,
        b: PSrc,
    },
    /// `mov.bN d, {a, b, ...}`: the parts, low first, `bits` each.
    Pack {
        d: u32,
        parts: Vec<Src>,
        bits: u32,
    },
    /// `mov.bN {a, b, ...}, s`.
    Unpack {
        ds: Vec<u32>,
        a: Src,
        bits: u32,
    },
    Ld {
        space: Space,
        elem: u32,
        n: u32,
        sext: bool,
        ds: [u32; 4],
        dmask: [u64; 4],
        addr: Src,
        off: i64,
    },
    St {
        space: Space,
        elem: u32,
        n: u32,
        srcs: [Src; 4],
        addr: Src,
        off: i64,
    },
    Bra {
        target: u32,
    },
    Bar {
        id: Src,
        count: Option<Src>,
    },
    WarpSync,
    Exit,
    Nop,
    Trap,
}

/// A decoded instruction: its operation, guard (`@%p` / `@!%p`), line and text.
#[derive(Clone, Debug)]
pub(crate) struct Inst {
    pub(crate) op: Op,
    pub(crate) guard: Option<(u32, bool)>,
    pub(crate) line: u32,
    pub(crate) text: Box<str>,
}

/// Patches the target of a branch once its label is known.
pub(crate) fn set_branch_target(inst: &mut Inst, target: u32) {
    if let Op::Bra { target: t } = &mut inst.op {
        *t = target;
    }
}

/// Why an instruction was not decoded.
enum DErr {
    Syntax(String),
    Unsupported(String, String),
}

type R<T> = Result<T, DErr>;

fn syntax<T>(m: impl Into<String>) -> R<T> {
    Err(DErr::Syntax(m.into()))
}

fn unsup<T>(what: impl Into<String>, why: impl Into<String>) -> R<T> {
    Err(DErr::Unsupported(what.into(), why.into()))
}

/// Decodes one instruction; the label name is returned for a branch (its target is set
/// once the kernel's labels are known).
pub(crate) fn decode(raw: &RawInst, names: &Names<'_>) -> Result<(Inst, Option<String>), PtxError> {
    let d = Dec { raw, names };
    let wrap = |e: DErr| match e {
        DErr::Syntax(message) => PtxError::Syntax {
            line: raw.line,
            text: raw.text.clone(),
            message,
        },
        DErr::Unsupported(what, reason) => PtxError::Unsupported {
            line: raw.line,
            text: raw.text.clone(),
            what,
            reason,
        },
    };
    let guard = match &raw.guard {
        Some((p, neg)) => Some((d.pred(p).map_err(wrap)?, *neg)),
        None => None,
    };
    let (op, label) = d.op().map_err(wrap)?;
    Ok((
        Inst {
            op,
            guard,
            line: raw.line,
            text: raw.text.clone().into_boxed_str(),
        },
        label,
    ))
}

struct Dec<'a> {
    raw: &'a RawInst,
    names: &'a Names<'a>,
}

fn special(name: &str) -> Option<Sreg> {
    let dim = |s: &str| match s {
        "x" => Some(0u8),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    if let Some((base, d)) = name.rsplit_once('.') {
        let d = dim(d)?;
        return Some(match base {
            "%tid" => Sreg::Tid(d),
            "%ntid" => Sreg::Ntid(d),
            "%ctaid" => Sreg::Ctaid(d),
            "%nctaid" => Sreg::Nctaid(d),
            _ => return None,
        });
    }
    Some(match name {
        "%laneid" => Sreg::LaneId,
        "%warpid" => Sreg::WarpId,
        "%nwarpid" => Sreg::NWarpId,
        "%smid" => Sreg::SmId,
        "%nsmid" => Sreg::NSmId,
        "%gridid" => Sreg::GridId,
        "%clock" => Sreg::Clock,
        "%clock64" => Sreg::Clock64,
        "%lanemask_eq" => Sreg::LaneMask(0),
        "%lanemask_lt" => Sreg::LaneMask(1),
        "%lanemask_le" => Sreg::LaneMask(2),
        "%lanemask_gt" => Sreg::LaneMask(3),
        "%lanemask_ge" => Sreg::LaneMask(4),
        "%dynamic_smem_size" => Sreg::DynSmem,
        "%total_smem_size" => Sreg::TotalSmem,
        _ => return None,
    })
}

/// The bits of a literal as an operand of type `ty`.
fn imm_bits(l: Lit, ty: Ty) -> R<u64> {
    let bits = ty.bits().min(64);
    let m = ops::mask(bits);
    let int_val = |neg: bool, mag: u64| if neg { mag.wrapping_neg() } else { mag };
    let as_float = |v: f64| -> u64 {
        match ty {
            Ty::F32 => (v as f32).to_bits() as u64,
            Ty::F64 => v.to_bits(),
            Ty::F16 => <f16 as ops::Float>::from_f64(v).to_bits() as u64,
            Ty::BF16 => <bf16 as ops::Float>::from_f64(v).to_bits() as u64,
            _ => 0,
        }
    };
    Ok(
        match (l, ty.is_float() && !matches!(ty, Ty::F16x2 | Ty::BF16x2)) {
            (Lit::Int { neg, mag }, false) => int_val(neg, mag) & m,
            (Lit::Int { neg, mag }, true) => {
                let v = mag as f64;
                as_float(if neg { -v } else { v })
            }
            (Lit::F32(b), false) => b as u64 & m,
            (Lit::F64(b), false) => b & m,
            (Lit::F32(b), true) => {
                if ty == Ty::F32 {
                    b as u64
                } else {
                    as_float(f32::from_bits(b) as f64)
                }
            }
            (Lit::F64(b), true) => as_float(f64::from_bits(b)),
            (Lit::Dec(v), true) => as_float(v),
            (Lit::Dec(_), false) => {
                return syntax(format!(
                    "a decimal float literal for a {} operand",
                    ty.name()
                ))
            }
        },
    )
}

impl Dec<'_> {
    fn pred(&self, name: &str) -> R<u32> {
        match self.names.reg(name) {
            Some(Reg::Pred(i)) => Ok(i),
            Some(Reg::Data { .. }) => syntax(format!("`{name}` is not a predicate register")),
            None => syntax(format!("undeclared predicate `{name}`")),
        }
    }

    fn psrc(&self, o: &Opnd) -> R<PSrc> {
        match o {
            Opnd::Name(n) => Ok(PSrc::Reg(self.pred(n)?, false)),
            Opnd::Not(n) => Ok(PSrc::Reg(self.pred(n)?, true)),
            Opnd::Imm(Lit::Int { mag, .. }) => Ok(PSrc::Imm(*mag != 0)),
            other => syntax(format!("expected a predicate, found {other:?}")),
        }
    }

    /// A data register destination; with its width in bits.
    fn dreg(&self, o: &Opnd) -> R<(u32, u32)> {
        match o {
            Opnd::Name(n) if n == "_" => Ok((SINK, 64)),
            Opnd::Name(n) => match self.names.reg(n) {
                Some(Reg::Data { idx, bits }) => Ok((idx, bits)),
                Some(Reg::Pred(_)) => syntax(format!("`{n}` is a predicate, not a data register")),
                None => syntax(format!("undeclared register `{n}`")),
            },
            other => syntax(format!("expected a register, found {other:?}")),
        }
    }

    fn dst(&self, o: &Opnd) -> R<u32> {
        let (r, _) = self.dreg(o)?;
        if r == SINK {
            return syntax("`_` is not allowed here");
        }
        Ok(r)
    }

    /// The address of a symbol as seen from `space` (`Generic`: its generic address;
    /// `None`: its address in its own space).
    fn sym_addr(&self, name: &str, space: Option<Space>) -> R<Option<u64>> {
        let Some(s) = self.names.syms.get(name) else {
            return Ok(None);
        };
        let (own, off, window) = match *s {
            Sym::Global => {
                return unsup(
                    format!("use of module-scope variable `{name}`"),
                    "module-scope .global/.const variables are not interpreted",
                )
            }
            Sym::Param { offset } => (Space::Param, offset, PARAM_WINDOW),
            Sym::Shared { offset } => (Space::Shared, offset, SHARED_WINDOW),
            Sym::Local { offset } => (Space::Local, offset, LOCAL_WINDOW),
        };
        let Some(space) = space else {
            return Ok(Some(off));
        };
        if space == Space::Generic {
            Ok(Some(window + off))
        } else if space == own {
            Ok(Some(off))
        } else {
            syntax(format!(
                "`{name}` is in {}, not {}",
                own.name(),
                space.name()
            ))
        }
    }

    /// A data source of type `ty`; `syms`: symbols are allowed (their address in their
    /// own state space; `generic(sym)` its generic address).
    fn src_sym(&self, o: &Opnd, ty: Ty, syms: bool) -> R<Src> {
        match o {
            Opnd::Imm(l) => Ok(Src::Imm(imm_bits(*l, ty)?)),
            Opnd::Name(n) => {
                if let Some(r) = self.names.reg(n) {
                    return match r {
                        Reg::Data { idx, .. } => Ok(Src::Reg(idx)),
                        Reg::Pred(_) => {
                            syntax(format!("`{n}` is a predicate, not a data register"))
                        }
                    };
                }
                if let Some(s) = special(n) {
                    return Ok(Src::Sreg(s));
                }
                if n.starts_with('%') {
                    if n.starts_with("%envreg")
                        || n.starts_with("%globaltimer")
                        || n.starts_with("%pm")
                        || n.starts_with("%cluster")
                        || n.starts_with("%nclusterid")
                        || n.starts_with("%clusterid")
                        || n.starts_with("%is_explicit_cluster")
                        || n.starts_with("%reserved")
                        || n.starts_with("%aggr_smem")
                        || n.starts_with("%current_graph_exec")
                    {
                        return unsup(format!("special register {n}"), "not modelled");
                    }
                    return syntax(format!("undeclared register `{n}`"));
                }
                match syms {
                    true => match self.sym_addr(n, None)? {
                        Some(a) => Ok(Src::Imm(a)),
                        None => syntax(format!("unknown symbol `{n}`")),
                    },
                    false => {
                        if self.names.syms.contains_key(n) {
                            unsup(
                                format!("{} with symbol operand `{n}`", self.raw.opcode),
                                "take its address with mov first",
                            )
                        } else {
                            syntax(format!("unknown name `{n}`"))
                        }
                    }
                }
            }
            Opnd::Generic(n) => match self.sym_addr(n, Some(Space::Generic))? {
                Some(a) if syms => Ok(Src::Imm(a)),
                Some(_) => unsup(
                    format!("{} with generic({n})", self.raw.opcode),
                    "only in mov",
                ),
                None => syntax(format!("unknown symbol `{n}`")),
            },
            other => syntax(format!("expected a value operand, found {other:?}")),
        }
    }

    fn src(&self, o: &Opnd, ty: Ty) -> R<Src> {
        self.src_sym(o, ty, false)
    }

    fn ops(&self, n: usize) -> R<&[Opnd]> {
        let o = &self.raw.operands;
        if o.len() != n {
            return syntax(format!(
                "`{}` takes {n} operands, found {}",
                self.raw.opcode,
                o.len()
            ));
        }
        Ok(o)
    }

    /// A memory operand: the base source and the offset.
    fn addr(&self, o: &Opnd, space: Space) -> R<(Src, i64)> {
        match o {
            Opnd::Addr { base: None, off } => Ok((Src::Imm(0), *off)),
            Opnd::Addr { base: Some(b), off } => {
                if let Some(r) = self.names.reg(b) {
                    return match r {
                        Reg::Data { idx, .. } => Ok((Src::Reg(idx), *off)),
                        Reg::Pred(_) => syntax(format!("`{b}` is a predicate, not an address")),
                    };
                }
                match self.sym_addr(b, Some(space))? {
                    Some(a) => Ok((Src::Imm(a), *off)),
                    None => syntax(format!("unknown address base `{b}`")),
                }
            }
            other => syntax(format!("expected an address [..], found {other:?}")),
        }
    }

    fn op(&self) -> R<(Op, Option<String>)> {
        let opcode = self.raw.opcode.as_str();
        let parts: Vec<&str> = opcode.split('.').collect();
        let base = parts[0];
        let two = parts.get(1).copied().unwrap_or("");
        let reason = match base {
            "atom" | "red" | "redux" | "multimem" => Some("atomic and reduction operations"),
            "shfl" | "vote" | "match" | "activemask" | "elect" => Some("warp-level collectives"),
            "mma" | "wmma" | "wgmma" | "ldmatrix" | "stmatrix" | "movmatrix" | "tcgen05" => {
                Some("tensor-core operations")
            }
            "call" => Some("calls"),
            "cp" | "mbarrier" => Some("asynchronous copies and memory barriers"),
            "st" if two == "async" => Some("asynchronous copies and memory barriers"),
            "tex" | "tld4" | "txq" | "suld" | "sust" | "sured" | "suq" | "istypep" => {
                Some("textures and surfaces")
            }
            "ex2" | "lg2" | "sin" | "cos" | "tanh" | "rsqrt" => {
                Some("approximate math (results are not bit-exact with the GPU)")
            }
            "addc" | "subc" | "madc" => Some("extended-precision carry chains"),
            "alloca" | "stacksave" | "stackrestore" => Some("dynamic stack allocation"),
            "isspacep"
            | "getctarank"
            | "mapa"
            | "griddepcontrol"
            | "setmaxnreg"
            | "prefetch"
            | "prefetchu"
            | "applypriority"
            | "discard"
            | "createpolicy"
            | "pmevent"
            | "brkpt"
            | "brx"
            | "dp4a"
            | "dp2a"
            | "sad"
            | "mul24"
            | "mad24"
            | "lop3"
            | "testp"
            | "set"
            | "bmsk"
            | "szext"
            | "fns"
            | "clusterlaunchcontrol"
            | "tensormap" => Some("not implemented by the interpreter"),
            _ => None,
        };
        if let Some(r) = reason {
            return unsup(opcode, r);
        }
        let m = Mods::parse(opcode, &parts[1..])?;
        let op = match base {
            "mov" => self.mov(m)?,
            "ld" | "ldu" => self.ld(m)?,
            "st" => self.st(m)?,
            "add" | "sub" => self.add_sub(base, m)?,
            "mul" => self.mul(m)?,
            "mad" | "fma" => self.mad(base, m)?,
            "div" | "rem" => self.div_rem(base, m)?,
            "min" | "max" => self.min_max(base, m)?,
            "abs" | "neg" => self.abs_neg(base, m)?,
            "sqrt" | "rcp" => self.sqrt_rcp(base, m)?,
            "copysign" => self.copysign(m)?,
            "and" | "or" | "xor" => self.logic(base, m)?,
            "not" | "cnot" => self.not(base, m)?,
            "shl" | "shr" => self.shift(base, m)?,
            "popc" | "clz" | "brev" | "bfind" => self.bits_un(base, m)?,
            "bfe" | "bfi" | "prmt" | "shf" => self.bits_multi(base, m)?,
            "setp" => self.setp(m)?,
            "selp" => self.selp(m)?,
            "slct" => self.slct(m)?,
            "cvt" => self.cvt(m)?,
            "cvta" => self.cvta(m)?,
            "bra" => {
                let mut m = m;
                m.has("uni");
                m.done()?;
                let o = self.ops(1)?;
                return match &o[0] {
                    Opnd::Name(l) => Ok((Op::Bra { target: 0 }, Some(l.clone()))),
                    other => syntax(format!("expected a label, found {other:?}")),
                };
            }
            "ret" | "exit" => {
                let mut m = m;
                m.has("uni");
                m.done()?;
                self.ops(0)?;
                Op::Exit
            }
            "bar" | "barrier" => self.bar(m)?,
            "membar" | "fence" => {
                // Every access is already ordered in the interpreter.
                let mut m = m;
                m.words.retain(|w| {
                    !matches!(
                        *w,
                        "cta"
                            | "gl"
                            | "gpu"
                            | "sys"
                            | "cluster"
                            | "sc"
                            | "acq_rel"
                            | "proxy"
                            | "alias"
                            | "async"
                            | "acquire"
                            | "release"
                    )
                });
                m.space = None;
                m.done()?;
                Op::Nop
            }
            "trap" => {
                m.done()?;
                Op::Trap
            }
            "nanosleep" => {
                let mut m = m;
                m.types.retain(|t| *t != Ty::U32);
                m.done()?;
                Op::Nop
            }
            _ => return unsup(opcode, "unknown instruction"),
        };
        Ok((op, None))
    }

    fn mov(&self, mut m: Mods<'_>) -> R<Op> {
        let ty = m.one_type()?;
        m.done()?;
        let o = self.ops(2)?;
        if ty == Ty::Pred {
            let d = match &o[0] {
                Opnd::Name(n) => self.pred(n)?,
                other => return syntax(format!("expected a predicate, found {other:?}")),
            };
            return Ok(Op::PredMov {
                d,
                a: self.psrc(&o[1])?,
            });
        }
        if ty == Ty::B128 {
            return unsup("mov.b128", "128-bit registers");
        }
        match (&o[0], &o[1]) {
            (Opnd::Vec(ds), a) => {
                let bits = ty.bits() / ds.len() as u32;
                if !matches!(ds.len(), 2 | 4) || bits < 8 {
                    return syntax("bad unpacking mov");
                }
                let ds = ds
                    .iter()
                    .map(|d| self.dreg(d).map(|r| r.0))
                    .collect::<R<Vec<_>>>()?;
                Ok(Op::Unpack {
                    ds,
                    a: self.src(a, ty)?,
                    bits,
                })
            }
            (d, Opnd::Vec(parts)) => {
                let bits = ty.bits() / parts.len() as u32;
                if !matches!(parts.len(), 2 | 4) || bits < 8 {
                    return syntax("bad packing mov");
                }
                let pty = match bits {
                    8 => Ty::B8,
                    16 => Ty::B16,
                    _ => Ty::B32,
                };
                let parts = parts
                    .iter()
                    .map(|p| self.src(p, pty))
                    .collect::<R<Vec<_>>>()?;
                Ok(Op::Pack {
                    d: self.dst(d)?,
                    parts,
                    bits,
                })
            }
            (d, a) => Ok(Op::Mov {
                d: self.dst(d)?,
                a: self.src_sym(a, ty, true)?,
                m: ops::mask(ty.bits()),
            }),
        }
    }
}

impl Dec<'_> {
    fn ld(&self, mut m: Mods<'_>) -> R<Op> {
        let space = m.space.take().unwrap_or(Space::Generic);
        let n = std::mem::take(&mut m.vec).max(1);
        m.memory_qualifiers()?;
        let ty = m.one_type()?;
        m.done()?;
        if ty == Ty::Pred || ty == Ty::B128 {
            return unsup(
                format!("{} ({})", self.raw.opcode, ty.name()),
                "type of memory access",
            );
        }
        let o = &self.raw.operands;
        if o.len() == 3 {
            return unsup(
                format!("{} with a cache-policy operand", self.raw.opcode),
                "cache policies",
            );
        }
        let o = self.ops(2)?;
        let elem = ty.bits() / 8;
        if elem * n > 16 {
            return unsup(
                format!("{} ({} bytes)", self.raw.opcode, elem * n),
                "accesses over 16 bytes",
            );
        }
        let dests: Vec<(u32, u32)> = match &o[0] {
            Opnd::Vec(v) => v.iter().map(|d| self.dreg(d)).collect::<R<_>>()?,
            d => vec![self.dreg(d)?],
        };
        if dests.len() != n as usize {
            return syntax(format!(
                "`{}` needs {n} destinations, found {}",
                self.raw.opcode,
                dests.len()
            ));
        }
        let mut ds = [SINK; 4];
        let mut dmask = [0u64; 4];
        let mut sext = false;
        for (k, &(r, bits)) in dests.iter().enumerate() {
            ds[k] = r;
            dmask[k] = ops::mask(bits);
            if ty.is_signed() && bits > ty.bits() {
                sext = true;
            }
        }
        let (addr, off) = self.addr(&o[1], space)?;
        Ok(Op::Ld {
            space,
            elem,
            n,
            sext,
            ds,
            dmask,
            addr,
            off,
        })
    }

    fn st(&self, mut m: Mods<'_>) -> R<Op> {
        let space = m.space.take().unwrap_or(Space::Generic);
        let n = std::mem::take(&mut m.vec).max(1);
        m.memory_qualifiers()?;
        let ty = m.one_type()?;
        m.done()?;
        if ty == Ty::Pred || ty == Ty::B128 {
            return unsup(
                format!("{} ({})", self.raw.opcode, ty.name()),
                "type of memory access",
            );
        }
        if self.raw.operands.len() == 3 {
            return unsup(
                format!("{} with a cache-policy operand", self.raw.opcode),
                "cache policies",
            );
        }
        let o = self.ops(2)?;
        let elem = ty.bits() / 8;
        if elem * n > 16 {
            return unsup(
                format!("{} ({} bytes)", self.raw.opcode, elem * n),
                "accesses over 16 bytes",
            );
        }
        let vals: Vec<Src> = match &o[1] {
            Opnd::Vec(v) => v.iter().map(|x| self.src(x, ty)).collect::<R<_>>()?,
            x => vec![self.src(x, ty)?],
        };
        if vals.len() != n as usize {
            return syntax(format!(
                "`{}` needs {n} values, found {}",
                self.raw.opcode,
                vals.len()
            ));
        }
        let mut srcs = [Src::Imm(0); 4];
        srcs[..vals.len()].copy_from_slice(&vals);
        let (addr, off) = self.addr(&o[0], space)?;
        Ok(Op::St {
            space,
            elem,
            n,
            srcs,
            addr,
            off,
        })
    }

    fn cvta(&self, mut m: Mods<'_>) -> R<Op> {
        let to = m.has("to");
        let space = m
            .space
            .take()
            .ok_or(DErr::Syntax("cvta needs a state space".into()))?;
        let ty = m.one_type()?;
        m.done()?;
        if ty != Ty::U64 && ty != Ty::B64 {
            return unsup(
                format!("{} (32-bit addresses)", self.raw.opcode),
                "only 64-bit generic addresses",
            );
        }
        let o = self.ops(2)?;
        let d = self.dst(&o[0])?;
        let a = self.src_sym(&o[1], ty, true)?;
        let base = match space {
            Space::Global | Space::Generic => return Ok(Op::Mov { d, a, m: u64::MAX }),
            Space::Shared => SHARED_WINDOW,
            Space::Local => LOCAL_WINDOW,
            Space::Param => PARAM_WINDOW,
        };
        let delta = if to { base.wrapping_neg() } else { base };
        Ok(Op::Bin {
            f: ops::ibin::<u64, { iop::ADD }>,
            d,
            a,
            b: Src::Imm(delta),
        })
    }

    fn bar(&self, mut m: Mods<'_>) -> R<Op> {
        let opcode = self.raw.opcode.as_str();
        if m.has("warp") {
            if !m.has("sync") {
                return unsup(opcode, "bar.warp without .sync");
            }
            m.done()?;
            self.ops(1)?;
            return Ok(Op::WarpSync);
        }
        m.has("cta");
        m.has("aligned");
        if !m.has("sync") {
            if m.words.iter().any(|w| matches!(*w, "arrive" | "red")) {
                return unsup(opcode, "bar.arrive and bar.red");
            }
            // `bar 0` (old spelling) is bar.sync.
            if !m.words.is_empty() {
                return unsup(opcode, "barrier variant");
            }
        }
        m.has("aligned");
        m.done()?;
        let o = self.raw.operands.as_slice();
        match o.len() {
            1 => Ok(Op::Bar {
                id: self.src(&o[0], Ty::U32)?,
                count: None,
            }),
            2 => Ok(Op::Bar {
                id: self.src(&o[0], Ty::U32)?,
                count: Some(self.src(&o[1], Ty::U32)?),
            }),
            n => syntax(format!("bar.sync takes 1 or 2 operands, found {n}")),
        }
    }
}
