//! `dist::launch` on this machine (no GPU needed): each test re-runs this binary once per rank
//! with the rank variables set, and the ranks meet through a file or a TCP rendezvous. A
//! failing rank fails the launch; a hanging one is killed at the deadline.

use std::time::{Duration, Instant};

use graphed::dist::{self, LaunchOptions, RankEnv, Rendezvous};
use graphed::{Error, Result};

fn options(test: &str, rendezvous: Option<Rendezvous>, deadline: Duration) -> LaunchOptions {
    let args = [test, "--exact", "--nocapture", "--test-threads=1"].map(String::from).to_vec();
    LaunchOptions { args: Some(args), rendezvous, deadline, ..Default::default() }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    l.local_addr().expect("an address").port()
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
    if std::env::var(dist::ENV_RANK).is_ok() {
        r.expect("rank 0 succeeds");
        return;
    }
    assert!(
        matches!(&r, Err(Error::Dist(graphed::DistError::RankFailed { rank: 1, status })) if status.contains('3')),
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
    if std::env::var(dist::ENV_RANK).is_ok() {
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
    if std::env::var(dist::ENV_RANK).is_ok() {
        return;
    }
    assert!(
        matches!(&r, Err(Error::Dist(graphed::DistError::RankFailed { status, .. })) if status.contains("deadline")),
        "{r:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn rank_variables_are_validated() {
    if std::env::var(dist::ENV_RANK).is_ok() {
        return;
    }
    assert_eq!(RankEnv::from_env().ok(), Some(None));
    assert_eq!(Rendezvous::parse("tcp://10.0.0.1:29500"), Rendezvous::Tcp("10.0.0.1:29500".into()));
    assert_eq!(Rendezvous::parse("node0:29500"), Rendezvous::Tcp("node0:29500".into()));
    assert_eq!(Rendezvous::parse("/shared/run1/id"), Rendezvous::File("/shared/run1/id".into()));
    let r = dist::launch(0, &LaunchOptions::default(), |_| Ok(()));
    assert!(matches!(r, Err(Error::InvalidArgument { .. })));
}

#[test]
fn a_rendezvous_that_nobody_joins_times_out() {
    if std::env::var(dist::ENV_RANK).is_ok() {
        return;
    }
    let quick = Duration::from_millis(200);
    let tcp = Rendezvous::Tcp(format!("127.0.0.1:{}", free_port()));
    // Rank 0 waits for a rank that never comes; a rank waits for a rank 0 that never serves.
    assert!(matches!(tcp.share(0, 2, Some(b"id"), quick), Err(Error::Dist(graphed::DistError::Rendezvous { .. }))));
    assert!(matches!(tcp.share(1, 2, None, quick), Err(Error::Dist(graphed::DistError::Rendezvous { .. }))));
    let file = Rendezvous::File(std::env::temp_dir().join(format!("graphed-missing-{}", std::process::id())));
    assert!(matches!(file.share(1, 2, None, quick), Err(Error::Dist(graphed::DistError::Rendezvous { .. }))));
    assert!(matches!(file.share(0, 2, None, quick), Err(Error::InvalidArgument { .. })));
}
