import os

# Compiles in tests go to a private cache unless the caller chose one: a test that
# claims "compiles" must not be satisfied by a cubin left behind by another run.
os.environ.setdefault("CUDA_TILE_CACHE_DIR", os.path.join(
    os.environ.get("PYTEST_CUTILE_CACHE_ROOT", "/tmp"), f"tiledattention-test-cache-{os.getpid()}"))
