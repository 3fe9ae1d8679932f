//! Which launcher started a rank, read from a given environment (the process's own is never
//! touched): graphed's variables, torchrun's, Slurm's and Open MPI's, their precedence, the
//! rendezvous each gives, and a typed error for every partial or malformed environment.

use std::collections::HashMap;

use graphed::dist::{Launcher, RankEnv, Rendezvous, SLURM_PORT_BASE, SLURM_PORT_SPAN};
use graphed::{DistError, Error, Result};

fn detect(vars: &[(&str, &str)]) -> Result<Option<RankEnv>> {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    RankEnv::detect(|k| map.get(k).cloned())
}

fn found(vars: &[(&str, &str)]) -> RankEnv {
    match detect(vars) {
        Ok(Some(env)) => env,
        other => panic!("{vars:?}: expected a rank, got {other:?}"),
    }
}

fn tcp(addr: &str) -> Rendezvous {
    Rendezvous::Tcp(addr.into())
}

const TORCHRUN: [(&str, &str); 5] =
    [("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "node0"), ("MASTER_PORT", "29500")];
const SLURM: [(&str, &str); 5] = [
    ("SLURM_PROCID", "6"),
    ("SLURM_NTASKS", "8"),
    ("SLURM_LOCALID", "2"),
    ("SLURM_NODELIST", "gpu[01-04,07],cpu3"),
    ("SLURM_JOB_ID", "123456"),
];
const OMPI: [(&str, &str); 5] = [
    ("OMPI_COMM_WORLD_RANK", "3"),
    ("OMPI_COMM_WORLD_SIZE", "4"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
    ("MASTER_ADDR", "10.0.0.1"),
    ("MASTER_PORT", "29600"),
];
const GRAPHED: [(&str, &str); 4] = [
    ("GRAPHED_RANK", "1"),
    ("GRAPHED_WORLD_SIZE", "2"),
    ("GRAPHED_LOCAL_RANK", "1"),
    ("GRAPHED_RENDEZVOUS", "tcp://127.0.0.1:4000"),
];

/// `base` with `changes` applied: `Some(v)` sets, `None` removes.
fn with(
    base: &[(&'static str, &'static str)],
    changes: &[(&'static str, Option<&'static str>)],
) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = base.iter().copied().filter(|(k, _)| !changes.iter().any(|(c, _)| c == k)).collect();
    v.extend(changes.iter().filter_map(|(k, val)| val.map(|val| (*k, val))));
    v
}

/// The launcher, the variable and the message (which holds the hint).
fn missing(vars: &[(&str, &str)]) -> (Launcher, &'static str, String) {
    match detect(vars) {
        Err(e @ Error::Dist(DistError::RankVarMissing { launcher, var, .. })) => (launcher, var, e.to_string()),
        other => panic!("{vars:?}: expected RankVarMissing, got {other:?}"),
    }
}

fn malformed(vars: &[(&str, &str)]) -> (Launcher, &'static str, String) {
    match detect(vars) {
        Err(Error::Dist(DistError::RankVarMalformed { launcher, var, value, .. })) => (launcher, var, value),
        other => panic!("{vars:?}: expected RankVarMalformed, got {other:?}"),
    }
}

fn out_of_range(vars: &[(&str, &str)]) -> (Launcher, &'static str, usize, usize) {
    match detect(vars) {
        Err(Error::Dist(DistError::RankOutOfRange { launcher, var, rank, world_size })) => {
            (launcher, var, rank, world_size)
        }
        other => panic!("{vars:?}: expected RankOutOfRange, got {other:?}"),
    }
}

#[test]
fn no_rank_variable_is_not_a_rank() -> Result<()> {
    assert_eq!(detect(&[])?, None);
    // Companions without the rank variable do not make a rank (WORLD_SIZE alone is common).
    assert_eq!(
        detect(&[("WORLD_SIZE", "8"), ("MASTER_ADDR", "x"), ("SLURM_NTASKS", "4"), ("SLURM_JOB_ID", "7")])?,
        None
    );
    // An empty value counts as unset.
    assert_eq!(detect(&[("RANK", ""), ("GRAPHED_RANK", "  ")])?, None);
    Ok(())
}

#[test]
fn graphed_variables() {
    let env = found(&GRAPHED);
    assert_eq!(
        env,
        RankEnv {
            rank: 1,
            world_size: 2,
            local_rank: 1,
            rendezvous: tcp("127.0.0.1:4000"),
            launcher: Launcher::Graphed
        }
    );
    // The local rank defaults to the rank, as it always did.
    let env = found(&with(&GRAPHED, &[("GRAPHED_LOCAL_RANK", None), ("GRAPHED_RENDEZVOUS", Some("/shared/id"))]));
    assert_eq!((env.local_rank, env.rendezvous), (1, Rendezvous::File("/shared/id".into())));
    let (launcher, var, _) = missing(&with(&GRAPHED, &[("GRAPHED_RENDEZVOUS", None)]));
    assert_eq!((launcher, var), (Launcher::Graphed, "GRAPHED_RENDEZVOUS"));
}

#[test]
fn torchrun_variables_meet_one_port_above_master_port() {
    let env = found(&TORCHRUN);
    assert_eq!((env.rank, env.world_size, env.local_rank, env.launcher), (5, 8, 1, Launcher::Torchrun));
    assert_eq!(env.rendezvous, tcp("node0:29501"), "torchrun's own store holds MASTER_PORT");
    let env = found(&with(&TORCHRUN, &[("MASTER_ADDR", Some("fe80::1"))]));
    assert_eq!(env.rendezvous, tcp("[fe80::1]:29501"));
}

#[test]
fn slurm_variables_meet_at_the_first_node() {
    let env = found(&SLURM);
    assert_eq!((env.rank, env.world_size, env.local_rank, env.launcher), (6, 8, 2, Launcher::Slurm));
    let port = SLURM_PORT_BASE + (123456 % SLURM_PORT_SPAN as u64) as u16;
    assert_eq!(env.rendezvous, tcp(&format!("gpu01:{port}")));
    // The step's node list and task count come before the job's.
    let env = found(&with(&SLURM, &[("SLURM_STEP_NODELIST", Some("gpu[04-07]")), ("SLURM_STEP_NUM_TASKS", Some("7"))]));
    assert_eq!((env.rendezvous, env.world_size), (tcp(&format!("gpu04:{port}")), 7));
    // MASTER_ADDR and MASTER_PORT, where the job script exports them, win.
    let env = found(&with(&SLURM, &[("MASTER_ADDR", Some("head")), ("MASTER_PORT", Some("29999"))]));
    assert_eq!(env.rendezvous, tcp("head:29999"));
    let env = found(&with(&SLURM, &[("SLURM_JOB_ID", None)]));
    assert_eq!(env.rendezvous, tcp(&format!("gpu01:{SLURM_PORT_BASE}")));
}

#[test]
fn slurm_host_lists() {
    for (list, first) in [
        ("node7", "node7"),
        ("gpu[01-04,07],cpu3", "gpu01"),
        ("cpu3,gpu[1-2]", "cpu3"),
        ("x[007]", "x007"),
        ("rack[2-3]-n[5,9]", "rack2-n5"),
        ("gpu-a100-[10-12]", "gpu-a100-10"),
        ("127.0.0.[1-4]", "127.0.0.1"),
    ] {
        let env = found(&with(&SLURM, &[("SLURM_NODELIST", Some(list)), ("MASTER_PORT", Some("1"))]));
        assert_eq!(env.rendezvous, tcp(&format!("{first}:1")), "{list}");
    }
    for list in
        ["gpu[01-04", "gpu]01", "gpu[1[2]]", "gpu[a-b]", "gpu[4-1]", "gpu[]", "gpu[1,,2]", "[1-2]x,", ",gpu1", "gpu 1"]
    {
        let (launcher, var, value) = malformed(&with(&SLURM, &[("SLURM_NODELIST", Some(list))]));
        assert_eq!((launcher, var, value.as_str()), (Launcher::Slurm, "SLURM_NODELIST", list), "{list}");
    }
    let e = detect(&with(&SLURM, &[("SLURM_NODELIST", Some("gpu[01-04"))])).expect_err("unparsable");
    assert!(e.to_string().contains("gpu[01-04,07]"), "the error shows the form expected: {e}");
    // No node list and no MASTER_ADDR: nowhere to meet.
    assert_eq!(missing(&with(&SLURM, &[("SLURM_NODELIST", None)])).1, "SLURM_NODELIST");
}

#[test]
fn open_mpi_variables_meet_at_master_addr() {
    let env = found(&OMPI);
    assert_eq!((env.rank, env.world_size, env.local_rank, env.launcher), (3, 4, 3, Launcher::OpenMpi));
    assert_eq!(env.rendezvous, tcp("10.0.0.1:29600"), "nothing else holds MASTER_PORT under mpirun");
    let (launcher, var, hint) = missing(&with(&OMPI, &[("MASTER_ADDR", None)]));
    assert_eq!((launcher, var), (Launcher::OpenMpi, "MASTER_ADDR"));
    assert!(hint.contains("GRAPHED_RENDEZVOUS"), "{hint}");
    assert_eq!(missing(&with(&OMPI, &[("MASTER_PORT", None)])).1, "MASTER_PORT");
    let env = found(&with(&OMPI, &[("MASTER_ADDR", None), ("GRAPHED_RENDEZVOUS", Some("node3:7000"))]));
    assert_eq!(env.rendezvous, tcp("node3:7000"));
}

#[test]
fn graphed_variables_take_precedence_then_the_inner_launcher() {
    let all: Vec<_> = [&GRAPHED[..], &TORCHRUN[..], &SLURM[..], &OMPI[..]].concat();
    assert_eq!(found(&all).launcher, Launcher::Graphed);
    // torchrun or mpirun inside a Slurm job: the inner launcher's ranks.
    assert_eq!(found(&[&TORCHRUN[..], &SLURM[..]].concat()).launcher, Launcher::Torchrun);
    assert_eq!(found(&[&OMPI[..], &SLURM[..]].concat()).launcher, Launcher::OpenMpi);
    assert_eq!(found(&[&TORCHRUN[..], &OMPI[4..]].concat()).launcher, Launcher::Torchrun);
    // GRAPHED_RENDEZVOUS replaces any launcher's address.
    let env = found(&with(&TORCHRUN, &[("GRAPHED_RENDEZVOUS", Some("/shared/run1/id"))]));
    assert_eq!((env.launcher, env.rendezvous), (Launcher::Torchrun, Rendezvous::File("/shared/run1/id".into())));
    let env = found(&with(&SLURM, &[("GRAPHED_RENDEZVOUS", Some("tcp://h:9"))]));
    assert_eq!(env.rendezvous, tcp("h:9"));
}

#[test]
fn graphed_launcher_narrows_detection() -> Result<()> {
    let both: Vec<_> = [&TORCHRUN[..], &SLURM[..]].concat();
    assert_eq!(detect(&with(&both, &[("GRAPHED_LAUNCHER", Some("none"))]))?, None);
    assert_eq!(found(&with(&both, &[("GRAPHED_LAUNCHER", Some("slurm"))])).launcher, Launcher::Slurm);
    assert_eq!(found(&with(&both, &[("GRAPHED_LAUNCHER", Some("auto"))])).launcher, Launcher::Torchrun);
    assert_eq!(detect(&with(&TORCHRUN, &[("GRAPHED_LAUNCHER", Some("mpirun"))]))?, None);
    // graphed's own variables are always read: `launch`'s children inherit GRAPHED_LAUNCHER.
    let env = found(&with(&GRAPHED, &[("GRAPHED_LAUNCHER", Some("none"))]));
    assert_eq!(env.launcher, Launcher::Graphed);
    let (launcher, var, value) = malformed(&with(&TORCHRUN, &[("GRAPHED_LAUNCHER", Some("pbs"))]));
    assert_eq!((launcher, var, value.as_str()), (Launcher::Graphed, "GRAPHED_LAUNCHER", "pbs"));
    Ok(())
}

#[test]
fn partial_environments_name_what_is_missing() {
    for (base, launcher) in [(&TORCHRUN, Launcher::Torchrun), (&SLURM, Launcher::Slurm), (&OMPI, Launcher::OpenMpi)] {
        // The world size and the local rank, for each launcher.
        for var in
            base.iter().map(|(k, _)| *k).filter(|k| k.contains("SIZE") || k.contains("NTASKS") || k.contains("LOCAL"))
        {
            let (l, v, hint) = missing(&with(base, &[(var, None)]));
            assert_eq!((l, v), (launcher, var));
            assert!(hint.contains(launcher.rank_var()) && hint.contains("GRAPHED_LAUNCHER=none"), "{hint}");
        }
    }
    let (_, var, hint) = missing(&[("RANK", "0")]);
    assert_eq!(var, "WORLD_SIZE");
    let e = detect(&[("RANK", "0")]).expect_err("partial");
    assert!(e.to_string().contains("WORLD_SIZE is not set") && e.to_string().contains("torchrun"), "{e}: {hint}");
    assert_eq!(missing(&with(&TORCHRUN, &[("MASTER_ADDR", None)])).1, "MASTER_ADDR");
    assert_eq!(missing(&with(&TORCHRUN, &[("MASTER_PORT", None)])).1, "MASTER_PORT");
    assert_eq!(missing(&with(&GRAPHED, &[("GRAPHED_WORLD_SIZE", None)])).1, "GRAPHED_WORLD_SIZE");
}

#[test]
fn malformed_values_are_refused() {
    for (base, var, value) in [
        (&TORCHRUN[..], "RANK", "one"),
        (&TORCHRUN[..], "WORLD_SIZE", "-8"),
        (&TORCHRUN[..], "WORLD_SIZE", "0"),
        (&TORCHRUN[..], "LOCAL_RANK", "1.0"),
        (&TORCHRUN[..], "MASTER_PORT", "http"),
        (&TORCHRUN[..], "MASTER_PORT", "70000"),
        (&TORCHRUN[..], "MASTER_PORT", "0"),
        // The rendezvous listens one port above: there is none above 65535.
        (&TORCHRUN[..], "MASTER_PORT", "65535"),
        (&SLURM[..], "SLURM_PROCID", "x"),
        (&SLURM[..], "SLURM_JOB_ID", "12_3"),
        (&OMPI[..], "OMPI_COMM_WORLD_SIZE", "four"),
        (&GRAPHED[..], "GRAPHED_RANK", "-1"),
    ] {
        let (_, v, got) = malformed(&with(base, &[(var, Some(value))]));
        assert_eq!((v, got.as_str()), (var, value));
    }
}

#[test]
fn ranks_beyond_the_world_are_refused() {
    assert_eq!(out_of_range(&with(&TORCHRUN, &[("RANK", Some("8"))])), (Launcher::Torchrun, "RANK", 8, 8));
    assert_eq!(out_of_range(&with(&TORCHRUN, &[("LOCAL_RANK", Some("9"))])), (Launcher::Torchrun, "LOCAL_RANK", 9, 8));
    assert_eq!(out_of_range(&with(&SLURM, &[("SLURM_NTASKS", Some("6"))])), (Launcher::Slurm, "SLURM_PROCID", 6, 6));
    assert_eq!(
        out_of_range(&with(&OMPI, &[("OMPI_COMM_WORLD_SIZE", Some("2"))])),
        (Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", 3, 2)
    );
    assert_eq!(out_of_range(&with(&GRAPHED, &[("GRAPHED_RANK", Some("2"))])).1, "GRAPHED_RANK");
    let e = detect(&with(&TORCHRUN, &[("RANK", Some("8"))])).expect_err("out of range");
    assert!(e.to_string().contains("RANK=8 is not below the world size 8"), "{e}");
}

#[test]
fn launchers_print_their_names() {
    let names: Vec<String> = Launcher::ALL.iter().map(|l| l.to_string()).collect();
    assert_eq!(
        names,
        [
            "graphed (GRAPHED_RANK)",
            "torchrun (RANK)",
            "Open MPI mpirun (OMPI_COMM_WORLD_RANK)",
            "Slurm srun (SLURM_PROCID)"
        ]
    );
}
