//! A peer that dies in the middle of a step: rank 1 aborts its process right after step 3's
//! forward, while rank 0 goes on with the step's backward (its graph all-reduces the grads),
//! the AdamW step and `comm.synchronize()`. Rank 0 must get a typed error (`CommTimeout`,
//! `CommAborted` or NCCL's) within the communicator's deadline, and then tear everything down
//! and exit without waiting forever in a destructor.
//!
//! On two GPUs (NCCL, one process each) it runs twice: with the ranks started as an external
//! launcher would (Slurm, a shell loop: the variables set by hand, nobody kills rank 0), and
//! with `dist::launch` (which gives rank 0 a grace period to end on its own before killing it).
//! Rank 0 writes what it saw to a report file the test reads. Without two usable GPUs these
//! print that they skipped and why (`GRAPHED_REQUIRE_MULTI_GPU=1` makes that a failure); the
//! same program on emulated ranks always runs.

mod common;
mod dist_programs;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::model::Stack;
use dist_programs::{adamw, microbatch, named, BATCH, WIDTH};
use graphed::dist::{self, Communicator, Config, DataParallel, LaunchOptions, RankEnv, ReduceOp};
use graphed::{make_graphed, ops, DistError, Error, GraphOptions, Module, Result, Tensor};

const RANKS: usize = 2;
/// The step whose forward is rank 1's last act.
const DIE_AT: usize = 3;
/// The communicators' deadline on GPUs.
const GPU_TIMEOUT: Duration = Duration::from_secs(20);
/// How long past its deadline rank 0 may take to see the error (the abort, the polling).
const MARGIN: Duration = Duration::from_secs(15);

/// How rank 1 leaves: a real process dies (`abort`, no cleanup); an emulated rank's thread
/// just stops taking part (it cannot kill the process the others run in).
fn leave() {
    if std::env::var(dist::ENV_RANK).is_ok() {
        eprintln!("rank 1: aborting the process after step {DIE_AT}'s forward");
        std::process::abort();
    }
}

/// The rank program: a graphed data-parallel stack, trained until rank 1 leaves. Rank 0
/// returns what it saw at the step rank 1 left: the error, how long it took to arrive, and
/// how long tearing down took.
fn rank_program(comm: Communicator) -> Result<Option<(Error, Duration, Duration)>> {
    let dev = comm.device().clone();
    let rank = comm.rank();
    let stack = Stack::new(&dev, 2, WIDTH, 42)?;
    let params = stack.params();
    let opt = adamw(&params)?;
    let dp = DataParallel::with_params(stack, named(&params), comm.clone(), ReduceOp::Sum, 1 << 20)?;
    let sample = Tensor::zeros(&dev, &[BATCH, WIDTH])?;
    let mut g = make_graphed(
        vec![Box::new(dp) as Box<dyn Module>],
        vec![vec![vec![Some(sample)]]],
        GraphOptions::new().warmup(2),
    )?;
    for step in 0..=DIE_AT {
        let (x, target) = microbatch(&dev, step, rank)?;
        let y = g.forward(0, &[Some(x)])?.remove(0).expect("an output");
        if step == DIE_AT && rank == 1 {
            leave();
            return Ok(None);
        }
        let dy = ops::mse_backward(&y, &target, 1.0)?;
        let started = Instant::now();
        let stepped = g.backward(0, &[Some(dy)]).and_then(|_| opt.step()).and_then(|()| comm.synchronize());
        if step < DIE_AT {
            stepped?;
            opt.zero_grad()?;
            continue;
        }
        let waited = started.elapsed();
        let Err(e) = stepped else {
            return Err(Error::msg(format!("rank 0: step {DIE_AT} completed although rank 1 is gone")));
        };
        eprintln!("rank 0: {e} (after {:.1} s)", waited.as_secs_f64());
        // Tear down: graphs, pools, the optimizer and the communicator, none waiting forever.
        let t = Instant::now();
        drop((g, opt, y));
        drop(comm);
        return Ok(Some((e, waited, t.elapsed())));
    }
    Err(Error::msg("unreachable: the loop returns at the step rank 1 leaves"))
}

/// Whether rank 0's error is one of the typed errors of a failed group.
fn typed(e: &Error) -> bool {
    matches!(
        e.root(),
        Error::Dist(DistError::CommTimeout { .. } | DistError::CommAborted { .. } | DistError::Nccl { .. })
    )
}

#[test]
fn a_dead_peer_on_emulated_ranks_is_a_typed_error_within_the_deadline() -> Result<()> {
    let timeout = Duration::from_secs(2);
    let results = dist::run_emulated_each(RANKS, &Config::default().timeout(timeout), rank_program)?;
    let mut results = results.into_iter();
    let (e, waited, teardown) = results.next().expect("rank 0")?.expect("rank 0's outcome");
    println!(
        "emulated: rank 0 got `{e}` after {:.2} s (deadline {timeout:?}), tore down in {:.3} s",
        waited.as_secs_f64(),
        teardown.as_secs_f64()
    );
    assert!(typed(&e), "{e:?}");
    assert!(waited <= timeout + Duration::from_secs(3), "{waited:?}");
    assert!(teardown < Duration::from_secs(5), "{teardown:?}");
    assert!(matches!(results.next(), Some(Ok(None))));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Two GPUs.

/// Where rank 0 of `test` writes its report: named after the test process (the ranks' parent).
fn report_path(test: &str, parent: u32) -> PathBuf {
    std::env::temp_dir().join(format!("graphed-dead-peer-{test}-{parent}.txt"))
}

/// In a rank process: runs the program on NCCL; rank 0 writes its report.
fn gpu_rank(test: &str, env: RankEnv) -> Result<()> {
    let comm = env.communicator(&Config::default().timeout(GPU_TIMEOUT))?;
    let rank = comm.rank();
    let outcome = rank_program(comm);
    if rank != 0 {
        return outcome.map(drop);
    }
    let report = match &outcome {
        Ok(Some((e, waited, teardown))) => format!(
            "{} {:.2} {:.2} {e}",
            if typed(e) { "typed" } else { "untyped" },
            waited.as_secs_f64(),
            teardown.as_secs_f64()
        ),
        Ok(None) => "untyped 0 0 rank 0 returned no outcome".into(),
        Err(e) => format!("untyped 0 0 the program failed: {e}"),
    };
    let path = report_path(test, std::os::unix::process::parent_id());
    std::fs::write(&path, &report).map_err(|e| Error::msg(format!("writing {}: {e}", path.display())))?;
    outcome.map(drop)
}

/// Reads and checks rank 0's report.
fn check_report(test: &str) -> Result<()> {
    let path = report_path(test, std::process::id());
    let report = std::fs::read_to_string(&path)
        .map_err(|e| Error::msg(format!("{test}: rank 0 wrote no report ({e}): it was killed or hung")))?;
    std::fs::remove_file(&path).ok();
    println!("{test}: rank 0 reports: {report}");
    let mut words = report.splitn(4, ' ');
    let (kind, waited, teardown) = (words.next(), words.next(), words.next());
    let secs = |w: Option<&str>| w.and_then(|w| w.parse::<f64>().ok()).unwrap_or(f64::MAX);
    if kind != Some("typed") {
        return Err(Error::msg(format!("{test}: rank 0 did not get a typed error: {report}")));
    }
    if secs(waited) > (GPU_TIMEOUT + MARGIN).as_secs_f64() || secs(teardown) > MARGIN.as_secs_f64() {
        return Err(Error::msg(format!("{test}: rank 0 took too long: {report}")));
    }
    Ok(())
}

fn rank_args(test: &str) -> Vec<String> {
    [test, "--exact", "--nocapture", "--test-threads=1"].map(String::from).to_vec()
}

/// The ranks started as an external launcher would: the rank variables set by hand, rank 1
/// left to die, rank 0 waited for with a deadline and never killed unless it hangs.
#[test]
fn a_dead_peer_on_gpus_without_the_launcher() -> Result<()> {
    const TEST: &str = "a_dead_peer_on_gpus_without_the_launcher";
    if let Some(env) = RankEnv::from_env()? {
        return gpu_rank(TEST, env);
    }
    if !common::gpus_here(TEST, RANKS) {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| Error::msg(e.to_string()))?;
    let rdv = std::env::temp_dir().join(format!("graphed-dead-peer-rdv-{}", std::process::id()));
    std::fs::remove_file(&rdv).ok();
    let mut ranks: Vec<Child> = Vec::new();
    for rank in 0..RANKS {
        let child = Command::new(&exe)
            .args(rank_args(TEST))
            .env(dist::ENV_RANK, rank.to_string())
            .env(dist::ENV_WORLD_SIZE, RANKS.to_string())
            .env(dist::ENV_LOCAL_RANK, rank.to_string())
            .env(dist::ENV_RENDEZVOUS, rdv.display().to_string())
            .env("NCCL_NVLS_ENABLE", "0")
            .spawn()
            .map_err(|e| Error::msg(format!("starting rank {rank}: {e}")))?;
        ranks.push(child);
    }
    let started = Instant::now();
    let deadline = Duration::from_secs(240);
    let status = loop {
        if let Some(status) = ranks[0].try_wait().map_err(|e| Error::msg(e.to_string()))? {
            break Some(status);
        }
        if started.elapsed() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for r in &mut ranks {
        let _ = r.kill();
        let _ = r.wait();
    }
    std::fs::remove_file(&rdv).ok();
    match status {
        None => Err(Error::msg(format!("{TEST}: rank 0 still ran after {deadline:?}: it hung"))),
        Some(s) if !s.success() => {
            check_report(TEST)?;
            Err(Error::msg(format!("{TEST}: rank 0 exited with {s}")))
        }
        Some(_) => {
            println!("{TEST}: rank 0 exited on its own after {:.1} s", started.elapsed().as_secs_f64());
            check_report(TEST)
        }
    }
}

/// The ranks started by `dist::launch`, with a grace period: the launch fails naming rank 1,
/// and rank 0 ends on its own with its typed error before the grace runs out.
#[test]
fn a_dead_peer_on_gpus_with_the_launcher() -> Result<()> {
    const TEST: &str = "a_dead_peer_on_gpus_with_the_launcher";
    if RankEnv::from_env()?.is_none() && !common::gpus_here(TEST, RANKS) {
        return Ok(());
    }
    let options = LaunchOptions {
        args: Some(rank_args(TEST)),
        deadline: Duration::from_secs(240),
        grace: Duration::from_secs(120),
        ..Default::default()
    };
    let started = Instant::now();
    let launched = dist::launch(RANKS, &options, |env| gpu_rank(TEST, env));
    if std::env::var(dist::ENV_RANK).is_ok() {
        return launched;
    }
    println!("{TEST}: the launch ended after {:.1} s: {launched:?}", started.elapsed().as_secs_f64());
    match &launched {
        Err(Error::Dist(DistError::RankFailed { rank: 1, .. })) => check_report(TEST),
        _ => Err(Error::msg(format!("{TEST}: expected rank 1's failure, got {launched:?}"))),
    }
}
