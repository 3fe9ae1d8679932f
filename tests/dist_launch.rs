//! `dist::launch` on this machine (no GPU needed): each test re-runs this binary once per rank
//! with the rank variables set, and the ranks meet through a file or a TCP rendezvous. A
//! failing rank fails the launch; a hanging one is killed at the deadline. The same rank code
//! runs under torchrun's, Slurm's and Open MPI's variables (set here as those launchers would),
//! and two launches on this machine play two hosts meeting at one rendezvous.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{free_port, free_port_pair, play_launcher};

use graphed::dist::{self, LaunchOptions, RankEnv, Rendezvous};
use graphed::{Error, RankExit, Result};

/// Whether this process is a rank (started by a launch, or with another launcher's variables).
fn in_rank() -> bool {
    matches!(RankEnv::from_env(), Ok(Some(_)))
}

fn options(test: &str, rendezvous: Option<Rendezvous>, deadline: Duration) -> LaunchOptions {
    let args = [test, "--exact", "--nocapture", "--test-threads=1"].map(String::from).to_vec();
    LaunchOptions { args: Some(args), rendezvous, deadline, ..Default::default() }
}

/// Every rank checks its variables, then the ranks share rank 0's bytes.
fn share_program(env: RankEnv) -> Result<()> {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("NCCL_NVLS_ENABLE") != "0" || env.world_size != 3 || env.local_rank != env.rank {
        return Err(Error::msg(format!("bad rank environment: {env:?}, NCCL_NVLS_ENABLE={}", var("NCCL_NVLS_ENABLE"))));
    }
    let payload = b"graphed rendezvous".to_vec();
    let mine = (env.rank == 0).then_some(payload.as_slice());
    let got = env.rendezvous.share(env.rank, env.world_size, mine, Duration::from_secs(30))?;
    if got != payload {
        return Err(Error::msg(format!("rank {} got {got:?}", env.rank)));
    }
    Ok(())
}

#[test]
fn launch_over_tcp_rendezvous() -> Result<()> {
    let test = "launch_over_tcp_rendezvous";
    let rdv = Rendezvous::Tcp(format!("127.0.0.1:{}", free_port()));
    dist::launch(3, &options(test, Some(rdv), Duration::from_secs(60)), share_program)
}

#[test]
fn launch_over_file_rendezvous() -> Result<()> {
    let test = "launch_over_file_rendezvous";
    dist::launch(3, &options(test, None, Duration::from_secs(60)), share_program)
}

#[test]
fn a_failing_rank_fails_the_launch() {
    let test = "a_failing_rank_fails_the_launch";
    let r = dist::launch(2, &options(test, None, Duration::from_secs(60)), |env| {
        if env.rank == 1 {
            // A rank process that dies with a failure status (what a failed `main` does).
            std::process::exit(3);
        }
        Ok(())
    });
    if in_rank() {
        r.expect("rank 0 succeeds");
        return;
    }
    assert!(
        matches!(&r, Err(Error::Dist(graphed::DistError::RankFailed { rank: 1, status: RankExit::Exited(s) })) if s.code() == Some(3)),
        "{r:?}"
    );
}

#[test]
fn the_others_get_a_grace_period_to_end_on_their_own() {
    let test = "the_others_get_a_grace_period_to_end_on_their_own";
    let mut options = options(test, None, Duration::from_secs(60));
    options.grace = Duration::from_secs(30);
    let started = Instant::now();
    let r = dist::launch(2, &options, |env| {
        if env.rank == 1 {
            std::process::exit(3);
        }
        // Rank 0 outlives its peer, reports, and ends on its own within the grace period.
        std::thread::sleep(Duration::from_millis(500));
        let report = std::env::temp_dir().join(format!("graphed-grace-{}", std::os::unix::process::parent_id()));
        std::fs::write(report, b"rank 0 ended on its own").map_err(|e| Error::msg(e.to_string()))
    });
    if in_rank() {
        r.expect("rank 0 succeeds");
        return;
    }
    assert!(matches!(&r, Err(Error::Dist(graphed::DistError::RankFailed { rank: 1, .. }))), "{r:?}");
    let report = std::env::temp_dir().join(format!("graphed-grace-{}", std::process::id()));
    assert_eq!(std::fs::read(&report).ok().as_deref(), Some(&b"rank 0 ended on its own"[..]), "rank 0 was not killed");
    std::fs::remove_file(report).ok();
    assert!(started.elapsed() < Duration::from_secs(25), "the launch waited for rank 0, not the grace's end");
}

#[test]
fn a_hanging_rank_is_killed_at_the_deadline() {
    let test = "a_hanging_rank_is_killed_at_the_deadline";
    let started = Instant::now();
    let r = dist::launch(2, &options(test, None, Duration::from_secs(3)), |env| {
        if env.rank == 0 {
            std::thread::sleep(Duration::from_secs(120));
        }
        Ok(())
    });
    if in_rank() {
        return;
    }
    assert!(
        matches!(&r, Err(Error::Dist(graphed::DistError::RankFailed { status: RankExit::Deadline { .. }, .. }))),
        "{r:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn rank_variables_are_validated() {
    if in_rank() {
        return;
    }
    assert_eq!(RankEnv::from_env().ok(), Some(None));
    assert_eq!(Rendezvous::parse("tcp://10.0.0.1:29500"), Rendezvous::Tcp("10.0.0.1:29500".into()));
    assert_eq!(Rendezvous::parse("node0:29500"), Rendezvous::Tcp("node0:29500".into()));
    assert_eq!(Rendezvous::parse("/shared/run1/id"), Rendezvous::File("/shared/run1/id".into()));
    let r = dist::launch(0, &LaunchOptions::default(), |_| Ok(()));
    assert!(matches!(r, Err(Error::Dist(graphed::DistError::World { op: "launch", world: 0, .. }))));
}

#[test]
fn a_rendezvous_that_nobody_joins_times_out() {
    if in_rank() {
        return;
    }
    let quick = Duration::from_millis(200);
    let tcp = Rendezvous::Tcp(format!("127.0.0.1:{}", free_port()));
    // Rank 0 waits for a rank that never comes; a rank waits for a rank 0 that never serves.
    assert!(matches!(tcp.share(0, 2, Some(b"id"), quick), Err(Error::Dist(graphed::DistError::Rendezvous { .. }))));
    assert!(matches!(tcp.share(1, 2, None, quick), Err(Error::Dist(graphed::DistError::Rendezvous { .. }))));
    let file = Rendezvous::File(std::env::temp_dir().join(format!("graphed-missing-{}", std::process::id())));
    assert!(matches!(file.share(1, 2, None, quick), Err(Error::Dist(graphed::DistError::Rendezvous { .. }))));
    assert!(matches!(file.share(0, 2, None, quick), Err(Error::Dist(graphed::DistError::NoPayload))));
}

/// Where the ranks of `test` started by this process report what they saw.
fn report_dir(test: &str, launcher_pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("graphed-report-{test}-{launcher_pid}"))
}

/// A rank writes what it detected (launcher, local rank, world, rendezvous) for the test
/// process to check, then the ranks share rank 0's bytes through the rendezvous, as they share
/// NCCL's unique id.
fn report_program(test: &'static str) -> impl FnOnce(RankEnv) -> Result<()> {
    move |env| {
        let io = |e: std::io::Error| Error::msg(format!("rank {}: {e}", env.rank));
        let dir = report_dir(test, std::os::unix::process::parent_id());
        std::fs::create_dir_all(&dir).map_err(io)?;
        let line = format!("{:?} {} {} {}", env.launcher, env.local_rank, env.world_size, env.rendezvous.to_env());
        std::fs::write(dir.join(env.rank.to_string()), line).map_err(io)?;
        let payload = b"an NCCL unique id".to_vec();
        let mine = (env.rank == 0).then_some(payload.as_slice());
        let got = env.rendezvous.share(env.rank, env.world_size, mine, Duration::from_secs(30))?;
        if got != payload {
            return Err(Error::msg(format!("rank {} got {got:?}", env.rank)));
        }
        Ok(())
    }
}

/// The reports of `test`'s ranks, by rank; the directory is removed.
fn reports(test: &str) -> BTreeMap<usize, String> {
    let dir = report_dir(test, std::process::id());
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let rank = entry.file_name().to_string_lossy().parse().expect("a rank number");
        out.insert(rank, std::fs::read_to_string(entry.path()).expect("a report"));
    }
    std::fs::remove_dir_all(dir).ok();
    out
}

fn check_reports(test: &str, expected: &[(usize, String)]) {
    let got = reports(test);
    let want: BTreeMap<usize, String> = expected.iter().cloned().collect();
    assert_eq!(got, want, "each rank's launcher, local rank, world size and rendezvous");
}

#[test]
fn ranks_under_torchrun_variables() -> Result<()> {
    const TEST: &str = "ranks_under_torchrun_variables";
    if in_rank() {
        return dist::launch(3, &LaunchOptions::default(), report_program(TEST));
    }
    // torchrun's store holds MASTER_PORT; the ranks meet one port above.
    let port = free_port_pair();
    play_launcher(TEST, 3, Duration::from_secs(60), |r| {
        vec![
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "3".into()),
            ("LOCAL_RANK", r.to_string()),
            ("LOCAL_WORLD_SIZE", "3".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
        ]
    })?;
    let rdv = format!("tcp://127.0.0.1:{}", port + 1);
    check_reports(TEST, &(0..3).map(|r| (r, format!("Torchrun {r} 3 {rdv}"))).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn ranks_under_torchrun_variables_with_a_graphed_rendezvous_file() -> Result<()> {
    const TEST: &str = "ranks_under_torchrun_variables_with_a_graphed_rendezvous_file";
    if in_rank() {
        return dist::launch(2, &LaunchOptions::default(), report_program(TEST));
    }
    let file = std::env::temp_dir().join(format!("graphed-rdv-torchrun-{}", std::process::id()));
    std::fs::remove_file(&file).ok();
    let path = file.display().to_string();
    // MASTER_PORT is left malformed-free but unused: GRAPHED_RENDEZVOUS wins.
    play_launcher(TEST, 2, Duration::from_secs(60), |r| {
        vec![
            ("RANK", r.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("LOCAL_RANK", r.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", "1".into()),
            ("GRAPHED_RENDEZVOUS", path.clone()),
        ]
    })?;
    std::fs::remove_file(&file).ok();
    check_reports(TEST, &(0..2).map(|r| (r, format!("Torchrun {r} 2 {path}"))).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn ranks_under_slurm_variables() -> Result<()> {
    const TEST: &str = "ranks_under_slurm_variables";
    if in_rank() {
        return dist::launch(3, &LaunchOptions::default(), report_program(TEST));
    }
    // No MASTER_PORT: the port comes from the job id. Pick a job whose port is free here.
    let job = (0..u64::from(dist::SLURM_PORT_SPAN))
        .map(|j| 1_000_000 + j * 7919 % u64::from(dist::SLURM_PORT_SPAN))
        .find(|j| {
            let port = dist::SLURM_PORT_BASE + (j % u64::from(dist::SLURM_PORT_SPAN)) as u16;
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        })
        .expect("a free port in the Slurm range");
    let port = dist::SLURM_PORT_BASE + (job % u64::from(dist::SLURM_PORT_SPAN)) as u16;
    // Rank 0 runs on the first host of the compressed node list: 127.0.0.1 here.
    play_launcher(TEST, 3, Duration::from_secs(60), |r| {
        vec![
            ("SLURM_PROCID", r.to_string()),
            ("SLURM_NTASKS", "3".into()),
            ("SLURM_LOCALID", r.to_string()),
            ("SLURM_NODELIST", "127.0.0.[1-3,7],cpu3".into()),
            ("SLURM_JOB_ID", job.to_string()),
        ]
    })?;
    let rdv = format!("tcp://127.0.0.1:{port}");
    check_reports(TEST, &(0..3).map(|r| (r, format!("Slurm {r} 3 {rdv}"))).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn ranks_under_open_mpi_variables() -> Result<()> {
    const TEST: &str = "ranks_under_open_mpi_variables";
    if in_rank() {
        return dist::launch(3, &LaunchOptions::default(), report_program(TEST));
    }
    let port = free_port();
    play_launcher(TEST, 3, Duration::from_secs(60), |r| {
        vec![
            ("OMPI_COMM_WORLD_RANK", r.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "3".into()),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
        ]
    })?;
    let rdv = format!("tcp://127.0.0.1:{port}");
    check_reports(TEST, &(0..3).map(|r| (r, format!("OpenMpi {r} 3 {rdv}"))).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn a_partial_launcher_environment_fails_the_rank() -> Result<()> {
    const TEST: &str = "a_partial_launcher_environment_fails_the_rank";
    if std::env::var("RANK").is_ok() {
        // RANK without WORLD_SIZE: the rank gets a typed error instead of guessing; it exits
        // with status 7 when (and only when) that is the error, for the test to check.
        let r = dist::launch(2, &LaunchOptions::default(), |_| Ok(()));
        if let Err(e @ Error::Dist(graphed::DistError::RankVarMissing { var: "WORLD_SIZE", .. })) = &r {
            println!("the rank refused, as expected: {e}");
            std::process::exit(7);
        }
        return r;
    }
    let r = play_launcher(TEST, 1, Duration::from_secs(60), |_| vec![("RANK", "0".into())]);
    assert!(matches!(&r, Err(Error::Msg(m)) if m.contains("rank 0 exited") && m.contains('7')), "{r:?}");
    Ok(())
}

#[test]
fn two_nodes_meet_at_one_rendezvous() -> Result<()> {
    const TEST: &str = "two_nodes_meet_at_one_rendezvous";
    if in_rank() {
        return dist::launch(4, &LaunchOptions::default(), report_program(TEST));
    }
    // Two launches play two hosts, each starting its two ranks (local ranks 0 and 1), as
    // torchrun --nnodes=2 --node_rank=N --nproc_per_node=2 would on each host.
    let rdv = Rendezvous::Tcp(format!("127.0.0.1:{}", free_port()));
    let nodes: Vec<_> = (0..2)
        .map(|node_rank| {
            let mut o = options(TEST, Some(rdv.clone()), Duration::from_secs(60));
            (o.nnodes, o.node_rank) = (2, node_rank);
            std::thread::spawn(move || dist::launch(4, &o, report_program(TEST)))
        })
        .collect();
    for n in nodes {
        n.join().map_err(|_| Error::msg("a launcher thread panicked"))??;
    }
    let rdv = rdv.to_env();
    check_reports(TEST, &(0..4).map(|r| (r, format!("Graphed {} 4 {rdv}", r % 2))).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn node_options_are_validated() {
    if in_rank() {
        return;
    }
    let tcp = Some(Rendezvous::Tcp("127.0.0.1:1".into()));
    for (world, nnodes, node_rank, rendezvous) in
        [(4, 0, 0, tcp.clone()), (4, 2, 2, tcp.clone()), (5, 2, 0, tcp.clone()), (4, 2, 1, None)]
    {
        let o = LaunchOptions { nnodes, node_rank, rendezvous, ..Default::default() };
        let r = dist::launch(world, &o, |_| Ok(()));
        let refused = matches!(
            &r,
            Err(Error::Dist(graphed::DistError::Nodes { .. } | graphed::DistError::NodesNeedRendezvous { .. }))
        );
        assert!(refused, "{world} {nnodes} {node_rank}: {r:?}");
    }
}

#[test]
fn a_failing_rank_on_a_second_node_is_named_by_its_global_rank() {
    const TEST: &str = "a_failing_rank_on_a_second_node_is_named_by_its_global_rank";
    let mut o = options(TEST, None, Duration::from_secs(60));
    if in_rank() {
        let r = dist::launch(4, &o, |env| if env.rank == 3 { std::process::exit(3) } else { Ok(()) });
        r.expect("the other ranks succeed");
        return;
    }
    // Node 1 alone (its peers on node 0 never come; these ranks do not meet).
    let file = std::env::temp_dir().join(format!("graphed-rdv-node1-{}", std::process::id()));
    (o.nnodes, o.node_rank, o.rendezvous) = (2, 1, Some(Rendezvous::File(file)));
    let r = dist::launch(4, &o, |_| Ok(()));
    assert!(matches!(&r, Err(Error::Dist(graphed::DistError::RankFailed { rank: 3, .. }))), "{r:?}");
}
