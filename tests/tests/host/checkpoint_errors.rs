//! Bad input gets a clear error naming the file (and parameter), and nothing is
//! half-loaded: a failed load leaves every rank's engine bit-identical; a failed save
//! leaves the previous checkpoint `latest` and loadable. A rank that does not call save
//! makes the others fail by the timeout. Thousands of mutated manifests and data-file
//! headers: no panic.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zero_comm::{Communicator, HostGroup};
use zero_runtime::checkpoint::format::{header_len, parse_safetensors_header};
use zero_runtime::checkpoint::resolve::StateKind;
use zero_runtime::checkpoint::CheckpointDir;
use zero_runtime::{Device, Engine, HostDevice, LoadOptions, ZeroConfig};
use zero_tests::{
    dataset, full_params, init_values, mlp_config, run_ranks, run_ranks_on, seed, train_step,
    MICRO_BATCH,
};

const WORLD: usize = 2;

fn cfg() -> String {
    mlp_config(2, "bf16", 1, 0.5, false)
}

/// Saves a checkpoint after two steps under `tag`.
fn saved(dir: &Path, tag: &str) {
    let data = dataset(3, 4 * WORLD * MICRO_BATCH);
    run_ranks(WORLD, &cfg(), 3, |e| {
        for s in 0..2 {
            train_step(e, &data, s, None).expect("step");
        }
        e.save_checkpoint(dir, Some(tag), json!({"k": 1}))
            .expect("save");
    });
}

fn fingerprint<C: Communicator, D: Device<Buffer = C::Buffer>>(
    e: &mut Engine<C, D>,
) -> (Vec<u32>, Vec<zero_runtime::StatePiece>, (u64, u64, u64)) {
    let p = full_params(e).expect("params");
    (
        p.iter().flatten().flatten().map(|x| x.to_bits()).collect(),
        e.optimizer_state().expect("state"),
        e.step_counts(),
    )
}

/// Loads `dir` (tag `tag`) on every rank of a fresh run; every rank's error message. Also
/// checks that the failed load changed nothing.
fn load_errors(dir: &Path, tag: Option<&str>, options: LoadOptions) -> Vec<String> {
    run_ranks(WORLD, &cfg(), 11, |e| {
        let before = fingerprint(e);
        let err = e
            .load_checkpoint(dir, tag, options)
            .expect_err("the load must fail")
            .to_string();
        assert!(
            fingerprint(e) == before,
            "a failed load changed the engine: {err}"
        );
        err
    })
}

fn file_of(folder: &Path, part: &str) -> PathBuf {
    std::fs::read_dir(folder)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().contains(part))
        .unwrap_or_else(|| panic!("no file with {part} in {}", folder.display()))
}

fn fresh_copy(tmp: &Path, name: &str) -> PathBuf {
    let dir = tmp.join(name);
    saved(&dir, "t");
    dir
}

#[test]
fn missing_checkpoints_and_a_dangling_latest_name_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    for e in load_errors(tmp.path(), None, LoadOptions::default()) {
        assert!(
            e.contains(&tmp.path().join("latest").display().to_string()),
            "{e}"
        );
    }
    for e in load_errors(tmp.path(), Some("nope"), LoadOptions::default()) {
        assert!(e.contains("nope/manifest.json"), "{e}");
    }
    std::fs::write(tmp.path().join("latest"), "ghost").unwrap();
    for e in load_errors(tmp.path(), None, LoadOptions::default()) {
        assert!(
            e.contains("ghost/manifest.json") && e.contains("does not exist"),
            "{e}"
        );
    }
}

#[test]
fn damaged_or_missing_data_files_are_named_and_nothing_changes() {
    let tmp = tempfile::tempdir().unwrap();
    // Truncated.
    let dir = fresh_copy(tmp.path(), "trunc");
    let f = file_of(&dir.join("t"), "rank00001-master");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let name = f.file_name().unwrap().to_string_lossy().into_owned();
    for e in load_errors(&dir, None, LoadOptions::default()) {
        assert!(e.contains(&name), "{e}");
    }
    // A flipped byte in the data.
    let dir = fresh_copy(tmp.path(), "flip");
    let f = file_of(&dir.join("t"), "rank00000-moments");
    let mut b = std::fs::read(&f).unwrap();
    let at = b.len() - 7;
    b[at] ^= 0x40;
    std::fs::write(&f, &b).unwrap();
    let name = f.file_name().unwrap().to_string_lossy().into_owned();
    for e in load_errors(&dir, None, LoadOptions::default()) {
        assert!(e.contains(&name) && e.contains("checksum"), "{e}");
    }
    // A missing rank file.
    let dir = fresh_copy(tmp.path(), "missing");
    let f = file_of(&dir.join("t"), "rank00001-moments");
    std::fs::remove_file(&f).unwrap();
    let name = f.file_name().unwrap().to_string_lossy().into_owned();
    for e in load_errors(&dir, None, LoadOptions::default()) {
        assert!(e.contains(&name) && e.contains("missing"), "{e}");
    }
    // A damaged index.
    let dir = fresh_copy(tmp.path(), "index");
    let f = file_of(&dir.join("t"), "rank00000-index");
    let mut b = std::fs::read(&f).unwrap();
    b[5] ^= 1;
    std::fs::write(&f, &b).unwrap();
    let name = f.file_name().unwrap().to_string_lossy().into_owned();
    for e in load_errors(&dir, None, LoadOptions::default()) {
        assert!(e.contains(&name) && e.contains("damaged"), "{e}");
    }
}

fn edit_manifest(dir: &Path, f: impl FnOnce(&mut Value)) {
    let path = dir.join("t").join("manifest.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn a_manifest_of_another_model_or_version_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fresh_copy(tmp.path(), "shape");
    // Another model's layer0.bias: 12 elements, in one fragment.
    edit_manifest(&dir, |v| {
        v["params"][1]["shape"] = json!([12]);
        v["params"][1]["fragments"] = json!([{"rank": 0, "offset": 0, "len": 12}]);
    });
    for e in load_errors(&dir, None, LoadOptions::default()) {
        assert!(
            e.contains("layer0.bias") && e.contains("[12]") && e.contains("[13]"),
            "{e}"
        );
    }
    let dir = fresh_copy(tmp.path(), "names");
    edit_manifest(&dir, |v| v["params"][0]["name"] = json!("encoder.weight"));
    for e in load_errors(&dir, None, LoadOptions::default()) {
        assert!(
            e.contains("layer0.weight") && e.contains("not in the checkpoint"),
            "{e}"
        );
    }
    // Not strict: the missing parameter keeps its value, the extra one is ignored.
    run_ranks(WORLD, &cfg(), 11, |e| {
        let before = full_params(e).unwrap()[0][0].clone();
        let opts = LoadOptions {
            strict: false,
            ..LoadOptions::default()
        };
        e.load_checkpoint(&dir, None, opts)
            .expect("non-strict load");
        assert_eq!(full_params(e).unwrap()[0][0], before);
    });
    let dir = fresh_copy(tmp.path(), "version");
    edit_manifest(&dir, |v| v["format_version"] = json!(99));
    for e in load_errors(&dir, None, LoadOptions::default()) {
        assert!(
            e.contains("format version 99") && e.contains("manifest.json"),
            "{e}"
        );
    }
}

#[test]
fn a_failed_save_leaves_the_previous_checkpoint_latest_and_loadable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ok");
    saved(&dir, "first");
    // A folder no one can write: the tag's folder is a file.
    std::fs::write(dir.join("second"), "in the way").unwrap();
    let data = dataset(3, 4 * WORLD * MICRO_BATCH);
    let errs = run_ranks(WORLD, &cfg(), 3, |e| {
        train_step(e, &data, 0, None).unwrap();
        e.save_checkpoint(&dir, Some("second"), json!(null))
            .unwrap_err()
            .to_string()
    });
    for e in &errs {
        assert!(e.contains(&dir.join("second").display().to_string()), "{e}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("latest")).unwrap(),
        "first"
    );
    // A read-only file system.
    let errs = run_ranks(WORLD, &cfg(), 3, |e| {
        e.save_checkpoint(Path::new("/sys/zero-ckpt-test"), None, json!(null))
            .unwrap_err()
            .to_string()
    });
    for e in &errs {
        assert!(e.contains("/sys/zero-ckpt-test"), "{e}");
    }
    // A bad tag is refused before anything is written.
    for e in run_ranks(WORLD, &cfg(), 3, |e| {
        e.save_checkpoint(&dir, Some("../escape"), json!(null))
            .unwrap_err()
            .to_string()
    }) {
        assert!(e.contains("../escape"), "{e}");
    }
    run_ranks(WORLD, &cfg(), 11, |e| {
        assert_eq!(
            e.load_checkpoint(&dir, None, LoadOptions::default())
                .unwrap(),
            json!({"k": 1})
        );
    });
}

#[test]
fn a_save_between_micro_steps_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for e in run_ranks(WORLD, &mlp_config(1, "bf16", 2, 0.0, false), 3, |e| {
        e.fetch(0).unwrap();
        e.release(0).unwrap();
        e.fetch(2).unwrap();
        e.add_grads_f32(2, &[&[0.0; 15], &[0.0; 3]]).unwrap();
        e.grads_ready(2).unwrap();
        e.save_checkpoint(tmp.path(), None, json!(null))
            .unwrap_err()
            .to_string()
    }) {
        assert!(e.contains("middle of a step"), "{e}");
    }
}

#[test]
fn a_rank_that_does_not_save_makes_the_others_fail_by_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let timeout = Duration::from_secs(2);
    let comms = HostGroup::with_timeout(3, timeout).unwrap();
    let results = run_ranks_on(
        comms,
        || HostDevice,
        &mlp_config(2, "bf16", 1, 0.0, false),
        3,
        |e| {
            let t = Instant::now();
            if e.rank() == 2 {
                std::thread::sleep(timeout + Duration::from_secs(1));
                return (String::new(), t.elapsed());
            }
            let err = e
                .save_checkpoint(tmp.path(), None, json!(null))
                .unwrap_err();
            (err.to_string(), t.elapsed())
        },
    );
    for (r, (e, took)) in results.iter().take(2).enumerate() {
        assert!(
            e.contains("every rank must call") && e.contains("tag"),
            "rank {r}: {e}"
        );
        assert!(
            *took < timeout + Duration::from_secs(3),
            "rank {r} took {took:?}"
        );
    }
    assert!(!tmp.path().join("latest").exists());
}

#[test]
fn tag_validation_fail_refuses_different_tags_on_every_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let base = mlp_config(1, "bf16", 1, 0.0, false);
    let strict = base.replacen('{', r#"{"checkpoint": {"tag_validation": "Fail"},"#, 1);
    for e in run_ranks(WORLD, &strict, 3, |e| {
        let tag = format!("mine{}", e.rank());
        e.save_checkpoint(tmp.path(), Some(&tag), json!(null))
            .unwrap_err()
            .to_string()
    }) {
        assert!(e.contains("rank 1 `mine1`") && e.contains("mine0"), "{e}");
    }
    let warn = base.replacen('{', r#"{"checkpoint": {"tag_validation": "Warn"},"#, 1);
    let tags = run_ranks(WORLD, &warn, 3, |e| {
        let tag = format!("mine{}", e.rank());
        e.save_checkpoint(tmp.path(), Some(&tag), json!(null))
            .unwrap()
    });
    assert_eq!(tags, vec!["mine0", "mine0"]);
}

/// Flips, drops or inserts a few random bytes.
fn mutate_bytes(rng: &mut ChaCha8Rng, b: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..4) {
        if b.is_empty() {
            b.push(rng.gen());
            continue;
        }
        let at = rng.gen_range(0..b.len());
        match rng.gen_range(0..4) {
            0 => b[at] ^= 1 << rng.gen_range(0..8),
            1 => {
                b.remove(at);
            }
            2 => b.insert(
                at,
                *b"{}[]\",:0-9e".get(rng.gen_range(0..12)).unwrap_or(&b'x'),
            ),
            _ => b.truncate(at),
        }
    }
}

/// Replaces a random number in the JSON with a random, often absurd, value.
fn mutate_numbers(rng: &mut ChaCha8Rng, v: &mut Value) {
    fn numbers(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Number(_) => out.push(at),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .for_each(|(i, x)| numbers(x, format!("{at}/{i}"), out)),
            Value::Object(o) => o.iter().for_each(|(k, x)| {
                numbers(
                    x,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                )
            }),
            _ => {}
        }
    }
    let mut all = Vec::new();
    numbers(v, String::new(), &mut all);
    if all.is_empty() {
        return;
    }
    let pick = all[rng.gen_range(0..all.len())].clone();
    let new = match rng.gen_range(0..6) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(u64::MAX),
        3 => json!(rng.gen_range(0..100)),
        4 => json!(1e300),
        _ => json!("text"),
    };
    if let Some(slot) = v.pointer_mut(&pick) {
        *slot = new;
    }
}

/// Opens the checkpoint and reads every parameter's state: must return, never panic.
fn read_everything(dir: &Path) -> Result<(), String> {
    let mut c = CheckpointDir::open(dir, None).map_err(|e| e.to_string())?;
    let params = c.manifest.params.clone();
    for p in &params {
        if p.trainable {
            for k in [StateKind::Master, StateKind::ExpAvg, StateKind::ExpAvgSq] {
                c.read_state(p, k, 0..p.numel(), |_, _| Ok(()))
                    .map_err(|e| e.to_string())?;
            }
        } else {
            c.read_frozen(p).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

#[test]
fn thousands_of_mutated_manifests_and_headers_never_panic() {
    let seed = seed("checkpoint fuzz");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = fresh_copy(tmp.path(), "fuzz");
    let manifest_path = dir.join("t").join("manifest.json");
    let original = std::fs::read(&manifest_path).unwrap();
    let value: Value = serde_json::from_slice(&original).unwrap();
    let (mut errors, mut loaded) = (0, 0);
    for i in 0..3000 {
        let bytes = if i % 2 == 0 {
            let mut b = original.clone();
            mutate_bytes(&mut rng, &mut b);
            b
        } else {
            let mut v = value.clone();
            for _ in 0..rng.gen_range(1..3) {
                mutate_numbers(&mut rng, &mut v);
            }
            serde_json::to_vec(&v).unwrap()
        };
        std::fs::write(&manifest_path, &bytes).unwrap();
        match std::panic::catch_unwind(|| read_everything(&dir)) {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(_)) => errors += 1,
            Err(_) => panic!("a mutated manifest panicked (seed {seed}, iteration {i})"),
        }
        // Some through the engine's load too (all-or-nothing, no panic).
        if i % 150 == 0 {
            let cfg = ZeroConfig::from_json_str(&mlp_config(1, "bf16", 1, 0.0, false), 1).unwrap();
            let comm = HostGroup::new(1).unwrap().remove(0);
            let mut e = Engine::new(
                cfg,
                zero_tests::mlp_modules(),
                comm,
                HostDevice,
                |id, _, v| init_values(5, id, v),
            )
            .unwrap();
            let _ = e.load_checkpoint(&dir, None, LoadOptions::default());
        }
    }
    println!(
        "manifests: {errors} refused, {loaded} read (mutations that changed nothing that matters)"
    );
    std::fs::write(&manifest_path, &original).unwrap();
    assert!(errors > 1000);

    // The safetensors header parser alone, on random and mutated headers; then damaged
    // headers in a real data file, which the chunk checksums must catch.
    let mut refused = 0;
    for i in 0..2000 {
        let len: usize = rng.gen_range(0..300);
        let mut b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if i % 2 == 0 {
            b = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}"#.to_vec();
            mutate_bytes(&mut rng, &mut b);
        }
        let file_len = rng.gen_range(0..400u64);
        let r = std::panic::catch_unwind(|| {
            let _ = header_len(&b[..b.len().min(8)], file_len, "fuzz");
            parse_safetensors_header(&b, file_len, "fuzz").is_err()
        });
        match r {
            Ok(true) => refused += 1,
            Ok(false) => {}
            Err(_) => panic!("a mutated header panicked (seed {seed}, iteration {i})"),
        }
    }
    println!("headers: {refused} of 2000 refused");
    let master = file_of(&dir.join("t"), "rank00000-master");
    let pristine = std::fs::read(&master).unwrap();
    for i in 0..500 {
        let mut b = pristine.clone();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let at = rng.gen_range(0..8 + n);
        b[at] ^= 1 << rng.gen_range(0..8);
        std::fs::write(&master, &b).unwrap();
        let r = std::panic::catch_unwind(|| read_everything(&dir));
        assert!(
            r.is_ok(),
            "a damaged header panicked (seed {seed}, iteration {i})"
        );
        assert!(
            r.unwrap().is_err(),
            "a damaged header was read without complaint (iteration {i})"
        );
    }
}
