//! Pipeline parallelism on emulated ranks: chunk c runs on rank (c - 1) % world, activations and
//! grads travel by send/recv inside the captured graphs (grouped where neighbours would wait on
//! each other), and the losses, every grad and the parameters after a few AdamW steps are
//! bitwise those of the same chunks graphed in one process with the whole order.

mod common;
mod dist_programs;

use common::model::Block;
use dist_programs::{BATCH, ORDER, WIDTH};
use graphed::dist::{self, stage_order, PipelineSchedule, PipelineStage};
use graphed::{Device, DistError, Error, OrderEntry, Result, ScheduleError};

#[test]
fn pipeline_across_ranks_equals_one_device_bitwise() -> Result<()> {
    let reference = dist_programs::pipeline_reference(&Device::host())?;
    let ranks = dist::run_emulated(2, dist_programs::pipeline_rank)?;
    let got: Vec<Vec<f32>> = ranks.into_iter().flatten().collect();
    dist_programs::bitwise(&got, &reference).map_err(Error::msg)?;
    let initial = Block::new(&Device::host(), WIDTH, WIDTH, 5)?.params()[0].value.to_vec()?;
    assert_ne!(initial, reference[0], "the parameters must move");
    Ok(())
}

/// Runs `order` on `world` emulated ranks and in one process, and compares each rank's trace
/// with its part of the reference.
fn across_ranks_equals_one_process(order: &[OrderEntry], world: usize) -> Result<()> {
    let reference = dist_programs::pipeline_split_reference(&Device::host(), order)?;
    let chunks = order.iter().map(|e| e.chunk()).max().unwrap_or(0);
    let initial = dist_programs::split_chunk(&Device::host(), 1)?.w.value.to_vec()?;
    assert_ne!(initial, reference.params[0], "the parameters must move");
    assert!(reference.losses.iter().all(|l| !l.is_empty()), "every step has losses");
    let ranks = dist::run_emulated(world, |comm| dist_programs::pipeline_split_rank(comm, order))?;
    for (rank, got) in ranks.iter().enumerate() {
        let want = reference.of_rank(rank, world, chunks);
        dist_programs::same_trace(got, &want).map_err(|e| Error::msg(format!("rank {rank}: {e}")))?;
    }
    Ok(())
}

/// 1F1B with split backwards over two ranks and four microbatches: rank 1 sends each grad
/// back while rank 0 sends the next activation, so rank 0's sends go out grouped with its
/// receives of those grads; the weight grads run as their own graphs.
#[test]
fn one_f_one_b_with_wgrad_across_ranks_equals_one_process_bitwise() -> Result<()> {
    let order = PipelineSchedule::one_f_one_b(2, 4).split_backward().order()?;
    // Rank 0 runs two forwards ahead; weight grads wait a backward on rank 0, none on rank 1.
    use OrderEntry::{Backward as B, Forward as F, Wgrad as W};
    assert_eq!(stage_order(&order, 2, 0)?, [F(1), F(1), B(1), F(1), B(1), W(1), F(1), B(1), W(1), B(1), W(1), W(1)]);
    assert_eq!(stage_order(&order, 2, 1)?, [F(1), B(1), W(1), F(1), B(1), W(1), F(1), B(1), W(1), F(1), B(1), W(1)]);
    across_ranks_equals_one_process(&order, 2)
}

#[test]
fn one_f_one_b_across_ranks_equals_one_process_bitwise() -> Result<()> {
    let order = PipelineSchedule::one_f_one_b(2, 4).order()?;
    across_ranks_equals_one_process(&order, 2)
}

/// examples/pipeline_wgrad.rs's order, each chunk on its own rank.
#[test]
fn a_hand_written_wgrad_order_across_ranks_equals_one_process_bitwise() -> Result<()> {
    use OrderEntry::{Backward as B, Forward as F, Wgrad as W};
    let order = [F(1), F(2), F(1), B(2), F(2), B(1), W(2), B(2), W(1), B(1), W(2), W(1)];
    across_ranks_equals_one_process(&order, 2)
}

/// Megatron-LM's interleaved 1F1B: two chunks per rank (rank 0 runs chunks 1 and 3, rank 1
/// chunks 2 and 4), with and without split backwards.
#[test]
fn interleaved_one_f_one_b_across_ranks_equals_one_process_bitwise() -> Result<()> {
    let order = PipelineSchedule::one_f_one_b(2, 4).interleaved(2).order()?;
    across_ranks_equals_one_process(&order, 2)?;
    let split = PipelineSchedule::one_f_one_b(2, 4).interleaved(2).split_backward().order()?;
    across_ranks_equals_one_process(&split, 2)
}

#[test]
fn three_ranks_one_f_one_b_with_wgrad_equals_one_process_bitwise() -> Result<()> {
    let order = PipelineSchedule::one_f_one_b(3, 4).split_backward().order()?;
    across_ranks_equals_one_process(&order, 3)
}

#[test]
fn an_order_that_deadlocks_across_ranks_is_refused_on_every_rank() -> Result<()> {
    // Chunk 1 waits for its first grad before it sends its second activation, which chunk 2
    // waits for before it sends that grad: no grouping helps.
    let bad = [1, -1, 1, -1, 2, 2, -2, -2];
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        let block = Block::new(comm.device(), WIDTH, WIDTH, 5)?;
        PipelineStage::new(block, comm, bad, &[BATCH, WIDTH]).map(|_| ())
    })?;
    for r in &results {
        assert!(
            matches!(r, Err(Error::Dist(DistError::PipelineDeadlock { stuck })) if stuck.len() == 2 && stuck.iter().all(|t| !t.sends)),
            "{r:?}"
        );
    }
    Ok(())
}

#[test]
fn ranks_with_different_orders_are_refused_on_every_rank() -> Result<()> {
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        let order: &[i32] = if comm.rank() == 0 { &ORDER } else { &[1, 2, -2, -1, 1, 2, -2, -1] };
        let block = Block::new(comm.device(), WIDTH, WIDTH, 5)?;
        PipelineStage::new(block, comm, order, &[BATCH, WIDTH]).map(|_| ())
    })?;
    for r in &results {
        assert!(matches!(r, Err(Error::Dist(DistError::ScheduleMismatch { .. }))), "{r:?}");
    }
    // The same with and without weight-grad entries.
    let with = PipelineSchedule::one_f_one_b(2, 2).split_backward().order()?;
    let without = PipelineSchedule::one_f_one_b(2, 2).order()?;
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        let order = if comm.rank() == 0 { &with } else { &without };
        let split = dist_programs::split_chunk(comm.device(), comm.rank() + 1)?;
        PipelineStage::new(split, comm, order, &[BATCH, WIDTH]).map(|_| ())
    })?;
    for r in &results {
        assert!(matches!(r, Err(Error::Dist(DistError::ScheduleMismatch { .. }))), "{r:?}");
    }
    Ok(())
}

/// A `w(c)` for a chunk whose module runs its backward whole: that rank refuses with the
/// schedule's error, its peer with a mismatch, before anything is sent; the module's grads
/// are untouched.
#[test]
fn a_wgrad_for_a_chunk_that_does_not_split_is_refused_before_anything_runs() -> Result<()> {
    let order = PipelineSchedule::one_f_one_b(2, 2).split_backward().order()?;
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        let rank = comm.rank();
        // Rank 1's chunk splits its backward, rank 0's (a Block) does not.
        let r = if rank == 0 {
            let block = Block::new(comm.device(), WIDTH, WIDTH, 5)?;
            let grads = block.params();
            let r = PipelineStage::new(block, comm, &order, &[BATCH, WIDTH]).map(|_| ());
            for p in &grads {
                assert!(p.grad.to_vec()?.iter().all(|g| *g == 0.0), "nothing ran");
            }
            r
        } else {
            PipelineStage::new(dist_programs::split_chunk(comm.device(), 2)?, comm, &order, &[BATCH, WIDTH]).map(|_| ())
        };
        Ok(r)
    })?;
    let results: Vec<Result<()>> = results.into_iter().map(|r| r.and_then(|r| r)).collect();
    let not_split = ScheduleError::WgradNotSplit { chunk: 1, module: "Block".into() };
    assert!(matches!(&results[0], Err(Error::Schedule(e)) if *e == not_split), "{results:?}");
    assert!(matches!(&results[1], Err(Error::Dist(DistError::ScheduleMismatch { .. }))), "{results:?}");
    Ok(())
}

/// A rank that captures its stage with another part of the order than its own, or with its
/// stages out of place: refused by `make_graphed` on every rank, modules handed back.
#[test]
fn make_graphed_refuses_a_stage_captured_with_another_order() -> Result<()> {
    use graphed::{make_graphed, GraphOptions, Module, Tensor};
    let order = PipelineSchedule::one_f_one_b(2, 2).interleaved(2).split_backward().order()?;
    for case in ["right", "rank 1 without w(c)", "rank 1's stages swapped"] {
        let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
            let dev = comm.device().clone();
            let rank = comm.rank();
            let modules = [rank + 1, rank + 3].map(|c| dist_programs::split_chunk(&dev, c)).into_iter();
            let mut stages =
                PipelineStage::interleaved(modules.collect::<Result<Vec<_>>>()?, comm, &order, &[BATCH, WIDTH])?;
            let mut local = stage_order(&order, 2, rank)?;
            if rank == 1 && case == "rank 1 without w(c)" {
                local.retain(|e| !matches!(e, OrderEntry::Wgrad(_)));
            }
            if rank == 1 && case == "rank 1's stages swapped" {
                stages.swap(0, 1);
            }
            let samples = stages
                .iter()
                .map(|s| Ok(vec![vec![Some(Tensor::zeros(&dev, &[BATCH, WIDTH])?.with_requires_grad(s.chunk() > 1))]]))
                .collect::<Result<Vec<_>>>()?;
            let modules: Vec<Box<dyn Module>> = stages.into_iter().map(|s| Box::new(s) as Box<dyn Module>).collect();
            let options = GraphOptions::new().warmup(1).order(local);
            match make_graphed(modules, samples, options) {
                Ok(_) => Ok(true),
                Err(e) => {
                    let (e, modules) = e.into_parts();
                    assert_eq!(modules.len(), 2, "the modules come back");
                    Err(e)
                }
            }
        })?;
        if case == "right" {
            assert!(results.iter().all(|r| matches!(r, Ok(true))), "{results:?}");
        } else {
            let refused = |r: &Result<bool>| matches!(r, Err(Error::Dist(DistError::ScheduleMismatch { .. })));
            assert!(results.iter().all(refused), "{case}: {results:?}");
        }
    }
    Ok(())
}

#[test]
fn stages_refuse_orders_that_do_not_fit_the_ranks() -> Result<()> {
    let interleaved = PipelineSchedule::one_f_one_b(2, 2).interleaved(2).order()?;
    let results = dist::run_emulated_each(2, &dist::Config::default(), |comm| {
        // Two chunks per rank, one module given.
        let split = dist_programs::split_chunk(comm.device(), comm.rank() + 1)?;
        PipelineStage::new(split, comm, &interleaved, &[BATCH, WIDTH]).map(|_| ())
    })?;
    for (rank, r) in results.iter().enumerate() {
        assert!(
            matches!(r, Err(Error::Dist(DistError::StageChunks { rank: got, expected: 2, given: 1 })) if *got == rank),
            "{r:?}"
        );
    }
    // Three chunks on two ranks.
    let e = stage_order(PipelineSchedule::one_f_one_b(3, 2).order()?, 2, 0).unwrap_err();
    assert!(matches!(e, Error::Dist(DistError::PipelineChunks { chunks: 3, world: 2 })), "{e}");
    // Rank 0 sends chunk 3's first output before chunk 1's second, which rank 1 receives first.
    let crossed = [1, 2, 3, 1, 2, 4, 3, 4, -4, -4, -3, -3, -2, -2, -1, -1];
    let e = stage_order(crossed, 2, 0).unwrap_err();
    let Error::Dist(DistError::PipelineTransferOrder { sent, received }) = e else { panic!("{e}") };
    assert_eq!((sent.chunk, sent.microbatch, received.chunk, received.microbatch), (3, 0, 1, 1));
    Ok(())
}
