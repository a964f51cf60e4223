//! Module structure: directives, kernels, parameters, variables, register declarations
//! and statements. Each instruction is decoded (see `decode`) as soon as it is read, with
//! the registers of its scope; branch targets are resolved at the end of the kernel.

use super::decode::{self, Lit, Opnd, RawInst, Reg, Sym};
use super::lex::{lex, Tok, Token};
use super::shared::Var;
use super::{Kernel, Module, ParamSlot, PtxError};
use std::collections::HashMap;

/// Parses a whole module.
pub(crate) fn parse_module(text: &str) -> Result<Module, PtxError> {
    let toks = lex(text)?;
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut p = Parser {
        toks: &toks,
        pos: 0,
        lines: &lines,
    };
    p.module()
}

struct Parser<'a> {
    toks: &'a [Token],
    pos: usize,
    lines: &'a [&'a str],
}

/// A declared data type: its name and size in bytes (0 for `.pred`).
fn type_size(t: &str) -> Option<usize> {
    Some(match t {
        ".pred" => 0,
        ".b8" | ".u8" | ".s8" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        _ => return None,
    })
}

/// Shared memory layout shared by the module's kernels.
#[derive(Default, Clone)]
struct SharedLayout {
    vars: Vec<Var>,
    end: usize,
    dyn_align: usize,
    dyn_names: Vec<String>,
}

impl SharedLayout {
    fn add(&mut self, name: &str, size: usize, align: usize) -> u64 {
        let off = self.end.next_multiple_of(align.max(1));
        self.vars.push(Var {
            name: name.to_string(),
            offset: off,
            size,
        });
        self.end = off + size;
        off as u64
    }
}

/// A variable declaration: `.shared .align 8 .b8 name[2048]`.
struct VarDecl {
    name: String,
    size: usize,
    align: usize,
    /// Declared with `[]` (dynamic shared memory).
    unsized_array: bool,
    line: u32,
}

impl<'a> Parser<'a> {
    fn line_of(&self, line: u32) -> String {
        self.lines
            .get(line.saturating_sub(1) as usize)
            .copied()
            .unwrap_or("")
            .to_string()
    }

    fn cur_line(&self) -> u32 {
        self.toks
            .get(self.pos)
            .or_else(|| self.toks.last())
            .map_or(1, |t| t.line)
    }

    fn err(&self, line: u32, message: impl Into<String>) -> PtxError {
        PtxError::Syntax {
            line,
            text: self.line_of(line),
            message: message.into(),
        }
    }

    fn unsupported(&self, line: u32, what: &str, reason: &str) -> PtxError {
        PtxError::Unsupported {
            line,
            text: self.line_of(line),
            what: what.to_string(),
            reason: reason.to_string(),
        }
    }

    fn peek(&self) -> Option<&'a Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn next(&mut self) -> Result<&'a Token, PtxError> {
        let t = self
            .toks
            .get(self.pos)
            .ok_or_else(|| self.err(self.cur_line(), "unexpected end of the text"))?;
        self.pos += 1;
        Ok(t)
    }

    fn word(&mut self) -> Result<(&'a str, u32), PtxError> {
        let t = self.next()?;
        match &t.tok {
            Tok::Word(w) => Ok((w.as_str(), t.line)),
            other => Err(self.err(t.line, format!("expected a word, found {other:?}"))),
        }
    }

    fn punct(&mut self, c: char) -> Result<u32, PtxError> {
        let t = self.next()?;
        match &t.tok {
            Tok::Punct(p) if *p == c => Ok(t.line),
            other => Err(self.err(t.line, format!("expected `{c}`, found {other:?}"))),
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn number(&mut self) -> Result<u64, PtxError> {
        let (w, line) = self.word()?;
        match decode::parse_lit(w) {
            Some(Lit::Int { neg: false, mag }) => Ok(mag),
            _ => Err(self.err(line, format!("expected a number, found `{w}`"))),
        }
    }

    /// Skips the rest of a directive that ends at the end of its line.
    fn skip_line(&mut self, line: u32) {
        while self.pos < self.toks.len() && self.toks[self.pos].line == line {
            self.pos += 1;
        }
    }

    fn skip_to_semicolon(&mut self) -> Result<(), PtxError> {
        loop {
            if self.next()?.tok == Tok::Punct(';') {
                return Ok(());
            }
        }
    }

    fn module(&mut self) -> Result<Module, PtxError> {
        let mut target = String::new();
        let mut version = (0, 0);
        let mut kernels = Vec::new();
        let mut shared = SharedLayout::default();
        let mut globals: Vec<String> = Vec::new();
        while let Some(tok) = self.peek() {
            let line = self.cur_line();
            let w = match tok {
                Tok::Word(w) => w.as_str(),
                other => {
                    return Err(self.err(line, format!("unexpected {other:?} at module scope")))
                }
            };
            match w {
                ".version" => {
                    self.pos += 1;
                    let (v, l) = self.word()?;
                    let mut it = v.split('.');
                    let parsed = (|| Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?)))();
                    version = parsed.ok_or_else(|| self.err(l, format!("bad .version `{v}`")))?;
                }
                ".target" => {
                    self.pos += 1;
                    let (t, _) = self.word()?;
                    target = t.to_string();
                    while self.eat(',') {
                        self.word()?;
                    }
                }
                ".address_size" => {
                    self.pos += 1;
                    let n = self.number()?;
                    if n != 64 {
                        return Err(self.unsupported(
                            line,
                            ".address_size 32",
                            "only 64-bit addressing",
                        ));
                    }
                }
                ".file" | ".loc" => {
                    self.pos += 1;
                    self.skip_line(line);
                }
                ".pragma" => {
                    self.pos += 1;
                    self.skip_to_semicolon()?;
                }
                ".visible" | ".weak" | ".common" => {
                    self.pos += 1;
                }
                ".extern" => {
                    self.pos += 1;
                    if self.peek() == Some(&Tok::Word(".shared".into())) {
                        self.pos += 1;
                        let d = self.var_decl()?;
                        if !d.unsized_array {
                            return Err(self.unsupported(
                                line,
                                ".extern .shared",
                                "only unsized arrays (dynamic shared memory)",
                            ));
                        }
                        shared.dyn_align = shared.dyn_align.max(d.align);
                        shared.dyn_names.push(d.name);
                    }
                }
                ".entry" => {
                    self.pos += 1;
                    kernels.push(self.entry(&shared, &globals)?);
                }
                ".shared" => {
                    self.pos += 1;
                    let d = self.var_decl()?;
                    if d.unsized_array {
                        shared.dyn_align = shared.dyn_align.max(d.align);
                        shared.dyn_names.push(d.name);
                    } else {
                        shared.add(&d.name, d.size, d.align);
                    }
                }
                ".func" => {
                    return Err(self.unsupported(
                        line,
                        ".func",
                        "device functions and calls are not interpreted",
                    ))
                }
                ".global" | ".const" => {
                    // Declared (NVRTC 12.x emits an unused `.global` from nv/target);
                    // an instruction that uses one is refused when it is decoded.
                    self.pos += 1;
                    let d = self.var_decl_init()?;
                    globals.push(d.name);
                }
                ".section" => {
                    return Err(self.unsupported(
                        line,
                        ".section",
                        "debug sections (compile without -G)",
                    ))
                }
                other => {
                    return Err(self.unsupported(line, other, "unknown module-scope directive"))
                }
            }
        }
        if target.is_empty() {
            return Err(self.err(1, "no .target directive"));
        }
        Ok(Module {
            target,
            version,
            kernels,
        })
    }

    /// After `.shared`/`.local`: `[.align N] .type name[N]...[;]`.
    fn var_decl(&mut self) -> Result<VarDecl, PtxError> {
        let mut align = 0usize;
        let mut elem = None;
        let line = self.cur_line();
        let name = loop {
            let (w, l) = self.word()?;
            if w == ".align" {
                align = self.number()? as usize;
            } else if let Some(s) = type_size(w) {
                if s == 0 {
                    return Err(self.err(l, ".pred variables are not allowed"));
                }
                elem = Some(s);
            } else if w.starts_with(".v") {
                return Err(self.unsupported(l, w, "vector-typed variables"));
            } else if w.starts_with('.') {
                return Err(self.unsupported(l, w, "variable attribute"));
            } else {
                break w.to_string();
            }
        };
        let elem = elem.ok_or_else(|| self.err(line, format!("variable `{name}` has no type")))?;
        let mut count = 1usize;
        let mut unsized_array = false;
        while self.eat('[') {
            if self.eat(']') {
                unsized_array = true;
                continue;
            }
            let n = self.number()? as usize;
            self.punct(']')?;
            count = count.saturating_mul(n);
        }
        if self.peek() == Some(&Tok::Punct('=')) {
            return Err(self.unsupported(
                line,
                "variable initializer",
                "only .global/.const variables have initializers",
            ));
        }
        self.eat(';');
        Ok(VarDecl {
            name,
            size: if unsized_array { 0 } else { elem * count },
            align: if align == 0 { elem } else { align },
            unsized_array,
            line,
        })
    }

    /// `elem * count` bytes, at most 4 GiB.
    fn bounded(&self, line: u32, name: &str, elem: usize, count: usize) -> Result<usize, PtxError> {
        elem.checked_mul(count)
            .filter(|&s| s <= 1 << 32)
            .ok_or_else(|| {
                self.err(
                    line,
                    format!("`{name}` is too large ({count} elements of {elem} bytes)"),
                )
            })
    }

    /// A declared alignment (a power of two up to 4096), or the element size.
    fn alignment(&self, line: u32, align: usize, elem: usize) -> Result<usize, PtxError> {
        match align {
            0 => Ok(elem),
            a if a.is_power_of_two() && a <= 4096 => Ok(a),
            a => Err(self.err(line, format!("bad alignment {a}"))),
        }
    }

    /// A `.global`/`.const` variable, its initializer (`= ...;`) skipped.
    fn var_decl_init(&mut self) -> Result<VarDecl, PtxError> {
        let start = self.pos;
        // Find the `=` of this declaration, if any, before its `;`.
        let mut j = start;
        while j < self.toks.len() && !matches!(self.toks[j].tok, Tok::Punct(';') | Tok::Punct('='))
        {
            j += 1;
        }
        if j < self.toks.len() && self.toks[j].tok == Tok::Punct('=') {
            let all = self.toks;
            self.toks = &all[..j];
            let d = self.var_decl();
            self.toks = all;
            let d = d?;
            self.pos = j;
            self.skip_to_semicolon()?;
            return Ok(d);
        }
        self.var_decl()
    }

    /// `.param [.align N] .type [.ptr [.space] [.align N]] name[[N]]`
    fn param_decl(&mut self) -> Result<(String, usize, usize), PtxError> {
        let (w, line) = self.word()?;
        if w != ".param" {
            return Err(self.err(line, format!("expected .param, found `{w}`")));
        }
        let mut align = 0usize;
        let mut elem = None;
        let mut after_ptr = false;
        let name = loop {
            let (w, l) = self.word()?;
            match w {
                ".align" => {
                    let n = self.number()? as usize;
                    if !after_ptr {
                        align = n;
                    }
                }
                ".ptr" => after_ptr = true,
                ".global" | ".shared" | ".local" | ".const" if after_ptr => {}
                _ => {
                    if let Some(s) = type_size(w) {
                        if s == 0 {
                            return Err(self.err(l, ".pred parameters are not allowed"));
                        }
                        elem = Some(s);
                    } else if w.starts_with('.') {
                        return Err(self.unsupported(l, w, "parameter attribute"));
                    } else {
                        break w.to_string();
                    }
                }
            }
        };
        let elem = elem.ok_or_else(|| self.err(line, format!("parameter `{name}` has no type")))?;
        let mut count = 1usize;
        while self.eat('[') {
            let n = self.number()? as usize;
            self.punct(']')?;
            count = count.saturating_mul(n);
        }
        let size = self.bounded(line, &name, elem, count)?;
        Ok((name, size, self.alignment(line, align, elem)?))
    }

    fn dims(&mut self) -> Result<[u32; 3], PtxError> {
        let mut d = [1u32; 3];
        let line = self.cur_line();
        for (i, slot) in d.iter_mut().enumerate() {
            if i > 0 && !self.eat(',') {
                break;
            }
            let n = self.number()?;
            *slot = u32::try_from(n).map_err(|_| self.err(line, "dimension too large"))?;
        }
        Ok(d)
    }

    fn entry(&mut self, shared: &SharedLayout, globals: &[String]) -> Result<Kernel, PtxError> {
        let (name, line) = self.word()?;
        let name = name.to_string();
        let mut params = Vec::new();
        let mut param_names = Vec::new();
        let mut syms: HashMap<String, Sym> =
            globals.iter().map(|g| (g.clone(), Sym::Global)).collect();
        let mut end = 0usize;
        if self.eat('(') && !self.eat(')') {
            loop {
                let (pname, size, align) = self.param_decl()?;
                let offset = end.next_multiple_of(align.max(1));
                end = offset + size;
                syms.insert(
                    pname.clone(),
                    Sym::Param {
                        offset: offset as u64,
                    },
                );
                params.push(ParamSlot {
                    offset,
                    size,
                    align,
                });
                param_names.push(pname);
                if self.eat(')') {
                    break;
                }
                self.punct(',')?;
            }
        }
        let mut maxntid = None;
        let mut reqntid = None;
        loop {
            let l = self.cur_line();
            match self.peek() {
                Some(Tok::Punct('{')) => break,
                Some(Tok::Word(w)) => {
                    self.pos += 1;
                    match w.as_str() {
                        ".maxntid" => maxntid = Some(self.dims()?),
                        ".reqntid" => reqntid = Some(self.dims()?),
                        ".minnctapersm" | ".maxnreg" | ".maxnctapersm" => {
                            self.number()?;
                        }
                        ".noreturn" => {}
                        ".pragma" => self.skip_to_semicolon()?,
                        other => return Err(self.unsupported(l, other, "kernel directive")),
                    }
                }
                Some(other) => {
                    return Err(self.err(l, format!("unexpected {other:?} before the kernel body")))
                }
                None => return Err(self.err(l, "kernel without a body")),
            }
        }
        let mut layout = shared.clone();
        for v in &shared.vars {
            syms.insert(
                v.name.clone(),
                Sym::Shared {
                    offset: v.offset as u64,
                },
            );
        }
        let dyn_align = shared.dyn_align.max(16);
        let mut body = Body {
            scopes: vec![HashMap::new()],
            syms,
            data_regs: 0,
            pred_regs: 0,
            declared: 0,
            code: Vec::new(),
            labels: HashMap::new(),
            branches: Vec::new(),
            local: SharedLayout::default(),
            shared: &mut layout,
            dyn_align,
        };
        body.place_dynamic_shared();
        self.body(&mut body)?;
        let mut code = body.code;
        for (idx, label, l) in body.branches {
            let target = *body
                .labels
                .get(&label)
                .ok_or_else(|| self.err(l, format!("unknown label `{label}`")))?;
            decode::set_branch_target(&mut code[idx], target);
        }
        let static_shared = body.shared.end;
        let _ = line;
        Ok(Kernel {
            name,
            params,
            param_names,
            param_bytes: end,
            code,
            data_regs: body.data_regs,
            pred_regs: body.pred_regs,
            declared_regs: body.declared,
            shared_vars: body.shared.vars.clone(),
            static_shared,
            dynamic_shared_align: dyn_align,
            local_vars: body.local.vars,
            local_bytes: body.local.end,
            maxntid,
            reqntid,
        })
    }

    fn body(&mut self, b: &mut Body<'_>) -> Result<(), PtxError> {
        self.punct('{')?;
        let mut depth = 1usize;
        loop {
            let t = self.next()?;
            let line = t.line;
            match &t.tok {
                Tok::Punct('{') => {
                    depth += 1;
                    b.scopes.push(HashMap::new());
                }
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                    b.scopes.pop();
                }
                Tok::Punct(';') => {}
                Tok::Punct('@') => {
                    let neg = self.eat('!');
                    let (p, _) = self.word()?;
                    let guard = Some((p.to_string(), neg));
                    let (op, _) = self.word()?;
                    self.instruction(b, guard, op, line)?;
                }
                Tok::Word(w) if self.peek() == Some(&Tok::Punct(':')) && !w.starts_with('.') => {
                    self.pos += 1;
                    if b.labels.insert(w.clone(), b.code.len() as u32).is_some() {
                        return Err(self.err(line, format!("label `{w}` defined twice")));
                    }
                }
                Tok::Word(w) => {
                    match w.as_str() {
                        ".reg" => self.reg_decl(b, line)?,
                        ".local" => {
                            let d = self.var_decl()?;
                            if d.unsized_array {
                                return Err(self.unsupported(
                                    d.line,
                                    ".local []",
                                    "unsized local arrays",
                                ));
                            }
                            let off = b.local.add(&d.name, d.size, d.align);
                            b.syms.insert(d.name, Sym::Local { offset: off });
                        }
                        ".shared" => {
                            let d = self.var_decl()?;
                            if d.unsized_array {
                                return Err(self.unsupported(
                                    d.line,
                                    ".shared [] in a kernel body",
                                    "declare dynamic shared memory at module scope",
                                ));
                            }
                            if !b.code.is_empty() {
                                return Err(self.unsupported(d.line, ".shared after instructions", "declare a kernel's shared variables before its first instruction"));
                            }
                            let off = b.shared.add(&d.name, d.size, d.align);
                            b.syms.insert(d.name, Sym::Shared { offset: off });
                            b.place_dynamic_shared();
                        }
                        ".pragma" => self.skip_to_semicolon()?,
                        ".loc" | ".file" => self.skip_line(line),
                        ".param" => {
                            return Err(self.unsupported(
                                line,
                                ".param in a kernel body",
                                "call parameters (calls are not interpreted)",
                            ))
                        }
                        d if d.starts_with('.') => {
                            return Err(self.unsupported(line, d, "directive in a kernel body"))
                        }
                        _ => self.instruction(b, None, w, line)?,
                    }
                }
                other => return Err(self.err(line, format!("unexpected {other:?}"))),
            }
        }
    }

    fn reg_decl(&mut self, b: &mut Body<'_>, line: u32) -> Result<(), PtxError> {
        let (ty, l) = self.word()?;
        if ty.starts_with(".v") {
            return Err(self.unsupported(l, ty, "vector registers"));
        }
        let size = type_size(ty).ok_or_else(|| self.unsupported(l, ty, "register type"))?;
        loop {
            let (name, nl) = self.word()?;
            let count = if self.eat('<') {
                let n = self.number()?;
                self.punct('>')?;
                Some(n as u32)
            } else {
                None
            };
            let add = |b: &mut Body<'_>, n: String| {
                let reg = if size == 0 {
                    b.pred_regs += 1;
                    Reg::Pred(b.pred_regs - 1)
                } else {
                    b.data_regs += 1;
                    b.declared += 1;
                    Reg::Data {
                        idx: b.data_regs - 1,
                        bits: size as u32 * 8,
                    }
                };
                if let Some(scope) = b.scopes.last_mut() {
                    scope.insert(n, reg);
                }
            };
            match count {
                Some(n) => {
                    if n > 1 << 16 {
                        return Err(self.err(nl, "too many registers"));
                    }
                    for i in 0..n {
                        add(b, format!("{name}{i}"));
                    }
                }
                None => add(b, name.to_string()),
            }
            if !self.eat(',') {
                break;
            }
        }
        let _ = line;
        self.punct(';').map(|_| ())
    }

    fn instruction(
        &mut self,
        b: &mut Body<'_>,
        guard: Option<(String, bool)>,
        opcode: &str,
        line: u32,
    ) -> Result<(), PtxError> {
        let start = self.pos;
        let mut end = start;
        while end < self.toks.len() && self.toks[end].tok != Tok::Punct(';') {
            end += 1;
        }
        if end >= self.toks.len() {
            return Err(self.err(line, format!("`{opcode}` has no terminating `;`")));
        }
        let operands = parse_operands(&self.toks[start..end])
            .map_err(|m| self.err(line, format!("{opcode}: {m}")))?;
        self.pos = end + 1;
        let raw = RawInst {
            guard,
            opcode: opcode.to_string(),
            operands,
            line,
            text: self.line_of(line),
        };
        let names = decode::Names {
            scopes: &b.scopes,
            syms: &b.syms,
        };
        let (inst, label) = decode::decode(&raw, &names)?;
        if let Some(label) = label {
            b.branches.push((b.code.len(), label, line));
        }
        b.code.push(inst);
        Ok(())
    }
}

struct Body<'s> {
    scopes: Vec<HashMap<String, Reg>>,
    syms: HashMap<String, Sym>,
    data_regs: u32,
    pred_regs: u32,
    declared: u32,
    code: Vec<decode::Inst>,
    labels: HashMap<String, u32>,
    branches: Vec<(usize, String, u32)>,
    local: SharedLayout,
    shared: &'s mut SharedLayout,
    dyn_align: usize,
}

impl Body<'_> {
    /// Dynamic shared memory starts after every static variable, aligned (to at least 16).
    fn place_dynamic_shared(&mut self) {
        let start = self.shared.end.next_multiple_of(self.dyn_align) as u64;
        for n in &self.shared.dyn_names {
            self.syms.insert(n.clone(), Sym::Shared { offset: start });
        }
    }
}

/// The operand list of an instruction (the tokens between the opcode and `;`).
fn parse_operands(toks: &[Token]) -> Result<Vec<Opnd>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    if toks.is_empty() {
        return Ok(out);
    }
    loop {
        let (op, next) = operand(toks, i)?;
        out.push(op);
        i = next;
        match toks.get(i).map(|t| &t.tok) {
            None => return Ok(out),
            Some(Tok::Punct(',')) => i += 1,
            Some(other) => return Err(format!("unexpected {other:?} after an operand")),
        }
    }
}

fn tok_at(toks: &[Token], i: usize) -> Option<&Tok> {
    toks.get(i).map(|t| &t.tok)
}

fn operand(toks: &[Token], i: usize) -> Result<(Opnd, usize), String> {
    match tok_at(toks, i) {
        Some(Tok::Punct('[')) => {
            let mut j = i + 1;
            let mut base = None;
            let mut off: i64 = 0;
            let mut sign = 1i64;
            let mut expect_term = true;
            loop {
                match tok_at(toks, j) {
                    Some(Tok::Punct(']')) if !expect_term => {
                        return Ok((Opnd::Addr { base, off }, j + 1))
                    }
                    Some(Tok::Punct('+')) if !expect_term => {
                        sign = 1;
                        expect_term = true;
                    }
                    Some(Tok::Punct('-')) => sign = -sign,
                    Some(Tok::Word(w)) if expect_term => {
                        match decode::parse_lit(w) {
                            Some(Lit::Int { neg, mag }) => {
                                let v = i64::try_from(mag)
                                    .map_err(|_| format!("address offset `{w}` too large"))?;
                                let v = if neg { -v } else { v };
                                off = off.wrapping_add(sign * v);
                            }
                            Some(_) => return Err(format!("bad address offset `{w}`")),
                            None => {
                                if base.is_some() || sign < 0 {
                                    return Err(
                                        "an address has at most one register or symbol".into()
                                    );
                                }
                                base = Some(w.clone());
                            }
                        }
                        sign = 1;
                        expect_term = false;
                    }
                    other => return Err(format!("bad address: unexpected {other:?}")),
                }
                j += 1;
            }
        }
        Some(Tok::Punct('{')) => {
            let mut items = Vec::new();
            let mut j = i + 1;
            loop {
                let (op, next) = operand(toks, j)?;
                items.push(op);
                j = next;
                match tok_at(toks, j) {
                    Some(Tok::Punct(',')) => j += 1,
                    Some(Tok::Punct('}')) => return Ok((Opnd::Vec(items), j + 1)),
                    other => return Err(format!("bad vector operand: unexpected {other:?}")),
                }
            }
        }
        Some(Tok::Punct('!')) => match tok_at(toks, i + 1) {
            Some(Tok::Word(w)) => Ok((Opnd::Not(w.clone()), i + 2)),
            other => Err(format!("expected a predicate after `!`, found {other:?}")),
        },
        Some(Tok::Punct('-')) => match tok_at(toks, i + 1) {
            Some(Tok::Word(w)) => match decode::parse_lit(w) {
                Some(l) => Ok((Opnd::Imm(decode::negate_lit(l)), i + 2)),
                None => Err(format!("cannot negate `{w}`")),
            },
            other => Err(format!("expected a number after `-`, found {other:?}")),
        },
        Some(Tok::Word(w)) => {
            if let Some(l) = decode::parse_lit(w) {
                return Ok((Opnd::Imm(l), i + 1));
            }
            if tok_at(toks, i + 1) == Some(&Tok::Punct('|')) {
                if let Some(Tok::Word(q)) = tok_at(toks, i + 2) {
                    return Ok((Opnd::Pipe(w.clone(), q.clone()), i + 3));
                }
                return Err("expected a predicate after `|`".into());
            }
            if w == "generic" && tok_at(toks, i + 1) == Some(&Tok::Punct('(')) {
                if let (Some(Tok::Word(s)), Some(Tok::Punct(')'))) =
                    (tok_at(toks, i + 2), tok_at(toks, i + 3))
                {
                    return Ok((Opnd::Generic(s.clone()), i + 4));
                }
                return Err("bad generic(...) operand".into());
            }
            Ok((Opnd::Name(w.clone()), i + 1))
        }
        other => Err(format!("expected an operand, found {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
.version 8.5
.target sm_90
.address_size 64
.shared .align 8 .b8 sdata[2048];
.extern .shared .align 16 .b8 dyn[];
.visible .entry k(
	.param .u64 k_param_0,
	.param .u32 k_param_1,
	.param .align 8 .b8 k_param_2[512],
	.param .f32 k_param_3,
	.param .u64 .ptr .global .align 1 k_param_4
)
.maxntid 256, 1, 1
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<10>;
	.reg .b64 	%rd<5>;
	.reg .b64 %SP, %SPL;
	.local .align 4 .b8 __local_depot0[12];
	ld.param.u64 	%rd1, [k_param_0];
	mov.b64 %rd2, k_param_2;
	{
	.reg .b32 %inner;
	mov.u32 %inner, 1;
	}
$L__BB0_1:
	@!%p1 bra 	$L__BB0_1;
	ret;
}
"#;

    #[test]
    fn parses_layout_of_params_shared_and_local() {
        let m = Module::parse(SMALL).expect("parses");
        assert_eq!(m.target(), "sm_90");
        assert_eq!(m.version(), (8, 5));
        assert_eq!(m.kernel_names(), vec!["k"]);
        let k = m.kernel("k").expect("k");
        let offs: Vec<(usize, usize)> = k.params().iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(offs, vec![(0, 8), (8, 4), (16, 512), (528, 4), (536, 8)]);
        assert_eq!(k.param_bytes(), 544);
        assert_eq!(k.static_shared_bytes(), 2048);
        assert_eq!(k.local_bytes(), 12);
        assert_eq!(k.max_threads(), Some(256));
        assert_eq!(k.registers(), 10 + 5 + 2 + 1);
        assert_eq!(k.instruction_count(), 5);
    }

    #[test]
    fn errors_name_the_line() {
        let bad = SMALL.replace("ret;", "atom.global.add.u32 %r1, [%rd1], 1;\n\tret;");
        let e = Module::parse(&bad).expect_err("atomics unsupported");
        let s = e.to_string();
        assert!(s.contains("atom.global.add.u32"), "{s}");
        let expect = bad
            .lines()
            .position(|l| l.contains("atom.global"))
            .map(|i| i as u32 + 1);
        assert_eq!(Some(e.line()), expect, "{s}");
        let bad = SMALL.replace("ret;", "add.u32 %r99, %r1, %r2;\n\tret;");
        let s = Module::parse(&bad).expect_err("undeclared").to_string();
        assert!(s.contains("%r99"), "{s}");
        let bad = SMALL.replace("@!%p1 bra 	$L__BB0_1;", "@!%p1 bra 	$L__BB0_9;");
        let s = Module::parse(&bad).expect_err("unknown label").to_string();
        assert!(s.contains("$L__BB0_9"), "{s}");
        let ok = SMALL.replace(
            ".visible .entry",
            ".global .align 8 .u64 g = 1;\n.const .b8 c[2] = {1, 2};\n.visible .entry",
        );
        Module::parse(&ok).expect("unused module variables are fine");
        let bad = ok.replace("ret;", "mov.u64 %rd3, g;\n\tret;");
        let s = Module::parse(&bad)
            .expect_err("used module variable")
            .to_string();
        assert!(s.contains("`g`"), "{s}");
        let bad = SMALL.replace(".visible .entry", ".visible .func");
        let s = Module::parse(&bad).expect_err("func").to_string();
        assert!(s.contains(".func"), "{s}");
        let bad = SMALL.replace(
            "mov.u32 %inner, 1;",
            "mov.u32 %inner, 1;\n}\nmov.u32 %inner, 2;\n{",
        );
        let s = Module::parse(&bad).expect_err("out of scope").to_string();
        assert!(s.contains("%inner"), "{s}");
    }
}
