//! make_graphed semantics (the README's Semantics list), through `#[graphed]` modules, on each backend:
//! hooks, parity with eager, interleaved pipelines, None outputs, forward-only, train/eval,
//! unused inputs, grad accumulation, stale handles, replay order, warm-up and RNG.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use common::model::{Block, BlockGradOutputs, BlockInputs, GraphedStack, Stack};
use common::{on_each_backend, random};
use graphed::optim::{Sgd, SgdConfig};
use graphed::{
    capture_time_hook, graphed, make_graphed, ops, Cx, Device, Error, GraphOptions, HookKind, HookRegistry, Module,
    Param, Result, Tensor,
};

type Log = Arc<Mutex<Vec<(usize, &'static str, bool)>>>;

/// `y = x W^T + b` that logs its capture-time hooks.
pub struct Logged {
    id: usize,
    lin: Block,
    log: Log,
    fail_pre_backward_at: Option<usize>,
    calls: usize,
}

impl Logged {
    fn new(dev: &Device, id: usize, log: &Log) -> Result<Logged> {
        Ok(Logged {
            id,
            lin: Block::new(dev, 8, 8, 10 + id as u64)?,
            log: log.clone(),
            fail_pre_backward_at: None,
            calls: 0,
        })
    }
    fn record(&mut self, kind: &'static str) {
        self.log.lock().unwrap().push((self.id, kind, graphed::is_capturing()));
    }
}

#[graphed(warmup = 2)]
impl Logged {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        self.lin.forward(cx, x)
    }
    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        self.lin.backward(cx, dy)
    }
    #[capture_time_hook(pre_forward)]
    fn pre_forward(&mut self) {
        self.record("pre_forward");
    }
    #[capture_time_hook(forward)]
    fn forward_hook(&mut self) {
        self.record("forward");
    }
    #[capture_time_hook(pre_backward)]
    fn pre_backward(&mut self) -> Result<()> {
        self.calls += 1;
        if Some(self.calls) == self.fail_pre_backward_at {
            return Err(Error::msg("unshard failed"));
        }
        self.record("pre_backward");
        Ok(())
    }
    #[capture_time_hook(backward)]
    fn backward_hook(&mut self) {
        self.record("backward");
    }
}

#[graphed(warmup = 2, order = [1, 2, -2, -1])]
struct TwoLoggedOrdered {
    first: Logged,
    second: Logged,
}

fn one_iteration() -> Vec<(usize, &'static str, bool)> {
    [
        (0, "pre_forward"),
        (0, "forward"),
        (1, "pre_forward"),
        (1, "forward"),
        (1, "pre_backward"),
        (1, "backward"),
        (0, "pre_backward"),
        (0, "backward"),
    ]
    .into_iter()
    .map(|(i, k)| (i, k, false))
    .collect()
}

fn hook_run(dev: &Device, ordered: bool) -> Result<()> {
    let log: Log = Arc::default();
    let x = random(dev, &[4, 8], 1)?;
    let h = random(dev, &[4, 8], 2)?.with_requires_grad(true);
    let mut g = if ordered {
        TwoLoggedOrdered { first: Logged::new(dev, 0, &log)?, second: Logged::new(dev, 1, &log)? }
            .make_graphed(vec![vec![vec![Some(x.clone())]], vec![vec![Some(h.clone())]]])?
            .into_inner()
    } else {
        let mods: Vec<Box<dyn Module>> =
            vec![Box::new(Logged::new(dev, 0, &log)?), Box::new(Logged::new(dev, 1, &log)?)];
        make_graphed(
            mods,
            vec![vec![vec![Some(x.clone())]], vec![vec![Some(h.clone())]]],
            GraphOptions::new().warmup(2),
        )?
    };
    let want: Vec<_> = (0..3).flat_map(|_| one_iteration()).collect();
    assert_eq!(*log.lock().unwrap(), want, "2 warm-up iterations + 1 capture, never inside a capture");
    // Replays run no hooks.
    for _ in 0..2 {
        let y = g.forward(0, &[Some(x.clone())])?.remove(0);
        let z = g.forward(1, &[y])?.remove(0);
        let d = g.backward(1, &[z])?.remove(0);
        g.backward(0, &[d])?;
    }
    assert_eq!(log.lock().unwrap().len(), want.len(), "replays must not run hooks");
    Ok(())
}

#[test]
fn hooks_run_per_warmup_iteration_and_once_for_capture_never_on_replay() {
    on_each_backend(|dev| {
        hook_run(dev, false)?;
        hook_run(dev, true)
    });
}

/// Two declared pre_forward hooks, the second with `prepend`.
pub struct Prepended {
    lin: Block,
    log: Arc<Mutex<Vec<&'static str>>>,
}

#[graphed(warmup = 1)]
impl Prepended {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        self.lin.forward(cx, x)
    }
    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        self.lin.backward(cx, dy)
    }
    #[capture_time_hook(pre_forward)]
    fn declared_first(&mut self) {
        self.log.lock().unwrap().push("declared first");
    }
    #[capture_time_hook(pre_forward, prepend)]
    fn declared_prepended(&mut self) {
        self.log.lock().unwrap().push("declared prepend");
    }
}

#[test]
fn prepend_puts_a_hook_first_declared_and_registered() {
    on_each_backend(|dev| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let hooks = HookRegistry::new();
        let (l1, l2, l3) = (log.clone(), log.clone(), log.clone());
        let _a = hooks.register(0, HookKind::PreForward, false, move || {
            l1.lock().unwrap().push("registered append");
            Ok(())
        });
        let _b = hooks.register(0, HookKind::PreForward, true, move || {
            l2.lock().unwrap().push("registered prepend");
            Ok(())
        });
        let removed = hooks.register(0, HookKind::PreForward, false, move || {
            l3.lock().unwrap().push("removed");
            Ok(())
        });
        removed.remove();
        let x = random(dev, &[2, 8], 3)?;
        let m = Prepended { lin: Block::new(dev, 8, 8, 5)?, log: log.clone() };
        let _g = GraphedPrepended::new(m, PrependedInputs { x }, GraphedPrepended::options().hooks(&hooks))?;
        let got = log.lock().unwrap().clone();
        let one = ["registered prepend", "declared prepend", "declared first", "registered append"];
        assert_eq!(got, [one, one].concat(), "warm-up 1 + capture");
        Ok(())
    });
}

#[test]
fn a_failing_hook_aborts_the_capture_cleanly() {
    on_each_backend(|dev| {
        let log: Log = Arc::default();
        let x = random(dev, &[4, 8], 1)?;
        let mut m = Logged::new(dev, 0, &log)?;
        m.fail_pre_backward_at = Some(3); // warm-up 2 succeed, the capture's fails
        let Err(err) = m.make_graphed(&x) else { panic!("the capture must fail") };
        assert!(err.to_string().contains("unshard failed"), "{err}");
        assert!(err.to_string().contains("pre_backward hook"), "{err}");
        assert!(!dev.is_capturing() && !graphed::is_capturing());
        // The stream is usable and a new capture works.
        let y = ops::scale(&x, 2.0)?;
        assert_eq!(y.to_vec()?, x.to_vec()?.iter().map(|v| v * 2.0).collect::<Vec<_>>());
        let mut g = Logged::new(dev, 0, &log)?.make_graphed(&x)?;
        g.forward(&x)?;
        Ok(())
    });
}

/// Three eager/graphed flavours of the same 3-layer model.
enum Flavour {
    Eager(Stack),
    Whole(GraphedStack),
    PerLayer(graphed::GraphedModules),
}

impl Flavour {
    fn step(&mut self, dev: &Device, x: &Tensor, dy: &Tensor) -> Result<Vec<f32>> {
        let mut cx = Cx::new(dev);
        match self {
            Flavour::Eager(s) => {
                let y = s.forward(&mut cx, x)?;
                s.backward(&mut cx, dy)?;
                y.to_vec()
            }
            Flavour::Whole(g) => {
                let y = g.forward(x)?;
                let v = y.to_vec()?;
                g.backward(dy)?;
                Ok(v)
            }
            Flavour::PerLayer(g) => {
                let mut h = Some(x.clone());
                for i in 0..3 {
                    h = g.forward(i, &[h])?.remove(0);
                }
                let v = h.as_ref().expect("output").to_vec()?;
                let mut d = Some(dy.clone());
                for i in (0..3).rev() {
                    d = g.backward(i, &[d])?.remove(0);
                }
                Ok(v)
            }
        }
    }
}

#[test]
fn parity_eager_whole_and_per_layer_are_bitwise_equal_over_sgd_steps() {
    on_each_backend(|dev| {
        let xs: Vec<Tensor> = (0..2).map(|m| random(dev, &[5, 16], 100 + m)).collect::<Result<_>>()?;
        let dys: Vec<Tensor> = (0..2).map(|m| random(dev, &[5, 16], 200 + m)).collect::<Result<_>>()?;
        let mut results = Vec::new();
        for flavour in 0..3 {
            let stack = Stack::new(dev, 3, 16, 42)?;
            let params = stack.params();
            let sgd = Sgd::new(&params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?;
            let mut f = match flavour {
                0 => Flavour::Eager(stack),
                1 => Flavour::Whole(stack.make_graphed(&xs[0])?),
                _ => {
                    let mods: Vec<Box<dyn Module>> =
                        stack.blocks.into_iter().map(|b| Box::new(b) as Box<dyn Module>).collect();
                    let h = Tensor::zeros(dev, &[5, 16])?.with_requires_grad(true);
                    let samples =
                        vec![vec![vec![Some(xs[0].clone())]], vec![vec![Some(h.clone())]], vec![vec![Some(h)]]];
                    Flavour::PerLayer(make_graphed(mods, samples, GraphOptions::new().warmup(3))?)
                }
            };
            let mut outs = Vec::new();
            for _step in 0..3 {
                sgd.zero_grad()?;
                for m in 0..2 {
                    outs.push(f.step(dev, &xs[m], &dys[m])?);
                }
                let grads: Vec<Vec<f32>> = params.iter().map(|p| p.grad.to_vec()).collect::<Result<_>>()?;
                outs.extend(grads);
                sgd.step()?;
            }
            outs.extend(params.iter().map(|p| p.value.to_vec()).collect::<Result<Vec<_>>>()?);
            results.push(outs);
        }
        assert_eq!(results[0], results[1], "whole-model graph differs from eager");
        assert_eq!(results[0], results[2], "per-layer graphs differ from eager");
        Ok(())
    });
}

#[graphed(warmup = 2, order = [1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1])]
struct Interleaved {
    first: Block,
    second: Block,
}

/// The two-chunk pipeline, graphed or run eagerly by hand with a FIFO of contexts per chunk.
#[allow(clippy::large_enum_variant)] // test code: one value per run
enum Pipe {
    Graphed(GraphedInterleaved),
    Eager { first: Block, second: Block, cx1: VecDeque<Cx>, cx2: VecDeque<Cx> },
}

impl Pipe {
    fn forward(&mut self, dev: &Device, chunk: i32, x: &Tensor) -> Result<Tensor> {
        let mut cx = Cx::new(dev);
        match (self, chunk) {
            (Pipe::Graphed(g), 1) => Ok(g.forward_first(BlockInputs { x: x.clone() })?.output_0),
            (Pipe::Graphed(g), _) => Ok(g.forward_second(BlockInputs { x: x.clone() })?.output_0),
            (Pipe::Eager { first, cx1, .. }, 1) => {
                let y = first.forward(&mut cx, x)?;
                cx1.push_back(cx);
                Ok(y)
            }
            (Pipe::Eager { second, cx2, .. }, _) => {
                let y = second.forward(&mut cx, x)?;
                cx2.push_back(cx);
                Ok(y)
            }
        }
    }

    fn backward(&mut self, chunk: i32, dy: &Tensor) -> Result<Option<Tensor>> {
        match (self, chunk) {
            (Pipe::Graphed(g), 1) => Ok(g.backward_first(BlockGradOutputs { dy: dy.clone() })?.x),
            (Pipe::Graphed(g), _) => Ok(g.backward_second(BlockGradOutputs { dy: dy.clone() })?.x),
            (Pipe::Eager { first, cx1, .. }, 1) => first.backward(&mut cx1.pop_front().expect("fifo"), dy),
            (Pipe::Eager { second, cx2, .. }, _) => second.backward(&mut cx2.pop_front().expect("fifo"), dy),
        }
    }
}

#[test]
fn interleaved_pipeline_matches_the_same_schedule_run_eagerly() {
    const ORDER: [i32; 12] = [1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1];
    on_each_backend(|dev| {
        let xs: Vec<Tensor> = (0..3).map(|m| random(dev, &[4, 8], 300 + m)).collect::<Result<_>>()?;
        let dys: Vec<Tensor> = (0..3).map(|m| random(dev, &[4, 8], 400 + m)).collect::<Result<_>>()?;
        let run = |graphed: bool| -> Result<Vec<Vec<f32>>> {
            let (first, second) = (Block::new(dev, 8, 8, 7)?, Block::new(dev, 8, 8, 8)?);
            let params: Vec<Param> = first.params().into_iter().chain(second.params()).collect();
            let sgd = Sgd::new(&params, SgdConfig { lr: 0.05, ..Default::default() })?;
            let mut pipe = if graphed {
                let h = Tensor::zeros(dev, &[4, 8])?.with_requires_grad(true);
                let samples = vec![xs.iter().map(|x| vec![Some(x.clone())]).collect(), vec![vec![Some(h)]]];
                Pipe::Graphed(Interleaved { first, second }.make_graphed(samples)?)
            } else {
                Pipe::Eager { first, second, cx1: VecDeque::new(), cx2: VecDeque::new() }
            };
            let (mut out, mut acts, mut grads) = (Vec::new(), VecDeque::new(), VecDeque::new());
            let (mut f1, mut b2) = (0, 0);
            for &e in &ORDER {
                match e {
                    1 => {
                        acts.push_back(pipe.forward(dev, 1, &xs[f1])?.with_requires_grad(true));
                        f1 += 1;
                    }
                    2 => {
                        let h = acts.pop_front().expect("chunk 1 ran");
                        out.push(pipe.forward(dev, 2, &h)?.to_vec()?);
                    }
                    -2 => {
                        grads.push_back(pipe.backward(2, &dys[b2])?.expect("grad of chunk 2's input"));
                        b2 += 1;
                    }
                    _ => {
                        let d = grads.pop_front().expect("chunk 2's backward ran");
                        pipe.backward(1, &d)?;
                    }
                }
            }
            out.extend(params.iter().map(|p| p.grad.to_vec()).collect::<Result<Vec<_>>>()?);
            sgd.step()?;
            out.extend(params.iter().map(|p| p.value.to_vec()).collect::<Result<Vec<_>>>()?);
            Ok(out)
        };
        assert_eq!(run(true)?, run(false)?, "pipeline graphs differ from the eager schedule");
        Ok(())
    });
}
