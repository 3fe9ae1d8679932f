//! The parameter visitor (#11) on each backend: `#[derive(Parameters)]` names over nested
//! structs with Vec/Option/array fields, `#[graphed]` forwarding `Module::visit_params`, frozen
//! parameters and optimizers built from a module, and safetensors save/load (bitwise round
//! trip; a refused load names the tensor and changes nothing).

mod common;

use std::path::PathBuf;

use common::{on_each_backend, random};
use graphed::optim::{AdamW, AdamWConfig, Sgd, SgdConfig};
use graphed::{
    graphed, load_safetensors, ops, save_safetensors, CheckpointProblem, Cx, Device, Error, Module, OptimError, Param,
    Parameters, Result, Tensor,
};

#[derive(Parameters)]
struct Linear {
    w: Param,
    b: Option<Param>,
}

#[derive(Parameters)]
struct Pair(Param, #[param(skip)] Param);

#[derive(Parameters)]
struct Mlp {
    up: Linear,
    #[param(nested)]
    down: Linear,
}

#[derive(Parameters)]
struct Net {
    layers: Vec<Linear>,
    mlp: Mlp,
    heads: [Param; 2],
    gate: Option<Param>,
    absent: Option<Param>,
    #[param(rename = "tied")]
    pair: Pair,
    boxed: Box<Param>,
    scale: f32,
    label: String,
}

#[derive(Parameters)]
struct Wrapper<T> {
    inner: T,
    gain: Param,
}

fn param(dev: &Device, dims: &[usize], seed: u64) -> Result<Param> {
    Param::new(random(dev, dims, seed)?)
}

fn linear(dev: &Device, seed: u64, bias: bool) -> Result<Linear> {
    Ok(Linear { w: param(dev, &[3, 2], seed)?, b: if bias { Some(param(dev, &[3], seed + 1)?) } else { None } })
}

fn net(dev: &Device, seed: u64) -> Result<Net> {
    Ok(Net {
        layers: vec![linear(dev, seed, true)?, linear(dev, seed + 2, false)?],
        mlp: Mlp { up: linear(dev, seed + 4, true)?, down: linear(dev, seed + 6, true)? },
        heads: [param(dev, &[2], seed + 8)?, param(dev, &[2], seed + 9)?],
        gate: Some(param(dev, &[1], seed + 10)?),
        absent: None,
        pair: Pair(param(dev, &[4], seed + 11)?, param(dev, &[4], seed + 12)?),
        boxed: Box::new(param(dev, &[2, 2], seed + 13)?),
        scale: 1.0,
        label: "net".into(),
    })
}

const NET_NAMES: [&str; 12] = [
    "layers.0.w",
    "layers.0.b",
    "layers.1.w",
    "mlp.up.w",
    "mlp.up.b",
    "mlp.down.w",
    "mlp.down.b",
    "heads.0",
    "heads.1",
    "gate",
    "tied.0",
    "boxed",
];

fn names(p: &impl Parameters) -> Vec<String> {
    p.parameters().into_iter().map(|(n, _)| n).collect()
}

#[test]
fn the_visitor_names_every_parameter_by_its_field_path() {
    on_each_backend(|dev| {
        let n = net(dev, 1)?;
        assert_eq!(names(&n), NET_NAMES);
        // Each name refers to the right handle.
        let params = n.parameters();
        assert!(params[1].1.value.same_buffer(&n.layers[0].b.as_ref().expect("bias").value));
        assert!(params[10].1.value.same_buffer(&n.pair.0.value));
        let mut prefixed = Vec::new();
        n.mlp.visit_params("model.mlp", &mut |name, _| prefixed.push(name.to_string()));
        assert_eq!(prefixed, ["model.mlp.up.w", "model.mlp.up.b", "model.mlp.down.w", "model.mlp.down.b"]);
        let w = Wrapper { inner: vec![linear(dev, 3, false)?], gain: param(dev, &[1], 4)? };
        assert_eq!(names(&w), ["inner.0.w", "gain"]);
        assert_eq!(n.scale, 1.0);
        assert_eq!(n.label, "net");
        assert!(!params.iter().any(|(_, p)| p.value.same_buffer(&n.pair.1.value)), "a skipped field is not visited");
        Ok(())
    });
}

#[test]
fn zero_grad_trainable_params_and_frozen_parameters() {
    on_each_backend(|dev| {
        let mut n = net(dev, 1)?;
        n.heads[1] = Param::frozen(random(dev, &[2], 99)?)?;
        for (_, p) in n.parameters() {
            ops::fill_(&p.grad, 3.0)?;
        }
        n.zero_grad()?;
        for (name, p) in n.parameters() {
            assert_eq!(p.grad.to_vec()?, vec![0.0; p.grad.numel()], "{name}");
        }
        assert_eq!(n.trainable_params().len(), NET_NAMES.len() - 1);
        assert!(n.any_requires_grad());
        let frozen =
            Wrapper { inner: Param::frozen(random(dev, &[2], 1)?)?, gain: Param::frozen(random(dev, &[1], 2)?)? };
        assert!(!frozen.any_requires_grad());

        // Optimizers built from the module update the trainable parameters only.
        let before = n.heads[1].value.to_vec()?;
        let w_before = n.heads[0].value.to_vec()?;
        for (_, p) in n.parameters() {
            ops::fill_(&p.grad, 1.0)?;
        }
        let adamw = AdamW::from_module(&n, AdamWConfig::default())?;
        assert_eq!(adamw.params().len(), NET_NAMES.len() - 1);
        adamw.step()?;
        let sgd = Sgd::from_module(&n, SgdConfig::default())?;
        sgd.step()?;
        assert_eq!(n.heads[1].value.to_vec()?, before, "a frozen parameter is not updated");
        assert_ne!(n.heads[0].value.to_vec()?, w_before);
        let e = AdamW::from_module(&frozen, AdamWConfig::default()).unwrap_err();
        assert!(matches!(e, Error::Optim(OptimError::NoParams { op: "AdamW::new" })), "{e}");
        Ok(())
    });
}

/// `y = x * w`, a `#[graphed]` module that also derives `Parameters`.
#[derive(Parameters)]
struct Scale {
    w: Param,
    frozen_bias: Param,
}

#[graphed(warmup = 1)]
impl Scale {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        cx.save(x);
        ops::mul(x, &self.w.value)
    }

    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        ops::axpy_(&self.w.grad, 1.0, &ops::mul(dy, &cx.saved(0)?)?)?;
        Ok(None)
    }
}

/// A `#[graphed]` module without `Parameters`: it reports none.
struct Plain {
    w: Param,
}

#[graphed(warmup = 1)]
impl Plain {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        ops::mul(x, &self.w.value)
    }

    fn backward(&mut self, _cx: &mut Cx, _dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
}

fn module_names(m: &dyn Module) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    m.visit_params(&mut |name, p| out.push((name.to_string(), p.requires_grad())));
    out
}

#[test]
fn graphed_modules_forward_visit_params_to_their_parameters_impl() {
    on_each_backend(|dev| {
        let scale = Scale { w: param(dev, &[3], 1)?, frozen_bias: Param::frozen(random(dev, &[3], 2)?)? };
        assert_eq!(module_names(&scale), [("w".to_string(), true), ("frozen_bias".to_string(), false)]);
        let plain = Plain { w: param(dev, &[3], 1)? };
        assert_eq!(module_names(&plain), []);
        assert_eq!(plain.w.value.numel(), 3);
        // Still visible through the graphed wrapper's module.
        let g = scale.make_graphed(&Tensor::zeros(dev, &[3])?)?;
        assert_eq!(module_names(g.module()).len(), 2);
        Ok(())
    });
}

/// A unique temporary file for one test on one backend.
fn temp_file(test: &str, dev: &Device) -> PathBuf {
    let backend = if dev.is_host() { "host" } else { "cuda" };
    std::env::temp_dir().join(format!("graphed-{test}-{backend}-{}.safetensors", std::process::id()))
}

fn all_bits(p: &impl Parameters) -> Result<Vec<(String, Vec<u32>)>> {
    p.parameters().into_iter().map(|(n, p)| Ok((n, p.value.to_vec()?.iter().map(|v| v.to_bits()).collect()))).collect()
}

/// A module with an integer parameter (a frozen table of indices) beside a float one.
#[derive(Parameters)]
struct Indexed {
    w: Param,
    index: Param,
}

#[test]
fn an_i32_parameter_round_trips_exactly_and_is_put_back_after_a_failed_load() {
    on_each_backend(|dev| {
        // An integer value has no grad (as in PyTorch): a parameter of it is frozen or refused.
        let refused = Param::new(Tensor::from_i32(dev, &[1], &[1])?);
        assert!(matches!(refused, Err(Error::DType { op: "Param::new", got: graphed::DType::I32, .. })));
        // Past 2^24 an i32 that went through f32 would come back changed.
        let ints = [1, -2, (1 << 24) + 1, i32::MAX, i32::MIN];
        let saved = Indexed { w: param(dev, &[2], 3)?, index: Param::frozen(Tensor::from_i32(dev, &ints, &[5])?)? };
        let path = temp_file("i32", dev);
        save_safetensors(&saved, &path)?;
        let bytes = std::fs::read(&path).map_err(Error::msg)?;
        let file = safetensors::SafeTensors::deserialize(&bytes).map_err(Error::msg)?;
        assert_eq!(file.tensor("index").map_err(Error::msg)?.dtype(), safetensors::Dtype::I32);
        let loaded = Indexed { w: param(dev, &[2], 4)?, index: Param::frozen(Tensor::from_i32(dev, &[0; 5], &[5])?)? };
        load_safetensors(&loaded, &path)?;
        assert_eq!(loaded.index.value.to_i32_vec()?, ints);
        assert_eq!(all_bits(&loaded)?[0], all_bits(&saved)?[0]);
        // A refused load leaves the integers as they were.
        let other = Indexed { w: param(dev, &[3], 4)?, index: Param::frozen(Tensor::from_i32(dev, &[7; 5], &[5])?)? };
        assert!(
            matches!(load_safetensors(&other, &path), Err(Error::CheckpointTensorMismatch { ref tensor, .. }) if tensor == "w")
        );
        assert_eq!(other.index.value.to_i32_vec()?, [7; 5]);
        std::fs::remove_file(&path).ok();
        Ok(())
    });
}

/// A module with a bf16 and an f16 parameter.
#[derive(Parameters)]
struct Half {
    b: Param,
    h: Param,
}

#[test]
fn sixteen_bit_parameters_round_trip_their_raw_patterns() {
    use graphed::half::{bf16, f16};
    on_each_backend(|dev| {
        // A signalling NaN's payload is what a trip through f32 changes (the quiet bit is set).
        let b_bits = [0x7f81u16, 0xff80, 0x0001, 0x8000];
        let h_bits = [0x7c01u16, 0xfc00, 0x0001, 0x8000];
        let bits = |m: &Half| -> Result<(Vec<u16>, Vec<u16>)> {
            Ok((
                m.b.value.to_bf16_vec()?.iter().map(|v| v.to_bits()).collect(),
                m.h.value.to_f16_vec()?.iter().map(|v| v.to_bits()).collect(),
            ))
        };
        let make = |b: &[u16], h: &[u16]| -> Result<Half> {
            let b: Vec<bf16> = b.iter().map(|&x| bf16::from_bits(x)).collect();
            let h: Vec<f16> = h.iter().map(|&x| f16::from_bits(x)).collect();
            Ok(Half {
                b: Param::new(Tensor::from_bf16(dev, &b, &[4])?)?,
                h: Param::new(Tensor::from_f16(dev, &h, &[4])?)?,
            })
        };
        let saved = make(&b_bits, &h_bits)?;
        let path = temp_file("sixteen-bit", dev);
        save_safetensors(&saved, &path)?;
        let loaded = make(&[0; 4], &[0; 4])?;
        load_safetensors(&loaded, &path)?;
        assert_eq!(bits(&loaded)?, (b_bits.to_vec(), h_bits.to_vec()));
        std::fs::remove_file(&path).ok();
        Ok(())
    });
}

#[test]
fn safetensors_round_trip_is_bitwise() {
    on_each_backend(|dev| {
        let saved = net(dev, 1)?;
        // Values whose bits a lossy path would change.
        saved.heads[0].value.copy_from_slice(&[-0.0, f32::from_bits(1)])?;
        saved.heads[1].value.copy_from_slice(&[f32::INFINITY, f32::MIN_POSITIVE])?;
        let path = temp_file("round-trip", dev);
        save_safetensors(&saved, &path)?;
        let loaded = net(dev, 50)?;
        assert_ne!(all_bits(&loaded)?, all_bits(&saved)?);
        load_safetensors(&loaded, &path)?;
        assert_eq!(all_bits(&loaded)?, all_bits(&saved)?);
        // The file holds exactly the parameter names.
        let bytes = std::fs::read(&path).map_err(Error::msg)?;
        let file = safetensors::SafeTensors::deserialize(&bytes).map_err(Error::msg)?;
        let mut stored: Vec<&str> = file.names();
        stored.sort_unstable();
        let mut want = NET_NAMES.to_vec();
        want.sort_unstable();
        assert_eq!(stored, want);
        std::fs::remove_file(&path).ok();
        Ok(())
    });
}

#[test]
fn a_refused_load_names_the_tensor_and_changes_nothing() {
    on_each_backend(|dev| {
        let path = temp_file("refused", dev);
        let small = Wrapper { inner: linear(dev, 1, false)?, gain: param(dev, &[1], 2)? };
        save_safetensors(&small, &path)?;

        // The module has a parameter the file lacks.
        let bigger = Wrapper { inner: linear(dev, 5, true)?, gain: param(dev, &[1], 6)? };
        let before = all_bits(&bigger)?;
        let e = load_safetensors(&bigger, &path).unwrap_err();
        assert!(matches!(&e, Error::CheckpointMissingTensor { tensor, .. } if tensor == "inner.b"), "{e}");
        assert_eq!(all_bits(&bigger)?, before);

        // The file has a tensor the module lacks.
        save_safetensors(&bigger, &path)?;
        let before = all_bits(&small)?;
        let e = load_safetensors(&small, &path).unwrap_err();
        assert!(matches!(&e, Error::CheckpointUnexpectedTensor { tensor, .. } if tensor == "inner.b"), "{e}");
        assert_eq!(all_bits(&small)?, before);

        // A tensor of another shape: refused although the others (checked earlier) fit.
        let reshaped = Wrapper { inner: linear(dev, 1, true)?, gain: param(dev, &[2], 2)? };
        let before = all_bits(&reshaped)?;
        let e = load_safetensors(&reshaped, &path).unwrap_err();
        assert!(
            matches!(&e, Error::CheckpointTensorMismatch { tensor, expected, got, .. }
                if tensor == "gain" && expected.to_string() == "F32 [2]" && got.to_string() == "F32 [1]"),
            "{e}"
        );
        assert_eq!(all_bits(&reshaped)?, before);

        // A tensor of another dtype.
        let data = [0u8; 16];
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F64, vec![2], &data).map_err(Error::msg)?;
        safetensors::serialize_to_file([("gain", view)], None, &path).map_err(Error::msg)?;
        let single = Wrapper { inner: None::<Param>, gain: param(dev, &[2], 3)? };
        let before = all_bits(&single)?;
        let e = load_safetensors(&single, &path).unwrap_err();
        assert!(matches!(&e, Error::CheckpointTensorMismatch { tensor, .. } if tensor == "gain"), "{e}");
        assert_eq!(all_bits(&single)?, before);

        // Not a safetensors file at all: its first 8 bytes read as a header length past the end.
        std::fs::write(&path, b"not a safetensors file").map_err(Error::msg)?;
        let e = load_safetensors(&single, &path).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::CheckpointFormat { tensor: None, problem: CheckpointProblem::Truncated { file: 22, .. }, .. }
            ),
            "{e}"
        );
        // No file: the OS's error.
        let e = load_safetensors(&single, path.with_extension("missing")).unwrap_err();
        assert!(matches!(&e, Error::CheckpointIo { kind: std::io::ErrorKind::NotFound, .. }), "{e}");
        std::fs::remove_file(&path).ok();
        Ok(())
    });
}

/// A hand-written impl that names two parameters alike.
struct Twice(Param);

impl Parameters for Twice {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        f(prefix, &self.0);
        f(prefix, &self.0);
    }
}

#[test]
fn duplicate_names_are_refused() {
    on_each_backend(|dev| {
        let twice = Twice(param(dev, &[1], 1)?);
        let path = temp_file("twice", dev);
        let e = save_safetensors(&twice, &path).unwrap_err();
        assert!(matches!(&e, Error::DuplicateParamName { name } if name.is_empty()), "{e}");
        let e = load_safetensors(&twice, &path).unwrap_err();
        assert!(matches!(&e, Error::DuplicateParamName { .. }), "{e}");
        assert!(!path.exists());
        Ok(())
    });
}
