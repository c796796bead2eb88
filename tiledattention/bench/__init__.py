"""The benchmark harness behind ``tiledattn bench``: config, grid, methods, runner, store."""
