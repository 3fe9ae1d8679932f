# Sourced by the GPU-machine scripts: the CUDA libraries on the loader path, and cuDNN's (for
# the fused attention engine) where a Python package ships it (nvidia-cudnn-cu12/13, which
# PyTorch installs). Without libcudnn the portable attention kernels run.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
if [ -n "$cudnn_lib" ] && [ -d "$cudnn_lib" ]; then
  export LD_LIBRARY_PATH=$cudnn_lib:$LD_LIBRARY_PATH
fi
