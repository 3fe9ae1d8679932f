//! flash_attention and its backward: against the CPU reference (causal or not, grouped
//! key/value heads, lengths that are not multiples of the tiles), finite differences of the
//! reference in f32, bitwise reproducibility (run to run and eager against replay), errors.

mod common;
mod ops_support;

use common::{backends, on_each_backend, random_vec, say_skipped};
use graphed::ops::{self, cpu, cpu::AttnDims, cpu::AttnSaved, cpu::AttnShape, Attention, AttentionEngine};
use graphed::{CaptureMode, DType, Device, Error, Graph, Result, Tensor};
use ops_support::*;

/// Relative error allowed on CUDA against the CPU reference: the kernels round `P` and `dS` to
/// the dtype as the reference does, but in another order of summation; measured on an H200
/// about 2.6e-3 (bf16) and 3.4e-4 (f16) at every size, so this leaves about 4x and 6x.
fn tol(dtype: DType) -> f64 {
    if dtype == DType::BF16 {
        1e-2
    } else {
        2e-3
    }
}

/// `‖got − want‖ / max(‖want‖, floor · sqrt(n))`: the relative error, except where the reference
/// itself is about zero (a one-token sequence has `dQ = dK = 0` up to rounding).
fn check_close(what: &str, got: &[f32], want: &[f32], tol: f64) -> Result<()> {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let num: f64 = got.iter().zip(want).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum::<f64>().sqrt();
    let den = want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt().max(1e-2 * (want.len() as f64).sqrt());
    let e = num / den;
    if e.is_nan() || e >= tol {
        return Err(Error::msg(format!("{what}: relative error {e:e} against the CPU reference (tolerance {tol:e})")));
    }
    Ok(())
}

struct Case {
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    causal: bool,
}

impl Case {
    fn shape(&self) -> AttnShape {
        let dims = AttnDims { batch: self.batch, seq: self.seq, heads: self.heads, head_dim: self.head_dim };
        AttnShape { dims, kv_heads: self.kv_heads, causal: self.causal }
    }

    fn attention(&self) -> Attention {
        let at = if self.causal { Attention::causal(self.heads) } else { Attention::full(self.heads) };
        at.kv_heads(self.kv_heads)
    }

    fn attention_on(&self, engine: AttentionEngine) -> Attention {
        self.attention().engine(engine)
    }

    /// q, k, v and dout in `dtype`, from fixed seeds.
    fn inputs(&self, dev: &Device, dtype: DType, seed: u64) -> Result<[Tensor; 4]> {
        let (q, kv) =
            ([self.batch, self.seq, self.heads * self.head_dim], [self.batch, self.seq, self.kv_heads * self.head_dim]);
        let t = |dims: &[usize], s: u64| {
            let v: Vec<f32> = random_vec(dims.iter().product(), s).into_iter().map(|x| 2.0 * x).collect();
            Tensor::from_slice_as(dev, &v, dims, dtype)
        };
        Ok([t(&q, seed)?, t(&kv, seed + 1)?, t(&kv, seed + 2)?, t(&q, seed + 3)?])
    }
}

/// The engines to test on `dev`: the host backend has one path (the reference); on CUDA the
/// portable kernels, cuDNN where it runs and the Hopper backward where it runs (else said
/// skipped, with why).
fn engines(dev: &Device) -> Result<Vec<AttentionEngine>> {
    if dev.is_host() {
        return Ok(vec![AttentionEngine::Auto]);
    }
    if std::env::var("GRAPHED_ATTENTION").is_ok_and(|v| v == "portable") {
        // scripts/gpu-validate.sh runs racecheck so: it flags cuDNN's Hopper kernels, whose
        // warps synchronise through mbarriers that racecheck does not follow.
        say_skipped("ops_flash: the cuDNN and Hopper engines are skipped: GRAPHED_ATTENTION=portable");
        return Ok(vec![AttentionEngine::Portable]);
    }
    let q = Tensor::zeros_as(dev, &[1, 64, 128], DType::BF16)?;
    let mut list = vec![AttentionEngine::Portable];
    let e = ops::attention_engines(&q, &Attention::causal(2))?;
    if e.forward == AttentionEngine::Cudnn && e.backward == AttentionEngine::Cudnn {
        list.push(AttentionEngine::Cudnn);
    } else {
        say_skipped(&format!(
            "ops_flash: the cuDNN engine is skipped on {}: it runs forward {:?} / backward {:?} here \
             (libcudnn 9.10+ on the library path runs both)",
            dev.name(),
            e.forward,
            e.backward
        ));
    }
    match ops::attention_engines(&q, &Attention::causal(2).engine(AttentionEngine::Hopper)) {
        Ok(e) if e.backward == AttentionEngine::Hopper => list.push(AttentionEngine::Hopper),
        Ok(e) => panic!("ops_flash: the Hopper engine ran its backward as {:?}", e.backward),
        Err(why) => say_skipped(&format!("ops_flash: the Hopper engine is skipped on {}: {why}", dev.name())),
    }
    Ok(list)
}

/// The cases an engine runs: cuDNN takes equal query and key/value head counts only, the Hopper
/// backward head dim 64 only.
fn cases_for(engine: AttentionEngine) -> Vec<Case> {
    cases()
        .into_iter()
        .filter(|c| engine != AttentionEngine::Cudnn || c.kv_heads == c.heads)
        .filter(|c| engine != AttentionEngine::Hopper || c.head_dim == 64)
        .collect()
}

/// Lengths 1, 63, 130 and 257 (none a multiple of the 64- or 128-row tiles, so the last tile of
/// rows and keys is partial), causal tiles entirely above the diagonal (skipped by the kernels,
/// zero in the reference), grouped key/value heads (4 query heads on 2, 4 on 1), both head
/// dimensions and both dtypes.
fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for head_dim in Attention::HEAD_DIMS {
        for causal in [true, false] {
            for &(batch, seq, heads, kv_heads) in &[(2, 1, 2, 2), (2, 63, 4, 2), (1, 257, 4, 1), (1, 130, 2, 2)] {
                v.push(Case { batch, seq, heads, kv_heads, head_dim, causal });
            }
        }
    }
    v
}

#[test]
fn flash_attention_matches_the_cpu_reference() {
    on_each_backend(|dev| {
        for engine in engines(dev)? {
            for dtype in [DType::BF16, DType::F16] {
                for (i, c) in cases_for(engine).iter().enumerate() {
                    let what = format!("flash_attention {engine:?} {dtype} {:?} causal={}", c.shape().dims, c.causal);
                    let [q, k, v, d] = c.inputs(dev, dtype, 100 * i as u64)?;
                    let at = c.attention_on(engine);
                    let ran = ops::attention_engines(&q, &at)?;
                    if engine == AttentionEngine::Cudnn {
                        assert_eq!((ran.forward, ran.backward), (engine, engine), "{what}: engines");
                    }
                    if engine == AttentionEngine::Hopper {
                        assert_eq!(ran.backward, engine, "{what}: engines");
                    }
                    let (out, lse) = ops::flash_attention(&q, &k, &v, &at)?;
                    assert_eq!(
                        (out.dtype(), lse.dtype(), lse.dims()),
                        (dtype, DType::F32, &[c.batch, c.heads, c.seq][..])
                    );
                    let (dq, dk, dv) = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &at)?;
                    assert_eq!((dq.dims(), dk.dims(), dv.dims()), (q.dims(), k.dims(), v.dims()));
                    let [qv, kv, vv, dov] = [&q, &k, &v, &d].map(|t| t.to_vec());
                    let [qv, kv, vv, dov] = [qv?, kv?, vv?, dov?];
                    let (ro, rl) = cpu::attention(&qv, &kv, &vv, c.shape(), dtype);
                    // The reference's output rounded to the dtype, as the kernel stores it.
                    let ro: Vec<f32> = ro.iter().map(|&x| dtype.round(x)).collect();
                    let (ov, lv) = (out.to_vec()?, lse.to_vec()?);
                    let saved = AttnSaved { dout: &dov, q: &qv, k: &kv, v: &vv, out: &ov, lse: &lv };
                    let (rq, rk, rv) = cpu::attention_backward(saved, c.shape(), dtype);
                    let round = |x: Vec<f32>| x.into_iter().map(|x| dtype.round(x)).collect::<Vec<f32>>();
                    let (rq, rk, rv) = (round(rq), round(rk), round(rv));
                    if dev.is_host() {
                        // The host backend runs the reference itself.
                        for (name, got, want) in [("out", &ov, &ro), ("lse", &lv, &rl)] {
                            bitwise_eq(&format!("{what} {name}"), got, want)?;
                        }
                        for (name, got, want) in [("dq", &dq, &rq), ("dk", &dk, &rk), ("dv", &dv, &rv)] {
                            bitwise_eq(&format!("{what} {name}"), &got.to_vec()?, want)?;
                        }
                    } else {
                        check_close(&format!("{what} out"), &ov, &ro, tol(dtype))?;
                        check_close(&format!("{what} lse"), &lv, &rl, 1e-5)?;
                        for (name, got, want) in [("dq", &dq, &rq), ("dk", &dk, &rk), ("dv", &dv, &rv)] {
                            check_close(&format!("{what} {name}"), &got.to_vec()?, want, tol(dtype))?;
                        }
                    }
                }
            }
        }
        Ok(())
    });
}

/// The reference the kernels are checked against is itself checked: its backward against
/// central differences of its forward, in f32, causal and not, with grouped heads.
#[test]
fn the_reference_backward_matches_finite_differences() {
    for causal in [true, false] {
        let a = AttnShape { dims: AttnDims { batch: 2, seq: 5, heads: 4, head_dim: 3 }, kv_heads: 2, causal };
        let (nq, nk) = (2 * 5 * 4 * 3, 2 * 5 * 2 * 3);
        let (qv, kv, vv, r) = (random_vec(nq, 1), random_vec(nk, 2), random_vec(nk, 3), random_vec(nq, 4));
        let (out, lse) = cpu::attention(&qv, &kv, &vv, a, DType::F32);
        let saved = AttnSaved { dout: &r, q: &qv, k: &kv, v: &vv, out: &out, lse: &lse };
        let (dq, dk, dv) = cpu::attention_backward(saved, a, DType::F32);
        let loss = |q: &[f32], k: &[f32], v: &[f32]| dot(&r, &cpu::attention(q, k, v, a, DType::F32).0);
        let what = format!("causal={causal}");
        check_fd(&format!("{what} dq"), &dq, &fd_grad(&qv, |q| loss(q, &kv, &vv))).unwrap();
        check_fd(&format!("{what} dk"), &dk, &fd_grad(&kv, |k| loss(&qv, k, &vv))).unwrap();
        check_fd(&format!("{what} dv"), &dv, &fd_grad(&vv, |v| loss(&qv, &kv, v))).unwrap();
    }
}

/// Causal attention with as many key/value heads as query heads is `causal_attention`: the
/// same function on the host (bitwise), within the dtype's rounding on CUDA.
#[test]
fn causal_flash_attention_is_causal_attention() {
    on_each_backend(|dev| {
        let c = Case { batch: 2, seq: 100, heads: 2, kv_heads: 2, head_dim: 64, causal: true };
        let [q, k, v, d] = c.inputs(dev, DType::BF16, 7)?;
        let (out, lse) = ops::flash_attention(&q, &k, &v, &Attention::causal(2))?;
        let (out2, lse2) = ops::causal_attention(&q, &k, &v, 2)?;
        let g = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &Attention::causal(2))?;
        let g2 = ops::causal_attention_backward(&d, &q, &k, &v, &out2, &lse2, 2)?;
        let pairs = [(&out, &out2), (&lse, &lse2), (&g.0, &g2.0), (&g.1, &g2.1), (&g.2, &g2.2)];
        for (i, (a, b)) in pairs.into_iter().enumerate() {
            if dev.is_host() {
                bitwise_eq(&format!("output {i}"), &a.to_vec()?, &b.to_vec()?)?;
            } else {
                check_close(&format!("output {i}"), &a.to_vec()?, &b.to_vec()?, 1.5e-2)?;
            }
        }
        Ok(())
    });
}

#[test]
fn flash_attention_is_bitwise_reproducible_and_replays_equal_to_eager() {
    on_each_backend(|dev| {
        for (engine, causal) in engines(dev)?.into_iter().flat_map(|e| [(e, true), (e, false)]) {
            // Grouped heads on the portable kernels; cuDNN takes equal head counts, the Hopper
            // backward head dim 64 (its forward is cuDNN's where cuDNN runs it).
            let kv_heads = if engine == AttentionEngine::Cudnn { 4 } else { 2 };
            let head_dim = if engine == AttentionEngine::Hopper { 64 } else { 128 };
            let c = Case { batch: 2, seq: 200, heads: 4, kv_heads, head_dim, causal };
            let [q, k, v, d] = c.inputs(dev, DType::BF16, 11)?;
            let at = c.attention_on(engine);
            let run = || -> Result<Vec<Tensor>> {
                let (out, lse) = ops::flash_attention(&q, &k, &v, &at)?;
                let (dq, dk, dv) = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &at)?;
                Ok(vec![out, lse, dq, dk, dv])
            };
            let (a, b) = (run()?, run()?);
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                bitwise_eq(&format!("{engine:?} causal={causal} run-to-run output {i}"), &x.to_vec()?, &y.to_vec()?)?;
            }
            eager_vs_replay(dev, run)?;
        }
        Ok(())
    });
}

/// q, k and v packed in one tensor (one projection's output) give the separate call's results:
/// the output and lse, and the grads packed as the input (`dq | dk | dv` in each row). The
/// portable kernels and the host reference give them bit for bit (the same kernels, reading the
/// blocks in place); cuDNN's plans for the packed strides may be other engines, so there the
/// packed call is held to the reference's tolerance and said bitwise or not. Every packed call
/// is reproducible run to run and replays equal to eager. Grouped heads on the portable path.
#[test]
fn packed_qkv_gives_the_separate_calls_results() {
    on_each_backend(|dev| {
        for engine in engines(dev)? {
            for (i, c) in cases_for(engine).iter().enumerate() {
                let dtype = DType::BF16;
                let what =
                    format!("packed {engine:?} {:?} kv_heads={} causal={}", c.shape().dims, c.kv_heads, c.causal);
                let [q, k, v, d] = c.inputs(dev, dtype, 300 + 10 * i as u64)?;
                let at = c.attention_on(engine);
                let qkv = ops::concat_columns(&[&q, &k, &v])?;
                let (out, lse) = ops::flash_attention(&q, &k, &v, &at)?;
                let (dq, dk, dv) = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &at)?;
                let want_grads = ops::concat_columns(&[&dq, &dk, &dv])?;
                let run = || -> Result<Vec<Tensor>> {
                    let (po, pl) = ops::flash_attention_packed(&qkv, &at)?;
                    let dqkv = ops::flash_attention_packed_backward(&d, &qkv, &po, &pl, &at)?;
                    Ok(vec![po, pl, dqkv])
                };
                let got = run()?;
                assert_eq!((got[0].dims(), got[2].dims()), (q.dims(), qkv.dims()), "{what}: shapes");
                let want = [out.to_vec()?, lse.to_vec()?, want_grads.to_vec()?];
                let names = ["out", "lse", "dqkv"];
                let same = got.iter().zip(&want).all(|(g, w)| g.to_vec().is_ok_and(|g| g == *w));
                // The Hopper engine's forward is cuDNN's where cuDNN runs the call.
                if engine == AttentionEngine::Cudnn || engine == AttentionEngine::Hopper {
                    for ((name, g), w) in names.iter().zip(&got).zip(&want) {
                        let t = if *name == "lse" { 1e-5 } else { tol(dtype) };
                        check_close(&format!("{what} {name}"), &g.to_vec()?, w, t)?;
                    }
                    println!(
                        "{what}: {} the separate call's bits",
                        if same { "equal to" } else { "within tolerance of" }
                    );
                } else {
                    for ((name, g), w) in names.iter().zip(&got).zip(&want) {
                        bitwise_eq(&format!("{what} {name}"), &g.to_vec()?, w)?;
                    }
                }
                let again = run()?;
                for ((name, a), b) in names.iter().zip(&got).zip(&again) {
                    bitwise_eq(&format!("{what} run-to-run {name}"), &a.to_vec()?, &b.to_vec()?)?;
                }
                eager_vs_replay(dev, run)?;
            }
        }
        Ok(())
    });
}

/// The packed call's own refusals, before any work: a width that is not `heads + 2·kv_heads`
/// blocks of a supported head dim, the wrong rank, no rows, f32, and a backward whose dout,
/// out or lse do not fit.
#[test]
fn packed_attention_refuses_bad_input_before_running() {
    on_each_backend(|dev| {
        let bf = |dims: &[usize]| Tensor::zeros_as(dev, dims, DType::BF16);
        let at = Attention::causal(2);
        let qkv = bf(&[2, 8, 384])?; // 2 heads of 64, packed
        expect_err("width", ops::flash_attention_packed(&bf(&[2, 8, 385])?, &at), is_shape)?;
        expect_err("head dim 32", ops::flash_attention_packed(&bf(&[2, 8, 192])?, &at), is_unsupported)?;
        expect_err("rank", ops::flash_attention_packed(&bf(&[16, 384])?, &at), is_shape)?;
        expect_err("empty", ops::flash_attention_packed(&bf(&[2, 0, 384])?, &at), is_shape)?;
        expect_err("kv_heads 3", ops::flash_attention_packed(&qkv, &at.kv_heads(3)), is_shape)?;
        let f = Tensor::zeros(dev, &[2, 8, 384])?;
        expect_err("f32", ops::flash_attention_packed(&f, &at), is_unsupported)?;
        let (out, lse) = ops::flash_attention_packed(&qkv, &at)?;
        assert_eq!(out.dims(), &[2, 8, 128]);
        expect_err("dout", ops::flash_attention_packed_backward(&qkv, &qkv, &out, &lse, &at), is_shape)?;
        expect_err("out", ops::flash_attention_packed_backward(&out, &qkv, &bf(&[2, 8, 64])?, &lse, &at), is_shape)?;
        let lse_bad = Tensor::zeros(dev, &[2, 2, 7])?;
        expect_err("lse", ops::flash_attention_packed_backward(&out, &qkv, &out, &lse_bad, &at), is_shape)?;
        Ok(())
    });
}

/// Head dim 64 runs narrower tiles when a call has few (batch, head) pairs: a batch large enough
/// for the large-grid tiles (9 x 1024 tokens, 8 heads: 576 blocks of 128 queries) agrees with
/// each of its sequences run alone (the small-grid tiles) within bf16 rounding, forward and
/// backward, causal or not. CUDA only: the host backend has one path, the reference (and this
/// size would take it minutes).
#[test]
fn large_and_small_grid_tiles_agree() {
    for backend in backends().iter().filter(|b| b.device.is_cuda()) {
        if let Err(e) = tiles_agree(&backend.device) {
            panic!("on {}: {e}", backend.device.name());
        }
    }
}

fn tiles_agree(dev: &Device) -> Result<()> {
    let (batch, seq, heads, d) = (9, 1024, 8, 64);
    let width = heads * d;
    let data: Vec<Vec<f32>> = (0..4).map(|i| random_vec(batch * seq * width, 70 + i)).collect();
    let tensor = |v: &[f32], b: usize| Tensor::from_slice_as(dev, v, &[b, seq, width], DType::BF16);
    for causal in [true, false] {
        let at = if causal { Attention::causal(heads) } else { Attention::full(heads) };
        // The tile sets are the portable kernels' own.
        let at = at.engine(AttentionEngine::Portable);
        let run = |ins: [&[f32]; 4], b: usize| -> Result<Vec<Vec<f32>>> {
            let [q, k, v, dout] = ins.map(|x| tensor(x, b));
            let (q, k, v, dout) = (q?, k?, v?, dout?);
            let (out, lse) = ops::flash_attention(&q, &k, &v, &at)?;
            let (dq, dk, dv) = ops::flash_attention_backward(&dout, &q, &k, &v, &out, &lse, &at)?;
            [out, dq, dk, dv].iter().map(Tensor::to_vec).collect()
        };
        let whole = run([&data[0], &data[1], &data[2], &data[3]], batch)?;
        let n = seq * width;
        for b in [0, 4, 8] {
            let one = |i: usize| &data[i][b * n..(b + 1) * n];
            let alone = run([one(0), one(1), one(2), one(3)], 1)?;
            for (i, name) in ["out", "dq", "dk", "dv"].iter().enumerate() {
                let what = format!("causal={causal} sequence {b} {name}: batch of {batch} vs alone");
                check_close(&what, &whole[i][b * n..(b + 1) * n], &alone[i], tol(DType::BF16))?;
            }
        }
    }
    Ok(())
}

/// The Hopper backward over many query tiles a key tile (a key tile of 128 waits its turn for
/// every query tile after it, in a fixed order): against the portable kernels' backward from the
/// same forward, within bf16 rounding, at lengths that are not multiples of the tiles, grouped
/// heads, causal or not, several sequences, the dQ sum in two chains and in one; and two runs
/// give the same bits. CUDA with an sm_90 GPU only (else said skipped).
#[test]
fn hopper_backward_agrees_with_the_portable_kernels_at_long_sequences() {
    let mut ran = false;
    for backend in backends().iter().filter(|b| b.device.is_cuda()) {
        let dev = &backend.device;
        if !engines(dev).is_ok_and(|e| e.contains(&AttentionEngine::Hopper)) {
            continue;
        }
        ran = true;
        let check = || -> Result<()> {
            // The first three fit in two waves of an H100's or H200's 132 multiprocessors, where
            // the runtime sums dQ in two chains; the last (8 key tiles x 16 heads x 4 = 512 work
            // items) in one.
            for (batch, seq, heads, kv_heads) in [(2, 1000, 4, 2), (1, 2048, 8, 8), (3, 333, 2, 1), (4, 1024, 16, 16)] {
                for causal in [true, false] {
                    let c = Case { batch, seq, heads, kv_heads, head_dim: 64, causal };
                    let what = format!("hopper {:?} kv_heads={kv_heads} causal={causal}", c.shape().dims);
                    let [q, k, v, d] = c.inputs(dev, DType::BF16, 900 + seq as u64)?;
                    let portable = c.attention_on(AttentionEngine::Portable);
                    let (out, lse) = ops::flash_attention(&q, &k, &v, &portable)?;
                    let want = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &portable)?;
                    let hopper = c.attention_on(AttentionEngine::Hopper);
                    let got = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &hopper)?;
                    let again = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &hopper)?;
                    for (name, g, a, w) in [
                        ("dq", &got.0, &again.0, &want.0),
                        ("dk", &got.1, &again.1, &want.1),
                        ("dv", &got.2, &again.2, &want.2),
                    ] {
                        check_close(&format!("{what} {name}"), &g.to_vec()?, &w.to_vec()?, tol(DType::BF16))?;
                        bitwise_eq(&format!("{what} {name} run-to-run"), &g.to_vec()?, &a.to_vec()?)?;
                    }
                }
            }
            Ok(())
        };
        if let Err(e) = check() {
            panic!("on {}: {e}", dev.name());
        }
    }
    if !ran {
        say_skipped("hopper_backward_agrees_with_the_portable_kernels_at_long_sequences: no sm_90 CUDA device here");
    }
}

/// `CudnnNondeterministic` (cuDNN's backward with atomics, opt-in): against the CPU reference
/// within the same tolerance, and reported as the backward's engine. No bitwise claim: its
/// `dQ` may differ between runs in the last bits. CUDA with libcudnn only.
#[test]
fn cudnn_nondeterministic_backward_matches_the_reference() {
    for backend in backends().iter().filter(|b| b.device.is_cuda()) {
        let dev = &backend.device;
        if engines(dev).map_or(true, |e| !e.contains(&AttentionEngine::Cudnn)) {
            continue; // engines() said why
        }
        let run = || -> Result<()> {
            for causal in [true, false] {
                let c = Case { batch: 2, seq: 130, heads: 2, kv_heads: 2, head_dim: 64, causal };
                let at = c.attention_on(AttentionEngine::CudnnNondeterministic);
                let [q, k, v, d] = c.inputs(dev, DType::BF16, 5)?;
                let ran = ops::attention_engines(&q, &at)?;
                assert_eq!(
                    (ran.forward, ran.backward),
                    (AttentionEngine::Cudnn, AttentionEngine::CudnnNondeterministic)
                );
                let (out, lse) = ops::flash_attention(&q, &k, &v, &at)?;
                let (dq, dk, dv) = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &at)?;
                let [qv, kv, vv, dov, ov, lv] = [&q, &k, &v, &d, &out, &lse].map(|t| t.to_vec());
                let [qv, kv, vv, dov, ov, lv] = [qv?, kv?, vv?, dov?, ov?, lv?];
                let saved = AttnSaved { dout: &dov, q: &qv, k: &kv, v: &vv, out: &ov, lse: &lv };
                let (rq, rk, rv) = cpu::attention_backward(saved, c.shape(), DType::BF16);
                for (name, got, want) in [("dq", &dq, &rq), ("dk", &dk, &rk), ("dv", &dv, &rv)] {
                    check_close(
                        &format!("nondeterministic causal={causal} {name}"),
                        &got.to_vec()?,
                        want,
                        tol(DType::BF16),
                    )?;
                }
            }
            Ok(())
        };
        if let Err(e) = run() {
            panic!("on {}: {e}", dev.name());
        }
    }
}

/// cuDNN's deterministic backward above the workspace limit runs in chunks of whole sequences
/// (two of two, four of one), and where one sequence's workspace is too much, one sequence at a
/// time in chunks of its heads, copied into packed tensors (two of four, one of two): every
/// chunking gives the same bits as the whole call, eagerly and replayed, and one head at a time
/// holds less at its peak (the chunks ran). q, k and v packed in one tensor, chunked by heads,
/// give the bits of the separate tensors chunked the same way (the same plan runs on the same
/// copies). CUDA with libcudnn only.
#[test]
fn cudnn_backward_in_chunks_equals_the_whole_call() {
    for backend in backends().iter().filter(|b| b.device.is_cuda()) {
        let dev = &backend.device;
        if engines(dev).map_or(true, |e| !e.contains(&AttentionEngine::Cudnn)) {
            continue; // engines() said why
        }
        let before = ops::attention_workspace_limit();
        let run = || -> Result<()> {
            for (batch, heads, head_dim, causal) in [(4, 2, 64, true), (4, 2, 128, false), (2, 4, 128, true)] {
                let c = Case { batch, seq: 200, heads, kv_heads: heads, head_dim, causal };
                let at = c.attention_on(AttentionEngine::Cudnn);
                let [q, k, v, d] = c.inputs(dev, DType::BF16, 21)?;
                let qkv = ops::concat_columns(&[&q, &k, &v])?;
                let (out, lse) = ops::flash_attention(&q, &k, &v, &at)?;
                let grads = || -> Result<Vec<Tensor>> {
                    let (dq, dk, dv) = ops::flash_attention_backward(&d, &q, &k, &v, &out, &lse, &at)?;
                    Ok(vec![dq, dk, dv])
                };
                let packed_grads = || -> Result<Vec<Tensor>> {
                    Ok(vec![ops::flash_attention_packed_backward(&d, &qkv, &out, &lse, &at)?])
                };
                // The most bytes a capture of the backward holds at once (its workspace with it).
                let peak = || -> Result<usize> {
                    let mut g = Graph::new(dev);
                    g.capture(CaptureMode::Global, grads)?;
                    Ok(g.pool().stats().peak_in_use)
                };
                ops::set_attention_workspace_limit(usize::MAX);
                let whole: Vec<Vec<f32>> = grads()?.iter().map(Tensor::to_vec).collect::<Result<_>>()?;
                let whole_peak = peak()?;
                // A head of 200 rows takes about 256² · 2 bytes (131 kB): at 2 heads, 600 kB
                // holds two sequences and 300 kB one; at 4 heads 600 kB holds one sequence and
                // 300 kB two of its heads; 1 byte runs one head at a time.
                for limit in [600_000, 300_000, 1] {
                    ops::set_attention_workspace_limit(limit);
                    let what = format!("batch={batch} heads={heads} d={head_dim} causal={causal} limit={limit}");
                    let chunked = grads()?;
                    for (i, (x, y)) in whole.iter().zip(&chunked).enumerate() {
                        bitwise_eq(&format!("{what} grad {i}: chunked vs whole"), x, &y.to_vec()?)?;
                    }
                    eager_vs_replay(dev, grads)?;
                    if limit == 1 {
                        let joined: Vec<&Tensor> = chunked.iter().collect();
                        let want = ops::concat_columns(&joined)?.to_vec()?;
                        let got = packed_grads()?.remove(0).to_vec()?;
                        bitwise_eq(&format!("{what}: packed vs separate, both by heads"), &want, &got)?;
                        eager_vs_replay(dev, packed_grads)?;
                        // One head at a time holds one head's dP (at least seq² · 2 bytes) where
                        // the whole call held every head's, less the eight copies of a head's
                        // columns the chunks keep.
                        let copies = 8 * 200 * head_dim * 2;
                        let fewer = (batch * heads - 1) * 200 * 200 * 2 - copies;
                        let chunked_peak = peak()?;
                        if chunked_peak + fewer > whole_peak {
                            return Err(Error::msg(format!(
                                "{what}: one head at a time peaked at {chunked_peak} bytes, the whole \
                                 call at {whole_peak}: not {fewer} fewer"
                            )));
                        }
                    }
                }
            }
            Ok(())
        };
        let r = run();
        ops::set_attention_workspace_limit(before);
        if let Err(e) = r {
            panic!("on {}: {e}", dev.name());
        }
    }
}

fn is_unsupported(e: &Error) -> bool {
    matches!(e, Error::AttentionUnsupported { .. })
}

#[test]
fn flash_attention_refuses_bad_input_before_running() {
    on_each_backend(|dev| {
        let bf = |dims: &[usize]| Tensor::zeros_as(dev, dims, DType::BF16);
        let x = bf(&[2, 8, 128])?;
        let at = Attention::causal(2);
        // Head dims and dtypes the kernels are not built for.
        expect_err("head_dim 32", ops::flash_attention(&x, &x, &x, &Attention::causal(4)), is_unsupported)?;
        let f = Tensor::zeros(dev, &[2, 8, 128])?;
        expect_err("f32", ops::flash_attention(&f, &f, &f, &at), is_unsupported)?;
        expect_err("dtype mix", ops::flash_attention(&x, &f, &f, &at), |e| matches!(e, Error::DTypeMismatch { .. }))?;
        // K/V heads that do not divide the query heads, or K/V of the wrong width.
        expect_err("kv_heads 3", ops::flash_attention(&x, &x, &x, &at.kv_heads(3)), is_shape)?;
        expect_err("kv_heads 0", ops::flash_attention(&x, &x, &x, &at.kv_heads(0)), is_shape)?;
        let narrow = bf(&[2, 8, 64])?;
        expect_err("k width", ops::flash_attention(&x, &narrow, &narrow, &at), is_shape)?;
        expect_err("v shape", ops::flash_attention(&x, &x, &narrow, &at), is_shape)?;
        expect_err("seq", ops::flash_attention(&x, &bf(&[2, 7, 128])?, &bf(&[2, 7, 128])?, &at), is_shape)?;
        expect_err("rank", ops::flash_attention(&bf(&[16, 128])?, &x, &x, &at), is_shape)?;
        expect_err("empty", ops::flash_attention(&bf(&[2, 0, 128])?, &x, &x, &at), is_shape)?;
        if dev.is_cuda() {
            // cuDNN's graphs take equal query and key/value head counts: asked for it with
            // grouped heads (or where libcudnn is missing), the call is refused, not rerouted.
            let gqa = at.kv_heads(1).engine(AttentionEngine::Cudnn);
            expect_err("cuDNN, grouped heads", ops::flash_attention(&x, &narrow, &narrow, &gqa), is_unsupported)?;
        }
        // The backward's own arguments.
        let (out, lse) = ops::flash_attention(&x, &x, &x, &at)?;
        expect_err("dout", ops::flash_attention_backward(&narrow, &x, &x, &x, &out, &lse, &at), is_shape)?;
        let lse_bad = Tensor::zeros(dev, &[2, 2, 7])?;
        expect_err("lse", ops::flash_attention_backward(&x, &x, &x, &x, &out, &lse_bad, &at), is_shape)?;
        expect_err("lse dtype", ops::flash_attention_backward(&x, &x, &x, &x, &out, &bf(&[2, 2, 8])?, &at), |e| {
            matches!(e, Error::DType { .. })
        })?;
        Ok(())
    });
}
