//! A chain of graphed layers whose backward takes a large transient workspace (as cuDNN's
//! fused attention backward does): every layer's backward replays serially into one shared
//! pool, so the pool should reserve one workspace, not one per layer, nor two.

use graphed::{
    graphed, make_graphed, ops, CaptureMode, Cx, Device, Graph, GraphOptions, Module, PoolStats, Result, Tensor,
};

/// Rows and width of the activations.
const ROWS: usize = 256;
const WIDTH: usize = 256;
/// One activation's bytes.
const ACT: usize = ROWS * WIDTH * 4;

/// A layer shaped like an attention block: a forward saving a few activations, and a backward
/// that makes a few grads (the MLP's), then `dq, dk, dv`, then a workspace of `work` floats
/// that it frees before the rest of the backward (the projections' grads, the input grad).
struct Layer {
    work: usize,
}

#[graphed(warmup = 2)]
impl Layer {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let q = ops::scale(x, 0.5)?;
        let k = ops::scale(x, 0.25)?;
        let v = ops::scale(x, 2.0)?;
        let a = ops::add(&q, &k)?;
        let y = ops::add(&a, &v)?;
        for t in [&q, &k, &v, &a] {
            cx.save(t);
        }
        Ok(y)
    }

    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let saved = (0..4).map(|i| cx.saved(i)).collect::<Result<Vec<_>>>()?;
        let dm = ops::scale(dy, 1.5)?;
        let datt = ops::add(&dm, &saved[3])?;
        let (dq, dk, dv) = (ops::scale(&datt, 0.5)?, ops::scale(&datt, 0.25)?, ops::scale(&datt, 2.0)?);
        if self.work > 0 {
            // The op's workspace: made after its outputs, gone when it returns.
            let work = Tensor::empty(dy.device(), &[self.work])?;
            drop(work);
        }
        let dh = ops::add(&ops::add(&dq, &dk)?, &dv)?;
        let dx = ops::add(&dh, &saved[0])?;
        Ok(Some(dx))
    }
}

/// The chain's end: the mean squared error against a target, as a model's loss head.
struct Loss {
    target: Tensor,
}

#[graphed(warmup = 2)]
impl Loss {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        cx.save(x);
        ops::mse_loss(x, &self.target)
    }

    fn backward(&mut self, cx: &mut Cx, _dloss: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(ops::mse_backward(&cx.saved(0)?, &self.target, 1.0)?))
    }
}

/// The pool's stats after capturing `layers` layers with a workspace of `work` floats each,
/// and after three replayed iterations.
fn captured(dev: &Device, layers: usize, work: usize) -> Result<(PoolStats, PoolStats)> {
    let mut modules: Vec<Box<dyn Module>> = (0..layers).map(|_| Box::new(Layer { work }) as Box<dyn Module>).collect();
    modules.push(Box::new(Loss { target: Tensor::full(dev, &[ROWS, WIDTH], 0.25)? }));
    let x = Tensor::full(dev, &[ROWS, WIDTH], 0.5)?.with_requires_grad(true);
    let hidden = Tensor::zeros(dev, &[ROWS, WIDTH])?.with_requires_grad(true);
    let mut samples = vec![vec![vec![Some(x.clone())]]];
    samples.extend((0..layers).map(|_| vec![vec![Some(hidden.clone())]]));
    let mut g = make_graphed(modules, samples, GraphOptions::new().warmup(2).chained(true))?;
    let after_capture = g.pool().stats();
    let dloss = Tensor::full(dev, &[1], 1.0)?;
    for _ in 0..3 {
        let mut h = x.clone();
        for i in 0..=layers {
            h = g.forward(i, &[Some(h)])?.remove(0).expect("output");
        }
        let mut d = dloss.clone();
        for i in (0..=layers).rev() {
            d = g.backward(i, &[Some(d)])?.remove(0).expect("dx");
        }
    }
    Ok((after_capture, g.pool().stats()))
}

#[test]
fn a_transient_workspace_of_every_layers_backward_is_reserved_once() -> Result<()> {
    let dev = Device::host();
    let layers = 8;
    for work_acts in [4, 16, 64] {
        let work = work_acts * ACT / 4;
        let (base, _) = captured(&dev, layers, 0)?;
        let (with, after) = captured(&dev, layers, work)?;
        let grown = with.reserved - base.reserved;
        eprintln!(
            "workspace {work_acts} activations ({} KiB): reserved {} KiB without, {} KiB with \
             (+{} KiB = {:.2} workspaces), {} slabs vs {}; after replays {} KiB",
            (work * 4) >> 10,
            base.reserved >> 10,
            with.reserved >> 10,
            grown >> 10,
            grown as f64 / (work * 4) as f64,
            with.slabs,
            base.slabs,
            after.reserved >> 10,
        );
        assert_eq!(after.reserved, with.reserved, "replays never grow the pool");
        assert!(
            with.reserved as f64 <= 1.1 * (base.reserved + work * 4) as f64,
            "reserved {} > 1.1 x ({} without the workspace + one workspace of {})",
            with.reserved,
            base.reserved,
            work * 4
        );
    }
    Ok(())
}

/// Eagerly: a small block that would split the only range holding the largest freed block
/// grows the pool by its own size, and the large block fits again.
#[test]
fn a_small_block_does_not_take_the_room_of_the_largest_freed_one() -> Result<()> {
    let dev = Device::host();
    let pool = dev.new_pool();
    let (big, small) = (1 << 18, 1 << 14); // floats: 1 MiB and 64 KiB
    dev.with_pool(&pool, || -> Result<()> {
        drop(Tensor::empty(&dev, &[big])?);
        let s = Tensor::empty(&dev, &[small])?;
        let again = Tensor::empty(&dev, &[big])?;
        assert_eq!(pool.stats().reserved, (big + small) * 4, "one large range, one small slab");
        drop((s, again));
        Ok(())
    })
}

/// Where the pool cannot grow (its limit), the small block splits the range as best fit says,
/// and nothing fails that would have fitted.
#[test]
fn keeping_room_never_fails_a_request_that_fits() -> Result<()> {
    let dev = Device::host();
    let (big, small) = (1 << 18, 1 << 14);
    let pool = dev.new_pool().with_limit(big * 4);
    dev.with_pool(&pool, || -> Result<()> {
        drop(Tensor::empty(&dev, &[big])?);
        let s = Tensor::empty(&dev, &[small])?;
        assert_eq!(pool.stats().reserved, big * 4, "split, within the limit");
        drop(s);
        Ok(())
    })?;
    // The same inside a capture that retries after growing: refused for room first, then the
    // limit refuses the growth, and the retry splits.
    let pool = dev.new_pool().with_limit(big * 4);
    dev.with_pool(&pool, || Tensor::empty(&dev, &[big]).map(drop))?;
    let x = Tensor::full(&dev, &[small], 1.0)?;
    let mut g = Graph::with_pool(&dev, &pool);
    let y = g.capture(CaptureMode::Global, || ops::scale(&x, 2.0))?;
    g.replay()?;
    assert_eq!(y.to_vec()?, vec![2.0; small]);
    assert_eq!(pool.stats().reserved, big * 4);
    // A raw capture (capture_begin, no retry) is never refused a block that fits either.
    let pool = dev.new_pool();
    dev.with_pool(&pool, || Tensor::empty(&dev, &[big]).map(drop))?;
    let mut g = Graph::with_pool(&dev, &pool);
    g.capture_begin(CaptureMode::Global)?;
    let y = ops::scale(&x, 3.0);
    g.capture_end()?;
    g.replay()?;
    assert_eq!(y?.to_vec()?, vec![3.0; small]);
    assert_eq!(pool.stats().reserved, big * 4);
    Ok(())
}
