//! The interpreter on hand-written PTX: control flow, barriers, memories, special
//! registers, predicates, and what it refuses.

use super::testmem::{pack, Arg, TestMem};
use super::*;

const HEAD: &str = ".version 8.5\n.target sm_90\n.address_size 64\n";

/// A module with one kernel `k(params)` and `body`, after module-scope `decls`.
fn kernel_text(decls: &str, params: &str, body: &str) -> String {
    format!(
        "{HEAD}{decls}\n.visible .entry k({params})\n{{\n\t.reg .pred %p<8>;\n\t.reg .b16 %rs<8>;\n\t.reg .b32 %r<20>;\n\t.reg .f32 %f<8>;\n\t.reg .b64 %rd<20>;\n{body}\n}}\n"
    )
}

fn module(decls: &str, params: &str, body: &str) -> Module {
    let text = kernel_text(decls, params, body);
    Module::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn dims(grid: [u32; 3], block: [u32; 3]) -> LaunchDims {
    LaunchDims {
        grid,
        block,
        dynamic_shared_bytes: 0,
    }
}

/// Runs `k(out)` with `n` u32 outputs; the outputs.
fn run_out(m: &Module, d: &LaunchDims, n: usize, seed: u64) -> Result<Vec<u32>, ExecError> {
    let k = m.kernel("k").expect("k");
    let mut mem = TestMem::new();
    let out = mem.alloc_of("out", &vec![0xdead_beefu32; n]);
    launch(
        k,
        d,
        &pack(k, &[Arg::U64(out)]),
        &mut mem,
        &ExecOptions {
            seed,
            max_shared_bytes: 0,
            max_warp_instructions: 0,
        },
    )?;
    Ok(mem.read(out))
}

/// Stores `%r{reg}` to `out[linear tid.x]`.
fn store_r(reg: u32) -> String {
    format!(
        "\tld.param.u64 %rd1, [out];\n\tmov.u32 %r19, %tid.x;\n\tmul.wide.u32 %rd2, %r19, 4;\n\tadd.s64 %rd3, %rd1, %rd2;\n\tst.global.u32 [%rd3], %r{reg};\n"
    )
}

fn fault_message(r: Result<Vec<u32>, ExecError>) -> String {
    match r {
        Err(e @ ExecError::Fault { .. }) => e.to_string(),
        other => panic!("expected a fault, got {other:?}"),
    }
}

#[test]
fn divergent_loops_reconverge() {
    let body = format!(
        "\tmov.u32 %r1, %tid.x;\n\tmov.u32 %r2, 0;\n\tand.b32 %r3, %r1, 1;\n\tsetp.eq.u32 %p1, %r3, 0;\n\t@%p1 bra EVEN;\n\tmov.u32 %r4, 0;\nLOOP:\n\tadd.u32 %r2, %r2, 3;\n\tadd.u32 %r4, %r4, 1;\n\tsetp.lt.u32 %p2, %r4, %r1;\n\t@%p2 bra LOOP;\n\tbra.uni JOIN;\nEVEN:\n\tmov.u32 %r2, 1000;\nJOIN:\n\tadd.u32 %r2, %r2, %r1;\n{}\tret;",
        store_r(2)
    );
    let m = module("", ".param .u64 out", &body);
    let out = run_out(&m, &dims([1, 1, 1], [70, 1, 1]), 70, 1).expect("runs");
    for (t, &v) in out.iter().enumerate() {
        let t = t as u32;
        assert_eq!(v, if t % 2 == 0 { 1000 + t } else { 4 * t }, "thread {t}");
    }
}

#[test]
fn exited_threads_count_as_arrived_and_32_bit_shared_addresses_work() {
    let body = format!(
        "\tmov.u32 %r1, %tid.x;\n\tsetp.ge.u32 %p1, %r1, 40;\n\t@%p1 ret;\n\tshl.b32 %r2, %r1, 2;\n\tmov.u32 %r3, sm;\n\tadd.u32 %r4, %r3, %r2;\n\tst.shared.u32 [%r4], %r1;\n\tbar.sync 0;\n\tmov.u32 %r6, 39;\n\tsub.u32 %r5, %r6, %r1;\n\tshl.b32 %r7, %r5, 2;\n\tadd.u32 %r8, %r3, %r7;\n\tld.shared.u32 %r9, [%r8];\n{}\tret;",
        store_r(9)
    );
    let m = module(".shared .align 4 .b8 sm[256];", ".param .u64 out", &body);
    for seed in 0..4 {
        let out = run_out(&m, &dims([1, 1, 1], [64, 1, 1]), 64, seed).expect("runs");
        for t in 0..40u32 {
            assert_eq!(out[t as usize], 39 - t);
        }
        assert!(out[40..].iter().all(|&x| x == 0xdead_beef));
    }
}

#[test]
fn barriers_that_can_never_release_are_a_fault() {
    let body = "\tmov.u32 %r1, %tid.x;\n\tsetp.lt.u32 %p1, %r1, 32;\n\t@%p1 bra A;\n\tbar.sync 1;\n\tret;\nA:\n\tbar.sync 0;\n\tret;";
    let m = module("", ".param .u64 out", body);
    let s = fault_message(run_out(&m, &dims([1, 1, 1], [64, 1, 1]), 64, 0));
    assert!(
        s.contains("barrier deadlock") && s.contains("barrier 1") && s.contains("barrier 0"),
        "{s}"
    );
    let body = "\tbar.sync 0, 32;\n\tret;";
    let m = module("", ".param .u64 out", body);
    let s = fault_message(run_out(&m, &dims([1, 1, 1], [64, 1, 1]), 64, 0));
    assert!(s.contains("thread count"), "{s}");
    assert_eq!(m.kernel("k").map(Kernel::instruction_count), Some(2));
    let ok = run_out(
        &module(
            "",
            ".param .u64 out",
            "\tbarrier.sync.aligned 0, 64;\n\tbar.sync 3;\n\tret;",
        ),
        &dims([1, 1, 1], [64, 1, 1]),
        64,
        0,
    );
    ok.expect("whole-block counts are fine");
}

#[test]
fn local_memory_direct_and_generic() {
    let body = format!(
        "\t.reg .b64 %SP;\n\t.reg .b64 %SPL;\n\t.local .align 8 .b8 depot[16];\n\tmov.u64 %SPL, depot;\n\tcvta.local.u64 %SP, %SPL;\n\tmov.u32 %r1, %tid.x;\n\tst.local.u32 [%SPL], %r1;\n\tadd.u32 %r2, %r1, 100;\n\tst.u32 [%SP+4], %r2;\n\tld.local.v2.u32 {{%r3, %r4}}, [depot];\n\tadd.u32 %r5, %r3, %r4;\n{}\tret;",
        store_r(5)
    );
    let m = module("", ".param .u64 out", &body);
    assert_eq!(m.kernel("k").map(|k| k.local_bytes()), Some(16));
    let out = run_out(&m, &dims([2, 1, 1], [40, 1, 1]), 40, 0).expect("runs");
    for (t, &v) in out.iter().enumerate() {
        assert_eq!(v, 2 * t as u32 + 100);
    }
    let uninit = body.replace("\tadd.u32 %r5, %r3, %r4;", "\tld.local.u32 %r5, [depot+8];");
    let s = fault_message(run_out(
        &module("", ".param .u64 out", &uninit),
        &dims([1, 1, 1], [8, 1, 1]),
        8,
        0,
    ));
    assert!(s.contains("uninitialized local memory `depot`+8"), "{s}");
    let oob = body.replace(
        "\tadd.u32 %r5, %r3, %r4;",
        "\tld.local.u32 %r5, [depot+16];",
    );
    let s = fault_message(run_out(
        &module("", ".param .u64 out", &oob),
        &dims([1, 1, 1], [8, 1, 1]),
        8,
        0,
    ));
    assert!(s.contains("out of bounds"), "{s}");
}

#[test]
fn parameters_read_through_symbols_registers_and_generic_addresses() {
    let body = "\tld.param.u64 %rd1, [out];\n\tmov.b64 %rd5, blob;\n\tcvta.param.u64 %rd6, %rd5;\n\tld.u32 %r1, [%rd6+8];\n\tld.param.u32 %r2, [%rd5+4];\n\tld.param.u32 %r3, [blob];\n\tadd.u32 %r4, %r1, %r2;\n\tadd.u32 %r4, %r4, %r3;\n\tst.global.u32 [%rd1], %r4;\n\tret;";
    let m = module("", ".param .u64 out, .param .align 4 .b8 blob[12]", body);
    let k = m.kernel("k").expect("k");
    assert_eq!(
        k.params()[1],
        ParamSlot {
            offset: 8,
            size: 12,
            align: 4
        }
    );
    assert_eq!(k.param_names(), &["out".to_string(), "blob".to_string()]);
    let mut blob = Vec::new();
    for x in [1u32, 20, 300] {
        blob.extend_from_slice(&x.to_le_bytes());
    }
    let mut mem = TestMem::new();
    let out = mem.alloc_of("out", &[0u32]);
    launch(
        k,
        &dims([1, 1, 1], [3, 1, 1]),
        &pack(k, &[Arg::U64(out), Arg::Bytes(blob.clone())]),
        &mut mem,
        &ExecOptions::default(),
    )
    .expect("runs");
    assert_eq!(mem.read::<u32>(out), vec![321]);
    for store in ["\tst.u32 [%rd6], %r1;", "\tst.param.u32 [blob], %r1;"] {
        let bad = body.replace("\tret;", &format!("{store}\n\tret;"));
        let m = module("", ".param .u64 out, .param .align 4 .b8 blob[12]", &bad);
        let k = m.kernel("k").expect("k");
        let r = launch(
            k,
            &dims([1, 1, 1], [1, 1, 1]),
            &pack(k, &[Arg::U64(out), Arg::Bytes(blob.clone())]),
            &mut mem,
            &ExecOptions::default(),
        );
        let s = r.expect_err("parameters are read-only").to_string();
        assert!(s.contains("read-only"), "{s}");
    }
}

#[test]
fn vectors_packing_and_sinks() {
    let body = "\tld.param.u64 %rd1, [out];\n\tmov.u32 %r1, 5;\n\tmov.u32 %r2, 7;\n\tmov.b64 %rd7, {%r1, %r2};\n\tmov.b64 {%r3, %r4}, %rd7;\n\tmov.u16 %rs1, 0x1234;\n\tmov.u16 %rs2, 0xabcd;\n\tmov.b32 %r5, {%rs1, %rs2};\n\tst.global.v2.u64 [%rd1], {%rd7, %rd7};\n\tst.global.v4.u32 [%rd1+16], {%r3, %r4, %r5, %r1};\n\tld.global.v4.u32 {%r6, _, %r7, _}, [%rd1+16];\n\tst.global.v2.u32 [%rd1+32], {%r6, %r7};\n\tret;";
    let m = module("", ".param .u64 out", body);
    let out = run_out(&m, &dims([1, 1, 1], [1, 1, 1]), 10, 0).expect("runs");
    assert_eq!(out, vec![5, 7, 5, 7, 5, 7, 0xabcd_1234, 5, 5, 0xabcd_1234]);
}

#[test]
fn special_registers_in_three_dimensions() {
    // out[block linear * 64 + thread linear] = laneid + 100 * warpid + 1000 * (tid.x + 10 tid.y + 100 tid.z)
    let body = "\tld.param.u64 %rd1, [out];\n\tmov.u32 %r1, %tid.x;\n\tmov.u32 %r2, %tid.y;\n\tmov.u32 %r3, %tid.z;\n\tmov.u32 %r4, %ntid.x;\n\tmov.u32 %r5, %ntid.y;\n\tmul.lo.u32 %r6, %r4, %r5;\n\tmad.lo.u32 %r7, %r2, %r4, %r1;\n\tmad.lo.u32 %r7, %r3, %r6, %r7;\n\tmov.u32 %r8, %ctaid.x;\n\tmov.u32 %r9, %ctaid.y;\n\tmov.u32 %r10, %nctaid.x;\n\tmad.lo.u32 %r11, %r9, %r10, %r8;\n\tmov.u32 %r12, %ntid.z;\n\tmul.lo.u32 %r12, %r12, %r6;\n\tmad.lo.u32 %r13, %r11, %r12, %r7;\n\tmov.u32 %r14, %laneid;\n\tmov.u32 %r15, %warpid;\n\tmad.lo.u32 %r14, %r15, 100, %r14;\n\tmad.lo.u32 %r16, %r2, 10, %r1;\n\tmad.lo.u32 %r16, %r3, 100, %r16;\n\tmad.lo.u32 %r14, %r16, 1000, %r14;\n\tmul.wide.u32 %rd2, %r13, 4;\n\tadd.s64 %rd3, %rd1, %rd2;\n\tst.global.u32 [%rd3], %r14;\n\tret;";
    let m = module("", ".param .u64 out", body);
    let out = run_out(&m, &dims([2, 3, 1], [8, 4, 2]), 6 * 64, 5).expect("runs");
    for b in 0..6usize {
        for t in 0..64u32 {
            let (x, y, z) = (t % 8, (t / 8) % 4, t / 32);
            let want = t % 32 + 100 * (t / 32) + 1000 * (x + 10 * y + 100 * z);
            assert_eq!(out[b * 64 + t as usize], want, "block {b} thread {t}");
        }
    }
}

#[test]
fn partial_warps_and_lane_masks() {
    let body = format!(
        "\tmov.u32 %r1, %lanemask_lt;\n\tpopc.b32 %r2, %r1;\n{}\tret;",
        store_r(2)
    );
    let m = module("", ".param .u64 out", &body);
    let out = run_out(&m, &dims([1, 1, 1], [33, 1, 1]), 33, 0).expect("runs");
    for (t, &v) in out.iter().enumerate() {
        assert_eq!(v, (t % 32) as u32);
    }
}

#[test]
fn predicates_combine_and_select() {
    let body = format!(
        "\tmov.u32 %r1, %tid.x;\n\tsetp.lt.s32 %p1|%p2, %r1, 16;\n\tsetp.ne.and.u32 %p3, %r1, 3, %p1;\n\tcvt.rn.f32.u32 %f1, %r1;\n\tsetp.gt.and.f32 %p4, %f1, 0f41200000, !%p2;\n\tmov.f32 %f2, 0f7FC00000;\n\tsetp.equ.f32 %p5, %f2, %f1;\n\tsetp.eq.f32 %p6, %f2, %f2;\n\tor.pred %p7, %p5, %p6;\n\tselp.u32 %r2, 1, 0, %p3;\n\tselp.u32 %r3, 2, 0, %p4;\n\tselp.u32 %r4, 4, 0, %p7;\n\tnot.pred %p6, %p6;\n\tselp.u32 %r5, 8, 0, %p6;\n\tor.b32 %r2, %r2, %r3;\n\tor.b32 %r2, %r2, %r4;\n\tor.b32 %r2, %r2, %r5;\n\tsub.s32 %r6, %r1, 8;\n\tslct.u32.s32 %r7, 16, 0, %r6;\n\tor.b32 %r2, %r2, %r7;\n{}\tret;",
        store_r(2)
    );
    let m = module("", ".param .u64 out", &body);
    let out = run_out(&m, &dims([1, 1, 1], [32, 1, 1]), 32, 0).expect("runs");
    for (t, &v) in out.iter().enumerate() {
        let p3 = t != 3 && t < 16;
        let p4 = t > 10 && t < 16;
        let want = p3 as u32 | (p4 as u32) << 1 | 4 | 8 | if t >= 8 { 16 } else { 0 };
        assert_eq!(v, want, "thread {t}");
    }
}

#[test]
fn warp_sync_orders_a_warps_shared_accesses() {
    let body = |sync: bool| {
        format!(
            "\tmov.u32 %r1, %tid.x;\n\tsetp.eq.u32 %p1, %r1, 0;\n\tmov.u32 %r3, 7;\n\t@%p1 st.shared.u32 [sm], %r3;\n{}\tld.shared.u32 %r2, [sm];\n{}\tret;",
            if sync { "\tbar.warp.sync -1;\n" } else { "" },
            store_r(2)
        )
    };
    let m = module(
        ".shared .align 4 .b8 sm[128];",
        ".param .u64 out",
        &body(true),
    );
    assert_eq!(
        run_out(&m, &dims([1, 1, 1], [32, 1, 1]), 32, 0).expect("ordered"),
        vec![7; 32]
    );
    let m = module(
        ".shared .align 4 .b8 sm[128];",
        ".param .u64 out",
        &body(false),
    );
    let s = fault_message(run_out(&m, &dims([1, 1, 1], [32, 1, 1]), 32, 0));
    assert!(
        s.contains("race on `sm`+0") && s.contains("thread (0, 0, 0) wrote"),
        "{s}"
    );
}

#[test]
fn shared_bounds_alignment_and_dynamic_memory() {
    let decls = ".shared .align 4 .b8 sm[100];\n.extern .shared .align 16 .b8 dsm[];";
    let run = |body: &str, dynamic: u32| {
        let m = module(decls, ".param .u64 out", body);
        let k = m.kernel("k").expect("k");
        assert_eq!(k.static_shared_bytes(), 100);
        let mut mem = TestMem::new();
        let out = mem.alloc_of("out", &[0u32; 32]);
        let d = LaunchDims {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            dynamic_shared_bytes: dynamic,
        };
        launch(
            k,
            &d,
            &pack(k, &[Arg::U64(out)]),
            &mut mem,
            &ExecOptions::default(),
        )
        .map(|_| mem.read::<u32>(out))
    };
    let dynamic = format!(
        "\tmov.u32 %r1, %tid.x;\n\tmov.u64 %rd4, dsm;\n\tmul.wide.u32 %rd5, %r1, 4;\n\tadd.s64 %rd6, %rd4, %rd5;\n\tmov.u32 %r2, %dynamic_smem_size;\n\tadd.u32 %r2, %r2, %r1;\n\tst.shared.u32 [%rd6], %r2;\n\tld.shared.u32 %r3, [%rd6];\n{}\tret;",
        store_r(3)
    );
    let out = run(&dynamic, 128).expect("dynamic shared memory");
    assert!(out.iter().enumerate().all(|(t, &v)| v == 128 + t as u32));
    let s = run(&dynamic, 64)
        .expect_err("past the dynamic bytes")
        .to_string();
    assert!(s.contains("out of bounds"), "{s}");
    let s = run("\tld.shared.u32 %r1, [sm+2];\n\tret;", 0)
        .expect_err("misaligned")
        .to_string();
    assert!(s.contains("misaligned address"), "{s}");
    let s = run(
        "\tmov.u32 %r1, 1;\n\tst.shared.u32 [sm+112], %r1;\n\tret;",
        0,
    )
    .expect_err("outside")
    .to_string();
    assert!(
        s.contains("out of bounds")
            && s.contains("offset 112")
            && s.contains("100 bytes of shared memory"),
        "{s}"
    );
}

#[test]
fn a_fault_caused_by_an_uninitialized_shared_read_names_the_read() {
    let body = "\tld.param.u64 %rd1, [out];\n\tld.shared.u32 %r2, [sm];\n\tadd.u32 %r2, %r2, 1000;\n\tmul.wide.u32 %rd2, %r2, 4;\n\tadd.s64 %rd3, %rd1, %rd2;\n\tst.global.u32 [%rd3], %r2;\n\tret;";
    let m = module(".shared .align 4 .b8 sm[128];", ".param .u64 out", body);
    let s = fault_message(run_out(&m, &dims([1, 1, 1], [32, 1, 1]), 32, 0));
    assert!(
        s.contains("uninitialized shared memory")
            && s.contains("`sm`+0")
            && s.contains("ld.shared"),
        "{s}"
    );
}

#[test]
fn integer_division_by_zero_and_trap() {
    let body = format!("\tmov.u32 %r1, %tid.x;\n\tdiv.u32 %r2, 7, %r1;\n\trem.s32 %r3, 7, %r1;\n\tadd.u32 %r2, %r2, %r3;\n{}\tret;", store_r(2));
    let m = module("", ".param .u64 out", &body);
    let out = run_out(&m, &dims([1, 1, 1], [4, 1, 1]), 4, 0).expect("no panic");
    assert_eq!(out[1..], [7, 3 + 1, 2 + 1]);
    let m = module(
        "",
        ".param .u64 out",
        "\tmov.u32 %r1, %tid.x;\n\tsetp.eq.u32 %p1, %r1, 3;\n\t@%p1 trap;\n\tret;",
    );
    let s = fault_message(run_out(&m, &dims([1, 1, 1], [8, 1, 1]), 8, 0));
    assert!(s.contains("trap") && s.contains("thread (3, 0, 0)"), "{s}");
}

#[test]
fn launches_are_checked() {
    let m = module("", ".param .u64 out", "\tret;");
    let k = m.kernel("k").expect("k");
    let mut mem = TestMem::new();
    let opts = ExecOptions::default();
    assert!(matches!(
        launch(k, &dims([1, 1, 1], [1, 1, 1]), &[0; 4], &mut mem, &opts),
        Err(ExecError::ParamSize {
            expected: 8,
            actual: 4,
            ..
        })
    ));
    assert!(matches!(
        launch(k, &dims([0, 1, 1], [1, 1, 1]), &[0; 8], &mut mem, &opts),
        Err(ExecError::BadLaunch { .. })
    ));
    assert!(matches!(
        launch(k, &dims([1, 1, 1], [1, 1, 65]), &[0; 8], &mut mem, &opts),
        Err(ExecError::LaunchLimit { .. })
    ));
    let text = kernel_text("", ".param .u64 out", "\tret;").replace("\n{", "\n.reqntid 64\n{");
    let m = Module::parse(&text).expect("parses");
    let k = m.kernel("k").expect("k");
    assert_eq!(k.max_threads(), Some(64));
    assert!(matches!(
        launch(k, &dims([1, 1, 1], [32, 1, 1]), &[0; 8], &mut mem, &opts),
        Err(ExecError::BadLaunch { .. })
    ));
    let stats = launch(k, &dims([3, 1, 1], [64, 1, 1]), &[0; 8], &mut mem, &opts).expect("runs");
    assert_eq!(
        (
            stats.blocks,
            stats.warp_instructions,
            stats.thread_instructions
        ),
        (3, 6, 192)
    );
}

#[test]
fn unsupported_instructions_are_refused_with_their_line() {
    for (inst, what) in [
        (
            "shfl.sync.bfly.b32 %r1, %r2, 1, 31, -1;",
            "shfl.sync.bfly.b32",
        ),
        ("vote.sync.any.pred %p1, %p2, -1;", "vote"),
        ("div.approx.f32 %f1, %f2, %f3;", "div.approx.f32"),
        ("div.full.f32 %f1, %f2, %f3;", "div.full.f32"),
        ("add.rz.f32 %f1, %f2, %f3;", ".rz"),
        ("cvt.rz.f16.f32 %rs1, %f1;", ".rz"),
        ("add.f16 %rs1, %rs2, %rs3;", "add.f16"),
        ("ex2.approx.f32 %f1, %f2;", "ex2.approx.f32"),
        ("add.cc.u32 %r1, %r2, %r3;", "add.cc.u32"),
        (
            "ld.global.L2::cache_hint.u32 %r1, [%rd1], %rd2;",
            "cache_hint",
        ),
        ("ld.const.u32 %r1, [%rd1];", ".const"),
        ("mov.u32 %r1, %globaltimer_lo;", "%globaltimer_lo"),
        ("atom.shared.add.u32 %r1, [%rd1], 1;", "atom.shared.add.u32"),
        ("add.u32.foo %r1, %r2, %r3;", ".foo"),
    ] {
        let text = kernel_text(
            "",
            ".param .u64 out",
            &format!("\tmov.u32 %r1, 0;\n\t{inst}\n\tret;"),
        );
        let e = Module::parse(&text).expect_err(inst);
        let s = e.to_string();
        assert!(matches!(e, PtxError::Unsupported { .. }), "{inst}: {s}");
        assert!(s.contains(what), "{inst}: {s}");
        let line = text
            .lines()
            .position(|l| l.contains(inst))
            .map(|i| i as u32 + 1);
        assert_eq!(Some(e.line()), line, "{s}");
    }
    for (inst, what) in [
        ("add.u32 %r1, %r2;", "operands"),
        ("bra NOWHERE;", "NOWHERE"),
        ("frob.u32 %r1;", "frob.u32"),
    ] {
        let text = kernel_text("", ".param .u64 out", &format!("\t{inst}\n\tret;"));
        let s = Module::parse(&text).expect_err(inst).to_string();
        assert!(s.contains(what), "{inst}: {s}");
    }
    let text = format!("{HEAD}.visible .func f()\n{{\n\tret;\n}}\n");
    assert!(Module::parse(&text)
        .expect_err(".func")
        .to_string()
        .contains(".func"));
}

#[test]
fn float_and_conversion_instructions_match_the_gpu_rules() {
    // min with NaN returns the other operand; sqrt of a negative is the canonical NaN;
    // cvt.rni/cvt.rzi; f64 arithmetic; fma rounds once.
    let body = "\tld.param.u64 %rd1, [out];\n\tmov.f32 %f1, 0f7FC00000;\n\tmov.f32 %f2, 0f40200000;\n\tmin.f32 %f3, %f1, %f2;\n\tmov.b32 %r1, %f3;\n\tst.global.u32 [%rd1], %r1;\n\tneg.f32 %f4, %f2;\n\tsqrt.rn.f32 %f5, %f4;\n\tmov.b32 %r2, %f5;\n\tst.global.u32 [%rd1+4], %r2;\n\tcvt.rni.s32.f32 %r3, %f2;\n\tst.global.u32 [%rd1+8], %r3;\n\tcvt.rzi.s32.f32 %r4, %f4;\n\tst.global.u32 [%rd1+12], %r4;\n\tmov.f32 %f6, 0f3F800001;\n\tfma.rn.f32 %f7, %f6, %f6, 0fBF800002;\n\tmov.b32 %r5, %f7;\n\tst.global.u32 [%rd1+16], %r5;\n\tmul.f32 %f7, %f6, %f6;\n\tadd.f32 %f7, %f7, 0fBF800002;\n\tmov.b32 %r6, %f7;\n\tst.global.u32 [%rd1+20], %r6;\n\tret;";
    let m = module("", ".param .u64 out", body);
    let out = run_out(&m, &dims([1, 1, 1], [1, 1, 1]), 6, 0).expect("runs");
    let one_ulp = f32::from_bits(0x3F80_0001);
    let fused = one_ulp.mul_add(one_ulp, f32::from_bits(0xBF80_0002));
    let split = one_ulp * one_ulp + f32::from_bits(0xBF80_0002);
    assert_eq!(
        out,
        vec![
            2.5f32.to_bits(),
            0x7fff_ffff,
            2,
            (-2i32) as u32,
            fused.to_bits(),
            split.to_bits()
        ]
    );
    assert_ne!(fused.to_bits(), split.to_bits());
}

#[test]
fn modules_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Module>();
    shareable::<Kernel>();
    shareable::<PtxError>();
    shareable::<ExecError>();
}

#[test]
fn damaged_text_is_an_error_never_a_panic() {
    // A kernel using most of the syntax, then damaged in many ways (seeded, printed).
    let body = format!(
        "\t.local .align 8 .b8 depot[16];\n\tmov.u32 %r1, %tid.x;\n\tsetp.lt.u32 %p1|%p2, %r1, 16;\n\t@!%p1 bra DONE;\n\tld.shared.v2.u32 {{%r2, %r3}}, [sm+8];\n\tcvt.rn.f32.u32 %f1, %r2;\n\tst.local.f32 [depot+-0], %f1;\n\tmov.b64 %rd4, {{%r2, %r3}};\nDONE:\n\tbar.sync 0;\n{}\tret;",
        store_r(1)
    );
    let text = kernel_text(".shared .align 8 .b8 sm[64];", ".param .u64 out", &body);
    Module::parse(&text).expect("the undamaged text parses");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    println!("damaged_text_is_an_error_never_a_panic: seed = {seed}");
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let bytes = text.as_bytes();
    let alphabet = b"{}[]()<>;,.:%@!|+-_0123456789abcxyz \n\"";
    for _ in 0..3000 {
        let mut t = bytes.to_vec();
        for _ in 0..1 + next() % 3 {
            let at = (next() % t.len() as u64) as usize;
            match next() % 3 {
                0 => {
                    let len = (next() % 8) as usize;
                    t.drain(at..(at + len).min(t.len()));
                }
                1 => t[at] = alphabet[(next() % alphabet.len() as u64) as usize],
                _ => t.insert(at, alphabet[(next() % alphabet.len() as u64) as usize]),
            }
        }
        if let Ok(damaged) = String::from_utf8(t) {
            let _ = Module::parse(&damaged);
        }
    }
}

#[test]
fn an_endless_loop_is_a_fault_past_the_instruction_budget() {
    let m = module("", ".param .u64 out", "$L__loop:\n\tbra.uni $L__loop;\n");
    let k = m.kernel("k").expect("k");
    let mut mem = TestMem::new();
    let out = mem.alloc_of("out", &[0u32; 1]);
    let r = launch(
        k,
        &dims([1, 1, 1], [32, 1, 1]),
        &pack(k, &[Arg::U64(out)]),
        &mut mem,
        &ExecOptions {
            seed: 1,
            max_shared_bytes: 0,
            max_warp_instructions: 1000,
        },
    );
    match r {
        Err(e @ ExecError::Fault { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains("past 1000 warp instructions") && m.contains("bra.uni"),
                "{m}"
            );
        }
        other => panic!("expected a fault, got {other:?}"),
    }
    // The clean twin: a kernel that ends runs within any budget it needs.
    let m = module(
        "",
        ".param .u64 out",
        &format!("\tmov.u32 %r1, 5;\n{}\tret;\n", store_r(1)),
    );
    assert_eq!(
        run_out(&m, &dims([1, 1, 1], [1, 1, 1]), 1, 1).expect("runs"),
        [5]
    );
}
