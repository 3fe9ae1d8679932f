//! Shape buckets (`GraphOptions::buckets`): every bucket captured, largest first, into one
//! pool; a call of any size up to the largest replays its bucket's graphs on padded inputs and
//! gets trimmed outputs, bit for bit what the eager modules compute on the same padded inputs;
//! the module reads the real size on the device; refusals change nothing.

mod common;

use common::model::{Block, Mse};
use common::{on_each_backend, random_vec};
use graphed::{
    make_graphed, ops, AboveLargest, BucketError, BucketRule, Buckets, Cx, Device, Error, GraphOptions, GraphedModules,
    Module, Result, Tensor,
};

const H: usize = 8;
const SIZES: [usize; 3] = [4, 8, 16];

/// `y = x · len`, where `len` is the call's real size, read on the device.
struct ScaleByLength;

#[graphed::graphed(warmup = 2)]
impl ScaleByLength {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let len = cx.bucket_length().ok_or_else(|| Error::msg("no bucket length"))?.clone();
        let y = ops::scale(x, 1.0)?;
        ops::scale_by_(&y, &len)?;
        cx.save(&len);
        Ok(y)
    }

    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let dx = ops::scale(dy, 1.0)?;
        ops::scale_by_(&dx, &cx.saved(0)?)?;
        Ok(Some(dx))
    }
}

/// `[rows, H]` values from a seed.
fn rows(dev: &Device, n: usize, seed: u64) -> Result<Tensor> {
    Tensor::from_slice(dev, &random_vec(n * H, seed), &[n, H])
}

/// `x` (`[n, H]`) padded with zero rows up to `size`.
fn padded(x: &Tensor, size: usize) -> Result<Tensor> {
    let mut v = x.to_vec()?;
    v.resize(size * H, 0.0);
    Tensor::from_slice(x.device(), &v, &[size, H])
}

/// A block graphed with buckets along axis 0 (the rows), training.
fn graphed_block(dev: &Device, above: AboveLargest) -> Result<GraphedModules> {
    let x = rows(dev, 16, 1)?.with_requires_grad(true);
    let opts = GraphOptions::new().buckets(Buckets::new(0, SIZES).above_largest(above));
    Ok(make_graphed(vec![Box::new(Block::new(dev, H, H, 7)?)], vec![vec![vec![Some(x)]]], opts)?)
}

/// Forward and backward of `n` rows through the graphed block; (y, dx, dW) as read back.
fn graphed_step(g: &mut GraphedModules, dev: &Device, n: usize, seed: u64) -> Result<[Vec<f32>; 3]> {
    let x = rows(dev, n, seed)?.with_requires_grad(true);
    let y = g.forward(0, &[Some(x)])?.remove(0).ok_or_else(|| Error::msg("y"))?;
    assert_eq!(y.dims(), &[n, H], "outputs come back at the call's size");
    let dy = rows(dev, n, seed + 100)?;
    let dx = g.backward(0, &[Some(dy)])?.remove(0).ok_or_else(|| Error::msg("dx"))?;
    assert_eq!(dx.dims(), &[n, H], "input grads come back at the call's size");
    let block = g.module::<Block>(0).ok_or_else(|| Error::msg("block"))?;
    let dw = block.w.grad.to_vec()?;
    block.w.grad.copy_from_slice(&[0.0; H * H])?;
    block.b.grad.copy_from_slice(&[0.0; H])?;
    Ok([y.to_vec()?, dx.to_vec()?, dw])
}

/// The same on an eager block, at the padded size `size`, trimmed back to `n` rows.
fn eager_step(block: &mut Block, dev: &Device, n: usize, size: usize, seed: u64) -> Result<[Vec<f32>; 3]> {
    let x = padded(&rows(dev, n, seed)?, size)?.with_requires_grad(true);
    let mut cx = Cx::new(dev);
    let y = block.forward(&mut cx, &x)?;
    let dy = padded(&rows(dev, n, seed + 100)?, size)?;
    let dx = block.backward(&mut cx, &dy)?.ok_or_else(|| Error::msg("dx"))?;
    let dw = block.w.grad.to_vec()?;
    block.w.grad.copy_from_slice(&[0.0; H * H])?;
    block.b.grad.copy_from_slice(&[0.0; H])?;
    let trim = |v: Vec<f32>| v[..n * H].to_vec();
    Ok([trim(y.to_vec()?), trim(dx.to_vec()?), dw])
}

#[test]
fn every_bucket_boundary_matches_eager_on_the_padded_shape_bit_for_bit() {
    on_each_backend(|dev| {
        let mut g = graphed_block(dev, AboveLargest::Error)?;
        let mut eager = Block::new(dev, H, H, 7)?;
        assert_eq!(g.bucket_reports().iter().map(|r| r.size).collect::<Vec<_>>(), SIZES);
        // Exact sizes, one below and one above each boundary, out of order.
        for (k, n) in [4, 3, 5, 8, 7, 9, 16, 15, 1, 16, 2].into_iter().enumerate() {
            let size = SIZES.into_iter().find(|s| *s >= n).expect("a bucket");
            let got = graphed_step(&mut g, dev, n, 10 * k as u64)?;
            assert_eq!(g.active_bucket(), Some(size), "{n} rows replay the {size} bucket");
            let want = eager_step(&mut eager, dev, n, size, 10 * k as u64)?;
            assert_eq!(got, want, "{n} rows in the {size} bucket on {}", dev.name());
        }
        Ok(())
    });
}

#[test]
fn above_the_largest_bucket_is_a_typed_error_or_eager_as_chosen() {
    on_each_backend(|dev| {
        let mut g = graphed_block(dev, AboveLargest::Error)?;
        graphed_step(&mut g, dev, 5, 1)?;
        let x = rows(dev, 17, 2)?.with_requires_grad(true);
        let e = g.forward(0, &[Some(x)]).expect_err("17 rows are above the largest bucket");
        assert!(matches!(e, Error::Bucket(BucketError::AboveLargest { size: 17, largest: 16 })), "{e}");
        assert_eq!(g.active_bucket(), Some(8), "the refusal left the active bucket alone");
        // The eager choice: 17 rows run eagerly, exactly as the module does.
        let mut g = graphed_block(dev, AboveLargest::Eager)?;
        let mut eager = Block::new(dev, H, H, 7)?;
        for n in [17, 3, 20] {
            let got = graphed_step(&mut g, dev, n, 40 + n as u64)?;
            let want =
                eager_step(&mut eager, dev, n, n.max(SIZES.into_iter().find(|s| *s >= n).unwrap_or(n)), 40 + n as u64)?;
            assert_eq!(got, want, "{n} rows");
        }
        Ok(())
    });
}

#[test]
fn refused_calls_change_nothing() {
    on_each_backend(|dev| {
        let mut g = graphed_block(dev, AboveLargest::Error)?;
        let mut eager = Block::new(dev, H, H, 7)?;
        graphed_step(&mut g, dev, 3, 1)?;
        eager_step(&mut eager, dev, 3, 4, 1)?;
        let before = g.pool().stats();
        // Wrong width in a bucket other than the active one: refused, the bucket not switched.
        let bad = Tensor::zeros(dev, &[10, H + 1])?;
        let e = g.forward(0, &[Some(bad)]).expect_err("wrong width");
        assert!(matches!(e, Error::SlotShape { .. }), "{e}");
        assert_eq!(g.active_bucket(), Some(4));
        // A stale handle, a backward with no forward pending, above the largest.
        let e = g.backward(0, &[Some(rows(dev, 3, 2)?)]).expect_err("no forward pending");
        assert!(matches!(e, Error::NoPendingForward { .. }), "{e}");
        let e = g.forward(0, &[Some(rows(dev, 40, 2)?)]).expect_err("above");
        assert!(matches!(e, Error::Bucket(BucketError::AboveLargest { .. })), "{e}");
        // A grad output whose size is not the forward's.
        g.forward(0, &[Some(rows(dev, 6, 3)?.with_requires_grad(true))])?;
        let e = g.backward(0, &[Some(rows(dev, 5, 4)?)]).expect_err("the forward had 6 rows");
        assert!(matches!(e, Error::SlotShape { .. }), "{e}");
        assert_eq!(g.pool().stats().reserved, before.reserved, "no refusal grew the pool");
        // The step goes on with correct calls, and still matches eager.
        let dx = g.backward(0, &[Some(rows(dev, 6, 3 + 100)?)])?;
        assert_eq!(dx[0].as_ref().map(|t| t.dims().to_vec()), Some(vec![6, H]));
        let eager_6 = eager_step(&mut eager, dev, 6, 8, 3)?;
        assert_eq!(dx[0].as_ref().map(Tensor::to_vec).transpose()?, Some(eager_6[1].clone()));
        let block = g.module::<Block>(0).ok_or_else(|| Error::msg("block"))?;
        assert_eq!(block.w.grad.to_vec()?, eager_6[2]);
        block.w.grad.copy_from_slice(&[0.0; H * H])?;
        block.b.grad.copy_from_slice(&[0.0; H])?;
        let got = graphed_step(&mut g, dev, 7, 9)?;
        let want = eager_step(&mut eager, dev, 7, 8, 9)?;
        assert_eq!(got, want);
        Ok(())
    });
}

#[test]
fn switching_buckets_mid_iteration_abandons_the_pending_backward() {
    on_each_backend(|dev| {
        let mut g = graphed_block(dev, AboveLargest::Error)?;
        g.forward(0, &[Some(rows(dev, 12, 1)?.with_requires_grad(true))])?;
        g.forward(0, &[Some(rows(dev, 2, 2)?.with_requires_grad(true))])?;
        // The 4 bucket's microbatch is the one waiting; the 16 bucket's was abandoned.
        let dx = g.backward(0, &[Some(rows(dev, 2, 3)?)])?;
        assert_eq!(dx[0].as_ref().map(|t| t.dims().to_vec()), Some(vec![2, H]));
        let e = g.backward(0, &[Some(rows(dev, 12, 3)?)]).expect_err("abandoned");
        assert!(matches!(e, Error::NoPendingForward { .. }), "{e}");
        // Back in the 16 bucket, a whole iteration works.
        graphed_step(&mut g, dev, 12, 5)?;
        // The buckets share buffers: a handle from one goes stale when another replays, never
        // silently reading the other bucket's numbers.
        let big = g.forward(0, &[Some(rows(dev, 16, 6)?.with_requires_grad(true))])?.remove(0).expect("y");
        assert!(big.to_vec().is_ok());
        let small = g.forward(0, &[Some(rows(dev, 3, 7)?.with_requires_grad(true))])?.remove(0).expect("y");
        assert!(
            matches!(big.to_vec(), Err(Error::StaleTensor { .. })),
            "the 16 bucket's output after the 4 bucket ran"
        );
        g.forward(0, &[Some(rows(dev, 16, 8)?.with_requires_grad(true))])?;
        assert!(
            matches!(small.to_vec(), Err(Error::StaleTensor { .. })),
            "the 4 bucket's output after the 16 bucket ran"
        );
        Ok(())
    });
}

#[test]
fn the_module_reads_the_real_size_on_the_device() {
    on_each_backend(|dev| {
        let x = rows(dev, 16, 1)?.with_requires_grad(true);
        let opts = GraphOptions::new().buckets(Buckets::powers_of_two(0, 4, 16));
        let mut g = make_graphed(vec![Box::new(ScaleByLength)], vec![vec![vec![Some(x)]]], opts)?;
        for n in [3, 4, 16, 11, 1] {
            let x = rows(dev, n, n as u64)?.with_requires_grad(true);
            let y = g.forward(0, &[Some(x.clone())])?.remove(0).ok_or_else(|| Error::msg("y"))?;
            let want: Vec<f32> = x.to_vec()?.iter().map(|v| v * n as f32).collect();
            assert_eq!(y.to_vec()?, want, "{n} rows");
            let dx = g.backward(0, &[Some(x.clone())])?.remove(0).ok_or_else(|| Error::msg("dx"))?;
            assert_eq!(dx.to_vec()?, want, "the backward reads the same length");
        }
        Ok(())
    });
}

#[test]
fn buckets_share_one_pool_captured_largest_first() {
    on_each_backend(|dev| {
        let g = graphed_block(dev, AboveLargest::Error)?;
        let reports = g.bucket_reports();
        let shared = g.pool().stats().reserved;
        // Captured largest first: the pool only grows after the largest, and ends as it stood
        // after the last (smallest) bucket's capture.
        assert!(reports[..2].iter().all(|r| r.reserved_bytes >= reports[2].reserved_bytes), "{reports:?}");
        assert_eq!(reports[0].reserved_bytes, shared);
        // The largest alone, in a pool of its own.
        let x = rows(dev, 16, 1)?.with_requires_grad(true);
        let alone =
            make_graphed(vec![Box::new(Block::new(dev, H, H, 7)?)], vec![vec![vec![Some(x)]]], GraphOptions::new())?;
        let largest = alone.pool().stats().reserved;
        println!("pool: {shared} B for {SIZES:?}, {largest} B for the largest alone; per bucket {reports:?}");
        assert!(shared < 2 * largest, "the smaller buckets reuse the largest one's memory");
        assert!(reports[2].capture_time > std::time::Duration::ZERO);
        Ok(())
    });
}

#[test]
fn refused_options() {
    let dev = Device::host();
    let x = || Ok::<_, Error>(vec![vec![vec![Some(rows(&dev, 16, 1)?)]]]);
    let block = || -> Result<Vec<Box<dyn Module>>> { Ok(vec![Box::new(Block::new(&dev, H, H, 7)?)]) };
    type Case = (GraphOptions, fn(&Error) -> bool);
    let cases: Vec<Case> = vec![
        (GraphOptions::new().buckets(Buckets::new(0, [])), |e| matches!(e, Error::Bucket(BucketError::NoSizes { .. }))),
        (GraphOptions::new().buckets(Buckets::new(0, [0, 4])), |e| {
            matches!(e, Error::Bucket(BucketError::NoSizes { .. }))
        }),
        (GraphOptions::new().buckets(Buckets::powers_of_two(0, 32, 16)), |e| {
            matches!(e, Error::Bucket(BucketError::NoList { rule: BucketRule::PowersOfTwo { min: 32, max: 16 } }))
        }),
        (GraphOptions::new().buckets(Buckets::new(0, [4, 32])), |e| {
            matches!(e, Error::Bucket(BucketError::NoBucketedInput { axis: 0, largest: 32 }))
        }),
        (GraphOptions::new().buckets(Buckets::new(0, [4, 16])).pool(&dev.new_pool()), |e| {
            matches!(e, Error::Bucket(BucketError::Unsupported { .. }))
        }),
    ];
    for (opts, want) in cases {
        let e = make_graphed(block().expect("block"), x().expect("x"), opts).expect_err("refused");
        assert!(want(e.error()), "{}", e.error());
        assert_eq!(e.into_parts().1.len(), 1, "the modules come back");
    }
}

const B: usize = 3;

/// A block over `[batch, seq, H]`: the bucketed axis is 1, so trimming copies (not a view).
struct SeqBlock(Block);

#[graphed::graphed(warmup = 2)]
impl SeqBlock {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let d = x.dims().to_vec();
        self.0.forward(cx, &x.reshape(&[d[0] * d[1], H])?)?.reshape(&d)
    }

    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let d = dy.dims().to_vec();
        self.0.backward(cx, &dy.reshape(&[d[0] * d[1], H])?)?.map(|g| g.reshape(&d)).transpose()
    }
}

/// `[B, t, H]` values from a seed.
fn seq(dev: &Device, t: usize, seed: u64) -> Result<Tensor> {
    Tensor::from_slice(dev, &random_vec(B * t * H, seed), &[B, t, H])
}

/// `x` (`[B, t, H]`) padded along the sequence with `value` up to `size`.
fn seq_padded(x: &Tensor, size: usize, value: f32) -> Result<Tensor> {
    let (t, v) = (x.dims()[1], x.to_vec()?);
    let mut out = vec![value; B * size * H];
    for b in 0..B {
        out[b * size * H..][..t * H].copy_from_slice(&v[b * t * H..][..t * H]);
    }
    Tensor::from_slice(x.device(), &out, &[B, size, H])
}

/// The first `t` positions of `[B, size, H]` values.
fn seq_trim(v: &[f32], size: usize, t: usize) -> Vec<f32> {
    (0..B).flat_map(|b| v[b * size * H..][..t * H].to_vec()).collect()
}

/// Two sequence blocks and a loss, chained, bucketed along the sequence (axis 1).
fn chain_modules(dev: &Device) -> Result<Vec<Box<dyn Module>>> {
    Ok(vec![
        Box::new(SeqBlock(Block::new(dev, H, H, 3)?)),
        Box::new(SeqBlock(Block::new(dev, H, H, 4)?)),
        Box::new(Mse),
    ])
}

/// The loss, the first input's grad and the first block's weight grad of one iteration on
/// `t` positions: graphed (forward_chain + backward_chain, or one fused step) or eager at the
/// bucket's size on padded inputs.
fn chain_iteration(
    g: Option<&mut GraphedModules>,
    eager: &mut [Box<dyn Module>],
    dev: &Device,
    t: usize,
    size: usize,
    fused: bool,
) -> Result<[Vec<f32>; 3]> {
    let x = seq(dev, t, t as u64)?.with_requires_grad(true);
    let target = seq(dev, t, 1000 + t as u64)?;
    let dloss = Tensor::from_slice(dev, &[1.0], &[1])?;
    let (loss, dx, first) = match g {
        Some(g) => {
            let (loss, dx) = if fused {
                let out = g.step_chain(&[&[Some(x)]], &[&[Some(target)]], &[&[Some(dloss)]])?;
                let dx = g.grad_inputs(0, 0)?.remove(0).ok_or_else(|| Error::msg("dx"))?;
                (out[0][0].clone().ok_or_else(|| Error::msg("loss"))?, seq_trim(&dx.to_vec()?, size, t))
            } else {
                let loss = g.forward_chain(&[Some(x)], &[Some(target)])?.remove(0).ok_or_else(|| Error::msg("loss"))?;
                let loss = loss.to_vec()?;
                let dx = g.backward_chain(&[Some(dloss)])?.remove(0).ok_or_else(|| Error::msg("dx"))?;
                assert_eq!(dx.dims(), &[B, t, H]);
                (Tensor::from_slice(dev, &loss, &[1])?, dx.to_vec()?)
            };
            let block = g.module::<SeqBlock>(0).ok_or_else(|| Error::msg("block"))?;
            let w = block.0.w.grad.to_vec()?;
            for c in 0..2 {
                let b = &g.module::<SeqBlock>(c).ok_or_else(|| Error::msg("block"))?.0;
                b.w.grad.copy_from_slice(&[0.0; H * H])?;
                b.b.grad.copy_from_slice(&[0.0; H])?;
            }
            (loss.to_vec()?, dx, w)
        }
        None => {
            let xp = seq_padded(&x, size, 0.0)?.with_requires_grad(true);
            let tp = seq_padded(&target, size, 0.0)?;
            let mut cxs = [Cx::new(dev), Cx::new(dev), Cx::new(dev)];
            let h1 = eager[0].forward(&mut cxs[0], &[Some(xp)])?.remove(0);
            let h2 = eager[1].forward(&mut cxs[1], &[h1])?.remove(0);
            let loss = eager[2].forward(&mut cxs[2], &[h2, Some(tp)])?.remove(0).ok_or_else(|| Error::msg("loss"))?;
            let d2 = eager[2].backward(&mut cxs[2], &[Some(dloss)])?.remove(0);
            let d1 = eager[1].backward(&mut cxs[1], &[d2])?.remove(0);
            let dx = eager[0].backward(&mut cxs[0], &[d1])?.remove(0).ok_or_else(|| Error::msg("dx"))?;
            let block =
                (eager[0].as_ref() as &dyn std::any::Any).downcast_ref::<SeqBlock>().ok_or_else(|| Error::msg("b"))?;
            let w = block.0.w.grad.to_vec()?;
            for m in &eager[..2] {
                let b =
                    &(m.as_ref() as &dyn std::any::Any).downcast_ref::<SeqBlock>().ok_or_else(|| Error::msg("b"))?.0;
                b.w.grad.copy_from_slice(&[0.0; H * H])?;
                b.b.grad.copy_from_slice(&[0.0; H])?;
            }
            (loss.to_vec()?, seq_trim(&dx.to_vec()?, size, t), w)
        }
    };
    Ok([loss, dx, first])
}

#[test]
fn chained_calls_and_fused_steps_per_bucket_match_eager_bit_for_bit() {
    on_each_backend(|dev| {
        let sizes = [4, 8, 12];
        let x = seq(dev, 12, 1)?.with_requires_grad(true);
        let samples = vec![
            vec![vec![Some(x.clone())]],
            vec![vec![Some(x.clone())]],
            vec![vec![Some(x.clone()), Some(seq(dev, 12, 2)?)]],
        ];
        let opts = GraphOptions::new().chained(true).buckets(Buckets::new(1, sizes));
        let mut g = make_graphed(chain_modules(dev)?, samples, opts)?;
        let mut eager = chain_modules(dev)?;
        for fused in [false, true] {
            if fused {
                g.fuse()?;
            }
            for t in [12, 3, 9, 4, 5, 12, 1] {
                let size = sizes.into_iter().find(|s| *s >= t).expect("a bucket");
                let got = chain_iteration(Some(&mut g), &mut eager, dev, t, size, fused)?;
                let want = chain_iteration(None, &mut eager, dev, t, size, fused)?;
                assert_eq!(got, want, "{t} positions in the {size} bucket, fused: {fused}, on {}", dev.name());
            }
        }
        Ok(())
    });
}

#[test]
fn the_pool_estimate_is_within_ten_percent_of_the_real_pool() {
    on_each_backend(|dev| {
        // Wide enough that the pool is not all slab rounding.
        let (rows_max, width) = (512, 64);
        let samples = || -> Result<Vec<Vec<Vec<Option<Tensor>>>>> {
            let x = Tensor::from_slice(dev, &random_vec(rows_max * width, 5), &[rows_max, width])?;
            let x = x.with_requires_grad(true);
            Ok(vec![vec![vec![Some(x.clone())]], vec![vec![Some(x)]]])
        };
        let modules = || -> Result<Vec<Box<dyn Module>>> {
            Ok(vec![Box::new(Block::new(dev, width, width, 1)?), Box::new(Block::new(dev, width, width, 2)?)])
        };
        let opts = GraphOptions::new().buckets(Buckets::powers_of_two(0, 32, rows_max));
        let (estimate, back) = graphed::estimate_pool(modules()?, samples()?, opts.clone())?;
        assert_eq!(back.len(), 2, "the modules come back");
        assert_eq!(estimate.probes.iter().map(|p| p.elements).collect::<Vec<_>>(), [32, 64, 128]);
        let g = make_graphed(back, samples()?, opts)?;
        let real = g.pool().stats().reserved;
        let x = samples()?;
        let alone = make_graphed(modules()?, x, GraphOptions::new())?.pool().stats().reserved;
        let off = (estimate.bytes as f64 - real as f64) / real as f64;
        println!(
            "{}: estimate {} B, real {real} B ({:+.1}%); the largest bucket alone {alone} B (shared/alone {:.3})",
            dev.name(),
            estimate.bytes,
            100.0 * off,
            real as f64 / alone as f64
        );
        assert!(off.abs() < 0.10, "estimate {estimate:?} against the real {real} B");
        assert!(real as f64 <= 1.1 * alone as f64, "the buckets share the largest one's memory");
        Ok(())
    });
}

#[test]
fn a_pipeline_iteration_stays_in_its_first_microbatchs_bucket() {
    on_each_backend(|dev| {
        let order = [1, 2, 1, 2, -2, -1, -2, -1];
        let x = rows(dev, 16, 1)?.with_requires_grad(true);
        let samples = vec![vec![vec![Some(x.clone())]], vec![vec![Some(x)]]];
        let opts = GraphOptions::new().order(order).buckets(Buckets::new(0, SIZES));
        let blocks = || -> Result<Vec<Box<dyn Module>>> {
            Ok(vec![Box::new(Block::new(dev, H, H, 3)?), Box::new(Block::new(dev, H, H, 4)?)])
        };
        let mut g = make_graphed(blocks()?, samples, opts)?;
        let mut eager = blocks()?;
        // Microbatch 0 has 7 rows (the 8 bucket); microbatch 1 has 3, and stays in the 8 bucket.
        let lens = [7, 3];
        let xs: Vec<Tensor> = lens.iter().map(|&n| rows(dev, n, n as u64)).collect::<Result<_>>()?;
        let dys: Vec<Tensor> = lens.iter().map(|&n| rows(dev, n, 50 + n as u64)).collect::<Result<_>>()?;
        let (mut got, mut want) = (Vec::new(), Vec::new());
        let mut hs = [None, None];
        let mut cxs: Vec<[Cx; 2]> = (0..2).map(|_| [Cx::new(dev), Cx::new(dev)]).collect();
        let mut ehs = [None, None];
        let (mut f, mut b) = ([0usize; 2], [0usize; 2]);
        for e in order {
            let c = e.unsigned_abs() as usize - 1;
            let m = if e > 0 { f[c] } else { b[c] };
            let input = if c == 0 { Some(xs[m].clone().with_requires_grad(true)) } else { hs[m].clone() };
            if e > 0 {
                let out = g.forward(c, &[input])?.remove(0);
                assert_eq!(g.active_bucket(), Some(8), "microbatch {m} of chunk {c} stays in the 8 bucket");
                let ein = if c == 0 { Some(padded(&xs[m], 8)?.with_requires_grad(true)) } else { ehs[m].clone() };
                let eout = eager[c].forward(&mut cxs[m][c], &[ein])?.remove(0);
                if c == 0 {
                    hs[m] = out.map(|t| t.deep_clone()).transpose()?.map(|t| t.with_requires_grad(true));
                    ehs[m] = eout.map(|t| t.with_requires_grad(true));
                } else {
                    got.push(out.expect("y").to_vec()?);
                    want.push(eout.expect("y").to_vec()?[..lens[m] * H].to_vec());
                }
                f[c] += 1;
            } else {
                let (gd, ed) = if c == 1 {
                    let gd = g.backward(1, &[Some(dys[m].clone())])?.remove(0);
                    (gd, eager[1].backward(&mut cxs[m][1], &[Some(padded(&dys[m], 8)?)])?.remove(0))
                } else {
                    let gd = g.backward(0, &[hs[m].take()])?.remove(0);
                    (gd, eager[0].backward(&mut cxs[m][0], &[ehs[m].take()])?.remove(0))
                };
                if c == 1 {
                    // Chunk 1's input grad is chunk 0's grad output.
                    hs[m] = gd.map(|t| t.deep_clone()).transpose()?;
                    ehs[m] = ed;
                } else {
                    got.push(gd.expect("dx").to_vec()?);
                    want.push(ed.expect("dx").to_vec()?[..lens[m] * H].to_vec());
                }
                b[c] += 1;
            }
        }
        assert_eq!(got, want, "on {}", dev.name());
        Ok(())
    });
}

/// `[b, t, H]` values from a seed.
fn grid(dev: &Device, b: usize, t: usize, seed: u64) -> Result<Tensor> {
    Tensor::from_slice(dev, &random_vec(b * t * H, seed), &[b, t, H])
}

/// `x` (`[b, t, H]`) padded with zeros to `[bb, tt, H]`.
fn grid_padded(x: &Tensor, bb: usize, tt: usize) -> Result<Tensor> {
    let (b, t, v) = (x.dims()[0], x.dims()[1], x.to_vec()?);
    let mut out = vec![0.0; bb * tt * H];
    for i in 0..b {
        out[i * tt * H..][..t * H].copy_from_slice(&v[i * t * H..][..t * H]);
    }
    Tensor::from_slice(x.device(), &out, &[bb, tt, H])
}

/// The first `[b, t, H]` of `[bb, tt, H]` values.
fn grid_trim(v: &[f32], tt: usize, b: usize, t: usize) -> Vec<f32> {
    (0..b).flat_map(|i| v[i * tt * H..][..t * H].to_vec()).collect()
}

#[test]
fn buckets_over_a_batch_and_a_sequence_axis_match_eager_on_the_padded_shapes() {
    on_each_backend(|dev| {
        let spec = Buckets::new(0, [2, 4]).and(Buckets::new(1, [4, 8]));
        let x = grid(dev, 4, 8, 1)?.with_requires_grad(true);
        let opts = GraphOptions::new().buckets(spec.clone());
        let mut g = make_graphed(vec![Box::new(SeqBlock(Block::new(dev, H, H, 9)?))], vec![vec![vec![Some(x)]]], opts)?;
        let shapes: Vec<Vec<usize>> = g.bucket_reports().iter().map(|r| r.shape.clone()).collect();
        assert_eq!(shapes, [[2, 4], [2, 8], [4, 4], [4, 8]]);
        let mut eager = SeqBlock(Block::new(dev, H, H, 9)?);
        for (k, (b, t)) in [(3, 5), (1, 3), (2, 8), (4, 4), (4, 8), (1, 1), (3, 8)].into_iter().enumerate() {
            let bucket = spec.bucket_for(&[b, t]).expect("a bucket");
            let (bb, tt) = (bucket[0], bucket[1]);
            let x = grid(dev, b, t, 10 + k as u64)?.with_requires_grad(true);
            let dy = grid(dev, b, t, 50 + k as u64)?;
            let y = g.forward(0, &[Some(x.clone())])?.remove(0).expect("y");
            assert_eq!(g.active_bucket_shape(), Some(bucket.clone()), "({b}, {t})");
            assert_eq!(y.dims(), &[b, t, H]);
            let dx = g.backward(0, &[Some(dy.clone())])?.remove(0).expect("dx");
            assert_eq!(dx.dims(), &[b, t, H]);
            let mut cx = Cx::new(dev);
            let ey = eager.forward(&mut cx, &grid_padded(&x, bb, tt)?.with_requires_grad(true))?;
            let edx = eager.backward(&mut cx, &grid_padded(&dy, bb, tt)?)?.expect("dx");
            let what = format!("({b}, {t}) in the ({bb}, {tt}) bucket on {}", dev.name());
            assert_eq!(y.to_vec()?, grid_trim(&ey.to_vec()?, tt, b, t), "{what}: outputs");
            assert_eq!(dx.to_vec()?, grid_trim(&edx.to_vec()?, tt, b, t), "{what}: input grads");
            let (gw, ew) = (&g.module::<SeqBlock>(0).expect("block").0.w.grad, &eager.0.w.grad);
            assert_eq!(gw.to_vec()?, ew.to_vec()?, "{what}: weight grads");
            for w in [gw, ew] {
                w.copy_from_slice(&[0.0; H * H])?;
            }
            g.module::<SeqBlock>(0).expect("block").0.b.grad.copy_from_slice(&[0.0; H])?;
            eager.0.b.grad.copy_from_slice(&[0.0; H])?;
        }
        // Above the largest along either axis, and inputs that disagree: typed refusals.
        let e = g.forward(0, &[Some(grid(dev, 5, 2, 1)?)]).expect_err("5 rows");
        assert!(matches!(e, Error::Bucket(BucketError::AboveLargest { size: 5, largest: 4 })), "{e}");
        let e = g.forward(0, &[Some(grid(dev, 2, 9, 1)?)]).expect_err("9 positions");
        assert!(matches!(e, Error::Bucket(BucketError::AboveLargest { size: 9, largest: 8 })), "{e}");
        let three = Buckets::new(0, [2]).and(Buckets::new(1, [4])).and(Buckets::new(2, [8]));
        let e = make_graphed(
            vec![Box::new(Block::new(dev, H, H, 1)?)],
            vec![vec![vec![Some(rows(dev, 2, 1)?)]]],
            GraphOptions::new().buckets(three),
        )
        .expect_err("three axes");
        assert!(matches!(e.error(), Error::Bucket(BucketError::TooManyAxes { axes: 3, max: 2 })), "{}", e.error());
        Ok(())
    });
}

/// A chained forward refused for its first chunk's inputs (a wrong width, in a bucket other
/// than the active one) changes nothing: the active bucket stays, and its microbatch waiting for
/// its backward is still there (its backward runs and returns its positions).
#[test]
fn a_refused_chained_forward_leaves_the_active_bucket_and_its_pending_backward() {
    on_each_backend(|dev| {
        let x = seq(dev, 12, 1)?.with_requires_grad(true);
        let samples = vec![
            vec![vec![Some(x.clone())]],
            vec![vec![Some(x.clone())]],
            vec![vec![Some(x.clone()), Some(seq(dev, 12, 2)?)]],
        ];
        let opts = GraphOptions::new().chained(true).buckets(Buckets::new(1, [4, 8, 12]));
        let mut g = make_graphed(chain_modules(dev)?, samples, opts)?;
        // 9 positions: the 12 bucket, its backward pending.
        g.forward_chain(&[Some(seq(dev, 9, 3)?.with_requires_grad(true))], &[Some(seq(dev, 9, 4)?)])?;
        assert_eq!(g.active_bucket(), Some(12));
        // 3 positions, one feature too many: routed to the 4 bucket, refused for its width.
        let wide = Tensor::from_slice(dev, &random_vec(B * 3 * (H + 1), 5), &[B, 3, H + 1])?;
        let e = g.forward_chain(&[Some(wide)], &[Some(seq(dev, 3, 6)?)]).expect_err("a wrong width");
        assert!(matches!(e, Error::SlotShape { .. }), "{e:?}");
        assert_eq!(g.active_bucket(), Some(12), "the active bucket is the same");
        let dloss = Tensor::from_slice(dev, &[1.0], &[1])?;
        let dx = g.backward_chain(&[Some(dloss)])?.remove(0).ok_or_else(|| Error::msg("dx"))?;
        assert_eq!(dx.dims(), &[B, 9, H], "the pending backward ran");
        Ok(())
    });
}
