//! Shape buckets declared with `#[graphed(buckets(...))]`: a struct so declared trains bit for
//! bit like the same struct captured with `GraphOptions::buckets` given explicitly, on inputs
//! of several sizes; buckets given at run time win over the attribute's; an impl declares
//! them too.

mod common;

use common::model::{Block, Mse};
use common::{on_each_backend, random_vec};
use graphed::{graphed, ops, AboveLargest, Buckets, Cx, Device, Error, GraphOptions, Param, Result, Tensor};

const H: usize = 8;
const SIZES: [usize; 3] = [4, 8, 16];

/// Two blocks and a loss, bucketed along the rows by the attribute.
#[graphed(warmup = 2, chained, buckets(axis = 0, sizes = [16, 4, 8], pad(1 = -0.5)))]
struct Declared {
    first: Block,
    second: Block,
    head: Mse,
}

/// The same model with no buckets in its attribute.
#[graphed(warmup = 2, chained)]
struct Plain {
    first: Block,
    second: Block,
    head: Mse,
}

/// `y = x · len`, `len` the call's real size read on the device: right only when the call
/// replays the bucket the attribute declares.
struct ScaleByLength;

#[graphed(warmup = 2, buckets(axis = 0, sizes = powers_of_two(min = 4, max = 16), above_largest = eager))]
impl ScaleByLength {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        let len = cx.bucket_length().cloned().map_or_else(|| Tensor::full(x.device(), &[1], x.dims()[0] as f32), Ok)?;
        let y = ops::scale(x, 1.0)?;
        ops::scale_by_(&y, &len)?;
        cx.save(&len);
        Ok(y)
    }

    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        let dx = ops::scale(dy, 1.0)?;
        ops::scale_by_(&dx, &cx.saved(0)?)?;
        Ok(Some(dx))
    }
}

/// `[n, H]` values from a seed.
fn rows(dev: &Device, n: usize, seed: u64) -> Result<Tensor> {
    Tensor::from_slice(dev, &random_vec(n * H, seed), &[n, H])
}

fn blocks(dev: &Device) -> Result<(Block, Block)> {
    Ok((Block::new(dev, H, H, 3)?, Block::new(dev, H, H, 4)?))
}

/// One SGD step on the blocks' parameters, grads zeroed after.
fn sgd(params: &[Param]) -> Result<()> {
    for p in params {
        ops::axpy_(&p.value, -0.1, &p.grad)?;
        p.zero_grad()?;
    }
    Ok(())
}

/// Per step: the loss, and every parameter after the update.
type Trace = Vec<(Vec<f32>, Vec<Vec<f32>>)>;

/// The sizes the tests train on: both ends of two buckets, out of order.
const STEPS: [usize; 6] = [16, 5, 3, 16, 12, 8];

fn trace_step(loss: &Tensor, params: &[Param]) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
    sgd(params)?;
    Ok((loss.to_vec()?, params.iter().map(|p| p.value.to_vec()).collect::<Result<_>>()?))
}

fn train_declared(g: &mut GraphedDeclared, dev: &Device) -> Result<Trace> {
    let dloss = Tensor::full(dev, &[1], 1.0)?;
    let params = [g.module_first().params(), g.module_second().params()].concat();
    let mut trace = Vec::new();
    for (step, n) in STEPS.into_iter().enumerate() {
        let (x, target) = (rows(dev, n, step as u64)?, rows(dev, n, 100 + step as u64)?);
        let loss = g.forward(DeclaredInputs { x }, DeclaredExtraInputs { target })?.output_0;
        g.backward(DeclaredGradOutputs { dloss: dloss.clone() })?;
        trace.push(trace_step(&loss, &params)?);
    }
    Ok(trace)
}

fn train_plain(g: &mut GraphedPlain, dev: &Device) -> Result<Trace> {
    let dloss = Tensor::full(dev, &[1], 1.0)?;
    let params = [g.module_first().params(), g.module_second().params()].concat();
    let mut trace = Vec::new();
    for (step, n) in STEPS.into_iter().enumerate() {
        let (x, target) = (rows(dev, n, step as u64)?, rows(dev, n, 100 + step as u64)?);
        let loss = g.forward(PlainInputs { x }, PlainExtraInputs { target })?.output_0;
        g.backward(PlainGradOutputs { dloss: dloss.clone() })?;
        trace.push(trace_step(&loss, &params)?);
    }
    Ok(trace)
}

fn declared(dev: &Device) -> Result<Declared> {
    let (first, second) = blocks(dev)?;
    Ok(Declared { first, second, head: Mse })
}

fn plain(dev: &Device) -> Result<Plain> {
    let (first, second) = blocks(dev)?;
    Ok(Plain { first, second, head: Mse })
}

/// Samples at the largest bucket's size.
fn samples(dev: &Device) -> Result<(Tensor, Tensor)> {
    Ok((rows(dev, 16, 1)?, rows(dev, 16, 2)?))
}

fn sizes(reports: &[graphed::BucketReport]) -> Vec<usize> {
    reports.iter().map(|r| r.size).collect()
}

#[test]
fn declared_buckets_train_bit_for_bit_like_explicit_ones() {
    on_each_backend(|dev| {
        let (x, target) = samples(dev)?;
        let mut g = declared(dev)?
            .make_graphed(DeclaredInputs { x: x.clone() }, DeclaredExtraInputs { target: target.clone() })?;
        assert_eq!(sizes(g.inner().bucket_reports()), SIZES);
        let explicit = GraphedPlain::options().buckets(Buckets::new(0, SIZES).pad(1, -0.5));
        let mut reference = GraphedPlain::new(plain(dev)?, PlainInputs { x }, PlainExtraInputs { target }, explicit)?;
        let got = train_declared(&mut g, dev)?;
        let want = train_plain(&mut reference, dev)?;
        assert_eq!(got.len(), STEPS.len());
        for (step, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(got, want, "step {step} ({} rows) on {}", STEPS[step], dev.name());
        }
        assert_eq!(g.inner().active_bucket(), Some(8));
        Ok(())
    });
}

#[test]
fn buckets_given_at_run_time_win_over_the_attribute() {
    let dev = Device::host();
    assert_eq!(GraphedDeclared::buckets(), Buckets::new(0, SIZES).pad(1, -0.5));
    assert_eq!(GraphedDeclared::options().bucket_spec(), Some(&GraphedDeclared::buckets()));
    assert!(GraphedPlain::options().bucket_spec().is_none());
    let (x, target) = samples(&dev).expect("samples");
    let sample = || (DeclaredInputs { x: x.clone() }, DeclaredExtraInputs { target: target.clone() });
    // Options without buckets get the attribute's.
    let (inputs, extras) = sample();
    let g = GraphedDeclared::new(declared(&dev).expect("model"), inputs, extras, GraphOptions::new().warmup(1))
        .expect("captured");
    assert_eq!(sizes(g.inner().bucket_reports()), SIZES);
    // Options with buckets keep theirs.
    let (inputs, extras) = sample();
    let own = GraphOptions::new().buckets(Buckets::step(0, 8, 16));
    let g = GraphedDeclared::new(declared(&dev).expect("model"), inputs, extras, own).expect("captured");
    assert_eq!(sizes(g.inner().bucket_reports()), [8, 16]);
}

#[test]
fn an_impl_declares_buckets_too() {
    on_each_backend(|dev| {
        assert_eq!(
            GraphedScaleByLength::buckets(),
            Buckets::powers_of_two(0, 4, 16).above_largest(AboveLargest::Eager)
        );
        let mut g = ScaleByLength.make_graphed(&rows(dev, 16, 1)?.with_requires_grad(true))?;
        assert_eq!(sizes(g.inner().bucket_reports()), SIZES);
        // 20 rows are above the largest bucket: eager, as the attribute says.
        for n in [3, 16, 11, 20, 1] {
            let x = rows(dev, n, n as u64)?.with_requires_grad(true);
            let y = g.forward(&x)?;
            let want: Vec<f32> = x.to_vec()?.iter().map(|v| v * n as f32).collect();
            assert_eq!(y.to_vec()?, want, "{n} rows on {}", dev.name());
            let dx = g.backward(&x)?.ok_or_else(|| Error::msg("dx"))?;
            assert_eq!(dx.to_vec()?, want, "the backward reads the same length");
        }
        // Given at run time, the options' buckets win here too.
        let own = GraphedScaleByLength::options().buckets(Buckets::new(0, [16]));
        let g = GraphedScaleByLength::new(
            ScaleByLength,
            ScaleByLengthInputs { x: rows(dev, 16, 1)?.with_requires_grad(true) },
            own,
        )?;
        assert_eq!(sizes(g.inner().bucket_reports()), [16]);
        Ok(())
    });
}
