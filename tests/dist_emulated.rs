//! Several ranks on the host backend (threads sharing memory): collectives, capture and
//! replay of collectives, data-parallel parity with gradient accumulation, and every failure
//! (mismatch, timeout, dead peer, different layouts) as a typed error on every rank.

mod common;
mod dist_programs;

use std::time::{Duration, Instant};

use common::model::{Block, Stack};
use graphed::dist::{self, Config, DataParallel, ReduceOp};
use graphed::{AbortReason, CaptureMode, Collective, DistError, Error, Graph, Module, Result, Tensor};

fn quick() -> Config {
    Config::default().timeout(Duration::from_millis(500))
}

#[test]
fn collectives_on_three_ranks() -> Result<()> {
    let out = dist::run_emulated(3, |comm| {
        let (dev, r) = (comm.device().clone(), comm.rank() as f32);
        let t = Tensor::from_slice(&dev, &[r, 10.0 * r], &[2])?;
        comm.all_reduce(&t, ReduceOp::Sum)?;
        let avg = Tensor::full(&dev, &[2], r)?;
        comm.all_reduce(&avg, ReduceOp::Avg)?;
        let gathered = Tensor::zeros(&dev, &[6])?;
        comm.all_gather(&Tensor::from_slice(&dev, &[r, -r], &[2])?, &gathered)?;
        let scattered = Tensor::zeros(&dev, &[1])?;
        comm.reduce_scatter(&Tensor::from_slice(&dev, &[1.0, 2.0, 3.0], &[3])?, &scattered, ReduceOp::Sum)?;
        let b = Tensor::full(&dev, &[2], r + 5.0)?;
        comm.broadcast(&b, 2)?;
        comm.barrier()?;
        Ok([t.to_vec()?, avg.to_vec()?, gathered.to_vec()?, scattered.to_vec()?, b.to_vec()?])
    })?;
    for (rank, o) in out.iter().enumerate() {
        assert_eq!(o[0], vec![3.0, 30.0]);
        assert_eq!(o[1], vec![1.0, 1.0]);
        assert_eq!(o[2], vec![0.0, -0.0, 1.0, -1.0, 2.0, -2.0]);
        assert_eq!(o[3], vec![3.0 * (rank as f32 + 1.0)]);
        assert_eq!(o[4], vec![7.0, 7.0]);
    }
    Ok(())
}

#[test]
fn send_recv_ring_and_bucket() -> Result<()> {
    let out = dist::run_emulated(2, |comm| {
        let dev = comm.device().clone();
        let peer = 1 - comm.rank();
        let mine = Tensor::full(&dev, &[3], comm.rank() as f32 + 1.0)?;
        let theirs = Tensor::zeros(&dev, &[3])?;
        // A send completes when its receive does (as NCCL's may): rank 0 sends first.
        if comm.rank() == 0 {
            comm.send(&mine, peer)?;
            comm.recv(&theirs, peer)?;
        } else {
            comm.recv(&theirs, peer)?;
            comm.send(&mine, peer)?;
        }
        let (a, b) = (Tensor::full(&dev, &[2], 1.0)?, Tensor::full(&dev, &[5], comm.rank() as f32)?);
        comm.all_reduce_bucket(&[a.clone(), b.clone()], ReduceOp::Sum)?;
        Ok((theirs.to_vec()?, a.to_vec()?, b.to_vec()?))
    })?;
    assert_eq!(out[0].0, vec![2.0; 3]);
    assert_eq!(out[1].0, vec![1.0; 3]);
    for o in &out {
        assert_eq!((o.1.clone(), o.2.clone()), (vec![2.0; 2], vec![1.0; 5]));
    }
    Ok(())
}

#[test]
fn collectives_are_captured_and_replayed() -> Result<()> {
    let out = dist::run_emulated(2, |comm| {
        let dev = comm.device().clone();
        let x = Tensor::zeros(&dev, &[4])?;
        let y = Tensor::zeros(&dev, &[4])?;
        let mut g = Graph::new(&dev);
        // Captured, not run: the peers only meet on replay.
        g.capture(CaptureMode::Global, || {
            y.copy_(&x)?;
            comm.all_reduce(&y, ReduceOp::Sum)
        })?;
        assert_eq!(y.to_vec()?, vec![0.0; 4], "a capture must not run the collective");
        let mut seen = Vec::new();
        for step in 0..3 {
            x.copy_from_slice(&[(comm.rank() * 10 + step) as f32; 4])?;
            g.replay()?;
            seen.push(y.to_vec()?[0]);
        }
        Ok(seen)
    })?;
    assert_eq!(out[0], vec![10.0, 12.0, 14.0]);
    assert_eq!(out[1], out[0]);
    Ok(())
}

#[test]
fn refused_calls_change_nothing() -> Result<()> {
    dist::run_emulated(2, |comm| {
        let dev = comm.device().clone();
        let t = Tensor::full(&dev, &[2], 1.0)?;
        assert!(matches!(comm.send(&t, comm.rank()), Err(Error::Dist(DistError::Peer { op: "send", .. }))));
        assert!(matches!(comm.recv(&t, 7), Err(Error::Dist(DistError::Peer { peer: 7, world: 2, .. }))));
        assert!(matches!(comm.broadcast(&t, 2), Err(Error::Dist(DistError::Root { root: 2, world: 2, .. }))));
        assert!(matches!(comm.all_gather(&t, &Tensor::zeros(&dev, &[3])?), Err(Error::Shape { .. })));
        let other = Tensor::zeros(&graphed::Device::host(), &[2])?;
        assert!(matches!(
            comm.all_reduce(&other, ReduceOp::Sum),
            Err(Error::Dist(DistError::Device { param: None, .. }))
        ));
        // The group is still healthy: the refused calls never reached the peers.
        comm.all_reduce(&t, ReduceOp::Sum)?;
        assert_eq!(t.to_vec()?, vec![2.0; 2]);
        Ok(())
    })?;
    Ok(())
}

#[test]
fn different_collectives_fail_on_every_rank() -> Result<()> {
    let results = dist::run_emulated_each(2, &quick(), |comm| {
        let t = Tensor::zeros(comm.device(), &[2 + comm.rank()])?;
        comm.all_reduce(&t, ReduceOp::Sum)
    })?;
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(Error::Dist(graphed::DistError::CollectiveMismatch { rank: got, issued })) => {
                assert_eq!(*got, rank);
                let sizes = [2, 3].map(|elements| Collective::AllReduce { elements, op: ReduceOp::Sum });
                assert!(sizes.iter().all(|c| issued.contains(c)), "{issued:?}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn a_receive_of_another_size_than_its_send_fails_typed() -> Result<()> {
    let results = dist::run_emulated_each(2, &quick(), |comm| {
        let t = Tensor::zeros(comm.device(), &[2 + comm.rank()])?;
        if comm.rank() == 0 {
            comm.send(&t, 1)?;
        } else {
            comm.recv(&t, 0)?;
        }
        comm.barrier()
    })?;
    assert!(
        matches!(
            results[1],
            Err(Error::Dist(DistError::TransferSizeMismatch { rank: 1, peer: 0, sent: 2, expected: 3 }))
        ),
        "{:?}",
        results[1]
    );
    let reason = AbortReason::TransferSizeMismatch { sender: 0, receiver: 1, sent: 2, expected: 3 };
    assert!(
        matches!(&results[0], Err(Error::Dist(DistError::CommAborted { rank: 0, reason: r })) if *r == reason),
        "{:?}",
        results[0]
    );
    Ok(())
}

#[test]
fn a_missing_peer_times_out_and_later_calls_see_the_abort() -> Result<()> {
    let started = Instant::now();
    let results = dist::run_emulated_each(2, &quick(), |comm| {
        let t = Tensor::zeros(comm.device(), &[2])?;
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(900));
            return comm.all_reduce(&t, ReduceOp::Sum);
        }
        comm.all_reduce(&t, ReduceOp::Sum)
    })?;
    assert!(
        matches!(results[0], Err(Error::Dist(graphed::DistError::CommTimeout { rank: 0, op: "all_reduce", .. }))),
        "{:?}",
        results[0]
    );
    assert!(
        matches!(results[1], Err(Error::Dist(graphed::DistError::CommAborted { rank: 1, .. }))),
        "{:?}",
        results[1]
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    Ok(())
}

#[test]
fn two_sends_facing_each_other_time_out_instead_of_hanging() -> Result<()> {
    let results = dist::run_emulated_each(2, &quick(), |comm| {
        let t = Tensor::zeros(comm.device(), &[2])?;
        comm.send(&t, 1 - comm.rank())?;
        comm.recv(&t, 1 - comm.rank())
    })?;
    let timeouts = results
        .iter()
        .filter(|r| matches!(r, Err(Error::Dist(graphed::DistError::CommTimeout { op: "send", .. }))))
        .count();
    assert!(timeouts >= 1, "{results:?}");
    assert!(results.iter().all(|r| matches!(
        r,
        Err(Error::Dist(graphed::DistError::CommTimeout { .. }) | Error::Dist(graphed::DistError::CommAborted { .. }))
    )));
    Ok(())
}

/// What deadlocks as two sends completes as one group each: every transfer is posted, then
/// all complete; captured, the group runs on every replay. Three ranks in a ring too.
#[test]
fn sends_and_receives_grouped_meet_facing_each_other() -> Result<()> {
    use graphed::dist::P2pOp;
    let out = dist::run_emulated_each(2, &quick(), |comm| {
        let dev = comm.device().clone();
        let peer = 1 - comm.rank();
        let (mine, theirs) = (Tensor::zeros(&dev, &[3])?, Tensor::zeros(&dev, &[3])?);
        let group = [P2pOp::Send(mine.clone(), peer), P2pOp::Recv(theirs.clone(), peer)];
        let mut g = Graph::new(&dev);
        g.capture(CaptureMode::Global, || comm.send_recv_group(&group))?;
        let mut seen = Vec::new();
        for step in 0..3 {
            mine.copy_from_slice(&[(comm.rank() * 10 + step) as f32; 3])?;
            g.replay()?;
            seen.push(theirs.to_vec()?[0]);
        }
        Ok(seen)
    })?;
    assert_eq!(out[0].as_ref().ok(), Some(&vec![10.0, 11.0, 12.0]), "{out:?}");
    assert_eq!(out[1].as_ref().ok(), Some(&vec![0.0, 1.0, 2.0]), "{out:?}");
    let ring = dist::run_emulated(3, |comm| {
        let (dev, r, n) = (comm.device().clone(), comm.rank(), comm.world_size());
        let got = Tensor::zeros(&dev, &[1])?;
        let ops =
            [P2pOp::Send(Tensor::full(&dev, &[1], r as f32)?, (r + 1) % n), P2pOp::Recv(got.clone(), (r + n - 1) % n)];
        comm.send_recv_group(&ops)?;
        got.to_vec()
    })?;
    assert_eq!(ring, vec![vec![2.0], vec![0.0], vec![1.0]]);
    Ok(())
}

/// A group with a receive into a buffer another transfer uses, or a bad peer, is refused
/// before anything is posted: the peers never see it, and the group stays usable.
#[test]
fn refused_groups_post_nothing() -> Result<()> {
    use graphed::dist::P2pOp;
    dist::run_emulated(2, |comm| {
        let dev = comm.device().clone();
        let peer = 1 - comm.rank();
        let t = Tensor::full(&dev, &[2], comm.rank() as f32)?;
        let aliased = [P2pOp::Send(t.clone(), peer), P2pOp::Recv(t.clone(), peer)];
        assert!(matches!(
            comm.send_recv_group(&aliased),
            Err(Error::Dist(DistError::GroupAliased { receive: 1, other: 0 }))
        ));
        let bad_peer = [P2pOp::Send(t.clone(), peer), P2pOp::Recv(Tensor::zeros(&dev, &[2])?, 5)];
        assert!(matches!(
            comm.send_recv_group(&bad_peer),
            Err(Error::Dist(DistError::Peer { op: "send_recv_group", peer: 5, .. }))
        ));
        comm.send_recv_group(&[])?;
        // Nothing was posted: the first message each rank receives is the one sent now.
        let got = Tensor::zeros(&dev, &[2])?;
        comm.send_recv_group(&[P2pOp::Send(t.clone(), peer), P2pOp::Recv(got.clone(), peer)])?;
        assert_eq!(got.to_vec()?, vec![peer as f32; 2]);
        Ok(())
    })?;
    Ok(())
}

#[test]
fn a_dead_peer_is_an_error_on_the_others() -> Result<()> {
    let results = dist::run_emulated_each(3, &Config::default().timeout(Duration::from_secs(30)), |comm| {
        if comm.rank() == 2 {
            panic!("rank 2 dies");
        }
        let dev = comm.device().clone();
        let t = Tensor::zeros(&dev, &[2])?;
        let into = Tensor::zeros(&dev, &[2])?;
        comm.recv(&into, 2)?;
        comm.all_reduce(&t, ReduceOp::Sum)
    })?;
    for r in &results[..2] {
        assert!(
            matches!(
                r,
                Err(Error::Dist(graphed::DistError::CommAborted {
                    reason: AbortReason::PeerPanicked { rank: 2, .. },
                    ..
                }))
            ),
            "{r:?}"
        );
    }
    let died = &results[2];
    assert!(
        matches!(died, Err(Error::Dist(DistError::RankPanicked { rank: 2, message })) if message == "rank 2 dies"),
        "{died:?}"
    );
    Ok(())
}

#[test]
fn different_parameter_layouts_are_refused_on_every_rank() -> Result<()> {
    let results = dist::run_emulated_each(2, &quick(), |comm| {
        let width = 4 + comm.rank();
        let block = Block::new(comm.device(), width, width, 1)?;
        let params = dist_programs::named(&block.params());
        DataParallel::with_params(block, params, comm, ReduceOp::Sum, 1024).map(|_| ())
    })?;
    for (rank, r) in results.iter().enumerate() {
        match r {
            Err(Error::Dist(graphed::DistError::ScheduleMismatch { rank: got, hashes, .. })) => {
                assert_eq!((*got, hashes.len()), (rank, 2));
                assert_ne!(hashes[0], hashes[1]);
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    Ok(())
}

/// `make_graphed` of ranks that differ in warm-up (data parallel) or capture another part of
/// the pipeline's order than their own (a pipeline stage): refused on every rank before
/// anything runs, each module handed back; matching ranks capture.
#[test]
fn make_graphed_refuses_different_schedules_on_every_rank() -> Result<()> {
    use graphed::dist::{stage_order, PipelineStage};
    use graphed::{make_graphed, DistError, GraphOptions, OrderEntry};
    let refused = |r: &Result<bool>| matches!(r, Err(Error::Dist(DistError::ScheduleMismatch { what, .. })) if what.contains("graph options"));
    // Data parallel: warm-up 2 on rank 0, 3 on rank 1.
    let results = dist::run_emulated_each(2, &quick(), |comm| {
        let dev = comm.device().clone();
        let block = Block::new(&dev, 4, 4, 1)?;
        let params = block.params();
        let before: Vec<Vec<f32>> = params.iter().map(|p| p.grad.to_vec()).collect::<Result<_>>()?;
        let dp = DataParallel::with_params(block, dist_programs::named(&params), comm.clone(), ReduceOp::Sum, 1024)?;
        let opts = GraphOptions::new().warmup(2 + comm.rank());
        let x = common::random(&dev, &[2, 4], 1)?;
        match make_graphed(vec![Box::new(dp)], vec![vec![vec![Some(x)]]], opts) {
            Ok(_) => Ok(true),
            Err(e) => {
                let (e, modules) = e.into_parts();
                assert_eq!(modules.len(), 1, "the module comes back");
                let after: Vec<Vec<f32>> = params.iter().map(|p| p.grad.to_vec()).collect::<Result<_>>()?;
                assert_eq!(after, before);
                Err(e)
            }
        }
    })?;
    assert!(results.iter().all(refused), "{results:?}");
    // A pipeline: rank 1 captures a valid order that is not its part of the pipeline's, or
    // one its own checks refuse (the whole order: its peer hears of it at once).
    const ORDER: [i32; 8] = [1, 1, 2, 2, -2, -2, -1, -1];
    for case in ["right", "another order", "an invalid order"] {
        let results = dist::run_emulated_each(2, &quick(), |comm| {
            let dev = comm.device().clone();
            let rank = comm.rank();
            let stage = PipelineStage::new(Block::new(&dev, 4, 4, 1)?, comm, ORDER, &[2, 4])?;
            let order = match case {
                "another order" if rank == 1 => OrderEntry::from_ints(&[1, -1, 1, -1]),
                "an invalid order" if rank == 1 => OrderEntry::from_ints(&ORDER),
                _ => stage_order(ORDER, 2, rank)?,
            };
            let x = Tensor::zeros(&dev, &[2, 4])?.with_requires_grad(rank == 1);
            let opts = GraphOptions::new().warmup(1).order(order);
            make_graphed(vec![Box::new(stage)], vec![vec![vec![Some(x)]]], opts).map(|_| true).map_err(Error::from)
        })?;
        match case {
            "right" => assert!(results.iter().all(|r| matches!(r, Ok(true))), "{results:?}"),
            "another order" => assert!(results.iter().all(refused), "{results:?}"),
            _ => {
                assert!(refused(&results[0]), "{results:?}");
                let out_of_range = graphed::ScheduleError::ChunkOutOfRange { chunk: 2, chunks: 1 };
                assert!(matches!(&results[1], Err(Error::Schedule(e)) if *e == out_of_range), "{results:?}");
            }
        }
    }
    Ok(())
}

#[test]
fn data_parallel_equals_one_rank_accumulating_bitwise() -> Result<()> {
    let reference = dist_programs::dp_reference(&graphed::Device::host())?;
    let ranks = dist::run_emulated(2, dist_programs::dp_rank)?;
    for (rank, params) in ranks.iter().enumerate() {
        dist_programs::bitwise(params, &reference).map_err(|e| Error::msg(format!("rank {rank}: {e}")))?;
    }
    // The parameters moved: the test would catch a reduction that did nothing.
    let initial = Stack::new(&graphed::Device::host(), 2, dist_programs::WIDTH, 42)?.params()[0].value.to_vec()?;
    assert_ne!(initial, reference[0]);
    Ok(())
}

#[test]
fn data_parallel_chunks_sharing_buckets_equal_one_rank_accumulating_bitwise() -> Result<()> {
    let reference = dist_programs::dp_reference(&graphed::Device::host())?;
    // One bucket for the whole model (flushed by the first chunk), and one per parameter (one
    // per chunk when overlapped); in place and overlapped with the next chunk's backward.
    for overlap in [false, true] {
        for bucket_bytes in [1 << 20, 4] {
            let ranks = dist::run_emulated(2, |comm| dist_programs::dp_chunks_rank(comm, bucket_bytes, overlap))?;
            for (rank, params) in ranks.iter().enumerate() {
                dist_programs::bitwise(params, &reference).map_err(|e| {
                    Error::msg(format!("buckets of {bucket_bytes} B, overlap {overlap}, rank {rank}: {e}"))
                })?;
            }
        }
    }
    Ok(())
}

#[test]
fn a_chunk_running_backward_twice_before_its_group_reduces_is_refused() -> Result<()> {
    dist::run_emulated(1, |comm| {
        let dev = comm.device().clone();
        let blocks: Vec<_> = (0..2).map(|i| Block::new(&dev, 4, 4, i)).collect::<Result<_>>()?;
        let chunks = blocks.into_iter().map(|b| {
            let named = dist_programs::named(&b.params());
            (b, named)
        });
        let mut layers = DataParallel::chunks(chunks.collect(), comm.clone(), ReduceOp::Sum, 1 << 20)?;
        let x = common::random(&dev, &[2, 4], 1)?;
        let run = |layer: &mut DataParallel<Block>| -> Result<()> {
            let mut cx = graphed::Cx::new(&dev);
            cx.set_needs_input_grad(vec![false]);
            let y = Module::forward(layer, &mut cx, &[Some(x.clone())])?;
            Module::backward(layer, &mut cx, &y).map(drop)
        };
        run(&mut layers[1])?;
        let grads = |l: &DataParallel<Block>| -> Result<Vec<Vec<f32>>> {
            l.inner().params().iter().map(|p| p.grad.to_vec()).collect()
        };
        let before = grads(&layers[1])?;
        assert!(matches!(run(&mut layers[1]), Err(Error::Dist(DistError::BackwardTwice { .. }))));
        // Refused before the chunk's backward ran: its grads were not added to again.
        assert_eq!(grads(&layers[1])?, before, "the refused backward left the grads alone");
        run(&mut layers[0])?; // the first chunk flushes the group
        run(&mut layers[1])
    })?;
    Ok(())
}

/// The cost model through exact samples of a latency and a cost per byte gives them back, and
/// its bucket is the smallest reaching the efficiency asked; what cannot be fitted or used is
/// refused.
#[test]
fn the_all_reduce_cost_model_fits_latency_and_bandwidth() -> Result<()> {
    use graphed::dist::{AllReduceCost, COST_SIZES};
    let r = common::random_vec(2, 77);
    // Some positive latency (ms) and cost per byte (ms).
    let truth = AllReduceCost {
        alpha_ms: 1e-2 * (1.0 + r[0].abs() as f64),
        beta_ms_per_byte: 1e-8 * (1.0 + r[1].abs() as f64),
    };
    let samples: Vec<(usize, f64)> = COST_SIZES.iter().map(|&b| (b, truth.time_ms(b))).collect();
    let fit = AllReduceCost::fit(&samples)?;
    let close = |a: f64, b: f64| ((a - b) / b).abs() < 1e-6;
    assert!(
        close(fit.alpha_ms, truth.alpha_ms) && close(fit.beta_ms_per_byte, truth.beta_ms_per_byte),
        "{fit:?} vs {truth:?}"
    );
    for efficiency in [0.5, 0.8, 0.95] {
        let b = fit.bucket_bytes(efficiency)?;
        assert!(b % 4 == 0 && fit.efficiency(b) >= efficiency && fit.efficiency(b - 4) < efficiency, "{b}");
    }
    let refused = |r: Result<AllReduceCost>| matches!(r, Err(Error::Dist(DistError::CostModel { .. })));
    assert!(refused(AllReduceCost::fit(&samples[..1])));
    assert!(refused(AllReduceCost::fit(&[(4, 1.0), (4, 2.0)])));
    assert!(refused(AllReduceCost::fit(&[(4, 1.0), (8, 0.0)])));
    assert!(refused(AllReduceCost::fit(&[(4, 2.0), (8, 1.0)])), "times falling with the size");
    for efficiency in [0.0, 1.0, f64::NAN] {
        assert!(matches!(fit.bucket_bytes(efficiency), Err(Error::Dist(DistError::CostModel { .. }))));
    }
    Ok(())
}

/// Measured on emulated ranks: every rank fits the same model (the times are averaged over
/// the ranks) and so picks the same bucket, which `DataParallel`'s layout check accepts and
/// trains with as one rank does.
#[test]
fn the_measured_bucket_size_is_the_same_on_every_rank() -> Result<()> {
    use graphed::dist::{AllReduceCost, COST_SIZES};
    let out = dist::run_emulated(2, |comm| {
        let cost = AllReduceCost::measure(&comm, &COST_SIZES, 2)?;
        let bucket = dist::measured_bucket_bytes(&comm)?;
        // DataParallel compares the bucket size across ranks; training with it is bitwise
        // the one-rank reference.
        let got = dist_programs::dp_chunks_rank(comm, bucket, true)?;
        Ok((cost, bucket, got))
    })?;
    let reference = dist_programs::dp_reference(&graphed::Device::host())?;
    for (_, _, got) in &out {
        dist_programs::bitwise(got, &reference).map_err(Error::msg)?;
    }
    assert_eq!((out[0].0, out[0].1), (out[1].0, out[1].1));
    let (cost, bucket, _) = &out[0];
    let (cost, bucket) = (*cost, *bucket);
    assert!(cost.beta_ms_per_byte > 0.0 && cost.alpha_ms >= 0.0, "{cost:?}");
    assert!(bucket % 4 == 0 && bucket >= 4, "{bucket}");
    // Refused before anything is sent: the peers are not waited for.
    dist::run_emulated(2, |comm| {
        let refused = AllReduceCost::measure(&comm, &[64, 64], 2);
        assert!(matches!(refused, Err(Error::Dist(DistError::CostModel { .. }))));
        assert!(matches!(AllReduceCost::measure(&comm, &COST_SIZES, 0), Err(Error::Dist(DistError::CostModel { .. }))));
        comm.barrier()
    })?;
    Ok(())
}
