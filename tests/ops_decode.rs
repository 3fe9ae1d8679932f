//! Decoding with a KV cache: decode_attention against the CPU reference (every float dtype, the
//! head dims built for and others, grouped key/value heads, lengths across the split boundary,
//! empty sequences), kv_cache_fill writing a prompt as the reference does, one
//! captured graph serving every length, bitwise reproducibility, kv_cache_append against the
//! reference, decode_attention_append bitwise the append then the attention (eager and
//! captured), and the errors: bad shapes and dtypes before anything runs, bad lengths and full
//! caches reported from the device.

mod common;
mod ops_support;

use common::{on_each_backend, random_vec};
use graphed::ops::{self, cpu, cpu::CacheShape};
use graphed::{CaptureMode, DType, Device, Error, Graph, Result, Tensor};
use ops_support::*;

/// Relative error allowed on CUDA against the reference: the output rounds to the dtype (half
/// an ulp: 2^-9 for bf16, 2^-12 for f16) and f32 sums differ from f64 far below that.
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
        _ => 1e-5,
    }
}

fn check_close(what: &str, got: &[f32], want: &[f32], tol: f64) -> Result<()> {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let num: f64 = got.iter().zip(want).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum::<f64>().sqrt();
    let den = want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt().max(1e-6);
    let e = num / den;
    if e.is_nan() || e >= tol {
        return Err(Error::msg(format!("{what}: relative error {e:e} against the CPU reference (tolerance {tol:e})")));
    }
    Ok(())
}

/// q, k_cache and v_cache of `s` in `dtype`, from fixed seeds (values in [-2, 2)).
fn inputs(dev: &Device, s: CacheShape, dtype: DType, seed: u64) -> Result<[Tensor; 3]> {
    let t = |dims: &[usize], seed: u64| {
        let v: Vec<f32> = random_vec(dims.iter().product(), seed).into_iter().map(|x| 2.0 * x).collect();
        Tensor::from_slice_as(dev, &v, dims, dtype)
    };
    Ok([t(&s.query_dims(), seed)?, t(&s.cache_dims(), seed + 1)?, t(&s.cache_dims(), seed + 2)?])
}

/// The reference's output for the tensors' values, rounded to the dtype as the op stores it.
fn reference(q: &Tensor, kc: &Tensor, vc: &Tensor, lengths: &[i32], s: CacheShape) -> Result<Vec<f32>> {
    let (out, bad) = cpu::decode_attention(&q.to_vec()?, &kc.to_vec()?, &vc.to_vec()?, lengths, s);
    assert!(bad.is_none(), "the test's lengths are valid");
    Ok(out.into_iter().map(|x| q.dtype().round(x)).collect())
}

fn compare(dev: &Device, what: &str, got: &[f32], want: &[f32], dtype: DType) -> Result<()> {
    if dev.is_host() {
        bitwise_eq(what, got, want)
    } else {
        check_close(what, got, want, tol(dtype))
    }
}

/// (batch, heads, kv_heads, max_len, lengths): lengths 1, 63, 0 (an empty slot), 257 and 300
/// (past the first 256-key split), max_len 1000 with a full cache (4 splits), grouped heads
/// (4 query heads on 2 and on 1); head dims 64 and 128 (built for in 16 bits) and 8, 24 and 96
/// (read at run time).
fn cases() -> Vec<(CacheShape, Vec<i32>)> {
    let mut v = Vec::new();
    for head_dim in [64, 128, 8, 24, 96] {
        let shape = |batch, heads, kv_heads, max_len| CacheShape { batch, heads, kv_heads, max_len, head_dim };
        v.push((shape(4, 4, 2, 300), vec![1, 63, 0, 257]));
        v.push((shape(2, 4, 1, 300), vec![300, 5]));
        v.push((shape(2, 2, 2, 1000), vec![1000, 999]));
    }
    v
}

#[test]
fn decode_attention_matches_the_cpu_reference() {
    on_each_backend(|dev| {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for (i, (s, lens)) in cases().into_iter().enumerate() {
                let what = format!("decode_attention {dtype} {s:?} lengths {lens:?}");
                let [q, kc, vc] = inputs(dev, s, dtype, 10 * i as u64)?;
                let lengths = Tensor::from_i32(dev, &lens, &[s.batch])?;
                let out = ops::decode_attention(&q, &kc, &vc, &lengths)?;
                assert_eq!((out.dtype(), out.dims()), (dtype, &s.query_dims()[..]));
                let got = out.to_vec()?;
                compare(dev, &what, &got, &reference(&q, &kc, &vc, &lens, s)?, dtype)?;
                // An empty sequence attends to nothing: zeros.
                for (b, _) in lens.iter().enumerate().filter(|&(_, &l)| l == 0) {
                    let row = s.heads * s.head_dim;
                    assert!(got[b * row..(b + 1) * row].iter().all(|&x| x == 0.0), "{what}: sequence {b}");
                }
            }
        }
        Ok(())
    });
}

/// The lengths are read on the device: one graph, captured once, replays for every length the
/// tensor is given afterwards, and each replay equals the eager call bitwise.
#[test]
fn one_captured_graph_serves_every_length() {
    on_each_backend(|dev| {
        let s = CacheShape { batch: 2, heads: 4, kv_heads: 2, max_len: 600, head_dim: 128 };
        let [q, kc, vc] = inputs(dev, s, DType::BF16, 5)?;
        let lengths = Tensor::from_i32(dev, &[1, 1], &[2])?;
        let mut g = Graph::new(dev);
        let out = g.capture(CaptureMode::Global, || ops::decode_attention(&q, &kc, &vc, &lengths))?;
        for lens in [[1, 600], [255, 256], [257, 0], [512, 513], [600, 3]] {
            lengths.copy_from_i32(&lens)?;
            g.replay()?;
            let replayed = out.to_vec()?;
            let eager = ops::decode_attention(&q, &kc, &vc, &lengths)?.to_vec()?;
            bitwise_eq(&format!("lengths {lens:?}: replay vs eager"), &replayed, &eager)?;
            compare(dev, &format!("lengths {lens:?}"), &replayed, &reference(&q, &kc, &vc, &lens, s)?, DType::BF16)?;
        }
        Ok(())
    });
}

#[test]
fn decode_attention_is_bitwise_reproducible() {
    on_each_backend(|dev| {
        let s = CacheShape { batch: 3, heads: 8, kv_heads: 2, max_len: 2048, head_dim: 64 };
        let [q, kc, vc] = inputs(dev, s, DType::F16, 21)?;
        let lengths = Tensor::from_i32(dev, &[2048, 1500, 77], &[3])?;
        let a = ops::decode_attention(&q, &kc, &vc, &lengths)?.to_vec()?;
        let b = ops::decode_attention(&q, &kc, &vc, &lengths)?.to_vec()?;
        bitwise_eq("run to run", &a, &b)?;
        eager_vs_replay(dev, || Ok(vec![ops::decode_attention(&q, &kc, &vc, &lengths)?]))
    });
}

/// A length below 0 or above max_len reads nothing: the sequence gets zeros (on CUDA, where
/// the output survives) and the call is `CacheLengthOutOfRange` naming the first such
/// sequence; afterwards the device works on (the error word is cleared).
#[test]
fn a_bad_length_reads_nothing_and_is_reported() {
    on_each_backend(|dev| {
        let s = CacheShape { batch: 3, heads: 2, kv_heads: 2, max_len: 16, head_dim: 64 };
        let [q, kc, vc] = inputs(dev, s, DType::BF16, 3)?;
        for (bad_seq, lens) in [(1usize, [4, -1, 17]), (2, [16, 16, 17])] {
            let lengths = Tensor::from_i32(dev, &lens, &[3])?;
            let is_bad = |e: &Error| {
                matches!(e, Error::CacheLengthOutOfRange { op: "decode_attention", sequence, length, max_len: 16 }
                    if *sequence == bad_seq && *length == lens[bad_seq] as i64)
            };
            let reported = match ops::decode_attention(&q, &kc, &vc, &lengths) {
                // CUDA: the kernel reports through the error word, the next read returns it.
                Ok(out) => {
                    assert!(!dev.is_host(), "the host backend returns the error from the call");
                    let err = out.to_vec().map(|_| ());
                    expect_err("the read after a bad length", err, is_bad)?;
                    // The output was written: zeros for the bad sequences, the reference for the rest.
                    let got = out.to_vec()?;
                    let row = s.heads * s.head_dim;
                    for (b, &l) in lens.iter().enumerate() {
                        if !(0..=16).contains(&l) {
                            assert!(got[b * row..(b + 1) * row].iter().all(|&x| x == 0.0), "sequence {b}");
                        }
                    }
                    true
                }
                Err(e) => is_bad(e.root()),
            };
            assert!(reported, "lengths {lens:?}");
            // The device works on, and a good call reports nothing.
            lengths.copy_from_i32(&[4, 5, 6])?;
            ops::decode_attention(&q, &kc, &vc, &lengths)?.to_vec()?;
        }
        Ok(())
    });
}

/// Steps appended one at a time, with ragged lengths, build the cache the reference builds,
/// and the lengths count up on the device.
#[test]
fn kv_cache_append_matches_the_reference() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let s = CacheShape { batch: 3, heads: 2, kv_heads: 2, max_len: 5, head_dim: 40 };
            let zeros = vec![0.0f32; s.cache_dims().iter().product()];
            let (kc, vc) = (
                Tensor::from_slice_as(dev, &zeros, &s.cache_dims(), dtype)?,
                Tensor::zeros_as(dev, &s.cache_dims(), dtype)?,
            );
            let start = [0, 2, 4];
            let lengths = Tensor::from_i32(dev, &start, &[3])?;
            let (mut rk, mut rv, mut rl) = (zeros.clone(), zeros.clone(), start.to_vec());
            for step in 0..3u64 {
                let n: usize = s.step_dims().iter().product();
                let kv: Vec<f32> = random_vec(n, 50 + step).iter().map(|x| dtype.round(*x)).collect();
                let vv: Vec<f32> = random_vec(n, 60 + step).iter().map(|x| dtype.round(*x)).collect();
                let (k, v) = (
                    Tensor::from_slice_as(dev, &kv, &s.step_dims(), dtype)?,
                    Tensor::from_slice_as(dev, &vv, &s.step_dims(), dtype)?,
                );
                let bad = cpu::kv_cache_append(&mut rk, &mut rv, &mut rl, &kv, &vv, s);
                let got = ops::kv_cache_append(&kc, &vc, &lengths, &k, &v).and_then(|()| lengths.to_i32_vec());
                match bad {
                    None => assert_eq!(got?, rl, "{dtype} step {step}"),
                    Some((b, _)) => {
                        // Sequence 2 starts at 4 of 5: full after the first step.
                        assert_eq!(b, 2);
                        expect_err("a full cache", got, |e| {
                            matches!(e, Error::CacheFull { op: "kv_cache_append", sequence: 2, max_len: 5 })
                        })?;
                        assert_eq!(lengths.to_i32_vec()?, rl, "{dtype} step {step}: the others were appended");
                    }
                }
                bitwise_eq(&format!("{dtype} step {step} k_cache"), &kc.to_vec()?, &rk)?;
                bitwise_eq(&format!("{dtype} step {step} v_cache"), &vc.to_vec()?, &rv)?;
            }
            assert_eq!(lengths.to_i32_vec()?, vec![3, 5, 5]);
        }
        Ok(())
    });
}

/// Append and attend captured once; each replay is one decoding step at the next position, and
/// its output is the reference's for the cache so far.
#[test]
fn a_captured_decode_step_advances_on_every_replay() {
    on_each_backend(|dev| {
        let s = CacheShape { batch: 2, heads: 4, kv_heads: 1, max_len: 8, head_dim: 64 };
        let dtype = DType::BF16;
        let [q, kc, vc] = inputs(dev, s, dtype, 9)?;
        let lengths = Tensor::from_i32(dev, &[0, 3], &[2])?;
        let n: usize = s.step_dims().iter().product();
        let k = Tensor::from_slice_as(dev, &random_vec(n, 1), &s.step_dims(), dtype)?;
        let v = Tensor::from_slice_as(dev, &random_vec(n, 2), &s.step_dims(), dtype)?;
        let mut g = Graph::new(dev);
        let out = g.capture(CaptureMode::Global, || {
            ops::kv_cache_append(&kc, &vc, &lengths, &k, &v)?;
            ops::decode_attention(&q, &kc, &vc, &lengths)
        })?;
        for step in 1..=5 {
            g.replay()?;
            let lens = lengths.to_i32_vec()?;
            assert_eq!(lens, vec![step, 3 + step]);
            let want = reference(&q, &kc, &vc, &lens, s)?;
            compare(dev, &format!("step {step}"), &out.to_vec()?, &want, dtype)?;
        }
        // Sequence 1 is now full (8 of 8): the next step reports it and leaves it unchanged.
        let full = |e: &Error| matches!(e, Error::CacheFull { sequence: 1, max_len: 8, .. });
        expect_err("a full cache during replay", g.replay().and_then(|()| lengths.to_i32_vec()), full)?;
        assert_eq!(lengths.to_i32_vec()?, vec![6, 8]);
        Ok(())
    });
}

/// A decode step's q/k/v rows (`[batch, (heads + 2 kv_heads) · head_dim]`, values rounded to
/// `dtype`) and the three parts the unfused ops take.
fn step_rows(s: CacheShape, dtype: DType, seed: u64) -> (Vec<f32>, [Vec<f32>; 3]) {
    let (qw, kw) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let rows: Vec<f32> = random_vec(s.batch * (qw + 2 * kw), seed).into_iter().map(|x| dtype.round(2.0 * x)).collect();
    let mut parts = [Vec::new(), Vec::new(), Vec::new()];
    for row in rows.chunks(qw + 2 * kw) {
        parts[0].extend_from_slice(&row[..qw]);
        parts[1].extend_from_slice(&row[qw..qw + kw]);
        parts[2].extend_from_slice(&row[qw + kw..]);
    }
    (rows, parts)
}

/// A cache of `s` holding `cache` (both k and v), its lengths `lens`.
fn cache_of(dev: &Device, s: CacheShape, dtype: DType, cache: &[f32], lens: &[i32]) -> Result<[Tensor; 3]> {
    Ok([
        Tensor::from_slice_as(dev, cache, &s.cache_dims(), dtype)?,
        Tensor::from_slice_as(dev, &cache.iter().map(|x| -x).collect::<Vec<_>>(), &s.cache_dims(), dtype)?,
        Tensor::from_i32(dev, lens, &[s.batch])?,
    ])
}

/// `decode_attention_append` is `kv_cache_append` then `decode_attention`, bit for bit on both
/// backends (output, caches, lengths), step after step: one-pass shapes (a cache of one split,
/// at most 8 heads, 16-bit at head dim 64 or 128), two-pass ones (two and four splits, more
/// heads, grouped heads) and run-time head dims, lengths 0, ragged and one below full; and it
/// matches the CPU reference.
#[test]
fn decode_attention_append_is_the_append_then_the_attention_bitwise() {
    on_each_backend(|dev| {
        let shape =
            |batch, heads, kv_heads, max_len, head_dim| CacheShape { batch, heads, kv_heads, max_len, head_dim };
        let cases = [
            (shape(3, 8, 2, 256, 64), vec![0, 17, 250]),
            (shape(2, 4, 4, 40, 128), vec![37, 3]),
            (shape(2, 16, 4, 256, 64), vec![5, 200]),
            (shape(2, 4, 1, 300, 64), vec![255, 290]),
            (shape(2, 2, 2, 1000, 128), vec![767, 998]),
            (shape(2, 4, 2, 50, 24), vec![0, 48]),
        ];
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for (i, (s, start)) in cases.iter().enumerate() {
                let s = *s;
                let cache: Vec<f32> = random_vec(s.cache_dims().iter().product(), 80 + i as u64)
                    .into_iter()
                    .map(|x| dtype.round(2.0 * x))
                    .collect();
                let [kc, vc, lengths] = cache_of(dev, s, dtype, &cache, start)?;
                let [kc2, vc2, lengths2] = cache_of(dev, s, dtype, &cache, start)?;
                for step in 0..2u64 {
                    let what = format!("{dtype} {s:?} from lengths {start:?}, step {step}");
                    let (rows, [q, k, v]) = step_rows(s, dtype, 90 + 10 * i as u64 + step);
                    let t = |v: &[f32], dims: &[usize]| Tensor::from_slice_as(dev, v, dims, dtype);
                    let width = rows.len() / s.batch;
                    let before = lengths.to_i32_vec()?;
                    let out = ops::decode_attention_append(&t(&rows, &[s.batch, width])?, &kc, &vc, &lengths, s.heads)?;
                    ops::kv_cache_append(&kc2, &vc2, &lengths2, &t(&k, &s.step_dims())?, &t(&v, &s.step_dims())?)?;
                    let want = ops::decode_attention(&t(&q, &s.query_dims())?, &kc2, &vc2, &lengths2)?;
                    assert_eq!((out.dtype(), out.dims()), (dtype, &s.query_dims()[..]), "{what}");
                    let got = out.to_vec()?;
                    bitwise_eq(&format!("{what}: output"), &got, &want.to_vec()?)?;
                    bitwise_eq(&format!("{what}: k_cache"), &kc.to_vec()?, &kc2.to_vec()?)?;
                    bitwise_eq(&format!("{what}: v_cache"), &vc.to_vec()?, &vc2.to_vec()?)?;
                    let lens = lengths.to_i32_vec()?;
                    assert_eq!(lens, lengths2.to_i32_vec()?, "{what}: lengths");
                    assert_eq!(lens, before.iter().map(|l| l + 1).collect::<Vec<_>>(), "{what}: one step");
                    let qt = t(&q, &s.query_dims())?;
                    compare(dev, &what, &got, &reference(&qt, &kc, &vc, &lens, s)?, dtype)?;
                }
            }
        }
        Ok(())
    });
}

/// Captured once, the fused step advances on every replay, each replay bitwise the eager
/// unfused step on a copy of the cache; a full sequence then reports `CacheFull` from
/// `kv_cache_append` (as the unfused ops do), attends to its cache unchanged, and the other
/// sequence is appended. Both the one-pass shape and a two-pass one.
#[test]
fn a_captured_fused_step_advances_on_every_replay() {
    on_each_backend(|dev| {
        let dtype = DType::BF16;
        for max_len in [8, 300] {
            let s = CacheShape { batch: 2, heads: 4, kv_heads: 1, max_len, head_dim: 64 };
            let start = [0, max_len as i32 - 6];
            let zeros = vec![0.0f32; s.cache_dims().iter().product()];
            let [kc, vc, lengths] = cache_of(dev, s, dtype, &zeros, &start)?;
            let [kc2, vc2, lengths2] = cache_of(dev, s, dtype, &zeros, &start)?;
            let (rows, [q, k, v]) = step_rows(s, dtype, 7);
            let t = |v: &[f32], dims: &[usize]| Tensor::from_slice_as(dev, v, dims, dtype);
            let qkv = t(&rows, &[s.batch, rows.len() / s.batch])?;
            let (qt, kt, vt) = (t(&q, &s.query_dims())?, t(&k, &s.step_dims())?, t(&v, &s.step_dims())?);
            let mut g = Graph::new(dev);
            let out = g.capture(CaptureMode::Global, || ops::decode_attention_append(&qkv, &kc, &vc, &lengths, 4))?;
            let unfused = || -> Result<Vec<f32>> {
                ops::kv_cache_append(&kc2, &vc2, &lengths2, &kt, &vt)?;
                ops::decode_attention(&qt, &kc2, &vc2, &lengths2)?.to_vec()
            };
            for step in 1..=6 {
                g.replay()?;
                let what = format!("max_len {max_len}, step {step}");
                assert_eq!(lengths.to_i32_vec()?, vec![step, start[1] + step], "{what}");
                bitwise_eq(&what, &out.to_vec()?, &unfused()?)?;
                bitwise_eq(&format!("{what}: k_cache"), &kc.to_vec()?, &kc2.to_vec()?)?;
            }
            // Sequence 1 is full: reported, left as it is; sequence 0 goes on.
            let full = |e: &Error| matches!(e, Error::CacheFull { op: "kv_cache_append", sequence: 1, max_len: m } if *m == max_len);
            expect_err("a full cache during replay", g.replay().and_then(|()| lengths.to_i32_vec()), full)?;
            assert_eq!(lengths.to_i32_vec()?, vec![7, max_len as i32]);
            expect_err("the unfused ops", unfused(), full)?;
            bitwise_eq(
                "after a full cache",
                &out.to_vec()?,
                &ops::decode_attention(&qt, &kc2, &vc2, &lengths2)?.to_vec()?,
            )?;
            bitwise_eq("after a full cache: v_cache", &vc.to_vec()?, &vc2.to_vec()?)?;
        }
        Ok(())
    });
}

/// A length outside 0..=max_len appends nothing, reads nothing and is `CacheLengthOutOfRange`
/// from `kv_cache_append`; the device works on afterwards.
#[test]
fn a_bad_length_in_the_fused_step_is_reported() {
    on_each_backend(|dev| {
        let s = CacheShape { batch: 3, heads: 2, kv_heads: 2, max_len: 16, head_dim: 64 };
        let dtype = DType::BF16;
        let zeros = vec![0.0f32; s.cache_dims().iter().product()];
        let [kc, vc, lengths] = cache_of(dev, s, dtype, &zeros, &[4, -1, 17])?;
        let (rows, _) = step_rows(s, dtype, 3);
        let qkv = Tensor::from_slice_as(dev, &rows, &[s.batch, rows.len() / s.batch], dtype)?;
        let bad = |e: &Error| {
            matches!(e, Error::CacheLengthOutOfRange { op: "kv_cache_append", sequence: 1, length: -1, max_len: 16 })
        };
        let r = ops::decode_attention_append(&qkv, &kc, &vc, &lengths, 2).and_then(|out| out.to_vec());
        expect_err("a bad length", r, bad)?;
        assert_eq!(lengths.to_i32_vec()?, vec![5, -1, 17], "only the good sequence advanced");
        lengths.copy_from_i32(&[4, 5, 6])?;
        ops::decode_attention_append(&qkv, &kc, &vc, &lengths, 2)?.to_vec()?;
        assert_eq!(lengths.to_i32_vec()?, vec![5, 6, 7]);
        Ok(())
    });
}

/// What the refusal tests start from: a small bf16 cache (`q`, `k_cache`, `v_cache`), the
/// cache's values, and lengths `[1, 2]`.
fn refusal_case(dev: &Device) -> Result<(CacheShape, [Tensor; 3], Vec<f32>, Tensor)> {
    let s = CacheShape { batch: 2, heads: 4, kv_heads: 2, max_len: 8, head_dim: 64 };
    let t = inputs(dev, s, DType::BF16, 1)?;
    let before = t[1].to_vec()?;
    Ok((s, t, before, Tensor::from_i32(dev, &[1, 2], &[2])?))
}

/// The fused step checks its rows, heads and dtypes before anything runs.
#[test]
fn the_fused_step_refuses_bad_rows_before_running() {
    on_each_backend(|dev| {
        let (_, [_, kc, vc], kc_before, lengths) = refusal_case(dev)?;
        let bf = |dims: &[usize]| Tensor::zeros_as(dev, dims, DType::BF16);
        let width = (4 + 2 * 2) * 64;
        let step = |qkv: &Tensor, heads| ops::decode_attention_append(qkv, &kc, &vc, &lengths, heads);
        expect_err("width", step(&bf(&[2, width - 64])?, 4), is_shape)?;
        expect_err("batch", step(&bf(&[3, width])?, 4), is_shape)?;
        expect_err("rank", step(&bf(&[2, 8, 64])?, 4), is_shape)?;
        expect_err("heads 3", step(&bf(&[2, (3 + 4) * 64])?, 3), is_shape)?;
        expect_err("heads 0", step(&bf(&[2, 4 * 64])?, 0), is_shape)?;
        expect_err("dtype mix", step(&Tensor::zeros(dev, &[2, width])?, 4), |e| {
            matches!(e, Error::DTypeMismatch { .. })
        })?;
        let f32_lengths = Tensor::from_slice(dev, &[1.0, 2.0], &[2])?;
        expect_err("f32 lengths", ops::decode_attention_append(&bf(&[2, width])?, &kc, &vc, &f32_lengths, 4), |e| {
            matches!(e, Error::DType { .. })
        })?;
        assert_eq!(lengths.to_i32_vec()?, vec![1, 2]);
        assert!(kc.to_vec()? == kc_before, "the cache changed");
        Ok(())
    });
}

/// A prompt's keys and values land at positions 0..seq of each sequence, as the reference puts
/// them, leaving the rest of the cache and the lengths alone; a decode step then attends to
/// them once the lengths say so.
#[test]
fn kv_cache_fill_writes_a_prompt_as_the_reference_does() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let s = CacheShape { batch: 2, heads: 4, kv_heads: 2, max_len: 9, head_dim: 64 };
            let seq = 5;
            let prompt = [s.batch, seq, s.kv_heads, s.head_dim];
            let n: usize = prompt.iter().product();
            let round = |v: Vec<f32>| v.into_iter().map(|x| dtype.round(x)).collect::<Vec<_>>();
            let (kv, vv) = (round(random_vec(n, 71)), round(random_vec(n, 72)));
            let cache: Vec<f32> = round(random_vec(s.cache_dims().iter().product(), 73));
            let kc = Tensor::from_slice_as(dev, &cache, &s.cache_dims(), dtype)?;
            let vc = Tensor::from_slice_as(dev, &cache, &s.cache_dims(), dtype)?;
            let (k, v) =
                (Tensor::from_slice_as(dev, &kv, &prompt, dtype)?, Tensor::from_slice_as(dev, &vv, &prompt, dtype)?);
            let (mut rk, mut rv) = (cache.clone(), cache.clone());
            cpu::kv_cache_fill(&mut rk, &mut rv, &kv, &vv, s, seq);
            ops::kv_cache_fill(&kc, &vc, &k, &v)?;
            bitwise_eq(&format!("{dtype} k_cache"), &kc.to_vec()?, &rk)?;
            bitwise_eq(&format!("{dtype} v_cache"), &vc.to_vec()?, &rv)?;
            // Position t of head h of sequence b is k[b, t, h].
            let (b, t, h) = (1, 3, 1);
            let at = ((b * s.kv_heads + h) * s.max_len + t) * s.head_dim;
            let from = ((b * seq + t) * s.kv_heads + h) * s.head_dim;
            assert_eq!(rk[at..at + s.head_dim], kv[from..from + s.head_dim], "{dtype}: the reference's layout");
            // Positions past the prompt keep what they held.
            let past = ((b * s.kv_heads + h) * s.max_len + seq) * s.head_dim;
            assert_eq!(rk[past..past + s.head_dim], cache[past..past + s.head_dim]);
            if dtype == DType::BF16 {
                let lengths = Tensor::from_i32(dev, &[seq as i32, 2], &[2])?;
                let q = Tensor::from_slice_as(
                    dev,
                    &random_vec(s.query_dims().iter().product(), 74),
                    &s.query_dims(),
                    dtype,
                )?;
                let out = ops::decode_attention(&q, &kc, &vc, &lengths)?.to_vec()?;
                compare(dev, "attention after a fill", &out, &reference(&q, &kc, &vc, &[seq as i32, 2], s)?, dtype)?;
            }
        }
        Ok(())
    });
}

#[test]
fn bad_shapes_and_dtypes_are_refused_before_running() {
    on_each_backend(|dev| {
        let (s, [q, kc, vc], kc_before, lengths) = refusal_case(dev)?;
        let bf = |dims: &[usize]| Tensor::zeros_as(dev, dims, DType::BF16);
        let dtype_err = |e: &Error| matches!(e, Error::DType { .. });
        // Lengths: dtype, shape, device-side type.
        let f32_lengths = Tensor::from_slice(dev, &[1.0, 2.0], &[2])?;
        expect_err("f32 lengths", ops::decode_attention(&q, &kc, &vc, &f32_lengths), |e| {
            matches!(e, Error::DType { got: DType::F32, expected: DType::I32, .. })
        })?;
        expect_err(
            "lengths shape",
            ops::decode_attention(&q, &kc, &vc, &Tensor::from_i32(dev, &[1], &[1])?),
            is_shape,
        )?;
        // Head dims past what the kernels hold in registers.
        let f = |dims: &[usize]| Tensor::zeros(dev, dims);
        let qf = f(&s.query_dims())?;
        let (q256, c256) = (bf(&[2, 4, 256])?, bf(&[2, 2, 8, 256])?);
        expect_err("head_dim 256", ops::decode_attention(&q256, &c256, &c256, &lengths), is_shape)?;
        expect_err("dtype mix", ops::decode_attention(&qf, &kc, &vc, &lengths), |e| {
            matches!(e, Error::DTypeMismatch { .. })
        })?;
        expect_err("i32 cache", ops::decode_attention(&lengths, &lengths, &lengths, &lengths), dtype_err)?;
        // Shapes.
        expect_err("heads 3", ops::decode_attention(&bf(&[2, 3, 64])?, &kc, &vc, &lengths), is_shape)?;
        expect_err("q batch", ops::decode_attention(&bf(&[3, 4, 64])?, &kc, &vc, &lengths), is_shape)?;
        expect_err("q rank", ops::decode_attention(&bf(&[2, 256])?, &kc, &vc, &lengths), is_shape)?;
        expect_err("v shape", ops::decode_attention(&q, &kc, &bf(&[2, 2, 9, 64])?, &lengths), is_shape)?;
        expect_err(
            "cache rank",
            ops::decode_attention(&q, &bf(&[2, 16, 64])?, &bf(&[2, 16, 64])?, &lengths),
            is_shape,
        )?;
        expect_err(
            "empty cache",
            ops::decode_attention(&q, &bf(&[2, 2, 0, 64])?, &bf(&[2, 2, 0, 64])?, &lengths),
            is_shape,
        )?;
        // kv_cache_append's own arguments.
        let step = bf(&s.step_dims())?;
        expect_err("append k shape", ops::kv_cache_append(&kc, &vc, &lengths, &bf(&[2, 2, 32])?, &step), is_shape)?;
        expect_err("append f32 lengths", ops::kv_cache_append(&kc, &vc, &f32_lengths, &step, &step), dtype_err)?;
        expect_err("append dtype mix", ops::kv_cache_append(&kc, &vc, &lengths, &f(&s.step_dims())?, &step), |e| {
            matches!(e, Error::DTypeMismatch { .. })
        })?;
        // kv_cache_fill's: a prompt longer than the cache, another batch, a dtype mix.
        let fill = |k: &Tensor| ops::kv_cache_fill(&kc, &vc, k, k);
        expect_err("fill past max_len", fill(&bf(&[2, 9, 2, 64])?), is_shape)?;
        expect_err("fill batch", fill(&bf(&[3, 4, 2, 64])?), is_shape)?;
        expect_err("fill rank", fill(&bf(&[2, 4, 128])?), is_shape)?;
        expect_err("fill dtype mix", fill(&f(&[2, 4, 2, 64])?), |e| matches!(e, Error::DTypeMismatch { .. }))?;
        // Nothing ran: the lengths and the caches are as they were.
        assert_eq!(lengths.to_i32_vec()?, vec![1, 2]);
        assert!(kc.to_vec()? == kc_before, "the cache changed");
        Ok(())
    });
}

/// I32 tensors hold integers: the float ops refuse them, casts to and from them too.
#[test]
fn float_ops_refuse_i32_tensors() {
    on_each_backend(|dev| {
        let t = Tensor::from_i32(dev, &[1, 2, 3], &[3])?;
        let dtype_err = |e: &Error| matches!(e, Error::DType { got: DType::I32, .. });
        expect_err("add", ops::add(&t, &t), dtype_err)?;
        expect_err("axpy_", ops::axpy_(&t, 1.0, &t), dtype_err)?;
        expect_err("cast to f32", ops::cast(&t, DType::F32), dtype_err)?;
        let f = Tensor::zeros(dev, &[3])?;
        expect_err("cast to i32", ops::cast(&f, DType::I32), dtype_err)?;
        // Copies and fills keep the integers.
        let c = t.deep_clone()?;
        assert_eq!(c.to_i32_vec()?, vec![1, 2, 3]);
        let z = Tensor::full_as(dev, &[2], 7.0, DType::I32)?;
        assert_eq!(z.to_i32_vec()?, vec![7, 7]);
        expect_err("to_i32_vec of f32", f.to_i32_vec(), dtype_err_f32)?;
        Ok(())
    });
}

fn dtype_err_f32(e: &Error) -> bool {
    matches!(e, Error::DType { got: DType::F32, expected: DType::I32, .. })
}

/// Greedy sampling: the reference's indices on both backends (bitwise: indices), across dtypes
/// and vocabularies that are not multiples of the block, with ties (the lower index), NaN
/// (never chosen) and rows of -inf and of NaN.
#[test]
fn argmax_matches_the_reference() {
    on_each_backend(|dev| {
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for (batch, vocab) in [(1, 1), (3, 7), (4, 1000), (2, 50257)] {
                let mut x: Vec<f32> =
                    random_vec(batch * vocab, vocab as u64).into_iter().map(|v| dtype.round(v)).collect();
                if vocab >= 7 {
                    // Row 0: a tie far apart and a NaN above both; the last row all -inf but one NaN.
                    x[3] = 5.0;
                    x[vocab - 1] = 5.0;
                    x[1] = f32::NAN;
                    let last = (batch - 1) * vocab;
                    x[last..].fill(f32::NEG_INFINITY);
                    x[last + 2] = f32::NAN;
                }
                let t = Tensor::from_slice_as(dev, &x, &[batch, vocab], dtype)?;
                let got = ops::argmax(&t)?;
                assert_eq!(got.dtype(), DType::I32);
                let want = cpu::argmax(&t.to_vec()?, batch, vocab);
                assert_eq!(got.to_i32_vec()?, want, "{dtype} [{batch}, {vocab}]");
                if vocab >= 7 {
                    assert_eq!((want[0], want[batch - 1]), (3, 0));
                }
            }
        }
        let nan = Tensor::from_slice(dev, &[f32::NAN; 4], &[1, 4])?;
        assert_eq!(ops::argmax(&nan)?.to_i32_vec()?, vec![0]);
        expect_err("rank", ops::argmax(&Tensor::zeros(dev, &[4])?), is_shape)?;
        expect_err("empty", ops::argmax(&Tensor::zeros(dev, &[2, 0])?), is_shape)?;
        let ints = Tensor::from_i32(dev, &[1, 2], &[1, 2])?;
        expect_err("i32 logits", ops::argmax(&ints), |e| matches!(e, Error::DType { .. }))?;
        let x = Tensor::from_slice(dev, &random_vec(3 * 300, 4), &[3, 300])?;
        eager_vs_replay(dev, || Ok(vec![ops::argmax(&x)?]))
    });
}
