//! Every NVRTC program the CUDA backend compiles, with the options it compiles it with, for the
//! checks that need no GPU. With `GRAPHED_DUMP_PROGRAMS=<folder>` the test below writes each
//! program there as `<name>.cu`, its options as `<name>.opts` (one a line) and, for the kernels
//! it launches with more than the default dynamic shared memory at a size fixed by the program,
//! `<name>.shared` (a kernel's name and its bytes a line); `scripts/nvrtc-check.py` compiles them
//! with NVRTC and assembles them with ptxas for the H200 (sm_90), which catches what the host
//! compiler's type-check (`scripts/check-kernels.sh`) cannot: inline PTX, the architecture's
//! instructions, registers, spills and shared memory.

use super::cuda::{conditional_program, main_options};
use super::cuda_decoder::decoder_programs;
use super::cuda_hopper::{hopper_program, HOPPER_BWD_SMEM};
use super::kernel_source;
use crate::Result;

/// One program: its name, source, NVRTC options and the fixed dynamic shared memory of its
/// kernels that launch with more than the default.
struct Program {
    name: String,
    source: String,
    options: Vec<String>,
    shared: Vec<(&'static str, u32)>,
}

/// The programs a GPU of compute capability `arch` compiles: the built-in kernels (with
/// programmatic dependent launch too, from sm_90), the conditional-node kernels, the
/// one-kernel decoding step for the GPT's shape in its variants, and on sm_90 the Hopper
/// attention backward (for sm_90a).
fn programs(arch: (i32, i32)) -> Result<Vec<Program>> {
    let main = kernel_source::main_sources()?.join("\n");
    let mut list =
        vec![Program { name: "main".into(), source: main.clone(), options: main_options(arch, false), shared: vec![] }];
    if arch.0 >= 9 {
        list.push(Program { name: "main-pdl".into(), source: main, options: main_options(arch, true), shared: vec![] });
    }
    let (source, options) = conditional_program(arch);
    list.push(Program { name: "conditional".into(), source, options, shared: vec![] });
    for (name, source, options, dynamic) in decoder_programs(arch)? {
        list.push(Program { name, source, options, shared: vec![("decoder_step_bf16", dynamic)] });
    }
    if arch == (9, 0) {
        let (source, options) = hopper_program()?;
        let smem = HOPPER_BWD_SMEM as u32;
        let shared = vec![("hb_bwd_bf16_d64", smem), ("hb_bwd_f16_d64", smem)];
        list.push(Program { name: "flash-hopper".into(), source, options, shared });
    }
    Ok(list)
}

#[test]
fn every_program_is_listed_and_written_where_asked() -> Result<()> {
    let list = programs((9, 0))?;
    let names: Vec<&str> = list.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "main",
            "main-pdl",
            "conditional",
            "decoder",
            "decoder-mt1",
            "decoder-trace",
            "decoder-cluster16",
            "decoder-dsmem16",
            "flash-hopper"
        ]
    );
    for p in &list {
        // The Hopper backward's wgmma needs the architecture-specific target.
        let arch = if p.name == "flash-hopper" { "sm_90a" } else { "sm_90" };
        assert!(p.options.contains(&format!("--gpu-architecture={arch}")), "{}", p.name);
        assert!(!p.source.is_empty(), "{}", p.name);
    }
    assert!(list[4].options.contains(&"-DFD_MT=1".to_string()));
    let dsmem = &list[7];
    assert!(
        dsmem.options.contains(&"-DFD_CLUSTER=16".to_string()) && dsmem.options.contains(&"-DFD_DSMEM=1".to_string())
    );
    // A GPU before sm_90 has no programmatic dependent launch to compile, and only sm_90 the
    // Hopper backward.
    assert!(programs((8, 0))?.iter().all(|p| p.name != "main-pdl" && p.name != "flash-hopper"));
    assert!(programs((10, 0))?.iter().all(|p| p.name != "flash-hopper"));
    let Some(dir) = std::env::var_os("GRAPHED_DUMP_PROGRAMS").filter(|d| !d.is_empty()) else {
        eprintln!("GRAPHED_DUMP_PROGRAMS not set: the programs were listed, not written");
        return Ok(());
    };
    let dir = std::path::Path::new(&dir);
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::msg(format!("{}: {e}", dir.display())))?;
    for p in &list {
        let write = |ext: &str, text: String| {
            let path = dir.join(format!("{}.{ext}", p.name));
            std::fs::write(&path, text).map_err(|e| crate::Error::msg(format!("{}: {e}", path.display())))
        };
        write("cu", p.source.clone())?;
        write("opts", p.options.join("\n") + "\n")?;
        if !p.shared.is_empty() {
            write("shared", p.shared.iter().map(|(k, b)| format!("{k} {b}\n")).collect())?;
        }
    }
    eprintln!("wrote {} programs to {}", list.len(), dir.display());
    Ok(())
}
