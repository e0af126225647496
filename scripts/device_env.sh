# Sourced by the scripts/*_on_device.sh scripts on the GPU machine: the environment every call needs.
# dfim is not pip-installed there (no registry): a folder on PYTHONPATH that mirrors the installed
# layout (dfim/ with engine/ and server/ as dfim.engine and dfim.server) makes `python3 -m dfim...` work.
# DFIM_SRC_ROOT (default: the current checkout) is the tree the mirror points at; a background run
# points it at a copy of its own, so a later call that replaces the checkout cannot change its code.
DFIM_SRC_ROOT=${DFIM_SRC_ROOT:-$PWD}
SRC=${DFIM_MIRROR:-/tmp/dfim-src}
rm -rf "$SRC" && mkdir -p "$SRC/dfim"
for entry in "$DFIM_SRC_ROOT"/dfim/*; do ln -s "$entry" "$SRC/dfim/"; done
ln -s "$DFIM_SRC_ROOT/engine" "$SRC/dfim/engine" && ln -s "$DFIM_SRC_ROOT/server" "$SRC/dfim/server"
# PYTHONSAFEPATH: `python3 -m` would put the checkout first on sys.path, where dfim/ lacks engine/ and server/.
export PYTHONUNBUFFERED=1 PYTHONPATH=$SRC PYTHONSAFEPATH=1 TOKENIZERS_PARALLELISM=false
# NVLink multicast (NVLS) is off on these machines: NCCL, torch's symmetric memory and NVSHMEM would
# otherwise try it and fail or hang at the first collective.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
