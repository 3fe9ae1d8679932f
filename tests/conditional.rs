//! Conditional graphs (WHILE and IF nodes whose condition the device sets): a body that counts
//! runs n times in one launch, zero times when the condition starts false, again after the
//! counter is reset; a decoding loop appends to a KV cache until a length; IF runs or skips;
//! an if/else is one node with an else body where the driver has them (nested ones too);
//! bodies and conditions that cannot work are refused with typed errors before anything runs.

mod common;
mod ops_support;

use common::{if_else_in_one_node, on_each_backend, random_vec};
use graphed::dist::{self, Communicator, ReduceOp};
use graphed::{ops, BodyNode, CaptureMode, Condition, ConditionalGraph, DType, Device, Error, Graph, Result, Tensor};
use ops_support::*;

/// A graph whose one op adds `by` to `counter`.
fn counting_body(dev: &Device, counter: &Tensor, by: &Tensor) -> Result<Graph> {
    let mut body = Graph::new(dev);
    body.set_label("count");
    body.capture(CaptureMode::Global, || ops::axpy_(counter, 1.0, by))?;
    Ok(body)
}

/// The counter example: the body increments a device counter, the condition is
/// `counter < n`, and ONE launch runs the body n times.
#[test]
fn a_while_loop_runs_its_body_until_the_condition_fails_in_one_launch() {
    on_each_backend(|dev| {
        let counter = Tensor::zeros(dev, &[1])?;
        let one = Tensor::full(dev, &[1], 1.0)?;
        let mut lp = counting_body(dev, &counter, &one)?.while_loop(&Condition::below(&counter, 10.0)?)?;
        assert!(lp.is_loop());
        lp.launch()?;
        assert_eq!(counter.to_vec()?, vec![10.0], "one launch, ten passes");
        // Tested before the first pass: a condition that starts false runs nothing.
        lp.launch()?;
        assert_eq!(counter.to_vec()?, vec![10.0]);
        // The condition is read on the device at every launch.
        counter.copy_from_slice(&[-3.5])?;
        lp.launch()?;
        assert_eq!(counter.to_vec()?, vec![10.5]);
        // The body graph is still the body: it replays on its own once given back.
        let mut body = lp.into_body();
        body.replay()?;
        assert_eq!(counter.to_vec()?, vec![11.5]);
        Ok(())
    });
}

/// An i32 counter (a KV cache length, counted up by kv_cache_append on the device): a decoding
/// loop that appends and attends until the cache holds n positions, in one launch.
#[test]
fn a_decoding_loop_fills_the_cache_up_to_a_length_in_one_launch() {
    on_each_backend(|dev| {
        let (max_len, d, dtype) = (32, 64, DType::BF16);
        let cache = || Tensor::zeros_as(dev, &[1, 1, max_len, d], dtype);
        let (kc, vc) = (cache()?, cache()?);
        let lengths = Tensor::from_i32(dev, &[0], &[1])?;
        let k = Tensor::from_slice_as(dev, &random_vec(d, 1), &[1, 1, d], dtype)?;
        let v = Tensor::from_slice_as(dev, &random_vec(d, 2), &[1, 1, d], dtype)?;
        let q = Tensor::from_slice_as(dev, &random_vec(2 * d, 3), &[1, 2, d], dtype)?;
        let mut body = Graph::new(dev);
        let out = body.capture(CaptureMode::Global, || {
            ops::kv_cache_append(&kc, &vc, &lengths, &k, &v)?;
            ops::decode_attention(&q, &kc, &vc, &lengths)
        })?;
        let mut lp = body.while_loop(&Condition::below(&lengths, 20.0)?)?;
        lp.launch()?;
        assert_eq!(lengths.to_i32_vec()?, vec![20]);
        // Every position holds the same key and value: the output is that value.
        let want: Vec<f32> = v.to_vec()?.repeat(2);
        let got = out.to_vec()?;
        let err = common::rel_err(&got, &want);
        assert!(err < 1e-2, "relative error {err}");
        Ok(())
    });
}

#[test]
fn if_then_runs_its_body_once_when_the_condition_holds() {
    on_each_backend(|dev| {
        let (x, one) = (Tensor::zeros(dev, &[1])?, Tensor::full(dev, &[1], 1.0)?);
        let flag = Tensor::from_i32(dev, &[0], &[1])?;
        let mut branch = counting_body(dev, &x, &one)?.if_then(&Condition::nonzero(&flag)?)?;
        assert!(!branch.is_loop());
        branch.launch()?;
        assert_eq!(x.to_vec()?, vec![0.0], "skipped");
        flag.copy_from_i32(&[7])?;
        branch.launch()?;
        branch.launch()?;
        assert_eq!(x.to_vec()?, vec![2.0], "once per launch");
        Ok(())
    });
}

/// A conditional graph replays inside the pool order of its body like the body itself, and
/// is refused during a capture.
#[test]
fn a_conditional_graph_launches_in_its_body_pool_order() {
    on_each_backend(|dev| {
        let counter = Tensor::zeros(dev, &[1])?;
        let one = Tensor::full(dev, &[1], 1.0)?;
        let pool = dev.new_pool();
        let mut first = Graph::with_pool(dev, &pool);
        first.capture(CaptureMode::Global, || ops::axpy_(&counter, 1.0, &one))?;
        let mut body = Graph::with_pool(dev, &pool);
        body.capture(CaptureMode::Global, || ops::axpy_(&counter, 1.0, &one))?;
        let mut lp = body.while_loop(&Condition::below(&counter, 4.0)?)?;
        // The body was captured second: the first graph is due.
        expect_err("out of order", lp.launch(), |e| matches!(e, Error::ReplayOrder { .. }))?;
        first.replay()?;
        lp.launch()?;
        assert_eq!(counter.to_vec()?, vec![4.0]);
        let mut outer = Graph::new(dev);
        let during = outer.capture(CaptureMode::Global, || lp.launch());
        expect_err("during a capture", during, |e| matches!(e, Error::IllegalDuringCapture { .. }))?;
        Ok(())
    });
}

#[test]
fn bad_bodies_and_conditions_are_refused_with_typed_errors() {
    on_each_backend(|dev| {
        let counter = Tensor::zeros(dev, &[1])?;
        let cond = Condition::below(&counter, 3.0)?;
        // An uncaptured body.
        let empty = Graph::new(dev);
        expect_err("uncaptured", ConditionalGraph::check_body(&empty, &cond), |e| {
            matches!(e, Error::NotCaptured { .. })
        })?;
        let refused = empty.while_loop(&cond).map(|_| ()).expect_err("uncaptured");
        assert!(matches!(refused.error(), Error::NotCaptured { .. }), "{}", refused.error());
        let empty = *refused.into_inner(); // the refusal hands the body back
        expect_err("uncaptured", ConditionalGraph::check_body(&empty, &cond), |e| {
            matches!(e, Error::NotCaptured { .. })
        })?;
        // Conditions: one f32 or i32 value.
        expect_err("two values", Condition::nonzero(&Tensor::zeros(dev, &[2])?), is_shape)?;
        let bf = Tensor::zeros_as(dev, &[1], DType::BF16)?;
        expect_err("bf16", Condition::below(&bf, 1.0), |e| matches!(e, Error::DType { .. }))?;
        // A condition on another device.
        if !dev.is_host() {
            let there = Condition::nonzero(&Tensor::zeros(&Device::host(), &[1])?)?;
            let body = counting_body(dev, &counter, &Tensor::full(dev, &[1], 1.0)?)?;
            expect_err("device", ConditionalGraph::check_body(&body, &there), |e| {
                matches!(e, Error::DeviceMismatch { .. })
            })?;
        }
        Ok(())
    });
}

/// A body with a collective (here an emulated rank's all-reduce, recorded on the host backend)
/// is refused: conditional bodies hold no collectives.
#[test]
fn a_body_with_a_collective_is_refused() -> Result<()> {
    let comms = Communicator::emulated(1, &dist::Config::default())?;
    let comm = &comms[0];
    let dev = comm.device();
    let t = Tensor::zeros(dev, &[4])?;
    let mut body = Graph::new(dev);
    body.set_label("reduce");
    body.capture(CaptureMode::Global, || comm.all_reduce(&t, ReduceOp::Sum))?;
    let cond = Condition::nonzero(&Tensor::zeros(dev, &[1])?)?;
    let refused = body.if_then(&cond).map(|_| ()).map_err(graphed::Error::from);
    expect_err("collective", refused, |e| {
        matches!(e, Error::ConditionalBody { graph, node: BodyNode::Collective { kernel, .. } }
                if graph == "reduce" && kernel.contains("all_reduce"))
    })
}

/// `Condition::run_if` inside a running capture: the work it captures runs at a replay only
/// where the condition holds, tested on the device at each replay, while the work around it
/// always runs; its value comes back. Outside a capture the closure just runs (its work must
/// honour the condition itself; nothing can skip a launch there).
#[test]
fn run_if_captures_work_that_runs_only_where_the_condition_holds() {
    on_each_backend(|dev| {
        let (flag, x, one) = (Tensor::zeros(dev, &[1])?, Tensor::zeros(dev, &[1])?, Tensor::full(dev, &[1], 1.0)?);
        let when = Condition::nonzero(&flag)?;
        // An eager call (and the warm-up that loads the condition kernel on CUDA).
        assert_eq!(when.run_if(|| ops::axpy_(&x, 100.0, &one).map(|()| 7))?, 7);
        assert_eq!(x.to_vec()?, vec![100.0]);
        x.copy_from_slice(&[0.0])?;
        let mut g = Graph::new(dev);
        let got = g.capture(CaptureMode::Global, || {
            let v = when.run_if(|| ops::axpy_(&x, 1.0, &one).map(|()| 5))?;
            ops::axpy_(&x, 10.0, &one)?;
            Ok(v)
        })?;
        assert_eq!(got, 5);
        assert_eq!(x.to_vec()?, vec![0.0], "capturing records");
        g.replay()?;
        assert_eq!(x.to_vec()?, vec![10.0], "flag 0: the body is skipped");
        flag.copy_from_slice(&[2.0])?;
        g.replay()?;
        assert_eq!(x.to_vec()?, vec![21.0], "flag 2: the body runs");
        flag.copy_from_slice(&[0.0])?;
        g.replay()?;
        assert_eq!(x.to_vec()?, vec![31.0]);
        Ok(())
    });
}

/// `run_if_else` takes one branch at each replay, the condition (an i32 below a limit here)
/// evaluated once before either; a `run_if` nested in a branch needs both conditions.
#[test]
fn run_if_else_takes_one_branch_and_nested_bodies_need_every_condition() {
    on_each_backend(|dev| {
        let step = Tensor::from_i32(dev, &[0], &[1])?;
        let inner = Tensor::zeros(dev, &[1])?;
        let (x, y, one) = (Tensor::zeros(dev, &[1])?, Tensor::zeros(dev, &[1])?, Tensor::full(dev, &[1], 1.0)?);
        let early = Condition::below(&step, 3.0)?;
        let nested = Condition::nonzero(&inner)?;
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || {
            early
                .run_if_else(
                    || {
                        ops::axpy_(&x, 1.0, &one)?;
                        nested.run_if(|| ops::axpy_(&x, 100.0, &one))
                    },
                    || ops::axpy_(&y, 1.0, &one),
                )
                .map(drop)
        })?;
        let mut want = (0.0, 0.0);
        for (s, inner_on) in [(0, 0.0), (2, 1.0), (3, 1.0), (7, 0.0), (1, 0.0)] {
            step.copy_from_i32(&[s])?;
            inner.copy_from_slice(&[inner_on])?;
            g.replay()?;
            match s < 3 {
                true => want.0 += 1.0 + if inner_on != 0.0 { 100.0 } else { 0.0 },
                false => want.1 += 1.0,
            }
            assert_eq!((x.to_vec()?[0], y.to_vec()?[0]), want, "step {s}, inner {inner_on}");
        }
        Ok(())
    });
}

/// An if/else captured on CUDA is one IF node with an else body where the driver has them
/// (CUDA 12.8), two IF nodes otherwise (or with `GRAPHED_IF_ELSE_NODE=0`), its condition(s) set
/// by one kernel; on the host one recorded op. An if/else nested in the else body takes the
/// right one of the three bodies at every replay.
#[test]
fn an_if_else_is_one_node_with_an_else_body_where_the_driver_has_them() {
    on_each_backend(|dev| {
        let (flag, inner, one) = (Tensor::zeros(dev, &[1])?, Tensor::zeros(dev, &[1])?, Tensor::full(dev, &[1], 1.0)?);
        let sums = [Tensor::zeros(dev, &[1])?, Tensor::zeros(dev, &[1])?, Tensor::zeros(dev, &[1])?];
        let (when, nested) = (Condition::nonzero(&flag)?, Condition::nonzero(&inner)?);
        let add = |i: usize| ops::axpy_(&sums[i], 1.0, &one);
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || {
            when.run_if_else(|| add(0), || nested.run_if_else(|| add(1), || add(2)).map(drop)).map(drop)
        })?;
        let nodes = g.nodes()?;
        let kernels: Vec<&str> = nodes.iter().filter_map(|n| n.kernel.as_deref()).collect();
        if dev.is_cuda() {
            let conditionals = nodes.iter().filter(|n| n.kind == graphed::NodeKind::Conditional).count();
            let (want, setter) = match if_else_in_one_node(dev) {
                true => (1, "graphed_set_conditional"),
                false => (2, "graphed_set_conditional2"),
            };
            assert_eq!((conditionals, kernels), (want, vec![setter]), "{nodes:?}");
        } else {
            assert_eq!(kernels, ["if_else"], "{nodes:?}");
        }
        let mut want = [0.0f32; 3];
        for (f, i) in [(1.0, 0.0), (0.0, 1.0), (0.0, 0.0), (2.0, 1.0), (0.0, 1.0), (0.0, 0.0)] {
            flag.copy_from_slice(&[f])?;
            inner.copy_from_slice(&[i])?;
            g.replay()?;
            want[if f != 0.0 {
                0
            } else if i != 0.0 {
                1
            } else {
                2
            }] += 1.0;
            let got = sums.iter().map(|t| Ok(t.to_vec()?[0])).collect::<Result<Vec<f32>>>()?;
            assert_eq!(got, want, "flag {f}, inner {i}");
        }
        Ok(())
    });
}

/// Misuse inside a body: ending the capture from inside is refused (the capture goes on; on the
/// host it ends normally, on CUDA it ends discarded with `CaptureInvalidated`, the failed branch's
/// node being impossible to take back out), a body that fails or panics leaves the stream
/// capturing the outer graph (the scoped capture then discards it) and usable afterwards.
#[test]
fn a_failing_body_leaves_the_capture_and_the_stream_usable() {
    on_each_backend(|dev| {
        let (flag, x, one) = (Tensor::full(dev, &[1], 1.0)?, Tensor::zeros(dev, &[1])?, Tensor::full(dev, &[1], 1.0)?);
        let when = Condition::nonzero(&flag)?;
        let mut g = Graph::new(dev);
        g.capture_begin(CaptureMode::Global)?;
        let refused = when.run_if(|| g.capture_end());
        assert!(matches!(refused, Err(Error::IllegalInConditionalBody { .. })), "{refused:?}");
        ops::axpy_(&x, 1.0, &one)?;
        if dev.is_cuda() {
            // CUDA cannot take the failed branch's node back out (its handle cannot be freed):
            // the capture ends discarded, with a typed error, and the stream is usable.
            let ended = g.capture_end();
            assert!(matches!(ended, Err(Error::CaptureInvalidated { .. })), "{ended:?}");
            assert!(!g.is_captured() && !graphed::is_capturing());
            g.capture(CaptureMode::Global, || ops::axpy_(&x, 1.0, &one))?;
        } else {
            g.capture_end()?;
        }
        g.replay()?;
        assert_eq!(x.to_vec()?, vec![1.0]);

        let mut failed = Graph::new(dev);
        let r = failed.capture(CaptureMode::Global, || when.run_if(|| Err::<(), _>(Error::msg("the body failed"))));
        assert!(matches!(&r, Err(Error::Msg(m)) if m == "the body failed"), "{r:?}");
        assert!(!failed.is_captured() && !graphed::is_capturing());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut p = Graph::new(dev);
            p.capture(CaptureMode::Global, || when.run_if(|| -> graphed::Result<()> { panic!("in the body") }))
        }));
        assert!(panicked.is_err() && !graphed::is_capturing());
        // The stream still captures and replays.
        let mut again = Graph::new(dev);
        again.capture(CaptureMode::Global, || when.run_if(|| ops::axpy_(&x, 1.0, &one)))?;
        again.replay()?;
        assert_eq!(x.to_vec()?, vec![2.0]);
        Ok(())
    });
}

/// A collective captured into a body is refused (conditional bodies hold none); the capture
/// it happened in is discarded.
#[test]
fn a_collective_in_a_run_if_body_is_refused() -> Result<()> {
    let comms = Communicator::emulated(1, &dist::Config::default())?;
    let comm = &comms[0];
    let dev = comm.device();
    let t = Tensor::zeros(dev, &[4])?;
    let when = Condition::nonzero(&Tensor::zeros(dev, &[1])?)?;
    let mut g = Graph::new(dev);
    let r = g.capture(CaptureMode::Global, || when.run_if(|| comm.all_reduce(&t, ReduceOp::Sum)));
    expect_err(
        "collective",
        r,
        |e| matches!(e, Error::ConditionalBody { node: BodyNode::Collective { kernel, .. }, .. } if kernel.contains("all_reduce")),
    )?;
    assert!(!g.is_captured());
    Ok(())
}

/// A WHILE node captured in the middle of a graph (`Condition::run_while`): work before it and
/// after it in the same graph, one launch; the loop runs as many passes as the value allows
/// (none too); an eager `run_while` (the host tests the value) gives the same bits.
#[test]
fn a_while_loop_inside_a_capture_runs_between_other_work_in_one_launch() {
    on_each_backend(|dev| {
        let (counter, one) = (Tensor::zeros(dev, &[1])?, Tensor::full(dev, &[1], 1.0)?);
        let (acc, x) = (Tensor::zeros(dev, &[64])?, Tensor::from_slice(dev, &random_vec(64, 3), &[64])?);
        let below = Condition::below(&counter, 7.0)?;
        let work = |start: f32| -> Result<()> {
            ops::fill_(&counter, start)?;
            ops::fill_(&acc, 0.0)?;
            below.run_while(|| {
                ops::axpy_(&acc, 0.5, &x)?;
                ops::axpy_(&counter, 1.0, &one)
            })?;
            ops::scale_(&acc, 3.0)
        };
        let mut g = Graph::new(dev);
        g.capture(CaptureMode::Global, || work(2.0))?;
        for (start, passes) in [(2.0f32, 5usize), (2.0, 5), (9.0, 0)] {
            if start != 2.0 {
                // Another start: a second graph (the start is baked into its fill).
                let mut h = Graph::new(dev);
                h.capture(CaptureMode::Global, || work(start))?;
                h.replay()?;
            } else {
                g.replay()?;
            }
            let got = acc.to_vec()?;
            assert_eq!(counter.to_vec()?, vec![start.max(7.0)]);
            work(start)?; // eagerly: the host reads the counter before each pass
            bitwise_eq(&format!("start {start}: replay vs eager"), &got, &acc.to_vec()?)?;
            let want: Vec<f32> =
                x.to_vec()?.iter().map(|&v| (0..passes).fold(0.0f32, |a, _| a + 0.5 * v) * 3.0).collect();
            bitwise_eq(&format!("start {start}: {passes} passes"), &got, &want)?;
        }
        Ok(())
    });
}
