//! The safetensors loader over malformed files: a few thousand deterministic mutations of a
//! real file (truncations, byte flips in the header and its length, header entries with
//! changed dtypes, shapes and offsets, missing or extra fields and tensors, bytes added to or
//! cut from the data). Every load must end in a typed error that names the file (and the
//! tensor, when the problem is one tensor's) and leaves the module unchanged, or load a file
//! that is still valid; none may panic.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use common::{backends, random};
use graphed::{load_safetensors, save_safetensors, CheckpointProblem, DType, Device, Error, Param, Parameters, Result};
use serde_json::{json, Map, Value};

/// A module with an f32 matrix, an f32 vector and a bf16 vector.
#[derive(Parameters)]
struct Model {
    w: Param,
    b: Param,
    h: Param,
}

fn model(dev: &Device, seed: u64) -> Result<Model> {
    Ok(Model {
        w: Param::new(random(dev, &[3, 4], seed)?)?,
        b: Param::new(random(dev, &[4], seed + 1)?)?,
        h: Param::new(random(dev, &[5], seed + 2)?.to_dtype(DType::BF16)?)?,
    })
}

fn bits(m: &Model) -> Result<Vec<Vec<u32>>> {
    m.parameters().iter().map(|(_, p)| Ok(p.value.to_vec()?.iter().map(|v| v.to_bits()).collect())).collect()
}

/// xorshift64*: deterministic, seeded.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The file split into its header (as JSON) and its data.
fn split(file: &[u8]) -> (Map<String, Value>, Vec<u8>) {
    let n = u64::from_le_bytes(file[..8].try_into().expect("8 bytes")) as usize;
    let header = serde_json::from_slice(&file[8..8 + n]).expect("the saved header is JSON");
    (header, file[8 + n..].to_vec())
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    let text = serde_json::to_vec(header).expect("JSON");
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(data);
    out
}

/// Values a header field may be replaced with.
fn odd_value(rng: &mut Rng) -> Value {
    match rng.below(12) {
        0 => json!(null),
        1 => json!(-1),
        2 => json!(1.5),
        3 => json!("F32"),
        4 => json!("Q7"),
        5 => json!([]),
        6 => json!([1u64 << 40, 1u64 << 40]),
        7 => json!([u64::MAX, 2]),
        8 => json!({}),
        9 => json!([0, 0]),
        10 => json!(["a", 1]),
        _ => json!(rng.next() % 64),
    }
}

/// One structured mutation of the header (and sometimes the data).
fn mutate_header(header: &Map<String, Value>, data: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut h = header.clone();
    let mut data = data.to_vec();
    let names: Vec<String> = h.keys().filter(|k| *k != "__metadata__").cloned().collect();
    if names.is_empty() {
        return join(&Value::Object(h), &data);
    }
    let name = names[rng.below(names.len())].clone();
    if !h[&name].is_object() {
        h[&name] = json!({});
    }
    let fields = ["dtype", "shape", "data_offsets"];
    match rng.below(10) {
        // A field replaced by something odd.
        0 | 1 => {
            let f = fields[rng.below(3)];
            h[&name][f] = odd_value(rng);
        }
        // A field removed.
        2 => {
            let f = fields[rng.below(3)];
            h[&name].as_object_mut().map(|o| o.remove(f));
        }
        // One dimension changed, added or removed.
        3 => {
            if !h[&name]["shape"].is_array() {
                h[&name]["shape"] = json!([]);
            }
            let shape = h[&name]["shape"].as_array_mut().expect("made an array above");
            match rng.below(3) {
                0 if !shape.is_empty() => {
                    let i = rng.below(shape.len());
                    shape[i] = json!(rng.next() % 9);
                }
                1 => shape.push(json!(1 + rng.next() % 3)),
                _ => {
                    shape.pop();
                }
            }
        }
        // Offsets moved.
        4 => {
            if let Some(o) = h[&name]["data_offsets"].as_array_mut().filter(|o| !o.is_empty()) {
                let i = rng.below(o.len());
                let v = o[i].as_u64().unwrap_or(0);
                o[i] = json!(v.wrapping_add(rng.next() % 9).wrapping_sub(4));
            }
        }
        // Another dtype of the list (some sizes match, some do not).
        5 => {
            let dtypes = ["F16", "BF16", "F32", "F64", "I8", "U8", "BOOL", "F4", "F8_E4M3", "C64", "I64", "U16"];
            h[&name]["dtype"] = json!(dtypes[rng.below(dtypes.len())]);
        }
        // A tensor removed, renamed or added.
        6 => {
            let entry = h.remove(&name).expect("an entry");
            match rng.below(3) {
                0 => {}
                1 => {
                    h.insert(format!("{name}x"), entry);
                }
                _ => {
                    h.insert(name, entry.clone());
                    h.insert("extra".into(), entry);
                }
            }
        }
        // Metadata of the wrong kind, or an entry that is not an object.
        7 => {
            if rng.below(2) == 0 {
                h.insert("__metadata__".into(), odd_value(rng));
            } else {
                h.insert(name, odd_value(rng));
            }
        }
        // Bytes added to or cut from the data.
        8 => {
            if rng.below(2) == 0 || data.is_empty() {
                data.extend((0..1 + rng.below(8)).map(|_| rng.next() as u8));
            } else {
                let keep = rng.below(data.len());
                data.truncate(keep);
            }
        }
        // Two mutations at once.
        _ => {
            let once = mutate_header(header, &data, rng);
            let (h2, d2) = split_lenient(&once).unwrap_or((h.clone(), data.clone()));
            return mutate_header(&h2, &d2, rng);
        }
    }
    join(&Value::Object(h), &data)
}

/// `split` for a file that may not parse.
fn split_lenient(file: &[u8]) -> Option<(Map<String, Value>, Vec<u8>)> {
    let n = u64::from_le_bytes(file.get(..8)?.try_into().ok()?) as usize;
    let header = serde_json::from_slice(file.get(8..8usize.checked_add(n)?)?).ok()?;
    Some((header, file[8 + n..].to_vec()))
}

/// Every input the fuzz loads: truncations, byte flips, length prefixes, header mutations.
fn inputs(file: &[u8], seed: u64, header_mutations: usize, flips: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(seed);
    let mut out: Vec<Vec<u8>> = (0..file.len()).map(|n| file[..n].to_vec()).collect();
    let header_len = u64::from_le_bytes(file[..8].try_into().expect("8 bytes")) as usize;
    for _ in 0..flips {
        let mut f = file.to_vec();
        let i = rng.below(8 + header_len);
        f[i] = match rng.below(3) {
            0 => f[i] ^ (1 << rng.below(8)),
            1 => b"{}[]\",:0-9eE "[rng.below(13)],
            _ => rng.next() as u8,
        };
        out.push(f);
    }
    for delta in [-9i64, -1, 1, 7, 1 << 20, i64::MAX] {
        let mut f = file.to_vec();
        f[..8].copy_from_slice(&(header_len as i64).wrapping_add(delta).to_le_bytes());
        out.push(f);
    }
    let (header, data) = split(file);
    out.extend((0..header_mutations).map(|_| mutate_header(&header, &data, &mut rng)));
    out
}

/// Loads `bytes` as a file into `m`: a typed error that names what it should, with `m`
/// unchanged, or a successful load (the mutation kept the file valid). The failure, if any.
fn check_one(m: &Model, path: &Path, bytes: &[u8], before: &[Vec<u32>]) -> std::result::Result<bool, String> {
    std::fs::write(path, bytes).map_err(|e| e.to_string())?;
    let loaded = catch_unwind(AssertUnwindSafe(|| load_safetensors(m, path))).map_err(|_| "panicked".to_string())?;
    let e = match loaded {
        Ok(()) => return Ok(true),
        Err(e) => e,
    };
    let named = |tensor: &Option<String>, problem: &CheckpointProblem| match problem {
        CheckpointProblem::Field { .. }
        | CheckpointProblem::UnknownDType { .. }
        | CheckpointProblem::SizeMismatch { .. }
        | CheckpointProblem::Offsets { .. } => tensor.is_some(),
        _ => true,
    };
    let file = path.display().to_string();
    let ok = match &e {
        Error::CheckpointFormat { path, tensor, problem } => *path == file && named(tensor, problem),
        Error::CheckpointMissingTensor { path, .. }
        | Error::CheckpointUnexpectedTensor { path, .. }
        | Error::CheckpointTensorMismatch { path, .. } => *path == file,
        _ => false,
    };
    if !ok {
        return Err(format!("untyped or unnamed error: {e:?}"));
    }
    if bits(m).map_err(|e| e.to_string())? != before {
        return Err(format!("the module changed: {e}"));
    }
    Ok(false)
}

fn temp(name: &str, dev: &Device) -> PathBuf {
    let backend = if dev.is_host() { "host" } else { "cuda" };
    std::env::temp_dir().join(format!("graphed-fuzz-{name}-{backend}-{}.safetensors", std::process::id()))
}

#[test]
fn malformed_files_are_typed_errors_that_change_nothing() {
    for b in backends() {
        let dev = &b.device;
        // The GPU half loads fewer inputs: the parsing is the same, only the copies differ.
        let (header_mutations, flips) = if dev.is_host() { (1500, 1000) } else { (300, 200) };
        let (source, target) = (temp("source", dev), temp("input", dev));
        let m = model(dev, 1).expect("model");
        save_safetensors(&model(dev, 7).expect("model"), &source).expect("save");
        let file = std::fs::read(&source).expect("read");
        let before = bits(&m).expect("bits");
        let (mut loaded, mut refused, mut failures) = (0, 0, Vec::new());
        let all = inputs(&file, 0x5eed_cafe, header_mutations, flips);
        for (i, bytes) in all.iter().enumerate() {
            match check_one(&m, &target, bytes, &before) {
                Ok(true) => {
                    loaded += 1;
                    load_safetensors(&m, &source).expect("reload");
                    for (p, q) in m.parameters().iter().zip(model(dev, 1).expect("model").parameters()) {
                        p.1.value.copy_(&q.1.value).expect("restore");
                    }
                }
                Ok(false) => refused += 1,
                Err(why) => failures.push(format!("input {i} ({} bytes): {why}", bytes.len())),
            }
        }
        std::fs::remove_file(&source).ok();
        std::fs::remove_file(&target).ok();
        println!(
            "loader fuzz on {}: {} inputs ({} truncations, {flips} byte flips, 6 length prefixes, {header_mutations} header mutations): {refused} refused with a typed error, {loaded} still valid and loaded, {} failures",
            dev.name(),
            all.len(),
            file.len(),
            failures.len()
        );
        assert!(failures.is_empty(), "on {}:\n{}", dev.name(), failures.join("\n"));
    }
}

/// A path that is not a regular file is refused before it is read: a directory, and a device
/// that never ends (/dev/zero, which `std::fs::read` would read until memory ran out).
#[test]
fn a_directory_or_a_device_is_refused_without_reading_it() {
    for b in backends() {
        let dev = &b.device;
        let m = model(dev, 1).expect("model");
        let before = bits(&m).expect("bits");
        let dir = std::env::temp_dir();
        let mut paths = vec![dir.as_path()];
        let zero = Path::new("/dev/zero");
        if zero.exists() {
            paths.push(zero);
        } else {
            println!("note: /dev/zero is not here; only the directory is checked");
        }
        for path in paths {
            let e = load_safetensors(&m, path).unwrap_err();
            let file = path.display().to_string();
            assert!(
                matches!(&e, Error::CheckpointIo { path, kind: std::io::ErrorKind::InvalidInput, .. } if *path == file),
                "{}: {e:?}",
                path.display()
            );
            assert!(e.to_string().contains("regular file"), "{e}");
            assert_eq!(bits(&m).expect("bits"), before);
        }
    }
}

#[test]
fn a_shape_that_does_not_match_its_bytes_names_the_tensor_and_the_file() {
    for b in backends() {
        let dev = &b.device;
        let path = temp("shape", dev);
        let m = model(dev, 1).expect("model");
        save_safetensors(&m, &path).expect("save");
        let (mut header, data) = split(&std::fs::read(&path).expect("read"));
        // [3, 4] -> [3, 5]: 60 bytes for 48.
        header["w"]["shape"] = json!([3, 5]);
        std::fs::write(&path, join(&Value::Object(header.clone()), &data)).expect("write");
        let before = bits(&m).expect("bits");
        let e = load_safetensors(&m, &path).unwrap_err();
        let file = path.display().to_string();
        assert!(
            matches!(&e, Error::CheckpointFormat { path, tensor: Some(t), problem: CheckpointProblem::SizeMismatch { bytes: 48, .. } } if *t == "w" && *path == file),
            "{e:?}"
        );
        assert!(e.to_string().contains("tensor `w`") && e.to_string().contains(&file), "{e}");
        // Same element count, another shape: the loader's own check names it too.
        header["w"]["shape"] = json!([4, 3]);
        std::fs::write(&path, join(&Value::Object(header), &data)).expect("write");
        let e = load_safetensors(&m, &path).unwrap_err();
        assert!(matches!(&e, Error::CheckpointTensorMismatch { tensor, .. } if tensor == "w"), "{e:?}");
        assert_eq!(bits(&m).expect("bits"), before);
        std::fs::remove_file(&path).ok();
    }
}
