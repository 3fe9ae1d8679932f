//! Static surfaces reused across the microbatches of a pipeline schedule
//! (`GraphOptions::reuse_buffers`): per-call replays, the fused step and eager agree bit for
//! bit; handles to a reused buffer go stale when a later microbatch overwrites it; the pool
//! grows with the microbatches in flight, not with their total.

mod common;

use common::model::Block;
use common::{on_each_backend, random};
use graphed::optim::{Sgd, SgdConfig};
use graphed::{
    make_graphed, Cx, Device, Error, GraphOptions, GraphedModules, Module, OrderEntry, Param, Result, Sequence, Tensor,
};

const B: usize = 4;
const H: usize = 8;
const STEPS: usize = 3;

/// `OrderEntry::windowed` over 2 chunks, as integers (the pipeline_memory example's schedule).
fn windowed(microbatches: usize, window: usize) -> Vec<i32> {
    let int = |e: &OrderEntry| match *e {
        OrderEntry::Forward(c) => c as i32,
        _ => -(e.chunk() as i32),
    };
    OrderEntry::windowed(2, microbatches, window).iter().map(int).collect()
}

/// Per microbatch of each step: an input and a grad output.
struct Data {
    xs: Vec<Vec<Tensor>>,
    dys: Vec<Vec<Tensor>>,
}

fn data(dev: &Device, microbatches: usize) -> Result<Data> {
    let mut d = Data { xs: Vec::new(), dys: Vec::new() };
    for s in 0..STEPS as u64 {
        let seeds = (0..microbatches as u64).map(|m| 100 * s + m);
        d.xs.push(seeds.clone().map(|k| Ok(random(dev, &[B, H], k)?.with_requires_grad(true))).collect::<Result<_>>()?);
        d.dys.push(seeds.map(|k| random(dev, &[B, H], 5000 + k)).collect::<Result<_>>()?);
    }
    Ok(d)
}

/// Two blocks graphed for `order`; the graphed modules and their parameters.
fn graphed(dev: &Device, order: &[i32], chained: bool, reuse: bool) -> Result<(GraphedModules, Vec<Param>)> {
    let (a, b) = (Block::new(dev, H, H, 1)?, Block::new(dev, H, H, 2)?);
    let params = [a.params(), b.params()].concat();
    let x = random(dev, &[B, H], 7)?.with_requires_grad(true);
    let samples = vec![vec![vec![Some(x.clone())]], vec![vec![Some(x)]]];
    let opts = GraphOptions::new().warmup(2).order(order.to_vec()).chained(chained).reuse_buffers(reuse);
    Ok((make_graphed(vec![Box::new(a), Box::new(b)], samples, opts)?, params))
}

/// Every microbatch's output and input grad of each step, then the parameters and grads.
fn train(dev: &Device, order: &[i32], mode: &str, chained: bool, reuse: bool) -> Result<Vec<Vec<f32>>> {
    let microbatches = order.len() / 4;
    let d = data(dev, microbatches)?;
    let mut out = Vec::new();
    if mode == "eager" {
        let (mut a, mut b) = (Block::new(dev, H, H, 1)?, Block::new(dev, H, H, 2)?);
        let params = [a.params(), b.params()].concat();
        let sgd = Sgd::new(&params, SgdConfig { lr: 0.1, ..Default::default() })?;
        for s in 0..STEPS {
            let mut cxs: Vec<[Cx; 2]> = (0..microbatches).map(|_| [Cx::new(dev), Cx::new(dev)]).collect();
            let (mut ys, mut dxs) = (vec![Vec::new(); microbatches], vec![Vec::new(); microbatches]);
            let mut hs = vec![None; microbatches];
            let (mut f, mut bw) = ([0usize; 2], [0usize; 2]);
            let mut dhs = vec![None; microbatches];
            for &e in order {
                let c = e.unsigned_abs() as usize - 1;
                let m = if e > 0 { f[c] } else { bw[c] };
                match (e > 0, c) {
                    (true, 0) => hs[m] = Some(a.forward(&mut cxs[m][0], &d.xs[s][m])?),
                    (true, _) => ys[m] = b.forward(&mut cxs[m][1], hs[m].as_ref().expect("h"))?.to_vec()?,
                    (false, 1) => dhs[m] = b.backward(&mut cxs[m][1], &d.dys[s][m])?,
                    (false, _) => {
                        dxs[m] = a.backward(&mut cxs[m][0], dhs[m].as_ref().expect("dh"))?.expect("dx").to_vec()?
                    }
                }
                if e > 0 {
                    f[c] += 1
                } else {
                    bw[c] += 1
                }
            }
            out.extend(ys.into_iter().zip(dxs).flat_map(|(y, dx)| [y, dx]));
            sgd.step()?;
        }
        out.extend(params.iter().flat_map(|p| [p.value.to_vec(), p.grad.to_vec()]).collect::<Result<Vec<_>>>()?);
        return Ok(out);
    }
    let (g, params) = graphed(dev, order, chained, reuse)?;
    let sgd = Sgd::new(&params, SgdConfig { lr: 0.1, ..Default::default() })?;
    let mut runner = Runner::new(g, mode)?;
    for s in 0..STEPS {
        out.extend(runner.step(order, &d.xs[s], &d.dys[s])?);
        sgd.step()?;
    }
    out.extend(params.iter().flat_map(|p| [p.value.to_vec(), p.grad.to_vec()]).collect::<Result<Vec<_>>>()?);
    Ok(out)
}

/// Graphed modules run per call, fused, or as a one-member `Sequence`.
enum Runner {
    PerCall(GraphedModules),
    Fused(GraphedModules),
    Sequence(Sequence),
}

impl Runner {
    fn new(mut g: GraphedModules, mode: &str) -> Result<Runner> {
        Ok(match mode {
            "per-call" => Runner::PerCall(g),
            "fused" => {
                g.fuse()?;
                Runner::Fused(g)
            }
            _ => Runner::Sequence(Sequence::new(vec![g]).map_err(Error::from)?),
        })
    }

    /// One iteration; each microbatch's output and input grad.
    fn step(&mut self, order: &[i32], xs: &[Tensor], dys: &[Tensor]) -> Result<Vec<Vec<f32>>> {
        let microbatches = xs.len();
        let g = match self {
            Runner::PerCall(g) => return per_call(g, order, xs, dys),
            Runner::Fused(g) => g,
            Runner::Sequence(seq) => seq.member_mut(0),
        };
        for m in 0..microbatches {
            g.static_inputs(0, m)?[0].as_ref().expect("x").copy_(&xs[m])?;
            g.static_grad_outputs(1, m)?[0].as_ref().expect("dy").copy_(&dys[m])?;
        }
        match self {
            Runner::Fused(g) => g.step()?,
            Runner::Sequence(seq) => seq.step()?,
            Runner::PerCall(_) => unreachable!(),
        }
        let g = match self {
            Runner::Fused(g) => &*g,
            Runner::Sequence(seq) => seq.member(0),
            Runner::PerCall(_) => unreachable!(),
        };
        let mut out = Vec::new();
        for m in 0..microbatches {
            out.push(g.outputs(1, m)?[0].as_ref().expect("y").to_vec()?);
            out.push(g.grad_inputs(0, m)?[0].as_ref().expect("dx").to_vec()?);
        }
        Ok(out)
    }
}

/// One iteration of per-call replays in `order`, passing each output (and grad) on.
fn per_call(g: &mut GraphedModules, order: &[i32], xs: &[Tensor], dys: &[Tensor]) -> Result<Vec<Vec<f32>>> {
    let microbatches = xs.len();
    let (mut hs, mut dhs) = (vec![None; microbatches], vec![None; microbatches]);
    let (mut ys, mut dxs) = (vec![Vec::new(); microbatches], vec![Vec::new(); microbatches]);
    let (mut f, mut bw) = ([0usize; 2], [0usize; 2]);
    for &e in order {
        let c = e.unsigned_abs() as usize - 1;
        let m = if e > 0 { f[c] } else { bw[c] };
        match (e > 0, c) {
            (true, 0) => hs[m] = g.forward(0, &[Some(xs[m].clone())])?.remove(0),
            (true, _) => ys[m] = g.forward(1, &[hs[m].take()])?[0].as_ref().expect("y").to_vec()?,
            (false, 1) => dhs[m] = g.backward(1, &[Some(dys[m].clone())])?.remove(0),
            (false, _) => dxs[m] = g.backward(0, &[dhs[m].take()])?[0].as_ref().expect("dx").to_vec()?,
        }
        if e > 0 {
            f[c] += 1
        } else {
            bw[c] += 1
        }
    }
    Ok(ys.into_iter().zip(dxs).flat_map(|(y, dx)| [y, dx]).collect())
}

#[test]
fn reused_surfaces_per_call_fused_and_eager_agree_bitwise() {
    on_each_backend(|dev| {
        let order = windowed(4, 2);
        let eager = train(dev, &order, "eager", false, true)?;
        for chained in [false, true] {
            for reuse in [true, false] {
                let got = train(dev, &order, "per-call", chained, reuse)?;
                assert_eq!(got, eager, "per-call, chained {chained}, reuse {reuse}");
            }
        }
        for mode in ["fused", "sequence"] {
            for reuse in [true, false] {
                assert_eq!(train(dev, &order, mode, true, reuse)?, eager, "{mode}, reuse {reuse}");
            }
        }
        Ok(())
    });
}

#[test]
fn handles_to_a_reused_buffer_go_stale() {
    on_each_backend(|dev| {
        let order = windowed(4, 2);
        let (mut g, _) = graphed(dev, &order, false, true)?;
        assert_eq!((g.surface_sets(0), g.surface_sets(1)), (2, 2));
        assert!(g.outputs(0, 0)?[0].as_ref().expect("y").same_buffer(g.outputs(0, 2)?[0].as_ref().expect("y")));
        let d = data(dev, 4)?;
        let fwd = |g: &mut GraphedModules, c: usize, x: &Tensor| -> Result<Tensor> {
            Ok(g.forward(c, &[Some(x.clone())])?.remove(0).expect("output"))
        };
        // Microbatches 0 and 1 through both chunks, then microbatch 0's backwards.
        let h0 = fwd(&mut g, 0, &d.xs[0][0])?;
        let y0 = fwd(&mut g, 1, &h0)?;
        let h1 = fwd(&mut g, 0, &d.xs[0][1])?;
        fwd(&mut g, 1, &h1)?;
        let dh0 = g.backward(1, &[Some(d.dys[0][0].clone())])?.remove(0).expect("dh");
        let dx0 = g.backward(0, &[Some(dh0.clone())])?.remove(0).expect("dx");
        let (y0_value, dx0_value) = (y0.to_vec()?, dx0.to_vec()?);
        // Microbatch 2 reuses microbatch 0's buffers: its forwards overwrite h0 and y0.
        let h2 = fwd(&mut g, 0, &d.xs[0][2])?;
        assert!(matches!(h0.to_vec(), Err(Error::StaleTensor { .. })), "chunk 1's output of microbatch 0");
        // A refused call (a stale argument) changes nothing: the schedule goes on.
        assert!(matches!(g.forward(1, &[Some(h0.clone())]), Err(Error::StaleTensor { .. })));
        let y2 = fwd(&mut g, 1, &h2)?;
        assert!(matches!(y0.to_vec(), Err(Error::StaleTensor { .. })), "chunk 2's output of microbatch 0");
        assert_ne!(y2.to_vec()?, y0_value);
        // Microbatch 1's backwards, then microbatch 2's overwrite microbatch 0's input grads.
        let dh1 = g.backward(1, &[Some(d.dys[0][1].clone())])?.remove(0).expect("dh");
        g.backward(0, &[Some(dh1)])?;
        let h3 = fwd(&mut g, 0, &d.xs[0][3])?;
        fwd(&mut g, 1, &h3)?;
        assert_eq!(dx0.to_vec()?, dx0_value, "not overwritten yet");
        let dh2 = g.backward(1, &[Some(d.dys[0][2].clone())])?.remove(0).expect("dh");
        assert!(matches!(dh0.to_vec(), Err(Error::StaleTensor { .. })), "chunk 2's input grad of microbatch 0");
        g.backward(0, &[Some(dh2)])?;
        assert!(matches!(dx0.to_vec(), Err(Error::StaleTensor { .. })), "chunk 1's input grad of microbatch 0");
        Ok(())
    });
}

#[test]
fn a_buffer_the_schedule_still_reads_is_not_reused() {
    on_each_backend(|dev| {
        // Chunk 1's backward of microbatch 0 (reading chunk 2's input grad of it) comes after
        // chunk 2's forward of microbatch 1: chunk 2 may not hand microbatch 0's buffers on.
        let order = [1, 2, -2, 1, 2, -1, -2, -1];
        let (g, _) = graphed(dev, &order, false, true)?;
        assert_eq!((g.surface_sets(0), g.surface_sets(1)), (2, 2));
        assert!(!g.grad_inputs(1, 0)?[0]
            .as_ref()
            .expect("dh")
            .same_buffer(g.grad_inputs(1, 1)?[0].as_ref().expect("dh")));
        let eager = train(dev, &order, "eager", false, true)?;
        assert_eq!(train(dev, &order, "per-call", false, true)?, eager);
        assert_eq!(train(dev, &order, "per-call", true, true)?, eager);
        // Backward right after forward: one set of surfaces per chunk serves every microbatch.
        let order = [1, 2, -2, -1, 1, 2, -2, -1, 1, 2, -2, -1];
        let (g, _) = graphed(dev, &order, true, true)?;
        assert_eq!((g.surface_sets(0), g.surface_sets(1)), (1, 1));
        let eager = train(dev, &order, "eager", false, true)?;
        assert_eq!(train(dev, &order, "per-call", true, true)?, eager);
        assert_eq!(train(dev, &order, "fused", true, true)?, eager);
        Ok(())
    });
}

/// The pool's reserved bytes for two blocks of width 256 (64 KiB per surface) and `order`.
fn reserved(dev: &Device, order: &[i32], reuse: bool) -> Result<usize> {
    let (w, batch) = (256, 64);
    let mods: Vec<Box<dyn Module>> = vec![Box::new(Block::new(dev, w, w, 1)?), Box::new(Block::new(dev, w, w, 2)?)];
    let x = random(dev, &[batch, w], 3)?.with_requires_grad(true);
    let samples = vec![vec![vec![Some(x.clone())]], vec![vec![Some(x)]]];
    let opts = GraphOptions::new().warmup(1).order(order.to_vec()).reuse_buffers(reuse);
    Ok(make_graphed(mods, samples, opts)?.pool().stats().reserved)
}

#[test]
fn the_pool_grows_with_the_microbatches_in_flight_not_their_total() {
    on_each_backend(|dev| {
        let (off8, on8) = (reserved(dev, &windowed(8, 2), false)?, reserved(dev, &windowed(8, 2), true)?);
        let (off16, on16) = (reserved(dev, &windowed(16, 2), false)?, reserved(dev, &windowed(16, 2), true)?);
        assert!(on8 * 2 < off8, "8 microbatches: {on8} B with reuse, {off8} B without");
        assert!(on16 * 4 < off16, "16 microbatches: {on16} B with reuse, {off16} B without");
        assert!(off16 > off8 + off8 / 2, "without reuse the pool grows with the microbatches");
        assert!(on16 <= on8 + on8 / 10, "with reuse it does not: {on8} B for 8, {on16} B for 16");
        Ok(())
    });
}

#[test]
fn a_fused_step_binds_each_microbatch_and_its_old_handles_go_stale() {
    on_each_backend(|dev| {
        let order = windowed(4, 2);
        let (mut g, _) = graphed(dev, &order, true, true)?;
        let x = |g: &GraphedModules, m| -> Result<Tensor> { Ok(g.static_inputs(0, m)?.remove(0).expect("x")) };
        assert!(x(&g, 0)?.same_buffer(&x(&g, 2)?), "per call, microbatches 0 and 2 share their input");
        g.fuse()?;
        assert!(!x(&g, 0)?.same_buffer(&x(&g, 2)?), "a fused step binds each microbatch's own");
        g.step()?;
        let y0 = g.outputs(1, 0)?.remove(0).expect("y");
        let y2 = g.outputs(1, 2)?.remove(0).expect("y");
        assert!(!y0.same_buffer(&y2));
        y0.to_vec()?;
        g.step()?;
        assert!(matches!(y0.to_vec(), Err(Error::StaleTensor { .. })), "the next step overwrote it");
        // Per-call replays still run on the shared surfaces after fusing.
        let d = data(dev, 4)?;
        let got = per_call(&mut g, &order, &d.xs[0], &d.dys[0])?;
        assert_eq!(got.len(), 8);
        Ok(())
    });
}
