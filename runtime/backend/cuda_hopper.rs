//! graphed's Hopper attention backward (`kernels/flash_hopper.cu`): its own NVRTC program,
//! compiled for sm_90a (wgmma is an architecture-specific instruction) the first time a
//! backward asks for it on an sm_90 GPU, and never elsewhere.

use std::sync::{Mutex, OnceLock};

use cudarc::driver::CudaFunction;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::cuda::{driver_err, opt_in_dynamic_shared, CudaBackend, LaunchDims};
use super::{kernel_source, ptx_cache, FlashTiles, KArg};
use crate::{DType, Error, Result};

/// Dynamic shared memory a block of the kernel takes (`HB_SMEM`): K and V (128 keys), two
/// stages of Q and dO (128 queries), dSᵀ, two stages of the tile's dQ parts (f32), two stages of
/// lse and dsum, and 1 KB to align the tiles to 1024 bytes.
pub(crate) const HOPPER_BWD_SMEM: usize = 196608 + 2048 + 1024;

/// Threads a block (`HB_THREADS`): two warpgroups of products and one whose first warp adds the
/// dQ parts.
const THREADS: u32 = 384;

/// Query (and key) rows of a tile (`HB_TILE_F32` is a tile's 128 x 64 f32 `dQ` sum).
pub(crate) const HOPPER_TILE: usize = 128;

/// Chains a query tile's `dQ` is summed in (the kernels' `chains`): key tile j adds into chain
/// j % chains, each chain in a fixed order, and the conversion adds the chains in order, so the
/// bits are fixed for a given count. Two where the call's work items (key tiles · kv heads ·
/// batch) fit in two waves of the GPU's `sms` multiprocessors, where a wave's blocks otherwise
/// wait for each other's turns in one chain (measured on an H100: the GPT's step 4.2% faster at
/// 4096 x 1 and 2.1% at 1024 x 4); one beyond (at 4 x 4096 x 16 heads two chains measured 29%
/// slower, the sums, twice the size, likely no longer staying in L2: DESIGN-DECISIONS).
/// `GRAPHED_HOPPER_CHAINS` (1 to 8, read once) sets it for every call, a measurement setting.
pub(crate) fn hopper_chains(items: usize, sms: usize) -> usize {
    static FROM_ENV: OnceLock<Option<usize>> = OnceLock::new();
    let env = FROM_ENV.get_or_init(|| chains_setting(std::env::var("GRAPHED_HOPPER_CHAINS").ok().as_deref()));
    env.unwrap_or(if items <= 2 * sms { 2 } else { 1 })
}

/// `GRAPHED_HOPPER_CHAINS`'s value as a count of chains: a whole number from 1 to 8, else none
/// (the default rule).
fn chains_setting(v: Option<&str>) -> Option<usize> {
    v.and_then(|v| v.trim().parse::<usize>().ok()).filter(|n| (1..=8).contains(n))
}

/// Head dimension the kernel is built for.
pub(crate) const HOPPER_HEAD_DIM: usize = 64;

/// The loaded kernels, the backward and its dQ conversion, one of each per 16-bit dtype.
#[derive(Clone)]
pub(crate) struct HopperBwd {
    bf16: CudaFunction,
    f16: CudaFunction,
    convert_bf16: CudaFunction,
    convert_f16: CudaFunction,
}

/// The program's source (core.cu, ops.cu, half.cu, flash.cu, then flash_hopper.cu) and NVRTC
/// options (flash.cu's tile defines, which it needs to compile).
pub(crate) fn hopper_program() -> Result<(String, Vec<String>)> {
    let main = kernel_source::main_sources()?;
    let names: Vec<&str> = kernel_source::MAIN.iter().map(|&(n, _)| n).collect();
    let pick = |name: &str| names.iter().position(|&n| n == name).map(|i| main[i]);
    let mut parts = Vec::new();
    for name in ["core.cu", "ops.cu", "half.cu", "flash.cu"] {
        parts.push(pick(name).ok_or_else(|| Error::msg(format!("kernel sources: {name} is not listed")))?);
    }
    parts.push(include_str!("kernels/flash_hopper.cu"));
    let mut options = vec!["--gpu-architecture=sm_90a".to_string(), "-std=c++17".into()];
    options.extend(FlashTiles::nvrtc_defines());
    Ok((parts.join("\n"), options))
}

/// The slot [`CudaBackend::hopper_bwd`] fills: not asked yet, or asked (and `None` where the
/// kernel does not run on this GPU).
pub(crate) type HopperSlot = Mutex<Option<Option<HopperBwd>>>;

impl CudaBackend {
    /// The Hopper backward's kernels, compiled and loaded the first time they are asked for;
    /// `None` where they do not run: a GPU other than sm_90 (wgmma), or one whose blocks cannot
    /// have [`HOPPER_BWD_SMEM`] bytes of shared memory.
    pub(crate) fn hopper_bwd(&self) -> Result<Option<HopperBwd>> {
        let mut slot = self.hopper_fn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = slot.as_ref() {
            return Ok(k.clone());
        }
        if self.capability != (9, 0) || self.max_shared_optin < HOPPER_BWD_SMEM {
            *slot = Some(None);
            return Ok(None);
        }
        self.bind()?;
        let (src, options) = hopper_program()?;
        let compile = || compile_ptx_with_opts(&src, CompileOptions { options: options.clone(), ..Default::default() });
        let ptx =
            ptx_cache::compile_cached(&src, &options, compile).map_err(|e| Error::cuda("nvrtcCompileProgram", e))?;
        let module = self.ctx.load_module(ptx).map_err(driver_err("cuModuleLoadData"))?;
        let get = |name: &str| module.load_function(name).map_err(driver_err("cuModuleGetFunction"));
        // The backward's kernels where a block gets their shared memory.
        let load = |name: &str| -> Result<Option<CudaFunction>> {
            let f = get(name)?;
            let fits = opt_in_dynamic_shared(&f, true, self.max_shared_optin) >= HOPPER_BWD_SMEM;
            Ok(fits.then_some(f))
        };
        let kernels = match (load("hb_bwd_bf16_d64")?, load("hb_bwd_f16_d64")?) {
            (Some(bf16), Some(f16)) => Some(HopperBwd {
                bf16,
                f16,
                convert_bf16: get("hb_dq_convert_bf16")?,
                convert_f16: get("hb_dq_convert_f16")?,
            }),
            _ => None,
        };
        *slot = Some(kernels.clone());
        Ok(kernels)
    }

    /// Launches the Hopper backward for `items` work items (key tiles x kv heads x batch) on
    /// a persistent grid of at most one block a multiprocessor. `args` are the kernel's, in
    /// `flash_hopper.cu`'s order; the caller checked them.
    pub(crate) fn launch_hopper_bwd(&self, k: &HopperBwd, dtype: DType, items: usize, args: &[KArg]) -> Result<()> {
        let f = if dtype == DType::BF16 { &k.bf16 } else { &k.f16 };
        let blocks = items.clamp(1, self.sm_count) as u32;
        let dims = LaunchDims { grid: (blocks, 1, 1), block: (THREADS, 1, 1), shared: HOPPER_BWD_SMEM as u32 };
        self.launch_function(f, dims, args)
    }

    /// Launches the dQ conversion after the backward: a block for each of `tiles` query tiles
    /// of each head (`heads`) of each sequence (`batch`); `args` in `hb_dq_convert`'s order.
    pub(crate) fn launch_hopper_dq(
        &self,
        k: &HopperBwd,
        dtype: DType,
        [tiles, heads, batch]: [usize; 3],
        args: &[KArg],
    ) -> Result<()> {
        let f = if dtype == DType::BF16 { &k.convert_bf16 } else { &k.convert_f16 };
        let dims = LaunchDims { grid: (tiles as u32, heads as u32, batch as u32), block: (256, 1, 1), shared: 0 };
        self.launch_function(f, dims, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_chains_within_two_waves_one_beyond_unless_set() {
        // The tests' environment does not set GRAPHED_HOPPER_CHAINS.
        if std::env::var_os("GRAPHED_HOPPER_CHAINS").is_none() {
            // The GPT at 4096 x 1 and 1024 x 4: 256 items on 132 multiprocessors.
            assert_eq!(hopper_chains(256, 132), 2);
            assert_eq!(hopper_chains(264, 132), 2);
            // 4 x 4096 x 16 heads: 2,048 items.
            assert_eq!(hopper_chains(265, 132), 1);
            assert_eq!(hopper_chains(2048, 132), 1);
        }
        assert_eq!(chains_setting(Some("4")), Some(4));
        assert_eq!(chains_setting(Some(" 1 ")), Some(1));
        for bad in ["0", "9", "two", "", "-1"] {
            assert_eq!(chains_setting(Some(bad)), None, "{bad}");
        }
        assert_eq!(chains_setting(None), None);
    }
}
